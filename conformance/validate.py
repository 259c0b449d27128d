"""Event-log validation: search for a spec behaviour that explains an implementation's events.

One matcher per event kind (the rows of `conformance.mapping.MAPPING`). A matcher proposes, for a
spec state, the spec action sequences that could have produced the event (an empty sequence is a
stutter, allowed only where the spec state already shows the event's effect) and checks the
event's outcome fields against the state the actions lead to. The validator keeps the set of spec
states consistent with the events so far (the frontier); an event that no frontier state can
explain is the first unexplained event, and the trace is rejected.

Logs of the three servers are merged by causality (request, generation, page and message
relations), never by wall-clock time: see `merge_logs`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kvhandoff.spec.actions import (
    Action,
    ClientCancelRequest,
    DecodeAdmitRequest,
    DecodeAnswer,
    DecodeDetectPrefillRestart,
    DecodeGenerate,
    DecodeReceiveAbortAck,
    DecodeReceiveCancel,
    DecodeReceiveCompletion,
    DecodeReceiveFailure,
    DecodeReceiveWrite,
    DecodeRejectRequest,
    DecodeReleasePages,
    DecodeReservePages,
    DecodeRestart,
    DecodeSuspectPrefillDead,
    DecodeWaitingTimeout,
    NetworkDropMessage,
    NetworkDuplicateMessage,
    PrefillAbortRequest,
    PrefillAdmitRequest,
    PrefillDetectDecodeRestart,
    PrefillReceiveAbort,
    PrefillReceiveCancel,
    PrefillReceiveGrant,
    PrefillRejectRequest,
    PrefillRestart,
    PrefillSendCompletion,
    PrefillWriteError,
    PrefillWritePage,
    RetransmitMessage,
    RouterRetryRequest,
    RouterSubmitRequest,
    action_to_json,
)
from kvhandoff.spec.config import Config, RequestSpec
from kvhandoff.spec.machine import enabled, is_enabled, step
from kvhandoff.spec.properties import check_always, check_always_after
from kvhandoff.spec.state import PREFILL_TERMINAL, Message, State, initial_state
from kvhandoff.spec.variants import REFERENCE, Variant

Event = dict[str, Any]
Candidate = tuple[Action, ...]

MAX_FRONTIER = 256


class LogError(ValueError):
    """A log file is malformed (the message names the file and line)."""


# --------------------------------------------------------------------------- id mapping


@dataclass
class Ids:
    """Implementation ids -> spec ids."""

    page_size: int
    requests: dict[str, int] = field(default_factory=dict)
    generations: dict[tuple[int, int], int] = field(default_factory=dict)
    """(decode instance, implementation generation) -> spec generation. Each decode instance
    numbers its generations on its own (two may issue the same one, in the spec as in real
    engines), so a generation names a grant only with the instance that issued it."""
    cancelled: set[int] = field(default_factory=set)
    decode_instances: dict[int, int] = field(default_factory=dict)
    """Spec request -> the decode instance it is placed on (absent: 0)."""

    def req(self, ev: Event) -> int | None:
        rid = ev["args"].get("request_id")
        return None if rid is None else self.requests.get(str(rid))

    def instance(self, ev: Event) -> int:
        """The decode instance of the request the line names (0 when it names none)."""
        r = self.req(ev)
        return 0 if r is None else self.decode_instances.get(r, 0)

    def gen(self, ev: Event) -> int | None:
        g = ev["args"].get("generation")
        return None if g is None else self.generations.get((self.instance(ev), int(g)))


def unchecked_config(**values: Any) -> Config:
    """A Config built without `__post_init__`'s size limits (which are for the explicit model):
    a live log can hold more requests than the model checker would explore."""
    cfg = object.__new__(Config)
    base = Config()
    for f in fields(Config):
        object.__setattr__(cfg, f.name, values.get(f.name, getattr(base, f.name)))
    return cfg


# --------------------------------------------------------------------------- matchers


@dataclass(frozen=True)
class Match:
    actions: Candidate
    check: Callable[[State, State], bool] | None = None


def _msgs(s: State, kind: str, r: int, gen: int | None) -> list[Message]:
    out = {
        m
        for m in s.network
        if m.kind == kind and m.request == r and (gen is None or m.generation == gen)
    }
    return sorted(out)


def _attempt(ev: Event) -> int:
    """The attempt an implementation line names (logged only for a retry: absent is 0)."""
    return int(ev["args"].get("attempt", 0))


def _of_attempt(msgs: list[Message], ev: Event) -> list[Message]:
    """The messages of the attempt the line names: a retried request's first attempt's late
    message and the retry's are told apart by it, as the spec's receivers tell them apart."""
    a = _attempt(ev)
    return [m for m in msgs if m.attempt == a]


def _lost(s: State, kind: str, r: int) -> list[Message]:
    return sorted({m for m in s.lost if m.kind == kind and m.request == r})


def _decode_waiting(s: State, r: int) -> bool:
    return s.requests[r].d in ("received", "admitted", "reserved")


def _answered(s: State, r: int, ok: bool) -> bool:
    a = s.requests[r].answer
    return a is not None and a.ok == ok


# Boot epochs by instance (see `spec/state.py`, "Instances": instance 0's are the plain fields).


def _prefill_epoch(s: State, i: int) -> int:
    return s.prefill_epoch if i == 0 else s.prefill_epochs[i - 1]


def _decode_epoch(s: State, j: int) -> int:
    return s.decode_epoch if j == 0 else s.decode_epochs[j - 1]


def _decode_sees(c: Config, s: State, j: int, i: int) -> int:
    """The boot epoch of prefill instance i that decode instance j last saw."""
    if i == 0 and j == 0:
        return s.decode_sees_prefill_epoch
    return s.decode_sees_prefill_epochs[j * c.prefill_instances + i - 1]


def _instance(ev: Event, name: str) -> int:
    """The instance a log line that names no request says logged it (absent: 0)."""
    return int(ev["args"].get(name, 0) or 0)


class Matchers:
    """One method per event kind; each returns the candidate explanations in a spec state."""

    def __init__(
        self, config: Config, ids: Ids, scrub: bool = True, accept_alarms: bool = False
    ) -> None:
        self.config = config
        self.ids = ids
        self.scrub = scrub
        self.accept_alarms = accept_alarms

    def _placed(self, r: int) -> tuple[int, int]:
        """(prefill instance, decode instance) request r is placed on."""
        q = self.config.requests[r]
        return q.prefill_instance, q.decode_instance

    def _restart_unseen(self, s: State, j: int, i: int) -> bool:
        """Prefill instance i restarted and decode instance j has not seen it yet."""
        return _decode_sees(self.config, s, j, i) != _prefill_epoch(s, i)

    def __call__(self, ev: Event, s: State) -> list[Match]:
        method = getattr(self, "m_" + str(ev.get("event")), None)
        if method is None:
            return []
        r = self.ids.req(ev)
        result: list[Match] = method(ev, s, r)
        return result

    # router
    def m_router_submit_request(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        return [Match((RouterSubmitRequest(r),), lambda a, b: b.requests[r].answer is None)]

    def m_router_retry_request(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        a = _attempt(ev)
        return [
            Match(
                (RouterRetryRequest(r),),
                lambda _, b: b.requests[r].answer is None and b.requests[r].attempt == a,
            )
        ]

    def m_router_reject_request(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        return [Match((RouterSubmitRequest(r),), lambda a, b: _answered(b, r, False))]

    def m_router_receive_prefill_result(self, ev: Event, s: State, r: int | None) -> list[Match]:
        return [Match(())]

    m_router_receive_decode_result = m_router_receive_prefill_result
    m_prefill_notice_failed = m_router_receive_prefill_result

    def m_client_cancel_request(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        self.ids.cancelled.add(r)
        if s.requests[r].answer is not None:
            # Decode already answered; the router was still waiting for prefill's result.
            return [Match(())]
        return [Match((ClientCancelRequest(r),))]

    def m_router_answer_client(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        ok = ev["args"].get("status") == "ok"
        if _answered(s, r, ok):
            return [Match(())]
        if not ok and ev["args"].get("code") == "CANCELLED" and r in self.ids.cancelled:
            # The client cancelled after decode's answer: it gets the cancel (fail closed).
            return [Match(())] if s.requests[r].answer is not None else []
        i, j = self._placed(r)
        req = s.requests[r]
        if not ok and req.answer is not None and req.d_epoch != _prefill_epoch(s, i):
            # The prefill that served the request crashed before the router heard its result:
            # the router answers an error although decode answered (fail closed).
            return [Match(())]
        if not ok and req.answer is not None and req.p_epoch != _decode_epoch(s, j):
            # Decode crashed after it answered, before its answer reached the router: the
            # router's call broke and it answers an error (fail closed).
            return [Match(())]
        if not ok and self._restart_unseen(s, j, i):
            # The router's call to a crashed prefill broke before decode's health check saw the
            # restart: the restart's detection, observed by the router first.
            detect = DecodeDetectPrefillRestart(dinst=j, pinst=i)
            return [Match((detect,), lambda a, b: _answered(b, r, False))]
        return []

    # prefill
    def m_prefill_restart(self, ev: Event, s: State, r: int | None) -> list[Match]:
        return [Match((PrefillRestart(pinst=_instance(ev, "prefill_instance")),))]

    def m_prefill_admit_request(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        args = ev["args"]
        truncated = "truncated_to" in args
        tokens = int(args.get("prompt_tokens", 0))
        if not truncated and -(-tokens // self.ids.page_size) != self.config.requests[r].pages:
            return []
        if s.requests[r].p == "lost":
            # The router's hand-over was still in flight when prefill crashed and reached the new
            # prefill (the spec hands over atomically at submission): a stutter.
            return [Match(())]
        if truncated:
            # Prefill kept only part of the prompt: the spec's answer to an over-limit prompt
            # (`prefill_reject_request`), explained only where the protocol truncates (M6).
            kept = -(-int(args["truncated_to"]) // self.ids.page_size)
            return [Match((PrefillRejectRequest(r),), lambda a, b: b.requests[r].p_len == kept)]
        return [Match((PrefillAdmitRequest(r),))]

    def m_prefill_reject_request(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        if s.requests[r].p == "lost" and "tenant" in ev["args"]:
            return [Match(())]
        return [Match((PrefillRejectRequest(r),))]

    def m_prefill_receive_grant(self, ev: Event, s: State, r: int | None) -> list[Match]:
        g = self.ids.gen(ev)
        if r is None or g is None:
            return []
        args = ev["args"]
        outcome = args.get("outcome")
        req = s.requests[r]
        out = []
        if outcome == "matched" and req.p_gen == g and req.p == "granted":
            out.append(Match(()))  # paired with a grant parked earlier
        for m in _of_attempt(_msgs(s, "grant", r, g), ev):
            if list(m.pages) != list(args.get("pages", [])):
                continue
            if outcome == "matched":
                out.append(Match((PrefillReceiveGrant(m),), _granted(r, g)))
            elif outcome == "parked" and _attempt(ev) < req.attempt:
                # A retried request's first-attempt grant, parked by a prefill that has not
                # seen the retry yet (a restarted one has no tombstone): the retry's submission
                # drops it, never adopts it.
                out.append(Match((PrefillReceiveGrant(m),), _grant_dropped(r)))
            elif outcome == "parked" and req.p in PREFILL_TERMINAL:
                # Parked for a request prefill will never see: dropped later (a stutter then).
                out.append(Match((PrefillReceiveGrant(m),), _grant_dropped(r)))
            elif outcome == "parked":
                out.append(Match((PrefillReceiveGrant(m),), _parked(r, g)))
            else:
                out.append(Match((PrefillReceiveGrant(m),), _grant_dropped(r)))
        if outcome == "stale_attempt" and not out:
            # A second copy of a first attempt's grant: dropped again, a stutter.
            out.append(Match((), _grant_dropped(r)))
        if outcome in ("refused", "dropped") and not out and req.p in PREFILL_TERMINAL:
            # A second copy of a grant prefill already refused (the network duplicated it):
            # refused again, prefill's state unchanged, so a stutter explains it.
            out.append(Match(()))
        return out

    def m_prefill_write_page(self, ev: Event, s: State, r: int | None) -> list[Match]:
        g = self.ids.gen(ev)
        if r is None or g is None:
            return []
        req = s.requests[r]
        if req.p_gen != g or req.p_wrote >= len(req.p_pages):
            return []
        if req.p_pages[req.p_wrote] != int(ev["args"].get("page", -1)):
            return []
        return [Match((PrefillWritePage(r),))]

    def m_prefill_send_completion(self, ev: Event, s: State, r: int | None) -> list[Match]:
        g = self.ids.gen(ev)
        if r is None or g is None or s.requests[r].p_gen != g:
            return []
        args = ev["args"]
        count = int(args.get("page_count", -1))
        if int(args.get("pages_written", count)) != s.requests[r].p_wrote:
            return []
        # What the completion claims (the pages written; the whole grant under M2) and whether
        # it carries a digest (not under M5) must be what the spec's prefill sends.
        return [Match((PrefillSendCompletion(r),), _completion_sent(r, g, count, args))]

    def m_prefill_receive_abort(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        msgs = _msgs(s, "abort", r, None)
        if ev["event"] == "prefill_receive_abort":
            # The abort's own attempt (the router's withdrawal, explained here too, names none).
            msgs = _of_attempt(msgs, ev)
        out = [Match((PrefillReceiveAbort(m),)) for m in msgs]
        stale = ev["event"] == "prefill_receive_abort" and _attempt(ev) < s.requests[r].attempt
        if ev["args"].get("outcome") == "stale_attempt" or stale:
            # A retried request's first-attempt abort: dropped as stale, or received by a
            # prefill that has not seen the retry yet (it acks it from that attempt's tombstone,
            # or keeps it for that attempt's submission, which never comes). Nothing of the
            # retry changes (a prefill that stops the retry then says so in its finish line,
            # `m_prefill_finish_request`, which no such abort explains).
            return [Match(a.actions, _grant_dropped(r)) for a in out] + [
                Match((), _grant_dropped(r))
            ]
        if s.requests[r].p in PREFILL_TERMINAL:
            out.append(Match(()))
        return out

    def m_prefill_cancel_request(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        if _attempt(ev) < s.requests[r].attempt:
            # The cancel of an earlier attempt of a retried request: the router's withdrawal of
            # it on decode's failure (decode's abort, by another path), reaching prefill after
            # the retry, or before it to a prefill that restarted and keeps it for that
            # attempt's submission, which never comes. Never the retry's cancel: nothing of the
            # retry changes (seed 3 of `conform --max-retries 1` took it for the retry's).
            msgs = _of_attempt(_msgs(s, "abort", r, None), ev)
            return [Match((PrefillReceiveAbort(m),), _grant_dropped(r)) for m in msgs] + [
                Match((), _grant_dropped(r))
            ]
        if not s.requests[r].p_cancel:
            # The router withdrawing the request on decode's failure: decode's abort, by
            # another path.
            return self.m_prefill_receive_abort(ev, s, r)
        out = [Match((PrefillReceiveCancel(r),))]
        if s.requests[r].p not in ("received", "admitted"):
            # Prefill already writes: the impl stops the stream on the router's word, the spec
            # on decode's abort (sent once the cancel reaches decode).
            out += self.m_prefill_receive_abort(ev, s, r)
        return out

    def m_prefill_drop_orphan_grant(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is not None and _attempt(ev) < s.requests[r].attempt:
            return [Match(())]  # a first attempt's grant, parked after the retry (see above)
        if r is None or s.requests[r].p not in PREFILL_TERMINAL:
            return []
        return [Match(())]

    def m_prefill_finish_request(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        # A stutter: the end of a request prefill's log already ended (a received abort, a
        # rejection), or a write stream that broke because decode refused a write of a request
        # it had failed (stricter than the spec). A request still waiting for its grant has
        # neither: its error finish is prefill's own abort, unless prefill says decode aborted
        # it (then it is the end of that abort's receipt, never a failure of prefill's own: a
        # retry ended by its first attempt's abort is a broken attempt fence, not a fault).
        out = [Match(())] if s.requests[r].p != "admitted" else []
        by_decode = str(ev["args"].get("reason", "")).startswith("decode aborted")
        if ev["args"].get("status") != "ok" and not by_decode:
            # Between writes, prefill's own abort; with writes of the grant still on the wire, a
            # failed write (the two guards split the states between them).
            out.append(Match((PrefillAbortRequest(r),)))
            out.append(Match((PrefillWriteError(r),)))
        return out

    # decode
    def m_decode_restart(self, ev: Event, s: State, r: int | None) -> list[Match]:
        return [Match((DecodeRestart(dinst=_instance(ev, "decode_instance")),))]

    def m_decode_admit_request(self, ev: Event, s: State, r: int | None) -> list[Match]:
        return [] if r is None else [Match((DecodeAdmitRequest(r),))]

    def m_decode_reject_request(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        code = ev["args"].get("code")
        over = [Match((DecodeRejectRequest(r),))] if code == "OUT_OF_RANGE" else []
        # Refused because prefill's notice or the router's withdrawal came first: as for
        # decode_abort_request (a stutter if decode already failed it, else that notice).
        return over + self.m_decode_abort_request(ev, s, r)

    def m_decode_reserve_pages(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        pages = tuple(int(p) for p in ev["args"].get("pages", ()))
        return [Match((DecodeReservePages(r),), lambda a, b: b.requests[r].d_pages == pages)]

    def m_decode_receive_write(self, ev: Event, s: State, r: int | None) -> list[Match]:
        g = self.ids.gen(ev)
        if r is None or g is None:
            return []
        args = ev["args"]
        if args.get("late"):
            return []
        page = int(args.get("page", -1))
        room = self.config.requests[r].room
        accepted = args.get("outcome") == "accepted"
        out = []
        for w in sorted(set(s.writes)):
            if w.room != room or w.generation != g or w.page != page or w.data.request != r:
                continue
            owner = s.pages[page].owner
            spec_accepts = owner is not None and owner == (r, g)
            # Decode refusing a write for a request it already failed (not_waiting) is stricter
            # than the spec, which lets it land in a page nobody will read before the scrub.
            stricter = (
                not accepted and args.get("reason") == "not_waiting" and s.requests[r].d == "failed"
            )
            if spec_accepts == accepted or stricter:
                out.append(Match((DecodeReceiveWrite(w),)))
        return out

    def m_decode_receive_completion(self, ev: Event, s: State, r: int | None) -> list[Match]:
        g = self.ids.gen(ev)
        if r is None or g is None:
            return []
        args = ev["args"]
        verdict = args.get("verdict")
        ignored = bool(args.get("ignored"))
        out = []
        for m in _of_attempt(_msgs(s, "completion", r, g), ev):
            if ignored:
                check = _unchanged_decode(r)
            elif verdict == "validated":
                # This very completion must be what validates: a second `validated` verdict
                # (a duplicate completion decode took again) is not explained by the first.
                check = _becomes(r, "validated")
            else:
                check = _decode_phase(r, "failed")
            out.append(Match((DecodeReceiveCompletion(m),), check))
        if ignored and not out:
            # A second copy of a completion decode already received (the network duplicated
            # it): refused, and decode's state is unchanged, so a stutter explains it.
            out.append(Match((), _unchanged_decode(r)))
        return out

    def m_decode_receive_rejection(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        out = [
            Match((DecodeReceiveFailure(m),), _decode_failed_or_unchanged(r))
            for m in _of_attempt(_msgs(s, "failure", r, None), ev)
        ]
        if ev["args"].get("outcome") == "stale_attempt" or _attempt(ev) != s.requests[r].attempt:
            # A notice of a retried request's first attempt: dropped (decode holds the retry), or
            # kept for that attempt's submission, which never comes: the retry is untouched.
            return [Match(a.actions, _unchanged_decode(r)) for a in out] + [
                Match((), _unchanged_decode(r))
            ]
        if not _decode_waiting(s, r):
            out.append(Match(()))
        return out

    def m_decode_abort_request(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        if _attempt(ev) != s.requests[r].attempt:
            # An early withdrawal of a retried request's first attempt, which reached decode
            # after the retry was handed over: it refuses only that attempt's submission.
            return [Match(())]
        if s.requests[r].d_cancel:
            # The client cancelled (the router then answers nothing else, relays no failure):
            # this is its word reaching decode.
            return [Match((DecodeReceiveCancel(r),))]
        if not _decode_waiting(s, r):
            return [Match(())]
        # Decode withdraws the attempt it holds: a notice of that attempt (a first attempt's
        # late notice is dropped, `decode_receive_rejection` with outcome stale_attempt).
        a = s.requests[r].attempt
        out = [
            Match((DecodeReceiveFailure(m),))
            for m in _msgs(s, "failure", r, None)
            if m.attempt == a
        ]
        out += [
            Match((RetransmitMessage(m), DecodeReceiveFailure(m)))
            for m in _lost(s, "failure", r)
            if m.attempt == a
        ]
        return out

    def m_decode_waiting_timeout(self, ev: Event, s: State, r: int | None) -> list[Match]:
        return [] if r is None else [Match((DecodeWaitingTimeout(r),))]

    def m_decode_receive_abort_ack(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        out = [
            Match((DecodeReceiveAbortAck(m),))
            for m in _of_attempt(_msgs(s, "abort_ack", r, None), ev)
        ]
        if not out:
            out.append(Match(()))
        return out

    def m_decode_detect_prefill_restart(self, ev: Event, s: State, r: int | None) -> list[Match]:
        named = ev["args"].get("failed")
        # Decode instance j's view of prefill instance i (both 0 with one instance of each).
        j, i = _instance(ev, "decode_instance"), _instance(ev, "prefill_instance")
        detect = DecodeDetectPrefillRestart(dinst=j, pinst=i)
        if "new_epoch" in ev["args"] and ev["args"]["new_epoch"] is None:
            # Missed health checks say nothing of why: a partition (prefill alive) or a prefill
            # that really crashed and stays down (SGLang's crash_down finding), which the spec
            # explains as the crash and its detection. Both are offered; the search keeps the
            # one the rest of the log agrees with.
            # The restart first: where the spec's prefill did restart, that is the explanation.
            out: list[Match] = []
            if self._restart_unseen(s, j, i) and (
                named is None or self._fails_as_named(s, named, j, i)
            ):
                out.append(Match((detect,)))
            return out + self._suspected_dead(s, named, j, i)
        if self._restart_unseen(s, j, i):
            if named is not None and not self._fails_as_named(s, named, j, i):
                return []
            return [Match((detect,))]
        return [Match(())]

    def _on(self, q: int, j: int, i: int) -> bool:
        """Request q is placed on decode instance j and prefill instance i."""
        return self._placed(q) == (i, j)

    def _suspected_dead(
        self, s: State, named: list[Any] | None, j: int = 0, i: int = 0
    ) -> list[Match]:
        """Decode's health checks of prefill missed and it took prefill for dead, with no new
        epoch (the log's `new_epoch` is null): a partition, `decode_suspect_prefill_dead`, which
        fails every request the spec's decode waits on (`reserved`). The line must name exactly
        those: one it kept would go on to be served by the live prefill, which the spec's
        decode no longer allows. Waiting on none, decode's suspicion changes nothing: a stutter."""
        waiting = {
            q for q, req in enumerate(s.requests) if req.d == "reserved" and self._on(q, j, i)
        }
        failed = set()
        for rid in named or ():
            q = self.ids.requests.get(str(rid))
            if q is None:
                return []
            failed.add(q)
        if not waiting:
            return [Match(())] if not failed else []
        if named is not None and failed != waiting:
            return []
        return [Match((DecodeSuspectPrefillDead(dinst=j, pinst=i),))]

    def _fails_as_named(self, s: State, named: list[Any], j: int = 0, i: int = 0) -> bool:
        """The requests a restart detection says it failed: only requests the spec's step fails
        (waiting on the old prefill), and at least those whose grant that prefill held."""
        failed = set()
        for rid in named:
            q = self.ids.requests.get(str(rid))
            if q is None:
                return False
            failed.add(q)
        may = {
            q
            for q, req in enumerate(s.requests)
            if req.d in ("received", "admitted", "reserved")
            and self._on(q, j, i)
            and req.d_epoch != _prefill_epoch(s, i)
        }
        must = {
            q
            for q in may
            if s.requests[q].d == "reserved" and s.requests[q].p_gen == s.requests[q].d_gen
        }
        return must <= failed <= may

    def m_decode_generate(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        pages = tuple(int(p) for p in ev["args"].get("pages", ()))
        if s.requests[r].d_pages != pages:
            return []
        if _cancelled_while_validated(s, r):
            # The client cancelled after validation: the impl's generation was already under
            # way; its output is discarded (the client got the cancel error).
            return [Match(())]
        return [Match((DecodeGenerate(r),))]

    def m_decode_answer(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        if ev["args"].get("status") == "ok":
            if _cancelled_while_validated(s, r):
                return [Match(())]
            if _cancelled(s, r):
                # The cancel was still on its way to decode: decode's answer goes to a router
                # that already told the client CANCELLED.
                return [Match((DecodeAnswer(r),))]
            return [Match((DecodeAnswer(r),), lambda a, b: _answered(b, r, True))]
        if not _decode_waiting(s, r):
            return [Match(())] if s.requests[r].answer is not None else []
        # Decode fails a request it was waiting for: the grant's reply carried prefill's verdict
        # (the failure notice, by another path, possibly after the notice itself was lost).
        out = [
            Match((DecodeReceiveFailure(m),), lambda a, b: _answered(b, r, False))
            for m in _msgs(s, "failure", r, None)
        ]
        out += [
            Match(
                (RetransmitMessage(m), DecodeReceiveFailure(m)), lambda a, b: _answered(b, r, False)
            )
            for m in _lost(s, "failure", r)
        ]
        if ev["args"].get("cause") == "grant_failed" and s.requests[r].d == "reserved":
            # Decode could not deliver this request's grant (the call broke: prefill crashed
            # under it) and gave up on this one request, aborting its generation and fencing
            # its pages: the spec's decode giving up on a reserved request, which it may do at
            # any moment (decode_waiting_timeout). Not the restart's detection, which fails
            # every request handed over for the lost prefill, including hand-overs that reach
            # the real decode after this and are admitted (seed 305 trace 41).
            out.append(Match((DecodeWaitingTimeout(r),), lambda a, b: _answered(b, r, False)))
        i, j = self._placed(r)
        if self._restart_unseen(s, j, i):
            # Decode saw the crashed prefill's write stream or grant call break before its
            # health check saw the new epoch: the restart's detection, by another path.
            detect = DecodeDetectPrefillRestart(dinst=j, pinst=i)
            out.append(Match((detect,), lambda a, b: _answered(b, r, False)))
        return out

    def m_decode_release_pages(self, ev: Event, s: State, r: int | None) -> list[Match]:
        if r is None:
            return []
        pages = tuple(int(p) for p in ev["args"].get("pages", ()))
        if s.requests[r].d_pages != pages:
            return []
        if bool(ev["args"].get("scrubbed", True)) != self.scrub:
            return []  # field mapping: `scrubbed` is the design's scrub-on-release
        return [Match((DecodeReleasePages(r),))]

    def m_invariant_alarm(self, ev: Event, s: State, r: int | None) -> list[Match]:
        # Decode noticed a broken invariant: never explained by a safe protocol; a stutter when
        # validating against a variant that breaks it on purpose.
        return [Match(())] if self.accept_alarms else []

    # harness-injected faults
    def _harness_messages(self, ev: Event, s: State, r: int | None, lost: bool) -> list[Message]:
        if r is None:
            return []
        kind = str(ev["args"].get("kind"))
        g = self.ids.gen(ev) if ev["args"].get("generation") else None
        pool = s.lost if lost else s.network
        a = _attempt(ev)
        return sorted(
            {
                m
                for m in pool
                if m.kind == kind
                and m.request == r
                and (g is None or m.generation == g)
                and m.attempt == a
            }
        )

    def m_network_drop_message(self, ev: Event, s: State, r: int | None) -> list[Match]:
        return [Match((NetworkDropMessage(m),)) for m in self._harness_messages(ev, s, r, False)]

    def m_network_duplicate_message(self, ev: Event, s: State, r: int | None) -> list[Match]:
        return [
            Match((NetworkDuplicateMessage(m),)) for m in self._harness_messages(ev, s, r, False)
        ]

    def m_retransmit_message(self, ev: Event, s: State, r: int | None) -> list[Match]:
        out = [Match((RetransmitMessage(m),)) for m in self._harness_messages(ev, s, r, True)]
        # The spec already received that content by another path (the router relays prefill's
        # failure and decode's abort too): the resent copy is a duplicate, a stutter here.
        return out or [Match(())]


def _cancelled(s: State, r: int) -> bool:
    answer = s.requests[r].answer
    return answer is not None and answer.reason == "cancelled by the client"


def _cancelled_while_validated(s: State, r: int) -> bool:
    req = s.requests[r]
    return (
        req.d == "failed"
        and req.read is None
        and _cancelled(s, r)
        and req.accepted_full is not None
    )


def _granted(r: int, g: int) -> Callable[[State, State], bool]:
    return lambda a, b: b.requests[r].p == "granted" and b.requests[r].p_gen == g


def _parked(r: int, g: int) -> Callable[[State, State], bool]:
    return lambda a, b: b.requests[r].p in ("received", "admitted") and b.requests[r].p_gen == g


def _completion_sent(
    r: int, g: int, count: int, args: dict[str, Any]
) -> Callable[[State, State], bool]:
    digest = args.get("digest")

    def sent(a: State, b: State) -> bool:
        for m in b.network:
            if m.kind != "completion" or m.request != r or m.generation != g:
                continue
            if m.count == count and (digest is None or (m.digest is None) == (digest == "")):
                return True
        return False

    return sent


def _grant_dropped(r: int) -> Callable[[State, State], bool]:
    return lambda a, b: a.requests[r] == b.requests[r]


def _unchanged_decode(r: int) -> Callable[[State, State], bool]:
    return lambda a, b: (
        (a.requests[r].d, a.requests[r].answer)
        == (
            b.requests[r].d,
            b.requests[r].answer,
        )
    )


def _decode_phase(r: int, phase: str) -> Callable[[State, State], bool]:
    return lambda a, b: b.requests[r].d == phase


def _becomes(r: int, phase: str) -> Callable[[State, State], bool]:
    return lambda a, b: a.requests[r].d != phase and b.requests[r].d == phase


def _decode_failed_or_unchanged(r: int) -> Callable[[State, State], bool]:
    return lambda a, b: b.requests[r].d == "failed" or a.requests[r].d == b.requests[r].d


def _extend(hist: tuple[Any, ...], actions: Candidate) -> tuple[Any, ...]:
    """Histories are linked (parent, actions) pairs: extending one is O(1), not O(length)."""
    return (hist, actions) if actions else hist


def flatten_history(hist: tuple[Any, ...]) -> tuple[Action, ...]:
    """A frontier state's action history as a flat tuple of spec actions."""
    return _flatten(hist)


def _flatten(hist: tuple[Any, ...]) -> tuple[Action, ...]:
    parts: list[Candidate] = []
    while hist:
        hist, actions = hist
        parts.append(actions)
    return tuple(a for actions in reversed(parts) for a in actions)


MATCHED_KINDS: frozenset[str] = frozenset(
    name[2:] for name in dir(Matchers) if name.startswith("m_")
)
SILENT_ACTIONS: tuple[type, ...] = (
    RetransmitMessage,
    PrefillDetectDecodeRestart,
    # A worker logs nothing for a cancel of a request it already finished.
    DecodeReceiveCancel,
    PrefillReceiveCancel,
)


# --------------------------------------------------------------------------- the validator


@dataclass
class ValidationReport:
    ok: bool
    events: int
    explained: int
    """Length of the longest explained prefix."""
    first_unexplained: Event | None = None
    enabled_there: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""
    violated: list[str] = field(default_factory=list)
    spec_actions: list[dict[str, Any]] = field(default_factory=list)
    """One spec behaviour explaining the explained prefix."""

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": "explained" if self.ok else "unexplained",
            "events": self.events,
            "explained": self.explained,
            "first_unexplained": self.first_unexplained,
            "enabled_there": self.enabled_there,
            "violated": self.violated,
            "message": self.message,
        }


class Validator:
    """Incremental: feed events one at a time (`feed`), or all at once (`run`)."""

    def __init__(
        self,
        config: Config,
        ids: Ids,
        variant: Variant = REFERENCE,
        silent: Sequence[type] = SILENT_ACTIONS,
        check_properties: bool = True,
    ) -> None:
        self.config = config
        self.ids = ids
        if config.decode_instances > 1:
            ids.decode_instances.update(
                {r: q.decode_instance for r, q in enumerate(config.requests)}
            )
        self.variant = variant
        self.silent = tuple(silent)
        self.check_properties = check_properties
        self.matchers = Matchers(
            config, ids, variant.design.scrub, accept_alarms=bool(variant.breaks)
        )
        init = initial_state(config)
        # frontier: state -> one action history reaching it (for reports)
        self.frontier: dict[State, tuple[Action, ...]] = {init: ()}
        self.count = 0
        self.failed: ValidationReport | None = None
        self._enabled_cache: dict[int, tuple[State, frozenset[Action]]] = {}
        # States known to satisfy every `always` property, by identity (the entry keeps the state
        # alive, so the id is not reused): a state stepped from one of them is checked only in
        # what differs (`check_always_after`).
        self._good: dict[int, State] = {}
        if not check_always(config, init):
            self._good[id(init)] = init

    def _enabled(self, s: State) -> frozenset[Action]:
        # Keyed by identity (the entry keeps the state alive, so the id is not reused): hashing
        # a whole state is the validator's main cost.
        got = self._enabled_cache.get(id(s))
        if got is None or got[0] is not s:
            if len(self._enabled_cache) > 4096:
                self._enabled_cache.clear()
            got = (s, frozenset(enabled(self.variant, self.config, s)))
            self._enabled_cache[id(s)] = got
        return got[1]

    def _apply(self, s: State, actions: Candidate) -> State | None:
        for a in actions:
            if not is_enabled(self.variant, self.config, s, a):
                return None
            s = step(self.variant, self.config, s, a)
        return s

    def _violated(self, s: State, base: State) -> list[str]:
        """The `always` properties `s` breaks; `base` is the frontier state it was reached from."""
        if self._good.get(id(base)) is base:
            failed = check_always_after(self.config, base, s)
        else:
            failed = check_always(self.config, s)
        return [p.name for p in failed]

    def _bind(self, ev: Event, before: State, after: State) -> None:
        if ev.get("event") == "decode_reserve_pages":
            r = self.ids.req(ev)
            if r is not None:
                key = (self.ids.instance(ev), int(ev["args"]["generation"]))
                self.ids.generations[key] = after.requests[r].d_gen

    def _explain(
        self, ev: Event, frontier: dict[State, tuple[Action, ...]], base: dict[int, State]
    ) -> dict[State, tuple[Action, ...]]:
        """The states explaining `ev` after `frontier`; `base` maps each state of `frontier` (by
        its identity) to the frontier state it was reached from, and is extended to the new
        states."""
        new: dict[State, tuple[Action, ...]] = {}
        # Reserve binds the generation from the state it is matched in.
        for s, hist in frontier.items():
            for match in self.matchers(ev, s):
                after = self._apply(s, match.actions)
                if after is None or (match.check is not None and not match.check(s, after)):
                    continue
                if not new:
                    new = {after: _extend(hist, match.actions)}
                    base[id(after)] = base[id(s)]
                elif after not in new:
                    new[after] = _extend(hist, match.actions)
                    base[id(after)] = base[id(s)]
                if ev.get("event") == "decode_reserve_pages":
                    self._bind(ev, s, after)
                if len(new) >= MAX_FRONTIER:
                    return new
        return new

    def _silent_successors(
        self, frontier: dict[State, tuple[Action, ...]], base: dict[int, State]
    ) -> dict[State, tuple[Action, ...]]:
        out: dict[State, tuple[Action, ...]] = {}
        for s, hist in frontier.items():
            for a in self._enabled(s):
                if isinstance(a, self.silent):
                    t = step(self.variant, self.config, s, a)
                    if t not in frontier and t not in out:
                        out[t] = _extend(hist, (a,))
                        base[id(t)] = base[id(s)]
        return out

    def take_silent(self, action: Action) -> None:
        """Step every frontier state where `action` (an unlogged spec step) is enabled."""
        new = {}
        for st, hist in self.frontier.items():
            if action in self._enabled(st):
                new[step(self.variant, self.config, st, action)] = _extend(hist, (action,))
        if new:
            self.frontier = new

    def advance(
        self, ev: Event, frontier: dict[State, tuple[Action, ...]]
    ) -> tuple[dict[State, tuple[Action, ...]], list[str]]:
        """The states explaining `ev` after `frontier` (trying up to two unlogged spec steps
        first when nothing explains it directly), and the properties violated if every such
        state breaks one."""
        # By identity: a state's hash is not kept, and every state here stays alive (in
        # `frontier`, a layer or `new`) while `base` is used.
        base = {id(s): s for s in frontier}
        new = self._explain(ev, frontier, base)
        layer = frontier
        layers = [layer]  # alive until `base` is done with, so that no id names two states
        for _ in range(2):
            if new:
                break
            layer = self._silent_successors(layer, base)
            layers.append(layer)
            if not layer:
                break
            new = self._explain(ev, layer, base)
        if new and self.check_properties:
            violated = {id(s): self._violated(s, base[id(s)]) for s in new}
            bad = [s for s in new if violated[id(s)]]
            if len(bad) == len(new):
                return {}, violated[id(bad[0])]
            for s in bad:
                del new[s]
            if len(self._good) > 4096:
                self._good.clear()
            for s in new:
                self._good[id(s)] = s
        return new, []

    def feed(self, ev: Event) -> bool:
        if self.failed is not None:
            return False
        new, violated = self.advance(ev, self.frontier)
        if not new:
            self.failed = self._report_failure(ev, violated)
            return False
        self.frontier = new
        self.count += 1
        return True

    def _report_failure(self, ev: Event, violated: Sequence[str] = ()) -> ValidationReport:
        enabled_there: list[dict[str, Any]] = []
        seen: set[Action] = set()
        for s in list(self.frontier)[:4]:
            for a in enabled(self.variant, self.config, s):
                if a not in seen:
                    seen.add(a)
                    enabled_there.append(action_to_json(a))
        hist = _flatten(next(iter(self.frontier.values()), ()))
        what = f"{ev.get('server')} #{ev.get('seq')} {ev.get('event')} {json.dumps(ev.get('args'), sort_keys=True)}"
        message = (
            f"event {self.count + 1} is unexplained: {what}"
            if not violated
            else f"event {self.count + 1} leads only to states violating {', '.join(violated)}: {what}"
        )
        return ValidationReport(
            ok=False,
            events=0,
            explained=self.count,
            first_unexplained=ev,
            enabled_there=enabled_there,
            message=message,
            violated=list(violated),
            spec_actions=[action_to_json(a) for a in hist],
        )

    def report(self, total: int | None = None) -> ValidationReport:
        if self.failed is not None:
            self.failed.events = total if total is not None else self.count + 1
            return self.failed
        hist = _flatten(next(iter(self.frontier.values()), ()))
        return ValidationReport(
            ok=True,
            events=self.count if total is None else total,
            explained=self.count,
            message=f"all {self.count} events explained by {len(hist)} spec steps",
            spec_actions=[action_to_json(a) for a in hist],
        )

    def run(self, events: Iterable[Event]) -> ValidationReport:
        evs = list(events)
        for ev in evs:
            if not self.feed(ev):
                break
        return self.report(len(evs))


# --------------------------------------------------------------------------- logs


def read_log(path: Path) -> tuple[dict[str, Any], list[Event]]:
    try:
        lines = [_json_line(x) for x in path.read_text().splitlines() if x.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        raise LogError(f"{path}: {exc}") from exc
    if not lines or not isinstance(lines[0], dict) or lines[0].get("kind") != "event_log":
        raise LogError(f"{path}: line 1 is not an event-log header (kind: event_log)")
    return lines[0], lines[1:]


_raw_decode = json.JSONDecoder().raw_decode


def _json_line(line: str) -> Any:
    """`json.loads(line)`, quicker for the usual line (one JSON value, nothing around it);
    any other line is left to `json.loads`, for its value or its error, word for word."""
    try:
        value, end = _raw_decode(line)
    except json.JSONDecodeError:
        return json.loads(line)
    return value if end == len(line) else json.loads(line)


def _facts(
    ev: Event, sent: dict[tuple[Any, Any], list[Any]] | None = None
) -> tuple[list[list[tuple[Any, ...]]], list[tuple[Any, ...]]]:
    """(requirements as any-of groups, facts produced) of one event, for the causal merge.
    `sent`: pages prefill put on each write stream so far (a completion follows their landing)."""
    a = ev.get("args", {})
    k = ev.get("event")
    rid = a.get("request_id")
    gen = a.get("generation")
    req: list[list[tuple[Any, ...]]] = []
    prod: list[tuple[Any, ...]] = []
    if k in ("router_submit_request", "router_reject_request"):
        prod.append(("submitted", rid))
    elif k in (
        "prefill_admit_request",
        "decode_admit_request",
        "decode_reject_request",
    ) or (k == "prefill_reject_request" and "tenant" in a):
        req.append([("submitted", rid)])
        if k == "prefill_reject_request":
            prod.append(("prefill_ended", rid))
        if k == "decode_reject_request" and a.get("code") == "CANCELLED":
            # Refused on a withdrawal that overtook the submit: after whatever caused it.
            req.append([("cancelled", rid), ("prefill_ended", rid)])
    elif k == "prefill_restart":
        prod.append(("prefill_epoch", a.get("prefill_instance", 0), a.get("boot_epoch")))
    elif k == "decode_detect_prefill_restart" and a.get("new_epoch") is not None:
        req.append([("prefill_epoch", a.get("prefill_instance", 0), a.get("new_epoch"))])
    elif k == "decode_reserve_pages":
        prod.append(("granted", rid, gen))
    elif k == "prefill_receive_grant":
        req.append([("granted", rid, gen)])
    elif k == "prefill_write_page":
        prod.append(("sent", rid, gen, a.get("page")))
    elif k == "decode_receive_write":
        req.append([("sent", rid, gen, a.get("page"))])
        prod.append(("landed", rid, gen, a.get("page")))
    elif k == "prefill_send_completion":
        for page in (sent or {}).get((rid, gen), []):
            req.append([("landed", rid, gen, page)])
        prod.append(("completion", rid))
    elif k == "decode_receive_completion":
        # Any completion of that request (a stale or forged generation is the validator's call).
        req.append([("completion", rid)])
        prod.append(("completion_answered", rid))
    elif k == "prefill_finish_request":
        if a.get("status") == "ok":
            req.append([("completion_answered", rid)])
        prod.append(("prefill_ended", rid))
    elif k == "decode_receive_rejection":
        req.append([("prefill_ended", rid)])
    elif k == "decode_answer":
        prod.append(("decode_ended", rid))
    elif k == "router_receive_prefill_result":
        req.append([("prefill_ended", rid)])
    elif k == "router_receive_decode_result":
        req.append([("decode_ended", rid)])
    elif k == "client_cancel_request":
        prod.append(("cancelled", rid))
    elif k == "decode_abort_request":
        req.append([("cancelled", rid), ("prefill_ended", rid)])
        prod.append(("abort", rid, gen))
    elif k == "prefill_cancel_request":
        req.append([("cancelled", rid), ("decode_ended", rid)])
        if a.get("early"):
            prod.append(("prefill_ended", rid))  # prefill will refuse the request
    elif k == "decode_waiting_timeout":
        prod.append(("abort", rid, gen))
    elif k == "prefill_receive_abort":
        req.append([("abort", rid, gen), ("decode_ended", rid)])
        prod.append(("abort_received", rid, gen))
    elif k == "decode_receive_abort_ack":
        req.append([("abort_received", rid, gen)])
    elif k == "router_answer_client":
        req.append([("decode_ended", rid), ("prefill_ended", rid), ("cancelled", rid)])
    return req, prod


Facts = tuple[list[list[tuple[Any, ...]]], list[tuple[Any, ...]]]


class _FactsOnce:
    """`_facts` of each event, computed once per event (the merge and the search ask again and
    again whether a log's next event is ready): only a completion's requirements depend on the
    pages sent so far, and those are computed each time."""

    def __init__(self) -> None:
        self._memo: dict[int, tuple[Event, Facts]] = {}  # by identity; the entry keeps ev alive

    def __call__(self, ev: Event, sent: dict[tuple[Any, Any], list[Any]]) -> Facts:
        if ev.get("event") == "prefill_send_completion":
            return _facts(ev, sent)
        got = self._memo.get(id(ev))
        if got is None or got[0] is not ev:
            got = (ev, _facts(ev))
            self._memo[id(ev)] = got
        return got[1]


def merge_logs(logs: Sequence[Sequence[Event]]) -> list[Event]:
    """Interleave per-server logs (each in its own order) respecting causality: an event waits
    until the events it depends on (by request, generation, page and message) are placed. Among
    ready events, router first, then prefill, then decode. Falls back to the first head when
    nothing is ready (a dependency that was never logged)."""
    order = {"router": 0, "harness": 0, "prefill": 1, "decode": 2}
    queues = sorted(
        (list(log) for log in logs if log),
        key=lambda q: order.get(role_and_instance(str(q[0].get("server", "")))[0], 3),
    )
    pos = [0] * len(queues)
    facts_of = _FactsOnce()
    known: set[tuple[Any, ...]] = set()
    sent: dict[tuple[Any, Any], list[Any]] = {}
    out: list[Event] = []
    total = sum(len(q) for q in queues)
    while len(out) < total:
        chosen = None
        for i, q in enumerate(queues):
            if pos[i] >= len(q):
                continue
            reqs, _ = facts_of(q[pos[i]], sent)
            if all(any(f in known for f in group) for group in reqs):
                chosen = i
                break
        if chosen is None:
            chosen = next(i for i, q in enumerate(queues) if pos[i] < len(q))
        ev = queues[chosen][pos[chosen]]
        pos[chosen] += 1
        out.append(ev)
        known.update(facts_of(ev, sent)[1])
        if ev.get("event") == "prefill_write_page":
            a = ev.get("args", {})
            sent.setdefault((a.get("request_id"), a.get("generation")), []).append(a.get("page"))
    return out


def _submissions_merged(queues: Sequence[Sequence[Event]]) -> Sequence[Event]:
    """Events holding every submission in the order `merge_logs` puts them (what
    `config_from_logs` reads). The merge keeps each log's own order, so when one log holds all
    the submissions (the router's), that log is it; otherwise the merge decides."""
    kinds = ("router_submit_request", "router_reject_request")
    holders = [q for q in queues if any(ev.get("event") in kinds for ev in q)]
    if len(holders) <= 1:
        return holders[0] if holders else []
    return merge_logs(queues)


MAX_EXPANSIONS_PER_EVENT = 200


def search_logs(
    headers: Sequence[dict[str, Any]],
    logs: Sequence[Sequence[Event]],
    variant: Variant = REFERENCE,
    deployment: Deployment | None = None,
) -> ValidationReport:
    """Validate per-server logs by searching over their interleavings: each server's events stay
    in their order, an event waits for the events it causally depends on, and a spec behaviour
    must explain the whole interleaving. Depth-first, in the causal merge's preference order
    (router, prefill, decode), backtracking when an event cannot be explained; interleavings
    that failed from the same point with the same spec states are not tried twice."""
    queues = [list(q) for q in logs if q]
    config, ids = config_from_logs(headers, _submissions_merged(queues), deployment)
    v = Validator(config, ids, variant)
    total = sum(len(q) for q in queues)
    Frontier = dict[State, tuple[Action, ...]]
    Sent = dict[tuple[Any, Any], list[Any]]

    # Shared, undone on backtracking: facts known (with multiplicity) and pages sent per stream.
    known: dict[tuple[Any, ...], int] = {}
    sent: Sent = {}
    facts_of = _FactsOnce()

    def ready(pos: tuple[int, ...]) -> Iterator[int]:
        """The heads to try at `pos`, in order: those whose causes are in place, else every head.
        Lazily: the next one is looked for only once the ones before it failed (the shared facts
        are then as they were at `pos` again), so most steps look at one head only."""
        heads = [i for i, q in enumerate(queues) if pos[i] < len(q)]
        found = False
        for i in heads:
            if is_ready(i, pos):
                found = True
                yield i
        if not found:
            yield from heads

    def is_ready(i: int, pos: tuple[int, ...]) -> bool:
        for group in facts_of(queues[i][pos[i]], sent)[0]:
            if known.keys().isdisjoint(group):  # not one of the group's facts is known
                return False
        return True

    def apply_facts(ev: Event) -> tuple[list[tuple[Any, ...]], tuple[Any, Any] | None]:
        produced = facts_of(ev, sent)[1]
        for f in produced:
            known[f] = known.get(f, 0) + 1
        key = None
        if ev.get("event") == "prefill_write_page":
            a = ev.get("args", {})
            key = (a.get("request_id"), a.get("generation"))
            sent.setdefault(key, []).append(a.get("page"))
        return produced, key

    def undo_facts(produced: list[tuple[Any, ...]], key: tuple[Any, Any] | None) -> None:
        for f in produced:
            known[f] -= 1
            if not known[f]:
                del known[f]
        if key is not None:
            sent[key].pop()

    # Stack frames: (pos, frontier, candidates left to try, facts this frame's event added).
    start = tuple(0 for _ in queues)
    Frame = tuple[
        tuple[int, ...],
        Frontier,
        Iterator[int],
        tuple[list[tuple[Any, ...]], tuple[Any, Any] | None],
    ]
    stack: list[Frame] = [(start, dict(v.frontier), ready(start), ([], None))]
    dead: set[tuple[tuple[int, ...], frozenset[State]]] = set()
    budget = MAX_EXPANSIONS_PER_EVENT * max(1, total)
    best: tuple[int, Event | None, list[str], Frontier] = (-1, None, [], {})
    best_rank: tuple[bool, int, bool] = (False, -1, False)
    # The deepest point where no log's next event had its causes in place:
    # (depth, positions, frontier, facts known, pages sent per stream).
    stuck: tuple[int, tuple[int, ...], Frontier, set[Any], Sent] = (-1, start, {}, set(), {})
    while stack:
        pos, frontier, todo, added = stack[-1]
        depth = sum(pos)
        if depth == total:
            hist = _flatten(next(iter(frontier.values()), ()))
            return ValidationReport(
                ok=True,
                events=total,
                explained=total,
                message=f"all {total} events explained by {len(hist)} spec steps",
                spec_actions=[action_to_json(a) for a in hist],
            )
        i = next(todo, None) if budget > 0 else None
        if i is None:
            stack.pop()
            undo_facts(*added)
            dead.add((pos, frozenset(frontier)))
            if budget <= 0:
                break
            continue
        budget -= 1
        ev = queues[i][pos[i]]
        new, violated = v.advance(ev, frontier)
        if not new:
            # Report the deepest failure of an event whose causes were all in place (a head
            # tried only as a fallback fails for want of them, not on its own).
            rank = (is_ready(i, pos), depth, bool(violated))
            if rank > best_rank:
                best_rank = rank
                best = (depth, ev, violated, frontier)
            continue
        npos = (*pos[:i], pos[i] + 1, *pos[i + 1 :])
        if dead and (npos, frozenset(new)) in dead:
            continue
        facts = apply_facts(ev)
        stack.append((npos, new, ready(npos), facts))
        ndepth = depth + 1
        if ndepth > stuck[0] and ndepth < total:
            heads = [j for j, q in enumerate(queues) if npos[j] < len(q)]
            if not any(is_ready(j, npos) for j in heads):
                stuck = (ndepth, npos, new, set(known), {k: list(x) for k, x in sent.items()})
    depth, failed_ev, violated, frontier = best
    ev = failed_ev or {}
    unplaced = None
    if not best_rank[0] and stuck[0] >= depth:
        # No event whose causes were in place failed: the logs order some events against their
        # causes (each log's own order forbids every interleaving). Name the first such event and
        # its causal predecessors, not whichever event the fallback happened to try.
        depth, stuck_pos, frontier, stuck_known, stuck_sent = stuck
        unplaced = _unplaced(queues, stuck_pos, stuck_known, stuck_sent)
        if unplaced is not None:
            ev = unplaced[0]
            violated = []
    v.frontier = frontier or v.frontier
    v.count = max(0, depth)
    rep = v._report_failure(ev, violated)
    rep.events = total
    if unplaced is not None:
        rep.message = f"event {depth + 1} cannot be placed: {unplaced[1]}"
    if budget <= 0:
        rep.message += " (search budget exhausted)"
    return rep


def _describe(ev: Event) -> str:
    a = ev.get("args", {})
    keys = ("request_id", "generation", "page", "verdict", "outcome", "status")
    what = ", ".join(f"{k} {a[k]}" for k in keys if k in a)
    return f"{ev.get('server')} #{ev.get('seq')} {ev.get('event')} ({what})"


def _unplaced(
    queues: Sequence[Sequence[Event]],
    pos: tuple[int, ...],
    known: set[Any],
    sent: dict[tuple[Any, Any], list[Any]],
) -> tuple[Event, str] | None:
    """At a point where no log's next event has its causes in place: the first such event (in
    the merge's order) whose missing causes are logged somewhere later, and a sentence naming its
    causal predecessors: those placed, and for each missing one, the event that logs it and what
    that event waits behind in its own log (or that it was never logged)."""
    heads = [i for i, q in enumerate(queues) if pos[i] < len(q)]

    def producers(fact: tuple[Any, ...]) -> list[tuple[int, int]]:
        out = []
        for j, q in enumerate(queues):
            for k in range(pos[j], len(q)):
                if fact in _facts(q[k])[1]:
                    out.append((j, k))
                    break
        return out

    placed_sent: dict[tuple[Any, Any], list[Any]] = {k: list(x) for k, x in sent.items()}
    candidates = []
    for i in heads:
        ev = queues[i][pos[i]]
        reqs = _facts(ev, placed_sent)[0]
        missing = [g for g in reqs if not any(f in known for f in g)]
        if not missing:
            continue
        later = [producers(f) for g in missing for f in g]
        candidates.append((i, ev, reqs, missing, later))
    if not candidates:
        return None
    head_of = {j: queues[j][pos[j]] for j in heads}
    # Log j must place its next event before log i's head can be: i waits for j. A head on a
    # cycle of such waits is where the logs' orders contradict causality; a head that only
    # waits for one (the router's answer waiting for decode's) is downstream of it.
    waits_for = {c[0]: {j for prods in c[4] for j, _ in prods} for c in candidates}

    def on_cycle(i: int) -> bool:
        seen, todo = set(), list(waits_for.get(i, ()))
        while todo:
            j = todo.pop()
            if j == i:
                return True
            if j not in seen:
                seen.add(j)
                todo += waits_for.get(j, ())
        return False

    i, ev, reqs, missing, later = next((c for c in candidates if on_cycle(c[0])), candidates[0])
    parts = []
    satisfied = [g for g in reqs if g not in missing]
    if satisfied:
        before = []
        for j, q in enumerate(queues):
            for k in range(pos[j]):
                if any(f in _facts(q[k])[1] for g in satisfied for f in g):
                    before.append(_describe(q[k]))
        parts.append("its causes placed so far: " + "; ".join(before[-6:]))
    waits = []
    for g in missing:
        found = [p for f in g for p in producers(f)]
        need = " or ".join(" ".join(str(x) for x in f) for f in g)
        if not found:
            waits.append(f"{need}: never logged")
            continue
        j, k = found[0]
        where = _describe(queues[j][k])
        if k > pos[j]:
            where += f", which {queues[j][k].get('server')} logged after {_describe(head_of[j])}"
        waits.append(f"{need}: logged by {where}")
    parts.insert(0, "it waits for " + "; ".join(waits))
    return ev, f"{_describe(ev)}: " + "; ".join(parts)


def config_from_logs(
    headers: Sequence[dict[str, Any]],
    events: Sequence[Event],
    deployment: Deployment | None = None,
) -> tuple[Config, Ids]:
    """The spec scenario a merged log plays: requests in the router's order, limits in pages;
    with `deployment` (several instances), each request where the logs show it ran."""
    hc: dict[str, Any] = {}
    for h in headers:
        hc.update(h.get("config", {}))
    page_size = int(hc.get("page_size", 4))
    ids = Ids(page_size)
    rooms: dict[int, int] = {}
    reqs: list[RequestSpec] = []
    for ev in events:
        if ev.get("event") not in ("router_submit_request", "router_reject_request"):
            continue
        a = ev["args"]
        rid = str(a["request_id"])
        if rid in ids.requests:
            continue
        ids.requests[rid] = len(reqs)
        room = rooms.setdefault(int(a.get("room", 0)), len(rooms) + 1)
        pages = max(1, -(-int(a.get("prompt_tokens", 1)) // page_size))
        pinst, dinst = deployment.placed.get(rid, (0, 0)) if deployment else (0, 0)
        reqs.append(RequestSpec(str(a.get("tenant", "t")) or "t", pages, room, pinst, dinst))
    n = max(1, len(reqs))
    big = 10**9

    def pages_of(key: str, default: int) -> int:
        return int(hc.get(key, default * page_size)) // page_size

    window = pages_of("context_window", 64)
    pool = int(hc.get("decode_pages", hc.get("num_pages", 64)))
    several: dict[str, Any] = {}
    if deployment is not None:
        several = {
            "prefill_instances": deployment.prefills,
            "decode_instances": deployment.decodes,
            "placement": "fixed",
        }
    config = unchecked_config(
        decode_pages=pool * (deployment.decodes if deployment else 1),
        page_size=page_size,
        prefill_pool_pages=int(hc.get("prefill_pages", 64)),
        context_window=window,
        prefill_max_prompt=pages_of("prefill_max_prompt", window),
        decode_max_prompt=pages_of("decode_max_prompt", window),
        requests=tuple(reqs) or (RequestSpec("t", 1, 1),),
        max_active=n,
        submit_in_order=True,
        max_faults=big,
        max_crashes=big,
        max_drops=0,
        max_duplicates=0,
        max_timeouts=big,
        max_cancels=big,
        max_prefill_aborts=big,
        max_partitions=big,
        max_write_errors=big,
        **several,
    )
    return config, ids


def validate_events(
    headers: Sequence[dict[str, Any]], events: Sequence[Event], variant: Variant = REFERENCE
) -> ValidationReport:
    config, ids = config_from_logs(headers, events)
    return Validator(config, ids, variant).run(events)


@dataclass(frozen=True)
class Deployment:
    """Several prefill or decode instances, each logging to a file of its own (`kvhandoff
    serve all --prefill-instances 2 ...`): how many of each, and where each request ran."""

    prefills: int
    decodes: int
    placed: dict[str, tuple[int, int]]
    """Request id -> (prefill instance, decode instance), from the logs that name it."""


def server_name(role: str, instance: int) -> str:
    """The `server` of an instance's lines once its log is read with others: the role for
    instance 0 (a deployment of one of each reads as before), `decode1`, ... for the others."""
    return f"{role}{instance}" if instance else role


def role_and_instance(server: str) -> tuple[str, int]:
    """`server_name` read back: ("decode", 1) for "decode1"."""
    role = server.rstrip("0123456789")
    return role, int(server[len(role) :] or 0)


def _instance_of(path: Path, header: dict[str, Any]) -> int:
    value = header.get("config", {}).get("instance", 0)
    if not isinstance(value, int) or value < 0:
        raise LogError(f"{path}: header's instance {value!r} is not a number >= 0")
    return value


def instance_logs(files: Sequence[tuple[Path, dict[str, Any], list[Event]]]) -> list[list[Event]]:
    """Each server's log (a header and its lines) as the validator reads several instances of a
    role: every line's `server` names its instance (`server_name`), a line about no request says
    which instance logged it, and page numbers are the spec's, decode instance j's pages the j-th
    block of the spec's pool (`Config.page_instance`; prefill's lines name its request's decode
    pages). Logs of one server per role come back as they are. Refused: an instance's log given
    twice, or missing while a later instance's is there."""
    seen: dict[tuple[str, int], Path] = {}
    for path, header, _ in files:
        role = str(header.get("server"))
        if role in ("prefill", "decode"):
            key = (role, _instance_of(path, header))
            if key in seen:
                raise LogError(
                    f"{path} and {seen[key]} are both the log of {role} instance {key[1]}: give "
                    "each server's log once"
                )
            seen[key] = path
    counts = {
        role: 1 + max((i for r, i in seen if r == role), default=0)
        for role in ("prefill", "decode")
    }
    if counts["prefill"] == 1 and counts["decode"] == 1:
        return [events for _, _, events in files]
    for role, n in counts.items():
        missing = [i for i in range(n) if (role, i) not in seen]
        if missing:
            raise LogError(
                f"the logs name {role} instance {n - 1} but not instance(s) {missing}: every "
                "instance's log is needed to validate a run"
            )
    decode_of: dict[str, int] = {}
    for path, header, events in files:
        if header.get("server") == "decode":
            k = _instance_of(path, header)
            for ev in events:
                rid = ev.get("args", {}).get("request_id")
                if rid is not None:
                    decode_of.setdefault(str(rid), k)
        elif header.get("server") == "router":
            for ev in events:
                j = ev.get("args", {}).get("decode_instance")
                if ev.get("event") in ("router_submit_request", "router_retry_request") and (
                    isinstance(j, int)
                ):
                    decode_of[str(ev["args"].get("request_id"))] = j
    pool = int(files[0][1].get("config", {}).get("decode_pages", 64))
    out: list[list[Event]] = []
    for path, header, events in files:
        role = str(header.get("server"))
        if role not in ("prefill", "decode"):
            out.append(events)
            continue
        k = _instance_of(path, header)
        moved: list[Event] = []
        for ev in events:
            args = dict(ev.get("args", {}))
            rid = args.get("request_id")
            if rid is None:
                args.setdefault(f"{role}_instance", k)
                base = pool * k if role == "decode" else 0
            else:
                base = pool * decode_of.get(str(rid), 0)
            if isinstance(args.get("page"), int):
                args["page"] += base
            if isinstance(args.get("pages"), list):
                args["pages"] = [q + base for q in args["pages"]]
            moved.append({**ev, "server": server_name(role, k), "args": args})
        out.append(moved)
    return out


def deployment_of(
    logs: Sequence[Sequence[Event]], headers: Sequence[dict[str, Any]] = ()
) -> Deployment | None:
    """The deployment logs read by `instance_logs` come from, when it has several instances of
    a role (None for one of each): the instances are those the lines' servers and the headers
    name, a request placed where the router's submission line says (`prefill_instance`,
    `decode_instance`), else where its lines were logged."""
    counts = {"prefill": 1, "decode": 1}
    for h in headers:
        role = str(h.get("server"))
        if role in counts:
            instance = h.get("config", {}).get("instance", 0)
            if isinstance(instance, int):
                counts[role] = max(counts[role], instance + 1)
    placed: dict[str, list[int]] = {}
    declared: dict[str, list[int]] = {}
    for log in logs:
        for ev in log:
            args = ev.get("args", {})
            rid = args.get("request_id")
            if ev.get("event") in ("router_submit_request", "router_retry_request"):
                # The router names the placement where it had a choice: what it says holds
                # even for a worker that never logged the request (a hand-over lost in a crash).
                i, j = args.get("prefill_instance"), args.get("decode_instance")
                if isinstance(i, int) and isinstance(j, int):
                    declared[str(rid)] = [i, j]
                    counts["prefill"] = max(counts["prefill"], i + 1)
                    counts["decode"] = max(counts["decode"], j + 1)
            role, k = role_and_instance(str(ev.get("server", "")))
            if role not in counts:
                continue
            counts[role] = max(counts[role], k + 1)
            if rid is not None:
                placed.setdefault(str(rid), [0, 0])[0 if role == "prefill" else 1] = k
    placed.update(declared)
    if counts["prefill"] == 1 and counts["decode"] == 1:
        return None
    return Deployment(
        counts["prefill"], counts["decode"], {r: (p, d) for r, (p, d) in placed.items()}
    )


def validate_logs(paths: Sequence[Path], variant: Variant = REFERENCE) -> ValidationReport:
    """Validate the event logs of a run (one file per server, any order; one per instance
    where a role has several)."""
    headers: list[dict[str, Any]] = []
    logs: list[list[Event] | int] = []  # an int: the index of a per-server file in `files`
    files: list[tuple[Path, dict[str, Any], list[Event]]] = []
    for p in paths:
        h, evs = read_log(p)
        headers.append(h)
        if h.get("server") == "merged":
            # One file holding all servers' events (as the conformance campaign saves them),
            # instances apart (`server_name`).
            roles = ("router", "prefill", "decode", "harness")
            by_server: dict[str, list[Event]] = {}
            for e in evs:
                by_server.setdefault(str(e.get("server")), []).append(e)
            placed = {
                (roles.index(role), k): server
                for server in by_server
                for role, k in [role_and_instance(server)]
                if role in roles
            }
            logs.extend(by_server[placed[key]] for key in sorted(placed))
        else:
            logs.append(len(files))
            files.append((p, h, evs))
    read = instance_logs(files)
    queues = [read[q] if isinstance(q, int) else q for q in logs]
    return search_logs(headers, queues, variant, deployment_of(queues, headers))


__all__ = [
    "MATCHED_KINDS",
    "Deployment",
    "Ids",
    "LogError",
    "ValidationReport",
    "Validator",
    "config_from_logs",
    "deployment_of",
    "instance_logs",
    "merge_logs",
    "read_log",
    "role_and_instance",
    "search_logs",
    "server_name",
    "unchecked_config",
    "validate_events",
    "validate_logs",
]
