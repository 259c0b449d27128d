"""The witnesses are written once (spec/properties.py) and every engine reads them.

Each `sometimes` witness has a formula over the vocabulary (`Witness.formula`) beside its Python
function (what the explorer checks, which stays). Differential tests against the hand-written
copies the formulas replace in the Z3 engines: the fixed-configuration twins
(`z3_witnesses.legacy_fixed_witnesses`) and the any-size ones
(`z3_witnesses.legacy_any_size_witnesses`):

* by Z3, each derived fixed-configuration witness is equivalent to its twin on every well-formed
  state of the encoding (not only reachable ones), for the push, pull and one-sided designs, over
  Ints and over bit-vectors; likewise the any-size witnesses the model reads from their formulas,
  and the others are named with the reason;
* on every reachable state of the small scenario, for several variants, the formula and the
  Python function agree, and each witness is true somewhere and false somewhere;
* `fixed_movement` (which actions fire and which witnesses hold, and at which depth) is the same
  with the derived witnesses as with the hand-written ones; `any_size_movement` reaches the same
  witnesses (its steps are those of the path the solver finds, so they are not compared);
* the explorer with `--invariants` evaluates the witness formulas beside the functions.
"""

from __future__ import annotations

import dataclasses

import pytest
import z3

from kvhandoff.model_checker import z3_prove, z3_witnesses
from kvhandoff.model_checker.explore import build_graph, explore
from kvhandoff.model_checker.logic_z3 import (
    FixedReading,
    any_size_witnesses,
    translate,
)
from kvhandoff.model_checker.z3_encoding import Encoding
from kvhandoff.model_checker.z3_invariants import legacy_fixed_invariants
from kvhandoff.model_checker.z3_witnesses import (
    ANY_SIZE_NOT_CHECKED,
    _any_size_witnesses,
    any_size_movement,
    any_size_witnesses_left_out,
    fixed_movement,
    fixed_witnesses,
    legacy_any_size_witnesses,
    legacy_fixed_witnesses,
)
from kvhandoff.spec.config import Config
from kvhandoff.spec.properties import SOMETIMES
from kvhandoff.spec.variants import REFERENCE, get_variant
from tests.model_checker.small import SMALL
from tests.model_checker.small import valid as _valid

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


@pytest.mark.parametrize(
    ("name", "config", "width"),
    [
        ("reference", Config(), None),
        ("reference_pull", Config(), None),
        ("one_sided_fenced", Config(), None),
        # No prompt over prefill's limit: the oversized-prompt witness is false everywhere.
        ("reference", dataclasses.replace(SMALL, prefill_max_prompt=2), None),
        # Over bit-vectors (as BMC and fixed_movement read them), where the reasons are bits.
        ("reference_pull", SMALL, 5),
    ],
)
def test_the_derived_fixed_witnesses_are_equivalent_to_the_hand_written_twins(
    name: str, config: Config, width: int | None
) -> None:
    enc = Encoding(get_variant(name), config, width=width)
    s = enc.state_at(0)
    sane = z3.And(enc.in_range(s), legacy_fixed_invariants(enc)["well_formed"](s))
    new, old = fixed_witnesses(enc, s), legacy_fixed_witnesses(enc, s)
    assert list(new) == list(old) == NAMES
    for witness in NAMES:
        assert _valid(new[witness] == old[witness], sane), witness


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
    # The unrolling uses the formulas it reads, and its own statement of the others.
    states, restarts = [z3_prove.state("@a"), z3_prove.state("@b")], [z3.Bool("restart@a")]
    used = _any_size_witnesses(states, restarts)
    own = legacy_any_size_witnesses(states, restarts)
    assert set(used) == set(own)
    derived_now = any_size_witnesses(states[-1])[0]
    for name in used:
        expected = derived_now[name] if name in derived_now else own[name]()
        assert z3.eq(used[name](), expected), name
    # Each formula it reads is its hand-written twin (whose request is a Skolem constant), on
    # every state of the model's well-formedness invariant.
    sane = z3_prove.legacy_invariants(states[-1])["well_formed"]
    r = z3.Const(f"w_r@{len(states) - 1}", z3_prove.Req)
    for name, formula in derived_now.items():
        assert _valid(formula == z3.Exists([r], own[name]()), sane), name


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


@pytest.mark.parametrize(
    ("name", "depth"), [("reference", 14), ("one_sided_fenced", 12), ("reference_pull", 10)]
)
def test_fixed_movement_is_the_same_with_the_derived_witnesses(name: str, depth: int) -> None:
    variant = get_variant(name)
    derived = fixed_movement(variant, SMALL, depth)
    legacy = fixed_movement(variant, SMALL, depth, legacy_witnesses=True)
    assert derived.problems == legacy.problems == []
    assert derived.actions == legacy.actions
    assert derived.witnesses == legacy.witnesses
    assert derived.spec_unreached == legacy.spec_unreached
    assert any(at is not None for at in derived.witnesses.values())


def test_the_any_size_movement_reaches_the_same_witnesses_with_the_derived_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The unrolling reports the step on the path the solver found, not the shortest (see
    z3_witnesses), so only what is reached is compared, not at which step."""
    derived = any_size_movement(REFERENCE, Config())
    monkeypatch.setattr(z3_witnesses, "_any_size_witnesses", legacy_any_size_witnesses)
    legacy = any_size_movement(REFERENCE, Config())
    assert derived.problems == legacy.problems == []
    assert derived.reached() == legacy.reached()
    assert all(derived.reached().values())
    assert derived.actions.keys() == legacy.actions.keys()


def test_the_explorer_evaluates_the_witness_formulas_beside_the_functions() -> None:
    result = explore(get_variant("incident"), SMALL, invariants=True)
    formulas = result.extra["invariants"]["witnesses"]
    assert formulas["checked"] == NAMES
    assert formulas["disagreeing"] == {}
    graph = build_graph(get_variant("incident"), SMALL, invariants=True)[0]
    assert graph.witness_disagreements == {}
    assert build_graph(REFERENCE, SMALL)[0].witness_disagreements is None
