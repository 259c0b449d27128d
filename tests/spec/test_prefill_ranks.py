"""Several prefill ranks: each writes its own shard of every page and reports on its own."""

from dataclasses import replace

import pytest

from kvhandoff.spec import (
    REFERENCE,
    Config,
    RequestSpec,
    default_config,
    enabled,
    get_variant,
    init,
    step,
)
from kvhandoff.spec.actions import (
    Action,
    DecodeAdmitRequest,
    DecodeGenerate,
    DecodeReceiveAbortAck,
    DecodeReceiveCompletion,
    DecodeReceiveWrite,
    DecodeReleasePages,
    DecodeReservePages,
    DecodeWaitingTimeout,
    NetworkDuplicateMessage,
    PrefillAdmitRequest,
    PrefillReceiveAbort,
    PrefillReceiveGrant,
    PrefillRejectRequest,
    PrefillSendAbortAck,
    PrefillSendCompletion,
    PrefillWritePage,
    RouterSubmitRequest,
    action_from_json,
    action_to_json,
)
from kvhandoff.spec.machine import checked_step
from kvhandoff.spec.properties import (
    accepted_completion_implies_full_coverage,
    decode_reads_only_validated_pages,
    freed_pages_hold_no_readable_data,
)
from kvhandoff.spec.state import Message, PageState, State, Tag
from kvhandoff.spec.trace import dump_trace, load_trace, replay
from kvhandoff.spec.variants import Variant

ONE_PAGE = (RequestSpec("a", 1, 1),)


def two_ranks(**changes: object) -> Config:
    return replace(Config(requests=ONE_PAGE, decode_pages=1, prefill_ranks=2), **changes)


def run(variant: Variant, config: Config, actions: list[Action]) -> State:
    state = init(config)
    for action in actions:
        state = checked_step(variant, config, state, action)
    return state


def granted(variant: Variant, config: Config) -> State:
    """Request 0 admitted on both sides, its page granted and the grant received by prefill."""
    state = run(
        variant,
        config,
        [RouterSubmitRequest(0), PrefillAdmitRequest(0), DecodeAdmitRequest(0)],
    )
    state = checked_step(variant, config, state, DecodeReservePages(0))
    return checked_step(variant, config, state, PrefillReceiveGrant(state.network[0]))


def the(kind: str, state: State, rank: int = 0) -> Message:
    return next(m for m in state.network if m.kind == kind and m.rank == rank)


def reachable(variant: Variant, config: Config) -> set[State]:
    seen = {init(config)}
    frontier = list(seen)
    while frontier:
        state = frontier.pop()
        for action in enabled(variant, config, state):
            after = step(variant, config, state, action)
            if after not in seen:
                seen.add(after)
                frontier.append(after)
    return seen


SMALL = Config(
    requests=(RequestSpec("a", 1, 1), RequestSpec("b", 2, 2)),
    decode_pages=2,
    prefill_max_prompt=1,
    decode_max_prompt=2,
    context_window=2,
)


def test_with_one_rank_pages_are_one_shard_and_the_rank_sets_stay_empty() -> None:
    for variant in (REFERENCE, get_variant("one_sided_fenced")):
        for state in reachable(variant, SMALL):
            assert all(page.rank_shards == () for page in state.pages)
            assert all(
                req.p_ranks_done == req.d_ranks == req.d_acks == () for req in state.requests
            )
            assert state.acked_ranks == ()
            assert all(m.rank == 0 for m in state.network) and all(
                w.rank == 0 for w in state.writes
            )


def test_each_rank_writes_its_own_shard_of_the_page() -> None:
    config = two_ranks()
    state = checked_step(REFERENCE, config, granted(REFERENCE, config), PrefillWritePage(0))
    assert sorted(w.rank for w in state.writes) == [0, 1]
    assert {w.page for w in state.writes} == {0}
    one = next(w for w in state.writes if w.rank == 1)
    state = checked_step(REFERENCE, config, state, DecodeReceiveWrite(one))
    own = Tag(0, 1, "a")
    assert state.pages[0].shards == (None, own)


def test_a_rank_reports_only_once_its_own_writes_returned() -> None:
    config = two_ranks()
    state = checked_step(REFERENCE, config, granted(REFERENCE, config), PrefillWritePage(0))
    zero = next(w for w in state.writes if w.rank == 0)
    state = checked_step(REFERENCE, config, state, DecodeReceiveWrite(zero))
    completions = [a for a in enabled(REFERENCE, config, state) if type(a) is PrefillSendCompletion]
    assert completions == [PrefillSendCompletion(0, rank=0)]


