"""Several prefill and decode instances (`Config.prefill_instances`, `Config.decode_instances`).

Each request is placed on one prefill and one decode instance; each decode instance grants pages
of its own pool under its own generation counter, and every message names the decode instance
at its decode end (spec/state.py, "Instances"). The explorer and the fixed-configuration Z3
encoding (bmc, spacer, k-induction) check them, a router that places as it likes as every fixed
placement, and the any-size `prove` any number of them; the conformance targets refuse, with
the reason. A crash restarts one instance, and a partition cuts one decode instance off one
prefill instance. With one instance of each nothing changes.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from kvhandoff.cli.main import main
from kvhandoff.conformance.target import UnsupportedScenario, require_one_prefill_rank
from kvhandoff.model_checker.engines import ENGINES, EngineOptions, run_engine
from kvhandoff.model_checker.explore import StateGraph, build_graph, explore
from kvhandoff.model_checker.result import CheckResult
from kvhandoff.model_checker.z3_crosscheck import accepted_non_edges, edge_mismatches
from kvhandoff.spec import Config, get_variant
from kvhandoff.spec.actions import (
    DecodeAdmitRequest,
    DecodeReservePages,
    DecodeRestart,
    DecodeSuspectPrefillDead,
    DecodeWaitingTimeout,
    PrefillDetectDecodeRestart,
    PrefillReceiveAbort,
    PrefillRestart,
    PrefillSendAbortAck,
    RouterSubmitRequest,
    action_from_json,
    action_name,
    action_to_json,
)
from kvhandoff.spec.config import ConfigError, parse_set, placements
from kvhandoff.spec.machine import checked_step, enabled, init
from kvhandoff.spec.state import State, evolve
from kvhandoff.spec.trace import replay
from tests.explored import SMALL

TWO_BY_TWO = ["prefill_instances=2", "decode_instances=2", "max_crashes=0", "decode_pages=4"]
"""Two of each, two pages each, no restarts (kept small; restarts are checked below)."""


RESTARTS = ["max_crashes=1", "max_partitions=1"]
"""A crash (of any one instance) and a partition (between any decode and prefill instance)."""


def _fixed(requests: str) -> Config:
    return parse_set(Config(), [*TWO_BY_TWO, "placement=fixed", f"requests={requests}"])


@cache
def _graph(variant: str, requests: str) -> StateGraph:
    return build_graph(get_variant(variant), _fixed(requests))[0]


@cache
def _explored(variant: str, requests: str) -> CheckResult:
    return explore(get_variant(variant), _fixed(requests))


# --- the configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("assignments", "message"),
    [
        (["prefill_instances=0"], "prefill_instances must be an integer from 1 to 3"),
        (["prefill_instances=4"], "prefill_instances must be an integer from 1 to 3"),
        (["decode_instances=-1"], "decode_instances must be an integer from 1 to 3"),
        (["decode_instances=3", "decode_pages=2"], "decode_pages=2 is fewer than"),
        (["placement=some"], "placement must be one of any, fixed, got 'some'"),
        (
            [*TWO_BY_TWO, "placement=fixed", "requests=a:2:1:0/2"],
            "request 0: decode_instance must be an instance from 0 to 1",
        ),
        (
            [*TWO_BY_TWO, "requests=a:2:1:1/0"],
            "request 0: prefill_instance=1 under placement=any",
        ),
        (["requests=a:2:1:x"], "the placement must be P/D"),
        (["requests=a:2:1:0/0:3"], "expected TENANT:PAGES:ROOM (or TENANT:PAGES:ROOM:P/D"),
    ],
)
def test_bad_instance_settings_are_refused_naming_the_values(
    assignments: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_set(Config(), assignments)
    assert message in str(caught.value)


def test_instances_split_the_pool_in_blocks_and_placements_read_from_set() -> None:
    config = _fixed("a:2:1:0/1,b:1:2:1/0")
    assert [config.page_instance(q) for q in range(4)] == [0, 0, 1, 1]
    assert [(r.prefill_instance, r.decode_instance) for r in config.requests] == [(0, 1), (1, 0)]
    three = parse_set(Config(), ["decode_instances=3", "decode_pages=3", "max_crashes=0"])
    assert [three.page_instance(q) for q in range(3)] == [0, 1, 2]
    assert Config.from_json(config.to_json()) == config


def test_json_names_instances_and_placements_only_where_they_are_not_the_default() -> None:
    """Every config written before instances existed reads and writes the same."""
    plain = Config().to_json()
    assert not {"prefill_instances", "decode_instances", "placement"} & set(plain)
    assert all(set(r) == {"tenant", "pages", "room"} for r in plain["requests"])
    assert Config.from_json(plain) == Config()
    placed = _fixed("a:2:1:0/1,b:1:2").to_json()
    assert placed["placement"] == "fixed"
    assert placed["requests"][0] == {"tenant": "a", "pages": 2, "room": 1, "decode_instance": 1}
    assert placed["requests"][1] == {"tenant": "b", "pages": 1, "room": 2}


def test_a_router_that_places_as_it_likes_is_every_placement_up_to_renaming() -> None:
    """Two requests on two prefill and two decode instances of equal pools: the first request
    on instance 0 of each (renaming), the second anywhere: four placements. Pools of different
    sizes are not interchangeable: all of the decode placements are kept."""
    config = parse_set(Config(), [*TWO_BY_TWO, "requests=a:2:1,b:2:1"])
    got = {
        tuple((r.prefill_instance, r.decode_instance) for r in c.requests)
        for c in placements(config)
    }
    assert got == {((0, 0), (0, 0)), ((0, 0), (0, 1)), ((0, 0), (1, 0)), ((0, 0), (1, 1))}
    uneven = parse_set(config, ["decode_pages=5"])
    decode_choices = {tuple(r.decode_instance for r in c.requests) for c in placements(uneven)}
    assert decode_choices == {(0, 0), (0, 1), (1, 0), (1, 1)}
    assert placements(Config()) == [Config()]
    fixed = _fixed("a:2:1:1/1,b:2:1:0/0")
    assert placements(fixed) == [fixed]


def test_renaming_the_instances_of_a_placement_checks_the_same_system() -> None:
    """What keeping one placement per renaming class rests on: a placement and its renamed
    image have state spaces of the same size and the same verdicts."""
    for a, b in [("0/0", "1/1"), ("0/1", "1/0")]:
        one, other = _fixed(f"a:2:1:0/0,b:2:1:{a}"), _fixed(f"a:2:1:1/1,b:2:1:{b}")
        for variant in ("reference", "room_keyed_matching"):
            x, y = explore(get_variant(variant), one), explore(get_variant(variant), other)
            assert (x.states, x.extra["transitions"]) == (y.states, y.extra["transitions"])
            assert [(r.property, r.verdict, r.depth) for r in x.results] == [
                (r.property, r.verdict, r.depth) for r in y.results
            ]


# --- what the model of several instances does ----------------------------------------------------


def _all_states(variant: str, requests: str) -> list[State]:
    return _graph(variant, requests).states


def test_each_decode_instance_grants_from_its_own_pool() -> None:
    config = _fixed("a:2:1:0/0,b:2:1:0/1")
    states = _all_states("reference", "a:2:1:0/0,b:2:1:0/1")
    held = {(r, q) for s in states for r, req in enumerate(s.requests) for q in req.d_pages}
    assert {q for r, q in held if r == 0} == {0, 1}
    assert {q for r, q in held if r == 1} == {2, 3}
    assert all(config.page_instance(q) == config.requests[r].decode_instance for r, q in held)


def test_two_decode_instances_issue_the_same_generation_on_the_same_room() -> None:
    """Each decode instance counts its own generations: two requests of room 1 on two decode
    instances both hold generation 1, which one decode instance never allows."""
    states = _all_states("reference", "a:2:1:0/0,b:2:1:0/1")
    assert any(s.requests[0].d_gen == s.requests[1].d_gen == 1 for s in states)
    assert any(s.next_generation == 2 and s.next_generations == (2,) for s in states)
    one = build_graph(get_variant("reference"), parse_set(Config(), ["requests=a:2:1,b:2:1"]))
    assert not any(s.requests[0].d_gen == s.requests[1].d_gen != 0 for s in one[0].states), (
        "one decode instance never issues a generation twice"
    )


def test_messages_reach_only_the_instance_they_are_addressed_to() -> None:
    """Every message names the decode instance at its decode end, and with both requests of
    room 1 holding generation 1 on different decode instances, no completion or failure made
    for one request's transfer ever validates or fails the other (their data never mixes)."""
    config = _fixed("a:2:1:0/0,b:2:1:0/1")
    states = _all_states("reference", "a:2:1:0/0,b:2:1:0/1")
    for s in states:
        for m in s.network + s.lost:
            assert m.dinst == config.requests[m.request].decode_instance
    result = _explored("reference", "a:2:1:0/0,b:2:1:0/1")
    assert result.verdict == "safe"
    assert result.witnesses["can_complete_handoff"]


