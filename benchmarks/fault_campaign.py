"""Fault campaign over the real gRPC servers (issue 15): many traces, in chunks of one seed each,
with a line of figures per chunk and a total, so a long run reports what it reached even when
it is stopped.

    python benchmarks/fault_campaign.py --traces 10000 [--chunk 250] [--faults LIST] [--seed 100]

Each chunk is `kvhandoff conform --target grpc --faults LIST --traces CHUNK --seed S`
(conformance/fault_campaign.py). A chunk stops at its first failing trace (its merged log is
saved and named); the run goes on with the next seed, so the totals give a failure rate.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance.fault_campaign import parse_faults, run_fault_campaign

DEFAULT = "all"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--traces", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=250)
    ap.add_argument("--faults", default=DEFAULT)
    ap.add_argument("--seed", type=int, default=100, help="seed of the first chunk")
    ap.add_argument("--out", default="kvhandoff-report/faults")
    args = ap.parse_args()
    faults = parse_faults(args.faults)
    total: Counter[str] = Counter()
    injected: Counter[str] = Counter()
    start = time.perf_counter()
    seed = args.seed
    failures: list[dict[str, str]] = []
    while total["traces"] < args.traces:
        n = min(args.chunk, args.traces - total["traces"])
        r = run_fault_campaign("reference", n, seed, faults, Path(args.out))
        for key in ("traces", "divergences", "cross_tenant_reads", "unanswered", "pages_lost"):
            total[key] += getattr(r, key)
        injected.update(r.injected)
        print(
            f"seed {seed}: {r.traces} traces in {r.seconds:.0f} s, "
            f"{'conforms' if r.conforms else 'diverges'}",
            flush=True,
        )
        if r.failure is not None:
            failures.append(r.failure)
            print(f"  {r.failure['kind']}: {r.failure['message'][:160]} ({r.failure['log']})")
        seed += 1
    wall = time.perf_counter() - start
    print(f"faults {','.join(sorted(faults))}: {total['traces']} traces in {wall:.0f} s")
    print(
        f"  {total['divergences']} divergences, {total['cross_tenant_reads']} cross-tenant reads, "
        f"{total['unanswered']} unanswered, {total['pages_lost']} with pages held at quiescence"
    )
    print("  injected: " + ", ".join(f"{k} {v}" for k, v in sorted(injected.items())))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
