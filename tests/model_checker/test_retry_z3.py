"""Client retries in the fixed-configuration Z3 encoding (bmc, kind, the fixed prove): each
attempt of a request has its own message and write slots, and the verdicts agree with the
explorer's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvhandoff.model_checker.explore import build_graph, explore
from kvhandoff.model_checker.z3_crosscheck import accepted_non_edges, edge_mismatches
from kvhandoff.model_checker.z3_encoding import Encoding
from kvhandoff.model_checker.z3_engines import bmc, kinduction
from kvhandoff.spec import REFERENCE, Config, RequestSpec, get_variant
from kvhandoff.spec.invariants import failing_invariants
from kvhandoff.spec.properties import ALWAYS, TERMINATION
from kvhandoff.spec.state import Message, State, evolve

ONE = Config(requests=(RequestSpec("a", 1, 1),), decode_pages=1, max_retries=1)
"""One request, one page, one retry: small enough to explore in a second (1,409 states for the
reference), deep enough for a first attempt's messages and writes to meet the second's."""
UNFENCED = get_variant("retry_reuses_request_id")


def _stale(state: State) -> bool:
    """A first attempt's message or write is still in flight after the retry."""
    stale_message = any(
        m.attempt < state.requests[m.request].attempt for m in (*state.network, *state.lost)
    )
    stale_write = any(w.generation != state.requests[w.data.request].p_gen for w in state.writes)
    return stale_message or stale_write