def test_room_keyed_matching_crosses_decode_instances_where_prefill_is_shared() -> None:
    """SGLang-style room-keyed matching at one prefill instance: a's prefill may take the grant
    b's decode instance made (same room), and without the binding decode generates for b from
    a's data. With the requests on different prefill instances they never meet."""
    shared = _explored("room_keyed_matching", "a:2:1:0/0,b:2:1:0/1")
    assert shared.verdict == "violated"
    broken = {r.property for r in shared.results if r.verdict == "violated"}
    assert "no_cross_tenant_read" in broken
    trace = next(r.trace for r in shared.results if r.property == "no_cross_tenant_read")
    assert trace is not None
    final = replay(get_variant("room_keyed_matching"), _fixed("a:2:1:0/0,b:2:1:0/1"), trace)[-1]
    # The grant a's prefill took names pages of b's decode instance (pages 2 and 3).
    assert set(final.requests[0].p_pages) <= {2, 3}
    apart = _explored("room_keyed_matching", "a:2:1:0/0,b:2:1:1/1")
    assert apart.verdict == "safe"


def test_a_drain_ack_to_a_second_decode_instance_replays() -> None:
    """A trace step acknowledging decode instance 1's abort is enabled when a trace is replayed
    or a step checked (`is_enabled` asks the drain-ack guard alone), as it is in `enabled`.
    (It was not: that guard listed every ack as decode instance 0's, so a bmc or kind path
    with one, found by the Z3 witness check, failed to replay.)"""
    config = parse_set(
        Config(), [*SMALL, *TWO_BY_TWO, "placement=fixed", "requests=a:1:1:0/1,b:2:2:1/0"]
    )
    variant = get_variant("one_sided_fenced")
    state = init(config)
    for action in (
        RouterSubmitRequest(0),
        DecodeAdmitRequest(0),
        DecodeReservePages(0),
        DecodeWaitingTimeout(0),
    ):
        state = checked_step(variant, config, state, action)
    (abort,) = [m for m in state.network if m.kind == "abort"]
    state = checked_step(variant, config, state, PrefillReceiveAbort(abort))
    ack = PrefillSendAbortAck(room=1, generation=1, rank=0, dinst=1)
    assert ack in enabled(variant, config, state)
    after = checked_step(variant, config, state, ack)
    assert not after.pending_acks


