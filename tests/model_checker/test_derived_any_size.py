"""The any-size model derived from the rules (z3_derived): its verdicts, its teeth, its coverage.

`z3_derived.prove_derived` translates the spec's guard and effect formulas over uninterpreted
sorts. It replaced a hand-written any-size model once it reached the same verdicts on every
catalogue variant both covered (the differential test this file held until then). Now its
verdicts are held against the explorer's: never SAFE where the explorer finds a safety
violation, SAFE where the explorer finds none. It catches a planted bug, and it covers the spec:
sampled explorer steps are steps of the derived model from states inside its claims.
"""

from __future__ import annotations

import dataclasses
from functools import cache

import pytest
import z3

from kvhandoff.model_checker import z3_derived
from kvhandoff.model_checker.engines import EngineOptions, run_engine
from kvhandoff.model_checker.explore import build_graph
from kvhandoff.model_checker.logic_z3 import Untranslatable
from kvhandoff.model_checker.prove import _derived_why_not
from kvhandoff.spec.actions import action_name
from kvhandoff.spec.config import Config, parse_set
from kvhandoff.spec.properties import ALWAYS
from kvhandoff.spec.variants import REFERENCE, VARIANTS, Design, get_variant
from tests.explored import RETRY_TINY, edges_by_kind, explored, sample_edges

SAFETY = {p.name for p in ALWAYS}

IN_FRAGMENT = [
    v.name
    for v in VARIANTS
    if _derived_why_not(v, v.scenario(Config())) is None and z3_derived.supports(v.design) is None
]
"""The catalogue variants `prove` proves on the derived model (on their own scenarios: one
prefill rank, the push path with receiver-checked writes)."""
FAST = ("reference", "incident")
NOT_INDUCTIVE = {"retry_reuses_request_id": "prefill_holds_decodes_generation"}
"""Variants with no safety violation whose reachable states break one of the proof's claims
(`kvhandoff check --variant retry_reuses_request_id --invariants`: a retry after decode's
restart adopts the first attempt's grant, 7 steps): the proof rightly does not say SAFE."""
NOT_ANY_SIZE = {"room_keyed_with_binding": "rejected_request_gets_error_not_output"}
"""Variants safe on their scenario with a property that holds there and not for every size
(decode admitting less than prefill: docs/z3.md, "The invariants"): the any-size obligations fail
for that property alone, and `prove` proves it on the configuration (tests/spec/
test_room_invariants.py)."""


@cache
def _derived(name: str) -> tuple[z3_derived.Obligation, ...]:
    return tuple(z3_derived.prove_derived(get_variant(name).design, timeout=30))


def _verdict(obligations: tuple[z3_derived.Obligation, ...] | list[z3_derived.Obligation]) -> str:
    verdicts = {o.verdict for o in obligations}
    assert "unknown" not in verdicts, [o for o in obligations if o.verdict == "unknown"]
    return "safe" if verdicts == {"proved"} else "failed"


def test_the_derived_model_proves_the_reference_for_any_size() -> None:
    obligations = _derived("reference")
    assert _verdict(obligations) == "safe"
    # Every action of the rulebook, every claim: nothing is left out but a client's retry,
    # whose guard never holds without `max_retries` (the proof is for scenarios without them).
    actions = {o.action for o in obligations if o.kind == "consecution"}
    assert actions == set(z3_derived.actions(REFERENCE.design)) - {"router_retry_request"}
    claims = {o.invariant for o in obligations}
    assert {"decode_reads_only_validated_pages", "no_cross_tenant_read"} <= claims
    assert "generations_are_unique" in claims


def _agree(name: str) -> None:
    violated = {r.property for r in explored(name).violated() if r.property in SAFETY}
    obligations = _derived(name)
    if violated:
        # Never SAFE where the spec has a counterexample: some obligation fails. Others may be
        # unknown within the timeout (retry_reuses_request_id has one): not proved either way.
        verdicts = {o.verdict for o in obligations}
        assert "failed" in verdicts, (name, verdicts)
    elif name in NOT_INDUCTIVE:
        # Safe, but not for the reference's reasons: a claim the proof leans on fails on a
        # reachable state, so no SAFE, and that claim's obligation fails.
        failed = {o.invariant for o in obligations if o.verdict == "failed"}
        assert NOT_INDUCTIVE[name] in failed, (name, failed)
    elif name in NOT_ANY_SIZE:
        unproved = {o.invariant for o in obligations if o.verdict != "proved"}
        assert unproved == {NOT_ANY_SIZE[name]}, (name, unproved)
    else:
        assert _verdict(obligations) == "safe", name
    for o in _derived(name):
        if o.verdict == "failed" and o.kind == "consecution":
            assert o.action is not None and o.counterexample is not None
            assert o.counterexample["before"] and o.counterexample["after"]


@pytest.mark.parametrize("name", sorted(NOT_INDUCTIVE))
def test_the_exceptions_break_the_claim_on_a_reachable_state(name: str) -> None:
    """What `NOT_INDUCTIVE` says, checked: the claim fails on a reachable state of the variant
    (one request, one retry), so no proof leaning on it may say SAFE."""
    config = parse_set(get_variant(name).scenario(Config()), RETRY_TINY)
    run = run_engine("explore", get_variant(name), config, EngineOptions(invariants=True))
    assert run.result is not None
    assert NOT_INDUCTIVE[name] in run.result.extra["invariants"]["failing"]


@pytest.mark.parametrize("name", FAST)
def test_derived_verdicts_agree_with_the_explorer(name: str) -> None:
    _agree(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in IN_FRAGMENT if n not in FAST])
