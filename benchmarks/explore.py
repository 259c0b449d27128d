"""Explicit-state search speed and memory for growing configurations.

Each configuration is explored in a fresh subprocess so that its peak resident memory (ru_maxrss)
is its own. States per second are states / CPU seconds of that process (wall time is printed too:
on a shared machine CPU time is the steadier figure).

Each rung is run twice: the full search (`reduce=False`, every state) and the explorer's default,
which stores once states that differ only in what no step or property reads: ghost flags only
witnesses read, and prefill's fields of a request prefill has finished with
(`model_checker/reduction.py`). The second row's `states` is what it stored; its states/s is the
full search's states over its own CPU seconds ("counted before reduction": the same scenario
checked that much faster). Both must give the same verdict.

    python benchmarks/explore.py            # the default ladder
    python benchmarks/explore.py --quick    # the first three rungs only
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

LADDER: list[tuple[str, str, list[str]]] = [
    (
        "1 request, 1 page, no faults",
        "reference",
        ["requests=a:1:1", "decode_pages=1", "max_faults=0"],
    ),
    (
        "2 requests, 2 pages",
        "reference",
        [
            "requests=a:1:1,b:2:2",
            "decode_pages=2",
            "prefill_max_prompt=1",
            "decode_max_prompt=2",
            "context_window=2",
        ],
    ),
    ("sequential scenario, no faults", "reference", ["max_faults=0"]),
    ("sequential scenario (incident variant)", "incident", []),
    ("sequential scenario", "reference", []),
    ("sequential scenario, 4 pages", "reference", ["decode_pages=4"]),
    ("sequential scenario, 2 in flight", "reference", ["max_active=2"]),
    ("sequential scenario, 2 prefill ranks", "reference", ["prefill_ranks=2"]),
    (
        "wide: the default (2 in flight, 2 faults)",
        "reference",
        ["requests=a:2:1,b:3:1", "max_active=2", "max_faults=2"],
    ),
    (
        "instances: wide on 2+2, every placement",
        "reference",
        [
            "requests=a:2:1,b:3:1",
            "max_active=2",
            "max_faults=2",
            "max_crashes=0",
            "decode_pages=6",
            "prefill_instances=2",
            "decode_instances=2",
        ],
    ),
    (
        "instance_faults: instances, 1 fault (a crash or partition of any one instance)",
        "reference",
        [
            "requests=a:2:1,b:3:1",
            "max_active=2",
            "max_faults=1",
            "max_partitions=1",
            "decode_pages=6",
            "prefill_instances=2",
            "decode_instances=2",
        ],
    ),
]

CHILD = r"""
import json, resource, sys, time
from kvhandoff.model_checker.explore import explore
from kvhandoff.spec import Config, get_variant, parse_set
reduce, variant, sets = sys.argv[1] == "reduce", sys.argv[2], sys.argv[3:]
config = parse_set(Config(), sets)
wall, cpu = time.perf_counter(), time.process_time()
result = explore(get_variant(variant), config, reduce=reduce)
cpu = time.process_time() - cpu
wall = time.perf_counter() - wall
print(json.dumps({
    "states": result.states, "transitions": result.extra["transitions"],
    "cpu": cpu, "wall": wall, "verdict": result.verdict,
    "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="only the first three rungs")
    args = parser.parse_args()
    ladder = LADDER[:3] if args.quick else LADDER
    print(
        f"{'configuration':42s} {'variant':9s} {'states':>9s} {'trans.':>9s} "
        f"{'cpu s':>7s} {'wall s':>7s} {'states/s':>9s} {'peak MiB':>9s}  verdict"
    )
    for label, variant, sets in ladder:
        full: dict[str, float] = {}
        for mode in ("full", "reduce"):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, mode, variant, *sets],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(out.stdout)
            full = full or r
            # States per second counted before reduction: the full search's states over this
            # run's CPU seconds (the same scenario checked that much faster).
            rate = full["states"] / r["cpu"] if r["cpu"] > 0 else float("nan")
            if full["verdict"] != r["verdict"]:
                raise SystemExit(
                    f"{label}: the reduced search says {r['verdict']}, the full one "
                    f"{full['verdict']}"
                )
            name = label if mode == "full" else "  reduced (what no step or property reads)"
            print(
                f"{name:42s} {variant:9s} {r['states']:9,d} {r['transitions']:9,d} "
                f"{r['cpu']:7.2f} {r['wall']:7.2f} {rate:9,.0f} {r['peak_mib']:9.0f}  "
                f"{r['verdict']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
