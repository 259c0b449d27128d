"""Explorer results shared across test modules (each variant is explored once per session)."""

from __future__ import annotations

import random
from collections import defaultdict
from functools import cache

from kvhandoff.model_checker.explore import build_graph, explore
from kvhandoff.model_checker.result import CheckResult
from kvhandoff.spec import Config, get_variant
from kvhandoff.spec.actions import Action, action_name
from kvhandoff.spec.config import parse_set
from kvhandoff.spec.state import State

SMALL = [
    "requests=a:1:1,b:2:2",
    "decode_pages=2",
    "prefill_max_prompt=1",
    "decode_max_prompt=2",
    "context_window=2",
]
RETRY_TINY = [*SMALL, "requests=a:1:1", "max_retries=1"]
"""One request and one client retry: the smallest scenario in which the router retries, for the
tests that need every step taken somewhere (the retry scenarios over `SMALL` are in `make
test-slow`)."""
"""`--set` values of the small scenario (two requests, two pages) several test modules explore."""


@cache
def explored(variant_name: str) -> CheckResult:
    """The variant explored on its catalogue scenario (the default config, plus its `config`)."""
    variant = get_variant(variant_name)
    return explore(variant, variant.scenario(Config()))


Edge = tuple[State, Action, State]


@cache
def edges_by_kind(name: str) -> tuple[Config, dict[str, list[Edge]]]:
    """Every edge of the variant's graph on the small scenario, by action kind: the steps the
    simulation checks of the any-size models (hand-written and derived) sample from."""
    variant = get_variant(name)
    config = parse_set(variant.scenario(Config()), SMALL)
    graph, _, _ = build_graph(variant, config, keep_edges=True)
    assert graph.all_edges is not None
    by_kind: dict[str, list[Edge]] = defaultdict(list)
    for i, out in enumerate(graph.all_edges):
        for j, action in out:
            by_kind[action_name(action)].append((graph.states[i], action, graph.states[j]))
    return config, by_kind


def sample_edges(by_kind: dict[str, list[Edge]], per_kind: int, seed: int = 0) -> list[Edge]:
    """`per_kind` edges of each kind, chosen at random (seeded)."""
    rnd = random.Random(seed)
    out: list[Edge] = []
    for kind in sorted(by_kind):
        edges = list(by_kind[kind])
        rnd.shuffle(edges)
        out += edges[:per_kind]
    return out
