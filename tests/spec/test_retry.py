"""A client retries a request under the same request id and room after it got an error."""

from dataclasses import replace

import pytest

from kvhandoff.conformance.target import UnsupportedScenario, require_one_prefill_rank
from kvhandoff.model_checker.explore import explore
from kvhandoff.model_checker.z3_encoding import CannotEncode, Encoding
from kvhandoff.spec import REFERENCE, Config, RequestSpec, enabled, get_variant, init
from kvhandoff.spec.actions import (
    Action,
    ClientCancelRequest,
    DecodeAdmitRequest,
    DecodeReceiveCancel,
    DecodeReleasePages,
    DecodeReservePages,
    PrefillAdmitRequest,
    PrefillReceiveAbort,
    PrefillReceiveCancel,
    PrefillReceiveGrant,
    RouterRetryRequest,
    RouterSubmitRequest,
    action_from_json,
    action_to_json,
)
from kvhandoff.spec.config import parse_set
from kvhandoff.spec.machine import checked_step, is_enabled
from kvhandoff.spec.state import Message, State
from kvhandoff.spec.variants import Variant
from tests.explored import SMALL

ONE = Config(requests=(RequestSpec("a", 1, 1),), decode_pages=1, max_retries=1)
UNFENCED = get_variant("retry_reuses_request_id")
RETRY = RouterRetryRequest(0)


def run(variant: Variant, config: Config, actions: list[Action]) -> State:
    state = init(config)
    for action in actions:
        state = checked_step(variant, config, state, action)
    return state


# The client cancels after decode granted a page; decode's abort of that grant is sent, and the
# grant itself has not reached prefill yet, when both workers are done with the first attempt.
CANCELLED = [
    RouterSubmitRequest(0),
    DecodeAdmitRequest(0),
    DecodeReservePages(0),
    ClientCancelRequest(0),
    DecodeReceiveCancel(0),
    PrefillReceiveCancel(0),
    DecodeReleasePages(0),
]


def stale(state: State, kind: str) -> Message:
    (m,) = [m for m in state.network if m.kind == kind]
    return m


def test_a_retry_is_enabled_once_the_client_has_its_error_and_both_workers_are_done() -> None:
    before_release = run(REFERENCE, ONE, CANCELLED[:-1])
    assert before_release.requests[0].answer is not None
    assert not is_enabled(REFERENCE, ONE, before_release, RETRY)  # decode still holds a page
    cancel_on_its_way = run(REFERENCE, ONE, CANCELLED[:4])
    assert not is_enabled(REFERENCE, ONE, cancel_on_its_way, RETRY)
    done = run(REFERENCE, ONE, CANCELLED)
    assert RETRY in enabled(REFERENCE, ONE, done)


def test_the_default_budget_has_no_retry() -> None:
    config = replace(ONE, max_retries=0)
    done = run(REFERENCE, config, CANCELLED)
    assert not any(isinstance(a, RouterRetryRequest) for a in enabled(REFERENCE, config, done))


def test_a_retry_starts_a_fresh_attempt_and_spends_its_own_budget_not_a_fault() -> None:
    done = run(REFERENCE, ONE, CANCELLED)
    assert done.faults.total == ONE.max_faults  # the cancel spent the run's one fault
    after = checked_step(REFERENCE, ONE, done, RETRY)
    req = after.requests[0]
    assert (req.attempt, req.answer, req.p, req.d) == (1, None, "received", "received")
    assert (req.p_gen, req.d_gen, req.read, req.accepted_full) == (0, 0, None, None)
    assert (after.faults.retries, after.faults.total) == (1, done.faults.total)
    # The first attempt's messages are still in flight: that is the point.
    assert {m.kind for m in after.network} == {"grant", "abort"}
    assert not is_enabled(REFERENCE, ONE, after, RETRY)  # answered or not, budget spent


def test_the_reference_ignores_the_first_attempts_abort_and_grant() -> None:
    second = run(REFERENCE, ONE, [*CANCELLED, RETRY, PrefillAdmitRequest(0)])
    abort, grant = stale(second, "abort"), stale(second, "grant")
    assert (abort.attempt, grant.attempt) == (0, 0)
    assert checked_step(REFERENCE, ONE, second, PrefillReceiveAbort(abort)).requests[0].p == (
        "admitted"
    )
    assert checked_step(REFERENCE, ONE, second, PrefillReceiveGrant(grant)).requests[0].p_gen == 0


def test_matching_by_request_id_alone_lets_the_first_attempts_abort_stop_the_second() -> None:
    second = run(UNFENCED, ONE, [*CANCELLED, RETRY, PrefillAdmitRequest(0)])
    stopped = checked_step(UNFENCED, ONE, second, PrefillReceiveAbort(stale(second, "abort")))
    assert stopped.requests[0].p == "aborted"
    took = checked_step(UNFENCED, ONE, second, PrefillReceiveGrant(stale(second, "grant")))
    assert (took.requests[0].p, took.requests[0].p_gen) == ("granted", 1)


def test_messages_of_a_second_attempt_carry_it_in_traces_and_first_attempts_read_as_before() -> (
    None
):
    second = run(REFERENCE, ONE, [*CANCELLED, RETRY, DecodeAdmitRequest(0), DecodeReservePages(0)])
    fresh = max(m for m in second.network if m.kind == "grant")
    assert fresh.attempt == 1
    data = action_to_json(PrefillReceiveGrant(fresh))
    assert data["args"]["message"]["attempt"] == 1
    assert action_from_json(data) == PrefillReceiveGrant(fresh)
    old = action_to_json(PrefillReceiveGrant(stale(run(REFERENCE, ONE, CANCELLED), "grant")))
    assert "attempt" not in old["args"]["message"]


def small(*more: str) -> Config:
    return parse_set(Config(), [*SMALL, *more])


def test_the_reference_stays_safe_and_terminating_with_a_retry_on_the_small_scenario() -> None:
    assert explore(REFERENCE, small(), reduce=False).states == 5_040  # no retry: as before
    result = explore(REFERENCE, small("max_retries=1"), reduce=False)
    assert result.states == 30_334
    assert all(p.verdict == "holds" for p in result.results)


def test_matching_by_request_id_alone_breaks_termination_with_a_retry() -> None:
    # Without a retry it is the reference.
    assert explore(UNFENCED, small(), reduce=False).states == 5_040
    result = explore(UNFENCED, small("max_retries=1"), reduce=False)
    broken = [p.property for p in result.results if p.verdict == "violated"]
    assert broken == ["every_request_terminates"]
    assert UNFENCED.breaks == ("every_request_terminates",)
    assert UNFENCED.config == {"max_retries": 1}


def test_engines_that_cannot_hold_a_retry_say_so() -> None:
    Encoding(REFERENCE, ONE)  # the fixed encoding holds a retry (one slot set per attempt)...
    with pytest.raises(CannotEncode, match="max_retries=1"):
        Encoding(REFERENCE, replace(ONE, prefill_ranks=2))  # ...with one prefill rank only
    with pytest.raises(UnsupportedScenario, match="max_retries=1"):
        require_one_prefill_rank(ONE)
    with pytest.raises(ValueError, match="max_retries"):
        Config(max_retries=-1)
