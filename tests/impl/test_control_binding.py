"""Every control message between the workers binds request, room, generation and capability
token: one with any field wrong is refused with a status that names the field, and changes
nothing (the request it named still completes, its pages stay owned until then).

Driven at the sans-I/O cores, so each case is exact and fast; tests/impl/test_bad_input.py covers
the same refusals over gRPC for writes and completions, and the prefill abort below over gRPC too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from kvhandoff.impl.core import decode as dc
from kvhandoff.impl.core import prefill as pc
from kvhandoff.impl.core.common import Generation, PageId, Reply, RequestId, Room, Status, Tenant

PAGE = 4
TOKEN = b"T" * 16
RID = RequestId("r1")
ROOM = Room(7_000_001)


def reply(cmds: Sequence[object]) -> Reply:
    return next((c for c in cmds if isinstance(c, Reply)), Reply(Status.OK))


# ----------------------------------------------------------------------------------- prefill


@dataclass
class PrefillWithGrant:
    core: pc.PrefillCore
    generation: Generation
    pages: tuple[PageId, ...]


def prefill_writing() -> PrefillWithGrant:
    """A prefill that admitted r1 (8 tokens) and holds decode's grant: it is writing."""
    core = pc.PrefillCore(pc.PrefillConfig(page_size=PAGE, max_prompt_tokens=64))
    core.handle(pc.SubmitRequest(RID, Tenant("a"), ROOM, 8, 0.0))
    gen, pages = Generation(5), (PageId(0), PageId(1))
    cmds = core.handle(pc.GrantReceived(RID, ROOM, gen, pages, TOKEN, 8, 0.0))
    assert any(isinstance(c, pc.StartWrites) for c in cmds)
    return PrefillWithGrant(core, gen, pages)


@pytest.mark.parametrize(
    ("field", "status", "named"),
    [
        ("room", Status.INVALID_ARGUMENT, "room 7000002"),
        ("token", Status.PERMISSION_DENIED, "capability token"),
    ],
)
def test_an_abort_with_a_wrong_room_or_token_is_refused_and_the_writes_go_on(
    field: str, status: Status, named: str
) -> None:
    p = prefill_writing()
    kwargs = {"room": ROOM, "token": TOKEN, field: {"room": Room(ROOM + 1), "token": b"x"}[field]}
    cmds = p.core.handle(pc.AbortReceived(RID, kwargs["room"], p.generation, kwargs["token"]))  # type: ignore[arg-type]
    assert reply(cmds).status is status and named in reply(cmds).message
    assert not any(isinstance(c, pc.CancelWrites | pc.SendAbortAck) for c in cmds)
    assert p.core.active_requests() == {RID: "writing"}


def test_an_abort_with_a_wrong_room_does_not_kill_a_request_waiting_for_its_grant() -> None:
    # The bug of issue 15: the room was not checked, so a guessed generation killed the request.
    core = pc.PrefillCore(pc.PrefillConfig(page_size=PAGE, max_prompt_tokens=64))
    core.handle(pc.SubmitRequest(RID, Tenant("a"), ROOM, 8, 0.0))
    cmds = core.handle(pc.AbortReceived(RID, Room(ROOM + 1), Generation(1), TOKEN))
    assert reply(cmds).status is Status.INVALID_ARGUMENT
    assert core.active_requests() == {RID: "admitted"}
    # The right room still aborts it (decode may abort before its grant is delivered).
    cmds = core.handle(pc.AbortReceived(RID, ROOM, Generation(1), TOKEN))
    assert reply(cmds).status is Status.OK and core.active_requests() == {}


def test_an_abort_of_another_generation_is_acked_and_leaves_the_writes_alone() -> None:
    p = prefill_writing()
    cmds = p.core.handle(pc.AbortReceived(RID, ROOM, Generation(p.generation + 1), b"other"))
    assert reply(cmds).status is Status.OK
    assert not any(isinstance(c, pc.CancelWrites) for c in cmds)
    assert p.core.active_requests() == {RID: "writing"}


def test_the_right_abort_stops_the_writes_and_its_ack_echoes_the_token() -> None:
    p = prefill_writing()
    cmds = p.core.handle(pc.AbortReceived(RID, ROOM, p.generation, TOKEN))
    assert any(isinstance(c, pc.CancelWrites) for c in cmds)
    cmds = p.core.handle(pc.WritesFinished(RID, p.generation, Status.CANCELLED))
    acks = [c for c in cmds if isinstance(c, pc.SendAbortAck)]
    assert acks == [pc.SendAbortAck(RID, ROOM, p.generation, TOKEN)]


