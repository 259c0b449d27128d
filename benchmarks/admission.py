"""Admission queue under load (issue 15): refusal rate and latency with decode's and the router's
queues off (every request that does not fit is refused at once, the old behaviour) and on, in the
same run, against the same cluster shape and the same request stream.

    python benchmarks/admission.py [--clients 16] [--requests 12] [--seed 1]

Load: several tenants send prompts of 16..48 pages at once to a 64-page decode pool, so the pool
is full most of the time (the issue measured 31-40 % refused under such load).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvhandoff.impl.cluster import start_cluster
from kvhandoff.impl.tokenizer import encode


def run(queue_len: int, clients: int, requests: int, seed: int) -> dict[str, float]:
    cluster = start_cluster(
        "reference",
        device="cpu",
        decode_pages=64,
        prefill_pages=64,
        context_window=256,
        admission_queue_len=queue_len,
        admission_timeout_s=30.0,
    )
    results: list[tuple[str, float]] = []
    lock = threading.Lock()

    def client(n: int) -> None:
        rng = random.Random(seed * 1000 + n)
        with cluster.client() as c:
            for i in range(requests):
                pages = rng.randint(16, 48)
                prompt = encode(chr(65 + n % 26) * (pages * 4))
                t0 = time.perf_counter()
                r = c.generate(f"tenant-{n % 4}", prompt, 8, request_id=f"c{n}-{i}", timeout=60)
                dt = time.perf_counter() - t0
                with lock:
                    results.append((r.code if r.status != "ok" else "OK", dt))

    try:
        cluster.wait_healthy()
        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        assert cluster.wait_quiescent(30), "pages left behind"
    finally:
        cluster.stop()
    total = len(results)
    refused = sum(1 for code, _ in results if code == "RESOURCE_EXHAUSTED")
    other = sum(1 for code, _ in results if code not in ("OK", "RESOURCE_EXHAUSTED"))
    ok_lat = sorted(dt for code, dt in results if code == "OK")
    return {
        "total": total,
        "ok": len(ok_lat),
        "refused": refused,
        "other_errors": other,
        "refused_pct": 100.0 * refused / total,
        "p50_s": statistics.median(ok_lat) if ok_lat else float("nan"),
        "p95_s": ok_lat[int(0.95 * (len(ok_lat) - 1))] if ok_lat else float("nan"),
        "wall_s": wall,
        "ok_per_s": len(ok_lat) / wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rows = {
        "no queue (before)": run(0, args.clients, args.requests, args.seed),
        "queue (after)": run(256, args.clients, args.requests, args.seed),
    }
    print(f"{args.clients} clients x {args.requests} requests, prompts 16..48 pages, 64-page pool")
    print(
        f"{'':20} {'ok':>5} {'refused':>8} {'refused%':>9} {'other':>6} {'p50 s':>7} "
        f"{'p95 s':>7} {'ok/s':>6}"
    )
    for name, r in rows.items():
        print(
            f"{name:20} {r['ok']:5.0f} {r['refused']:8.0f} {r['refused_pct']:8.1f}% "
            f"{r['other_errors']:6.0f} {r['p50_s']:7.3f} {r['p95_s']:7.3f} {r['ok_per_s']:6.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
