"""The explorer runs the rules' formulas, compiled to Python, and they say what the Python rules say.

`spec/compiled.py` turns the guard and effect formulas of `spec/machine.py` into one `enabled`
function per variant (and per configuration: what the scenario fixes folded, loops over requests
unrolled) and one function per action kind; `machine.enabled` and `machine.step`, and so the
explorer, the conformance oracle and the log validator, run those. The Python guards and effects
the explorer ran before stay, as `machine.python_enabled` and `machine.python_step`, until this
differential test has passed on main. It checks, from every reachable state:

* of the small scenario, for every catalogue variant (between them every design option the rules
  read), every file in examples/ (a replaced guard, a replaced effect, an added action with a
  state field, a design option) and the Python-function variants of tests/data;
* of a scenario with a prompt over decode's limit, parallel submission and three requests (the
  unrolled loops and the folded rigid facts of another shape), and of two prefill ranks
  acknowledging a drain;
* of the same scenarios with the configuration not folded (`Rules.enabled` and `Rules.steps`, the
  form the log validator's large scenarios get),

that the compiled `enabled` lists exactly the actions the Python guards list, in the same order
(breadth-first search, and so which shortest counterexample is found, depends on it), and that
each enabled action's compiled effect gives exactly the state the Python effect gives. A planted
change to one formula is caught, and every compiled effect is taken somewhere.
"""

from __future__ import annotations

from collections import Counter

import pytest

from kvhandoff.model_checker.variant_loader import load_variant
from kvhandoff.spec import compiled as compiled_module
from kvhandoff.spec.actions import action_name
from kvhandoff.spec.compiled import Rules, compile_effect
from kvhandoff.spec.config import Config, parse_set
from kvhandoff.spec.machine import (
    RULE_EFFECTS,
    init,
    python_enabled,
    python_step,
    rule_effect,
)
from kvhandoff.spec.variants import VARIANTS, Variant, get_variant
from tests.explored import SMALL
from tests.spec.test_guards_once import WIDE

EXAMPLES = [
    "examples/variant_add_action.py",
    "examples/variant_replace_effect.py",
    "examples/variant_replace_guard.py",
    "examples/variant_skip_digest.py",
    "tests/data/python_variants/override_reject.py",
    "tests/data/python_variants/state_field.py",
]


def _disagreements(
    variant: Variant, sets: list[str], taken: Counter[str], compiled: Rules | None = None
) -> list[str]:
    """Every reachable state, by the Python rules; where the compiled rules say otherwise."""
    config = parse_set(variant.scenario(Config()), sets)
    compiled = compiled or Rules(variant)
    listed = compiled.enabled_for(config)
    effects = compiled.steps_for(config)
    wrong: list[str] = []
    seen = {init(config)}
    frontier = list(seen)
    while frontier:
        following = []
        for state in frontier:
            actions = python_enabled(variant, config, state)
            if listed(config, state) != actions:
                wrong.append(f"{variant.name}: enabled {listed(config, state)} != {actions}")
            for action in actions:
                after = python_step(variant, config, state, action)
                if effects[type(action)](config, state, action) != after:
                    wrong.append(f"{variant.name}: {action!r}")
                taken[action_name(action)] += 1
                if after not in seen:
                    seen.add(after)
                    following.append(after)
        frontier = following
    return wrong[:5]


@pytest.fixture(scope="module")
def taken() -> Counter[str]:
    return Counter()


@pytest.fixture(autouse=True)
def compile_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """An effect is read from its formula for its first calls and compiled after
    (`compiled._WARM`); here it is compiled at its first call, so that what is compared is the
    compiled code."""
    monkeypatch.setattr(compiled_module, "_WARM", 1)


@pytest.mark.parametrize("name", sorted(v.name for v in VARIANTS))
def test_compiled_and_python_rules_agree_on_every_variant(name: str, taken: Counter[str]) -> None:
    assert _disagreements(get_variant(name), SMALL, taken) == []


@pytest.mark.parametrize("path", EXAMPLES)
def test_they_agree_on_every_example_variant(path: str, taken: Counter[str]) -> None:
    assert _disagreements(load_variant(path), SMALL, taken) == []


def test_they_agree_with_three_requests_in_any_order(taken: Counter[str]) -> None:
    assert _disagreements(get_variant("reference"), WIDE, taken) == []


def test_they_agree_with_two_prefill_ranks_acknowledging_a_drain(taken: Counter[str]) -> None:
    before = taken["prefill_send_abort_ack"]
    sets = [*SMALL, "prefill_ranks=2"]
    assert _disagreements(get_variant("one_sided_fenced"), sets, taken) == []
    assert taken["prefill_send_abort_ack"] > before


@pytest.mark.parametrize("name", ["reference", "m8_release_on_timeout", "reference_pull"])
def test_they_agree_without_folding_the_configuration(name: str) -> None:
    """The loop form (no configuration folded), which a scenario too large to unroll gets."""
    variant = get_variant(name)
    compiled = Rules(variant)
    compiled.enabled_for = lambda config: compiled.enabled  # type: ignore[method-assign]
    compiled.steps_for = lambda config: compiled.steps  # type: ignore[method-assign]
    assert (
        _disagreements(variant, WIDE if name == "reference" else SMALL, Counter(), compiled) == []
    )


def test_every_compiled_effect_is_taken_somewhere(taken: Counter[str]) -> None:
    if not taken:
        for v in VARIANTS:
            _disagreements(v, SMALL, taken)
    assert set(RULE_EFFECTS) <= set(taken)


def test_a_planted_change_to_one_formula_is_caught() -> None:
    """decode_admit_request's effect made to reserve at once, compiled: the states differ."""
    from kvhandoff.spec.actions import DecodeAdmitRequest
    from kvhandoff.spec.effects import assign, effect
    from kvhandoff.spec.vocabulary import d

    variant = get_variant("reference")
    planted = Rules(variant)
    planted.steps_for(parse_set(Config(), SMALL))[DecodeAdmitRequest] = compile_effect(
        effect(lambda r: [assign(d(r), "reserved")]), variant.design, "planted", DecodeAdmitRequest
    )
    wrong = _disagreements(variant, SMALL, Counter(), planted)
    assert wrong and all("DecodeAdmitRequest" in w for w in wrong)


def test_a_compiled_effect_is_the_effect_formula_run() -> None:
    """The compiled function and `run_effect` (the formula read update by update) are two
    readings of one formula: from the same state they give the same next state."""
    from kvhandoff.spec.effects import run_effect
    from kvhandoff.spec.variants import arguments

    variant = get_variant("reference")
    config = parse_set(Config(), SMALL)
    compiled = Rules(variant)
    state = init(config)
    checked = 0
    for _ in range(12):  # along one run: submit, admit, reserve, grant, write, ...
        actions = python_enabled(variant, config, state)
        action = actions[0]
        eff = rule_effect(variant.design, action_name(action))
        expected = run_effect(eff, config, state, False, arguments(action, state))
        assert compiled.steps_for(config)[type(action)](config, state, action) == expected
        assert compiled.steps[type(action)](config, state, action) == expected
        state = expected
        checked += 1
    assert checked == 12


def test_effects_read_from_their_formula_then_compiled_agree(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default: each effect's first calls run `run_effect`, later ones the compiled code (a
    replay of a few steps does not pay for compiling); the states are the same either way."""
    monkeypatch.setattr(compiled_module, "_WARM", 64)
    taken: Counter[str] = Counter()
    assert _disagreements(get_variant("reference"), SMALL, taken) == []
    assert max(taken.values()) > 64 > min(taken.values())  # both readings were used
