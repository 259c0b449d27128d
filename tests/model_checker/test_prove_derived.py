"""`prove` on the any-size model derived from the rules (`z3_derived`).

The derived model (z3_derived) reads a variant's own formulas (replaced guards and effects, added
actions, state fields), so prove is any-size on the examples whose design is in its fragment;
what it proves must agree with the explorer (a safety property the explorer violates has a
failed obligation: never SAFE). Its witness check replays the spec's own paths to every action
and witness through the same derived model (z3_witnesses: `derived_movement`), and a model that
cannot take a step the spec takes is vacuous: its properties are `unknown`, never "holds".
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvhandoff.model_checker import z3_derived, z3_witnesses
from kvhandoff.model_checker.explore import explore
from kvhandoff.model_checker.prove import _derived_why_not, prove
from kvhandoff.model_checker.result import CheckResult
from kvhandoff.model_checker.variant_loader import load_variant
from kvhandoff.spec.config import Config
from kvhandoff.spec.properties import ALWAYS
from kvhandoff.spec.variants import REFERENCE, VARIANTS, Variant, get_variant
from tests.explored import explored

IN_FRAGMENT_EXAMPLES = ("examples/variant_replace_effect.py", "examples/variant_add_action.py")
ONE_SIDED_EXAMPLES = (
    "examples/variant_replace_guard.py",
    "examples/variant_ack_before_drain.py",
    "examples/variant_replace_fault.py",
)
SAFETY = {p.name for p in ALWAYS}


def _prove(variant: Variant) -> CheckResult:
    return prove(variant, variant.scenario(Config()), timeout=60)


def test_prove_on_the_derived_model_proves_the_reference_for_any_size() -> None:
    result = _prove(REFERENCE)
    assert result.extra["scope"] == "any-size"
    assert "any_size_unavailable" not in result.extra
    assert result.extra["obligations_proved"] == result.extra["obligations_total"]
    assert {r.property: r.verdict for r in result.results if r.property in SAFETY} == dict.fromkeys(
        SAFETY, "holds"
    )
    # The witness check ran on the derived model and found it moves as the spec does.
    movement = result.extra["movement"]
    assert movement["model"] == "derived any-size"
    assert "vacuity" not in result.extra and movement["problems"] == []
    assert all(at is not None for at in movement["witnesses"].values())
    # Off on the reference (by design or by the scenario: nothing is over decode's limit that
    # prefill admits, and no partition is allowed): the spec never takes them, so they are not
    # asked of the model.
    assert set(movement["spec_unreached"]) == {
        "decode_suspect_prefill_dead",
        "decode_reject_request",
        "decode_release_timeout",
        "prefill_lease_expire",
        "network_fail_transfer",
        "prefill_send_abort_ack",
        "decode_receive_abort_ack",
        "router_retry_request",  # max_retries is 0
    }
    taken = {n for n, at in movement["actions"].items() if at is not None}
    assert taken == set(z3_derived.actions(REFERENCE.design)) - set(movement["spec_unreached"])


def test_with_a_partition_allowed_the_witness_replay_takes_it_on_the_derived_model() -> None:
    result = prove(REFERENCE, replace(Config(), max_partitions=1), timeout=60)
    assert result.extra["scope"] == "any-size"
    assert result.extra["obligations_proved"] == result.extra["obligations_total"]
    movement = result.extra["movement"]
    assert movement["problems"] == [] and "vacuity" not in result.extra
    assert "decode_suspect_prefill_dead" not in movement["spec_unreached"]
    assert movement["actions"]["decode_suspect_prefill_dead"] is not None


def _violated_by_explorer(variant: Variant) -> set[str]:
    found = explore(variant, variant.scenario(Config()))
    return {r.property for r in found.violated() if r.property in SAFETY}


@pytest.mark.parametrize("path", IN_FRAGMENT_EXAMPLES)
def test_an_example_in_the_fragment_is_read_and_refuted_for_any_size(path: str) -> None:
    variant = load_variant(path)
    assert _derived_why_not(variant, variant.scenario(Config())) is None
    obligations = z3_derived.prove_derived(variant.design, timeout=60, variant=variant)
    assert "unknown" not in {o.verdict for o in obligations}
    failed = [o for o in obligations if o.verdict == "failed"]
    # The explorer violates what the example says it breaks; the proof must not be SAFE, and
    # the failure is under the step the variant changed or added.
    violated = _violated_by_explorer(variant)
    assert set(variant.breaks) <= violated
    assert failed
    changed = set(variant.formula_effects()) | set(variant.formula_guards())
    assert {o.action for o in failed} & changed


def test_the_variant_s_own_action_and_state_field_are_in_the_derived_model() -> None:
    variant = load_variant("examples/variant_add_action.py")
    assert "decode_preempt_request" in z3_derived.actions(variant.design, variant)
    obligations = z3_derived.prove_derived(
        variant.design, timeout=60, variant=variant, names=["decode_preempt_request"]
    )
    assert {o.action for o in obligations if o.kind == "consecution"} == {"decode_preempt_request"}
    # Without the variant, its action and field are no part of the model.
    assert "decode_preempt_request" not in z3_derived.actions(variant.design)


@pytest.mark.parametrize("path", ONE_SIDED_EXAMPLES)
def test_a_one_sided_example_falls_back_to_the_fixed_configuration_saying_why(path: str) -> None:
    variant = load_variant(path)
    why = _derived_why_not(variant, variant.scenario(Config()))
    assert why is not None and "one-sided" in why


def _break_step(monkeypatch: pytest.MonkeyPatch, action: str, part: str = "guard") -> None:
    """The derived model with one action broken: its guard false (`part="guard"`), or its
    effect dropped (`"effect"`: the next state is the state before)."""
    real = z3_derived.step

    def broken(model: z3_derived.Model, name: str, view: z3_derived.View, tag: str) -> object:
        g, new, constraints = real(model, name, view, tag)
        if name != action:
            return g, new, constraints
        return (False, new, constraints) if part == "guard" else (g, view, constraints)

    monkeypatch.setattr(z3_derived, "step", broken)


def test_the_derived_witness_check_has_teeth(monkeypatch: pytest.MonkeyPatch) -> None:
    # A model whose decode never reserves pages cannot complete a handoff, which the spec does:
    # the replay of the spec's path says so (and prove would then report unknown, never holds).
    _break_step(monkeypatch, "decode_reserve_pages")
    config = REFERENCE.scenario(Config())
    movement = z3_witnesses.derived_movement(REFERENCE, config, timeout=60)
    assert movement.witnesses["can_complete_handoff"] is None
    assert movement.actions["decode_reserve_pages"] is None
    assert any(
        "can_complete_handoff" in p and "decode_reserve_pages" in p for p in movement.problems
    )


def test_a_model_whose_write_never_lands_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # The mutant: the hand-written model with its write landing removed still proved
    # the reference SAFE. Here decode's step that lands a write changes nothing: the spec's next
    # state is not the model's, and every goal past the first landed write is unreached.
    _break_step(monkeypatch, "decode_receive_write", "effect")
    config = REFERENCE.scenario(Config())
    movement = z3_witnesses.derived_movement(REFERENCE, config, timeout=60)
    assert movement.actions["decode_receive_write"] is None
    assert movement.witnesses["can_complete_handoff"] is None
    assert any("decode_receive_write" in p for p in movement.problems)
    result = prove(REFERENCE, config, timeout=60)
    assert result.extra.get("vacuity")
    assert not [r for r in result.results if r.verdict == "holds"]


@pytest.mark.slow
@pytest.mark.parametrize("path", IN_FRAGMENT_EXAMPLES)
def test_prove_on_an_example_in_the_fragment_is_any_size(path: str) -> None:
    variant = load_variant(path)
    result = _prove(variant)
    assert result.extra["scope"] == "any-size"
    verdicts = {r.property: r.verdict for r in result.results}
    for name in variant.breaks:
        assert verdicts[name] != "holds"
    # The properties the variant leaves alone survive the failed obligations (Houdini).
    assert any(verdicts[n] == "holds" for n in SAFETY - set(variant.breaks))


@pytest.mark.slow
@pytest.mark.parametrize("path", ONE_SIDED_EXAMPLES[:1])
def test_prove_on_a_one_sided_example_reports_the_fixed_configuration(path: str) -> None:
    result = _prove(load_variant(path))
    assert result.extra["scope"] == "fixed-config"
    assert "one-sided" in result.extra["any_size_unavailable"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        v.name
        for v in VARIANTS
        if _derived_why_not(v, v.scenario(Config())) is None and not v.config
    ],
)
def test_never_safe_where_the_explorer_finds_a_safety_violation(name: str) -> None:
    variant = get_variant(name)
    violated = {r.property for r in explored(name).violated() if r.property in SAFETY}
    obligations = z3_derived.prove_derived(variant.design, timeout=60, variant=variant)
    if violated:
        assert any(o.verdict != "proved" for o in obligations), name
