"""`prove` on the any-size model derived from the rules (`--any-size-model derived`).

The derived model (z3_derived) reads a variant's own formulas (replaced guards and effects, added
actions, state fields), so prove is any-size on the examples whose design is in its fragment;
what it proves must agree with the explorer (a safety property the explorer violates has a
failed obligation: never SAFE). Its witness check unrolls the same derived model (z3_witnesses:
`derived_movement`), and a model that cannot reach what the spec reaches is vacuous: its
properties are `unknown`, never "holds".
"""

from __future__ import annotations

import pytest

from kvhandoff.cli.main import main
from kvhandoff.model_checker import z3_derived, z3_witnesses
from kvhandoff.model_checker.explore import explore
from kvhandoff.model_checker.prove import _derived_why_not, prove
from kvhandoff.model_checker.result import CheckResult
from kvhandoff.model_checker.variant_loader import load_variant
from kvhandoff.model_checker.z3_prove import supports
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
    return prove(variant, variant.scenario(Config()), timeout=60, model="derived")


def test_prove_on_the_derived_model_proves_the_reference_for_any_size() -> None:
    result = _prove(REFERENCE)
    assert result.extra["scope"] == "any-size"
    assert result.extra["any_size_model"] == "derived"
    assert "any_size_unavailable" not in result.extra
    assert result.extra["obligations_proved"] == result.extra["obligations_total"]
    assert {r.property: r.verdict for r in result.results if r.property in SAFETY} == dict.fromkeys(
        SAFETY, "holds"
    )
    # The witness check ran on the derived model and found it can move.
    movement = result.extra["movement"]
    assert movement["model"] == "derived any-size"
    assert "vacuity" not in result.extra and movement["problems"] == []
    assert all(at is not None for at in movement["witnesses"].values())
    # Off by design on the reference, dead under the proved claims, so not asked for.
    assert set(movement["not_checked"]) == {
        "decode_release_timeout",
        "prefill_lease_expire",
        "network_fail_transfer",
        "prefill_send_abort_ack",
        "decode_receive_abort_ack",
    }
    assert all(at is not None for at in movement["actions"].values())


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


def test_the_derived_witness_check_has_teeth(monkeypatch: pytest.MonkeyPatch) -> None:
    # A model whose decode never reserves pages cannot complete a handoff, which the spec does:
    # the check says so (and prove would then report unknown, never holds).
    real = z3_derived.step

    def broken(model: z3_derived.Model, name: str, view: z3_derived.View, tag: str) -> object:
        guard, new, constraints = real(model, name, view, tag)
        return (False if name == "decode_reserve_pages" else guard), new, constraints

    monkeypatch.setattr(z3_derived, "step", broken)
    universe, depth, _goals = z3_witnesses._derived_passes()[0]
    names = z3_derived.actions(REFERENCE.design)
    goals = ["can_complete_handoff", "decode_generate"]
    found, unknown, _ = z3_witnesses._derived_unroll(REFERENCE, universe, depth, goals, 60, names)
    assert unknown is None and found == {}


@pytest.mark.slow
def test_a_vacuous_derived_model_is_a_finding(monkeypatch: pytest.MonkeyPatch) -> None:
    real = z3_derived.step

    def broken(model: z3_derived.Model, name: str, view: z3_derived.View, tag: str) -> object:
        guard, new, constraints = real(model, name, view, tag)
        return (False if name == "decode_reserve_pages" else guard), new, constraints

    monkeypatch.setattr(z3_derived, "step", broken)
    config = REFERENCE.scenario(Config())
    movement = z3_witnesses.derived_movement(REFERENCE, config, timeout=60)
    assert movement.witnesses["can_complete_handoff"] is None
    assert any("can_complete_handoff" in p for p in movement.problems)


def test_the_cli_takes_the_any_size_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--engine", "explore", "--any-size-model", "hand"]) == 2
    assert "--any-size-model applies to --engine prove" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    assert "--any-size-model" in capsys.readouterr().out


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
    "name", [v.name for v in VARIANTS if supports(v.design) is None and not v.config]
)
def test_never_safe_where_the_explorer_finds_a_safety_violation(name: str) -> None:
    variant = get_variant(name)
    violated = {r.property for r in explored(name).violated() if r.property in SAFETY}
    obligations = z3_derived.prove_derived(variant.design, timeout=60, variant=variant)
    if violated:
        assert any(o.verdict != "proved" for o in obligations), name
