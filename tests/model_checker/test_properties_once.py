"""The safety properties are written once (spec/properties.py) and every engine reads them.

Each `always` property has a formula over the vocabulary (`Property.formula`) beside its Python
function (the explorer's fast path, which stays):

* the fixed-configuration engines check the formulas themselves, and so does the any-size model
  (every property, whole);
* on every reachable state of the small scenario, for variants whose properties fail, the formula
  and the Python function agree (and across the runs, every property fails somewhere);
* the explorer with `--invariants` evaluates the formulas beside the functions, and they agree.

The hand-written Z3 twins the formulas replaced were deleted once the differential tests had
shown them equivalent on main (docs/one-semantics.md).
"""

from __future__ import annotations

import z3

from kvhandoff.model_checker import z3_derived
from kvhandoff.model_checker.explore import build_graph, explore
from kvhandoff.model_checker.logic_z3 import FixedReading, translate
from kvhandoff.model_checker.z3_encoding import Encoding
from kvhandoff.spec.config import Config, RequestSpec
from kvhandoff.spec.properties import ALWAYS
from kvhandoff.spec.state import PageState, State
from kvhandoff.spec.variants import REFERENCE, get_variant
from tests.model_checker.small import SMALL

NAMES = [p.name for p in ALWAYS]


def test_every_property_has_a_formula_and_the_engines_read_it() -> None:
    assert all(p.formula is not None for p in ALWAYS)
    enc = Encoding(REFERENCE, Config(), width=None)
    s = enc.state_at(0)
    derived = enc.properties(s)
    assert list(derived) == NAMES
    for p in ALWAYS:
        assert p.formula is not None
        assert z3.eq(derived[p.name], translate(p.formula, FixedReading(enc, s))), p.name
    # The any-size model reads every property's formula, whole.
    model = z3_derived.Model(REFERENCE.design)
    view = z3_derived.base_view("")
    read = z3_derived.claims(model, view, "")
    for p in ALWAYS:
        assert p.formula is not None
        solver = z3.Solver()
        solver.add(read[p.name] != z3_derived._z(model.tr(p.formula, view, "", {})))
        assert solver.check() == z3.unsat, p.name


# Variants whose properties fail on the small scenario: between them, every property but
# page_has_single_owner (which no catalogued variant breaks: see the hand-built state below).
FAILING = [
    "reference",
    "incident",
    "m7_release_before_drain",
    "m13_lease_expiry_pull",
    "m14_silent_receive_failure_pull",
    "m20_unscrubbed_pages",
]


def _agreement(name: str, config: Config) -> set[str]:
    """Formula and function on every reachable state; the properties that fail somewhere."""
    failing: set[str] = set()
    for state in build_graph(get_variant(name), config)[0].states:
        for prop in ALWAYS:
            holds = prop.holds(config, state)
            assert prop.formula_holds(config, state) == holds, (name, prop.name, state)
            if not holds:
                failing.add(prop.name)
    return failing


def test_the_formulas_agree_with_the_python_functions_on_reachable_states() -> None:
    failing: set[str] = set()
    for name in FAILING:
        failing |= _agreement(name, SMALL)
    assert failing == set(NAMES) - {"page_has_single_owner"}
    # Two prefill ranks: the read is two shards per page.
    ranks = Config(
        decode_pages=2,
        requests=(RequestSpec("a", 1, 1), RequestSpec("b", 2, 1)),
        context_window=2,
        prefill_max_prompt=1,
        decode_max_prompt=2,
        prefill_ranks=2,
        max_faults=0,
    )
    assert "decode_reads_only_validated_pages" in _agreement(
        "first_rank_completion_accepted", ranks
    )


def test_a_double_booked_page_breaks_the_formula_as_it_breaks_the_function() -> None:
    start = build_graph(REFERENCE, SMALL)[0].states[0]
    prop = next(p for p in ALWAYS if p.name == "page_has_single_owner")
    owned_not_held = State(requests=start.requests, pages=(PageState(owner=(0, 1)), PageState()))
    held = start.requests[0].__class__(d="reserved", d_gen=1, d_pages=(0,))
    twice = State(
        requests=(held, held), pages=(PageState(owner=(0, 1)), PageState()), next_generation=2
    )
    for state in (owned_not_held, twice):
        assert not prop.holds(SMALL, state)
        assert not prop.formula_holds(SMALL, state)


def test_the_explorer_evaluates_the_property_formulas_beside_the_functions() -> None:
    result = explore(get_variant("incident"), SMALL, invariants=True)
    formulas = result.extra["invariants"]["properties"]
    assert formulas["checked"] == NAMES
    assert formulas["disagreeing"] == {}
    assert any(r.verdict == "violated" for r in result.results)
    graph = build_graph(get_variant("incident"), SMALL, invariants=True)[0]
    assert graph.property_disagreements == {}
    assert build_graph(REFERENCE, SMALL)[0].property_disagreements is None
