"""The witnesses are written once (spec/properties.py) and every engine reads them.

Each `sometimes` witness has a formula over the vocabulary (`Witness.formula`) beside its Python
function (what the explorer checks, which stays):

* the fixed-configuration engines' vacuity search reads the formulas themselves, and so does the
  any-size model's (every witness, where the spec's own path reaches it);
* on every reachable state of the small scenario, for several variants, the formula and the
  Python function agree, and each witness is true somewhere and false somewhere;
* the explorer with `--invariants` evaluates the witness formulas beside the functions.

The hand-written Z3 twins the formulas replaced were deleted once the differential tests had
shown them equivalent on main (docs/one-semantics.md).
"""

from __future__ import annotations

import z3

from kvhandoff.model_checker import z3_derived
from kvhandoff.model_checker.explore import build_graph, explore
from kvhandoff.model_checker.logic_z3 import FixedReading, translate
from kvhandoff.model_checker.z3_encoding import Encoding
from kvhandoff.model_checker.z3_witnesses import fixed_witnesses
from kvhandoff.spec.config import Config
from kvhandoff.spec.properties import SOMETIMES
from kvhandoff.spec.variants import REFERENCE, get_variant
from tests.model_checker.small import SMALL

NAMES = [w.name for w in SOMETIMES]


def test_every_witness_has_a_formula_and_the_fixed_engines_read_it() -> None:
    assert all(w.formula is not None for w in SOMETIMES)
    enc = Encoding(REFERENCE, Config(), width=None)
    s = enc.state_at(0)
    derived = fixed_witnesses(enc, s)
    assert list(derived) == NAMES
    for w in SOMETIMES:
        assert w.formula is not None
        assert z3.eq(derived[w.name], translate(w.formula, FixedReading(enc, s))), w.name


def test_the_any_size_model_reads_every_witness_formula() -> None:
    model = z3_derived.Model(REFERENCE.design)
    view = z3_derived.base_view("")
    for w in SOMETIMES:
        assert w.formula is not None
        assert z3.is_expr(z3_derived._z(model.tr(w.formula, view, "", {}))), w.name


# Variants whose runs on the small scenario, between them, show every witness true in some state
# (and false in the initial one): the reference designs (push, pull, one-sided, with a fence), and
# a broken one whose runs differ (no scrub: can_scrub_written_page stays false).
VARIANTS = ["reference", "reference_pull", "one_sided_fenced", "incident"]


def test_the_formulas_agree_with_the_python_functions_on_reachable_states() -> None:
    seen: dict[str, set[bool]] = {name: set() for name in NAMES}
    for name in VARIANTS:
        for state in build_graph(get_variant(name), SMALL)[0].states:
            for w in SOMETIMES:
                reached = w.reached(SMALL, state)
                assert w.formula_holds(SMALL, state) == reached, (name, w.name, state)
                seen[w.name].add(reached)
    assert all(values == {True, False} for values in seen.values()), seen


def test_the_explorer_evaluates_the_witness_formulas_beside_the_functions() -> None:
    result = explore(get_variant("incident"), SMALL, invariants=True)
    formulas = result.extra["invariants"]["witnesses"]
    assert formulas["checked"] == NAMES
    assert formulas["disagreeing"] == {}
    graph = build_graph(get_variant("incident"), SMALL, invariants=True)[0]
    assert graph.witness_disagreements == {}
    assert build_graph(REFERENCE, SMALL)[0].witness_disagreements is None
