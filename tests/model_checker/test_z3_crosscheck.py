"""Checks on the checker: Z3 encoding vs the spec and the explorer, invariants vs reachable states."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest
import z3

from kvhandoff.model_checker import z3_derived
from kvhandoff.model_checker.engines import bmc_completeness
from kvhandoff.model_checker.explore import build_graph, explore
from kvhandoff.model_checker.z3_crosscheck import accepted_non_edges, constants, edge_mismatches
from kvhandoff.model_checker.z3_encoding import Encoding
from kvhandoff.model_checker.z3_engines import bmc
from kvhandoff.model_checker.z3_invariants import fixed_invariants
from kvhandoff.spec.actions import DecodeSuspectPrefillDead
from kvhandoff.spec.config import Config
from kvhandoff.spec.invariants import INVARIANTS, ONE_SIDED_INVARIANTS
from kvhandoff.spec.machine import enabled
from kvhandoff.spec.properties import ALWAYS
from kvhandoff.spec.state import PageState
from kvhandoff.spec.variants import REFERENCE, VARIANTS, get_variant
from tests.model_checker.small import SMALL

PULL_VARIANTS = [v for v in VARIANTS if v.design.transfer == "pull"]


def _sample(states: list, k: int) -> list:  # type: ignore[type-arg]
    return states[:: max(1, len(states) // k)]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_z3_transition_relation_takes_exactly_the_explorers_edges(variant) -> None:  # type: ignore[no-untyped-def]
    graph, _, _ = build_graph(variant, SMALL)
    assert edge_mismatches(variant, SMALL, _sample(graph.states, 12)) == []
    assert accepted_non_edges(variant, SMALL, graph.states, samples=3) == []


@pytest.mark.parametrize("variant", PULL_VARIANTS, ids=lambda v: v.name)
def test_z3_takes_the_explorers_edges_where_the_pull_path_differs(variant) -> None:  # type: ignore[no-untyped-def]
    """Where a lease expired, a read may fail, or outside data landed: the states the pull
    encoders (read-time data, `prefill_lease_expire`, `network_fail_transfer`) are about."""
    graph, _, _ = build_graph(variant, SMALL)

    def pull_specific(state) -> bool:  # type: ignore[no-untyped-def]
        return (
            any(q.p_lease_expired for q in state.requests)
            or any(p.content is not None and p.content.request == -1 for p in state.pages)
            or any(
                type(a).__name__ in ("PrefillLeaseExpire", "NetworkFailTransfer")
                for a in enabled(variant, SMALL, state)
            )
        )

    picks = [s for s in graph.states if pull_specific(s)]
    assert any(any(q.p_lease_expired for q in s.requests) for s in picks)
    assert edge_mismatches(variant, SMALL, _sample(picks, 25)) == []
    assert accepted_non_edges(variant, SMALL, picks, samples=3, seed=1) == []


RANKED_DESIGNS = [
    "reference",
    "one_sided_fenced",
    "reference_pull",
    "first_rank_completion_accepted",
]


@pytest.mark.parametrize("name", RANKED_DESIGNS)
def test_z3_takes_exactly_the_explorers_edges_with_two_prefill_ranks(name: str) -> None:
    """Per-rank shards, writes, completions, drain acks and rank sets: the states where the
    ranks stand apart (some rank reported, acknowledged, or has a write in flight that another
    has not) are the ones the rank encoding is about."""
    variant = get_variant(name)
    config = replace(SMALL, prefill_ranks=2)
    graph, _, _ = build_graph(variant, config)

    def ranks_apart(state) -> bool:  # type: ignore[no-untyped-def]
        return (
            any(q.p_ranks_done or q.d_ranks or q.d_acks for q in state.requests)
            or bool(state.acked_ranks)
            or any(w.rank for w in state.writes)
            or any(m.rank for m in state.network)
        )

    picks = [s for s in graph.states if ranks_apart(s)]
    assert picks
    if name != "first_rank_completion_accepted":  # that one accepts the first rank's report
        assert any(q.d_ranks for s in picks for q in s.requests)
    assert edge_mismatches(variant, config, _sample(picks, 25)) == []
    assert accepted_non_edges(variant, config, picks, samples=3, seed=2) == []


@pytest.mark.parametrize("name", ["reference", "one_sided_fenced", "release_on_suspected_death"])
def test_z3_takes_the_explorers_edges_where_decode_suspects_a_live_prefill(name: str) -> None:
    """A partition (`decode_suspect_prefill_dead`, off by default): the states where decode may
    take prefill for dead, and those after it did, with each design's fence."""
    variant = get_variant(name)
    config = replace(SMALL, max_partitions=1)
    graph, _, _ = build_graph(variant, config)
    suspect = DecodeSuspectPrefillDead()
    picks = [
        s for s in graph.states if s.faults.partitions or suspect in enabled(variant, config, s)
    ]
    assert any(suspect in enabled(variant, config, s) for s in picks)
    assert any(s.faults.partitions for s in picks)
    assert edge_mismatches(variant, config, _sample(picks, 25)) == []
    assert accepted_non_edges(variant, config, picks, samples=3, seed=3) == []


