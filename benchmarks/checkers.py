"""Time and memory of every checker engine on growing configurations, as ratios to the explorer.

    PYTHONPATH=. python benchmarks/checkers.py [--depth 12] [--spacer-timeout 20] [--json]

Each (configuration, variant, engine) runs in a fresh Python process, so its peak resident memory
(`ru_maxrss`) is its own; the explorer runs in the same way in the same invocation, and every
figure is also given as a ratio to the explorer's on that configuration and variant. BMC runs to
`--depth` steps (and stops early once every property is violated); Spacer gets
`--spacer-timeout` seconds and is reported `unknown` when it runs out. For BMC the line also says
when the first counterexample of a property the variant is expected to break was found
(`cex@`, from the engine's `found_after_seconds`), which is the figure behind "BMC finds the
incident's counterexample in under N seconds"; the engine's total also covers checking every
other property up to the depth.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

CONFIGS: dict[str, list[str]] = {
    "1 request, 1 page": [
        "decode_pages=1",
        "requests=a:1:1",
        "context_window=1",
        "prefill_max_prompt=1",
        "decode_max_prompt=1",
    ],
    "2 requests, 2 pages": [
        "decode_pages=2",
        "requests=a:1:1,b:2:1",
        "context_window=2",
        "prefill_max_prompt=1",
        "decode_max_prompt=2",
    ],
    "3 requests, 3 pages (default)": [],
    "3 requests, 4 pages": ["decode_pages=4"],
}
ENGINES = ("explore", "bmc", "kind", "prove", "spacer")
VARIANTS = ("reference", "incident")

CHILD = """
import json, resource, sys, time
from kvhandoff.model_checker.engines import ENGINES, EngineOptions
from kvhandoff.spec.config import default_config, parse_set
from kvhandoff.spec.variants import get_variant
engine, variant, depth, spacer_timeout, *sets = sys.argv[1:]
config = parse_set(default_config(), sets)
timeout = float(spacer_timeout) if engine == "spacer" else None
options = EngineOptions(depth=int(depth) if engine == "bmc" else None, timeout=timeout)
started = time.perf_counter()
result = ENGINES[engine](get_variant(variant), config, options)
seconds = time.perf_counter() - started
violated = sorted({r.property for r in result.violated()})
# BMC: when the first counterexample of a property the variant is known to break was found.
found = result.extra.get("found_after_seconds") or {}
hits = [found[p] for p in get_variant(variant).breaks if p in found]
print(json.dumps({"seconds": seconds, "first_break_s": min(hits) if hits else None, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                  / 1024, "verdict": result.verdict, "violated": violated,
                  "states": result.states, "scope": result.extra.get("scope")}))
"""


def measure(
    engine: str, variant: str, sets: list[str], depth: int, spacer: float
) -> dict[str, Any]:
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, engine, variant, str(depth), str(spacer), *sets],
        capture_output=True,
        text=True,
        cwd=root,
        env={"PYTHONPATH": str(root)},
        check=False,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depth", type=int, default=12, help="BMC depth (default 12)")
    parser.add_argument("--spacer-timeout", type=float, default=20.0)
    parser.add_argument("--configs", help="comma-separated indices into the config list")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    names = list(CONFIGS)
    if args.configs:
        names = [names[int(i)] for i in args.configs.split(",")]
    rows = []
    for name in names:
        for variant in VARIANTS:
            base = measure("explore", variant, CONFIGS[name], args.depth, args.spacer_timeout)
            for engine in ENGINES:
                m = (
                    base
                    if engine == "explore"
                    else measure(engine, variant, CONFIGS[name], args.depth, args.spacer_timeout)
                )
                row = {"config": name, "variant": variant, "engine": engine, **m}
                if "seconds" in m and "seconds" in base:
                    row["time_ratio"] = m["seconds"] / base["seconds"]
                    row["mem_ratio"] = m["rss_mb"] / base["rss_mb"]
                rows.append(row)
                if not args.json:
                    if "error" in m:
                        print(f"{name:30s} {variant:10s} {engine:8s} ERROR {m['error']}")
                        continue
                    cex = m.get("first_break_s")
                    print(
                        f"{name:30s} {variant:10s} {engine:8s} {m['seconds']:8.2f} s "
                        f"({row['time_ratio']:6.2f}x) {m['rss_mb']:7.0f} MB "
                        f"({row['mem_ratio']:4.2f}x)  {m['verdict']:8s} "
                        + (f"cex@{cex:.2f}s " if cex is not None else "")
                        + f"{','.join(m['violated'])[:60]}",
                        flush=True,
                    )
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
