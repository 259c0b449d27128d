"""BMC finds the explorer's shortest counterexamples, replayed through the spec."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from kvhandoff.model_checker.explore import explore
from kvhandoff.model_checker.z3_encoding import Encoding, EncodingError
from kvhandoff.model_checker.z3_engines import bmc, replay_counterexample
from kvhandoff.spec.config import Config
from kvhandoff.spec.properties import ALWAYS
from kvhandoff.spec.trace import replay
from kvhandoff.spec.variants import REFERENCE, get_variant
from tests.model_checker.small import SMALL


def test_bmc_finds_the_incident_counterexamples_with_the_explorers_lengths() -> None:
    started = time.perf_counter()
    result = bmc(get_variant("incident"), Config(), depth=12)
    seconds = time.perf_counter() - started
    depths = {r.property: r.depth for r in result.violated()}
    assert depths["decode_reads_only_validated_pages"] == 12
    assert depths["accepted_completion_implies_full_coverage"] == 11
    assert depths["rejected_request_gets_error_not_output"] == 8
    assert depths["freed_pages_hold_no_readable_data"] == 8
    assert seconds < 30  # about 2 s on an idle 2-core machine; generous for shared CI


@pytest.mark.parametrize(
    ("name", "depth"),
    [
        ("incident", 12),
        ("m13_lease_expiry_pull", 13),
        ("m14_silent_receive_failure_pull", 13),
    ],
)
def test_bmc_counterexamples_are_as_short_as_the_explorers_on_the_default_config(
    name: str, depth: int
) -> None:
    """Same lengths as the explorer's shortest, property by property, within BMC's bound (the
    pull variants exercise the pull encoders: lease expiry, read-time data, failed reads)."""
    variant = get_variant(name)
    by_explorer = {r.property: r.depth for r in explore(variant, Config()).violated()}
    by_bmc = {r.property: r.depth for r in bmc(variant, Config(), depth=depth).violated()}
    expected = {
        prop: d
        for prop, d in by_explorer.items()
        if prop != "every_request_terminates" and d is not None and d <= depth
    }
    assert expected and by_bmc == expected
    assert set(variant.breaks) & set(by_bmc)


def test_every_bmc_counterexample_replays_to_its_violation() -> None:
    result = bmc(get_variant("incident"), Config(), depth=12)
    for r in result.violated():
        assert r.trace is not None
        final = replay(get_variant("incident"), Config(), r.trace)[-1]
        prop = next(p for p in ALWAYS if p.name == r.property)
        assert not prop.holds(Config(), final)


def test_bmc_reports_the_reference_bounded_up_to_its_depth_not_proved() -> None:
    result = bmc(REFERENCE, Config(), depth=6)
    assert result.verdict == "bounded" and result.exit_code == 3
    assert result.scope == "bounded"
    assert all(r.verdict == "bounded" and r.depth == 6 for r in result.results)
    assert all("no violation up to depth 6" in r.detail for r in result.results)
    assert "every_request_terminates" in result.extra["not_checked"]
    assert all(r.property != "every_request_terminates" for r in result.results)


def test_a_decoded_trace_that_does_not_replay_raises() -> None:
    """A model whose path the spec does not take is an encoder bug, never a verdict."""
    import z3

    enc = Encoding(get_variant("incident"), Config())
    solver = z3.SolverFor("QF_BV")
    solver.add(enc.init(enc.state_at(0)))
    solver.add(enc.trans_at(0))
    assert solver.check() == z3.sat
    model = solver.model()
    # Claim a property fails after one step: the replayed state satisfies it, so this raises.
    with pytest.raises(EncodingError):
        replay_counterexample(enc, model, 1, ["decode_reads_only_validated_pages"])


@pytest.mark.parametrize("name", ["m7_release_before_drain", "generation_reset_on_restart"])
def test_bmc_and_explorer_agree_on_shortest_lengths_on_a_small_config(name: str) -> None:
    variant = get_variant(name)
    by_explorer = {r.property: r.depth for r in explore(variant, SMALL).violated()}
    by_bmc = {r.property: r.depth for r in bmc(variant, SMALL, depth=14).violated()}
    for prop, depth in by_bmc.items():
        assert by_explorer[prop] == depth
    for prop, depth in by_explorer.items():
        if prop != "every_request_terminates" and depth is not None and depth <= 14:
            assert by_bmc[prop] == depth


def test_a_bit_vector_width_too_narrow_for_the_values_is_detected_not_silently_wrapped() -> None:
    from kvhandoff.model_checker.z3_engines import _bmc, _WidthTooSmall

    with pytest.raises(_WidthTooSmall):  # phases go up to 10
        enc = Encoding(get_variant("incident"), Config(), width=3)
        _bmc(enc, 3, None, False, time.perf_counter(), narrowed=False)
    assert bmc(get_variant("incident"), Config(), depth=3).extra["bitvector_width"] == 5


def test_the_range_check_uses_intervals_when_they_suffice_and_the_solver_when_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step bounds keep every counter within 5 bits at 20 steps (a counter grows only as
    often as the instances adding to it can fire), so BMC narrows at 5 bits; where they do not
    show the ranges, the solver must (and does, at 5 bits)."""
    from kvhandoff.model_checker.z3_engines import _bmc

    deep = bmc(REFERENCE, SMALL, depth=20)
    assert deep.extra["range_check"] == "intervals" and deep.extra["bitvector_width"] == 5
    enc = Encoding(REFERENCE, SMALL, width=5)
    monkeypatch.setattr(enc, "ranges_fit", lambda depth: False)  # as if not shown
    unnarrowed = _bmc(enc, 12, None, False, time.perf_counter(), narrowed=False)
    assert unnarrowed.extra["range_check"] == "solver" and unnarrowed.extra["bitvector_width"] == 5


