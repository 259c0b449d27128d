"""The Z3 encoding reads the guards of the single-request protocol steps from the spec.

`spec/machine.py` writes the guard of every protocol step of one request (or of none) as a formula
(`rule_guard`); `Encoding.rule` translates it (`logic_z3.translate`, as it translates a variant's
formula guard) in place of the guard its hand-written encoder builds, which stays reachable as
`Encoding(..., legacy_guards=True)` until this differential test has run on main for a while:

* by Z3, for every instance of those actions, the translated formula is equivalent to the
  hand-written guard on every well-formed state (not only reachable ones): the default scenario
  under the push, pull, one-sided-fenced and timeout-fenced designs, a scenario that submits in
  any order with two requests in progress, over Ints and over bit-vectors;
* the actions left with their hand-written guard are exactly the others;
* BMC finds the same verdicts and counterexample lengths with the derived guards as with the
  hand-written ones. (The edge crosscheck against the explorer, test_z3_crosscheck.py, runs on
  the derived guards.)

The concrete side (formula against the explorer's Python guard on reachable states) is
tests/spec/test_guards_once.py.
"""

from __future__ import annotations

import pytest
import z3

from kvhandoff.model_checker.z3_encoding import Encoding
from kvhandoff.model_checker.z3_engines import bmc
from kvhandoff.model_checker.z3_invariants import legacy_fixed_invariants
from kvhandoff.spec.config import Config, parse_set
from kvhandoff.spec.machine import RULE_GUARDS
from kvhandoff.spec.variants import get_variant
from tests.model_checker.small import SMALL
from tests.model_checker.small import valid as _valid

ANY_ORDER = parse_set(
    Config(),
    ["max_active=2", "submit_in_order=false", "requests=a:1:1,b:4:2,c:2:1", "decode_max_prompt=3"],
)
"""Two requests in progress at once, in any order, one prompt over decode's limit."""


def _equivalent(name: str, config: Config, width: int | None) -> set[str]:
    """Each derived guard equals the hand-written one on every well-formed state; the actions
    whose guard was derived."""
    derived = Encoding(get_variant(name), config, width=width)
    legacy = Encoding(get_variant(name), config, width=width, legacy_guards=True)
    s = derived.state_at(0)
    assert s.keys() == legacy.state_at(0).keys()
    sane = z3.And(derived.in_range(s), legacy_fixed_invariants(derived)["well_formed"](s))
    assert not _valid(z3.BoolVal(False), sane)  # some state is well formed
    checked: set[str] = set()
    for i, inst in enumerate(derived.instances):
        new, old = derived.rule(s, i)[0], legacy.rule(s, i)[0]
        hand = derived.hand_written_guard(s, i)
        assert z3.eq(old, hand), inst  # the legacy encoding takes the encoder's own guard
        if inst.name not in RULE_GUARDS:
            assert z3.eq(new, hand), inst  # left as it was
            continue
        assert _valid(new == hand, sane), (name, inst)
        checked.add(inst.name)
    return checked


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("reference", Config()),
        ("incident", Config()),
        ("reference_pull", Config()),
        ("one_sided_fenced", Config()),
        ("m8_release_on_timeout", Config()),
        ("reference", ANY_ORDER),
    ],
)
def test_the_derived_guards_are_equivalent_to_the_hand_written_ones(
    name: str, config: Config
) -> None:
    checked = _equivalent(name, config, width=None)
    expected = set(RULE_GUARDS)
    if name != "m8_release_on_timeout":
        expected.discard("decode_release_timeout")  # no such instance: the design lacks the step
    if get_variant(name).design.transfer != "pull":
        expected.discard("prefill_lease_expire")  # the push path has no lease
        expected.discard("network_fail_transfer")  # ... and no reads to fail
    if get_variant(name).design.release_fence not in ("drain_ack", "ack_or_timeout"):
        expected.discard("decode_receive_abort_ack")  # no drain acks: no such instance
        expected.discard("prefill_send_abort_ack")
    # Admission's outcome is fixed by the prompt's length: only one of admit/reject per request.
    lengths = {r.pages for r in config.requests}
    if all(n <= config.prefill_max_prompt for n in lengths):
        expected.discard("prefill_reject_request")
    if all(n <= config.decode_max_prompt for n in lengths):
        expected.discard("decode_reject_request")
    assert checked == expected


def test_the_derived_guards_are_equivalent_over_bit_vectors_too() -> None:
    checked = _equivalent("m8_release_on_timeout", Config(), width=5)
    assert "decode_release_timeout" in checked and "router_submit_request" in checked


@pytest.mark.parametrize("name", ["incident", "m7_release_before_drain", "m13_lease_expiry_pull"])
def test_bmc_finds_the_same_counterexample_lengths_with_the_derived_guards(name: str) -> None:
    variant = get_variant(name)
    derived = bmc(variant, SMALL, depth=12)
    legacy = bmc(variant, SMALL, depth=12, legacy_guards=True)
    assert derived.verdict == legacy.verdict
    assert [(r.property, r.verdict, r.depth) for r in derived.results] == [
        (r.property, r.verdict, r.depth) for r in legacy.results
    ]


def test_the_derived_guards_never_loosen_the_step_bounds() -> None:
    """The interval analysis (`Encoding.intervals`, what BMC narrows its variables to) reads the
    guards' top-level conjuncts. The derived guards give it at least the bounds the hand-written
    ones gave: `p_wrote < p_len and p_wrote < granted` bounds p_wrote twice where
    `p_wrote < min(p_len, granted)` bounded it not at all. (Soundness of the tighter bounds: the
    step-bounds test of test_z3_bmc.py, against every state the explorer reaches.)"""
    variant = get_variant("incident")
    derived = Encoding(variant, Config(), width=5).intervals(12)
    legacy = Encoding(variant, Config(), width=5, legacy_guards=True).intervals(12)
    assert derived is not None and legacy is not None
    tighter = 0
    for new, old in zip(derived, legacy, strict=True):
        for name, (lo, hi) in new.items():
            assert old[name][0] <= lo <= hi <= old[name][1], name
            tighter += (lo, hi) != old[name]
    assert tighter > 0