def test_derived_verdicts_agree_with_the_explorer_on_the_catalogue(name: str) -> None:
    _agree(name)


def test_a_planted_bug_is_caught_with_its_action_and_counterexample() -> None:
    # The incident's decisive change alone: decode accepts a completion without validating it.
    design: Design = dataclasses.replace(REFERENCE.design, validation="none")
    obligations = z3_derived.prove_derived(design, timeout=30)
    failed = [o for o in obligations if o.verdict == "failed"]
    assert failed and _verdict(obligations) == "failed"
    hit = [o for o in failed if o.action == "decode_receive_completion"]
    assert {o.invariant for o in hit} >= {"validated_pages_hold_own_data"}
    assert all(o.counterexample and o.counterexample["Reqs"] >= 1 for o in hit)


def test_a_weakened_invariant_fails_where_it_is_needed() -> None:
    # Without "generations are unique", a stale write of an older grant can land: some
    # obligation must fail (the planted claim is true, so initiation still holds).
    obligations = z3_derived.prove_derived(
        REFERENCE.design,
        timeout=30,
        weaken={"generations_are_unique": lambda model, view, tag: True},
        names=["decode_receive_write", "decode_reserve_pages"],
    )
    assert any(o.verdict == "failed" for o in obligations)


def test_every_action_of_the_derived_model_can_fire_from_inside_its_claims() -> None:
    # A proof about a model whose actions cannot fire would be vacuous. Dead on the reference,
    # as in the spec: the steps whose guard is false by design (a timeout fence, the pull path)
    # and the drain acks (no fence: nobody owes or sends one, which the claims state).
    model = z3_derived.Model(REFERENCE.design)
    s = z3_derived.base_view("")
    claims = list(z3_derived.claims(model, s, "").values())
    dead = set()
    for name in z3_derived.actions(REFERENCE.design):
        if name == "router_retry_request":
            continue  # not in the proof without retries; with them its claims fail (docs/spec.md)
        guard, s2, constraints = z3_derived.step(model, name, s, "")
        solver = z3.Solver()
        solver.set("timeout", 20_000)
        solver.add(*claims, z3_derived._z(guard), *constraints)
        solver.add(*model.count_axioms([(s, ""), (s2, "'")]))
        answer = solver.check()
        assert answer != z3.unknown, name
        if answer == z3.unsat:
            dead.add(name)
    assert dead == {
        "decode_release_timeout",
        "prefill_lease_expire",
        "network_fail_transfer",
        "prefill_send_abort_ack",
        "decode_receive_abort_ack",
    }


def test_designs_outside_the_fragment_are_refused_by_name() -> None:
    with pytest.raises(Untranslatable, match="pull path"):
        z3_derived.prove_derived(get_variant("reference_pull").design)
    with pytest.raises(Untranslatable, match="one-sided"):
        z3_derived.prove_derived(get_variant("one_sided_fenced").design)


# --- the derived model covers the spec -----------------------------------------------------------


def test_every_kind_of_reference_step_is_a_step_of_the_derived_model() -> None:
    config, by_kind = edges_by_kind("reference")
    sim = z3_derived.Simulator(REFERENCE.design, config)
    edges = sample_edges(by_kind, per_kind=1)
    assert len({action_name(a) for _, a, _ in edges}) >= 20
    assert [d for b, a, af in edges if (d := sim.check_step(b, a, af)) is not None] == []


@pytest.mark.slow
@pytest.mark.parametrize("name", IN_FRAGMENT)
def test_sampled_steps_of_each_variant_are_steps_of_the_derived_model(name: str) -> None:
    config, by_kind = edges_by_kind(name)
    if config.prefill_ranks != 1:
        pytest.skip("the derived any-size model has one prefill rank")
    sim = z3_derived.Simulator(get_variant(name).design, config)
    edges = sample_edges(by_kind, per_kind=3, seed=1)
    # Claims are read at the state before: only the reference keeps every one on every
    # reachable state, so a broken variant's edges are checked without them.
    if name != "reference":
        sim.with_claims = False
    assert [d for b, a, af in edges if (d := sim.check_step(b, a, af)) is not None] == []


def test_the_partition_s_steps_are_steps_of_the_derived_model() -> None:
    # `decode_suspect_prefill_dead` is off in the default scenarios (`max_partitions=0`), so
    # the sampled edges above never hold it: take its edges from a scenario that allows it.
    config = dataclasses.replace(edges_by_kind("reference")[0], max_partitions=1)
    graph, _, _ = build_graph(REFERENCE, config, keep_edges=True)
    assert graph.all_edges is not None
    edges = [
        (graph.states[i], action, graph.states[j])
        for i, out in enumerate(graph.all_edges)
        for j, action in out
        if action_name(action) == "decode_suspect_prefill_dead"
    ]
    assert len(edges) > 10
    sim = z3_derived.Simulator(REFERENCE.design, config)
    assert [d for b, a, af in edges[::5] if (d := sim.check_step(b, a, af)) is not None] == []
    # With its effect missing the step is no step of the model.
    before, action, _ = edges[0]
    assert sim.check_step(before, action, before) is not None


def test_the_simulation_check_has_teeth() -> None:
    config, by_kind = edges_by_kind("reference")
    sim = z3_derived.Simulator(REFERENCE.design, config)
    before, action, after = by_kind["decode_reserve_pages"][0]
    # The step's own effect is missing from "after": no step of the model gives that.
    assert sim.check_step(before, action, before) is not None
    # A step taken from a state the step does not start from: its guard or effect disagree.
    other_before, _, _ = by_kind["decode_answer"][0]
    assert sim.check_step(other_before, action, after) is not None