@pytest.mark.parametrize("name", ["reference", "retry_reuses_request_id"])
def test_the_relation_takes_the_explorers_edges_where_a_first_attempt_meets_the_second(
    name: str,
) -> None:
    variant = get_variant(name)
    graph, _, _ = build_graph(variant, ONE)
    stale = [s for s in graph.states if _stale(s)]
    assert stale  # the states this encoding's attempt slots are for
    picks = stale[:: max(1, len(stale) // 40)] + graph.states[:: max(1, len(graph.states) // 20)]
    assert edge_mismatches(variant, ONE, picks) == []
    assert accepted_non_edges(variant, ONE, graph.states, samples=3) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reference", "retry_reuses_request_id"])
def test_the_relation_takes_exactly_the_explorers_edges_on_every_state(name: str) -> None:
    variant = get_variant(name)
    graph, _, _ = build_graph(variant, ONE)
    assert edge_mismatches(variant, ONE, graph.states) == []


def test_without_retries_the_encoding_is_the_one_before() -> None:
    enc = Encoding(REFERENCE, replace(ONE, max_retries=0))
    assert not enc.retries and enc.attempts == 1
    assert not any(".a1" in name or name.endswith(("attempt", "retries")) for name, _ in enc.fields)
    assert "router_retry_request" not in {i.name for i in enc.instances}
    with_retry = Encoding(REFERENCE, ONE)
    assert {n for n, _ in enc.fields} < {n for n, _ in with_retry.fields}
    assert "router_retry_request" in {i.name for i in with_retry.instances}


@pytest.mark.parametrize("name", ["reference", "retry_reuses_request_id"])
def test_bmc_gives_the_explorers_safety_verdicts_with_a_retry(name: str) -> None:
    variant = get_variant(name)
    explored = explore(variant, ONE)
    result = bmc(variant, ONE, depth=explored.extra["max_depth"])  # a complete bound
    for p in ALWAYS:
        assert explored.result_for(p.name).verdict == "holds"
        assert result.result_for(p.name).verdict in ("bounded", "holds")
    # The unfenced variant's bug is a liveness one: the explorer catches it, and the Z3 engines
    # say they do not check that property (never that it holds).
    termination = explored.result_for(TERMINATION.name).verdict
    assert termination == ("violated" if name == "retry_reuses_request_id" else "holds")
    assert TERMINATION.name in result.extra["not_checked"]
    assert all(r.property != TERMINATION.name for r in result.results)


@pytest.mark.parametrize("name", ["reference", "one_sided_fenced"])
def test_kind_proves_the_design_with_a_retry(name: str) -> None:
    # The invariants say what a first attempt's messages and writes are once the request was
    # retried (an earlier attempt, a retired generation): with that, they are 1-inductive. On
    # the one-sided path a drain ack the first attempt owed may go out during the second, and
    # a current write is of the grant decode holds now.
    result = kinduction(get_variant(name), ONE, timeout=60)
    for p in ALWAYS:
        assert result.result_for(p.name).verdict == "holds", result.result_for(p.name)
    assert result.extra["k"] == 1
    assert result.extra["movement"]["actions"]["router_retry_request"] is not None


@pytest.mark.slow
def test_kind_proves_the_reference_with_a_retry_on_the_default_scenario() -> None:
    result = kinduction(REFERENCE, replace(Config(), max_retries=1), timeout=300)
    assert [result.result_for(p.name).verdict for p in ALWAYS] == ["holds"] * len(ALWAYS)


def test_prove_covers_any_number_of_retries_and_says_so() -> None:
    from kvhandoff.model_checker.prove import prove

    with_retries = prove(REFERENCE, replace(Config(), max_retries=1), timeout=120)
    assert with_retries.verdict == "safe"
    assert with_retries.scope == "any-size"
    assert "client retries" in with_retries.scope_text()
    assert "no client retries" not in with_retries.scope_text()
    without = prove(REFERENCE, Config(), timeout=120)
    assert without.verdict == "safe"
    assert "no client retries" in without.scope_text()


@pytest.mark.parametrize("name", ["reference", "reference_pull", "one_sided_fenced"])
def test_every_invariant_holds_on_every_state_with_a_retry(name: str) -> None:
    # Not only the proof: the explorer evaluates the same formulas on every reachable state,
    # many of them with a first attempt's messages or writes still in flight, so the
    # explorer's --invariants never cries wolf.
    variant = get_variant(name)
    config = replace(ONE, requests=(RequestSpec("a", 1, 1), RequestSpec("b", 1, 2)))
    graph, _, _ = build_graph(variant, config)
    stale = [s for s in graph.states if _stale(s)]
    assert len(stale) > 1000
    for state in graph.states:
        assert failing_invariants(config, state, variant.design) == [], state


def test_a_stale_completion_naming_a_live_generation_breaks_the_invariants() -> None:
    # The claim about earlier attempts has teeth: a first attempt's completion may stay in
    # flight only under a generation nobody holds. Give it the second attempt's generation and
    # decode could accept it for the second attempt: the invariant must say no.
    graph, _, _ = build_graph(REFERENCE, ONE)
    held = next(
        s
        for s in graph.states
        if s.requests[0].attempt == 1 and s.requests[0].d_gen != 0 and not s.network
    )
    req = held.requests[0]
    forged = Message("completion", 1, req.d_gen, 0, count=1, digest=((0, 0, req.d_gen),))
    broken = evolve(held, network=(forged,))
    names = [inv.name for inv in failing_invariants(ONE, broken, REFERENCE.design)]
    assert "messages_carry_their_generation" in names
    assert failing_invariants(ONE, held, REFERENCE.design) == []


VARIANTS_WITH_A_RETRY = [
    "incident",
    "m1_placeholder_rejection",
    "m20_unscrubbed_pages",
    "m15_silent_prefill_abort",
    "retry_reuses_request_id",
]


@pytest.mark.parametrize("name", VARIANTS_WITH_A_RETRY)
def test_bmc_never_says_safe_where_the_explorer_finds_a_violation_with_a_retry(
    name: str,
) -> None:
    variant = get_variant(name)
    config = replace(ONE, requests=(RequestSpec("a", 1, 1), RequestSpec("b", 1, 2)))
    explored = explore(variant, config)
    result = bmc(variant, config, depth=12)
    for p in ALWAYS:
        want = explored.result_for(p.name)
        got = result.result_for(p.name)
        if want.verdict == "violated" and want.depth is not None and want.depth <= 12:
            assert got.verdict == "violated", (p.name, got)
        if got.verdict == "violated":
            assert want.verdict == "violated", (p.name, got)
    if name in ("incident", "m20_unscrubbed_pages"):  # not vacuous: both caught at 8 steps
        caught = [r.property for r in result.results if r.verdict == "violated"]
        assert caught == ["freed_pages_hold_no_readable_data"]


def test_a_fixed_configuration_scope_names_the_client_retries_it_covers() -> None:
    # A retry is not a fault (its own budget), so "at most 1 fault" alone would leave a reader
    # to guess whether a verdict covered retries.
    from kvhandoff.model_checker.result import config_summary

    assert config_summary(ONE).endswith("at most 1 fault and 1 client retry")
    assert config_summary(replace(ONE, max_retries=2)).endswith("and 2 client retries")
    assert "retr" not in config_summary(replace(ONE, max_retries=0))
    result = kinduction(get_variant("one_sided_fenced"), ONE, timeout=60)
    assert result.scope_text().endswith("at most 1 fault and 1 client retry)")
