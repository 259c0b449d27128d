"""The sans-I/O cores, driven together in-process: the reference protocol holds, each switch of a
`Behaviour` changes exactly the step it names, and each mode (the combination its spec variant
needs) shows the consequence that makes it a bug."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvhandoff.impl.core import decode as dc
from kvhandoff.impl.core import prefill as pc
from kvhandoff.impl.core import router as rc
from kvhandoff.impl.core.common import Generation, PageId, Reply, RequestId, Room, Status, Tenant
from kvhandoff.impl.core.inprocess import InProcessCluster
from kvhandoff.impl.errors import ConfigError
from kvhandoff.impl.modes import MODES, NOT_APPLICABLE, Behaviour, get_mode

REF = Behaviour()


def net(behaviour: Behaviour = REF, **kw: object) -> InProcessCluster:
    return InProcessCluster(behaviour, **kw)  # type: ignore[arg-type]


def pages_free(n: InProcessCluster) -> bool:
    return n.decode.used_pages == 0 and not n.decode.active_requests()


# ------------------------------------------------------------------------------ reference


def test_reference_handoff_reads_only_the_requests_own_pages() -> None:
    n = net()
    n.submit("a", "A", 30)
    n.submit("b", "B", 50)
    n.run()
    assert n.answers["a"].status is Status.OK and set(n.answers["a"].read_tenants) == {"A"}
    assert n.answers["b"].status is Status.OK and set(n.answers["b"].read_tenants) == {"B"}
    assert pages_free(n)
    assert all(c is None for c in n.content.values()), "released pages are scrubbed"


def test_reference_oversized_prompt_is_rejected_and_nothing_is_written() -> None:
    n = net()
    n.submit("a", "A", 60)
    n.run()
    n.submit("b", "B", 100)  # over prefill's 64, within decode's 128
    n.run()
    assert n.answers["b"].status is Status.OUT_OF_RANGE
    assert "64" in n.answers["b"].message
    assert "prefill_write_page" not in [k for s, k, a in n.log if a.get("request_id") == "b"]
    assert "decode_receive_rejection" in n.events("decode")
    assert pages_free(n)


def test_reference_cancel_mid_transfer_releases_only_after_the_drain_ack() -> None:
    n = net()
    n.submit("a", "A", 40)
    for _ in range(12):
        n.step()
    n.hold("abort_ack")
    n.cancel("a")
    n.run()
    assert n.answers["a"].status is Status.CANCELLED
    assert n.decode.used_pages > 0, "pages stay fenced until prefill acks the drain"
    n.release()
    n.run()
    assert pages_free(n)


def test_reference_waiting_timeout_fails_the_request_and_frees_pages() -> None:
    n = net(waiting_timeout_s=5.0)
    n.hold("write")
    n.submit("a", "A", 20)
    n.run()
    n.advance(6.0)
    assert n.answers["a"].status is Status.DEADLINE_EXCEEDED
    n.release()
    n.run()
    assert pages_free(n)


def test_reference_detects_a_prefill_restart_and_fails_the_requests_it_held() -> None:
    n = net()
    n.submit("a", "A", 40)
    for _ in range(10):
        n.step()
    n.restart_prefill()
    n.run()
    assert n.answers["a"].status is not Status.OK
    assert "decode_detect_prefill_restart" in n.events("decode")
    assert pages_free(n)


def test_generations_never_repeat_and_a_stale_generation_write_is_refused() -> None:
    core = dc.DecodeCore(dc.DecodeConfig(8, 4, 32), generation_base=7 << 32)
    cmds = core.handle(dc.SubmitRequest(RequestId("r"), Tenant("t"), Room(1), 8, 2, b"k", 0.0))
    grant = next(c for c in cmds if isinstance(c, dc.SendGrant))
    assert grant.generation == 7 << 32
    write = dc.WriteReceived(
        RequestId("r"), Room(1), Generation(grant.generation - 1), b"k", 0, 0, b"d", b"d"
    )
    reply = next(c for c in core.handle(write) if isinstance(c, Reply))
    assert reply.status is Status.FAILED_PRECONDITION and str(grant.generation - 1) in reply.message


def test_decode_binds_writes_and_completions_to_the_request_that_shares_the_room() -> None:
    # The spec's `binds_request` (catalogue: room_keyed_matching breaks without it): two requests
    # on one room; a write and a completion carrying b's room, generation and token but naming a
    # are refused, so a's data can never fill b's pages.
    core = dc.DecodeCore(dc.DecodeConfig(8, 4, 32))
    grants = {}
    for rid, token in (("a", b"ka"), ("b", b"kb")):
        cmds = core.handle(dc.SubmitRequest(RequestId(rid), Tenant(rid), Room(1), 8, 2, token, 0.0))
        grants[rid] = next(c for c in cmds if isinstance(c, dc.SendGrant))
    b = grants["b"]
    page = int(b.pages[0])
    write = dc.WriteReceived(RequestId("a"), Room(1), b.generation, b"kb", page, 0, b"d", b"d")
    reply = next(c for c in core.handle(write) if isinstance(c, Reply))
    assert reply.status is not Status.OK and "'a'" in reply.message
    done = dc.CompletionReceived(RequestId("a"), Room(1), b.generation, b"kb", 2, b"x" * 16)
    cmds = core.handle(done)
    assert not any(isinstance(c, dc.Log) and c.kind == "decode_generate" for c in cmds)
    assert core.active_requests()["b"] == "waiting"


def test_prefill_takes_a_grant_only_for_the_request_it_names_not_any_on_its_room() -> None:
    # The spec's `matching="request"`: keyed by (request, room), a grant for b is parked, not
    # taken by a, which waits on the same room.
    core = pc.PrefillCore(pc.PrefillConfig(page_size=16, max_prompt_tokens=64))
    core.handle(pc.SubmitRequest(RequestId("a"), Tenant("A"), Room(1), 8, 0.0))
    ev = pc.GrantReceived(RequestId("b"), Room(1), Generation(5), (PageId(0),), b"kb", 8, 0.0)
    cmds = list(core.handle(ev))
    assert not [c for c in cmds if isinstance(c, pc.StartWrites)]
    assert core.parked_grants == 1
    cmds = list(core.handle(pc.SubmitRequest(RequestId("b"), Tenant("B"), Room(1), 8, 0.0)))
    assert [(w.request_id, w.generation) for w in cmds if isinstance(w, pc.StartWrites)] == [
        ("b", 5)
    ]


def test_an_undeliverable_grant_fails_that_request_alone_and_says_why_in_the_log() -> None:
    # The log's cause is what lets the validator read this as decode giving up on one request
    # (decode_waiting_timeout), not as a prefill restart's detection (which fails them all).
    core = dc.DecodeCore(dc.DecodeConfig(8, 4, 32))
    grants = []
    for rid in ("a", "b"):
        cmds = core.handle(dc.SubmitRequest(RequestId(rid), Tenant("t"), Room(1), 4, 2, b"k", 0.0))
        grants.append(next(c for c in cmds if isinstance(c, dc.SendGrant)))
    cmds = core.handle(dc.GrantFailed(RequestId("a"), grants[0].generation, "CANCELLED", 1.0))
    answers = [c.args for c in cmds if isinstance(c, dc.Log) and c.kind == "decode_answer"]
    assert answers == [
        {
            "request_id": "a",
            "tenant": "t",
            "generation": grants[0].generation,
            "status": "error",
            "code": Status.UNAVAILABLE.value,
            "cause": "grant_failed",
        }
    ]
    assert any(isinstance(c, dc.SendAbort) for c in cmds)  # fenced until prefill drains
    assert core.active_requests() == {"a": "releasing", "b": "waiting"}


def test_negative_lengths_are_refused_by_the_cores_naming_the_value() -> None:
    core = dc.DecodeCore(dc.DecodeConfig(8, 4, 32))
    cmds = core.handle(dc.SubmitRequest(RequestId("r"), Tenant("t"), Room(1), -5, 2, b"k", 0.0))
    reply = next(c for c in cmds if isinstance(c, Reply))
    assert reply.status is Status.INVALID_ARGUMENT and "-5" in reply.message
    router = rc.RouterCore(rc.RouterConfig(64))
    cmds2 = router.handle(rc.ClientSubmit(RequestId("r"), Tenant("t"), Room(1), 4, -1, 0.0))
    reply2 = next(c for c in cmds2 if isinstance(c, Reply))
    assert reply2.status is Status.INVALID_ARGUMENT and "-1" in reply2.message


# ------------------------------------------------------------------------------ the incident


def test_incident_mode_generates_tenant_b_answer_from_tenant_a_pages() -> None:
    n = net(get_mode("incident").behaviour)
    n.submit("a", "A", 60)
    n.run()
    n.submit("b", "B", 100)
    n.run()
    answer = n.answers["b"]
    assert answer.status is Status.OK
    assert "A" in answer.read_tenants
    assert "invariant_alarm" in n.events("decode")


def test_incident_without_unscrubbed_pages_reads_garbage_not_another_tenant() -> None:
    n = net(replace(get_mode("incident").behaviour, scrub_on_release=True))
    n.submit("a", "A", 60)
    n.run()
    n.submit("b", "B", 100)
    n.run()
    assert n.answers["b"].status is Status.OK
    assert "A" not in n.answers["b"].read_tenants and None in n.answers["b"].read_tenants


# ------------------------------------------------------------------------------ single modes


def oversized_after(behaviour: Behaviour) -> InProcessCluster:
    n = net(behaviour)
    n.submit("a", "A", 60)
    n.run()
    n.submit("b", "B", 100)
    n.run()
    return n


def test_m1_placeholder_writes_its_page_and_the_reference_decode_refuses_the_count() -> None:
    n = oversized_after(get_mode("m1_placeholder_rejection").behaviour)
    b_log = [(s, k, a) for s, k, a in n.log if a.get("request_id") == "b"]
    assert any(k == "prefill_reject_request" and a.get("placeholder") for _, k, a in b_log)
    # The placeholder bootstraps like any prompt: one page written, an honest count sent ...
    writes = [a for _, k, a in b_log if k == "prefill_write_page"]
    sent = next(a for _, k, a in b_log if k == "prefill_send_completion")
    assert len(writes) == 1 and sent["page_count"] == sent["pages_written"] == 1
    # ... which the reference decode refuses: 1 page for a grant of 25.
    verdict = next(a for _, k, a in b_log if k == "decode_receive_completion")
    assert verdict["verdict"] == "failed" and "25 were granted" in str(verdict["reason"])
    assert n.answers["b"].status is Status.DATA_LOSS


def test_local_completion_count_claims_the_grant_and_the_reference_decode_sees_the_gap() -> None:
    b = Behaviour(truncate_oversized=True, local_completion_count=True)
    n = oversized_after(b)
    writes = [a for s, k, a in n.log if k == "prefill_write_page" and a["request_id"] == "b"]
    assert len(writes) == 16  # 64 tokens of its own view, not the 25 granted pages
    sent = next(a for s, k, a in n.log if k == "prefill_send_completion" and a["request_id"] == "b")
    assert sent["page_count"] == 25 and sent["pages_written"] == 16  # M2: claims the grant
    verdicts = [
        a for s, k, a in n.log if k == "decode_receive_completion" and a["request_id"] == "b"
    ]
    assert verdicts[0]["verdict"] == "failed" and "never written" in str(verdicts[0]["reason"])
    assert n.answers["b"].status is Status.DATA_LOSS


def test_m2_decode_checks_the_claimed_count_only_and_generates_from_unwritten_pages() -> None:
    n = oversized_after(get_mode("m2_local_completion_count").behaviour)
    assert n.answers["b"].status is Status.OK
    assert None in n.answers["b"].read_tenants  # the 9 granted pages nobody wrote (scrubbed)
    alarms = [a for s, k, a in n.log if k == "invariant_alarm"]
    assert alarms[0]["alarm"] == "generating_from_unwritten_pages"


def test_m3_decode_trusts_a_short_completion() -> None:
    placeholder = Behaviour(placeholder_rejection=True)
    refused = oversized_after(placeholder)
    assert refused.answers["b"].status is Status.DATA_LOSS
    trusted = oversized_after(get_mode("m3_decode_trusts_completion").behaviour)
    assert trusted.answers["b"].status is Status.OK
    assert None in trusted.answers["b"].read_tenants  # scrubbed, never-written pages
    alarms = [a for s, k, a in trusted.log if k == "invariant_alarm"]
    assert alarms[0]["alarm"] == "generating_from_unwritten_pages"


def test_count_only_validation_checks_the_count_but_no_digest() -> None:
    for behaviour, ok in ((REF, False), (Behaviour(count_only_validation=True), True)):
        core = dc.DecodeCore(dc.DecodeConfig(8, 4, 32, behaviour=behaviour))
        cmds = core.handle(dc.SubmitRequest(RequestId("r"), Tenant("t"), Room(1), 8, 2, b"k", 0.0))
        g = next(c for c in cmds if isinstance(c, dc.SendGrant))
        for page in g.pages:  # data that does not hash to what the writer claimed
            core.handle(
                dc.WriteReceived(RequestId("r"), Room(1), g.generation, b"k", page, 0, b"x", b"y")
            )
        done = core.handle(
            dc.CompletionReceived(RequestId("r"), Room(1), g.generation, b"k", 2, b"whatever")
        )
        assert any(isinstance(c, dc.Generate) for c in done) is ok


def test_m5_decode_checks_the_digest_only_when_one_came() -> None:
    m5 = get_mode("m5_digest_skipped").behaviour
    for behaviour, digest, ok in ((REF, b"", False), (m5, b"whatever", False), (m5, b"", True)):
        core = dc.DecodeCore(dc.DecodeConfig(8, 4, 32, behaviour=behaviour))
        cmds = core.handle(dc.SubmitRequest(RequestId("r"), Tenant("t"), Room(1), 8, 2, b"k", 0.0))
        g = next(c for c in cmds if isinstance(c, dc.SendGrant))
        # Only the first granted page is written; the completion claims both.
        core.handle(
            dc.WriteReceived(RequestId("r"), Room(1), g.generation, b"k", g.pages[0], 0, b"x", b"x")
        )
        done = core.handle(
            dc.CompletionReceived(RequestId("r"), Room(1), g.generation, b"k", 2, digest)
        )
        assert any(isinstance(c, dc.Generate) for c in done) is ok, (digest, ok)


def test_m5_prefill_sends_no_digest_and_decode_generates_from_unwritten_pages() -> None:
    n = oversized_after(get_mode("m5_digest_skipped").behaviour)
    sent = next(a for s, k, a in n.log if k == "prefill_send_completion" and a["request_id"] == "b")
    assert sent["digest"] == "" and sent["page_count"] == 25 and sent["pages_written"] == 16
    assert n.answers["b"].status is Status.OK and None in n.answers["b"].read_tenants


def test_m6_truncates_instead_of_rejecting_and_writes_what_it_kept() -> None:
    n = oversized_after(get_mode("m6_asymmetric_truncation").behaviour)
    admitted = [a for s, k, a in n.log if k == "prefill_admit_request" and a["request_id"] == "b"]
    assert admitted and admitted[0]["truncated_to"] == 64
    writes = [a for s, k, a in n.log if k == "prefill_write_page" and a["request_id"] == "b"]
    assert len(writes) == 16  # data moved for a prompt prefill did not admit as sent
    assert n.answers["b"].status is Status.DATA_LOSS


def cancel_with_a_write_in_flight(behaviour: Behaviour) -> tuple[InProcessCluster, list[object]]:
    """A is cancelled while one of its writes is still on the wire (held back here)."""
    n = net(behaviour)
    n.submit("a", "A", 40)
    for _ in range(6):
        n.step()
    n.hold("write")
    n.cancel("a")
    n.run()
    in_flight: list[object] = list(n.held)
    n.held.clear()
    n.hold_kinds.clear()
    return n, in_flight


def b_reuses_the_pages_then_a_late_write_lands(
    n: InProcessCluster, in_flight: list[object]
) -> None:
    n.hold("completion")
    n.submit("b", "B", 40)
    n.run()  # B is granted A's old pages and writes all of them
    n.queue.extend(in_flight)  # type: ignore[arg-type]
    n.run()  # A's late write arrives
    n.release()
    n.run()


def test_m7_release_before_drain_lets_a_late_write_land_in_another_tenants_pages() -> None:
    n, in_flight = cancel_with_a_write_in_flight(get_mode("m7_release_before_drain").behaviour)
    assert n.decode.used_pages == 0, "m7 frees at once"
    b_reuses_the_pages_then_a_late_write_lands(n, in_flight)
    alarms = [a for s, k, a in n.log if k == "invariant_alarm"]
    assert alarms and alarms[0]["alarm"] == "late_write_landed_in_reallocated_page"
    assert n.answers["b"].status is Status.OK and "A" in n.answers["b"].read_tenants


def test_reference_refuses_the_same_late_write() -> None:
    n, in_flight = cancel_with_a_write_in_flight(REF)
    b_reuses_the_pages_then_a_late_write_lands(n, in_flight)
    refused = [a for s, k, a in n.log if k == "decode_receive_write" and a["outcome"] == "refused"]
    assert refused and refused[0]["request_id"] == "a"
    assert n.answers["b"].status is Status.OK and set(n.answers["b"].read_tenants) == {"B"}
    assert "invariant_alarm" not in n.events()
    assert pages_free(n)


def test_m8_releases_on_the_ack_timeout_without_the_ack() -> None:
    for behaviour, freed in ((REF, False), (get_mode("m8_release_on_timeout").behaviour, True)):
        n = net(behaviour)
        n.submit("a", "A", 40)
        for _ in range(6):
            n.step()
        n.hold("abort_ack", "abort")
        n.cancel("a")
        n.run()
        n.advance(30.0)
        assert (n.decode.used_pages == 0) is freed


def test_m10_adopts_a_stale_completion_for_an_earlier_incarnation_of_the_room() -> None:
    for behaviour, survives in (
        (REF, True),
        (get_mode("m10_stale_status_adopted").behaviour, False),
    ):
        core = dc.DecodeCore(dc.DecodeConfig(16, 4, 64, behaviour=behaviour))
        core.handle(dc.SubmitRequest(RequestId("new"), Tenant("t"), Room(9), 8, 2, b"k2", 0.0))
        stale = dc.CompletionReceived(RequestId("old"), Room(9), Generation(0xBEEF), b"k1", 2, b"d")
        core.handle(stale)
        assert ("new" in core.active_requests()) is survives


def test_m15_prefill_abort_is_not_told_to_decode() -> None:
    for behaviour, told in ((REF, True), (get_mode("m15_silent_prefill_abort").behaviour, False)):
        n = net(behaviour)
        n.fail_writes.add(RequestId("a"))
        n.submit("a", "A", 20)
        n.run()
        assert ("decode_receive_rejection" in n.events("decode")) is told
        assert n.answers["a"].status is Status.UNAVAILABLE  # prefill's error, to the client
        assert pages_free(n) is told


def test_m15_router_answers_prefills_error_without_relaying_it_to_decode() -> None:
    for behaviour, relayed in (
        (REF, True),
        (get_mode("m15_silent_prefill_abort").behaviour, False),
    ):
        router = rc.RouterCore(rc.RouterConfig(64, behaviour=behaviour))
        rid = RequestId("r")
        router.handle(rc.ClientSubmit(rid, Tenant("t"), Room(1), 4, 4, 0.0))
        cmds = router.handle(rc.PrefillFinished(rid, Status.ABORTED, "prefill gave up"))
        assert any(isinstance(c, rc.AbortAtDecode) for c in cmds) is relayed
        answer = next(c for c in cmds if isinstance(c, rc.AnswerClient))
        assert answer.status is Status.ABORTED


def test_m15_router_still_relays_a_broken_call_to_a_crashed_prefill() -> None:
    # A crash is not a prefill-side abort: decode detects it itself (the spec's restart
    # detection), and the router, seeing the call break first, withdraws the request.
    router = rc.RouterCore(
        rc.RouterConfig(64, behaviour=get_mode("m15_silent_prefill_abort").behaviour)
    )
    rid = RequestId("r")
    router.handle(rc.ClientSubmit(rid, Tenant("t"), Room(1), 4, 4, 0.0))
    cmds = router.handle(rc.PrefillFinished(rid, Status.UNAVAILABLE, "prefill crashed", True))
    assert any(isinstance(c, rc.AbortAtDecode) for c in cmds)


def test_m15_holds_decode_pages_until_the_waiting_timeout() -> None:
    n = net(get_mode("m15_silent_prefill_abort").behaviour, waiting_timeout_s=30.0)
    n.fail_writes.add(RequestId("a"))
    n.submit("a", "A", 20)
    n.run()
    assert n.answers["a"].status is Status.UNAVAILABLE and n.decode.used_pages > 0
    n.advance(31.0)
    n.run()
    assert "decode_waiting_timeout" in n.events("decode") and pages_free(n)


def test_a_prefill_abort_before_the_grant_is_told_to_decode_except_in_m15() -> None:
    for behaviour, told in ((REF, True), (get_mode("m15_silent_prefill_abort").behaviour, False)):
        n = net(behaviour)
        n.hold("to_prefill_grant")
        n.submit("a", "A", 20)
        n.run()
        reply = n.to_prefill(pc.FailRequest(RequestId("a"), Status.ABORTED, "out of memory"))
        assert reply.status is Status.OK
        n.release()
        n.run()
        assert n.answers["a"].status is Status.ABORTED
        grant = next(a for s, k, a in n.log if k == "prefill_receive_grant")
        # The reference refuses the late grant (decode fails the request on it, if nothing
        # else told it); m15 acks it and drops it, so decode keeps waiting.
        assert grant["outcome"] == ("refused" if told else "dropped")
        assert pages_free(n) is told


def test_prefill_fails_on_its_own_only_a_request_waiting_for_its_grant() -> None:
    core = pc.PrefillCore(pc.PrefillConfig(4, 64))
    unknown = core.handle(pc.FailRequest(RequestId("x"), Status.ABORTED, "oom"))[-1]
    assert isinstance(unknown, Reply) and unknown.status is Status.NOT_FOUND
    core.handle(pc.SubmitRequest(RequestId("a"), Tenant("A"), Room(1), 8, 0.0))
    core.handle(
        pc.GrantReceived(
            RequestId("a"), Room(1), Generation(1), (PageId(0), PageId(1)), b"k", 8, 0.0
        )
    )
    reply = core.handle(pc.FailRequest(RequestId("a"), Status.ABORTED, "oom"))[-1]
    assert isinstance(reply, Reply) and reply.status is Status.FAILED_PRECONDITION
    assert "writing" in reply.message


def test_m15_with_m16_holds_decode_pages_until_the_waiting_timeout() -> None:
    b = Behaviour(silent_prefill_abort=True, router_ignores_prefill_error=True)
    n = net(b, waiting_timeout_s=30.0)
    n.fail_writes.add(RequestId("a"))
    n.submit("a", "A", 20)
    n.run()
    assert n.decode.used_pages > 0 and "a" not in n.answers
    n.advance(31.0)
    assert n.answers["a"].status is Status.DEADLINE_EXCEEDED and pages_free(n)


def test_m16_router_returns_decodes_answer_despite_a_prefill_error() -> None:
    for behaviour, status in (
        (REF, Status.UNAVAILABLE),
        (get_mode("m16_router_ignores_prefill_error").behaviour, Status.OK),
    ):
        router = rc.RouterCore(rc.RouterConfig(64, behaviour=behaviour))
        rid = RequestId("r")
        router.handle(rc.ClientSubmit(rid, Tenant("t"), Room(1), 4, 4, 0.0))
        cmds = router.handle(rc.PrefillFinished(rid, Status.UNAVAILABLE, "prefill died"))
        cmds += router.handle(rc.DecodeFinished(rid, Status.OK))
        answers = [c for c in cmds if isinstance(c, rc.AnswerClient)]
        assert answers[0].status is status


def test_m18_keeps_orphan_grants_forever_and_hands_them_to_a_later_request_of_the_room() -> None:
    for behaviour, kept in ((REF, False), (get_mode("m18_orphan_grant_accepted").behaviour, True)):
        n = net(behaviour, orphan_grant_timeout_s=5.0)
        n.submit_to_decode_only("orphan", "A", 8, room=42)
        n.run()
        n.advance(100.0)
        assert (n.prefill.parked_grants == 1) is kept
        if not kept:
            assert "orphan" not in n.decode.active_requests()


def test_a_stale_parked_grant_does_not_block_a_later_request_of_the_same_room() -> None:
    # Found by conformance (seed 3 of the slow campaign): after a prefill restart, a duplicate of
    # a cancelled request's grant is parked; the next request reusing the room must still get its
    # own grant through, and a newer generation of one request's grant replaces an older one.
    core = pc.PrefillCore(pc.PrefillConfig(page_size=16, max_prompt_tokens=64))

    def grant(rid: str, gen: int) -> list[object]:
        ev = pc.GrantReceived(RequestId(rid), Room(1), Generation(gen), (PageId(0),), b"t", 8, 0.0)
        return list(core.handle(ev))

    def status(cmds: list[object]) -> Status:
        return next(c.status for c in cmds if isinstance(c, Reply))

    assert status(grant("stale", 1)) is Status.OK
    assert status(grant("next", 2)) is Status.OK  # the room is not blocked by "stale"'s grant
    assert core.parked_grants == 2
    assert status(grant("next", 3)) is Status.OK  # newer generation replaces the parked one
    assert status(grant("next", 2)) is Status.FAILED_PRECONDITION  # older one is stale
    assert core.parked_grants == 2
    cmds = core.handle(pc.SubmitRequest(RequestId("next"), Tenant("t"), Room(1), 8, 0.0))
    writes = [c for c in cmds if isinstance(c, pc.StartWrites)]
    assert [w.generation for w in writes] == [3]
    assert core.parked_grants == 1  # only the stale grant waits, for its orphan deadline


def test_m20_leaves_released_pages_readable() -> None:
    for behaviour, scrubbed in ((REF, True), (get_mode("m20_unscrubbed_pages").behaviour, False)):
        n = net(behaviour)
        n.submit("a", "A", 20)
        n.run()
        assert all(c is None for c in n.content.values()) is scrubbed


# ------------------------------------------------------------------------------ mode table


def test_every_mode_named_in_the_issue_exists_with_its_m_numbers() -> None:
    expected = {
        "reference": (),
        "incident": (1, 2, 3, 6, 20),
        "m1_placeholder_rejection": (1,),
        "m2_local_completion_count": (2, 6),
        "m3_decode_trusts_completion": (3, 1),
        "m5_digest_skipped": (5, 2, 6),
        "m6_asymmetric_truncation": (6,),
        "m7_release_before_drain": (7,),
        "m8_release_on_timeout": (8,),
        "m10_stale_status_adopted": (10,),
        "m15_silent_prefill_abort": (15,),
        "m16_router_ignores_prefill_error": (16,),
        "m18_orphan_grant_accepted": (18,),
        "m20_unscrubbed_pages": (20,),
    }
    assert {name: m.m_numbers for name, m in MODES.items()} == expected
    assert set(NOT_APPLICABLE) == {"m13_lease_expiry_pull", "m14_silent_receive_failure_pull"}


def test_an_unknown_mode_is_a_config_error_listing_the_modes() -> None:
    with pytest.raises(ConfigError, match="reference, incident"):
        get_mode("m99")
    with pytest.raises(ConfigError, match="not applicable"):
        get_mode("m13_lease_expiry_pull")


def test_cores_are_deterministic() -> None:
    def trace() -> list[tuple[str, str, dict[str, object]]]:
        n = net(get_mode("incident").behaviour)
        n.submit("a", "A", 60)
        n.run()
        n.submit("b", "B", 100)
        n.run()
        return n.log

    assert trace() == trace()


def _decode_with_two_requests_on_two_prefills() -> dc.DecodeCore:
    """Decode holding one waiting request from each of two prefill instances, both grants
    delivered, after probing both instances at epoch 1."""
    core = dc.DecodeCore(dc.DecodeConfig(4, 16, 64), generation_base=1 << 32)
    for i in (0, 1):
        core.handle(dc.PrefillHeartbeat(1, 0.0, prefill=i))
    for i, rid in enumerate(("r0", "r1")):
        core.handle(
            dc.SubmitRequest(
                RequestId(rid), Tenant("a"), Room(1), 16, 4, bytes([i]) * 16, 0.0, prefill=i
            )
        )
        view = core.grant_of(RequestId(rid))
        assert view is not None
        core.handle(dc.GrantDelivered(RequestId(rid), view.generation, 1, 0.0, prefill=i))
    return core


def test_decode_fails_only_the_requests_of_the_prefill_instance_that_restarted() -> None:
    core = _decode_with_two_requests_on_two_prefills()
    cmds = core.handle(dc.PrefillHeartbeat(2, 1.0, prefill=1))
    detect = [c for c in cmds if getattr(c, "kind", "") == "decode_detect_prefill_restart"]
    assert len(detect) == 1
    assert detect[0].args["failed"] == ["r1"] and detect[0].args["prefill_instance"] == 1
    assert set(core.active_requests()) == {"r0"}
    # The other instance's probe at its own epoch changes nothing.
    assert core.handle(dc.PrefillHeartbeat(1, 1.0, prefill=0)) == []


def test_decode_takes_one_silent_prefill_instance_for_dead_not_the_others() -> None:
    core = _decode_with_two_requests_on_two_prefills()
    for _ in range(core.config.prefill_dead_after_misses):
        core.handle(dc.PrefillHeartbeat(None, 1.0, prefill=0))
    assert core.prefill_dead_of(0) and not core.prefill_dead_of(1)
    assert set(core.active_requests()) == {"r1"}
    # One instance's log lines leave the instance out: the one-prefill format is unchanged.
    cmds = core.handle(dc.PrefillHeartbeat(3, 2.0))
    assert all("prefill_instance" not in getattr(c, "args", {}) for c in cmds)
