"""The proof of room-keyed matching: its own invariants (`spec.invariants.invariants_for`).

Under `matching="room"` prefill's request can hold a grant decode made for another request on its
room, so `prefill_holds_decodes_generation` (and the two others that say whose grant prefill
holds) are false on reachable states and no proof could use them. `ROOM_KEYED_INVARIANTS` say
what is true instead; these tests pin that every checker reads them for a room-keyed design,
that they hold on every reachable state, that kind proves `room_keyed_with_binding`'s safety
properties with them, that a wrong clause is caught concretely, and the one property the any-size
proof cannot give (it is false in some scenarios).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import z3

from kvhandoff.model_checker import z3_derived
from kvhandoff.model_checker.explore import build_graph, explore, invariants_of
from kvhandoff.model_checker.prove import prove
from kvhandoff.model_checker.z3_crosscheck import constants
from kvhandoff.model_checker.z3_encoding import Encoding
from kvhandoff.model_checker.z3_engines import kinduction
from kvhandoff.model_checker.z3_invariants import fixed_invariants
from kvhandoff.spec import invariants as spec_invariants
from kvhandoff.spec.config import Config, parse_set
from kvhandoff.spec.invariants import (
    INVARIANTS,
    ROOM_KEYED_EXTRA_INVARIANTS,
    ROOM_KEYED_INVARIANTS,
    Invariant,
    invariants_for,
)
from kvhandoff.spec.logic import REQ, Implies, forall
from kvhandoff.spec.variants import REFERENCE, get_variant
from kvhandoff.spec.vocabulary import d_gen, p_gen
from tests.spec.test_room_matching import SAFETY, SHARED_ROOM  # two requests on one room

# Decode admits less than prefill: request 1 (3 pages, room 1) is refused by decode and admitted
# by prefill, which can then take the grant decode made for request 0 on the same room.
DECODE_REFUSES_WHAT_PREFILL_ADMITS = [
    "requests=a:2:1,b:3:1",
    "decode_max_prompt=2",
    "prefill_max_prompt=3",
]


def test_room_keyed_designs_get_their_own_invariants_and_request_keyed_ones_do_not() -> None:
    room = get_variant("room_keyed_with_binding")
    names = [inv.name for inv in invariants_of(room)]
    for replaced, instead in ROOM_KEYED_INVARIANTS.items():
        assert replaced not in names and instead.name in names
    assert all(inv.name in names for inv in ROOM_KEYED_EXTRA_INVARIANTS)
    # The request-keyed designs read exactly the objects they read before.
    assert invariants_for(REFERENCE.design) == INVARIANTS
    # kind and the fixed-config prove read the same objects, as formulas over the encoding.
    enc = Encoding(room, Config(), width=None)
    assert set(names) | {"well_formed"} == set(fixed_invariants(enc))


@pytest.mark.parametrize("scenario", [SHARED_ROOM, DECODE_REFUSES_WHAT_PREFILL_ADMITS])
def test_the_room_keyed_invariants_hold_on_every_reachable_state(scenario: list[str]) -> None:
    for name in ("room_keyed_with_binding", "room_keyed_matching"):
        result = explore(get_variant(name), parse_set(Config(), scenario), invariants=True)
        failing = result.extra["invariants"]["failing"]
        if name == "room_keyed_with_binding":
            assert failing == {}, name
        else:
            # Without the binding a write lands in the pages decode holds for another request:
            # the invariant decode's ownership check keeps, and the properties on it, break.
            assert "owned_pages_hold_owner_data_or_nothing" in failing


def test_kind_s_reading_of_the_room_keyed_invariants_holds_on_sampled_reachable_states() -> None:
    # The formulas kind reads over the encoding agree with the explorer's on the spec's states
    # (the encoding keeps a write with its writer, which under room-keyed matching may hold
    # another request's grant).
    variant = get_variant("room_keyed_with_binding")
    config = parse_set(Config(), SHARED_ROOM)
    enc = Encoding(variant, config, width=None)
    invs = fixed_invariants(enc)
    request_keyed = next(i for i in INVARIANTS if i.name == "prefill_holds_decodes_generation")
    taken = 0
    states = build_graph(variant, config)[0].states
    for state in states[:: max(1, len(states) // 60)]:
        s = constants(enc, enc.abstract(state))
        for name, f in invs.items():
            assert z3.is_true(z3.simplify(f(s))), name
        taken += not request_keyed.holds(config, state, variant.design)
    # The sample has states where prefill holds another request's grant.
    assert taken > 0


def test_a_wrong_room_keyed_clause_is_named_with_its_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # Planted: the request-keyed claim ("prefill's grant is decode's grant for that request")
    # under the room-keyed invariant's name. The explorer evaluates it on every state.
    wrong = Invariant(
        "prefill_holds_a_generation_of_its_room",
        "planted: prefill's grant is decode's grant for the same request",
        forall(REQ, lambda r: Implies(p_gen(r) != 0, p_gen(r) == d_gen(r))),
    )
    planted = dict(ROOM_KEYED_INVARIANTS, prefill_holds_decodes_generation=wrong)
    monkeypatch.setattr(spec_invariants, "ROOM_KEYED_INVARIANTS", planted)
    variant = get_variant("room_keyed_with_binding")
    result = explore(variant, parse_set(Config(), SHARED_ROOM), invariants=True)
    failing = result.extra["invariants"]["failing"]
    assert list(failing) == ["prefill_holds_a_generation_of_its_room"]
    assert failing["prefill_holds_a_generation_of_its_room"]["depth"] > 0


def test_kind_proves_every_safety_property_of_room_keyed_with_binding() -> None:
    result = kinduction(get_variant("room_keyed_with_binding"), Config())
    assert result.verdict == "safe", result.extra.get("cti")
    assert {r.property: r.verdict for r in result.results if r.property in SAFETY} == dict.fromkeys(
        SAFETY, "holds"
    )
    assert result.extra["k"] == 1


def test_kind_needs_decode_s_own_progress_under_room_keyed_matching() -> None:
    # Without `decode_reads_only_what_it_validated` (request-keyed matching gets it from prefill's
    # progress), a request prefill completed under another's grant may have been read before
    # decode reserved it: not inductive, and no real counterexample.
    variant = get_variant("room_keyed_with_binding")
    enc = Encoding(variant, Config(), width=None)
    weak = dict(fixed_invariants(enc))
    del weak["decode_reads_only_what_it_validated"]
    result = kinduction(variant, Config(), depth=1, invariants=weak, fallback_depth=4)
    assert result.verdict == "unknown"
    assert result.extra["cti"]["action"] == "decode_reserve_pages"


def test_room_keyed_with_binding_lets_prefill_write_for_a_request_decode_refused() -> None:
    # Why the any-size proof cannot give `rejected_request_gets_error_not_output`: in a scenario
    # where decode admits less than prefill, prefill takes request 0's grant for request 1, which
    # decode refused, and writes under it (decode's binding refuses the write: nothing leaks, but
    # the property's "prefill writes nothing for it" is broken). The reference matches the grant
    # by request id and keeps it.
    config = parse_set(Config(), DECODE_REFUSES_WHAT_PREFILL_ADMITS)
    room = explore(get_variant("room_keyed_with_binding"), config)
    broken = room.result_for("rejected_request_gets_error_not_output")
    assert broken.verdict == "violated" and broken.depth == 10
    assert all(room.result_for(p).verdict == "holds" for p in SAFETY if p != broken.property)
    assert explore(REFERENCE, config).result_for(broken.property).verdict == "holds"


TWO_DECODES_SHARING_A_ROOM = [
    "decode_instances=2",
    "decode_pages=4",
    "placement=fixed",
    "max_crashes=0",
    "requests=a:2:1:0/0,b:2:1:0/1",
]
"""Two requests on one room and one prefill instance, each on its own decode instance: a's
prefill can take the grant b's decode instance made (tests/spec/test_instances.py)."""