def test_a_drain_ack_names_the_decode_instance_its_abort_came_from() -> None:
    """Two decode instances abort the same (room 1, generation 1), each its own grant, and
    prefill owes both drain acks. The ack (`PrefillSendAbortAck`) names the decode instance as
    well as the room and generation, so the drain of b's (no) writes is never taken for the drain
    of a's: a's pages wait for a's own ack. (Named by room and generation alone, the step that
    acknowledged b's abort acknowledged a's, and a late write of a's landed in a freed page:
    `one_sided_fenced` broke `no_late_write_lands_in_reallocated_page` in 18 steps.)"""
    config = parse_set(
        Config(),
        [
            *TWO_BY_TWO,
            "decode_pages=6",
            "placement=fixed",
            "requests=a:2:1:0/0,b:3:1:0/1",
            "max_active=2",
            "max_faults=2",
            "max_drops=0",
            "max_duplicates=0",
            "max_prefill_aborts=0",
        ],
    )
    variant = get_variant("one_sided_fenced")
    graph = build_graph(variant, config)[0]
    both = [s for s in graph.states if len({a[2] for a in s.pending_acks if a[:2] == (1, 1)}) == 2]
    assert both, "the scenario reaches two acks owed for one (room, generation)"
    acks = {
        action
        for s in both
        for action in enabled(variant, config, s)
        if isinstance(action, PrefillSendAbortAck)
    }
    assert {a.dinst for a in acks} == {0, 1}
    assert explore(variant, config).verdict == "safe"


