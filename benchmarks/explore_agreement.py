"""The explorer's answers in this tree against another tree's: the differential test for a change
that must not change what the search finds (a new state representation, a faster loop).

    git worktree add --detach /tmp/base main     # the tree to agree with
    python benchmarks/explore_agreement.py --base /tmp/base [--jobs 2] [--quick]

Every variant of the catalogue is explored on its own scenario (`Variant.scenario_name`, `wide`
otherwise), and the reference on every rung of benchmarks/explore.py, once in each tree, each run
in a fresh process with `PYTHONPATH` set to that tree's root. The two answers must be the same in
everything but time: the verdict, the state count, the transitions and the search depth, every
property's verdict, depth, detail and counterexample (its actions, as trace JSON), the witnesses,
the termination bound and each placement's verdict. Each row prints both state counts and
"same" or what differs; the exit status is 1 if any row differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from benchmarks.explore import LADDER  # noqa: E402 (after the path is set)

CHILD = r"""
import json, sys
from kvhandoff.model_checker.explore import explore
from kvhandoff.spec import get_variant, parse_set
from kvhandoff.spec.config import scenario_config
variant_name, scenario_name, sets = sys.argv[1], sys.argv[2], sys.argv[3:]
variant = get_variant(variant_name)
config = parse_set(scenario_config(scenario_name or variant.scenario_name or "wide"), sets)
answer = explore(variant, config).to_json()
for timing in ("seconds", "states_per_second"):
    answer.pop(timing, None)
print(json.dumps(answer, sort_keys=True, default=str))
"""


def rows(quick: bool) -> list[tuple[str, str, str, list[str]]]:
    """(label, variant, scenario ("" for the variant's own), --set arguments) of every run."""
    sys.path.insert(0, str(HERE))
    from kvhandoff.spec.variants import VARIANTS

    out = [(f"{v.name} (its scenario)", v.name, "", []) for v in VARIANTS]
    ladder = LADDER[:3] if quick else LADDER
    out += [(label, variant, "sequential", sets) for label, variant, sets in ladder]
    return out[:6] if quick else out


def answer(tree: Path, variant: str, scenario: str, sets: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    run = subprocess.run(
        [sys.executable, "-c", CHILD, variant, scenario, *sets],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if run.returncode != 0:
        return {"error": run.stderr.strip().splitlines()[-1:] or [f"exit {run.returncode}"]}
    parsed: dict[str, Any] = json.loads(run.stdout)
    return parsed


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Where two JSON values differ, as paths (the first few)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for key in sorted(set(a) | set(b)):
            out += differences(a.get(key), b.get(key), f"{where}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{where}[{i}]")
        ]
    return [] if a == b else [f"{where or '.'}: {json.dumps(a)[:80]} vs {json.dumps(b)[:80]}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the other tree's root")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument("--quick", action="store_true", help="the first six rows only")
    args = parser.parse_args()
    base = args.base.resolve()
    if not (base / "kvhandoff").is_dir():
        parser.error(f"--base {base}: no kvhandoff package there (a checkout's root?)")
    todo = rows(args.quick)

    def both(row: tuple[str, str, str, list[str]]) -> tuple[dict[str, Any], dict[str, Any]]:
        _, variant, scenario, sets = row
        return answer(HERE, variant, scenario, sets), answer(base, variant, scenario, sets)

    print(f"{'run':58s} {'this':>9s} {'base':>9s}  answer")
    differing = 0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for row, (mine, theirs) in zip(todo, pool.map(both, todo), strict=True):
            diff = differences(mine, theirs)
            differing += bool(diff)
            states = f"{mine.get('states', '-')!s:>9s} {theirs.get('states', '-')!s:>9s}"
            print(f"{row[0][:58]:58s} {states}  {'same' if not diff else 'DIFFERS'}", flush=True)
            for line in diff[:5]:
                print(f"    {line}")
    print(f"{len(todo) - differing}/{len(todo)} runs give the same answer in both trees")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
