"""A variant can replace an effect with a formula, and every fixed-config engine checks it.

examples/variant_replace_effect.py is the reviewer's view (prefill's rejection kept as a
placeholder, written as an effect formula); examples/variant_override_reject.py is the same change
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

ROOT = Path(__file__).parents[2]
FORMULA = str(ROOT / "examples/variant_replace_effect.py")
PYTHON = str(ROOT / "examples/variant_override_reject.py")


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


def test_the_encoding_takes_the_variant_s_effect_even_on_the_legacy_path() -> None:
    variant = load_variant(FORMULA)
    for legacy in (False, True):
        enc = Encoding(variant, parse_set(Config(), SMALL), legacy_effects=legacy)
        assert (
            enc.effect_formulas["prefill_reject_request"]
            is variant.formula_effects()["prefill_reject_request"].formula
        )


def test_a_formula_effect_only_replaces_effects_of_one_request_protocol_steps() -> None:
    with pytest.raises(VariantError, match="formula effect can replace only"):
        replace(
            REFERENCE,
            name="fault_effect",
            step_overrides={"decode_restart": effect(lambda: [])},
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


@pytest.mark.parametrize("engine", ["bmc", "kind"])
def test_the_cli_checks_the_effect_example_with_the_z3_engines(engine: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvhandoff.cli", "check", "--variant", FORMULA, "--engine", engine],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "VIOLATED  rejected_request_gets_error_not_output  (counterexample: 8 steps)" in (
        out.stdout
    )