def test_prove_proves_room_keyed_with_binding_for_any_size_but_one_property() -> None:
    # The any-size proof takes six of the seven safety properties, for any number of instances;
    # the seventh holds for the configuration and not for every size (below), and is proved on
    # the configuration alone (about 45 s: both proofs).
    config = parse_set(Config(), TWO_DECODES_SHARING_A_ROOM)
    result = prove(get_variant("room_keyed_with_binding"), config, timeout=60)
    assert result.verdict == "safe"
    scopes = {r.property: r.scope for r in result.results if r.verdict == "holds"}
    assert set(scopes) == set(SAFETY)
    narrow = "rejected_request_gets_error_not_output"
    assert scopes.pop(narrow) == "fixed-config"
    assert set(scopes.values()) == {"any-size"}
    assert result.extra["obligations_scope"] == "any-size"
    assert "any_size_instances" not in result.extra
    fixed = result.extra["fixed_config_proof"]
    assert fixed["obligations_proved"] == fixed["obligations_total"] and narrow in fixed["proved"]
    # The result as a whole covers the narrower scope, and names what is wider.
    assert result.scope == "fixed-config"
    assert sorted(result.extra["any_size_properties"]) == sorted(scopes)
    assert result.scope_text().startswith("this configuration (")
    assert "no_cross_tenant_read" in result.scope_text().split(";")[-1]


def test_room_keyed_designs_with_several_instances_go_to_the_any_size_model() -> None:
    from kvhandoff.model_checker.prove import _derived_why_not

    several = parse_set(Config(), ["decode_instances=2", "decode_pages=4"])
    for variant in ("room_keyed_with_binding", "room_keyed_matching", "reference"):
        assert _derived_why_not(get_variant(variant), Config()) is None
        assert _derived_why_not(get_variant(variant), several) is None


