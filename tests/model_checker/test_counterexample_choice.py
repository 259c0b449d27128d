"""Issue 12, part 6: counterexamples read well.

Among the shortest counterexamples the explorer reports one with the fewest fault steps, and
`check` lists each distinct counterexample once, naming the ones that are its first steps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import pytest

from kvhandoff.cli.main import main
from kvhandoff.model_checker.explore import explore
from kvhandoff.model_checker.render import group_counterexamples
from kvhandoff.spec.actions import (
    ClientCancelRequest,
    PrefillRejectRequest,
    RouterSubmitRequest,
    is_fault,
)
from kvhandoff.spec.config import Config, default_config, parse_set
from kvhandoff.spec.properties import ALWAYS
from kvhandoff.spec.state import OTHER_TENANT, State, Tag
from kvhandoff.spec.trace import replay
from kvhandoff.spec.variants import REFERENCE
from tests.explored import SMALL
from tests.sequential import SEQUENTIAL


@dataclass(frozen=True)
class DecodeWarmPage:
    page: int


def _warmable(config: Config, state: State) -> list[DecodeWarmPage]:
    """Once some request has its answer, a warmer may fill page 0 if it is free and zeroed."""
    if not any(r.answer is not None for r in state.requests):
        return []
    page = state.pages[0]
    return [DecodeWarmPage(0)] if page.owner is None and page.content is None else []


def _warm(config: Config, state: State, action: DecodeWarmPage) -> State:
    page = replace(state.pages[action.page], content=Tag(-1, 0, OTHER_TENANT))
    pages = (*state.pages[: action.page], page, *state.pages[action.page + 1 :])
    return replace(state, pages=pages)


WARM_AFTER_ANSWER = replace(
    REFERENCE.derive("warm_after_answer", "a warmer fills free pages once a request is answered"),
    extra_actions=_warmable,
    step_overrides={"decode_warm_page": _warm},
    extra_action_types=(DecodeWarmPage,),
)
# The small scenario, either request first: request 1 is over prefill's limit and is answered
# (rejected) in two protocol steps, as request 0 is by a submit and a client cancel (a fault).
# Breadth-first order meets the cancel first.
SCENARIO = [*SMALL, "submit_in_order=false"]


def test_a_shortest_counterexample_with_a_fault_free_alternative_is_fault_free() -> None:
    config = parse_set(default_config(), SCENARIO)
    prop = next(p for p in ALWAYS if p.name == "freed_pages_hold_no_readable_data")
    # The run breadth-first search meets first: as short, with a fault.
    faulted = (RouterSubmitRequest(0), ClientCancelRequest(0), DecodeWarmPage(0))
    assert not prop.holds(config, replay(WARM_AFTER_ANSWER, config, faulted)[-1])  # type: ignore[arg-type]
    result = explore(WARM_AFTER_ANSWER, config, max_states=5000)  # the bug is 3 steps deep
    trace: tuple[object, ...] | None = result.result_for(prop.name).trace
    assert trace == (RouterSubmitRequest(1), PrefillRejectRequest(1), DecodeWarmPage(0))
    assert not any(is_fault(a) for a in trace)


def test_a_counterexample_that_needs_its_fault_keeps_it() -> None:
    """With the requests in order, request 1 waits for request 0: the shortest runs cancel it."""
    config = parse_set(default_config(), SMALL)
    result = explore(WARM_AFTER_ANSWER, config, max_states=5000)
    trace = result.result_for("freed_pages_hold_no_readable_data").trace
    assert trace is not None and len(trace) == 3
    assert trace[1] == ClientCancelRequest(0)


def test_incident_lists_each_distinct_counterexample_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["check", *SEQUENTIAL, "--variant", "incident", "--set", "max_faults=0"])
    out = capsys.readouterr().out
    assert code == 1
    listings: dict[str, list[str]] = {}
    named: dict[str, str] = {}
    for block in out.split("\ncounterexample for ")[1:]:
        head, *lines = block.strip("\n").split("\n")
        prop = head.split(" ", 1)[0]
        if "same run as" in head:
            named[prop] = head
        else:
            listings[prop] = [re.sub(r"^\s*\d+\. |  <- .*$", "", line) for line in lines]
    # Five properties break; two distinct runs show them all.
    assert sorted(listings) == [
        "decode_reads_only_validated_pages",
        "freed_pages_hold_no_readable_data",
    ]
    assert named == {
        "no_cross_tenant_read": "no_cross_tenant_read (24 steps): same run as "
        "decode_reads_only_validated_pages",
        "accepted_completion_implies_full_coverage": "accepted_completion_implies_full_coverage "
        "(23 steps): same run as decode_reads_only_validated_pages, first 23 steps",
        "rejected_request_gets_error_not_output": "rejected_request_gets_error_not_output "
        "(20 steps): same run as decode_reads_only_validated_pages, first 20 steps",
    }
    for a, steps_a in listings.items():
        for b, steps_b in listings.items():
            assert a == b or steps_b[: len(steps_a)] != steps_a, f"{a} is a prefix of {b}"
    # The listing marks where each named property breaks.
    assert "<- breaks rejected_request_gets_error_not_output" in out
    assert "<- breaks accepted_completion_implies_full_coverage" in out


def test_grouping_of_equal_prefix_and_lasso_counterexamples() -> None:
    a, b, c = RouterSubmitRequest(0), RouterSubmitRequest(1), ClientCancelRequest(0)
    listings, same_as = group_counterexamples(
        [
            ("p", (a, b), None),
            ("q", (a, b), None),  # equal: named under the first
            ("r", (a,), None),  # a prefix of p's
            ("s", (a, c), None),  # differs: listed
            ("t", (a,), 0),  # a lasso: listed, never folded into another run
        ]
    )
    assert [x.property for x in listings] == ["p", "s", "t"]
    assert same_as == {"q": ("p", 2), "r": ("p", 1)}
    assert listings[0].prefixes == (("q", 2), ("r", 1))
