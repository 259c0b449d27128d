"""Conformance throughput: traces/s and steps/s in-process and over gRPC, events/s validated.

    PYTHONPATH=. python benchmarks/conformance.py [--traces 1000] [--grpc-traces 50] [--json]

In-process and gRPC figures come from `conformance.campaign.run` (Hypothesis programs of up to
20 spec steps against the reference mode; the gRPC target runs the real servers on loopback).
Log validation is measured two ways: the incremental validator over the event logs of the
in-process programs (the lockstep oracle's cost), and the interleaving search of
`kvhandoff validate-log` over the logs of a live cluster run with mixed traffic and a crash.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# Run as a script, this file's folder comes first on sys.path and its name would shadow the
# `conformance` package: drop it.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from kvhandoff.conformance import campaign  # noqa: E402
from kvhandoff.conformance.inproc import InProcTarget  # noqa: E402
from kvhandoff.conformance.lockstep import run_program  # noqa: E402
from kvhandoff.conformance.validate import Ids, Validator, validate_logs  # noqa: E402


def inprocess(traces: int) -> dict[str, float]:
    report = campaign.run("inproc", "reference", traces=traces, steps=20, seed=0)
    assert report.conforms, report.failures
    return {
        "traces": report.traces,
        "traces_per_s": report.traces / report.seconds,
        "steps_per_s": report.step_count / report.seconds,
    }


def over_grpc(traces: int) -> dict[str, float]:
    report = campaign.run("grpc", "reference", traces=traces, steps=20, seed=0)
    assert report.conforms, report.failures
    return {
        "traces": report.traces,
        "traces_per_s": report.traces / report.seconds,
        "steps_per_s": report.step_count / report.seconds,
    }


def incremental_validation(programs: int) -> dict[str, float]:
    """Collect the event logs of random in-process programs, then validate them again."""
    config = campaign.campaign_config()
    logs: list[list[dict[str, Any]]] = []
    for seed in range(programs):
        rng = random.Random(seed)
        session = run_program(InProcTarget(), config, "reference", rng.choice, 20)
        logs.append(session.events)
    events = sum(len(x) for x in logs)
    start = time.perf_counter()
    for log in logs:
        ids = Ids(config.page_size, {f"r{r}": r for r in range(len(config.requests))})
        assert Validator(config, ids).run(log).ok
    seconds = time.perf_counter() - start
    return {"events": events, "events_per_s": events / seconds}


def live_log_validation() -> dict[str, float]:
    from kvhandoff.impl.cluster import start_cluster

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cluster = start_cluster(
            "reference", device="cpu", log_dir=root / "logs", state_dir=root / "state"
        )
        try:
            with cluster.client() as client:

                def go(i: int) -> None:
                    n = [8, 20, 300, 40, 4][i % 5]
                    client.generate("ab"[i % 2], [65 + i % 2] * n, max_tokens=4)

                for wave in range(4):
                    threads = [
                        threading.Thread(target=go, args=(wave * 10 + i,)) for i in range(10)
                    ]
                    for t in threads:
                        t.start()
                    for t in threads:
                        t.join()
                cluster.crash_prefill()
                cluster.restart_prefill()
                cluster.wait_healthy()
                for i in range(10):
                    go(i)
            cluster.wait_quiescent(10)
        finally:
            cluster.stop()
        files = sorted((root / "logs").glob("*.jsonl"))
        validate_logs(files)  # warm-up (imports, caches)
        start = time.perf_counter()
        report = validate_logs(files)
        seconds = time.perf_counter() - start
        assert report.ok, report.message
        return {"events": report.events, "events_per_s": report.events / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=1000)
    parser.add_argument("--grpc-traces", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = {
        "inprocess": inprocess(args.traces),
        "grpc": over_grpc(args.grpc_traces),
        "validation_incremental": incremental_validation(300),
        "validation_live_logs": live_log_validation(),
    }
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return
    ip, gr = out["inprocess"], out["grpc"]
    inc, live = out["validation_incremental"], out["validation_live_logs"]
    print(
        f"in-process: {ip['traces_per_s']:.0f} traces/s, {ip['steps_per_s']:.0f} steps/s "
        f"({ip['traces']:.0f} traces of up to 20 steps)"
    )
    print(
        f"gRPC:       {gr['traces_per_s']:.1f} traces/s, {gr['steps_per_s']:.0f} steps/s "
        f"({gr['traces']:.0f} traces)"
    )
    print(
        f"validation: {inc['events_per_s']:.0f} events/s incremental ({inc['events']:.0f} events); "
        f"{live['events_per_s']:.0f} events/s searching live logs ({live['events']:.0f} events)"
    )


if __name__ == "__main__":
    main()
