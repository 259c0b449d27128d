"""A variant can replace a guard and add state of its own; the explorer checks it, Z3 refuses it.

The two example files are the reviewer's view (examples/variant_replace_guard.py,
tests/data/python_variants/state_field.py); these tests pin what the mechanism does on a small scenario.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from kvhandoff.model_checker.explore import explore
from kvhandoff.model_checker.z3_encoding import CannotEncode, Encoding
from kvhandoff.spec.actions import DecodeReleasePages
from kvhandoff.spec.config import Config, parse_set
from kvhandoff.spec.machine import enabled, init, is_enabled
from kvhandoff.spec.state import State
from kvhandoff.spec.variants import REFERENCE, Variant, VariantError, get_variant
from tests.explored import SMALL

EXAMPLES = Path(__file__).parents[2] / "examples"
PYTHON_VARIANTS = Path(__file__).parents[2] / "tests/data/python_variants"
"""The Python-function forms of two changes: explorer-only, the Z3 engines refuse them."""


def _load(name: str, folder: Path = EXAMPLES) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _small(variant_config: Config) -> Config:
    return parse_set(variant_config, SMALL)


def test_a_replaced_guard_lists_its_kind_in_place_of_the_rulebook_s() -> None:
    never = replace(
        REFERENCE, name="never_release", guard_overrides={"decode_release_pages": lambda c, s: []}
    )
    config = _small(Config())
    result = explore(REFERENCE, config)
    assert result.extra["complete"]
    # Somewhere the reference releases; the variant never does, and nothing else changes there.
    from kvhandoff.model_checker.explore import build_graph

    graph, _, _ = build_graph(REFERENCE, config)
    state = next(
        s
        for s in graph.states
        if any(isinstance(a, DecodeReleasePages) for a in enabled(REFERENCE, config, s))
    )
    ours = enabled(never, config, state)
    theirs = enabled(REFERENCE, config, state)
    assert ours == [a for a in theirs if not isinstance(a, DecodeReleasePages)]
    release = next(a for a in theirs if isinstance(a, DecodeReleasePages))
    assert not is_enabled(never, config, state, release)
    assert is_enabled(REFERENCE, config, state, release)


def test_a_formula_guard_and_the_same_python_guard_enable_the_same_actions() -> None:
    formula = _load("variant_replace_guard").VARIANT
    python = _python_guard_variant()
    config = _small(formula.scenario(Config()))
    from kvhandoff.model_checker.explore import build_graph

    states = build_graph(python, config)[0].states
    assert len(states) == len(build_graph(formula, config)[0].states)
    for state in states[:: max(1, len(states) // 400)]:
        assert enabled(formula, config, state) == enabled(python, config, state)


def test_a_formula_guard_is_read_by_the_z3_encoding_and_bmc_finds_the_same_run() -> None:
    from kvhandoff.model_checker.z3_engines import bmc

    variant = _load("variant_replace_guard").VARIANT
    assert variant.is_pure_design and "decode_release_pages" in variant.formula_guards()
    config = _small(variant.scenario(Config()))
    by_explorer = explore(variant, config).result_for("no_late_write_lands_in_reallocated_page")
    by_bmc = bmc(variant, config, depth=by_explorer.depth).result_for(
        "no_late_write_lands_in_reallocated_page"
    )
    assert by_bmc.verdict == "violated" and by_bmc.depth == by_explorer.depth


def test_a_formula_guard_must_range_over_what_the_rulebook_s_guard_ranges_over() -> None:
    from kvhandoff.spec.logic import guard

    # decode_receive_grant's rulebook guard ranges over messages; a request guard cannot bind it.
    with pytest.raises(VariantError, match=r"message_guard\("):
        replace(
            REFERENCE,
            name="wrong_shape",
            guard_overrides={"prefill_receive_grant": guard(lambda r: d_gen_is_zero())},
        )


def d_gen_is_zero():  # type: ignore[no-untyped-def]
    from kvhandoff.spec.logic import REQ, forall
    from kvhandoff.spec.vocabulary import d_gen

    return forall(REQ, lambda r: d_gen(r) == 0)


def test_the_guard_example_breaks_the_fence_it_removes() -> None:
    variant = _load("variant_replace_guard").VARIANT
    result = explore(variant, _small(variant.scenario(Config())))
    late = result.result_for("no_late_write_lands_in_reallocated_page")
    assert late.verdict == "violated" and late.trace is not None
    assert any(isinstance(a, DecodeReleasePages) for a in late.trace)
    # The design it starts from, with its own guard, is safe on the same scenario.
    base = get_variant("one_sided_fenced")
    assert explore(base, _small(base.scenario(Config()))).verdict == "safe"


def test_a_guard_listing_another_kind_of_action_is_an_error_naming_it() -> None:
    wrong = replace(
        REFERENCE,
        name="wrong_kind",
        guard_overrides={"decode_release_pages": lambda c, s: [DecodeReleasePages(0), "x"]},
    )
    with pytest.raises(TypeError, match=r"guard_overrides\['decode_release_pages'\] listed 'x'"):
        enabled(wrong, Config(), init(Config()))


def test_a_guard_override_of_no_action_is_refused_with_a_suggestion() -> None:
    with pytest.raises(VariantError, match="did you mean 'decode_release_pages'"):
        replace(REFERENCE, name="typo", guard_overrides={"decode_release_page": lambda c, s: []})


def test_variant_state_starts_at_its_initial_value_and_is_stored_only_when_it_differs() -> None:
    variant = replace(REFERENCE, name="counting", state_fields={"retries": 0})
    s0 = init(Config())
    assert variant.get(s0, "retries") == 0
    s1 = variant.put(s0, "retries", 2)
    assert variant.get(s1, "retries") == 2 and s1.variant_fields == (("retries", 2),)
    s2 = variant.put(s1, "retries", 0)
    # Back at the initial value: equal (and hashing equal) to the state that never changed it.
    assert s2 == s0 and hash(s2) == hash(s0)
    with pytest.raises(VariantError, match=r"no state field 'retry'.*did you mean 'retries'"):
        variant.get(s0, "retry")


def test_unhashable_initial_state_is_refused() -> None:
    with pytest.raises(VariantError, match="not hashable"):
        replace(REFERENCE, name="listy", state_fields={"queue": []})


def test_the_state_field_example_is_checked_by_the_explorer() -> None:
    variant = _load("state_field", PYTHON_VARIANTS).VARIANT
    result = explore(variant, _small(Config()))
    freed = result.result_for("freed_pages_hold_no_readable_data")
    assert freed.verdict == "violated" and freed.trace is not None
    assert any(type(a).__name__ == "DecodePreemptRequest" for a in freed.trace)
    # The field bounds the new action: no reachable state preempted twice.
    from kvhandoff.model_checker.explore import build_graph

    graph, _, _ = build_graph(variant, _small(Config()))
    counts = {variant.get(s, "preemptions") for s in graph.states}
    assert counts == {0, 1}


def _python_guard_variant() -> Variant:
    def release_without_waiting(config: Config, state: State) -> list[DecodeReleasePages]:
        return [
            DecodeReleasePages(r)
            for r, req in enumerate(state.requests)
            if req.d in ("answered", "failed") and req.d_pages
        ]

    return get_variant("one_sided_fenced").derive(
        "python_guard",
        "the guard example, as a Python function",
        guard_overrides={"decode_release_pages": release_without_waiting},
    )


@pytest.mark.parametrize("name", ["python_guard", "state_field"])
def test_z3_refuses_python_code_and_names_it(name: str) -> None:
    variant = (
        _python_guard_variant() if name == "python_guard" else _load(name, PYTHON_VARIANTS).VARIANT
    )
    with pytest.raises(CannotEncode) as caught:
        Encoding(variant, variant.scenario(Config()))
    for construct in variant.untranslated():
        assert construct in str(caught.value)
    assert not variant.is_pure_design


def test_rulebook_states_carry_no_variant_state() -> None:
    state: State = init(Config())
    assert state.variant_fields == ()
