"""A partition in which decode takes a live prefill for dead (`decode_suspect_prefill_dead`).

Prefill is alive: it keeps its grant and keeps writing. Each design must stay safe against that
writer: the reference refuses its late writes, the drain-fenced design keeps the pages until
prefill's drain ack, and releasing without the ack (`release_on_suspected_death`) lets a late
write land in a page granted again.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvhandoff.model_checker.explore import explore
from kvhandoff.spec import REFERENCE, Config, enabled, get_variant, init
from kvhandoff.spec.actions import (
    DecodeAdmitRequest,
    DecodeReceiveAbortAck,
    DecodeReceiveWrite,
    DecodeReleasePages,
    DecodeReservePages,
    DecodeSuspectPrefillDead,
    PrefillAdmitRequest,
    PrefillReceiveAbort,
    PrefillReceiveGrant,
    PrefillSendAbortAck,
    PrefillWritePage,
    RouterSubmitRequest,
    action_name,
)
from kvhandoff.spec.config import ConfigError, parse_set
from kvhandoff.spec.properties import check_always
from kvhandoff.spec.state import Faults, State, all_done
from kvhandoff.spec.variants import Variant
from tests.explored import SMALL, explored
from tests.stepping import one_fault_config, take_one, walk

# One request of one page, one partition allowed and no other fault.
ONE = one_fault_config(max_partitions=1)
FENCED = get_variant("one_sided_fenced")
RELEASES = get_variant("release_on_suspected_death")
REASON = "prefill stopped answering health checks"


def take(variant: Variant, state: State, kind: type, config: Config = ONE) -> State:
    return take_one(variant, config, state, kind)


def write_in_flight(variant: Variant, config: Config = ONE) -> State:
    """Request 0 granted, and prefill's write of its page on the wire."""
    s = walk(
        variant,
        config,
        (
            RouterSubmitRequest,
            PrefillAdmitRequest,
            DecodeAdmitRequest,
            DecodeReservePages,
            PrefillReceiveGrant,
            PrefillWritePage,
        ),
    )
    assert s.writes
    return s


def test_the_partition_budget_is_off_by_default_and_set_like_any_other() -> None:
    assert Config().max_partitions == 0
    assert parse_set(Config(), ["max_partitions=2"]).max_partitions == 2
    with pytest.raises(ConfigError, match="max_partitions"):
        Config(max_partitions=-1)
    with pytest.raises(ConfigError, match="max_partitions"):
        parse_set(Config(), ["max_partitions=x"])
    # A partition is a fault like the others: it counts against the run's total.
    assert Faults(partitions=1).total == 1


def test_without_a_partition_budget_decode_never_suspects_prefill() -> None:
    s = write_in_flight(REFERENCE, replace(ONE, max_partitions=0))
    assert DecodeSuspectPrefillDead() not in enabled(REFERENCE, replace(ONE, max_partitions=0), s)
    # Nor once the run's fault budget is spent, whatever the partition budget.
    spent = replace(s, faults=Faults(crashes=1))
    assert DecodeSuspectPrefillDead() not in enabled(REFERENCE, ONE, spent)


def test_a_suspicion_with_nothing_waiting_on_prefill_is_not_a_step() -> None:
    # Submitted and admitted, but no pages granted yet: decode waits on nothing of prefill's.
    s = init(ONE)
    for kind in (RouterSubmitRequest, PrefillAdmitRequest, DecodeAdmitRequest):
        s = take(REFERENCE, s, kind)
    assert s.requests[0].d == "admitted"
    assert DecodeSuspectPrefillDead() not in enabled(REFERENCE, ONE, s)


def test_decode_fails_what_it_waits_on_and_prefill_keeps_writing() -> None:
    s = take(REFERENCE, write_in_flight(REFERENCE), DecodeSuspectPrefillDead)
    req = s.requests[0]
    assert req.d == "failed" and req.answer is not None and req.answer.reason == REASON
    # Prefill is alive: it still holds the grant, and its write is still on the wire.
    assert req.p == "granted" and s.writes
    assert [m.kind for m in s.network] == ["abort"] and s.network[0].generation == req.d_gen
    assert s.faults.partitions == 1 and s.faults.total == 1
    # Nothing restarted: no epoch moved.
    assert (s.prefill_epoch, s.decode_sees_prefill_epoch) == (0, 0)


