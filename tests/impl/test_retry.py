"""Client retries under the same request id: the router numbers the attempts, every message
about a request carries its attempt, and prefill and decode drop a message of another attempt
than the one they hold (the spec's `router_retry_request` with `Design.attempt_fence`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvhandoff.impl.cluster import Cluster
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
)
from kvhandoff.impl.core.inprocess import InProcessCluster
from kvhandoff.impl.modes import Behaviour
from kvhandoff.impl.tokenizer import encode

RID = RequestId("r1")
ROOM = Room(7)


def _reply(cmds: Sequence[object]) -> Reply:
    return next((c for c in cmds if isinstance(c, Reply)), Reply(Status.OK))


def _logs(cmds: Sequence[object], kind: str) -> list[dict[str, object]]:
    return [dict(c.args) for c in cmds if isinstance(c, Log) and c.kind == kind]


def _prefill() -> pc.PrefillCore:
    return pc.PrefillCore(pc.PrefillConfig(page_size=4, max_prompt_tokens=64))


def _decode() -> dc.DecodeCore:
    return dc.DecodeCore(dc.DecodeConfig(num_pages=8, page_size=4, max_prompt_tokens=64))


# ------------------------------------------------------------------------------ end to end


def test_a_retry_after_an_error_is_served_under_the_same_id() -> None:
    n = InProcessCluster(Behaviour())
    n.fail_writes.add(RID)
    n.submit(RID, "A", 12)
    n.run()
    assert n.answers[RID].status is not Status.OK
    assert not n.router.active_requests()
    n.fail_writes.clear()
    n.submit(RID, "A", 12, retry=True)
    n.run()
    assert n.answers[RID].status is Status.OK
    assert set(n.answers[RID].read_tenants) == {"A"}
    assert n.decode.used_pages == 0 and not n.decode.active_requests()
    retried = [a for s, k, a in n.log if k == "router_retry_request"]
    assert retried and retried[0]["attempt"] == 1


def test_the_router_refuses_a_retry_that_follows_no_error() -> None:
    n = InProcessCluster(Behaviour())
    # Never submitted: nothing to retry.
    assert n.to_router(rc.ClientSubmit(RID, Tenant("A"), ROOM, 12, 4, 0.0, retry=True)).status is (
        Status.FAILED_PRECONDITION
    )
    # Answered OK: nothing to retry either.
    n.submit(RID, "A", 12)
    n.run()
    assert n.answers[RID].status is Status.OK
    reply = n.to_router(rc.ClientSubmit(RID, Tenant("A"), ROOM, 12, 4, 0.0, retry=True))
    assert reply.status is Status.FAILED_PRECONDITION


def test_the_router_refuses_a_retry_by_another_tenant_and_past_its_limit() -> None:
    n = InProcessCluster(Behaviour())
    n.fail_writes.add(RID)
    n.submit(RID, "A", 12)
    n.run()
    assert n.to_router(rc.ClientSubmit(RID, Tenant("B"), ROOM, 12, 4, 0.0, retry=True)).status is (
        Status.FAILED_PRECONDITION
    )
    n.submit(RID, "A", 12, retry=True)  # attempt 1 fails again (writes still fail)
    n.run()
    assert n.answers[RID].status is not Status.OK
    reply = n.to_router(rc.ClientSubmit(RID, Tenant("A"), ROOM, 12, 4, 0.0, retry=True))
    assert reply.status is Status.RESOURCE_EXHAUSTED and "max_retries=1" in reply.message


# ------------------------------------------------------------------------------ prefill


def test_prefill_tombstones_are_per_attempt() -> None:
    p = _prefill()
    p.handle(pc.SubmitRequest(RID, Tenant("A"), ROOM, 8, 0.0))
    assert _reply(p.handle(pc.FailRequest(RID, Status.ABORTED, "injected"))).status is Status.OK
    # A replay of attempt 0 is refused, as before.
    replay = p.handle(pc.SubmitRequest(RID, Tenant("A"), ROOM, 8, 0.0))
    assert _reply(replay).status is Status.ALREADY_EXISTS
    # The retry (attempt 1) is admitted.
    retry = p.handle(pc.SubmitRequest(RID, Tenant("A"), ROOM, 8, 0.0, attempt=1))
    assert _reply(retry).status is Status.OK and _logs(retry, "prefill_admit_request")
    assert p.attempt_of(RID) == 1
    # A replay of attempt 1 while it is in progress, and of attempt 0, stay refused.
    again = p.handle(pc.SubmitRequest(RID, Tenant("A"), ROOM, 8, 0.0, attempt=1))
    assert _reply(again).status is Status.ALREADY_EXISTS
    old = p.handle(pc.SubmitRequest(RID, Tenant("A"), ROOM, 8, 0.0, attempt=0))
    assert _reply(old).status is Status.ALREADY_EXISTS


def test_a_stale_first_attempt_abort_does_not_stop_the_retry_at_prefill() -> None:
    p = _prefill()
    p.handle(pc.SubmitRequest(RID, Tenant("A"), ROOM, 8, 0.0))
    p.handle(pc.FailRequest(RID, Status.ABORTED, "injected"))
    p.handle(pc.SubmitRequest(RID, Tenant("A"), ROOM, 8, 0.0, attempt=1))
    # Decode's abort of attempt 0 (sent before any grant: generation 0) arrives late.
    cmds = p.handle(pc.AbortReceived(RID, ROOM, Generation(0), b"", attempt=0))
    (line,) = _logs(cmds, "prefill_receive_abort")
    assert line["outcome"] == "stale_attempt" and "attempt 1" in str(line["reason"])
    # Acked (attempt 0 is over at prefill: nothing of it is in flight), never applied.
    acks = [c for c in cmds if isinstance(c, pc.SendAbortAck)]
    assert [a.attempt for a in acks] == [0]
    assert not [c for c in cmds if isinstance(c, pc.AnswerRequest | pc.CancelWrites)]
    assert p.active_requests() == {RID: "admitted"}
    # The retry's own grant is still taken.
    grant = pc.GrantReceived(RID, ROOM, Generation(5), (PageId(0), PageId(1)), b"t", 8, 0.0, 1)
    cmds = p.handle(grant)
    assert any(isinstance(c, pc.StartWrites) and c.attempt == 1 for c in cmds)
    # Its abort (attempt 1) does stop it.
    cmds = p.handle(pc.AbortReceived(RID, ROOM, Generation(5), b"t", attempt=1))
    assert any(isinstance(c, pc.CancelWrites) for c in cmds)


def test_a_stale_first_attempt_grant_is_refused_for_the_retry() -> None:
    p = _prefill()
    p.handle(pc.SubmitRequest(RID, Tenant("A"), ROOM, 8, 0.0))
    p.handle(pc.FailRequest(RID, Status.ABORTED, "injected"))
    p.handle(pc.SubmitRequest(RID, Tenant("A"), ROOM, 8, 0.0, attempt=1))
    stale = pc.GrantReceived(RID, ROOM, Generation(3), (PageId(0), PageId(1)), b"t", 8, 0.0, 0)
    cmds = p.handle(stale)
    assert _reply(cmds).status is Status.FAILED_PRECONDITION
    assert _logs(cmds, "prefill_receive_grant")[0]["outcome"] == "stale_attempt"
    assert not [c for c in cmds if isinstance(c, pc.StartWrites)]
    assert p.active_requests() == {RID: "admitted"}


# ------------------------------------------------------------------------------ decode


def _decode_retry() -> tuple[dc.DecodeCore, dc.SendGrant, dc.SendGrant]:
    """Attempt 0 granted and failed by prefill's notice; attempt 1 admitted and granted."""
    d = _decode()
    first = d.handle(dc.SubmitRequest(RID, Tenant("A"), ROOM, 8, 4, b"t0", 0.0))
    g0 = next(c for c in first if isinstance(c, dc.SendGrant))
    d.handle(dc.RejectionReceived(RID, ROOM, Status.ABORTED, "injected"))
    assert not d.active_requests() and d.used_pages == 0
    second = d.handle(dc.SubmitRequest(RID, Tenant("A"), ROOM, 8, 4, b"t1", 0.0, attempt=1))
    g1 = next(c for c in second if isinstance(c, dc.SendGrant))
    assert g1.attempt == 1 and g1.generation != g0.generation
    return d, g0, g1


