"""The explorer runs the rules' formulas compiled to Python, and they say what the formulas say.

`spec/compiled.py` turns the guard and effect formulas of `spec/machine.py` into one `enabled`
function per variant (and per configuration: what the scenario fixes folded, loops over requests
unrolled) and one function per action kind; `machine.enabled` and `machine.step`, and so the
explorer, the conformance oracle and the log validator, run those. This test compares them with
the same formulas read directly:

* each guard formula evaluated on its own (`FormulaGuard`: the formula as one claim, nothing folded,
  nothing unrolled or shared), the actions listed in the rulebook's order (`PROTOCOL_GROUPS`, the
  variant's extra actions, then `FAULT_GROUPS` while the fault budget lasts; within a group,
  request by request, each kind in turn; a kind whose guard a variant replaced after the kinds of
  its group it kept);
* each effect formula read update by update (`spec.effects.run_effect`), or the variant's own
  Python effect;

from every reachable state:

* of the small scenario, for every catalogue variant (between them every design option the rules
  read), every file in examples/ (a replaced guard, a replaced effect, an added action with a
  state field, a design option) and the Python-function variants of tests/data;
* of a scenario with a prompt over decode's limit, parallel submission and three requests (the
  unrolled loops and the folded rigid facts of another shape), and of two prefill ranks
  acknowledging a drain;
* of the same scenarios with the configuration not folded (`Rules.enabled` and `Rules.steps`, the
  form the log validator's large scenarios get),

that the compiled `enabled` lists exactly those actions in the same order (breadth-first search,
and so which shortest counterexample is found, depends on it), that `is_enabled` agrees with it,
and that each enabled action's compiled effect gives exactly the state the formula gives. A
planted change to one formula is caught, and every compiled effect is taken somewhere.

History: until commit 6dda962 the rules were also written as Python functions
(`machine.python_enabled`, `machine.python_step`, the explorer's former path), and this test
compared the compiled formulas with them; it passed on main in CI (stop 23) before they were
retired.
"""

from __future__ import annotations

from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from kvhandoff.model_checker.variant_loader import load_variant
from kvhandoff.spec import compiled as compiled_module
from kvhandoff.spec.actions import FAULT_ACTIONS, PROTOCOL_ACTIONS, action_name, snake_case
from kvhandoff.spec.compiled import Rules, compile_effect
from kvhandoff.spec.config import Config, parse_set
from kvhandoff.spec.effects import run_effect
from kvhandoff.spec.machine import (
    FAULT_GROUPS,
    PROTOCOL_GROUPS,
    RULE_EFFECTS,
    init,
    is_enabled,
    rule_effect,
    rule_guard,
)
from kvhandoff.spec.state import State
from kvhandoff.spec.variants import (
    VARIANTS,
    Design,
    FormulaEffect,
    FormulaGuard,
    Variant,
    arguments,
    get_variant,
)
from tests.explored import RETRY_TINY, SMALL
from tests.spec.test_guards_once import WIDE

EXAMPLES = [
    *sorted(f"examples/{p.name}" for p in (Path(__file__).parents[2] / "examples").glob("*.py")),
    "tests/data/python_variants/override_reject.py",
    "tests/data/python_variants/state_field.py",
]
"""Every file in examples/ (a new one joins by being there) and the Python-function forms."""


def _drain(variant: Variant) -> bool:
    return variant.design.drain_fenced


@cache
def _read_guard(design: Design, kind: type) -> FormulaGuard:
    """The guard formula of `kind`, read on its own (compiled once, as one claim)."""
    name = snake_case(kind.__name__)
    return FormulaGuard(name, kind, rule_guard(design, name), design)


def read_enabled(variant: Variant, config: Config, state: State) -> list[Any]:
    """`enabled` with each guard formula read on its own, in the rulebook's order."""
    design = variant.design

    def group(kinds: tuple[type, ...]) -> list[Any]:
        names = [snake_case(k.__name__) for k in kinds]
        out: list[Any] = []
        for kind, name in zip(kinds, names, strict=True):
            if name not in variant.guard_overrides:
                out += _read_guard(design, kind)(config, state)
        if len(kinds) > 1:
            out.sort(key=lambda a: a.request)  # stable: request by request, each kind in turn
        for name in names:
            hook = variant.guard_overrides.get(name)
            if hook is not None:
                out += list(hook(config, state))
        return out

    out = [a for kinds in PROTOCOL_GROUPS for a in group(kinds)]
    if variant.extra_actions is not None:
        out += variant.extra_actions(config, state)
    for added in variant.added_guards:
        out += added(config, state)
    if state.faults.total < config.max_faults:
        out += [a for kinds in FAULT_GROUPS for a in group(kinds)]
    return out