def test_any_placement_reports_the_violating_placement_and_its_config() -> None:
    config = parse_set(Config(), [*TWO_BY_TWO, "requests=a:2:1,b:2:1"])
    result = explore(get_variant("room_keyed_matching"), config)
    assert result.verdict == "violated"
    assert result.config.placement == "fixed"  # the placement the counterexample replays on
    verdicts = {p["placement"]: p["verdict"] for p in result.extra["placements"]}
    assert len(verdicts) == 4
    assert verdicts["0:a:p0/d0, 1:b:p1/d1"] == "safe"
    assert verdicts["0:a:p0/d0, 1:b:p0/d1"] == "violated"
    for r in result.results:
        if r.trace is not None:
            replay(get_variant("room_keyed_matching"), result.config, r.trace)
    safe = explore(get_variant("reference"), config)
    assert safe.verdict == "safe"
    assert safe.config == config
    assert safe.states == sum(p["states"] for p in safe.extra["placements"])


# --- who checks several instances ----------------------------------------------------------------


def test_one_instance_is_every_checker_s_and_keeps_the_small_state_space() -> None:
    config = parse_set(Config(), SMALL)
    explicit = parse_set(config, ["prefill_instances=1", "decode_instances=1"])
    assert explicit == config
    # As on main before instances (every state: the explorer's reduction off).
    assert explore(get_variant("reference"), config, reduce=False).states == 5040