def test_a_stale_first_attempt_notice_does_not_fail_the_retry_at_decode() -> None:
    d, _, _ = _decode_retry()
    cmds = d.handle(dc.RejectionReceived(RID, ROOM, Status.ABORTED, "late", attempt=0))
    (line,) = _logs(cmds, "decode_receive_rejection")
    assert line["outcome"] == "stale_attempt"
    assert d.active_requests() == {RID: "waiting"}
    assert not [c for c in cmds if isinstance(c, dc.AnswerRequest)]


def test_stale_first_attempt_writes_and_completions_do_not_touch_the_retry() -> None:
    d, g0, g1 = _decode_retry()
    page = int(g0.pages[0])
    late = dc.WriteReceived(RID, ROOM, g0.generation, g0.token, page, 0, b"d", b"d", attempt=0)
    cmds = d.handle(late)
    assert _reply(cmds).status is not Status.OK
    assert not [c for c in cmds if isinstance(c, dc.StorePage)]
    # Even a write naming the retry's generation is refused when it is of the first attempt.
    forged = dc.WriteReceived(RID, ROOM, g1.generation, g1.token, int(g1.pages[0]), 0, b"d", b"d")
    cmds = d.handle(forged)
    assert _logs(cmds, "decode_receive_write")[0]["reason"] == "stale_attempt"
    done = dc.CompletionReceived(RID, ROOM, g0.generation, g0.token, 2, b"x", attempt=0)
    cmds = d.handle(done)
    assert _logs(cmds, "decode_receive_completion")[0]["ignored"] is True
    ack = dc.AbortAckReceived(RID, ROOM, g0.generation, g0.token, attempt=0)
    assert _logs(d.handle(ack), "decode_receive_abort_ack")[0]["matched"] is False
    # The retry's own write is accepted.
    own = dc.WriteReceived(
        RID, ROOM, g1.generation, g1.token, int(g1.pages[0]), 0, b"d", b"d", attempt=1
    )
    assert any(isinstance(c, dc.StorePage) for c in d.handle(own))
    view = d.grant_of(RID)
    assert view is not None and view.state == "waiting" and view.written == (g1.pages[0],)