def test_the_reference_releases_at_once_and_refuses_the_late_write() -> None:
    s = take(REFERENCE, write_in_flight(REFERENCE), DecodeSuspectPrefillDead)
    assert not s.requests[0].d_awaiting_ack
    s = take(REFERENCE, s, DecodeReleasePages)
    s = take(REFERENCE, s, DecodeReceiveWrite)
    assert s.ghost.refused_write and not s.ghost.late_landing
    assert check_always(ONE, s) == []


def test_the_drain_fenced_design_keeps_the_pages_until_the_live_prefill_acks() -> None:
    s = take(FENCED, write_in_flight(FENCED), DecodeSuspectPrefillDead)
    assert s.requests[0].d_awaiting_ack
    assert not [a for a in enabled(FENCED, ONE, s) if isinstance(a, DecodeReleasePages)]
    # The partition heals: the abort reaches prefill, its write lands in the page still held
    # for it, it acknowledges the drain, and only then are the pages freed.
    for kind in (
        PrefillReceiveAbort,
        DecodeReceiveWrite,
        PrefillSendAbortAck,
        DecodeReceiveAbortAck,
        DecodeReleasePages,
    ):
        s = take(FENCED, s, kind)
        assert check_always(ONE, s) == [], kind.__name__
    assert all_done(ONE, s)


def test_releasing_on_suspicion_lets_the_live_writer_land_in_a_freed_page() -> None:
    s = take(RELEASES, write_in_flight(RELEASES), DecodeSuspectPrefillDead)
    assert not s.requests[0].d_awaiting_ack
    s = take(RELEASES, s, DecodeReleasePages)
    s = take(RELEASES, s, DecodeReceiveWrite)
    assert s.ghost.late_landing
    broken = {p.name for p in check_always(ONE, s)}
    assert "no_late_write_lands_in_reallocated_page" in broken


@pytest.mark.parametrize("name", ["reference", "one_sided_fenced"])
def test_a_partition_leaves_the_safe_designs_safe_on_the_small_scenario(name: str) -> None:
    variant = get_variant(name)
    without = explore(variant, parse_set(Config(), SMALL), reduce=False)
    result = explore(variant, parse_set(Config(), [*SMALL, "max_partitions=1"]), reduce=False)
    assert result.verdict == "safe", [r.property for r in result.violated()]
    assert all(result.witnesses.values())
    # The partition is really taken: it adds states (reference 5,040 -> 5,614, one_sided_fenced
    # 4,411 -> 4,854; 4,375 -> 4,818 before its decode fenced on prefill's failure notices).
    assert (without.states, result.states) == {
        "reference": (5040, 5614),
        "one_sided_fenced": (4411, 4854),
    }[name]


def test_the_default_scenario_is_unchanged_without_a_partition() -> None:
    # 71,075 states in the full search (`reduce=False`: tests/model_checker/test_reduction.py).
    assert explored("reference").states == 29_456


def test_the_catalogue_variant_is_caught_by_the_late_write_with_its_own_config() -> None:
    assert RELEASES.config == {"max_partitions": 1}
    assert RELEASES.scenario(Config()).max_partitions == 1
    result = explored(RELEASES.name)
    late = result.result_for("no_late_write_lands_in_reallocated_page")
    assert late.verdict == "violated" and late.trace is not None
    names = [action_name(a) for a in late.trace]
    assert len(names) == 9
    # Decode suspects prefill while its write is on the wire, frees the page, the write lands.
    assert names[-3:] == [
        "decode_suspect_prefill_dead",
        "decode_release_pages",
        "decode_receive_write",
    ]
    # On the design without the option flipped, the same scenario is safe.
    assert explore(FENCED, RELEASES.scenario(Config())).verdict == "safe"
