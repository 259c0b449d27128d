"""The guards are written once, as formulas, and read the same way by each reading of them.

`spec/machine.py` states the guard of every protocol step and fault as a formula over the
vocabulary (`rule_guard(design, name)`); the Z3 encoding translates those formulas
(tests/model_checker/test_guards_once.py) and the explorer runs them compiled into one `enabled`
function per variant (`spec/compiled.py`). These tests pin, on concrete states, each formula read
on its own (`FormulaGuard`: the formula as one claim) to the compiled `enabled` in its loop form
(`Rules.enabled`: no configuration folded, the form a scenario too large to unroll gets; the
folded form is pinned by tests/spec/test_compiled_rules.py):

* the formulas cover exactly the protocol steps and faults whose action takes one request or
  nothing, and the steps of `MESSAGE_STEPS` (a message or a write);
* on every reachable state of the small scenario, for variants that between them take every value
  of the design options these guards (or the states they see) depend on, and for a scenario with
  a prompt over decode's limit, parallel submission and two prefill ranks, the actions for which
  each formula holds are exactly the actions of its kind the compiled `enabled` lists;
* each formula is true somewhere and false somewhere (a guard that never fires, or always does,
  would agree with a broken reading too easily).

Until commit 6dda962 the second reading was the rules' Python guards (retired: see
docs/one-semantics.md).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest

from kvhandoff.model_checker.explore import build_graph
from kvhandoff.spec.actions import ACTIONS_BY_NAME, FAULT_ACTIONS
from kvhandoff.spec.compiled import Rules
from kvhandoff.spec.config import Config, parse_set
from kvhandoff.spec.machine import PROTOCOL_GROUPS, RULE_GUARDS, rule_guard
from kvhandoff.spec.variants import FormulaGuard, get_variant
from tests.explored import RETRY_TINY, SMALL

# Variants and the design options they bring to the guards (or to the states the guards see):
VARIANTS = [
    "reference",
    "incident",  # placeholder (prefill's p_len shrinks), local completion, no validation
    "m6_asymmetric_truncation",  # truncate
    "m7_release_before_drain",  # one-sided, no fence
    "one_sided_fenced",  # one-sided, drain-ack fence: release waits for the ack
    "m8_release_on_timeout",  # ack_or_timeout: the release timeout step exists
    "reference_pull",  # pull path
    "m14_silent_receive_failure_pull",
    "m10_stale_status_adopted",  # matching by room alone
    "first_rank_completion_accepted",  # two prefill ranks (its catalogue config)
    "release_on_suspected_death",  # a partition: decode takes a live prefill for dead
]
WIDE = [
    "requests=a:1:1,b:3:2,c:1:1",
    "decode_pages=2",
    "prefill_max_prompt=1",
    "decode_max_prompt=2",
    "context_window=3",
    "max_active=2",
    "submit_in_order=false",
    "max_faults=0",
]
"""A prompt decode rejects, two of three requests in progress at once, submitted in any order
(no faults: the small scenario has them; with them this one is many times larger)."""
FAILED_WRITE = [*SMALL, "max_write_errors=1"]
"""The small scenario with a page write that may fail on prefill's side (off by default)."""

Seen = dict[str, set[bool]]


def _one_request_or_none(kind: type) -> bool:
    """One request, nothing, or instances (a restart, a health check, a partition: an instance
    of 0 when there is one of each, so nothing)."""
    names = [f.name for f in dataclasses.fields(kind)]
    return names in (["request"], []) or (bool(names) and set(names) <= {"pinst", "dinst"})


MESSAGE_STEPS = {
    "prefill_receive_grant",
    "decode_receive_failure",
    "retransmit_message",
    "network_drop_message",
    "network_duplicate_message",
    "decode_receive_write",
    "prefill_receive_abort",
    "decode_receive_completion",
    "prefill_send_completion",
    "decode_receive_abort_ack",
    "network_fail_transfer",
    "prefill_send_abort_ack",
}
"""The steps that take a message, a write, or a request and a rank (`message_guard`,
`write_guard`, `rank_guard`; a drain ack is named by the request that owes it and the rank)."""


