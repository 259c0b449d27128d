"""The effects are written once, as formulas, and read the same way by each reading of them.

`spec/machine.py` states the effect of every protocol step and fault as updates over the
vocabulary (`rule_effect(design, name)`); the Z3 encoding translates those updates
(tests/model_checker/test_effects_once.py), and the explorer runs them compiled to Python
(`spec/compiled.py`). These tests pin the formula read update by update (`run_effect`) to its
compiled function in the loop form (`Rules.steps`: no configuration folded, the form the log
validator's large scenarios get; the folded, per-request form is pinned by
tests/spec/test_compiled_rules.py): from every reachable state of the small scenario, for every
catalogue variant (between them every value of the design options the effects read), and of a
scenario with a prompt over decode's limit and parallel submission, each enabled step's compiled
effect gives exactly the state `run_effect` gives, and every formula is taken somewhere. A planted
change to one formula is caught.

Until commit 6dda962 the second reading was the rules' Python effects (retired: see
docs/one-semantics.md).
"""

from __future__ import annotations

from collections import Counter

import pytest

from kvhandoff.model_checker.explore import build_graph
from kvhandoff.spec import compiled as compiled_module
from kvhandoff.spec.actions import action_name
from kvhandoff.spec.compiled import Rules
from kvhandoff.spec.config import Config, parse_set
from kvhandoff.spec.effects import EffectFormula, run_effect
from kvhandoff.spec.machine import RULE_EFFECTS, RULE_GUARDS, enabled, rule_effect
from kvhandoff.spec.variants import VARIANTS, arguments, get_variant
from kvhandoff.spec.vocabulary import d
from tests.explored import RETRY_TINY, SMALL
from tests.spec.test_guards_once import WIDE


def _drain(name: str) -> bool:
    return get_variant(name).design.drain_fenced


def _agree(
    variant_name: str, sets: list[str], taken: Counter[str], effects: dict[str, EffectFormula]
) -> list[str]:
    """Formula and compiled effect from every reachable state; the disagreements, described."""
    variant = get_variant(variant_name)
    config = parse_set(variant.scenario(Config()), sets)
    drain = _drain(variant_name)
    compiled = Rules(variant).steps  # the loop form: nothing folded
    wrong: list[str] = []
    for state in build_graph(variant, config)[0].states:
        for action in enabled(variant, config, state):
            name = action_name(action)
            eff = effects.get(name)
            if eff is None or name in variant.step_overrides:  # the variant's own effect
                continue
            args = arguments(action, state)
            if run_effect(eff, config, state, drain, args) != compiled[type(action)](
                config, state, action
            ):
                wrong.append(f"{variant_name}: {action!r}")
            taken[name] += 1
    return wrong


@pytest.fixture(scope="module")
def taken() -> Counter[str]:
    return Counter()


@pytest.fixture(autouse=True)
def compile_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """An effect is read from its formula for its first calls and compiled after
    (`compiled._WARM`); here it is compiled at its first call, so that what is compared is the
    compiled code."""
    monkeypatch.setattr(compiled_module, "_WARM", 1)


def _effects(name: str) -> dict[str, EffectFormula]:
    design = get_variant(name).design
    return {n: rule_effect(design, n) for n in RULE_EFFECTS}


def test_the_effects_are_those_of_the_steps_whose_guards_are_formulas() -> None:
    assert set(RULE_EFFECTS) == set(RULE_GUARDS)


@pytest.mark.parametrize("name", sorted(v.name for v in VARIANTS))
def test_formula_and_compiled_effect_give_the_same_state(name: str, taken: Counter[str]) -> None:
    assert _agree(name, SMALL, taken, _effects(name)) == []


def test_they_agree_with_a_prompt_over_decode_s_limit_and_parallel_submission(
    taken: Counter[str],
) -> None:
    assert _agree("reference", WIDE, taken, _effects("reference")) == []


def test_they_agree_with_two_prefill_ranks_acknowledging_a_drain(taken: Counter[str]) -> None:
    """Each rank sends its own drain ack; only the last clears what prefill owes."""
    sets = [*SMALL, "prefill_ranks=2"]
    before = taken["prefill_send_abort_ack"]
    assert _agree("one_sided_fenced", sets, taken, _effects("one_sided_fenced")) == []
    assert taken["prefill_send_abort_ack"] > before


def test_every_formula_is_taken_somewhere(taken: Counter[str]) -> None:
    # The tests above fill `taken`; where some did not run (a `-k`, or the slow ones left out of
    # `make test`), the smallest retry scenario first, then everything.
    if set(taken) != set(RULE_EFFECTS):
        name = "retry_reuses_request_id"
        assert _agree(name, RETRY_TINY, taken, _effects(name)) == []
    if set(taken) != set(RULE_EFFECTS):
        for v in VARIANTS:
            _agree(v.name, SMALL, taken, _effects(v.name))
        _agree("reference", WIDE, taken, _effects("reference"))
    assert set(taken) == set(RULE_EFFECTS)


def test_a_planted_change_to_one_formula_is_caught() -> None:
    """decode_admit_request's effect made to reserve at once: the states differ."""
    from kvhandoff.spec.effects import assign, effect

    planted = _effects("reference")
    planted["decode_admit_request"] = effect(lambda r: [assign(d(r), "reserved")])
    wrong = _agree("reference", SMALL, Counter(), planted)
    assert wrong and all("DecodeAdmitRequest" in w for w in wrong)
