"""The invariants are written once (spec/invariants.py) and every engine reads those objects.

Differential tests against the hand-written copies they replace: the Python functions
(spec/invariants_py.py), the fixed-configuration Z3 twins (z3_invariants.legacy_fixed_invariants)
and the any-size ones (z3_prove.legacy_invariants). The derived formulas must say at least what
each old copy said (checked by Z3 for every state of the encoding, not only reachable ones), agree
with the old Python functions on reachable states, and still prove the reference.
"""

from __future__ import annotations

import pytest
import z3

from kvhandoff.model_checker import z3_prove
from kvhandoff.model_checker.explore import build_graph, explore
from kvhandoff.model_checker.logic_z3 import AnySizeReading, FixedReading, Untranslatable, translate
from kvhandoff.model_checker.z3_encoding import Encoding
from kvhandoff.model_checker.z3_invariants import fixed_invariants, legacy_fixed_invariants
from kvhandoff.spec import invariants_py
from kvhandoff.spec.config import Config
from kvhandoff.spec.invariants import INVARIANTS, ONE_SIDED_INVARIANTS
from kvhandoff.spec.logic import REQ, And, Implies, Or, clauses, forall
from kvhandoff.spec.trace import replay
from kvhandoff.spec.variants import REFERENCE, get_variant
from kvhandoff.spec.vocabulary import d, d_awaiting_ack, d_gen, p_gen
from tests.model_checker.small import SMALL
from tests.model_checker.small import valid as _valid


def test_every_engine_reads_the_same_invariant_objects() -> None:
    names = [inv.name for inv in INVARIANTS]
    enc = Encoding(REFERENCE, Config(), width=None)
    assert set(names) <= set(fixed_invariants(enc))
    assert set(names) <= set(z3_prove.invariants(z3_prove.state()))
    # The fixed reading is the translation of the spec's formula itself.
    s = enc.state_at(0)
    for inv in INVARIANTS:
        derived = fixed_invariants(enc)[inv.name](s)
        assert z3.eq(derived, translate(inv.formula, FixedReading(enc, s))), inv.name


@pytest.mark.parametrize(
    "name", ["reference", "reference_pull", "one_sided_fenced", "m7_release_before_drain"]
)
def test_the_derived_fixed_invariants_say_everything_the_hand_written_twins_said(name: str) -> None:
    enc = Encoding(get_variant(name), Config(), width=None)
    s = enc.state_at(0)
    old, new = legacy_fixed_invariants(enc), fixed_invariants(enc)
    sane = z3.And(enc.in_range(s), old["well_formed"](s))
    for inv in INVARIANTS:
        assert _valid(z3.Implies(new[inv.name](s), old[inv.name](s)), sane), inv.name
    if "fenced_writes_land_in_held_pages" in old:  # the one-sided designs: equivalent
        fenced_new, fenced_old = (x["fenced_writes_land_in_held_pages"](s) for x in (new, old))
        assert _valid(fenced_new == fenced_old, sane)


def test_the_derived_any_size_invariants_say_everything_the_hand_written_ones_said() -> None:
    s = z3_prove.state()
    old, new = z3_prove.legacy_invariants(s), z3_prove.invariants(s)
    assert _valid(z3.Implies(z3.And(list(new.values())), z3.And(list(old.values()))))


def test_the_any_size_model_names_the_clauses_it_cannot_read() -> None:
    left = z3_prove.left_out()
    assert left["generations_are_unique"] == []
    assert any("write" in why for why in left["writes_carry_their_grant"])
    assert any("'p_wrote'" in why for why in left["prefill_holds_decodes_generation"])
    with pytest.raises(Untranslatable, match="d_awaiting_ack"):
        translate(forall(REQ, lambda r: d_awaiting_ack(r)), AnySizeReading(z3_prove.state()))


def test_clauses_split_conjunctions_under_quantifiers_and_implications() -> None:
    f = forall(
        REQ, lambda r: Implies(Or(d(r) == "reserved", p_gen(r) != 0), And(d_gen(r) != 0, True))
    )
    assert len(clauses(f)) == 4


@pytest.mark.parametrize(
    "name",
    ["reference", "incident", "m5_digest_skipped", "m20_unscrubbed_pages", "one_sided_fenced"],
)
def test_the_formulas_agree_with_the_old_python_functions_on_reachable_states(name: str) -> None:
    variant = get_variant(name)
    states = build_graph(variant, SMALL)[0].states
    disagree = 0
    for state in states:
        for new, old in zip(INVARIANTS, invariants_py.INVARIANTS, strict=True):
            assert new.name == old.name
            if new.holds(SMALL, state, variant.design) != old.holds(SMALL, state):
                disagree += 1
    assert disagree == 0


def test_the_fenced_one_sided_formula_agrees_with_the_old_function_where_it_holds_and_fails() -> (
    None
):
    variant = get_variant("m7_release_before_drain")  # breaks the fence: the invariant fails
    (new,), (old,) = ONE_SIDED_INVARIANTS, invariants_py.ONE_SIDED_INVARIANTS
    values = [
        (new.holds(SMALL, s, variant.design), old.holds(SMALL, s))
        for s in build_graph(variant, SMALL)[0].states
    ]
    assert all(a == b for a, b in values)
    assert any(not a for a, _ in values) and any(a for a, _ in values)


def test_the_explorer_evaluates_the_invariants_on_every_state() -> None:
    assert explore(REFERENCE, SMALL, invariants=True).extra["invariants"]["failing"] == {}
    variant = get_variant("m20_unscrubbed_pages")
    result = explore(variant, SMALL, invariants=True)
    failing = result.extra["invariants"]["failing"]
    assert "owned_pages_hold_owner_data_or_nothing" in failing
    # The run it reports ends in a state that breaks the formula.
    graph = build_graph(variant, SMALL, invariants=True)[0]
    assert graph.invariant_failures is not None
    index = graph.invariant_failures["owned_pages_hold_owner_data_or_nothing"]
    final = replay(variant, SMALL, graph.path_to(index))[-1]
    inv = next(i for i in INVARIANTS if i.name == "owned_pages_hold_owner_data_or_nothing")
    assert not inv.holds(SMALL, final, variant.design)
    assert failing["owned_pages_hold_owner_data_or_nothing"]["depth"] == len(graph.path_to(index))


def test_prove_and_kind_still_prove_the_reference_with_the_derived_invariants() -> None:
    obligations = z3_prove.prove_any_size(REFERENCE.design)
    assert obligations and all(o.verdict == "proved" for o in obligations)