def test_an_early_abort_refuses_only_a_submit_for_its_own_room() -> None:
    core = pc.PrefillCore(pc.PrefillConfig(page_size=PAGE, max_prompt_tokens=64))
    core.handle(pc.AbortReceived(RID, Room(ROOM + 1), Generation(1), b""))
    cmds = core.handle(pc.SubmitRequest(RID, Tenant("a"), ROOM, 8, 0.0))
    assert core.active_requests() == {RID: "admitted"}, cmds
    other = RequestId("r2")
    core.handle(pc.AbortReceived(other, ROOM, Generation(1), b""))
    assert reply(core.handle(pc.SubmitRequest(other, Tenant("a"), ROOM, 8, 0.0))).status is (
        Status.ALREADY_EXISTS
    )


def test_an_abort_of_a_parked_grant_needs_its_token() -> None:
    core = pc.PrefillCore(pc.PrefillConfig(page_size=PAGE, max_prompt_tokens=64))
    core.handle(pc.GrantReceived(RID, ROOM, Generation(3), (PageId(0),), TOKEN, 4, 0.0))
    assert reply(core.handle(pc.AbortReceived(RID, ROOM, Generation(3), b"x"))).status is (
        Status.PERMISSION_DENIED
    )
    assert core.parked_grants == 1
    assert reply(core.handle(pc.AbortReceived(RID, ROOM, Generation(3), TOKEN))).status is (
        Status.OK
    )
    assert core.parked_grants == 0


def test_a_grant_for_the_wrong_room_or_an_older_generation_is_refused() -> None:
    p = prefill_writing()
    wrong_room = pc.GrantReceived(RID, Room(ROOM + 1), p.generation, p.pages, TOKEN, 8, 0.0)
    r = reply(p.core.handle(wrong_room))
    assert r.status is Status.INVALID_ARGUMENT and str(ROOM + 1) in r.message
    other_gen = pc.GrantReceived(RID, ROOM, Generation(p.generation + 1), p.pages, TOKEN, 8, 0.0)
    r = reply(p.core.handle(other_gen))
    assert r.status is Status.FAILED_PRECONDITION and str(p.generation) in r.message
    assert p.core.active_requests() == {RID: "writing"}


# ------------------------------------------------------------------------------------ decode


@dataclass
class DecodeWaiting:
    core: dc.DecodeCore
    grant: dc.SendGrant


def decode_waiting() -> DecodeWaiting:
    core = dc.DecodeCore(dc.DecodeConfig(num_pages=8, page_size=PAGE, max_prompt_tokens=32))
    cmds = core.handle(dc.SubmitRequest(RID, Tenant("a"), ROOM, 8, 4, TOKEN, 0.0))
    grant = next(c for c in cmds if isinstance(c, dc.SendGrant))
    return DecodeWaiting(core, grant)


WRONG = {
    "request_id": (RequestId("r9"), Status.NOT_FOUND, "r9"),
    "room": (Room(ROOM + 1), Status.INVALID_ARGUMENT, "room 7000002"),
    "generation": (None, Status.FAILED_PRECONDITION, "generation"),
    "token": (b"forged", Status.PERMISSION_DENIED, "capability token"),
}


def _fields(d: DecodeWaiting, field: str) -> dict[str, object]:
    good: dict[str, object] = {
        "request_id": RID,
        "room": ROOM,
        "generation": d.grant.generation,
        "token": TOKEN,
    }
    value = WRONG[field][0]
    good[field] = Generation(d.grant.generation + 1) if field == "generation" else value
    return good


@pytest.mark.parametrize("field", list(WRONG))
def test_a_completion_with_any_field_wrong_is_refused_and_the_request_waits_on(
    field: str,
) -> None:
    d = decode_waiting()
    f = _fields(d, field)
    ev = dc.CompletionReceived(f["request_id"], f["room"], f["generation"], f["token"], 2, b"")  # type: ignore[arg-type]
    r = reply(d.core.handle(ev))
    assert r.status is WRONG[field][1] and str(WRONG[field][2]) in r.message, r
    assert d.core.active_requests() == {RID: "waiting"}


@pytest.mark.parametrize("field", list(WRONG))
def test_a_write_with_any_field_wrong_is_refused_and_stores_nothing(field: str) -> None:
    d = decode_waiting()
    f = _fields(d, field)
    ev = dc.WriteReceived(
        f["request_id"],  # type: ignore[arg-type]
        f["room"],  # type: ignore[arg-type]
        f["generation"],  # type: ignore[arg-type]
        f["token"],  # type: ignore[arg-type]
        int(d.grant.pages[0]),
        0,
        b"d",
        b"d",
    )
    cmds = d.core.handle(ev)
    assert reply(cmds).status is WRONG[field][1], reply(cmds)
    assert not any(isinstance(c, dc.StorePage) for c in cmds)
    assert d.core.grant_of(RID).written == ()  # type: ignore[union-attr]


