"""A client's cancel reaches decode and prefill by calls of their own (spec/machine.py)."""

from __future__ import annotations

from kvhandoff.spec import REFERENCE, Config, RequestSpec, enabled, init, step
from kvhandoff.spec.actions import (
    Action,
    ClientCancelRequest,
    DecodeAdmitRequest,
    DecodeAnswer,
    DecodeGenerate,
    DecodeReceiveCancel,
    DecodeReceiveCompletion,
    DecodeReceiveWrite,
    DecodeReleasePages,
    DecodeReservePages,
    PrefillAdmitRequest,
    PrefillReceiveAbort,
    PrefillReceiveCancel,
    PrefillReceiveGrant,
    PrefillSendCompletion,
    PrefillWritePage,
    RouterSubmitRequest,
)
from kvhandoff.spec.properties import check_always
from kvhandoff.spec.state import State, all_done

ONE = Config(decode_pages=1, requests=(RequestSpec("a", 1, 1),), max_faults=1)


def take(state: State, kind: type) -> State:
    """Step the one enabled action of `kind` (there must be exactly one)."""
    options: list[Action] = [a for a in enabled(REFERENCE, ONE, state) if isinstance(a, kind)]
    assert len(options) == 1, (kind.__name__, options)
    after = step(REFERENCE, ONE, state, options[0])
    assert check_always(ONE, after) == []
    return after


def until_completion_sent() -> State:
    s = init(ONE)
    for kind in (
        RouterSubmitRequest,
        PrefillAdmitRequest,
        DecodeAdmitRequest,
        DecodeReservePages,
        PrefillReceiveGrant,
        PrefillWritePage,
        DecodeReceiveWrite,
        PrefillSendCompletion,
    ):
        s = take(s, kind)
    return s


def test_a_cancel_is_answered_at_once_and_reaches_decode_later() -> None:
    s = take(until_completion_sent(), ClientCancelRequest)
    req = s.requests[0]
    assert req.answer is not None and not req.answer.ok
    assert req.d == "reserved" and req.d_cancel
    assert not req.p_cancel  # prefill already completed: the router has nothing to stop there


def test_a_completion_on_its_way_is_validated_before_the_cancel_arrives_and_nothing_leaks() -> None:
    s = take(until_completion_sent(), ClientCancelRequest)
    for kind in (DecodeReceiveCompletion, DecodeGenerate, DecodeAnswer, DecodeReleasePages):
        s = take(s, kind)
    req = s.requests[0]
    assert req.answer is not None and req.answer.reason == "cancelled by the client"
    assert req.d == "released" and req.d_cancel
    s = take(s, DecodeReceiveCancel)  # a no-op now: decode finished with the request
    assert not s.requests[0].d_cancel and s.requests[0].d == "released"
    assert all_done(ONE, s)


def test_a_cancel_reaching_a_waiting_decode_fails_it_and_aborts_prefill() -> None:
    s = init(ONE)
    for kind in (RouterSubmitRequest, PrefillAdmitRequest, DecodeAdmitRequest, DecodeReservePages):
        s = take(s, kind)
    s = take(s, ClientCancelRequest)
    assert s.requests[0].d_cancel and s.requests[0].p_cancel
    s = take(s, DecodeReceiveCancel)
    assert s.requests[0].d == "failed"
    assert sorted(m.kind for m in s.network) == ["abort", "grant"]
    # The router's word reaches prefill first: it stops a request it has not started writing,
    # and decode's abort then finds nothing to stop.
    s = take(s, PrefillReceiveCancel)
    assert s.requests[0].p == "aborted" and not s.requests[0].p_cancel
    s = take(s, PrefillReceiveAbort)
    assert s.requests[0].p == "aborted"


def test_the_cancel_reaching_a_writing_prefill_leaves_the_stop_to_decodes_abort() -> None:
    s = init(ONE)
    for kind in (RouterSubmitRequest, PrefillAdmitRequest, DecodeAdmitRequest):
        s = take(s, kind)
    s = take(s, ClientCancelRequest)
    for kind in (DecodeReservePages, PrefillReceiveGrant):
        s = take(s, kind)
    assert s.requests[0].p == "granted" and s.requests[0].p_cancel
    s = take(s, PrefillReceiveCancel)
    assert s.requests[0].p == "granted"  # only decode's abort fences the grant's generation