def landed_and_rank_0_reported(variant: Variant, config: Config) -> State:
    state = checked_step(variant, config, granted(variant, config), PrefillWritePage(0))
    zero = next(w for w in state.writes if w.rank == 0)
    state = checked_step(variant, config, state, DecodeReceiveWrite(zero))
    state = checked_step(variant, config, state, PrefillSendCompletion(0, rank=0))
    assert state.requests[0].p == "granted" and state.requests[0].p_ranks_done == (0,)
    return checked_step(variant, config, state, DecodeReceiveCompletion(the("completion", state)))


def test_the_reference_decode_waits_for_every_rank_before_it_accepts() -> None:
    config = two_ranks()
    state = landed_and_rank_0_reported(REFERENCE, config)
    assert state.requests[0].d == "reserved" and state.requests[0].d_ranks == (0,)
    assert DecodeGenerate(0) not in enabled(REFERENCE, config, state)
    one = next(w for w in state.writes if w.rank == 1)
    state = checked_step(REFERENCE, config, state, DecodeReceiveWrite(one))
    state = checked_step(REFERENCE, config, state, PrefillSendCompletion(0, rank=1))
    assert state.requests[0].p == "completed" and state.requests[0].p_ranks_done == ()
    state = checked_step(
        REFERENCE, config, state, DecodeReceiveCompletion(the("completion", state, 1))
    )
    req = state.requests[0]
    assert (req.d, req.accepted_full, req.d_ranks) == ("validated", True, ())
    state = checked_step(REFERENCE, config, state, DecodeGenerate(0))
    assert state.requests[0].read == (Tag(0, 1, "a"), Tag(0, 1, "a"))
    assert decode_reads_only_validated_pages(config, state)


def test_a_duplicated_completion_of_one_rank_does_not_stand_for_another() -> None:
    config = two_ranks()
    state = checked_step(REFERENCE, config, granted(REFERENCE, config), PrefillWritePage(0))
    zero = next(w for w in state.writes if w.rank == 0)
    state = checked_step(REFERENCE, config, state, DecodeReceiveWrite(zero))
    state = checked_step(REFERENCE, config, state, PrefillSendCompletion(0, rank=0))
    completion = the("completion", state)
    state = checked_step(REFERENCE, config, state, NetworkDuplicateMessage(completion))
    state = checked_step(REFERENCE, config, state, DecodeReceiveCompletion(completion))
    state = checked_step(REFERENCE, config, state, DecodeReceiveCompletion(completion))
    assert state.requests[0].d == "reserved" and state.requests[0].d_ranks == (0,)


def test_the_first_rank_variant_accepts_one_rank_and_reads_a_missing_shard() -> None:
    variant = get_variant("first_rank_completion_accepted")
    config = two_ranks()
    state = landed_and_rank_0_reported(variant, config)
    assert state.requests[0].d == "validated"
    assert not accepted_completion_implies_full_coverage(config, state)
    state = checked_step(variant, config, state, DecodeGenerate(0))
    assert state.requests[0].read == (Tag(0, 1, "a"), None)
    assert not decode_reads_only_validated_pages(config, state)


def test_the_first_rank_variant_is_the_reference_protocol_with_one_rank() -> None:
    variant = get_variant("first_rank_completion_accepted")
    config = Config(requests=ONE_PAGE, decode_pages=1)
    state = checked_step(variant, config, granted(variant, config), PrefillWritePage(0))
    state = checked_step(variant, config, state, DecodeReceiveWrite(state.writes[0]))
    state = checked_step(variant, config, state, PrefillSendCompletion(0))
    state = checked_step(variant, config, state, DecodeReceiveCompletion(state.network[0]))
    assert state.requests[0].accepted_full is True


def failed_validation(config: Config) -> State:
    """Prefill truncates a 2-page prompt to 1 page; rank 0 reports 1 page of 2: invalid."""
    variant = REFERENCE.derive("truncating", "", oversize="truncate")
    state = run(
        variant, config, [RouterSubmitRequest(0), PrefillRejectRequest(0), DecodeAdmitRequest(0)]
    )
    state = checked_step(variant, config, state, DecodeReservePages(0))
    state = checked_step(variant, config, state, PrefillReceiveGrant(state.network[0]))
    state = checked_step(variant, config, state, PrefillWritePage(0))
    zero = next(w for w in state.writes if w.rank == 0)
    state = checked_step(variant, config, state, DecodeReceiveWrite(zero))
    state = checked_step(variant, config, state, PrefillSendCompletion(0, rank=0))
    state = checked_step(variant, config, state, DecodeReceiveCompletion(the("completion", state)))
    assert state.requests[0].d == "failed"
    return state


