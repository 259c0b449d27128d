"""vLLM's recompute policy on the pull path (`Design.load_failure`, `Design.recompute_fence`).

A failed read either fails the request (`fail`) or makes decode compute the pages itself
(`recompute`). The recompute is safe only if a read of the failed transfer that is still in
flight cannot land on a recomputed page: the reference recomputes under a fresh generation, and
`recompute_without_fence` shows what happens when it does not."""

from __future__ import annotations

from dataclasses import replace

from kvhandoff.model_checker.explore import build_graph, explore
from kvhandoff.model_checker.z3_engines import bmc, kinduction
from kvhandoff.spec.actions import NetworkFailTransfer
from kvhandoff.spec.config import Config, RequestSpec
from kvhandoff.spec.invariants import INVARIANTS, RECOMPUTE_INVARIANTS, invariants_for
from kvhandoff.spec.state import Tag
from kvhandoff.spec.trace import replay
from kvhandoff.spec.variants import get_variant

# One request, on the pull path, with the faults the hazard needs: a failed read and an expired
# lease (two faults); `ONE_FAULT` allows either, not both.
TWO_FAULTS = Config(requests=(RequestSpec("a", 2, 1),), max_faults=2)
ONE_FAULT = replace(TWO_FAULTS, max_faults=1)


def _output_after_failed_read(variant: str, config: Config) -> bool:
    """Some state reachable after a failed read (`network_fail_transfer`) has output."""
    graph = build_graph(get_variant(variant), config, keep_edges=True)[0]
    assert graph.all_edges is not None
    todo = [j for edges in graph.all_edges for j, a in edges if isinstance(a, NetworkFailTransfer)]
    seen = set(todo)
    while todo:
        i = todo.pop()
        if any(q.answer is not None and q.answer.ok for q in graph.states[i].requests):
            return True
        for j, _ in graph.all_edges[i]:
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return False


def test_recompute_turns_a_failed_read_into_output_where_fail_gives_an_error() -> None:
    assert _output_after_failed_read("reference_pull_recompute", ONE_FAULT)
    assert not _output_after_failed_read("reference_pull", ONE_FAULT)


def test_the_reference_recompute_is_safe_with_both_faults() -> None:
    result = explore(get_variant("reference_pull_recompute"), TWO_FAULTS)
    assert result.verdict == "safe", [r for r in result.results if r.verdict != "holds"]


def test_recompute_without_fence_needs_the_failed_read_and_the_expired_lease() -> None:
    variant = get_variant("recompute_without_fence")
    assert explore(variant, ONE_FAULT).verdict == "safe"
    result = explore(variant, TWO_FAULTS)
    caught = {r.property: r for r in result.violated()}
    assert set(variant.breaks) <= set(caught)
    names = [type(a).__name__ for a in caught["no_cross_tenant_read"].trace or ()]
    assert names[-1] == "DecodeGenerate"
    # The read that fails comes before the one that lands: decode recomputed in between.
    assert "PrefillLeaseExpire" in names
    assert names.index("NetworkFailTransfer") < len(names) - 1 - names[::-1].index(
        "DecodeReceiveWrite"
    )


def test_the_fence_refuses_the_read_that_lands_after_the_recompute() -> None:
    """The unfenced design's counterexample, replayed on the reference recompute: the same steps
    are taken, but the recompute took a fresh generation, the late read is refused, and decode
    reads its own data."""
    trace = explore(get_variant("recompute_without_fence"), TWO_FAULTS).violated()[0].trace
    assert trace is not None
    unfenced = replay(get_variant("recompute_without_fence"), TWO_FAULTS, trace)[-1]
    fenced = replay(get_variant("reference_pull_recompute"), TWO_FAULTS, trace)[-1]
    assert unfenced.requests[0].read is not None and fenced.requests[0].read is not None
    assert any(t is not None and t.tenant != "a" for t in unfenced.requests[0].read)
    gen = fenced.requests[0].d_gen
    assert gen == 2 and fenced.next_generation == 3
    assert fenced.requests[0].read == (Tag(0, gen, "a"),) * 2
    assert fenced.ghost.refused_write and not unfenced.ghost.refused_write


def test_bmc_finds_the_unfenced_recompute_at_the_explorers_length() -> None:
    variant = get_variant("recompute_without_fence")
    by_explorer = {r.property: r.depth for r in explore(variant, TWO_FAULTS).violated()}
    by_bmc = {r.property: r.depth for r in bmc(variant, TWO_FAULTS, depth=12).violated()}
    assert by_bmc == {p: d for p, d in by_explorer.items() if d is not None and d <= 12}
    assert by_bmc["no_cross_tenant_read"] == by_explorer["no_cross_tenant_read"]


def test_the_recompute_invariants_hold_where_the_ones_they_replace_break() -> None:
    """Three invariants tie decode's validation to prefill's grant and completion; a recompute
    breaks each of them on reachable states, and their recompute versions hold on all."""
    variant = get_variant("reference_pull_recompute")
    names = {i.name for i in invariants_for(variant.design)}
    assert {i.name for i in RECOMPUTE_INVARIANTS.values()} <= names
    result = explore(variant, TWO_FAULTS, invariants=True)
    assert result.extra["invariants"]["failing"] == {}
    states = build_graph(variant, TWO_FAULTS)[0].states
    for name in RECOMPUTE_INVARIANTS:
        replaced = next(i for i in INVARIANTS if i.name == name)
        assert any(not replaced.holds(TWO_FAULTS, s, variant.design) for s in states), name
    # The other designs keep the invariants as they were.
    assert invariants_for(get_variant("reference_pull").design) == INVARIANTS


def test_kind_proves_the_fenced_recompute_and_finds_the_unfenced_one() -> None:
    assert kinduction(get_variant("reference_pull_recompute"), TWO_FAULTS).verdict == "safe"
    unfenced = kinduction(get_variant("recompute_without_fence"), TWO_FAULTS)
    assert unfenced.verdict == "violated"


def test_the_recompute_proof_carries_over_a_retry_on_a_shared_room() -> None:
    """A retry sets a recomputed attempt aside: its old grant is still retired, held by nobody
    else at decode or prefill (the clause `kind` needed to close the induction)."""
    config = Config(requests=(RequestSpec("a", 2, 1), RequestSpec("a", 1, 1)), max_retries=1)
    variant = get_variant("reference_pull_recompute")
    assert explore(variant, config, invariants=True).extra["invariants"]["failing"] == {}
    assert kinduction(variant, config).verdict == "safe"