def test_z3_keeps_two_orphan_grants_of_one_room_apart() -> None:
    """M18: prefill keeps transfer state for each stale grant; two of one room (different
    requests' generations) must both survive the abstraction (a sampled state once lost one)."""
    variant = get_variant("m18_orphan_grant_accepted")
    graph, _, _ = build_graph(variant, SMALL)
    picks = [s for s in graph.states if len({room for room, _, _ in s.orphans}) < len(s.orphans)]
    assert picks
    assert edge_mismatches(variant, SMALL, _sample(picks, 10)) == []


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_z3_properties_agree_with_the_spec_on_sampled_states(variant) -> None:  # type: ignore[no-untyped-def]
    """Must-fail per property: wherever the spec says a property fails, so does Z3."""
    graph, first, _ = build_graph(variant, SMALL)
    enc = Encoding(variant, SMALL)
    picks = _sample(graph.states, 20) + [graph.states[i] for i in first.values()]
    for state in picks:
        formulas = enc.properties(constants(enc, enc.abstract(state)))
        for prop in ALWAYS:
            assert z3.is_true(z3.simplify(formulas[prop.name])) == prop.holds(SMALL, state)


def test_every_property_has_a_state_where_z3_says_it_fails() -> None:
    seen: set[str] = set()
    runs = [(v, SMALL) for v in VARIANTS] + [(get_variant("incident"), Config())]
    for variant, config in runs:
        graph, first, _ = build_graph(variant, config)
        enc = Encoding(variant, config)
        for name, i in first.items():
            formulas = enc.properties(constants(enc, enc.abstract(graph.states[i])))
            assert z3.is_false(z3.simplify(formulas[name]))
            seen.add(name)
    # No catalogued variant double-books a page; break the page table by hand for that one.
    state = build_graph(REFERENCE, SMALL)[0].states[0]
    bad = state.__class__(requests=state.requests, pages=(PageState(owner=(0, 1)), PageState()))
    enc = Encoding(REFERENCE, SMALL)
    formulas = enc.properties(constants(enc, enc.abstract(bad)))
    assert z3.is_false(z3.simplify(formulas["page_has_single_owner"]))
    seen.add("page_has_single_owner")
    assert seen == {p.name for p in ALWAYS}


@pytest.fixture(scope="module")
def reference_states() -> list:  # type: ignore[type-arg]
    return build_graph(REFERENCE, Config())[0].states


def test_the_reference_invariants_hold_on_every_reachable_state(reference_states) -> None:  # type: ignore[no-untyped-def]
    for state in reference_states:
        for inv in INVARIANTS:
            assert inv.holds(Config(), state), inv.name


def test_the_reference_invariants_hold_on_every_reachable_state_of_the_pull_reference() -> None:
    for state in build_graph(get_variant("reference_pull"), Config())[0].states:
        for inv in INVARIANTS:
            assert inv.holds(Config(), state), inv.name


def test_the_one_sided_fenced_invariants_hold_on_every_reachable_state_of_that_design() -> None:
    variant = get_variant("one_sided_fenced")
    for state in build_graph(variant, Config())[0].states:
        for inv in INVARIANTS + ONE_SIDED_INVARIANTS:
            assert inv.holds(Config(), state), inv.name


def test_z3_invariants_hold_on_sampled_reachable_states_and_share_the_spec_names(
    reference_states,  # type: ignore[no-untyped-def]
) -> None:
    enc = Encoding(REFERENCE, Config(), width=None)
    invs = fixed_invariants(enc)
    # The same invariants, by name, in Python, on the fixed config and for any size.
    assert set(invs) - {"well_formed"} == {i.name for i in INVARIANTS}
    read = z3_derived.claims(z3_derived.Model(REFERENCE.design), z3_derived.base_view(""), "")
    assert set(invs) <= set(read)
    for state in _sample(reference_states, 60):
        s = constants(enc, enc.abstract(state))
        for name, f in invs.items():
            assert z3.is_true(z3.simplify(f(s))), name


def test_spec_stays_pure() -> None:
    for path in Path("spec").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in {"z3", "networkx", "torch", "grpc"}, path


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_explorer_and_bmc_agree_on_every_verdict_on_a_small_config(variant) -> None:  # type: ignore[no-untyped-def]
    by_explorer = explore(variant, SMALL)
    depth = by_explorer.extra["max_depth"]
    # The explorer's depth: BMC is complete here, and says so (`holds`, not `bounded`).
    by_bmc = bmc_completeness(variant, SMALL, bmc(variant, SMALL, depth=depth))
    # A violation decides the verdict without a completeness search (`bmc_completeness`).
    assert by_bmc.verdict == "violated" or by_bmc.extra["completeness"]["complete"]
    complete = by_bmc.extra.get("completeness", {}).get("complete", False)
    for r in by_bmc.results:
        theirs = by_explorer.result_for(r.property).verdict
        if theirs == "holds" and not complete:
            # Beside a counterexample, BMC runs no completeness search: the others stay bounded.
            assert r.verdict == "bounded", r.property
        else:
            assert r.verdict == theirs, r.property
        if r.verdict == "violated":
            assert r.depth == by_explorer.result_for(r.property).depth


def test_the_pull_z3_invariants_hold_on_sampled_reachable_states() -> None:
    variant = get_variant("reference_pull")
    enc = Encoding(variant, Config(), width=None)
    invs = fixed_invariants(enc)
    states = build_graph(variant, Config())[0].states
    outside = [s for s in states if any(p.content and p.content.request == -1 for p in s.pages)]
    assert outside  # the invariants must allow outside data in owned pages
    for state in _sample(states, 40) + _sample(outside, 20):
        s = constants(enc, enc.abstract(state))
        for name, f in invs.items():
            assert z3.is_true(z3.simplify(f(s))), name
