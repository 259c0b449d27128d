"""The shortcuts checkers take must say exactly what the spec says.

* `is_enabled` asks only the guard of an action's kind: it must agree with `action in enabled(...)`.
* `check_always_after` looks only at what differs from a state where every property held, trusting
  each property's `reads`, `each_request` and `each_page`: it must agree with `check_always`, and a
  property must not depend on parts of the state it does not declare.

Each is checked on every reachable state of small scenarios, for every variant.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kvhandoff.model_checker.explore import build_graph
from kvhandoff.spec import ALWAYS, Config, default_config, parse_set
from kvhandoff.spec.actions import Action
from kvhandoff.spec.machine import enabled, is_enabled
from kvhandoff.spec.properties import check_always, check_always_after
from kvhandoff.spec.state import State
from kvhandoff.spec.variants import VARIANTS, Variant
from tests.explored import SMALL

# Small enough to try every action ever enabled in every state; two faults so that a fault's
# own budget and the total budget each decide somewhere.
TINY_FAULTY = ["requests=a:1:1", "decode_pages=1", "max_faults=2"]


def _scenario(variant: Variant, sets: list[str]) -> Config:
    return variant.scenario(parse_set(default_config(), sets))


def _states(variant: Variant, config: Config, limit: int) -> list[State]:
    graph, _, _ = build_graph(variant, config, max_states=limit)
    return graph.states


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_is_enabled_agrees_with_enabled_on_every_reachable_state(variant: Variant) -> None:
    config = _scenario(variant, SMALL)
    states = _states(variant, config, 20_000)
    lists = [enabled(variant, config, s) for s in states]
    ever = sorted({a for actions in lists for a in actions}, key=repr)
    step = max(1, len(ever) // 40)
    for k, (s, actions) in enumerate(zip(states, lists, strict=True)):
        for a in actions:
            assert is_enabled(variant, config, s, a), a
        # Actions enabled somewhere: a sample per state (a different one from state to state)
        # keeps this fast; the tiny scenario below tries all of them everywhere.
        for a in ever[k % step :: step]:
            assert is_enabled(variant, config, s, a) == (a in actions), a


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_is_enabled_agrees_with_enabled_for_every_action_in_a_tiny_scenario(
    variant: Variant,
) -> None:
    config = _scenario(variant, TINY_FAULTY)
    states = _states(variant, config, 5_000)
    lists = [enabled(variant, config, s) for s in states]
    ever = {a for actions in lists for a in actions}
    for s, actions in zip(states, lists, strict=True):
        for a in ever:
            assert is_enabled(variant, config, s, a) == (a in actions), a


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_check_always_after_agrees_with_check_always_along_every_edge(variant: Variant) -> None:
    config = _scenario(variant, SMALL)
    graph, _, _ = build_graph(variant, config, max_states=20_000, keep_edges=True)
    assert graph.all_edges is not None
    good = [not check_always(config, s) for s in graph.states]
    for i, edges in enumerate(graph.all_edges):
        if not good[i]:
            continue
        before = graph.states[i]
        for j, _action in edges:
            after = graph.states[j]
            # `after` as stepped from `before` (sharing its unchanged parts), and as stored.
            for candidate in (after, _stepped(variant, config, before, _action)):
                assert check_always_after(config, before, candidate) == check_always(
                    config, candidate
                )


def _stepped(variant: Variant, config: Config, state: State, action: Action) -> State:
    from kvhandoff.spec.machine import step

    return step(variant, config, state, action)


def test_properties_read_only_what_they_declare() -> None:
    """Swap in another reachable state's parts that a property does not declare: its verdict
    must not move. (A per-request claim, on each request, must give the property's verdict; so
    must a per-page claim, on each page.)"""
    samples: list[tuple[Config, list[State]]] = []
    for name in ("reference", "incident", "m20_unscrubbed_pages", "m13_lease_expiry_pull"):
        variant = next(v for v in VARIANTS if v.name == name)
        config = _scenario(variant, SMALL)
        samples.append((config, _states(variant, config, 20_000)))
    for config, states in samples:
        others = states[:: max(1, len(states) // 50)]
        for s in states[:: max(1, len(states) // 200)]:
            for prop in ALWAYS:
                verdict = prop.holds(config, s)
                if prop.each_request is not None:
                    claims = [prop.each_request(config, r, q) for r, q in enumerate(s.requests)]
                    assert verdict == all(claims), prop.name
                if prop.each_page is not None:
                    page_claims = [prop.each_page(config, page) for page in s.pages]
                    assert verdict == all(page_claims), prop.name
                assert prop.reads, f"{prop.name} declares what it reads"
                for other in others:
                    assert prop.holds(config, _with_parts(other, s, prop.reads)) == verdict, (
                        prop.name
                    )


def _with_parts(base: State, source: State, reads: tuple[str, ...]) -> State:
    """`base` with the parts named in `reads` taken from `source` (fields of requests or pages
    taken request by request, page by page)."""
    changes: dict[str, Any] = {}
    item_fields: dict[str, dict[str, None]] = {}
    for part in reads:
        name, _, field = part.partition(".")
        if field:
            item_fields.setdefault(name, {})[field] = None
        else:
            changes[name] = getattr(source, name)
    for name, names in item_fields.items():
        if name not in changes and hasattr(getattr(base, name), "_fields"):  # one record
            changes[name] = replace(
                getattr(base, name), **{f: getattr(getattr(source, name), f) for f in names}
            )
        elif name not in changes:
            changes[name] = tuple(
                replace(q, **{f: getattr(src, f) for f in names})
                for q, src in zip(getattr(base, name), getattr(source, name), strict=True)
            )
    return replace(base, **changes)
