"""Prefill addresses its grant's sender (`ReqState.p_grant_dinst`).

Until 2026-12-05 the spec read the decode instance of prefill's grant off the grant's first page
(`page_instance(p_pages[0])`); it now keeps the instance that sent the grant, as engines do (SGLang's
prefill keeps the decode endpoint the registration named, not page indices). The two readings
must agree on every reachable state, and the new field must carry nothing else (0 whenever
prefill holds no grant), so the explored graphs are the same ones: this is the differential test
of that change, on configurations where a request can take another decode instance's grant
(room-keyed matching, one prefill instance shared), with retries, restarts and partitions.
"""

from __future__ import annotations

import pytest

from kvhandoff.model_checker.explore import build_graph
from kvhandoff.spec import Config, get_variant
from kvhandoff.spec.config import parse_set
from kvhandoff.spec.state import State

TWO_DECODES = ["decode_instances=2", "decode_pages=4", "placement=fixed"]

CASES = [
    # room-keyed: a's prefill can take the grant b's decode instance made (same room)
    ("room_keyed_matching", [*TWO_DECODES, "max_crashes=0", "requests=a:2:1:0/0,b:2:1:0/1"]),
    ("room_keyed_with_binding", [*TWO_DECODES, "max_crashes=0", "requests=a:2:1:0/0,b:2:1:0/1"]),
    # a client retry under the same id, the first attempt's grant from the other instance
    (
        "room_keyed_with_binding",
        [*TWO_DECODES, "max_crashes=0", "max_retries=1", "requests=a:1:1:0/0,b:1:1:0/1"],
    ),
    # restarts and partitions of one instance, request-keyed
    (
        "reference",
        [
            *TWO_DECODES,
            "prefill_instances=2",
            "max_crashes=1",
            "max_partitions=1",
            "requests=a:1:1:0/0,b:1:1:1/1",
        ],
    ),
]


def _old_reading(config: Config, s: State, r: int) -> int:
    """The spec's reading before the change: the instance of the grant's first page."""
    req = s.requests[r]
    if req.p_pages:
        return config.page_instance(req.p_pages[0])
    return config.requests[r].decode_instance


def _new_reading(config: Config, s: State, r: int) -> int:
    req = s.requests[r]
    return req.p_grant_dinst if req.p_gen else config.requests[r].decode_instance


@pytest.mark.parametrize(("variant", "sets"), CASES, ids=lambda x: str(x))
def test_the_grant_s_sender_is_the_instance_its_pages_name(variant: str, sets: list[str]) -> None:
    config = parse_set(Config(), sets)
    graph = build_graph(get_variant(variant), config)[0]
    assert graph.complete
    crossed = 0
    for s in graph.states:
        for r, req in enumerate(s.requests):
            assert _new_reading(config, s, r) == _old_reading(config, s, r), (r, s)
            # The field carries nothing beyond the reading: no two states differ by it alone.
            assert req.p_grant_dinst == 0 or req.p_gen != 0, (r, s)
            assert bool(req.p_pages) == (req.p_gen != 0), (r, s)
            crossed += req.p_gen != 0 and req.p_grant_dinst != config.requests[r].decode_instance
    if variant.startswith("room_keyed"):
        # What the change is about: some request holds another decode instance's grant.
        assert crossed > 0
