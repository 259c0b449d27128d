"""What writing the guards (or, with `--part effects`, the effects) of the single-request steps
once costs: the spec's formulas, translated by the Z3 encoding, against the encoders' hand-written
guards (effects).

Same run, same machine, CPU seconds (`time.process_time`, steadier than wall time on a shared
machine), best of `--repeat`, the two sides alternating (after one warm-up BMC on a small
scenario, so neither side pays the first imports and caches):

* BMC (default depth) on the incident variant, default scenario, with the derived guards
  (`Encoding`, the default) and the hand-written ones (`Encoding(..., legacy_guards=True)`):
  time, and each property's verdict and counterexample length; then on a few more catalogue
  variants (verdicts and lengths compared, times printed);
* the explorer, which keeps the Python guards: states/s on the default scenario of the reference,
  for this tree and, with `--against PATH` (a checkout of another tree, e.g. `git archive main`
  unpacked), for that tree, each in a fresh subprocess.

    python benchmarks/guards_once.py [--part guards|effects] [--repeat 3] [--against /tmp/main]

With `--part effects` the two sides are `Encoding` (the spec's effects) and
`Encoding(..., legacy_effects=True)` (the encoders' own), both with the spec's guards; the
explorer keeps the Python effects too.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvhandoff.model_checker.result import CheckResult
from kvhandoff.model_checker.z3_engines import bmc
from kvhandoff.spec.config import Config, parse_set
from kvhandoff.spec.variants import get_variant

SMALL = [
    "requests=a:1:1,b:2:2",
    "decode_pages=2",
    "prefill_max_prompt=1",
    "decode_max_prompt=2",
    "context_window=2",
]
MORE = ["reference", "m7_release_before_drain", "m13_lease_expiry_pull", "one_sided_fenced"]

EXPLORE = """
import time
from kvhandoff.model_checker.explore import build_graph
from kvhandoff.spec.config import Config
from kvhandoff.spec.variants import REFERENCE
best = None
for _ in range({repeat}):
    started = time.process_time()
    graph = build_graph(REFERENCE, Config())[0]
    spent = time.process_time() - started
    best = spent if best is None else min(best, spent)
print(len(graph.states), best)
"""


def _best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        started = time.process_time()
        out = fn()
        best = min(best, time.process_time() - started)
    return best, out


def _pair(a: Callable[[], Any], b: Callable[[], Any], repeat: int) -> tuple[float, Any, float, Any]:
    """Best times of `a` and `b`, run alternately, with their last results."""
    best_a = best_b = float("inf")
    out_a = out_b = None
    for _ in range(repeat):
        t_a, out_a = _best(a, 1)
        t_b, out_b = _best(b, 1)
        best_a, best_b = min(best_a, t_a), min(best_b, t_b)
    return best_a, out_a, best_b, out_b


def _lengths(result: CheckResult) -> list[str]:
    return [f"{r.property} {r.verdict} {r.depth}" for r in result.results]


def _explore(tree: Path, repeat: int) -> tuple[int, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", EXPLORE.format(repeat=repeat)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return int(out[0]), float(out[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (best is kept)")
    parser.add_argument("--against", type=Path, help="another tree to time the explorer of")
    parser.add_argument(
        "--part",
        choices=("guards", "effects"),
        default="guards",
        help="which half of the rules to compare: the formula guards or the formula effects",
    )
    args = parser.parse_args()
    legacy_flag = {f"legacy_{args.part}": True}
    part = args.part[:-1]
    config = Config()
    incident = get_variant("incident")

    small = parse_set(config, SMALL)
    bmc(incident, small, depth=8)
    bmc(incident, small, depth=8, **legacy_flag)

    derived, d_result, legacy, l_result = _pair(
        lambda: bmc(incident, config),
        lambda: bmc(incident, config, **legacy_flag),
        args.repeat,
    )
    same = _lengths(d_result) == _lengths(l_result)
    print(f"bmc, incident, default scenario (depth {d_result.extra['max_depth']}):")
    print(f"  derived {args.part:7s}      {derived:6.2f} s  {d_result.verdict}")
    print(f"  hand-written {args.part:7s} {legacy:6.2f} s  {l_result.verdict}")
    print(f"  ratio derived/hand-written {derived / legacy:6.2f}")
    print(f"  verdicts and counterexample lengths identical: {same}")
    for line in _lengths(d_result):
        print(f"    {line}")

    print(f"bmc, default scenario, best of {args.repeat} (derived / hand-written):")
    for name in MORE:
        variant = get_variant(name)
        t_d, r_d, t_l, r_l = _pair(
            lambda v=variant: bmc(v, config),
            lambda v=variant: bmc(v, config, **legacy_flag),
            args.repeat,
        )
        same = _lengths(r_d) == _lengths(r_l)
        print(
            f"  {name:32s} {t_d:6.2f} s / {t_l:6.2f} s  {r_d.verdict:9s} "
            f"verdicts and lengths identical: {same}"
        )

    here = Path(__file__).resolve().parents[1]
    trees = [("this tree", here)] + ([("--against", args.against)] if args.against else [])
    print(f"explorer (Python {part}s), reference, default scenario:")
    for label, tree in trees:
        states, seconds = _explore(tree, args.repeat)
        print(
            f"  {label:10s} {states:,} states  {seconds:6.2f} s  {states / seconds:9,.0f} states/s"
        )


if __name__ == "__main__":
    main()
