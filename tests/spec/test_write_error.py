"""A page write that fails on prefill's side mid-transfer (`prefill_write_error`).

Prefill fails the request and tells decode, but the other writes of the grant are not recalled:
they may still land. The failure notice says prefill stopped, not that its writes drained. The
reference refuses the late write; the drain-fenced design aborts and holds the pages until the
drain ack (`fence_on_prefill_failure`); releasing on the notice (`release_on_prefill_failure`)
lets the write land in a freed page.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvhandoff.model_checker.explore import explore
from kvhandoff.spec import REFERENCE, Config, RequestSpec, enabled, get_variant, init, step
from kvhandoff.spec.actions import (
    DecodeAdmitRequest,
    DecodeReceiveAbortAck,
    DecodeReceiveFailure,
    DecodeReceiveWrite,
    DecodeReleasePages,
    DecodeReservePages,
    PrefillAbortRequest,
    PrefillAdmitRequest,
    PrefillReceiveAbort,
    PrefillReceiveGrant,
    PrefillSendAbortAck,
    PrefillWriteError,
    PrefillWritePage,
    RouterSubmitRequest,
)
from kvhandoff.spec.config import ConfigError, parse_set
from kvhandoff.spec.properties import check_always
from kvhandoff.spec.state import Faults, State, all_done
from kvhandoff.spec.variants import Variant
from tests.stepping import one_fault_config, take_one, walk

# One request of one page, one failed write allowed and no other fault.
ONE = one_fault_config(max_write_errors=1, max_prefill_aborts=1)
FENCED = get_variant("one_sided_fenced")
RELEASES = get_variant("release_on_prefill_failure")
WRITE_ERROR = PrefillWriteError(0)


def take(variant: Variant, state: State, kind: type, config: Config = ONE) -> State:
    return take_one(variant, config, state, kind)


def granted(variant: Variant, config: Config = ONE) -> State:
    """Request 0 granted its page, prefill holding the grant, nothing written yet."""
    s = walk(
        variant,
        config,
        (
            RouterSubmitRequest,
            PrefillAdmitRequest,
            DecodeAdmitRequest,
            DecodeReservePages,
            PrefillReceiveGrant,
        ),
    )
    assert s.requests[0].p == "granted" and not s.writes
    return s


def failed_mid_write(variant: Variant) -> State:
    """Prefill's write on the wire, then its transfer failed: the notice is on its way."""
    s = take(variant, granted(variant), PrefillWritePage)
    return step(variant, ONE, s, WRITE_ERROR)


def test_the_write_error_budget_is_off_by_default_and_set_like_any_other() -> None:
    assert Config().max_write_errors == 0
    assert parse_set(Config(), ["max_write_errors=2"]).max_write_errors == 2
    with pytest.raises(ConfigError, match="max_write_errors"):
        Config(max_write_errors=-1)
    with pytest.raises(ConfigError, match="max_write_errors"):
        parse_set(Config(), ["max_write_errors=x"])
    # A failed write is a fault like the others: it counts against the run's total.
    assert Faults(write_errors=1).total == 1


def test_a_write_error_needs_a_write_in_flight_and_an_abort_needs_none() -> None:
    # Between writes, prefill may abort on its own; with nothing on the wire no write can fail.
    s = granted(REFERENCE)
    actions = enabled(REFERENCE, ONE, s)
    assert PrefillAbortRequest(0) in actions and WRITE_ERROR not in actions
    # A write on the wire: the two guards swap.
    s = take(REFERENCE, s, PrefillWritePage)
    actions = enabled(REFERENCE, ONE, s)
    assert WRITE_ERROR in actions and PrefillAbortRequest(0) not in actions
    # Not without its budget, nor once the run's fault budget is spent.
    assert WRITE_ERROR not in enabled(REFERENCE, replace(ONE, max_write_errors=0), s)
    assert WRITE_ERROR not in enabled(REFERENCE, ONE, replace(s, faults=Faults(crashes=1)))


def test_the_pull_path_has_no_prefill_write_to_fail() -> None:
    pull = get_variant("reference_pull")
    s = granted(pull)
    s = take(pull, s, PrefillWritePage)
    assert s.writes and WRITE_ERROR not in enabled(pull, ONE, s)


def test_prefill_stops_and_tells_decode_while_its_write_stays_on_the_wire() -> None:
    s = failed_mid_write(REFERENCE)
    req = s.requests[0]
    assert req.p == "aborted"
    assert [(m.kind, m.generation, m.reason) for m in s.network] == [
        ("failure", req.d_gen, "aborted")
    ]
    assert len(s.writes) == 1 and s.writes[0].generation == req.d_gen
    assert s.faults.write_errors == 1 and s.faults.total == 1
    # The router honours prefill's error: the client has its answer already.
    assert req.answer is not None and not req.answer.ok


