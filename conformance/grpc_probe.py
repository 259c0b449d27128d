"""Adversarial probes over real gRPC: the suite plays a faulty or malicious prefill against the
live decode server (`conformance.adversary`, for the coarse gRPC target).

The in-process target answers each forged message on a copy of its decode core; a live server
cannot be copied, so here the forged messages change the run for real. They are sent in an
*adversarial round* after a trace has been judged, never inside one: a forged message leaves
lines in decode's log that no behaviour of the trace's spec explains, so a round's events are in
no trace's log, and the round keeps a spec state of its own that says what each reaction must be:

1. Requests A (two pages) and B (one page) are submitted with the real prefill's writes held
   back (`Cluster.stall_prefill_writes`, a test hook): decode holds both grants and nothing else
   happens. The suite then writes A's pages itself, honestly, over `Decode.WritePages`: it is
   A's prefill from now on.
2. Every attack the spec says decode must refuse or ignore (`adversary.attacks_for`, those whose
   `Expected.unchanged`) is sent to decode over gRPC, against A and B: forged tokens, other rooms
   and generations, a page of the other request, corrupt page data, completions of no grant. Each
   must get the spec's reaction and leave decode's bookkeeping (pages, owners, requests, the
   pages written) exactly as it was.
3. A's handoff then ends one of the ways of `FINALES` (by round number, so that a default
   campaign tries each): a forged completion the spec *does* act on (an under- or over-count, a
   digest over other data, the honest one), which decode must fail or validate as the spec's own
   receive step does, or a crash of the real prefill, after which decode must let A and B go.
4. Once decode has let A go, C is submitted (held too) and gets A's pages; a write of A's released
   generation and A's abort ack are replayed: both must change nothing (no late write lands in
   C's pages, no page is freed twice).
5. The client cancels B: the spec's decode fails and releases it, so the live decode must not
   hold B's pages 5 s later.
6. The held writes are let go; C (and B, when it was not failed) must be answered with exactly
   their prompts' echo, and the cluster must come back to quiescence.

The expected reactions are the spec's: a spec state is driven along (the same requests, their
protocol steps up to the point each probe is sent, `_drive`) and `adversary.expected` takes the
spec's receive step on the forged message. Decode's reaction is read from its answer to the call
and its own event-log line for the message; its bookkeeping through the cluster's read-only
introspection (`DecodeCore.grant_of`, `owner_of`), the hooks the tests use.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvhandoff.conformance import adversary
from kvhandoff.conformance.adversary import Attack, ProbeResult
from kvhandoff.spec.actions import (
    Action,
    DecodeAdmitRequest,
    DecodeAnswer,
    DecodeGenerate,
    DecodeReceiveWrite,
    DecodeReleasePages,
    DecodeReservePages,
    PrefillAdmitRequest,
    PrefillReceiveGrant,
    PrefillSendCompletion,
    PrefillWritePage,
    RouterSubmitRequest,
    is_fault,
)
from kvhandoff.spec.config import Config, RequestSpec
from kvhandoff.spec.machine import enabled, init, step
from kvhandoff.spec.state import State
from kvhandoff.spec.variants import REFERENCE

Problem = tuple[str, str, str]

FINALES = (
    "completion_undercount",
    "prefill_restart",
    "completion_bad_digest",
    "completion_overcount",
    "completion_early",
)
"""How A's handoff ends, by round number (so that a default campaign tries each): a forged
completion (`adversary.COMPLETION_ATTACKS`), or a crash of the real prefill while A's writes have
landed and B's are held (`prefill_restart`: the spec fails both, by decode's restart detection or
by the router's relay of prefill's failure, whichever comes first, so decode must let both go)."""
_A, _B, _C = 0, 1, 2


def _about(r: int) -> Callable[[Action], bool]:
    def grant_steps(a: Action) -> bool:
        if isinstance(
            a, RouterSubmitRequest | PrefillAdmitRequest | DecodeAdmitRequest | DecodeReservePages
        ):
            return a.request == r
        if isinstance(a, PrefillReceiveGrant):
            return a.message.request == r
        return False

    return grant_steps


def _writes_of(r: int) -> Callable[[Action], bool]:
    def write_steps(a: Action) -> bool:
        if isinstance(a, PrefillWritePage):
            return a.request == r
        if isinstance(a, DecodeReceiveWrite):
            return a.write.data.request == r
        return False

    return write_steps


def _end_of(r: int) -> Callable[[Action], bool]:
    def end_steps(a: Action) -> bool:
        return isinstance(a, DecodeGenerate | DecodeAnswer | DecodeReleasePages) and a.request == r

    return end_steps


def _concerns(r: int, room: int) -> Callable[[Action], bool]:
    """Any protocol step of request r but a write or a completion (its writes are held)."""

    def steps_of_r(a: Action) -> bool:
        if isinstance(a, PrefillWritePage | DecodeReceiveWrite | PrefillSendCompletion):
            return False
        if getattr(a, "request", None) == r:
            return True
        message = getattr(a, "message", None)
        if message is not None:
            return bool(message.request == r)
        return getattr(a, "room", None) == room

    return steps_of_r


def _drive(config: Config, s: State, allow: Callable[[Action], bool], limit: int = 40) -> State:
    """Take the protocol steps `allow` picks (never a fault) until none is enabled: the spec's
    side of what the round just made the cluster do."""
    for _ in range(limit):
        options = sorted(
            (a for a in enabled(REFERENCE, config, s) if not is_fault(a) and allow(a)), key=repr
        )
        if not options:
            break
        s = step(REFERENCE, config, s, options[0])
    return s


def round_config(config: Config) -> Config:
    """The spec scenario of a round: A (two pages), B (one page), C (two pages), all in decode at
    once, the scenario's limits otherwise. A round plays one prefill against one decode: on a
    cluster of several instances its requests are pinned to instance 0 of each (`_start_held`),
    and its spec scenario is one instance of each."""
    pages = max(1, min(2, config.prefill_max_prompt, config.decode_max_prompt))
    # B belongs to another tenant (its pages are the ones A's forged write aims at).
    first = config.tenants[0]
    tenants = [first, *(config.tenants[1:] or ("b" if first != "b" else "c",))]
    requests = (
        RequestSpec(tenants[0], pages, 1),
        RequestSpec(tenants[1], 1, 2),
        RequestSpec(tenants[0], pages, 3),
    )
    return dataclasses.replace(
        config,
        requests=requests,
        decode_pages=max(config.decode_pages, 2 * pages + 1),
        prefill_pool_pages=max(config.prefill_pool_pages, 2 * pages + 1),
        max_active=3,
        submit_in_order=True,
        prefill_instances=1,
        decode_instances=1,
        placement="fixed",
    )


class GrpcProber:
    """One adversarial round against a `GrpcTarget`'s live cluster (see the module doc)."""

    def __init__(self, target: Any, config: Config, trace_no: int, round_no: int = 0) -> None:
        self.target = target
        self.cluster = target.cluster
        self.config = round_config(config)
        self.trace_no = trace_no
        self.rids = [f"t{trace_no}adv{n}" for n in "ABC"]
        self.threads: dict[int, threading.Thread] = {}
        self.results: dict[int, Any] = {}
        self.outcomes: dict[str, int] = {}
        self.grants: dict[int, Any] = {}
        self._channel: Any = None
        self._stub: Any = None
        self._mid = 1_000_000
        self.round_no = round_no
        self.answer_ok = {_B, _C}  # requests the spec answers ok (honest handoffs)

    # ------------------------------------------------------------------ the round

    def run(self) -> Problem | None:
        from kvhandoff.impl.proto import rpc

        c = self.cluster
        self._channel = self._decode_channel()
        self._stub = rpc.decode_stub(self._channel)
        try:
            return self._round()
        finally:
            for rid in self.rids:
                c.resume_prefill_writes(rid)
            for th in self.threads.values():
                th.join(timeout=30)
            self._channel.close()

    def _round(self) -> Problem | None:
        cfg = self.config
        s = self._start_held(_A, init(cfg))
        s = self._start_held(_B, s)
        if _any_none(self.grants, (_A, _B)):
            return self._target_problem("decode never granted the held requests")
        # The suite writes A's pages, as A's prefill would.
        s = _drive(cfg, s, _writes_of(_A))
        accepted = self._write_honest(_A)
        if accepted != len(self.grants[_A].pages):
            return (
                "adversarial",
                "decode_reads_only_validated_pages",
                f"decode accepted {accepted} of the {len(self.grants[_A].pages)} honest page "
                f"writes of {self.rids[_A]} (the spec accepts them all)",
            )
        # Refused or ignored attacks: nothing may change.
        for attack in adversary.attacks_for(s):
            if attack.request not in (_A, _B):
                continue
            want = adversary.expected(REFERENCE, cfg, s, attack)
            if want is None or not want.unchanged:
                continue
            problem = self._probe(attack, want)
            if problem is not None:
                return problem
        # A's handoff ends with a completion the spec acts on, or a prefill crash.
        finale = Attack(FINALES[self.round_no % len(FINALES)], _A)
        if finale.kind == "prefill_restart":
            s = self._restart_prefill(s)
        else:
            want = adversary.expected(REFERENCE, cfg, s, finale)
            if want is None:
                return None
            problem = self._probe(finale, want)
            if problem is not None:
                return problem
            s = adversary.after_completion(REFERENCE, cfg, s, finale)
        s = _drive(cfg, s, _end_of(_A))
        for r in (_A, _B):
            if s.requests[r].d not in ("released", "failed"):
                continue
            if not self._wait(lambda r=r: self._grant(r) is None):  # type: ignore[misc]
                return (
                    "not_quiescent",
                    "every_request_terminates",
                    f"decode still holds {self.rids[r]} after its handoff ended "
                    f"({finale.kind}; the spec's decode has {s.requests[r].d} it): "
                    f"{self._grant(r)}",
                )
        if s.requests[_A].d != "released":
            return self._finish()
        # C takes A's pages; replays of A's released generation must change nothing.
        s = self._start_held(_C, s)
        if self.grants.get(_C) is None:
            return self._target_problem(f"decode never granted {self.rids[_C]}")
        for attack in adversary.attacks_for(s):
            if attack.request != _A or attack.kind not in adversary.REPLAY_ATTACKS:
                continue
            want = adversary.expected(REFERENCE, cfg, s, attack)
            if want is None or not want.unchanged:
                continue
            problem = self._probe(attack, want)
            if problem is not None:
                return problem
        problem = self._cancel(_B, s)
        if problem is not None:
            return problem
        return self._finish()

    def _cancel(self, r: int, s: State) -> Problem | None:
        """The client cancels r while decode holds r's grant and r's writes are held: the spec's
        router tells decode, whose decode fails and releases r (a router that answers the client
        but keeps the cancel from decode leaves r's pages held until some timeout)."""
        from kvhandoff.spec.actions import ClientCancelRequest

        cfg = self.config
        cancel = ClientCancelRequest(r)
        if cancel not in enabled(REFERENCE, cfg, s):
            return None
        s = _drive(cfg, step(REFERENCE, cfg, s, cancel), _concerns(r, cfg.requests[r].room))
        outcome = s.requests[r].d
        self.outcomes[f"client_cancel:{outcome}"] = (
            self.outcomes.get(f"client_cancel:{outcome}", 0) + 1
        )
        if outcome not in ("failed", "released"):
            return None
        self.answer_ok.discard(r)
        with self.cluster.client() as client:
            try:
                client.cancel(self.rids[r], timeout=5)
            except Exception as exc:  # the cancel is judged by decode's pages, not its answer
                self.outcomes["client_cancel:refused"] = 1
                del exc
        if not self._wait(lambda: self._grant(r) is None, timeout=5):
            return (
                "not_quiescent",
                "every_request_terminates",
                f"the client cancelled {self.rids[r]} while decode held its grant; the spec's "
                f"decode has {outcome} it, this decode still holds it 5 s later: {self._grant(r)}",
            )
        return None

    def _restart_prefill(self, s: State) -> State:
        """Crash and restart the real prefill while A's pages have landed and B's are held; the
        spec's decode detects the restart and fails every request granted to the old prefill."""
        from kvhandoff.spec.actions import DecodeDetectPrefillRestart, PrefillRestart

        cfg = self.config
        self.target.restart_prefill()
        self.target._decode_saw_prefill()
        for action in (PrefillRestart(), DecodeDetectPrefillRestart()):
            if action in enabled(REFERENCE, cfg, s):
                s = step(REFERENCE, cfg, s, action)
        s = _drive(cfg, s, _end_of(_B))
        self.outcomes["prefill_restart:" + s.requests[_A].d] = 1
        if s.requests[_B].d in ("failed", "released"):
            self.answer_ok.discard(_B)
        return s

    def _finish(self) -> Problem | None:
        c = self.cluster
        for r in (_A, _B, _C):
            c.resume_prefill_writes(self.rids[r])
        for r in sorted(self.answer_ok & set(self.threads)):
            th = self.threads.get(r)
            if th is not None:
                th.join(timeout=30)
            res = self.results.get(r)
            if res is None:
                return ("no_answer", "every_request_terminates", f"{self.rids[r]} unanswered")
            want = _canary(self.config, r)
            n = self.config.requests[r].pages * self.config.page_size
            if res.status != "ok" or list(res.tokens) != [want] * n:
                return (
                    "data",
                    "decode_reads_only_validated_pages",
                    f"{self.rids[r]} (an honest handoff beside the forged messages) was answered "
                    f"{res.status} {res.code} {res.error} with {len(res.tokens)} tokens, not the "
                    f"echo of its {n}-token prompt",
                )
        th = self.threads.get(_A)
        if th is not None:
            th.join(timeout=30)
        if not c.wait_quiescent(timeout=10):
            return (
                "not_quiescent",
                "every_request_terminates",
                f"after an adversarial round: {self.target.describe()}",
            )
        return None

    # ------------------------------------------------------------------ requests

    def _start_held(self, r: int, s: State) -> State:
        """Submit request r with its prefill's writes held; wait for decode's grant."""
        c = self.cluster
        rid = self.rids[r]
        if len(c.prefill_servers) > 1 or len(c.decode_servers) > 1:
            c.pin_placement(rid, 0, 0)
        c.stall_prefill_writes(rid, 0)
        spec = self.config.requests[r]
        tokens = [_canary(self.config, r)] * (spec.pages * self.config.page_size)

        def call() -> None:
            with c.client() as client:
                self.results[r] = client.generate(
                    spec.tenant, tokens, max_tokens=len(tokens), request_id=rid, timeout=30
                )

        th = threading.Thread(target=call, daemon=True)
        th.start()
        self.threads[r] = th
        try:
            self.grants[r] = c.wait_for_grant(rid, 0, timeout=10)
        except TimeoutError:
            self.grants[r] = None
        return _drive(self.config, s, _about(r))

    def _grant(self, r: int) -> Any:
        return self.cluster.decode_grant(self.rids[r])

    def _wait(self, cond: Callable[[], bool], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return True
            time.sleep(0.01)
        return cond()

    def _target_problem(self, why: str) -> Problem:
        # The spec's decode reserves pages for each of these requests (they fit its limits and
        # its pool, and nothing else runs): one that is never granted is a divergence.
        answers = {
            self.rids[r]: f"{res.status} {res.code} {res.error}".strip()
            for r, res in sorted(self.results.items())
        }
        return (
            "no_grant",
            "every_request_terminates",
            f"adversarial round of trace {self.trace_no}: {why} within 10 s "
            f"(answers so far: {answers or 'none'})",
        )

    # ------------------------------------------------------------------ messages

    def _decode_channel(self) -> Any:
        import grpc

        c = self.cluster
        tls = getattr(c, "_tls", {}).get("prefill")
        if tls is not None:  # mutual TLS: the suite calls decode as prefill does
            return grpc.secure_channel(c.decode, tls.channel_credentials())
        return grpc.insecure_channel(c.decode)

    def _page(self, rid: str, generation: int, index: int) -> bytes:
        size: int = self.cluster.decode_server.settings.shape.page_bytes
        seed = hashlib.sha256(f"{rid}/{generation}/{index}".encode()).digest()
        return (seed * (size // len(seed) + 1))[:size]

    def _write(
        self,
        rid: str,
        room: int,
        generation: int,
        token: bytes,
        page: int,
        data: bytes,
        claimed: bytes,
    ) -> bool:
        """One page write on its own stream; True when decode accepted it."""
        import grpc

        from kvhandoff.impl.pool import DTYPE_NAME
        from kvhandoff.impl.proto.gen.kvhandoff.v1 import handoff_pb2 as pb

        shape = self.cluster.decode_server.settings.shape
        self._mid += 1
        msg = pb.PageWrite(
            request_id=rid,
            room=room,
            generation=generation,
            token=token,
            message_id=self._mid,
            page_ids=[page],
            digests=[claimed],
            page_shape=list(shape.page_shape),
            dtype=DTYPE_NAME,
            data=data,
        )

        def stream() -> Iterator[Any]:
            yield msg

        try:
            summary = self._stub.WritePages(stream(), timeout=10)
        except grpc.RpcError:
            return False
        return int(summary.pages_accepted) > 0

    def _write_honest(self, r: int) -> int:
        from kvhandoff.impl.pool import page_digest

        g, rid = self.grants[r], self.rids[r]
        accepted = 0
        for i, page in enumerate(g.pages):
            data = self._page(rid, g.generation, i)
            accepted += self._write(
                rid, g.room, g.generation, g.token, int(page), data, page_digest(data)
            )
        return accepted

    def _completion_digest(self, r: int) -> bytes:
        from kvhandoff.impl.core.common import completion_digest
        from kvhandoff.impl.pool import page_digest

        g, rid = self.grants[r], self.rids[r]
        digests = [page_digest(self._page(rid, g.generation, i)) for i in range(len(g.pages))]
        return completion_digest(g.generation, [int(p) for p in g.pages], digests)

    def _send(self, attack: Attack) -> str | None:
        """Send the forged message of `attack`; the reaction's kind for a write (accepted or
        refused), None for a completion or ack (read from decode's log)."""
        import grpc

        from kvhandoff.impl.pool import page_digest
        from kvhandoff.impl.proto.gen.kvhandoff.v1 import handoff_pb2 as pb

        r, kind = attack.request, attack.kind
        g, rid = self.grants[r], self.rids[r]
        room, gen, token, pages = int(g.room), int(g.generation), bytes(g.token), g.pages
        forged = bytes(b ^ 0xFF for b in token) or b"forged"
        if kind in adversary.COMPLETION_ATTACKS:
            count, digest = len(pages), self._completion_digest(r)
            if kind == "completion_undercount":
                count -= 1
            elif kind == "completion_overcount":
                count += 1
            elif kind == "completion_bad_digest":
                digest = bytes(b ^ 0xFF for b in digest)
            elif kind == "completion_wrong_generation":
                gen += 1 << 20
            elif kind == "completion_wrong_room":
                room += 1000
            elif kind == "completion_forged_token":
                token = forged
            try:
                self._stub.Complete(
                    pb.Completion(
                        request_id=rid,
                        room=room,
                        generation=gen,
                        token=token,
                        page_count=count,
                        digest=digest,
                    ),
                    timeout=10,
                )
            except grpc.RpcError:
                pass
            return None
        if kind == "abort_ack_replay_released":
            try:
                self._stub.ReceiveAbortAck(
                    pb.AbortAck(request_id=rid, room=room, generation=gen, token=token), timeout=10
                )
            except grpc.RpcError:
                pass
            return None
        page = int(pages[0])
        data = self._page(rid, gen, 0)
        claimed = page_digest(data)
        if kind == "write_wrong_room":
            room += 1000
        elif kind == "write_wrong_generation":
            gen += 1 << 20
        elif kind == "write_page_not_granted":
            other = self.grants[_B if r == _A else _A]
            page = int(other.pages[0])
        elif kind == "write_forged_token":
            token = forged
        elif kind == "write_corrupt_data":
            data = bytes(b ^ 0x5A for b in data)
        ok = self._write(rid, room, gen, token, page, data, claimed)
        return "accepted" if ok else "refused"

    def _probe(self, attack: Attack, want: adversary.Expected) -> Problem | None:
        before = self._bookkeeping()
        lines = self._decode_lines()
        outcome = self._send(attack)
        after = self._bookkeeping()
        logged = self._decode_events(lines)
        rid = self.rids[attack.request]
        detail = "; ".join(
            f"{e.get('event')} {json.dumps(e.get('args'), sort_keys=True)}" for e in logged
        )[:400]
        if outcome is None:
            verdicts = [
                e["args"]
                for e in logged
                if e.get("event") == "decode_receive_completion"
                and e.get("args", {}).get("request_id") == rid
            ]
            if any(v.get("verdict") == "validated" and not v.get("ignored") for v in verdicts):
                outcome = "validated"
            elif verdicts and not all(v.get("ignored") for v in verdicts):
                outcome = "failed"
            else:
                outcome = "ignored"
        got = ProbeResult(outcome, before != after, detail)
        pair = f"{attack.kind}:{got.outcome}"
        self.outcomes[pair] = self.outcomes.get(pair, 0) + 1
        problem = adversary.judge(attack, want, got)
        if problem is None:
            return None
        return ("adversarial", want.prop, f"over gRPC, {rid}: {problem}")

    def _bookkeeping(self) -> tuple[object, ...]:
        from kvhandoff.conformance.inproc import _bookkeeping

        server = self.cluster.decode_server
        result: tuple[object, ...] = self.cluster.runtime.call(lambda: _bookkeeping(server.core))
        return result

    def _decode_log(self) -> Path:
        return Path(self.target.log_dir) / "decode.jsonl"

    def _decode_lines(self) -> int:
        path = self._decode_log()
        with path.open() as f:
            return sum(1 for _ in f)

    def _decode_events(self, skip: int) -> list[dict[str, Any]]:
        with self._decode_log().open() as f:
            lines = f.readlines()[skip:]
        return [json.loads(x) for x in lines if x.strip()]


def _any_none(d: dict[int, Any], keys: tuple[int, ...]) -> bool:
    return any(d.get(k) is None for k in keys)


def _canary(config: Config, r: int) -> int:
    from kvhandoff.conformance.grpc_target import canary_token

    return canary_token(config, config.requests[r].tenant)


__all__ = ["FINALES", "GrpcProber", "round_config"]
