"""This tree against another one, in the same run: the checks whose speed must not regress.

    git worktree add /tmp/base main          # or any commit: the baseline
    python benchmarks/against.py --base /tmp/base [--repeat 3] [--json]

Each measurement runs in a fresh Python process with `PYTHONPATH` set to one tree's root, so the
`kvhandoff` package of that tree is the one imported (both trees share this interpreter and its
installed dependencies). The two trees alternate, measurement by measurement, `--repeat` times,
and the best (least) figure of each side is reported with the ratio this/base: on a shared
machine the minimum is the steadiest estimate, and alternating spreads any load over both sides.

The checks (the issue "One semantics" names them): explorer states per CPU second on the default
scenario (the baseline's state count on both sides: see `figure`); BMC on the incident to depth 12 (the whole run, and `--first`, the shortest
counterexample); the any-size `prove` of the reference; k-induction of the reference. Each line
also compares the verdicts, and for BMC the counterexample lengths (with `--first`, the shortest
length: which property of that length the solver reports first may differ): a speed-up that
changes an answer is a bug, and is printed as one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
from kvhandoff.model_checker.engines import ENGINES, EngineOptions
from kvhandoff.spec import Config, get_variant, parse_set
engine, variant, options, sets = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4:]
config = parse_set(Config(), sets)
cpu = time.process_time()
result = ENGINES[engine](get_variant(variant), config, EngineOptions(**options))
cpu = time.process_time() - cpu
print(json.dumps({
    "cpu": cpu, "seconds": result.seconds, "verdict": result.verdict,
    "states": result.states,
    "violated": sorted((r.property, r.depth) for r in result.results if r.verdict == "violated"),
}))
"""

CHECKS: list[tuple[str, str, str, dict[str, Any], list[str]]] = [
    ("explore reference, sequential scenario", "explore", "reference", {}, []),
    (
        "explore reference, wide (the default)",
        "explore",
        "reference",
        {},
        ["requests=a:2:1,b:3:1", "max_active=2", "max_faults=2"],
    ),
    ("bmc incident, depth 12", "bmc", "incident", {"depth": 12}, []),
    ("bmc incident, depth 12, --first", "bmc", "incident", {"depth": 12, "first": True}, []),
    ("prove reference (any size)", "prove", "reference", {}, []),
    ("kind reference", "kind", "reference", {}, []),
]


def measure(tree: Path, engine: str, variant: str, options: dict[str, Any], sets: list[str]) -> Any:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, engine, variant, json.dumps(options), *sets],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=tree,
    )
    if out.returncode != 0:
        raise SystemExit(f"{engine} {variant} in {tree} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def figure(engine: str, run: dict[str, Any], states: int | None = None) -> float:
    """The figure compared: states per CPU second for the explorer (higher is better), the
    engine's own seconds otherwise (lower is better). The explorer's states are `states`, the
    baseline's count, where given: a tree whose explorer reduces (`model_checker/reduction.py`)
    stores fewer states for the same scenario, and its speed is the baseline's states over its
    own CPU seconds ("counted before reduction")."""
    if engine == "explore":
        return float(states if states is not None else run["states"]) / run["cpu"]
    return float(run["seconds"])


def _answer(run: dict[str, Any], options: dict[str, Any]) -> tuple[Any, ...]:
    """What must not change: the verdict and each violated property with its length; with
    `--first`, the length of the shortest counterexample (which property the solver reports
    first among those of that length may differ)."""
    violated = tuple(map(tuple, run["violated"]))
    if options.get("first"):
        return (run["verdict"], min((d for _, d in violated), default=None))
    return (run["verdict"], violated)


def _fmt(x: float, unit: str) -> str:
    return f"{x:,.0f} {unit}" if unit == "states/s" else f"{x:.2f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="root of the baseline tree")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--only", metavar="TEXT", help="only the checks whose label contains TEXT (e.g. explore)"
    )
    args = parser.parse_args()
    base = args.base.resolve()
    if not (base / "kvhandoff" / "spec").exists():
        parser.error(f"--base {base}: not a kvhandoff source tree (no kvhandoff/spec in it)")
    rows = []
    for label, engine, variant, options, sets in CHECKS:
        if args.only and args.only not in label:
            continue
        runs: dict[str, list[dict[str, Any]]] = {"this": [], "base": []}
        for _ in range(args.repeat):
            for side, tree in (("base", base), ("this", HERE)):
                runs[side].append(measure(tree, engine, variant, options, sets))
        counted = runs["base"][0].get("states")
        best = {
            side: (max if engine == "explore" else min)(figure(engine, r, counted) for r in rs)
            for side, rs in runs.items()
        }
        same = {_answer(r, options) for rs in runs.values() for r in rs}
        rows.append(
            {
                "check": label,
                "unit": "states/s" if engine == "explore" else "s",
                "base": best["base"],
                "this": best["this"],
                "ratio": best["this"] / best["base"],
                "same_answers": len(same) == 1,
                "verdict": runs["this"][0]["verdict"],
            }
        )
    if args.json:
        print(json.dumps({"base": str(base), "repeat": args.repeat, "rows": rows}, indent=2))
    else:
        print(f"this tree {HERE} against {base}, best of {args.repeat}, alternating")
        print(f"{'check':40s} {'base':>14s} {'this':>14s} {'this/base':>9s}  answers")
        for row in rows:
            answers = "same" if row["same_answers"] else "DIFFERENT (a bug)"
            print(
                f"{row['check']:40s} {_fmt(row['base'], row['unit']):>14s} "
                f"{_fmt(row['this'], row['unit']):>14s} {row['ratio']:9.2f}  "
                f"{answers}, {row['verdict']}"
            )
    return 0 if all(r["same_answers"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