def test_the_formulas_cover_the_steps_of_one_request_or_none() -> None:
    """Every protocol step and fault whose action takes one request or nothing, and the steps of
    `MESSAGE_STEPS`."""
    protocol = {k for kinds in PROTOCOL_GROUPS for k in kinds}
    expected = {
        name
        for name, kind in ACTIONS_BY_NAME.items()
        if (kind in protocol or kind in FAULT_ACTIONS) and _one_request_or_none(kind)
    }
    assert set(RULE_GUARDS) == expected | MESSAGE_STEPS


def _agree(variant_name: str, sets: list[str], seen: Seen) -> int:
    """Formula and compiled `enabled` on every reachable state; records where each formula
    held."""
    variant = get_variant(variant_name)
    config = parse_set(variant.scenario(Config()), sets)
    design = variant.design
    formulas = {
        name: FormulaGuard(name, ACTIONS_BY_NAME[name], rule_guard(design, name), design)
        for name in RULE_GUARDS
    }
    compiled = Rules(variant).enabled  # the loop form: nothing folded
    states = build_graph(variant, config)[0].states
    for state in states:
        enabled = compiled(config, state)
        for name, formula in formulas.items():
            kind = formula.kind
            listed = [a for a in enabled if type(a) is kind]
            held = formula(config, state)
            assert held == listed, (variant_name, name, state)
            if formula.formula.source:  # a step that takes a message or write: one per item
                source = formula.formula.source
                pool = {"network": state.network, "lost": state.lost, "writes": state.writes}
                kinds = formula.formula.kinds
                n = len({m for m in pool[source] if not kinds or m.kind in kinds})
                seen[name].update({True} if held else set())
                seen[name].update({False} if len(held) < n or n == 0 else set())
            elif formula.formula.params:
                n = len(state.requests) * (
                    config.prefill_ranks if len(formula.formula.params) == 2 else 1
                )
                seen[name].update({True} if held else set())
                seen[name].update({False} if len(held) < n else set())
            else:
                seen[name].add(bool(held))
    return len(states)


@pytest.fixture(scope="module")
def seen() -> Seen:
    return defaultdict(set)


@pytest.mark.parametrize("name", VARIANTS)
def test_formula_and_compiled_enabled_list_the_same_actions(name: str, seen: Seen) -> None:
    assert _agree(name, SMALL, seen) > 500


def test_they_agree_with_a_prompt_over_decode_s_limit_and_parallel_submission(
    seen: Seen,
) -> None:
    assert _agree("reference", WIDE, seen) > 500


def test_they_agree_with_two_prefill_ranks_acknowledging_a_drain(seen: Seen) -> None:
    assert _agree("one_sided_fenced", [*SMALL, "prefill_ranks=2"], seen) > 500


def test_they_agree_with_a_failed_write(seen: Seen) -> None:
    # The notice that overtakes the writes, on the design that answers it with an abort and
    # waits for the drain ack (the others keep the branch the tests above compare).
    assert _agree("one_sided_fenced", FAILED_WRITE, seen) > 500


def test_they_agree_with_a_client_retry(seen: Seen) -> None:
    # With and without the attempt fence: the stale first-attempt messages the retry meets.
    assert _agree("reference", [*SMALL, "max_retries=1"], seen) == 30_334
    assert _agree("retry_reuses_request_id", [*SMALL, "max_retries=1"], seen) == 40_078


def test_each_formula_is_enabled_somewhere_and_disabled_somewhere(seen: Seen) -> None:
    # The tests above fill `seen`; where some did not run (a `-k`, or the slow ones left out of
    # `make test`), the smallest retry scenario first, then everything.
    wanted = {name: {True, False} for name in RULE_GUARDS}
    if {name: seen[name] for name in RULE_GUARDS} != wanted:
        _agree("retry_reuses_request_id", RETRY_TINY, seen)
    if {name: seen[name] for name in RULE_GUARDS} != wanted:
        for name in VARIANTS:
            _agree(name, SMALL, seen)
        _agree("reference", WIDE, seen)
        _agree("one_sided_fenced", FAILED_WRITE, seen)
    assert {name: seen[name] for name in RULE_GUARDS} == {
        name: {True, False} for name in RULE_GUARDS
    }


def test_a_design_without_the_step_has_a_guard_that_never_holds() -> None:
    from kvhandoff.spec.logic import FALSE

    reference = get_variant("reference").design
    assert rule_guard(reference, "decode_release_timeout").formula is FALSE
    timeout = get_variant("m8_release_on_timeout").design
    assert rule_guard(timeout, "decode_release_timeout").formula is not FALSE
