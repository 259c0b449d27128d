"""Fault campaign over the real gRPC servers (issue 15): many traces, in chunks of one seed each,
with a line of figures per chunk and a total, so a long run reports what it reached even when
it is stopped.

    python benchmarks/fault_campaign.py --traces 10000 [--chunk 250] [--faults LIST] [--seed 100]
        [--keep-going] [--record FILE] [--logs DIR]
    python benchmarks/fault_campaign.py --revalidate DIR

Each chunk is `kvhandoff conform --target grpc --faults LIST --traces CHUNK --seed S`
(conformance/fault_campaign.py). Without --keep-going a chunk stops at its first failing trace
(its merged log is saved and named) and the run goes on with the next seed; with it, a chunk runs
all its traces and counts every failing one. --record appends one JSON line per chunk to FILE and
skips the seeds FILE already holds, so a stopped run resumes where it was (run it again with the
same arguments). --logs keeps every trace's logs (DIR/seedS.jsonl.gz); --revalidate judges the
kept logs again with the current validator, without the servers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvhandoff.conformance.fault_campaign import parse_faults, revalidate, run_fault_campaign

DEFAULT = "all"
KEYS = ("traces", "divergences", "cross_tenant_reads", "unanswered", "pages_lost")


def _recorded(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _revalidate(folder: Path) -> int:
    total = 0
    bad: list[dict[str, Any]] = []
    start = time.perf_counter()
    for path in sorted(folder.glob("seed*.jsonl.gz")):
        n, unexplained = revalidate(path)
        total += n
        bad += unexplained
        print(f"{path.name}: {n} traces, {len(unexplained)} unexplained", flush=True)
        for u in unexplained:
            print(f"  seed {u['seed']} trace {u['trace']}: {u['message'][:200]}")
    wall = time.perf_counter() - start
    print(f"revalidated {total} traces in {wall:.0f} s: {len(bad)} unexplained")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--traces", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=250)
    ap.add_argument("--faults", default=DEFAULT)
    ap.add_argument("--seed", type=int, default=100, help="seed of the first chunk")
    ap.add_argument("--out", default="kvhandoff-report/faults")
    ap.add_argument("--keep-going", action="store_true", help="count every failing trace")
    ap.add_argument("--record", type=Path, help="append per-chunk results here; resume from it")
    ap.add_argument("--logs", type=Path, help="keep every trace's logs in this folder")
    ap.add_argument("--revalidate", type=Path, help="judge the logs kept in this folder again")
    args = ap.parse_args()
    if args.revalidate is not None:
        return _revalidate(args.revalidate)
    faults = parse_faults(args.faults)
    total: Counter[str] = Counter()
    injected: Counter[str] = Counter()
    start = time.perf_counter()
    done = {int(rec["seed"]): rec for rec in _recorded(args.record)}
    failures: list[dict[str, str]] = []
    chunk_seconds = 0.0
    seed = args.seed
    while total["traces"] < args.traces:
        n = min(args.chunk, args.traces - total["traces"])
        rec = done.get(seed)
        if rec is not None:
            print(f"seed {seed}: recorded ({rec['traces']} traces)", flush=True)
        else:
            logs = None if args.logs is None else args.logs / f"seed{seed}.jsonl.gz"
            r = run_fault_campaign(
                "reference",
                n,
                seed,
                faults,
                Path(args.out),
                keep_going=args.keep_going,
                save_logs=logs,
            )
            rec = {
                "seed": seed,
                **{k: getattr(r, k) for k in KEYS},
                "seconds": round(r.seconds, 1),
                "injected": dict(sorted(r.injected.items())),
                "failures": r.failures,
            }
            if args.record is not None:
                args.record.parent.mkdir(parents=True, exist_ok=True)
                with args.record.open("a") as f:
                    f.write(json.dumps(rec, sort_keys=True) + "\n")
            verdict = "conforms" if not r.failures else f"{len(r.failures)} failing"
            print(
                f"seed {seed}: {r.traces} traces in {r.seconds:.0f} s, {verdict}",
                flush=True,
            )
        for key in KEYS:
            total[key] += int(rec[key])
        injected.update(rec.get("injected", {}))
        chunk_seconds += float(rec["seconds"])
        for failure in rec.get("failures", []):
            failures.append(failure)
            print(f"  trace {failure['trace']} {failure['kind']}: {failure['message'][:160]}")
            print(f"    ({failure['log']})")
        seed += 1
    wall = time.perf_counter() - start
    print(
        f"faults {','.join(sorted(faults))}: {total['traces']} traces in {chunk_seconds:.0f} s "
        f"of chunks ({wall:.0f} s in this run)"
    )
    print(
        f"  {total['divergences']} divergences, {total['cross_tenant_reads']} cross-tenant reads, "
        f"{total['unanswered']} unanswered, {total['pages_lost']} with pages held at quiescence"
    )
    print("  injected: " + ", ".join(f"{k} {v}" for k, v in sorted(injected.items())))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
