"""A variant can replace an effect with a formula, and every fixed-config engine checks it.

examples/variant_replace_effect.py is the reviewer's view (prefill's rejection kept as a
placeholder, written as an effect formula); tests/data/python_variants/override_reject.py is the same change
as a Python function, which only the explorer can run. These tests pin what the mechanism does.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kvhandoff.model_checker.explore import build_graph, explore
from kvhandoff.model_checker.variant_loader import load_variant
from kvhandoff.model_checker.z3_encoding import Encoding
from kvhandoff.model_checker.z3_engines import bmc
from kvhandoff.spec.config import Config, parse_set
from kvhandoff.spec.effects import assign, effect
from kvhandoff.spec.machine import enabled, step
from kvhandoff.spec.variants import REFERENCE, FormulaEffect, VariantError
from kvhandoff.spec.vocabulary import d_gen
from tests.explored import SMALL
from tests.sequential import SEQUENTIAL

ROOT = Path(__file__).parents[2]
FORMULA = str(ROOT / "examples/variant_replace_effect.py")
PYTHON = str(ROOT / "tests/data/python_variants/override_reject.py")


def test_the_formula_effect_and_the_python_effect_give_the_same_graph() -> None:
    formula, python = load_variant(FORMULA), load_variant(PYTHON)
    assert isinstance(formula.step_overrides["prefill_reject_request"], FormulaEffect)
    config = parse_set(Config(), SMALL)
    states = build_graph(python, config)[0].states
    assert len(states) == len(build_graph(formula, config)[0].states)
    for state in states:
        for action in enabled(python, config, state):
            assert step(formula, config, state, action) == step(python, config, state, action)


def test_bmc_reads_the_formula_effect_and_finds_the_explorer_s_counterexample() -> None:
    variant = load_variant(FORMULA)
    assert variant.is_pure_design and "prefill_reject_request" in variant.formula_effects()
    config = parse_set(Config(), SMALL)
    name = "rejected_request_gets_error_not_output"
    by_explorer = explore(variant, config).result_for(name)
    assert by_explorer.verdict == "violated"
    by_bmc = bmc(variant, config, depth=by_explorer.depth).result_for(name)
    assert by_bmc.verdict == "violated" and by_bmc.depth == by_explorer.depth
    # The rulebook's effect, on the same scenario, is safe for that property.
    assert bmc(REFERENCE, config, depth=by_explorer.depth).result_for(name).verdict != "violated"


def test_the_encoding_takes_the_variant_s_effect_in_place_of_the_rulebook_s() -> None:
    variant = load_variant(FORMULA)
    enc = Encoding(variant, parse_set(Config(), SMALL))
    assert (
        enc.effect_formulas["prefill_reject_request"]
        is variant.formula_effects()["prefill_reject_request"].formula
    )
    rulebook = Encoding(REFERENCE, parse_set(Config(), SMALL))
    assert (
        rulebook.effect_formulas["prefill_reject_request"]
        is not enc.effect_formulas["prefill_reject_request"]
    )


def test_a_formula_effect_must_take_what_the_rulebook_s_effect_takes() -> None:
    from kvhandoff.spec.effects import message_effect

    with pytest.raises(VariantError, match=r"effect\(lambda r: \[\.\.\.\]\)"):
        replace(
            REFERENCE,
            name="wrong_shape",
            step_overrides={"decode_admit_request": message_effect(lambda m: [])},
        )
    with pytest.raises(VariantError, match="no action of the rulebook"):
        replace(
            REFERENCE,
            name="typo",
            step_overrides={"decode_admit_reqest": effect(lambda r: [assign(d_gen(r), 0)])},
        )


def test_assigning_a_symbol_that_is_not_state_is_an_error_naming_it() -> None:
    from kvhandoff.spec.vocabulary import answered_ok

    with pytest.raises(ValueError, match="answered_ok"):
        effect(lambda r: [assign(answered_ok(r), True)])


@pytest.mark.parametrize(
    ("example", "prop", "engine"),
    [
        # bmc on both files runs in-process above; the command line once by default, the rest
        # in the slow run (each is a fresh interpreter: 3-9 s).
        ("variant_add_action", "freed_pages_hold_no_readable_data", "kind"),
        pytest.param(
            "variant_add_action",
            "freed_pages_hold_no_readable_data",
            "bmc",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "variant_replace_effect",
            "rejected_request_gets_error_not_output",
            "kind",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "variant_replace_effect",
            "rejected_request_gets_error_not_output",
            "bmc",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_the_cli_checks_the_formula_examples_with_the_z3_engines(
    engine: str, example: str, prop: str
) -> None:
    path = str(ROOT / "examples" / f"{example}.py")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvhandoff.cli",
            "check",
            *SEQUENTIAL,
            "--variant",
            path,
            "--engine",
            engine,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"VIOLATED  {prop}  (counterexample: 8 steps)" in out.stdout


# --- an added action and a state field, as formulas ------------------------------------------

ADDED = str(ROOT / "examples/variant_add_action.py")
ADDED_PYTHON = str(ROOT / "tests/data/python_variants/state_field.py")


def test_the_formula_added_action_and_the_python_one_give_the_same_graph() -> None:
    formula, python = load_variant(ADDED), load_variant(ADDED_PYTHON)
    config = formula.scenario(parse_set(Config(), SMALL))
    states = build_graph(python, config)[0].states
    assert len(states) == len(build_graph(formula, config)[0].states)
    preempted = 0
    for state in states:
        # Each example file declares its own DecodePreemptRequest class: compare by name and
        # arguments, and step each variant with its own action.
        ours, theirs = enabled(formula, config, state), enabled(python, config, state)
        assert [repr(a) for a in ours] == [repr(a) for a in theirs]
        for mine, other in zip(ours, theirs, strict=True):
            assert step(formula, config, state, mine) == step(python, config, state, other)
            preempted += type(mine).__name__ == "DecodePreemptRequest"
    assert preempted > 0


def test_the_z3_encoding_keeps_the_state_field_and_the_added_action() -> None:
    variant = load_variant(ADDED)
    assert variant.untranslated() == []
    enc = Encoding(variant, variant.scenario(parse_set(Config(), SMALL)))
    assert ("v.preemptions", "I") in enc.fields
    added = [i for i in enc.instances if i.name == "decode_preempt_request"]
    assert [i.args for i in added] == [(0,), (1,)]
    # After the protocol's own steps and before the faults, where the explorer lists them.
    first_fault = next(n for n, i in enumerate(enc.instances) if i.fault)
    assert all(enc.instances.index(i) < first_fault for i in added)


def test_the_z3_relation_has_exactly_the_explorer_s_edges_for_the_added_action() -> None:
    """Edge crosscheck (as tests/model_checker/test_z3_crosscheck.py does for the rulebook):
    from sampled reachable states, the encoding's successors are the explorer's, preemptions
    included, and the solver accepts no pair that is not an edge."""
    from kvhandoff.model_checker.z3_crosscheck import accepted_non_edges, edge_mismatches

    variant = load_variant(ADDED)
    config = variant.scenario(parse_set(Config(), SMALL))
    states = build_graph(variant, config)[0].states
    picks = [
        s
        for s in states
        if any(type(a).__name__ == "DecodePreemptRequest" for a in enabled(variant, config, s))
    ]
    sample = picks[:: max(1, len(picks) // 15)] + states[:: max(1, len(states) // 10)]
    assert edge_mismatches(variant, config, sample) == []
    assert accepted_non_edges(variant, config, states, samples=3) == []


def test_bmc_finds_the_explorer_s_run_through_the_added_action() -> None:
    variant = load_variant(ADDED)
    config = variant.scenario(parse_set(Config(), SMALL))
    name = "freed_pages_hold_no_readable_data"
    by_explorer = explore(variant, config).result_for(name)
    assert by_explorer.verdict == "violated" and by_explorer.trace is not None
    by_bmc = bmc(variant, config, depth=by_explorer.depth).result_for(name)
    assert by_bmc.verdict == "violated" and by_bmc.depth == by_explorer.depth
    assert by_bmc.trace is not None
    assert type(by_bmc.trace[-1]).__name__ == "DecodePreemptRequest"


def test_an_added_action_needs_a_guard() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class DecodeNap:
        request: int

    with pytest.raises(VariantError, match="added action 'decode_nap' has no guard"):
        REFERENCE.derive(
            "nap",
            "decode naps",
            extra_action_types=(DecodeNap,),
            step_overrides={"decode_nap": effect(lambda r: [])},
        )


def test_a_state_field_a_z3_encoding_cannot_keep_is_named() -> None:
    variant = REFERENCE.derive("negative", "a field below zero", state_fields={"debt": -1})
    assert variant.untranslated() == [
        "state field 'debt' (starts as -1: the Z3 encodings keep bools and non-negative ints)"
    ]
    from kvhandoff.spec.logic import state_field

    with pytest.raises(TypeError, match="non-negative int"):
        state_field("debt", -1)
