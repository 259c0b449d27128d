"""The invariants are written once (spec/invariants.py) and every engine reads those objects.

The hand-written copies they replaced (Python functions, fixed-configuration and any-size Z3
twins) were deleted once the differential tests had shown them equal on main; what pins the
formulas now is the spec itself: they hold on every reachable state of the reference
(tests/model_checker/test_z3_crosscheck.py), a variant that breaks one is named with its
shortest run, and `prove` and `kind` still prove the reference with them.
"""

from __future__ import annotations

import z3

from kvhandoff.model_checker import z3_derived
from kvhandoff.model_checker.explore import build_graph, explore
from kvhandoff.model_checker.logic_z3 import FixedReading, translate
from kvhandoff.model_checker.z3_encoding import Encoding
from kvhandoff.model_checker.z3_invariants import fixed_invariants
from kvhandoff.spec.config import Config
from kvhandoff.spec.invariants import INVARIANTS
from kvhandoff.spec.logic import REQ, And, Implies, Or, clauses, forall
from kvhandoff.spec.trace import replay
from kvhandoff.spec.variants import REFERENCE, get_variant
from kvhandoff.spec.vocabulary import d, d_gen, p_gen
from tests.model_checker.small import SMALL


def test_every_engine_reads_the_same_invariant_objects() -> None:
    names = [inv.name for inv in INVARIANTS]
    enc = Encoding(REFERENCE, Config(), width=None)
    assert set(names) <= set(fixed_invariants(enc))
    model = z3_derived.Model(REFERENCE.design)
    view = z3_derived.base_view("")
    read = z3_derived.claims(model, view, "")
    assert set(names) <= set(read)
    # Each reading is the translation of the spec's formula itself, every clause of it: the
    # any-size model's of the whole formula, the fixed encoding's likewise.
    for inv in INVARIANTS:
        whole = z3_derived._z(model.tr(inv.formula, view, "", {}))
        solver = z3.Solver()
        solver.add(whole != read[inv.name])
        assert solver.check() == z3.unsat, inv.name
    s = enc.state_at(0)
    for inv in INVARIANTS:
        derived = fixed_invariants(enc)[inv.name](s)
        assert z3.eq(derived, translate(inv.formula, FixedReading(enc, s))), inv.name


def test_clauses_split_conjunctions_under_quantifiers_and_implications() -> None:
    f = forall(
        REQ, lambda r: Implies(Or(d(r) == "reserved", p_gen(r) != 0), And(d_gen(r) != 0, True))
    )
    assert len(clauses(f)) == 4


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
    obligations = z3_derived.prove_derived(REFERENCE.design)
    assert obligations and all(o.verdict == "proved" for o in obligations)