def test_the_scope_of_an_any_size_proof_counts_instances() -> None:
    from kvhandoff.model_checker.result import CheckResult

    text = CheckResult("v", "prove", Config(), [], extra={"scope": "any-size"}).scope_text()
    assert "faults and instances" in text and "one prefill" not in text
    retries = replace(Config(), max_retries=1)
    text = CheckResult("v", "prove", retries, [], extra={"scope": "any-size"}).scope_text()
    assert "instances and client retries)" in text


ROOM_CLAIMS = {
    "prefill_holds_a_generation_of_its_room",
    "messages_carry_a_generation_of_their_room",
    "writes_carry_a_grant_of_their_room",
}


def test_the_room_claims_are_inductive_with_free_instances_under_decode_reserve_pages() -> None:
    # Where they were not (docs/z3.md, "The any-size model"): a decode instance issuing a
    # generation another instance already issued on the same room. Instances are free in the
    # any-size model, so this covers any number of them.
    variant = get_variant("room_keyed_with_binding")
    obligations = z3_derived.prove_derived(
        variant.design, timeout=30, variant=variant, names=["decode_reserve_pages"]
    )
    checked = {o.invariant for o in obligations if o.kind == "consecution"}
    assert checked >= ROOM_CLAIMS
    assert {o.verdict for o in obligations} == {"proved"}


def test_a_stale_write_is_told_by_its_instance_as_well_as_its_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Telling a retried request's earlier write by its generation alone, as with one decode
    # instance, is not inductive with several: the request's own decode instance can issue the
    # generation another instance issued for the earlier attempt (a counterexample to induction;
    # the solver finds it or gives up, and never proves the claim).
    from kvhandoff.spec.logic import And
    from kvhandoff.spec.vocabulary import attempt

    def generation_only(w: Any) -> Any:
        return And(attempt(w.req) > 0, w.gen != d_gen(w.req))

    monkeypatch.setattr(spec_invariants, "_stale_write_of_room", generation_only)
    old = spec_invariants.writes_carry_their_grant(room_keyed=True)
    variant = get_variant("room_keyed_with_binding")
    obligations = z3_derived.prove_derived(
        variant.design,
        timeout=5,
        variant=variant,
        names=["decode_reserve_pages"],
        weaken={"writes_carry_a_grant_of_their_room": lambda m, v, t: m.tr(old, v, t, {})},
    )
    verdicts = {
        o.verdict
        for o in obligations
        if o.kind == "consecution" and o.invariant == "writes_carry_a_grant_of_their_room"
    }
    assert verdicts and "proved" not in verdicts


@pytest.mark.slow
def test_the_any_size_model_proves_six_of_room_keyed_with_binding_s_properties() -> None:
    # About 16 s. Every invariant is inductive any-size; one property is not, and rightly: the
    # any-size model has every scenario at once, including those where it is false (above).
    variant = get_variant("room_keyed_with_binding")
    obligations = z3_derived.prove_derived(variant.design, timeout=60, variant=variant)
    assert "unknown" not in {o.verdict for o in obligations}
    failed = {o.invariant for o in obligations if o.verdict == "failed"}
    assert failed == {"rejected_request_gets_error_not_output"}


@pytest.mark.slow
def test_room_keyed_matching_is_still_violated_by_kind_and_prove() -> None:
    variant = get_variant("room_keyed_matching")
    for result in (kinduction(variant, Config()), prove(variant, Config(), timeout=60)):
        assert result.result_for("no_cross_tenant_read").verdict == "violated", result.engine


def test_the_room_keyed_invariants_change_nothing_for_request_keyed_designs() -> None:
    unbound = replace(REFERENCE, design=replace(REFERENCE.design, binds_request=False))
    assert invariants_for(unbound.design) == INVARIANTS


def test_the_room_keyed_invariants_hold_with_a_retry_on_a_shared_room() -> None:
    """A retried request's earlier grant, completion and writes: under room-keyed matching the
    attempt does not fence them at prefill (grants are matched by room), so they name a
    generation decode issued on the room, not a retired one, and a write's generation does not
    tell an earlier attempt's from the current one's. Before the room-keyed claims said so,
    `messages_carry_a_generation_of_their_room` failed at depth 6 here (a first attempt's grant
    still on the wire after the retry) and `writes_carry_their_grant` at depth 19."""
    config = parse_set(Config(), [*SHARED_ROOM, "max_retries=1"])
    result = explore(get_variant("room_keyed_with_binding"), config, invariants=True)
    assert result.extra["invariants"]["failing"] == {}


def test_kind_proves_room_keyed_matching_with_binding_with_a_retry() -> None:
    config = parse_set(Config(), [*SHARED_ROOM, "max_retries=1"])
    assert kinduction(get_variant("room_keyed_with_binding"), config).verdict == "safe"
