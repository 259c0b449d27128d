"""The explorer's reduction (`model_checker/reduction.py`): states that differ only in ghost flags
that only witnesses read are stored once. It must change nothing the explorer reports but the
number of states: every property's verdict, every safety counterexample (action by action),
every witness, the termination bound. Checked here against the full search on every variant of the
differential test (catalogue, examples, overrides, one-option design flips), and each of the
analysis's refusals on its own."""

from __future__ import annotations

import pytest

from kvhandoff.model_checker.explore import explore
from kvhandoff.model_checker.reduction import _pure_flags, erasable_ghost_flags
from kvhandoff.model_checker.result import CheckResult
from kvhandoff.spec.config import Config, parse_set, scenario_config
from kvhandoff.spec.effects import assign, effect
from kvhandoff.spec.logic import And, Or
from kvhandoff.spec.properties import TERMINATION
from kvhandoff.spec.variants import REFERENCE, Variant, get_variant
from kvhandoff.spec.vocabulary import (
    drain_acked,
    not_as_is,
    p,
    page_reuse,
    refused_write,
)
from tests.model_checker.differential import (
    OVERRIDES,
    design_flips,
    every_variant,
)
from tests.model_checker.small import SMALL

SMALL_FAULTY = parse_set(SMALL, ["max_faults=1"])


def _answers(result: CheckResult) -> dict[str, object]:
    """Everything a search reports but its state count (and the depth it searched to, which
    for a property that holds is the depth of the deepest state it stored)."""
    props = {
        r.property: (r.verdict, r.depth if r.verdict == "violated" else None, r.trace)
        for r in result.results
        if r.property != TERMINATION.name
    }
    # Termination's run is the first stuck state or protocol cycle a depth-first walk of the
    # graph meets, not a shortest one: on another graph, another (each is replayed). Its
    # verdict, and the bound where it holds, are the same.
    term = result.result_for(TERMINATION.name)
    props[TERMINATION.name] = (term.verdict, term.depth if term.verdict == "holds" else None, None)
    return {
        "properties": props,
        "witnesses": dict(result.witnesses),
        "response_bound": result.extra.get("response_bound"),
        "complete": result.extra.get("complete"),
    }


def _same_answers(variant: Variant, config: Config) -> tuple[int, int]:
    full = explore(variant, config, reduce=False)
    reduced = explore(variant, config)
    assert _answers(reduced) == _answers(full), variant.name
    assert full.states is not None and reduced.states is not None
    assert reduced.states <= full.states
    assert not full.extra["cleared_flags"]
    return full.states, reduced.states


# The catalogue, examples and overrides here; every one-option design change in `make test-slow`.
ROWS = [
    *(pytest.param(v, id=v.name) for v in every_variant()),
    *(pytest.param(v, id=v.name, marks=pytest.mark.slow) for v in design_flips()),
]


@pytest.mark.parametrize("variant", ROWS)
def test_the_reduced_search_answers_as_the_full_one(variant: Variant) -> None:
    _same_answers(variant, variant.scenario(SMALL_FAULTY))


@pytest.mark.slow
@pytest.mark.parametrize("variant", every_variant(), ids=lambda v: v.name)
def test_the_reduced_search_answers_as_the_full_one_on_each_variants_scenario(
    variant: Variant,
) -> None:
    """Each variant on the scenario it is checked on (`kvhandoff variants`): wide, mostly."""
    _same_answers(variant, variant.scenario(scenario_config(variant.scenario_name or "wide")))


def test_the_reduction_stores_fewer_states_where_a_witness_flag_is_set() -> None:
    full, reduced = _same_answers(REFERENCE, SMALL_FAULTY)
    assert reduced < full


@pytest.mark.slow
def test_the_sequential_scenario_counts() -> None:
    """The reference on `sequential`: 71,075 states, as pinned elsewhere, and fewer classes."""
    full, reduced = _same_answers(REFERENCE, Config())
    assert full == 71_075
    assert reduced < full


def test_python_hooks_turn_the_reduction_off() -> None:
    for variant in OVERRIDES:
        assert erasable_ghost_flags(variant) == ()
        assert not explore(variant, SMALL).extra["cleared_flags"]


def test_a_flag_an_effect_reads_is_kept() -> None:
    reading = REFERENCE.derive(
        "reads_page_reuse",
        "prefill's rejection also marks the request when some page was reused",
        step_overrides={
            "prefill_reject_request": effect(
                lambda r: [
                    assign(p(r), "rejected"),
                    assign(not_as_is(r), True, when=page_reuse()),
                ]
            )
        },
    )
    assert "page_reuse" in erasable_ghost_flags(REFERENCE)
    assert "page_reuse" not in erasable_ghost_flags(reading)
    assert "drain_acked" in erasable_ghost_flags(reading)


def test_a_flag_an_invariant_reads_is_kept() -> None:
    assert "refused_write" not in erasable_ghost_flags(REFERENCE, [refused_write()])


def test_checking_the_invariants_keeps_every_state() -> None:
    """`--invariants` compares formulas with their Python functions on every reachable state."""
    result = explore(REFERENCE, SMALL_FAULTY, invariants=True)
    assert not result.extra["cleared_flags"]
    assert result.states == explore(REFERENCE, SMALL_FAULTY, reduce=False).states


def test_only_a_flag_or_an_or_of_flags_is_a_flag_witness() -> None:
    assert _pure_flags(page_reuse()) == {"page_reuse"}
    assert _pure_flags(Or(refused_write(), drain_acked())) == {"refused_write", "drain_acked"}
    assert _pure_flags(And(page_reuse(), drain_acked())) is None


def test_check_no_reduce(capsys: pytest.CaptureFixture[str]) -> None:
    from kvhandoff.cli.main import main

    small = ["--scenario", "sequential", "--set", "requests=a:1:1,b:2:1", "--set", "decode_pages=2"]
    full_states = explore(REFERENCE, parse_set(Config(), small[3::2]), reduce=False).states
    assert main(["check", "--variant", "reference", *small]) == 0
    reduced = capsys.readouterr().out
    assert "counted once: --no-reduce counts each" in reduced
    assert f"{full_states:,} states" not in reduced
    assert main(["check", "--variant", "reference", *small, "--no-reduce"]) == 0
    full = capsys.readouterr().out
    assert f"{full_states:,} states" in full and "counted once" not in full
    assert main(["check", "--variant", "reference", "--engine", "bmc", "--no-reduce"]) == 2
    assert "--no-reduce applies to --engine explore" in capsys.readouterr().err


def test_the_incident_counterexample_is_the_full_searchs() -> None:
    incident = get_variant("incident")
    config = incident.scenario(Config())
    full = explore(incident, config, reduce=False)
    reduced = explore(incident, config)
    assert reduced.verdict == "violated"
    assert _answers(reduced) == _answers(full)
