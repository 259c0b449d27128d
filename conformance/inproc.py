"""The in-process target: the implementation's three sans-I/O cores on a deterministic fake
network and clock, with every message addressable so the lockstep runner can deliver, drop,
duplicate or delay each one.

Granularity (documented in `conformance.mapping`): decode admits and reserves in one call; it
generates, answers and releases in one call; a router-bound result is delivered at once (the
router's bookkeeping is not in the spec); a client cancel leaves the router's withdrawal pending
for decode (`decode_cancel`, the spec's `decode_receive_cancel`) and for prefill
(`prefill_cancel`, the spec's `prefill_receive_cancel`; the router's withdrawal on a decode
failure is the spec's `abort` by another path). Page data
is a ghost tag: (writer request id, tenant) of the last write that landed.

Instances (`Target.instances`): one prefill core per prefill instance and one decode core per
decode instance, each request on the cores its placement names (`RequestSpec.prefill_instance`,
`decode_instance`); the router core is one, as SGLang's router is one process in front of every
worker. Each decode core numbers its own pages from 0 and its own generations from its boot
(two cores issue the same generations, as two real decode instances may); the target names a
page by the spec's global number (decode instance j's pages are the j-th contiguous block,
`Config.page_instance`) in its log, in pending writes and in `page_contents`, and hands the
cores their own numbers. A restart is of one instance (`restart_prefill(pinst)`,
`restart_decode(dinst)`, each core its own boot epoch) and a partition cuts one decode instance
off one prefill instance (`suspect_prefill_dead(dinst, pinst)`): every decode core probes every
prefill instance's health on its own (`dc.PrefillHeartbeat.prefill`) and fails only the requests
placed on the one it lost. Log lines that name no request say which instance logged them
(`decode_instance`, `prefill_instance`, left out for instance 0).

Retries (`retry`, the spec's `router_retry_request`): the client resubmits a failed request
under the same id with `retry` set; the router makes it the next attempt. Every pending message
keeps the attempt it was sent for, and `deliver`, `drop`, `duplicate` and `retransmit` pick the
message of the spec message's attempt, so a first attempt's late message and the retry's are
told apart as the spec tells them apart.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any

from kvhandoff.conformance.adversary import Attack, ProbeResult
from kvhandoff.conformance.target import Event, Target, TargetAnswer, require_one_prefill_rank
from kvhandoff.impl.core import decode as dc
from kvhandoff.impl.core import prefill as pc
from kvhandoff.impl.core import router as rc
from kvhandoff.impl.core.common import (
    Generation,
    Log,
    PageId,
    Reply,
    RequestId,
    Room,
    Status,
    Tenant,
    completion_digest,
)
from kvhandoff.impl.modes import get_mode
from kvhandoff.spec.config import Config

ROUTER_KINDS = ("router_result",)
# Deliverable steps the spec names by request, not by message: of the request's current attempt.
_OF_THE_CURRENT_ATTEMPT = (
    "prefill_submit",
    "decode_submit",
    "decode_cancel",
    "prefill_cancel",
    "stream_close",
)


@dataclass
class _Pending:
    kind: str
    rid: RequestId
    generation: int
    page: int
    payload: Any
    mid: int
    attempt: int = 0


@dataclass
class _Writer:
    start: pc.StartWrites
    next_index: int = 0
    in_flight: int = 0


class InProcTarget(Target):
    name = "inproc"
    fine_grained = True
    retries = True
    instances = True

    def __init__(self) -> None:
        self.config: Config | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self, config: Config, mode: str) -> None:
        require_one_prefill_rank(config, retries=True, instances=True)
        b = get_mode(mode).behaviour
        self.behaviour = b
        self.config = config
        ps = config.page_size
        self.page_size = ps
        self.now = 0.0
        self.waiting_timeout = 30.0
        self.router = rc.RouterCore(rc.RouterConfig(config.context_window * ps, behaviour=b))
        self.prefills = [
            pc.PrefillCore(pc.PrefillConfig(ps, config.prefill_max_prompt * ps, 10.0, behaviour=b))
            for _ in range(config.prefill_instances)
        ]
        # Decode instance j's pages are the j-th contiguous block of the spec's page numbers.
        self.page_base = [
            min(q for q in range(config.decode_pages) if config.page_instance(q) == j)
            for j in range(config.decode_instances)
        ]
        self.decode_boots = [1] * config.decode_instances
        self.decodes = [self._new_decode(j) for j in range(config.decode_instances)]
        self.prefill_epochs = [1] * config.prefill_instances
        self.pending: list[_Pending] = []
        self.lost: list[_Pending] = []
        self.mid = 0
        self.seq = 0
        self.log: list[Event] = []
        self.taken = 0
        self.content: dict[int, tuple[str, str] | None] = {
            p: None for p in range(config.decode_pages)
        }
        self.writers: dict[tuple[RequestId, int], _Writer] = {}
        self.reads: dict[RequestId, list[tuple[str, str] | None]] = {}
        self.answered: dict[int, TargetAnswer] = {}
        self.tokens = 0
        self.submitted: set[int] = set()
        # The current attempt of each retried request (absent: 0).
        self.attempts: dict[RequestId, int] = {}
        self.prefill_done: set[RequestId] = set()
        # Every grant decode sent, by request: what a forged or replayed message is made from.
        self.grants_sent: dict[RequestId, list[dc.SendGrant]] = {}
        # (request, generation) of the grants prefill acknowledged (decode then knows which
        # prefill holds the request: `suspect_prefill_dead`).
        self.grants_delivered: set[tuple[RequestId, int]] = set()
        # The decode health probe: decode learns prefill's epoch from it.
        self._heartbeats()

    def _new_decode(self, j: int) -> dc.DecodeCore:
        assert self.config is not None
        c = self.config
        pages = sum(1 for q in range(c.decode_pages) if c.page_instance(q) == j)
        return dc.DecodeCore(
            dc.DecodeConfig(
                pages,
                c.page_size,
                c.decode_max_prompt * c.page_size,
                waiting_timeout_s=self.waiting_timeout,
                behaviour=self.behaviour,
            ),
            generation_base=self.decode_boots[j] << 32,
        )

    def request_id(self, r: int) -> str:
        return f"r{r}"

    def _r(self, rid: str) -> int:
        return int(rid[1:])

    # ------------------------------------------------------------------ instances

    @property
    def prefill(self) -> pc.PrefillCore:
        """The prefill core, where there is one."""
        assert len(self.prefills) == 1
        return self.prefills[0]

    @property
    def decode(self) -> dc.DecodeCore:
        """The decode core, where there is one."""
        assert len(self.decodes) == 1
        return self.decodes[0]

    def _pinst(self, rid: str) -> int:
        assert self.config is not None
        return self.config.requests[self._r(rid)].prefill_instance

    def _dinst(self, rid: str) -> int:
        assert self.config is not None
        return self.config.requests[self._r(rid)].decode_instance

    def _prefill_of(self, rid: str) -> pc.PrefillCore:
        return self.prefills[self._pinst(rid)]

    def _decode_of(self, rid: str) -> dc.DecodeCore:
        return self.decodes[self._dinst(rid)]

    def _global(self, j: int, page: int) -> int:
        """Decode instance j's page `page` under the spec's (global) number."""
        return self.page_base[j] + int(page)

    def _slot(self, j: int, page: int) -> int:
        """Where the data of decode instance j's page `page` is kept (`content`): the page's
        global number, each instance a pool of its own."""
        return self._global(j, page)

    def _prefill_args(self, args: dict[str, Any]) -> dict[str, Any]:
        rid = args.get("request_id")
        return self._globalize(self._dinst(rid), args) if isinstance(rid, str) else args

    def _heartbeats(self, dinst: int | None = None, pinst: int | None = None) -> None:
        """Health probes that answer: of prefill instance `pinst` (every one) by decode
        instance `dinst` (every one)."""
        for j in range(len(self.decodes)) if dinst is None else [dinst]:
            for i in range(len(self.prefills)) if pinst is None else [pinst]:
                beat = dc.PrefillHeartbeat(self.prefill_epochs[i], self.now, prefill=i)
                self._to_decode(beat, j)

    def _placed_on(self, pinst: int | None = None, dinst: int | None = None) -> set[str]:
        """The ids of the requests placed on prefill instance `pinst` and decode instance
        `dinst` (either: any)."""
        assert self.config is not None
        return {
            self.request_id(r)
            for r, q in enumerate(self.config.requests)
            if (pinst is None or q.prefill_instance == pinst)
            and (dinst is None or q.decode_instance == dinst)
        }

    def _globalize(self, j: int, args: dict[str, Any]) -> dict[str, Any]:
        """A log line's page numbers (decode instance j's own) as the spec's; a line that
        names no request says which decode instance logged it."""
        if not j:
            return args
        out = dict(args)
        if "request_id" not in out:
            out["decode_instance"] = j
        if isinstance(out.get("page"), int):
            out["page"] = self._global(j, out["page"])
        if isinstance(out.get("pages"), list):
            out["pages"] = [self._global(j, q) for q in out["pages"]]
        return out

    # ------------------------------------------------------------------ log

    def _record(self, server: str, kind: str, args: dict[str, Any]) -> None:
        self.seq += 1
        self.log.append({"seq": self.seq, "server": server, "event": kind, "args": args})

    def take_events(self) -> list[Event]:
        out = self.log[self.taken :]
        self.taken = len(self.log)
        return out

    # ------------------------------------------------------------------ client operations

    def _client_submit(self, r: int, retry: bool = False) -> rc.ClientSubmit:
        """The client's submission of request r (a retry of it, with `retry`): its id, tenant,
        room and prompt from the scenario."""
        assert self.config is not None
        spec = self.config.requests[r]
        return rc.ClientSubmit(
            RequestId(self.request_id(r)),
            Tenant(spec.tenant),
            Room(spec.room),
            self.prompt_tokens(self.config, r),
            4,
            self.now,
            retry=retry,
        )

    def submit(self, r: int) -> None:
        self.submitted.add(r)
        reply = self._to_router(self._client_submit(r))
        if reply.status is not Status.OK:
            self.answered[r] = TargetAnswer(False, reply.status.value, reply.message)

    def retry(self, r: int) -> bool:
        rid = RequestId(self.request_id(r))
        # The client retries once the first attempt is over everywhere, as the spec's guard
        # asks (prefill done with it, decode holding none of its pages). Two steps the spec
        # takes at once or never are finished here first. (1) The spec hands a request over
        # to both workers at submission; here the router's hand-over may still be on its way
        # to a worker that already ended the request (a cancel overtook it): it arrives now,
        # is refused, and the router hears the result it waits for. (2) This decode keeps an
        # aborted request's pages until prefill acks the abort (the spec's two-sided decode
        # releases at once): the abort and its ack go through now. Anything else still held
        # (a call in progress) leaves the retry undone: the router or decode would refuse it.
        for p in [
            p
            for p in self.pending
            if p.rid == rid and p.kind in ("prefill_submit", "decode_submit")
        ]:
            self.pending.remove(p)
            self._deliver(p)
        decode = self._decode_of(rid)
        if rid in decode.active_requests():
            # Only while decode still holds the first attempt: once it has released (prefill was
            # taken for dead, or restarted), that attempt's abort stays in flight and meets the
            # retry, as the spec's does.
            for kinds in (("abort", "cancel_prefill"), ("abort_ack",)):
                for p in [p for p in self.pending if p.rid == rid and p.kind in kinds]:
                    if p in self.pending:
                        self.pending.remove(p)
                        self._deliver(p)
        if rid in decode.active_requests() or self.router.attempt_of(rid) is not None:
            return False
        reply = self._to_router(self._client_submit(r, retry=True))
        if reply.status is not Status.OK:
            return False  # the router still holds the id, or holds no error for it
        # The first attempt's answer is set aside; the retry's prefill call is open again.
        self.attempts[rid] = self.attempts.get(rid, 0) + 1
        self.answered.pop(r, None)
        self.reads.pop(rid, None)
        self.prefill_done.discard(rid)
        return True

    def cancel(self, r: int) -> bool:
        rid = RequestId(self.request_id(r))
        reply = self._to_router(rc.ClientCancel(rid))
        # The router's withdrawals stay pending: `deliver("decode_cancel" | "prefill_cancel", r)`.
        return reply.status is Status.OK

    # ------------------------------------------------------------------ message control

    def _find(
        self, kind: str, r: int, page: int | None = None, attempt: int | None = None
    ) -> _Pending | None:
        rid = self.request_id(r)
        kinds = {
            "failure": ("rejection", "cancel_decode"),
            "abort": ("abort", "cancel_prefill"),
            "decode_cancel": ("cancel_decode",),
            "prefill_cancel": ("cancel_prefill",),
        }
        for k in kinds.get(kind, (kind,)):
            for p in self.pending:
                if p.kind != k or p.rid != rid or (page is not None and p.page != page):
                    continue
                if attempt is None or p.attempt == attempt:
                    return p
        return None

    def deliver(
        self, kind: str, r: int, page: int | None = None, attempt: int | None = None
    ) -> bool:
        if kind == "heartbeat":
            # Decode instance r's health probe of prefill instance `page` (None: 0).
            self._heartbeats(r, page or 0)
            return True
        if kind == "write_send":
            return self._write_send(RequestId(self.request_id(r)))
        if kind == "decode_submit":
            p = self._find(kind, r)
            if p is None or not self._can_deliver(p):
                return False  # the spec's decode waits for free pages; the impl would refuse
        if attempt is None and kind in _OF_THE_CURRENT_ATTEMPT:
            # A step the spec names by request alone acts on the request's current attempt
            # (the router's withdrawal of a first attempt may still be on its way).
            attempt = self.attempts.get(RequestId(self.request_id(r)), 0)
        p = self._find(kind, r, page, attempt)
        if p is None:
            return False
        self.pending.remove(p)
        self._deliver(p)
        return True

    def _harness(self, event: str, p: _Pending) -> None:
        kind = {"rejection": "failure", "cancel_decode": "failure", "cancel_prefill": "abort"}
        self._record(
            "harness",
            event,
            {
                "kind": kind.get(p.kind, p.kind),
                "request_id": p.rid,
                "generation": p.generation,
                **({"attempt": p.attempt} if p.attempt else {}),
            },
        )

    def drop(self, kind: str, r: int, attempt: int | None = None) -> bool:
        p = self._find(kind, r, attempt=attempt)
        if p is None:
            return False
        self.pending.remove(p)
        self.lost.append(p)
        self._harness("network_drop_message", p)
        return True

    def retransmit(self, kind: str, r: int, attempt: int | None = None) -> bool:
        rid = self.request_id(r)
        for p in self.lost:
            k = {"rejection": "failure", "cancel_decode": "failure", "cancel_prefill": "abort"}
            if attempt is not None and p.attempt != attempt:
                continue
            if p.rid == rid and k.get(p.kind, p.kind) == kind:
                self.lost.remove(p)
                self.pending.append(p)
                self._harness("retransmit_message", p)
                return True
        return False

    def duplicate(self, kind: str, r: int, attempt: int | None = None) -> bool:
        p = self._find(kind, r, attempt=attempt)
        if p is None:
            return False
        self.mid += 1
        self.pending.append(
            _Pending(p.kind, p.rid, p.generation, p.page, p.payload, self.mid, p.attempt)
        )
        self._harness("network_duplicate_message", p)
        return True

    def fire_timeout(self, r: int) -> bool:
        rid = RequestId(self.request_id(r))
        decode = self._decode_of(rid)
        view = decode.grant_of(rid)
        if view is None or view.state != "waiting":
            return False
        # The clock moves to r's deadline and no further: the spec's timeout is one request's,
        # and another request waiting at decode (a cancelled one whose cancel has not reached
        # decode, say) must not time out with it. Each admission moves the clock on
        # (`_deliver`), so deadlines differ; where another's has passed too, the step is
        # refused rather than played as two.
        now = max(self.now, view.deadline)
        for other in decode.active_requests():
            seen = decode.grant_of(other)
            if other != rid and seen is not None and seen.state == "waiting":
                if seen.deadline <= now:
                    return False
        self.now = now
        self._to_decode(dc.Tick(self.now), self._dinst(rid))
        return True

    def prefill_abort(self, r: int) -> bool:
        rid = RequestId(self.request_id(r))
        for key, w in list(self.writers.items()):
            if key[0] == rid and w.start.attempt == self._attempt(rid):
                # Writing: its write stream breaks. With writes of it still on the wire (a
                # failed write, the spec's `prefill_write_error`), those are not recalled: they
                # stay in flight and may still land.
                del self.writers[key]
                self._drop_stream(key, writes=False)
                self._to_prefill(
                    pc.WritesFinished(rid, w.start.generation, Status.UNAVAILABLE, "injected")
                )
                return True
        if self._prefill_of(rid).active_requests().get(rid) == pc.PrefillState.ADMITTED.value:
            # Waiting for its grant: prefill's scheduler gives up on it.
            reply = self._to_prefill(pc.FailRequest(rid, Status.ABORTED, "injected"))
            return reply.status is Status.OK
        return False

    def suspect_prefill_dead(self, dinst: int = 0, pinst: int = 0) -> bool:
        decode = self.decodes[dinst]
        on = self._placed_on(pinst=pinst)
        # Decode fails only the requests whose grant prefill acknowledged; the spec's decode,
        # which does not track delivery, fails a request whose grant is in flight too. Such a
        # grant would then reach the live prefill and the request be served: refuse the step
        # there rather than diverge (the registry's row says so).
        for rid, state in decode.active_requests().items():
            view = decode.grant_of(rid)
            if rid in on and state == "waiting" and view is not None:
                if (rid, int(view.generation)) not in self.grants_delivered:
                    return False
        # The probe gets no answer until decode gives prefill up; prefill itself runs on.
        for _ in range(decode.config.prefill_dead_after_misses):
            self._to_decode(dc.PrefillHeartbeat(None, self.now, prefill=pinst), dinst)
        if not decode.prefill_dead_of(pinst):
            return False
        # The partition heals: the next probe answers, with the epoch decode already knew
        # (nothing restarted, nothing more to detect), and decode stops taking prefill for dead.
        self._heartbeats(dinst, pinst)
        return True

    def restart_prefill(self, pinst: int = 0) -> None:
        self.prefills[pinst] = pc.PrefillCore(self.prefills[pinst].config)
        self.prefill_epochs[pinst] += 1
        on = self._placed_on(pinst=pinst)
        args: dict[str, Any] = {"boot_epoch": self.prefill_epochs[pinst]}
        if pinst:
            args["prefill_instance"] = pinst
        self._record("prefill", "prefill_restart", args)
        for key in [key for key in self.writers if key[0] in on]:
            del self.writers[key]
            # Writes already on the wire may still land; the stream itself is gone.
            self.pending = [
                p
                for p in self.pending
                if not (p.kind == "stream_close" and (p.rid, p.generation) == key)
            ]
        held = [p for p in self.pending if p.kind == "prefill_submit" and p.rid in on]
        self.pending = [p for p in self.pending if p not in held]
        # Decode's health probe sees the new epoch first (the spec's decode detects the restart
        # before anyone answers), then the router's calls to the old prefill break.
        self._heartbeats(pinst=pinst)
        # Only calls still open: a request whose prefill call already returned is not affected.
        broken = [p.rid for p in held] + [
            rid
            for rid in self.router.active_requests()
            if rid in on and rid not in {p.rid for p in held} and rid not in self.prefill_done
        ]
        for rid in broken:
            self._to_router(
                rc.PrefillFinished(rid, Status.UNAVAILABLE, "prefill restarted", broken=True)
            )
        # The router withdraws them from decode at once (as for a client cancel).
        # (With them, any withdrawal the router already had on the way to decode: the spec's
        # decode fails every request of the old prefill epoch when it detects the restart.)
        for p in [p for p in self.pending if p.kind == "cancel_decode" and p.rid in on]:
            self.pending.remove(p)
            self._deliver(p)

    def restart_decode(self, dinst: int = 0) -> None:
        assert self.config is not None
        self.decode_boots[dinst] += 1
        boot = self.decode_boots[dinst]
        active = list(self.decodes[dinst].active_requests())
        self.decodes[dinst] = self._new_decode(dinst)
        self._record(
            "decode",
            "decode_restart",
            {"boot": boot, "boot_epoch": boot, **({"decode_instance": dinst} if dinst else {})},
        )
        if self.behaviour.scrub_on_release:
            for q in self.content:
                if self.config.page_instance(q) == dinst:
                    self.content[q] = None
        on = self._placed_on(dinst=dinst)
        held = [p.rid for p in self.pending if p.kind == "decode_submit" and p.rid in on]
        self.pending = [
            p for p in self.pending if not (p.kind in ("generate", "decode_submit") and p.rid in on)
        ]
        self._heartbeats(dinst)
        for rid in [*active, *held]:
            self._to_router(rc.DecodeFinished(rid, Status.UNAVAILABLE, "decode restarted"))

    # ------------------------------------------------------------------ settle

    def settle(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            ready = [p for p in self.pending if self._can_deliver(p)]
            if ready:
                self.pending.remove(ready[0])
                self._deliver(ready[0])
                continue
            if self.lost:
                p = self.lost.pop(0)
                self.pending.append(p)
                self._harness("retransmit_message", p)
                continue
            sent = False
            for (rid, _g), w in list(self.writers.items()):
                if w.next_index < len(w.start.pages):
                    self._write_send(rid)
                    sent = True
                    break
            if sent:
                continue
            if self.pending:
                self._deliver(self.pending.pop(0))
                continue
            return
        raise RuntimeError("the in-process target did not settle")

    def _can_deliver(self, p: _Pending) -> bool:
        if p.kind != "decode_submit":
            return True
        prompt_len = int(p.payload.prompt_len)
        need = -(-prompt_len // self.page_size)
        decode = self._decode_of(p.rid)
        over = prompt_len > decode.config.max_prompt_tokens
        return over or need <= decode.free_pages

    def quiescent(self) -> bool:
        return (
            not self.pending
            and not any(d.active_requests() or d.used_pages for d in self.decodes)
            and not any(p.active_requests() for p in self.prefills)
            and not self.router.active_requests()
        )

    def describe(self) -> str:
        decode = ", ".join(
            f"{d.active_requests()} ({d.used_pages} pages used)" for d in self.decodes
        )
        prefill = ", ".join(str(p.active_requests()) for p in self.prefills)
        return (
            f"decode {decode}, prefill {prefill}, router {self.router.active_requests()}, "
            f"pending {[(p.kind, p.rid) for p in self.pending]}"
        )

    def answers(self) -> dict[int, TargetAnswer]:
        return dict(self.answered)

    def page_contents(self) -> dict[int, str | None]:
        return {p: (c[0] if c is not None else None) for p, c in self.content.items()}

    # ------------------------------------------------------------------ adversarial probes

    def probe(self, attack: Attack) -> ProbeResult | None:
        """Answer a forged message on a copy of decode: the run itself is untouched."""
        rid = RequestId(self.request_id(attack.request))
        clone = copy.deepcopy(self._decode_of(rid))
        event = self._forge(clone, rid, attack.kind)
        if event is None:
            return None
        before = _bookkeeping(clone)
        cmds = clone.handle(event)
        after = _bookkeeping(clone)
        changed = before != after
        logs = [c for c in cmds if isinstance(c, Log)]
        detail = "; ".join(f"{c.kind} {dict(c.args)}" for c in logs)[:400]
        if isinstance(event, dc.WriteReceived):
            stored = any(isinstance(c, dc.StorePage) for c in cmds)
            return ProbeResult("accepted" if stored else "refused", changed, detail)
        if isinstance(event, dc.CompletionReceived):
            verdicts = [c.args for c in logs if c.kind == "decode_receive_completion"]
            if any(v.get("verdict") == "validated" for v in verdicts):
                return ProbeResult("validated", changed, detail)
            if verdicts and not all(v.get("ignored") for v in verdicts):
                return ProbeResult("failed", changed, detail)
            return ProbeResult("ignored", changed, detail)
        return ProbeResult("ignored", changed, detail)

    def _forge(self, core: dc.DecodeCore, rid: RequestId, kind: str) -> dc.DecodeEvent | None:
        view = core.grant_of(rid)
        # A forged message names the attempt decode holds: what is probed is the grant's checks.
        attempt = core.attempt_of(rid) or 0
        if kind.startswith(("completion_", "write_")) and kind != "write_replay_released":
            if view is None or view.state != "waiting":
                return None
            gen, room, token, pages = view.generation, view.room, view.token, view.pages
            if kind.startswith("completion_"):
                digests = [self._page_digest(rid, gen, i) for i in range(len(pages))]
                count, digest = len(pages), completion_digest(gen, pages, digests)
                if kind == "completion_undercount":
                    count -= 1
                elif kind == "completion_overcount":
                    count += 1
                elif kind == "completion_bad_digest":
                    digest = bytes(b ^ 0xFF for b in digest)
                elif kind == "completion_wrong_generation":
                    gen = Generation(gen + (1 << 20))
                elif kind == "completion_wrong_room":
                    room = Room(room + 1000)
                elif kind == "completion_forged_token":
                    token = bytes(b ^ 0xFF for b in token) or b"forged"
                return dc.CompletionReceived(rid, room, gen, token, count, digest, attempt)
            page, index = int(pages[0]), 0  # the core's own page numbers
            data = claimed = self._page_digest(rid, gen, 0)
            if kind == "write_wrong_room":
                room = Room(room + 1000)
            elif kind == "write_wrong_generation":
                gen = Generation(gen + (1 << 20))
            elif kind == "write_page_not_granted":
                # Another request's page if there is one, else a free one (as the spec's probe).
                others = [p for p in range(core.config.num_pages) if p not in pages]
                owned = [p for p in others if core.owner_of(PageId(p)) is not None]
                if not others:
                    return None
                page = (owned or others)[0]
            elif kind == "write_forged_token":
                token = bytes(b ^ 0xFF for b in token) or b"forged"
            elif kind == "write_corrupt_data":
                data = hashlib.sha256(b"corrupted page").digest()[:8]
            return dc.WriteReceived(
                rid, room, gen, token, page, 1_000_000 + index, data, claimed, attempt=attempt
            )
        # Replays: the latest earlier generation of the request, no longer the current one.
        current = view.generation if view is not None and view.state == "waiting" else None
        old = [g for g in self.grants_sent.get(rid, []) if g.generation != current]
        if not old:
            return None
        g = old[-1]
        if kind == "write_replay_released":
            if not g.pages:
                return None
            digest = self._page_digest(rid, g.generation, 0)
            return dc.WriteReceived(
                rid,
                g.room,
                g.generation,
                g.token,
                int(g.pages[0]),
                1_000_000,
                digest,
                digest,
                attempt=g.attempt,
            )
        if kind == "abort_ack_replay_released":
            if view is not None and view.generation == g.generation:
                return None  # still being released: a real ack, not a replay
            return dc.AbortAckReceived(rid, g.room, g.generation, attempt=g.attempt)
        return None

    @staticmethod
    def _page_digest(rid: RequestId, generation: int, index: int) -> bytes:
        # The digest an honest prefill's write of page `index` carries (see `_write_send`).
        return hashlib.sha256(f"{rid}/{generation}/{index}".encode()).digest()[:8]

    # ------------------------------------------------------------------ plumbing

    def _attempt(self, rid: RequestId) -> int:
        """The attempt prefill holds of `rid` (the router's where prefill holds none)."""
        held = self._prefill_of(rid).attempt_of(rid)
        if held is None:
            held = self.router.attempt_of(rid)
        return held or 0

    def _push(
        self,
        kind: str,
        rid: RequestId,
        generation: int,
        payload: Any,
        page: int = -1,
        attempt: int = 0,
    ) -> None:
        self.mid += 1
        self.pending.append(_Pending(kind, rid, generation, page, payload, self.mid, attempt))

    def _deliver(self, p: _Pending) -> None:
        k = p.kind
        if k == "prefill_submit":
            c: Any = p.payload
            reply = self._to_prefill(
                pc.SubmitRequest(c.request_id, c.tenant, c.room, c.prompt_len, self.now, c.attempt)
            )
            if reply.status is not Status.OK:
                self.prefill_done.add(c.request_id)
                self._to_router(rc.PrefillFinished(c.request_id, reply.status, reply.message))
        elif k == "decode_submit":
            c = p.payload
            self.tokens += 1
            # A second apart (the waiting timeout is 30 s): each request's deadline its own.
            self.now += 1.0
            reply = self._to_decode(
                dc.SubmitRequest(
                    c.request_id,
                    c.tenant,
                    c.room,
                    c.prompt_len,
                    c.max_tokens,
                    self.tokens.to_bytes(16, "big"),
                    self.now,
                    c.attempt,
                    prefill=self._pinst(c.request_id),
                )
            )
            if reply.status is not Status.OK:
                self._to_router(rc.DecodeFinished(c.request_id, reply.status, reply.message))
        elif k == "grant":
            g: dc.SendGrant = p.payload
            reply = self._to_prefill(
                pc.GrantReceived(
                    g.request_id,
                    g.room,
                    g.generation,
                    g.pages,
                    g.token,
                    g.prompt_len,
                    self.now,
                    g.attempt,
                )
            )
            if reply.status is Status.OK:
                self.grants_delivered.add((g.request_id, int(g.generation)))
                i = self._pinst(g.request_id)
                self._to_decode(
                    dc.GrantDelivered(
                        g.request_id, g.generation, self.prefill_epochs[i], self.now, prefill=i
                    )
                )
            else:
                self._to_decode(dc.GrantFailed(g.request_id, g.generation, reply.message, self.now))
        elif k == "write":
            self._land(p)
        elif k == "stream_close":
            key = (p.rid, p.generation)
            if self.writers.pop(key, None) is not None:
                self._to_prefill(pc.WritesFinished(p.rid, Generation(p.generation), Status.OK))
        elif k == "completion":
            sc: pc.SendCompletion = p.payload
            reply = self._to_decode(
                dc.CompletionReceived(
                    sc.request_id,
                    sc.room,
                    sc.generation,
                    sc.token,
                    sc.page_count,
                    sc.digest,
                    sc.attempt,
                )
            )
            self._to_prefill(
                pc.CompletionAnswered(sc.request_id, sc.generation, reply.status, reply.message)
            )
        elif k == "rejection":
            sr: pc.SendRejection = p.payload
            self._to_decode(
                dc.RejectionReceived(sr.request_id, sr.room, sr.status, sr.reason, sr.attempt)
            )
        elif k == "cancel_decode":
            self._to_decode(dc.CancelRequest(p.rid, p.payload, self.now, p.attempt))
        elif k == "cancel_prefill":
            self._to_prefill(pc.CancelRequest(p.rid, p.payload, p.attempt))
        elif k == "abort":
            sa: dc.SendAbort = p.payload
            self._to_prefill(
                pc.AbortReceived(sa.request_id, sa.room, sa.generation, sa.token, sa.attempt)
            )
        elif k == "abort_ack":
            ack: pc.SendAbortAck = p.payload
            self._to_decode(
                dc.AbortAckReceived(
                    ack.request_id, ack.room, ack.generation, ack.token, ack.attempt
                )
            )
        elif k == "generate":
            gen: dc.Generate = p.payload
            n = -(-gen.prompt_len // self.page_size)
            j = self._dinst(gen.request_id)
            self.reads[gen.request_id] = [self.content[self._slot(j, pg)] for pg in gen.pages[:n]]
            if gen.request_id in self.decodes[j].active_requests():
                self._to_decode(
                    dc.GenerationFinished(gen.request_id, gen.generation, gen.max_tokens)
                )

    def _write_send(self, rid: RequestId) -> bool:
        for key, w in self.writers.items():
            if key[0] != rid or w.next_index >= len(w.start.pages):
                continue
            index = w.next_index
            page = w.start.pages[index]
            w.next_index += 1
            w.in_flight += 1
            digest = hashlib.sha256(f"{rid}/{key[1]}/{index}".encode()).digest()[:8]
            self._to_prefill(pc.PageSent(rid, w.start.generation, page, index, digest, index))
            self._push(
                "write",
                rid,
                key[1],
                (w.start, index, digest),
                page=self._global(self._dinst(rid), page),
                attempt=w.start.attempt,
            )
            return True
        return False

    def _drop_stream(self, key: tuple[RequestId, int], writes: bool = True) -> None:
        """Forget a stream's close and (unless `writes` is False) its writes still in flight."""
        kinds = ("write", "stream_close") if writes else ("stream_close",)
        self.pending = [
            p for p in self.pending if not (p.kind in kinds and (p.rid, p.generation) == key)
        ]

    def _land(self, p: _Pending) -> None:
        start, index, digest = p.payload
        rid = start.request_id
        j = self._dinst(rid)
        cmds = self.decodes[j].handle(
            dc.WriteReceived(
                rid,
                start.room,
                start.generation,
                start.token,
                PageId(p.page - self.page_base[j]),
                index,
                digest,
                digest,
                attempt=start.attempt,
            )
        )
        reply = Reply(Status.OK)
        for c in cmds:
            if isinstance(c, Log):
                self._record("decode", c.kind, self._globalize(j, dict(c.args)))
            elif isinstance(c, dc.StorePage):
                assert self.config is not None
                tenant = self.config.requests[self._r(rid)].tenant
                self.content[self._slot(j, c.page_id)] = (rid, tenant)
            elif isinstance(c, Reply):
                reply = c
        key = (rid, p.generation)
        w = self.writers.get(key)
        if w is None:
            return
        w.in_flight -= 1
        if reply.status is not Status.OK:
            del self.writers[key]
            self._drop_stream(key)
            self._to_prefill(pc.WritesFinished(rid, start.generation, reply.status, reply.message))
            return
        if w.next_index >= len(w.start.pages) and w.in_flight == 0:
            self._push("stream_close", rid, p.generation, None, attempt=w.start.attempt)

    def _to_router(self, event: rc.RouterEvent) -> Reply:
        cmds = self.router.handle(event)
        reply = Reply(Status.OK)
        for cmd in cmds:
            match cmd:
                case Log():
                    self._record("router", cmd.kind, dict(cmd.args))
                case rc.ForwardToPrefill():
                    self._push("prefill_submit", cmd.request_id, 0, cmd, attempt=cmd.attempt)
                case rc.ForwardToDecode():
                    self._push("decode_submit", cmd.request_id, 0, cmd, attempt=cmd.attempt)
                case rc.CancelAtPrefill():
                    self._push("cancel_prefill", cmd.request_id, 0, cmd.reason, attempt=cmd.attempt)
                case rc.AbortAtDecode():
                    self._push("cancel_decode", cmd.request_id, 0, cmd.reason, attempt=cmd.attempt)
                case rc.AnswerClient():
                    r = self._r(cmd.request_id)
                    read = [c[1] if c else None for c in self.reads.get(cmd.request_id, [])]
                    ans = TargetAnswer(cmd.status is Status.OK, cmd.status.value, cmd.message)
                    if ans.ok:
                        ans.read = read
                        assert self.config is not None
                        own = self.config.requests[r].tenant
                        for c in self.reads.get(cmd.request_id, []):
                            if c is not None and c[1] != own:
                                ans.foreign.append(c)
                    self.answered[r] = ans
                case Reply():
                    reply = cmd
        return reply

    def _to_prefill(self, event: pc.PrefillEvent) -> Reply:
        if isinstance(event, pc.Tick):
            # About no request: every instance's clock moves (the last one's reply).
            reply = Reply(Status.OK)
            for i in range(len(self.prefills)):
                reply = self._on_prefill(i, event)
            return reply
        return self._on_prefill(self._pinst(event.request_id), event)

    def _on_prefill(self, i: int, event: pc.PrefillEvent) -> Reply:
        cmds = self.prefills[i].handle(event)
        reply = Reply(Status.OK)
        for cmd in cmds:
            match cmd:
                case Log():
                    # Prefill holds decode's page numbers as the grant named them: those of the
                    # decode instance of the request the line is about.
                    self._record("prefill", cmd.kind, self._prefill_args(dict(cmd.args)))
                case pc.StartWrites():
                    self.writers[(cmd.request_id, int(cmd.generation))] = _Writer(cmd)
                    if not cmd.pages:
                        self._push(
                            "stream_close",
                            cmd.request_id,
                            int(cmd.generation),
                            None,
                            attempt=cmd.attempt,
                        )
                case pc.CancelWrites():
                    key = (cmd.request_id, int(cmd.generation))
                    if self.writers.pop(key, None) is not None:
                        # The stream is cancelled: its writes not yet received are discarded.
                        self._drop_stream(key)
                        self._to_prefill(
                            pc.WritesFinished(
                                cmd.request_id, cmd.generation, Status.CANCELLED, "cancelled"
                            )
                        )
                case pc.SendCompletion():
                    self._push(
                        "completion", cmd.request_id, int(cmd.generation), cmd, attempt=cmd.attempt
                    )
                case pc.SendRejection():
                    self._push("rejection", cmd.request_id, 0, cmd, attempt=cmd.attempt)
                case pc.SendAbortAck():
                    self._push(
                        "abort_ack", cmd.request_id, int(cmd.generation), cmd, attempt=cmd.attempt
                    )
                case pc.AnswerRequest():
                    self.prefill_done.add(cmd.request_id)
                    self._to_router(rc.PrefillFinished(cmd.request_id, cmd.status, cmd.message))
                case Reply():
                    reply = cmd
        return reply

    def _to_decode(self, event: dc.DecodeEvent, j: int | None = None) -> Reply:
        """Hand `event` to decode instance j: the one its request is placed on, or, for an
        event about no request (the health probe), every instance (the last one's reply)."""
        if j is None:
            rid = getattr(event, "request_id", None)
            if rid is None:
                reply = Reply(Status.OK)
                for k in range(len(self.decodes)):
                    reply = self._to_decode(event, k)
                return reply
            j = self._dinst(rid)
        cmds = self.decodes[j].handle(event)
        reply = Reply(Status.OK)
        for cmd in cmds:
            match cmd:
                case Log():
                    self._record("decode", cmd.kind, self._globalize(j, dict(cmd.args)))
                case dc.SendGrant():
                    self.grants_sent.setdefault(cmd.request_id, []).append(cmd)
                    self._push(
                        "grant", cmd.request_id, int(cmd.generation), cmd, attempt=cmd.attempt
                    )
                case dc.SendAbort():
                    self._push(
                        "abort", cmd.request_id, int(cmd.generation), cmd, attempt=cmd.attempt
                    )
                case dc.ReleasePages():
                    if cmd.scrub:
                        for pg in cmd.pages:
                            self.content[self._slot(j, pg)] = None
                case dc.Generate():
                    self._push(
                        "generate",
                        cmd.request_id,
                        int(cmd.generation),
                        cmd,
                        attempt=self.decodes[j].attempt_of(cmd.request_id) or 0,
                    )
                case dc.AnswerRequest():
                    self._to_router(rc.DecodeFinished(cmd.request_id, cmd.status, cmd.message))
                case Reply():
                    reply = cmd
        return reply


def _bookkeeping(core: dc.DecodeCore) -> tuple[object, ...]:
    """What decode knows about pages and requests (what a refused message must not change)."""
    owners = tuple(
        sorted((int(p), str(core.owner_of(PageId(p)))) for p in range(core.config.num_pages))
    )
    requests = tuple(sorted((str(rid), repr(core.grant_of(rid))) for rid in core.active_requests()))
    return core.free_pages, owners, requests


__all__ = ["InProcTarget"]