def test_a_rank_failing_validation_aborts_the_ranks_that_may_still_write() -> None:
    two = two_ranks(requests=(RequestSpec("a", 2, 1),), decode_pages=2, prefill_max_prompt=1)
    assert [m.kind for m in failed_validation(two).network] == ["abort"]
    one = replace(two, prefill_ranks=1)
    assert failed_validation(one).network == (), "the only rank has reported: nothing to stop"


def test_with_a_drain_fence_decode_releases_only_once_every_rank_acked() -> None:
    variant = get_variant("one_sided_fenced")
    config = two_ranks()
    state = checked_step(variant, config, granted(variant, config), PrefillWritePage(0))
    state = checked_step(variant, config, state, DecodeWaitingTimeout(0))
    assert state.requests[0].d_awaiting_ack
    state = checked_step(variant, config, state, PrefillReceiveAbort(the("abort", state)))
    assert enabled(variant, config, state).count(PrefillSendAbortAck(1, 1, 0)) == 0
    zero = next(w for w in state.writes if w.rank == 0)
    state = checked_step(variant, config, state, DecodeReceiveWrite(zero))
    state = checked_step(variant, config, state, PrefillSendAbortAck(1, 1, rank=0))
    assert state.acked_ranks == ((1, 1, 0),) and state.pending_acks
    state = checked_step(variant, config, state, DecodeReceiveAbortAck(the("abort_ack", state)))
    assert state.requests[0].d_awaiting_ack and state.requests[0].d_acks == (0,)
    assert DecodeReleasePages(0) not in enabled(variant, config, state)
    one = next(w for w in state.writes if w.rank == 1)
    state = checked_step(variant, config, state, DecodeReceiveWrite(one))
    state = checked_step(variant, config, state, PrefillSendAbortAck(1, 1, rank=1))
    assert state.acked_ranks == () and state.pending_acks == ()
    ack = the("abort_ack", state, 1)
    state = checked_step(variant, config, state, DecodeReceiveAbortAck(ack))
    assert not state.requests[0].d_awaiting_ack and state.requests[0].d_acks == ()
    state = checked_step(variant, config, state, DecodeReleasePages(0))
    assert state.pages[0] == PageState(last_tenant="a", rank_shards=(None,))


def test_a_free_page_with_one_unzeroed_shard_holds_readable_data() -> None:
    config = two_ranks()
    state = init(config)
    leaked = PageState(rank_shards=(Tag(0, 1, "a"),))
    assert freed_pages_hold_no_readable_data(config, state)
    assert not freed_pages_hold_no_readable_data(config, replace(state, pages=(leaked,)))


def test_rank_0_is_left_out_of_json_and_read_back_as_0() -> None:
    assert action_to_json(PrefillSendCompletion(2)) == {
        "action": "prefill_send_completion",
        "args": {"request": 2},
    }
    assert action_to_json(PrefillSendCompletion(2, rank=1))["args"] == {"request": 2, "rank": 1}
    assert action_from_json(
        {"action": "prefill_send_abort_ack", "args": {"room": 1, "generation": 3}}
    ) == (PrefillSendAbortAck(1, 3, 0))


@pytest.mark.parametrize("choose", [0, 1, 3, 5])
def test_a_several_rank_trace_round_trips_and_replays(choose: int) -> None:
    config = replace(default_config(), prefill_ranks=2)
    state = init(config)
    actions = []
    for _ in range(30):
        options = enabled(REFERENCE, config, state)
        if not options:
            break
        action = options[choose % len(options)]
        actions.append(action)
        state = step(REFERENCE, config, state, action)
    trace = load_trace(dump_trace(config, actions, kind="scenario", variant="reference"))
    assert trace.config.prefill_ranks == 2
    assert list(trace.actions) == actions
    assert replay(REFERENCE, config, trace.actions)[-1] == state


@pytest.mark.parametrize("name", ["reference", "one_sided_fenced"])
def test_the_safety_invariants_hold_on_every_reachable_state_with_two_ranks(name: str) -> None:
    from kvhandoff.spec.invariants import INVARIANTS, ONE_SIDED_INVARIANTS

    variant = get_variant(name)
    config = replace(SMALL, prefill_ranks=2)
    invariants = INVARIANTS + (ONE_SIDED_INVARIANTS if name == "one_sided_fenced" else ())
    states = reachable(variant, config)
    assert len(states) > 5000
    for state in states:
        for inv in invariants:
            assert inv.holds(config, state), inv.name