def test_decode_refuses_a_replay_of_an_attempt_it_has_seen() -> None:
    d = _decode()
    d.handle(dc.SubmitRequest(RID, Tenant("A"), ROOM, 8, 4, b"t0", 0.0))
    d.handle(dc.RejectionReceived(RID, ROOM, Status.ABORTED, "injected"))
    assert not d.active_requests()
    replay = d.handle(dc.SubmitRequest(RID, Tenant("A"), ROOM, 8, 4, b"t1", 0.0))
    assert _reply(replay).status is Status.ALREADY_EXISTS and d.used_pages == 0
    retry = d.handle(dc.SubmitRequest(RID, Tenant("A"), ROOM, 8, 4, b"t1", 0.0, attempt=1))
    assert _reply(retry).status is Status.OK and d.attempt_of(RID) == 1


def test_a_stale_router_cancel_does_not_withdraw_the_retry() -> None:
    d, _, _ = _decode_retry()
    cmds = d.handle(dc.CancelRequest(RID, "late cancel", 0.0, attempt=0))
    assert _reply(cmds).status is Status.NOT_FOUND
    assert d.active_requests() == {RID: "waiting"}


# ------------------------------------------------------------------------------ the servers


def test_the_servers_serve_a_retry_after_an_error_and_refuse_a_replay(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster("reference")
    prompt = encode("a retried request")
    cluster.stall_prefill_writes("rt-1", after_messages=0)
    with cluster.client() as c:
        # The first attempt stalls mid-handoff; the client gives up (its deadline passes).
        first = c.generate("t", prompt, 4, request_id="rt-1", timeout=1.0)
        assert first.status == "error"
        cluster.resume_prefill_writes("rt-1")
        assert cluster.wait_quiescent(timeout=10.0)
        # Not a retry: an id the router answered with an error is not resubmitted as new.
        again = c.generate("t", prompt, 4, request_id="rt-1")
        assert again.status == "error" and again.code == "ALREADY_EXISTS", again
        retried = c.generate("t", prompt, 4, request_id="rt-1", retry=True)
        assert retried.status == "ok", retried
        fresh = c.generate("t", prompt, 4, request_id="rt-2")
        assert fresh.status == "ok" and retried.tokens == fresh.tokens
        # Served: nothing to retry any more.
        late = c.generate("t", prompt, 4, request_id="rt-1", retry=True)
        assert late.status == "error" and late.code == "FAILED_PRECONDITION", late