UNORDERED = replace(SMALL, max_active=2, submit_in_order=False)


@pytest.mark.parametrize(
    ("name", "config", "max_parts"),
    [
        ("incident", SMALL, None),
        ("reference", SMALL, None),
        ("m13_lease_expiry_pull", SMALL, None),
        ("incident", Config(), None),
        ("reference", UNORDERED, None),
        # Past `_MAX_PARTS`, the analysis stops splitting by the router's flags mid-way.
        ("reference", UNORDERED, 6),
    ],
)
def test_the_step_bounds_hold_every_value_the_explorer_reaches_within_as_many_steps(
    name: str, config: Config, max_parts: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Encoding.narrow` gives step t's variables just the bits of their step-t intervals (a Bool
    that cannot be true yet is False): sound only if every state reachable within t steps has its
    values inside them."""
    from kvhandoff.model_checker import z3_bounds
    from kvhandoff.model_checker.explore import build_graph

    if max_parts is not None:
        monkeypatch.setattr(z3_bounds, "_MAX_PARTS", max_parts)
    variant = get_variant(name)
    graph, _, _ = build_graph(variant, config)
    enc = Encoding(variant, config, width=7)
    depth = 12
    steps = enc.intervals(depth)
    assert steps is not None and len(steps) == depth + 1
    checked = 0
    for state, d in zip(graph.states, graph.depth_of, strict=True):
        if d > depth:
            continue
        values = enc.abstract(state)
        for t in range(d, depth + 1):
            for n, _ in enc.fields:
                lo, hi = steps[t][n]
                assert lo <= int(values[n]) <= hi, (n, t, values[n], steps[t][n])
        checked += 1
    assert checked > 100
    # The intervals are per step: the first steps need fewer bits than the last.
    width = [sum(hi.bit_length() for lo, hi in steps[t].values() if lo != hi) for t in (1, depth)]
    assert width[0] < width[1]


def test_the_step_bounds_know_when_the_router_can_submit_a_request() -> None:
    """Split by the router's flags (`submitted`, `ans_set`), the bounds relate a request's fields
    to the others': with one request active at a time, in order, the third one waits for both
    others to be answered, which takes more than 10 steps with one fault at most (the explorer
    says more than 12); without the split, non-relational bounds let it in at step 6."""
    enc = Encoding(get_variant("incident"), Config(), width=5)
    steps = enc.intervals(12)
    assert steps is not None
    assert all(steps[t]["r2.submitted"] == (0, 0) for t in range(11))
    assert all(steps[t]["r2.p"] == steps[t]["r2.d"] == (0, 0) for t in range(11))


def test_the_interval_analysis_rejects_a_width_too_narrow() -> None:
    assert Encoding(get_variant("incident"), Config(), width=5).ranges_fit(12)
    assert not Encoding(get_variant("incident"), Config(), width=3).ranges_fit(3)


def test_a_deep_path_decodes_like_one_eval_per_variable() -> None:
    """`path_values` packs a step into one number; a 20-step path of the default configuration
    (thousands of digits if packed whole) must decode exactly like `values`."""
    import z3

    enc = Encoding(get_variant("incident"), Config())
    solver = z3.SolverFor("QF_BV")
    solver.add(enc.init(enc.state_at(0)))
    for t in range(20):
        solver.add(enc.trans_at(t))
    assert solver.check() == z3.sat
    model = solver.model()
    assert enc.path_values(model, 20) == [enc.values(model, enc.state_at(t)) for t in range(21)]
