"""What page-symmetry reduction would give the explorer, and why it does not use it.

For each configuration, a breadth-first search of the reachable states is run twice in this
process: once keeping every state (as `model_checker/explore.py` does), once keeping one state
per class of page relabellings (its index keyed by `spec.symmetry.canonical_pages`, storing and
expanding the first concrete state reached). Printed: states, CPU seconds and states/s of each,
the reduction ratio, the shortest depth at which each `always` property breaks in each, and, over
the full graph, how many classes of relabellings there are and in how many of them two members
disagree (their successors fall into different classes, or a property or witness holds in one
and not the other). A disagreeing class means the quotient is no bisimulation: the rulebook reads
page order (`spec/symmetry.py`), so the reduced search is unsound, and a depth that differs shows
it. The searches here are minimal (no fault-count tie-break, no termination check); the depths
are those of a breadth-first search, the explorer's counterexample lengths.

    python benchmarks/page_symmetry.py           # default scenario, incident, 2 in flight
    python benchmarks/page_symmetry.py --quick   # the first two rows
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from kvhandoff.spec import Config, get_variant
from kvhandoff.spec.compiled import rules
from kvhandoff.spec.config import parse_set
from kvhandoff.spec.machine import init
from kvhandoff.spec.properties import ALWAYS, SOMETIMES
from kvhandoff.spec.state import State
from kvhandoff.spec.symmetry import canonical_pages

ROWS: list[tuple[str, str, list[str]]] = [
    ("default scenario", "reference", []),
    ("default scenario (incident variant)", "incident", []),
    ("default scenario, 2 in flight", "reference", ["max_active=2"]),
]


def search(variant: Any, config: Config, key: Callable[[State], Any]) -> dict[str, Any]:
    """Breadth-first search with the index keyed by `key`; returns states, successor lists,
    CPU seconds and the depth of the first state breaking each `always` property."""
    rulebook = rules(variant)
    enabled_in, effect_of = rulebook.enabled_for(config), rulebook.steps_for(config)
    s0 = init(config)
    index = {key(s0): 0}
    states, depth, succ = [s0], [0], []
    broken: dict[str, int] = {}
    started = time.process_time()

    def check(i: int) -> None:
        for prop in ALWAYS:
            if prop.name not in broken and not prop.holds(config, states[i]):
                broken[prop.name] = depth[i]

    check(0)
    head = 0
    while head < len(states):
        s, out = states[head], []
        for action in enabled_in(config, s):
            t = effect_of[type(action)](config, s, action)
            k = key(t)
            j = index.get(k)
            if j is None:
                j = len(states)
                index[k] = j
                states.append(t)
                depth.append(depth[head] + 1)
                check(j)
            out.append(j)
        succ.append(out)
        head += 1
    cpu = time.process_time() - started
    return {"states": states, "succ": succ, "cpu": cpu, "broken": broken}


def disagreeing_classes(variant: Any, config: Config, full: dict[str, Any]) -> tuple[int, int]:
    """(classes of relabellings of the reachable states, classes whose members disagree)."""
    states: list[State] = full["states"]
    canon = [canonical_pages(s) for s in states]
    members: dict[State, list[int]] = {}
    for i, c in enumerate(canon):
        members.setdefault(c, []).append(i)
    disagree = 0
    for group in members.values():
        if len(group) < 2:
            continue
        seen = {
            (
                frozenset(canon[j] for j in full["succ"][i]),
                tuple(p.holds(config, states[i]) for p in ALWAYS),
                tuple(w.reached(config, states[i]) for w in SOMETIMES),
            )
            for i in group
        }
        disagree += len(seen) > 1
    return len(members), disagree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="only the first two rows")
    args = parser.parse_args()
    rows = ROWS[:2] if args.quick else ROWS
    print(
        f"{'configuration':36s} {'variant':9s} {'states':>8s} {'cpu s':>7s} {'states/s':>8s}"
        f" | {'reduced':>8s} {'cpu s':>7s} {'states/s':>8s} {'ratio':>6s}"
        f" | {'classes':>8s} {'disagree':>8s} | shortest violations (full/reduced)"
    )
    for label, name, sets in rows:
        variant = get_variant(name)
        config = parse_set(variant.scenario(Config()), sets)
        full = search(variant, config, lambda s: s)
        reduced = search(variant, config, canonical_pages)
        classes, disagree = disagreeing_classes(variant, config, full)
        n, m = len(full["states"]), len(reduced["states"])
        depths = ", ".join(
            f"{p.name} {full['broken'].get(p.name, '-')}/{reduced['broken'].get(p.name, '-')}"
            for p in ALWAYS
            if p.name in full["broken"] or p.name in reduced["broken"]
        )
        print(
            f"{label:36s} {name:9s} {n:8,d} {full['cpu']:7.2f} {n / full['cpu']:8,.0f}"
            f" | {m:8,d} {reduced['cpu']:7.2f} {m / reduced['cpu']:8,.0f} {n / m:6.3f}"
            f" | {classes:8,d} {disagree:8,d} | {depths or 'none'}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