def releasing() -> DecodeWaiting:
    d = decode_waiting()
    cmds = d.core.handle(dc.CancelRequest(RID, "client cancel", 0.0))
    assert dc.SendAbort(RID, ROOM, d.grant.generation, TOKEN) in cmds
    assert d.core.active_requests() == {RID: "releasing"}
    return d


@pytest.mark.parametrize("field", list(WRONG))
def test_an_abort_ack_with_any_field_wrong_releases_nothing(field: str) -> None:
    d = releasing()
    f = _fields(d, field)
    ev = dc.AbortAckReceived(f["request_id"], f["room"], f["generation"], f["token"])  # type: ignore[arg-type]
    cmds = d.core.handle(ev)
    assert not any(isinstance(c, dc.ReleasePages) for c in cmds)
    assert d.core.active_requests() == {RID: "releasing"}
    assert d.core.free_pages == 8 - 2
    if field == "token":
        assert reply(cmds).status is Status.PERMISSION_DENIED
    good = dc.AbortAckReceived(RID, ROOM, d.grant.generation, TOKEN)
    assert any(isinstance(c, dc.ReleasePages) for c in d.core.handle(good))
    assert d.core.free_pages == 8


def test_a_rejection_for_the_wrong_room_leaves_the_request_waiting() -> None:
    d = decode_waiting()
    ev = dc.RejectionReceived(RID, Room(ROOM + 1), Status.OUT_OF_RANGE, "too long")
    r = reply(d.core.handle(ev))
    assert r.status is Status.INVALID_ARGUMENT and str(ROOM + 1) in r.message
    assert d.core.active_requests() == {RID: "waiting"}


def test_an_early_rejection_refuses_only_a_submit_for_its_own_room() -> None:
    core = dc.DecodeCore(dc.DecodeConfig(num_pages=8, page_size=PAGE, max_prompt_tokens=32))
    core.handle(dc.RejectionReceived(RID, Room(ROOM + 1), Status.ABORTED, "poison"))
    cmds = core.handle(dc.SubmitRequest(RID, Tenant("a"), ROOM, 8, 4, TOKEN, 0.0))
    assert reply(cmds).status is Status.OK and core.active_requests() == {RID: "waiting"}
    core.handle(dc.RejectionReceived(RequestId("r2"), ROOM, Status.ABORTED, "real"))
    cmds = core.handle(dc.SubmitRequest(RequestId("r2"), Tenant("a"), ROOM, 8, 4, TOKEN, 0.0))
    assert reply(cmds).status is Status.ABORTED


def test_an_admitted_request_whose_grant_never_comes_fails_and_tells_decode() -> None:
    # Issue 15, crash in flight: a hand-over that crossed a prefill restart was admitted by the
    # new prefill and held until the router's call timed out; now the grant has a deadline.
    core = pc.PrefillCore(
        pc.PrefillConfig(page_size=PAGE, max_prompt_tokens=64, grant_timeout_s=2.0)
    )
    core.handle(pc.SubmitRequest(RID, Tenant("a"), ROOM, 8, 10.0))
    assert core.handle(pc.Tick(11.9)) == []
    cmds = core.handle(pc.Tick(12.0))
    assert core.active_requests() == {}
    rejection = next(c for c in cmds if isinstance(c, pc.SendRejection))
    assert rejection.status is Status.DEADLINE_EXCEEDED and "within 2s" in rejection.reason
    answer = next(c for c in cmds if isinstance(c, pc.AnswerRequest))
    assert answer.status is Status.DEADLINE_EXCEEDED
    # A request that got its grant in time is not touched by the deadline.
    p = prefill_writing()
    assert p.core.handle(pc.Tick(1e9)) == []


def test_a_second_copy_of_a_validated_completion_is_answered_ok_and_changes_nothing() -> None:
    from kvhandoff.impl.core.common import completion_digest

    d = decode_waiting()
    for i, page in enumerate(d.grant.pages):
        d.core.handle(
            dc.WriteReceived(RID, ROOM, d.grant.generation, TOKEN, page, 0, b"%d" % i, b"%d" % i)
        )
    digest = completion_digest(d.grant.generation, d.grant.pages, [b"0", b"1"])
    done = dc.CompletionReceived(RID, ROOM, d.grant.generation, TOKEN, 2, digest)
    assert any(isinstance(c, dc.Generate) for c in d.core.handle(done))
    again = d.core.handle(done)  # while generating
    assert reply(again).status is Status.OK and not any(isinstance(c, dc.Generate) for c in again)
    d.core.handle(dc.GenerationFinished(RID, d.grant.generation, 4))
    assert reply(d.core.handle(done)).status is Status.OK  # after release
    forged = dc.CompletionReceived(RID, ROOM, d.grant.generation, b"forged", 2, digest)
    assert reply(d.core.handle(forged)).status is Status.NOT_FOUND
    assert d.core.free_pages == 8