def test_the_notice_is_sent_even_where_prefill_aborts_silently() -> None:
    # M15's design does not tell decode of a local abort; a failed transfer is another path
    # (SGLang's `conclude_failure` pushes the Failed status whatever the abort policy).
    silent = get_variant("m15_silent_prefill_abort")
    s = take(silent, granted(silent), PrefillWritePage)
    s = step(silent, ONE, s, WRITE_ERROR)
    assert [m.kind for m in s.network] == ["failure"]


def test_the_reference_releases_at_once_and_refuses_the_late_write() -> None:
    s = take(REFERENCE, failed_mid_write(REFERENCE), DecodeReceiveFailure)
    assert s.requests[0].d == "failed" and not s.requests[0].d_awaiting_ack
    assert not [m for m in s.network if m.kind == "abort"]
    s = take(REFERENCE, s, DecodeReleasePages)
    s = take(REFERENCE, s, DecodeReceiveWrite)
    assert s.ghost.refused_write and not s.ghost.late_landing
    assert check_always(ONE, s) == []
    assert all_done(ONE, s)


def test_the_drain_fenced_design_aborts_on_the_notice_and_waits_for_the_ack() -> None:
    s = take(FENCED, failed_mid_write(FENCED), DecodeReceiveFailure)
    req = s.requests[0]
    assert req.d == "failed" and req.d_awaiting_ack
    assert [(m.kind, m.generation) for m in s.network] == [("abort", req.d_gen)]
    assert not [a for a in enabled(FENCED, ONE, s) if isinstance(a, DecodeReleasePages)]
    # The write lands in the page still held for it; prefill, already stopped, acknowledges the
    # drain once it has; only then are the pages freed.
    for kind in (
        PrefillReceiveAbort,
        DecodeReceiveWrite,
        PrefillSendAbortAck,
        DecodeReceiveAbortAck,
        DecodeReleasePages,
    ):
        s = take(FENCED, s, kind)
        assert check_always(ONE, s) == [], kind.__name__
    assert not s.ghost.late_landing
    assert all_done(ONE, s)


def test_a_notice_sent_before_any_grant_is_not_fenced() -> None:
    # Prefill gave up before it took the grant (generation 0 in its notice): no write of it can
    # be on the wire, so decode releases at once even on the drain-fenced design.
    s = init(ONE)
    for kind in (RouterSubmitRequest, PrefillAdmitRequest, DecodeAdmitRequest, DecodeReservePages):
        s = take(FENCED, s, kind)
    s = step(FENCED, ONE, s, PrefillAbortRequest(0))
    assert [(m.kind, m.generation) for m in s.network if m.kind == "failure"] == [("failure", 0)]
    s = take(FENCED, s, DecodeReceiveFailure)
    assert s.requests[0].d == "failed" and not s.requests[0].d_awaiting_ack
    assert not [m for m in s.network if m.kind == "abort"]


def test_releasing_on_the_notice_lets_the_write_land_in_a_freed_page() -> None:
    s = take(RELEASES, failed_mid_write(RELEASES), DecodeReceiveFailure)
    assert not s.requests[0].d_awaiting_ack
    s = take(RELEASES, s, DecodeReleasePages)
    s = take(RELEASES, s, DecodeReceiveWrite)
    assert s.ghost.late_landing
    assert sorted(p.name for p in check_always(ONE, s)) == [
        "freed_pages_hold_no_readable_data",
        "no_late_write_lands_in_reallocated_page",
    ]


def test_the_explorer_finds_the_unfenced_release_and_proves_the_fenced_designs() -> None:
    small = replace(ONE, requests=(RequestSpec("a", 1, 1), RequestSpec("b", 1, 1)))
    broken = explore(RELEASES, small)
    assert broken.verdict == "violated"
    # With two requests on one page the late write lands after the page was granted to the
    # other tenant and its completion validated: decode generates from it (20 steps).
    assert {r.property for r in broken.violated()} == {
        "no_late_write_lands_in_reallocated_page",
        "freed_pages_hold_no_readable_data",
        "decode_reads_only_validated_pages",
        "no_cross_tenant_read",
    }
    for variant in (REFERENCE, FENCED):
        result = explore(variant, small)
        assert result.verdict == "safe", (variant.name, [r.property for r in result.violated()])
        # The fault is really taken: it adds states.
        assert result.states > explore(variant, replace(small, max_write_errors=0)).states
