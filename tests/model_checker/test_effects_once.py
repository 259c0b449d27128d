"""The Z3 encoding reads the effects of the single-request protocol steps from the spec.

`spec/machine.py` writes the effect of every protocol step of one request (or of none) as updates
over the vocabulary (`rule_effect`); `Encoding.rule` translates them (`logic_z3.fixed_effect`) in
place of the new values its hand-written encoder builds, which stay reachable as
`Encoding(..., legacy_effects=True)` until this differential test has run on main for a while:

* by Z3, for every instance of those actions and every variable of the encoding, the translated
  effect gives the value the hand-written one gives, on every well-formed state where the step
  is enabled (not only reachable ones): the default scenario under the push, pull, one-sided
  fenced, timeout-fenced, placeholder and truncating designs, and a scenario that submits in any
  order with a prompt over decode's limit, over Ints and bit-vectors;
* the actions left with their hand-written effect are exactly the others;
* BMC finds the same verdicts and counterexample lengths with the derived effects as with the
  hand-written ones. (The edge crosscheck against the explorer, test_z3_crosscheck.py, runs on
  the derived effects.)

The concrete side (formula against the explorer's Python effect on reachable states) is
tests/spec/test_effects_once.py.
"""

from __future__ import annotations

import pytest
import z3

from kvhandoff.model_checker.z3_encoding import Encoding
from kvhandoff.model_checker.z3_engines import bmc
from kvhandoff.model_checker.z3_invariants import legacy_fixed_invariants
from kvhandoff.spec.config import Config
from kvhandoff.spec.machine import RULE_EFFECTS
from kvhandoff.spec.variants import get_variant
from tests.model_checker.small import SMALL
from tests.model_checker.small import valid as _valid
from tests.model_checker.test_guards_once import ANY_ORDER


def _equivalent(name: str, config: Config, width: int | None) -> set[str]:
    """Each derived effect gives every variable the hand-written value wherever its step is
    enabled on a well-formed state; the actions whose effect was derived."""
    derived = Encoding(get_variant(name), config, width=width)
    legacy = Encoding(get_variant(name), config, width=width, legacy_effects=True)
    s = derived.state_at(0)
    sane = z3.And(derived.in_range(s), legacy_fixed_invariants(derived)["well_formed"](s))
    assert not _valid(z3.BoolVal(False), sane)  # some state is well formed
    checked: set[str] = set()
    for i, inst in enumerate(derived.instances):
        guard, new = derived.rule(s, i)
        old = legacy.rule(s, i)[1]
        assert old == derived.hand_written_effect(s, i), inst  # legacy: the encoder's own
        if inst.name not in RULE_EFFECTS:
            assert new.keys() == old.keys(), inst  # left as it was
            assert all(z3.eq(new[v], old[v]) for v in new), inst
            continue
        same = [new.get(v, s[v]) == old.get(v, s[v]) for v in sorted(set(new) | set(old))]
        assert _valid(z3.And(same), z3.And(sane, guard)), (name, inst)
        checked.add(inst.name)
    return checked


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("reference", Config()),
        ("incident", Config()),
        ("m6_asymmetric_truncation", Config()),
        ("reference_pull", Config()),
        ("m13_lease_expiry_pull", Config()),
        ("one_sided_fenced", Config()),
        ("m8_release_on_timeout", Config()),
        ("m20_unscrubbed_pages", Config()),
        ("m18_orphan_grant_accepted", Config()),  # prefill adopts a grant it does not hold
        ("reference", ANY_ORDER),
    ],
)
def test_the_derived_effects_are_equivalent_to_the_hand_written_ones(
    name: str, config: Config
) -> None:
    checked = _equivalent(name, config, width=None)
    expected = set(RULE_EFFECTS)
    if name != "m8_release_on_timeout":
        expected.discard("decode_release_timeout")  # no such instance: the design lacks the step
    if get_variant(name).design.transfer != "pull":
        expected.discard("prefill_lease_expire")  # the push path has no lease
        expected.discard("network_fail_transfer")  # ... and no reads to fail
    if get_variant(name).design.release_fence not in ("drain_ack", "ack_or_timeout"):
        expected.discard("decode_receive_abort_ack")  # no drain acks: no such instance
        expected.discard("prefill_send_abort_ack")
    lengths = {r.pages for r in config.requests}
    if all(n <= config.prefill_max_prompt for n in lengths):
        expected.discard("prefill_reject_request")
    if all(n <= config.decode_max_prompt for n in lengths):
        expected.discard("decode_reject_request")
    assert checked == expected


def test_the_derived_effects_are_equivalent_over_bit_vectors_too() -> None:
    checked = _equivalent("m8_release_on_timeout", Config(), width=5)
    assert {"decode_reserve_pages", "decode_release_timeout"} <= checked


@pytest.mark.parametrize("name", ["incident", "m7_release_before_drain", "m13_lease_expiry_pull"])
def test_bmc_finds_the_same_counterexample_lengths_with_the_derived_effects(name: str) -> None:
    variant = get_variant(name)
    derived = bmc(variant, SMALL, depth=12)
    legacy = bmc(variant, SMALL, depth=12, legacy_effects=True)
    assert derived.verdict == legacy.verdict
    assert [(r.property, r.verdict, r.depth) for r in derived.results] == [
        (r.property, r.verdict, r.depth) for r in legacy.results
    ]


@pytest.mark.parametrize("name", ["incident", "one_sided_fenced", "m8_release_on_timeout"])
def test_the_derived_effects_never_loosen_the_step_bounds(name: str) -> None:
    """The interval analysis (`Encoding.intervals`, what BMC narrows its variables to) reads the
    updates' shapes (`x + 1` under a condition, a constant, ...). The derived effects give it at
    least the bounds the hand-written ones gave, at every step: in particular two sends into one
    slot under exclusive conditions (`decode_detect_prefill_restart`) still add at most one."""
    variant = get_variant(name)
    derived = Encoding(variant, Config(), width=5).intervals(12)
    legacy = Encoding(variant, Config(), width=5, legacy_effects=True).intervals(12)
    assert derived is not None and legacy is not None
    for new, old in zip(derived, legacy, strict=True):
        for var, (lo, hi) in new.items():
            assert old[var][0] <= lo <= hi <= old[var][1], var