def read_step(variant: Variant, config: Config, state: State, action: Any) -> State:
    """The state after `action`: its effect formula read update by update (`run_effect`), or the
    variant's own Python effect."""
    name = action_name(action)
    hook = variant.step_overrides.get(name)
    if hook is not None and not isinstance(hook, FormulaEffect):
        after: State = hook(config, state, action)
        return after
    formula = hook.formula if hook is not None else rule_effect(variant.design, name)
    return run_effect(formula, config, state, _drain(variant), arguments(action, state))


def _disagreements(
    variant: Variant, sets: list[str], taken: Counter[str], compiled: Rules | None = None
) -> list[str]:
    """Every reachable state, by the formulas read directly; where the compiled rules say
    otherwise (and where `is_enabled` does)."""
    config = parse_set(variant.scenario(Config()), sets)
    compiled = compiled or Rules(variant)
    listed = compiled.enabled_for(config)
    effects = compiled.steps_for(config, search=True)  # compiled from the first step
    wrong: list[str] = []
    direct: dict[State, list[Any]] = {}  # each state's actions, by the formulas read directly

    def actions_of(state: State) -> list[Any]:
        got = direct.get(state)
        if got is None:
            got = direct[state] = read_enabled(variant, config, state)
        return got

    seen = {init(config)}
    frontier = list(seen)
    while frontier:
        following = []
        for state in frontier:
            actions = actions_of(state)
            if listed(config, state) != actions:
                wrong.append(f"{variant.name}: enabled {listed(config, state)} != {actions}")
            for action in actions:
                after = read_step(variant, config, state, action)
                if effects[type(action)](config, state, action) != after:
                    wrong.append(f"{variant.name}: {action!r}")
                # `is_enabled` says yes to the action, and after it, yes exactly where the action
                # is listed again.
                if not is_enabled(variant, config, state, action):
                    wrong.append(f"{variant.name}: is_enabled says no to {action!r}")
                if is_enabled(variant, config, after, action) != (action in actions_of(after)):
                    wrong.append(f"{variant.name}: is_enabled of {action!r} after it")
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


def test_the_groups_list_every_action_in_the_rulebook_s_order() -> None:
    """Protocol steps first, in `PROTOCOL_ACTIONS`' order, faults last, in `FAULT_ACTIONS`'."""
    assert tuple(k for kinds in PROTOCOL_GROUPS for k in kinds) == PROTOCOL_ACTIONS
    assert tuple(k for kinds in FAULT_GROUPS for k in kinds) == FAULT_ACTIONS


@pytest.mark.parametrize("name", sorted(v.name for v in VARIANTS))
def test_compiled_rules_and_formulas_agree_on_every_variant(name: str, taken: Counter[str]) -> None:
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
    compiled.steps_for = lambda config, search=False: compiled.steps  # type: ignore[method-assign]
    assert (
        _disagreements(variant, WIDE if name == "reference" else SMALL, Counter(), compiled) == []
    )


def test_every_compiled_effect_is_taken_somewhere(taken: Counter[str]) -> None:
    # The tests above fill `taken`; where some did not run (a `-k`, or the slow ones left out of
    # `make test`), the smallest retry scenario first, then everything.
    if not set(RULE_EFFECTS) <= set(taken):
        assert _disagreements(get_variant("retry_reuses_request_id"), RETRY_TINY, taken) == []
    if not set(RULE_EFFECTS) <= set(taken):
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
    planted.steps_for(parse_set(Config(), SMALL), search=True)[DecodeAdmitRequest] = compile_effect(
        effect(lambda r: [assign(d(r), "reserved")]), variant.design, "planted", DecodeAdmitRequest
    )
    wrong = _disagreements(variant, SMALL, Counter(), planted)
    assert wrong and all("DecodeAdmitRequest" in w for w in wrong)


def test_a_planted_change_to_one_guard_is_caught() -> None:
    """The compiled `enabled` with decode's admission listed twice: the lists differ."""
    variant = get_variant("reference")
    planted = Rules(variant)
    config = parse_set(Config(), SMALL)
    honest = planted.enabled_for(config)

    def doubled(C: Config, S: State) -> list[Any]:
        out = honest(C, S)
        return out + [a for a in out if action_name(a) == "decode_admit_request"]

    planted.enabled_for = lambda c: doubled  # type: ignore[method-assign]
    wrong = _disagreements(variant, SMALL, Counter(), planted)
    assert wrong and all("enabled" in w and "DecodeAdmitRequest" in w for w in wrong)


def test_a_compiled_effect_is_the_effect_formula_run() -> None:
    """The compiled function and `run_effect` (the formula read update by update) are two
    readings of one formula: from the same state they give the same next state."""
    variant = get_variant("reference")
    config = parse_set(Config(), SMALL)
    compiled = Rules(variant)
    state = init(config)
    checked = 0
    for _ in range(12):  # along one run: submit, admit, reserve, grant, write, ...
        action = read_enabled(variant, config, state)[0]
        expected = read_step(variant, config, state, action)
        assert compiled.steps_for(config, search=True)[type(action)](config, state, action) == (
            expected
        )
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