def test_prove_proves_the_reference_any_size_on_several_instances(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The any-size model reads where requests are placed and whose pool a page is in as free
    functions (any number of instances, any placement, any split of the pool): one proof for
    every placement of the scenario, scoped so, and made once."""
    config = parse_set(
        Config(),
        [*SMALL, "decode_pages=4", "prefill_instances=2", "decode_instances=2", "max_crashes=0"],
    )
    proofs: list[Config] = []
    prove = ENGINES["prove"]

    def counted(variant: Any, config: Config, options: EngineOptions) -> CheckResult:
        proofs.append(config)
        return prove(variant, config, options)

    monkeypatch.setitem(ENGINES, "prove", counted)
    run = run_engine("prove", get_variant("reference"), config, EngineOptions(timeout=120))
    assert len(proofs) == 1
    assert run.result is not None
    assert run.result.verdict == "safe"
    assert run.result.scope == "any-size"
    assert "instances" in run.result.scope_text()
    assert "any_size_unavailable" not in run.result.extra
    extra = run.result.extra
    assert extra["obligations_proved"] == extra["obligations_total"]
    assert len(extra["placements"]) == 4


def test_the_any_size_proof_leans_on_grants_staying_on_their_instance() -> None:
    """The instances are no constants of the any-size model: without the claim that a grant's
    pages are one instance's, prefill could count its writes to one instance and send its
    completion while one to another is in flight, and the proof says so."""
    from kvhandoff.model_checker import z3_derived
    from kvhandoff.spec import REFERENCE

    obligations = z3_derived.prove_derived(
        REFERENCE.design,
        timeout=30,
        weaken={"grants_stay_on_their_instance": lambda model, view, tag: True},
    )
    failed = {(o.invariant, o.action) for o in obligations if o.verdict == "failed"}
    assert ("writes_carry_their_grant", "prefill_send_completion") in failed


def test_prove_proves_the_reference_with_two_requests_on_two_decode_instances() -> None:
    """Both decode instances grant generation 1 on their own: the claim that generations are
    unique is one decode instance's (`generations_are_unique`), and the any-size proof covers
    this placement with the rest."""
    config = parse_set(
        Config(),
        [
            *SMALL,
            "decode_pages=4",
            "decode_instances=2",
            "max_crashes=0",
            "placement=fixed",
            "requests=a:1:1:0/0,b:2:2:0/1",
        ],
    )
    run = run_engine("prove", get_variant("reference"), config, EngineOptions(timeout=120))
    assert run.result is not None
    assert run.result.verdict == "safe"
    assert run.result.scope == "any-size"


SHARED_ROOM = "a:1:1:0/0,b:1:1:0/1"
"""Two one-page requests on one prefill instance and room 1, on two decode instances: each
decode instance grants its request generation 1 of room 1, so (room, generation) names two
grants, the configuration where room-keyed matching crosses instances."""


def _two_decode_instances(requests: str) -> Config:
    return parse_set(
        Config(),
        [
            "decode_pages=2",
            "decode_instances=2",
            "max_crashes=0",
            "max_active=2",
            "placement=fixed",
            f"requests={requests}",
        ],
    )


@pytest.mark.parametrize("variant", ["reference", "room_keyed_with_binding"])
def test_kind_proves_designs_with_two_decode_instances_issuing_the_same_generation(
    variant: str,
) -> None:
    """The proof's invariants speak of several decode instances (each its own generation
    counter; a grant's pages one instance's, `grants_stay_on_their_instance`): k-induction
    proves the request-keyed reference and the room-keyed design with decode's binding where
    two decode instances grant the same (room, generation) to requests sharing a prefill."""
    config = _two_decode_instances(SHARED_ROOM)
    run = run_engine("kind", get_variant(variant), config, EngineOptions(timeout=120))
    assert run.result is not None, run.cannot_encode
    assert run.result.verdict == "safe", [
        (p.property, p.verdict, p.detail) for p in run.result.results
    ]


def test_kind_does_not_prove_room_keyed_matching_across_decode_instances() -> None:
    """Without the binding the same invariants cannot make it safe: it is not (the explorer's
    14-step counterexample, `test_room_keyed_matching_crosses_decode_instances...`)."""
    config = _two_decode_instances(SHARED_ROOM)
    run = run_engine("kind", get_variant("room_keyed_matching"), config, EngineOptions(timeout=120))
    assert run.result is not None
    assert run.result.verdict != "safe"


def test_the_invariants_hold_on_every_state_of_two_decode_instances() -> None:
    """`--invariants` takes several decode instances: on every reachable state of each
    placement of the small scenario on two decode instances, every invariant holds (and the
    properties' formulas agree with their Python functions)."""
    config = parse_set(Config(), [*SMALL, "decode_pages=4", "decode_instances=2", "max_crashes=0"])
    run = run_engine("explore", get_variant("reference"), config, EngineOptions(invariants=True))
    assert run.result is not None
    assert len(run.result.extra["placements"]) == 2
    checked = run.result.extra["invariants"]
    assert "grants_stay_on_their_instance" in checked["checked"]
    assert checked["failing"] == {}


def test_a_grant_over_two_instances_pools_breaks_its_invariant() -> None:
    """`grants_stay_on_their_instance` can fail: prefill holding pages of both decode
    instances' pools for one request (which no rule makes) is caught."""
    from kvhandoff.spec.invariants import INVARIANTS

    invariant = next(i for i in INVARIANTS if i.name == "grants_stay_on_their_instance")
    config = _two_decode_instances(SHARED_ROOM)
    graph = build_graph(get_variant("reference"), config)[0]
    held = [s for s in graph.states if s.requests[0].p_pages]
    assert held and all(invariant.holds(config, s) for s in graph.states)
    state = held[0]
    spread = evolve(state.requests[0], p_pages=(0, 1))  # page 0 is d0's, page 1 d1's
    broken = evolve(state, requests=(spread, *state.requests[1:]))
    assert not invariant.holds(config, broken)


def test_two_prefill_ranks_on_each_of_two_prefill_instances() -> None:
    """Ranks and instances together: each prefill instance's ranks write their own shards and
    acknowledge their own drains. On every placement the proof's invariants hold on every state
    of the reference, and the first-rank bug is still caught by the property it names."""
    config = parse_set(
        Config(), [*SMALL, "prefill_instances=2", "max_crashes=0", "prefill_ranks=2"]
    )
    run = run_engine("explore", get_variant("reference"), config, EngineOptions(invariants=True))
    assert run.result is not None and run.result.verdict == "safe"
    assert len(run.result.extra["placements"]) == 2
    assert run.result.extra["invariants"]["failing"] == {}
    bug = run_engine(
        "explore", get_variant("first_rank_completion_accepted"), config, EngineOptions()
    )
    assert bug.result is not None and bug.result.verdict == "violated"
    violated = {r.property for r in bug.result.violated()}
    assert "accepted_completion_implies_full_coverage" in violated


@pytest.mark.slow
def test_kind_proves_the_reference_with_two_ranks_on_two_instances_of_each() -> None:
    config = parse_set(
        Config(), [*SMALL, *TWO_BY_TWO, "decode_pages=2", "max_faults=1", "prefill_ranks=2"]
    )
    run = run_engine("kind", get_variant("reference"), config, EngineOptions(timeout=300))
    assert run.result is not None
    assert run.result.verdict == "safe"
    assert {p["verdict"] for p in run.result.extra["placements"]} == {"safe"}


def test_kind_proves_the_reference_on_two_prefill_instances_in_every_placement() -> None:
    config = parse_set(Config(), [*SMALL, "prefill_instances=2", "max_crashes=0"])
    run = run_engine("kind", get_variant("reference"), config, EngineOptions(timeout=120))
    assert run.result is not None
    assert run.result.verdict == "safe"
    assert [p["verdict"] for p in run.result.extra["placements"]] == ["safe", "safe"]
    assert run.result.config == config  # the scope is every placement


def test_bmc_finds_the_explorer_s_counterexamples_across_decode_instances() -> None:
    """The Z3 encoding reads the same formulas with several instances: its counterexamples
    have the explorer's lengths, and replay on the spec."""
    requests = "a:2:1:0/0,b:2:1:0/1"
    config = _fixed(requests)
    options = EngineOptions(depth=16, timeout=120)
    run = run_engine("bmc", get_variant("room_keyed_matching"), config, options)
    assert run.result is not None
    explored = _explored("room_keyed_matching", requests)
    for r in run.result.results:
        theirs = explored.result_for(r.property)
        if r.verdict == "violated":
            assert theirs.verdict == "violated" and theirs.depth == r.depth, r.property
            assert r.trace is not None
            replay(get_variant("room_keyed_matching"), config, r.trace)
        elif theirs.verdict == "violated" and r.property != "every_request_terminates":
            assert (theirs.depth or 0) > 16, r.property
    assert {r.property for r in run.result.results if r.verdict == "violated"} >= {
        "no_cross_tenant_read",
        "no_late_write_lands_in_reallocated_page",
    }


@pytest.mark.parametrize(
    ("name", "sets"),
    [
        # Two decode instances issue generation 1 on room 1 to requests sharing a prefill.
        ("reference", ["requests=a:1:1:0/0,b:2:1:0/1"]),
        # Drain acks from two prefill instances to two decode instances, each its own abort.
        ("one_sided_fenced", ["requests=a:1:1:0/1,b:2:1:1/0"]),
        # Two prefill ranks on each of two prefill instances: per-rank acks and completions.
        ("one_sided_fenced", ["requests=a:1:1:0/0,b:2:2:1/1", "prefill_ranks=2"]),
        # A restart or a partition of one instance among several, each worker's own view of
        # each peer's epoch, and a counter reset of one decode instance.
        ("reference", ["requests=a:1:1:0/0,b:2:1:1/1", *RESTARTS]),
        ("one_sided_fenced", ["requests=a:1:1:0/1,b:2:1:1/0", *RESTARTS]),
        ("generation_reset_on_restart", ["requests=a:1:1:0/0,b:2:1:1/1", *RESTARTS]),
    ],
)
def test_z3_takes_exactly_the_explorers_edges_across_instances(name: str, sets: list[str]) -> None:
    """The fixed-configuration encoding (bmc, kind, spacer) against the spec, edge by edge, on
    the states where an instance other than 0 is in play: a message or write addressed to
    it, or its generation counter moved."""
    variant = get_variant(name)
    config = parse_set(
        Config(), [*SMALL, *TWO_BY_TWO, "decode_pages=2", "placement=fixed", "max_faults=1", *sets]
    )
    graph, _, _ = build_graph(variant, config)

    def apart(state: State) -> bool:
        return (
            any(m.dinst for m in state.network)
            or any(w.page >= 1 for w in state.writes)
            or state.next_generations != (1,)
            or any(state.prefill_epochs + state.decode_epochs)
        )

    picks = [s for s in graph.states if apart(s)]
    assert len(picks) > 50
    assert edge_mismatches(variant, config, picks[:: max(1, len(picks) // 25)]) == []
    assert accepted_non_edges(variant, config, picks, samples=3, seed=2) == []


def test_conformance_refuses_several_instances() -> None:
    with pytest.raises(UnsupportedScenario, match="prefill_instances=2"):
        require_one_prefill_rank(parse_set(Config(), ["prefill_instances=2", "max_crashes=0"]))


def test_the_cli_checks_several_instances_with_the_explorer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["check", "--variant", "room_keyed_matching", "--engine", "explore"]
    for value in [*TWO_BY_TWO, "requests=a:2:1,b:2:1"]:
        args += ["--set", value]
    code = main(args)
    out = capsys.readouterr().out
    assert code == 1
    assert "placement" in out
    assert "p0/d1" in out


# --- restarts and partitions of one instance among several --------------------------------------


@cache
def _restart_edges(variant: str, requests: str) -> list[tuple[State, Any, State]]:
    config = parse_set(
        Config(), [*SMALL, *TWO_BY_TWO, "placement=fixed", f"requests={requests}", *RESTARTS]
    )
    graph, _, _ = build_graph(get_variant(variant), config, keep_edges=True)
    assert graph.all_edges is not None
    return [
        (graph.states[i], action, graph.states[j])
        for i, out in enumerate(graph.all_edges)
        for j, action in out
    ]


def _prefill_side(r: Any) -> tuple[Any, ...]:
    return (r.p, r.p_gen, r.p_pages, r.p_wrote, r.p_epoch, r.p_ranks_done, r.p_lease_expired)


@pytest.mark.parametrize(
    ("variant", "requests"),
    [
        ("reference", "a:1:1:0/0,b:2:2:1/1"),  # each request on its own pair of instances
        ("one_sided_fenced", "a:1:1:0/1,b:2:2:1/0"),  # crossed: a fault touches one side of each
    ],
)
def test_a_restart_or_partition_touches_only_its_own_instances(variant: str, requests: str) -> None:
    """On every edge of a two-by-two scenario with a crash and a partition: a prefill restart
    changes only the prefill side of the requests placed on it, and only its epoch; a decode
    restart only the requests and pages of its own pool, and only its epoch; a detection or a
    suspicion by decode instance j of prefill instance i only the requests placed on both.
    Each kind is taken at a nonzero instance somewhere, so none of this is vacuous."""
    config = parse_set(Config(), [*TWO_BY_TWO, "placement=fixed", f"requests={requests}"])
    p_of = [r.prefill_instance for r in config.requests]
    d_of = [r.decode_instance for r in config.requests]
    seen: set[tuple[str, int, int]] = set()
    for before, action, after in _restart_edges(variant, requests):
        name = action_name(action)
        pinst, dinst = getattr(action, "pinst", None), getattr(action, "dinst", None)
        pairs = zip(before.requests, after.requests, strict=True)
        if name == "prefill_restart":
            assert after.prefill_epochs == tuple(
                e + (pinst == i) for i, e in enumerate(before.prefill_epochs, 1)
            )
            for r, (old, new) in enumerate(pairs):
                if p_of[r] != pinst:
                    assert _prefill_side(old) == _prefill_side(new), (action, r)
            assert before.decode_epochs == after.decode_epochs and before.pages == after.pages
        elif name == "decode_restart":
            assert after.decode_epochs == tuple(
                e + (dinst == j) for j, e in enumerate(before.decode_epochs, 1)
            )
            for r, (old, new) in enumerate(pairs):
                if d_of[r] != dinst:
                    assert old == new, (action, r)
            for q, (old_page, new_page) in enumerate(zip(before.pages, after.pages, strict=True)):
                if config.page_instance(q) != dinst:
                    assert old_page == new_page, (action, q)
            assert before.prefill_epochs == after.prefill_epochs
        elif name in ("decode_detect_prefill_restart", "decode_suspect_prefill_dead"):
            for r, (old, new) in enumerate(pairs):
                if (d_of[r], p_of[r]) != (dinst, pinst):
                    assert old == new, (action, r)
        elif name == "prefill_detect_decode_restart":
            for r, (old, new) in enumerate(pairs):
                if p_of[r] != pinst:
                    assert old == new, (action, r)
        else:
            continue
        seen.add((name, pinst or 0, dinst or 0))
    for name in ("prefill_restart", "decode_detect_prefill_restart"):
        assert any(n == name and p for n, p, _ in seen), name
    for name in ("decode_restart", "prefill_detect_decode_restart"):
        assert any(n == name and d for n, _, d in seen), name
    assert any(n == "decode_suspect_prefill_dead" for n, _, _ in seen)


def test_restarts_of_one_instance_read_and_write_as_in_traces() -> None:
    """An instance of 0 is left out of a trace step (one-instance traces read as before); any
    other is written, and read back."""
    assert action_to_json(PrefillRestart()) == {"action": "prefill_restart", "args": {}}
    step = action_to_json(DecodeSuspectPrefillDead(dinst=1, pinst=0))
    assert step == {"action": "decode_suspect_prefill_dead", "args": {"dinst": 1}}
    assert action_from_json(step) == DecodeSuspectPrefillDead(dinst=1)
    for action in (DecodeRestart(dinst=2), PrefillDetectDecodeRestart(pinst=1, dinst=1)):
        assert action_from_json(action_to_json(action)) == action


@pytest.mark.parametrize(
    ("variant", "requests", "caught"),
    [
        ("reference", "a:1:1:0/0,b:2:2:1/1", None),
        ("one_sided_fenced", "a:1:1:0/1,b:2:1:1/0", None),
        # Releasing on suspicion: the suspected prefill is a live writer of another instance.
        (
            "release_on_suspected_death",
            "a:1:1:0/0,b:2:2:1/1",
            "no_late_write_lands_in_reallocated_page",
        ),
        # One decode instance's counter reset by its restart: a late write of a prefill
        # instance's old grant lands in the page the restarted decode granted again.
        (
            "generation_reset_on_restart",
            "a:1:1:0/1,b:2:1:1/1",
            "no_late_write_lands_in_reallocated_page",
        ),
    ],
)
def test_per_instance_faults_keep_the_catalogue_verdicts(
    variant: str, requests: str, caught: str | None
) -> None:
    """Restarts and partitions of one instance among two of each: the safe designs stay safe,
    and the catalogue's restart and partition bugs are still caught."""
    config = parse_set(
        Config(), [*SMALL, *TWO_BY_TWO, "placement=fixed", f"requests={requests}", *RESTARTS]
    )
    result = explore(get_variant(variant), config)
    if caught is None:
        assert result.verdict == "safe", [r for r in result.results if r.verdict != "holds"]
    else:
        assert result.result_for(caught).verdict == "violated"


@pytest.mark.slow
def test_kind_proves_the_reference_with_a_restart_or_partition_of_any_one_instance() -> None:
    """k-induction with the proof's invariants, over restarts and partitions of one instance
    among two of each, in every placement of the small scenario (19 s)."""
    config = parse_set(Config(), [*SMALL, *TWO_BY_TWO, *RESTARTS])
    run = run_engine("kind", get_variant("reference"), config, EngineOptions(timeout=300))
    assert run.result is not None
    assert run.result.verdict == "safe"
    assert [p["verdict"] for p in run.result.extra["placements"]] == ["safe"] * 4


def test_bmc_finds_the_counter_reset_of_one_decode_instance_at_the_explorer_s_length() -> None:
    """The fixed encoding's per-instance restart: bmc's counterexample for the counter reset of
    one decode instance has the explorer's length and replays on the spec."""
    requests = "a:1:1:0/1,b:2:1:1/1"
    config = parse_set(
        Config(), [*SMALL, *TWO_BY_TWO, "placement=fixed", f"requests={requests}", *RESTARTS]
    )
    variant = get_variant("generation_reset_on_restart")
    run = run_engine("bmc", variant, config, EngineOptions(depth=12, timeout=120))
    assert run.result is not None
    found = run.result.result_for("no_late_write_lands_in_reallocated_page")
    assert found.verdict == "violated" and found.trace is not None
    assert found.depth == explore(variant, config).result_for(found.property).depth
    assert any(action_name(a) == "decode_restart" and a.dinst == 1 for a in found.trace)
    replay(variant, config, found.trace)
