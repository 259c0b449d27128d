"""A variant can replace the guard or effect of any action, faults and message steps included,
and every engine checks it.

examples/variant_ack_before_drain.py replaces the guard of a step each prefill rank takes for a
drain ack it owes; examples/variant_replace_fault.py replaces what a fault does. Both start from
`one_sided_fenced` (proved safe) and break its fence. These tests pin that the explorer and the Z3
encodings read the same replaced rules (same edges, same shortest run), and that a replacement
that could not mean the same thing to every engine is refused with a message naming the fix.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kvhandoff.model_checker.explore import build_graph, explore
from kvhandoff.model_checker.variant_loader import load_variant
from kvhandoff.model_checker.z3_crosscheck import edge_mismatches
from kvhandoff.model_checker.z3_encoding import Encoding
from kvhandoff.model_checker.z3_engines import bmc, kinduction
from kvhandoff.spec.actions import DecodeWaitingTimeout, PrefillSendAbortAck
from kvhandoff.spec.config import Config, parse_set
from kvhandoff.spec.effects import answer_error, effect, message_effect
from kvhandoff.spec.logic import TRUE, guard, message_guard
from kvhandoff.spec.machine import enabled, step
from kvhandoff.spec.variants import FormulaEffect, FormulaGuard, VariantError, get_variant
from kvhandoff.spec.vocabulary import d, faults_spent
from tests.explored import SMALL

ROOT = Path(__file__).parents[2]
ACK = str(ROOT / "examples/variant_ack_before_drain.py")
FAULT = str(ROOT / "examples/variant_replace_fault.py")
LATE = "no_late_write_lands_in_reallocated_page"
FENCED = get_variant("one_sided_fenced")


def _config(path: str) -> Config:
    return parse_set(load_variant(path).scenario(Config()), SMALL)


@pytest.mark.parametrize(("path", "name"), [(ACK, "prefill_send_abort_ack"), (FAULT, "")])
def test_the_examples_bind_formulas_every_engine_reads(path: str, name: str) -> None:
    variant = load_variant(path)
    assert variant.is_pure_design and variant.untranslated() == []
    enc = Encoding(variant, _config(path))
    if name:
        assert isinstance(variant.guard_overrides[name], FormulaGuard)
        assert enc.guard_formulas[name] is variant.formula_guards()[name].formula
    else:
        hook = variant.step_overrides["decode_waiting_timeout"]
        assert isinstance(hook, FormulaEffect)
        assert enc.effect_formulas["decode_waiting_timeout"] is hook.formula


@pytest.mark.parametrize("path", [ACK, FAULT])
def test_bmc_finds_the_explorer_s_shortest_late_write(path: str) -> None:
    variant, config = load_variant(path), _config(path)
    by_explorer = explore(variant, config).result_for(LATE)
    assert by_explorer.verdict == "violated" and by_explorer.trace is not None
    by_bmc = bmc(variant, config, depth=by_explorer.depth).result_for(LATE)
    assert by_bmc.verdict == "violated" and by_bmc.depth == by_explorer.depth
    # The design they start from keeps the fence: no late write within the same depth.
    assert bmc(FENCED, config, depth=by_explorer.depth).result_for(LATE).verdict != "violated"


def test_the_changed_steps_are_on_the_counterexamples() -> None:
    ack = explore(load_variant(ACK), _config(ACK)).result_for(LATE).trace
    fault = explore(load_variant(FAULT), _config(FAULT)).result_for(LATE).trace
    assert ack is not None and any(isinstance(a, PrefillSendAbortAck) for a in ack)
    assert fault is not None and any(isinstance(a, DecodeWaitingTimeout) for a in fault)


def test_k_induction_refutes_the_fault_example() -> None:
    variant, config = load_variant(FAULT), _config(FAULT)
    assert (
        kinduction(variant, config, depth=1, fallback_depth=8).result_for(LATE).verdict
        == "violated"
    )


@pytest.mark.parametrize("path", [ACK, FAULT])
def test_the_z3_relation_has_exactly_the_explorer_s_edges(path: str) -> None:
    """From reachable states where the replaced step is enabled (and a sample of the rest), the
    encoding's successors are the explorer's."""
    variant, config = load_variant(path), _config(path)
    kinds = (PrefillSendAbortAck, DecodeWaitingTimeout)
    states = build_graph(variant, config)[0].states
    picks = [s for s in states if any(isinstance(a, kinds) for a in enabled(variant, config, s))]
    assert picks
    sample = picks[:: max(1, len(picks) // 12)] + states[:: max(1, len(states) // 8)]
    assert edge_mismatches(variant, config, sample) == []


def test_a_replaced_fault_guard_keeps_the_run_s_fault_budget() -> None:
    # This guard says nothing of the budget: the variant adds the run's total, so the explorer
    # (which checks the total apart) and the Z3 encodings (which read it from the guard) agree.
    anytime = guard(lambda r: d(r) == "reserved")
    variant = replace(
        FENCED, name="timeout_anytime", guard_overrides={"decode_waiting_timeout": anytime}
    )
    bound = variant.formula_guards()["decode_waiting_timeout"].formula
    assert repr(faults_spent()) in repr(bound.formula)
    config = parse_set(Config(), [*SMALL, "max_faults=1"])
    spent = [
        s
        for s in build_graph(variant, config)[0].states
        if s.faults.total >= 1 and any(r.d == "reserved" for r in s.requests)
    ]
    assert spent
    for state in spent[:20]:
        assert not any(isinstance(a, DecodeWaitingTimeout) for a in enabled(variant, config, state))
    assert edge_mismatches(variant, config, spent[:: max(1, len(spent) // 10)]) == []


def test_a_fault_effect_that_spends_no_budget_is_refused_naming_the_counts() -> None:
    free = effect(lambda r: [answer_error(r, "timed out waiting for prefill")])
    with pytest.raises(VariantError, match=r"must spend the fault budget.*timeouts_spent"):
        replace(FENCED, name="free_fault", step_overrides={"decode_waiting_timeout": free})


def test_a_message_guard_must_take_the_rulebook_s_messages() -> None:
    with pytest.raises(VariantError, match="completion messages, which the rulebook"):
        replace(
            FENCED,
            name="grant_from_completions",
            guard_overrides={
                "prefill_receive_grant": message_guard("network", ("completion",), lambda m: TRUE)
            },
        )
    with pytest.raises(VariantError, match="from 'lost'"):
        replace(
            FENCED,
            name="grant_from_lost",
            guard_overrides={
                "prefill_receive_grant": message_guard("lost", ("grant",), lambda m: TRUE)
            },
        )


def test_a_message_step_s_effect_can_be_replaced_and_is_run_as_written() -> None:
    # Prefill drops every grant it receives: requests then end only by decode's timeout.
    ignore = message_effect(lambda m: [])
    variant = replace(
        FENCED, name="grant_ignored", step_overrides={"prefill_receive_grant": ignore}
    )
    config = parse_set(Config(), SMALL)
    states = build_graph(variant, config)[0].states
    taken = 0
    for state in states:
        for action in enabled(variant, config, state):
            if type(action).__name__ == "PrefillReceiveGrant":
                # The message stays in the network (the effect did not consume it) and nothing
                # else changes.
                assert step(variant, config, state, action) == state
                taken += 1
    assert taken > 0
    assert edge_mismatches(variant, config, states[:: max(1, len(states) // 10)]) == []
