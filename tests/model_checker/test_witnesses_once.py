"""The witnesses are written once (spec/properties.py) and every engine reads them.

Each `sometimes` witness has a formula over the vocabulary (`Witness.formula`) beside its Python
function (what the explorer checks, which stays):

* the fixed-configuration engines' vacuity search reads the formulas themselves; the any-size
  unrolling reads those it can and states the others over the path's history, naming why;
* on every reachable state of the small scenario, for several variants, the formula and the
  Python function agree, and each witness is true somewhere and false somewhere;
* the explorer with `--invariants` evaluates the witness formulas beside the functions.

The hand-written Z3 twins the formulas replaced were deleted once the differential tests had
shown them equivalent on main (docs/one-semantics.md).
"""

from __future__ import annotations

import z3

from kvhandoff.model_checker import z3_prove
from kvhandoff.model_checker.explore import build_graph, explore
from kvhandoff.model_checker.logic_z3 import (
    FixedReading,
    any_size_witnesses,
    translate,
)
from kvhandoff.model_checker.z3_encoding import Encoding
from kvhandoff.model_checker.z3_witnesses import (
    ANY_SIZE_NOT_CHECKED,
    _any_size_witnesses,
    any_size_witnesses_left_out,
    fixed_witnesses,
    own_any_size_witnesses,
)
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


def test_the_any_size_model_reads_what_it_keeps_and_says_why_not_the_rest() -> None:
    st = z3_prove.state()
    read, why = any_size_witnesses(st)
    assert set(read) == {"can_complete_handoff", "can_reject_oversized_prompt"}
    assert set(read) | set(why) == set(NAMES)
    assert why == any_size_witnesses_left_out()
    # Every witness the model does not check at all cannot be read from its formula either.
    assert set(ANY_SIZE_NOT_CHECKED) <= set(why)
    assert "ghost flags" in why["can_reuse_freed_page"]
    assert "'accepted_set'" in why["can_accept_completion"]
    # The unrolling uses the formulas it reads, and its own statement of the others only.
    states, restarts = [z3_prove.state("@a"), z3_prove.state("@b")], [z3.Bool("restart@a")]
    used = _any_size_witnesses(states, restarts)
    own = own_any_size_witnesses(states, restarts)
    derived_now = any_size_witnesses(states[-1])[0]
    assert not set(own) & set(derived_now)
    assert set(used) == set(own) | set(derived_now)
    assert set(used) == set(NAMES) - set(ANY_SIZE_NOT_CHECKED)
    for name in used:
        expected = derived_now[name] if name in derived_now else own[name]()
        assert z3.eq(used[name](), expected), name


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
