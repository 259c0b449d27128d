"""Scenarios played on vLLM's scheduler-side KV-transfer lifecycle, each judged by the spec.

    python -m kvhandoff.conformance.vllm_scenarios --out docs/findings/vllm

As `conformance.sglang_scenarios` does for SGLang: per scenario the program
(`NAME.trace.jsonl`), vLLM's mapped event log (`NAME.log.jsonl`, `kvhandoff validate-log`) and
the spec behaviour explaining that log up to its first divergence (`NAME.spec.jsonl`,
`kvhandoff explain`); each log judged against the reference spec, the reference with freed pages
not zeroed, and the reference with vLLM's design (`vllm_design`: the pull path, one-sided reads,
release after the transfer is known done, no digest, no check before generating, no scrub).
Exit 0 when every scenario ran (whatever the verdicts), 3 when the target failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvhandoff.conformance.sglang_scenarios import (
    UNSCRUBBED,
    Scenario,
    run_scenarios,
    write_spec_trace,
)
from kvhandoff.conformance.target import Target, TargetError
from kvhandoff.spec.actions import ClientCancelRequest, RouterSubmitRequest
from kvhandoff.spec.variants import REFERENCE

VLLM_DESIGN = REFERENCE.derive(
    "vllm_design",
    "The reference with vLLM's NIXL design: decode pulls prefill's blocks with one-sided reads "
    "and frees an aborted request's blocks only once its reads are known done; no digest, "
    "decode checks nothing before it generates, freed blocks not zeroed.",
    transfer="pull",
    write_path="one_sided",
    release_fence="drain_ack",
    scrub=False,
    prefill_sends_digest=False,
    validation="none",
)

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("handoff", "one request, nothing goes wrong", (RouterSubmitRequest(0),)),
    Scenario(
        "oversize",
        "a prompt over prefill's limit but within decode's (request 1)",
        (RouterSubmitRequest(1),),
    ),
    Scenario(
        "cancel_waiting",
        "the client cancels while decode waits for remote KVs (its reads in flight)",
        (RouterSubmitRequest(0), ClientCancelRequest(0)),
        pause_s=0.15,
    ),
    Scenario(
        "cancel_prefill",
        "the client cancels while prefill still computes (decode never asked)",
        (RouterSubmitRequest(0), ClientCancelRequest(0)),
        env=(("KVHANDOFF_VLLM_PREFILL_S", "1"),),
    ),
    Scenario(
        "failed_load",
        "decode's reads fail; kv_load_failure_policy=fail (vLLM's default)",
        (RouterSubmitRequest(0),),
        env=(("KVHANDOFF_VLLM_FAIL_READS", "1"),),
    ),
    Scenario(
        "failed_load_recompute",
        "decode's reads fail; kv_load_failure_policy=recompute",
        (RouterSubmitRequest(0),),
        env=(
            ("KVHANDOFF_VLLM_FAIL_READS", "1"),
            ("KVHANDOFF_VLLM_LOAD_FAILURE_POLICY", "recompute"),
        ),
    ),
    Scenario(
        "two_tenants",
        "tenant a's request, then tenant b's into the blocks a's request freed",
        (RouterSubmitRequest(0), RouterSubmitRequest(2)),
        pause_s=1.0,
    ),
)


def run(
    out: Path,
    make_target: Callable[[], Target],
    names: list[str] | None = None,
    echo: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Play vLLM's scenarios (all, or `names`); one harness per distinct `env`."""
    variants = (
        ("reference", REFERENCE),
        ("unscrubbed", UNSCRUBBED),
        ("vllm_design", VLLM_DESIGN),
    )
    return run_scenarios(SCENARIOS, "vllm", variants, out, make_target, names, echo)


def main(argv: list[str] | None = None) -> int:
    from kvhandoff.conformance.vllm_target import VllmTarget

    p = argparse.ArgumentParser(prog="python -m kvhandoff.conformance.vllm_scenarios")
    p.add_argument("--out", default="kvhandoff-report/vllm", help="where traces and logs go")
    p.add_argument("--json", action="store_true", help="print the rows as one JSON list")
    p.add_argument(
        "--spec-traces",
        action="store_true",
        help="only (re)write NAME.spec.jsonl from the logs already in --out (no vLLM needed)",
    )
    p.add_argument("names", nargs="*", help="scenarios to run (default: all)")
    args = p.parse_args(argv)
    if args.spec_traces:
        for log in sorted(Path(args.out).glob("*.log.jsonl")):
            spec = log.with_name(log.name.replace(".log.", ".spec."))
            print(write_spec_trace(log, spec, target="vllm"))
        return 0
    try:
        rows = run(Path(args.out), VllmTarget, args.names, echo=lambda s: print(s, flush=True))
    except TargetError as exc:
        print(f"vllm scenarios: the target failed: {exc}", file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps(rows, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
