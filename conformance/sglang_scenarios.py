"""The catalogue's scenarios played on SGLang's disaggregation classes, each judged by the spec.

    python -m kvhandoff.conformance.sglang_scenarios --out docs/findings/sglang

For each scenario (a short program of client operations and crashes on the default campaign
scenario: tenants a and b, request 1 too long for prefill, a three-page decode pool) it drives
`SglangTarget`, saves the program (`NAME.trace.jsonl`: `kvhandoff replay ... --target sglang`
plays it again), SGLang's mapped event log (`NAME.log.jsonl`: `kvhandoff validate-log` judges
it) and the spec behaviour that explains that log up to its first divergence
(`NAME.spec.jsonl`: `kvhandoff explain` narrates it), and judges
the log three times: against the reference spec (the conformance verdict); against the reference
with freed pages not zeroed (the catalogue's m20 option: SGLang's allocators); and against the
reference with all of SGLang's known design choices (no digest, no check before generating, no
scrub), so that what SGLang does after those first differences is judged too.
Exit 0 when every scenario ran (whatever the verdicts), 3 when the target failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvhandoff.conformance.grpc_target import log_headers, split_by_server
from kvhandoff.conformance.target import Target, TargetError
from kvhandoff.conformance.validate import search_logs
from kvhandoff.spec.actions import Action, ClientCancelRequest, PrefillRestart, RouterSubmitRequest
from kvhandoff.spec.config import Config
from kvhandoff.spec.trace import dump_trace
from kvhandoff.spec.variants import REFERENCE, Variant

UNSCRUBBED = REFERENCE.derive(
    "reference_unscrubbed",
    "The reference, except that freed pages are not zeroed (SGLang's allocators).",
    scrub=False,
)
SGLANG_DESIGN = REFERENCE.derive(
    "sglang_design",
    "The reference with SGLang's known design choices: no digest sent, decode checks nothing "
    "before it generates, freed pages not zeroed.",
    scrub=False,
    prefill_sends_digest=False,
    validation="none",
)

NO_DIGEST = REFERENCE.derive(
    "sglang_no_digest",
    "The reference with SGLang's transfer check: no digest sent, decode checks nothing before "
    "it generates (freed pages zeroed: run with KVHANDOFF_SGLANG_SCRUB=1).",
    prefill_sends_digest=False,
    validation="none",
)


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    program: tuple[Action, ...]
    pause_s: float = 0.0
    """Wait this long after each step (lets a transfer start before a cancel or crash)."""
    env: tuple[tuple[str, str], ...] = ()
    """Settings of the harness process (scenarios with other settings get a harness of their
    own)."""
    cancel_after: str | None = None
    """A log event of the cancelled request to wait for before the cancel (a cancel *while* a
    step is under way must not overtake that step on a loaded machine)."""


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("handoff", "one request, nothing goes wrong", (RouterSubmitRequest(0),)),
    Scenario(
        "oversize",
        "a prompt over prefill's limit but within decode's (request 1)",
        (RouterSubmitRequest(1),),
    ),
    Scenario(
        "cancel",
        "the client cancels while the transfer is set up (decode aborts, prefill is told)",
        (RouterSubmitRequest(0), ClientCancelRequest(0)),
        cancel_after="decode_reserve_pages",
    ),
    Scenario(
        "timeout",
        "decode's pool is held by request 1 (which prefill refused), so request 2's destination "
        "pages are not sent in time: prefill's bootstrap timeout fires",
        (RouterSubmitRequest(1), RouterSubmitRequest(2)),
        pause_s=0.2,
    ),
    Scenario(
        "crash",
        "prefill is killed (SIGKILL) while requests 1 and 2 are in flight, and restarts",
        (RouterSubmitRequest(1), RouterSubmitRequest(2), PrefillRestart()),
        pause_s=0.5,
    ),
    Scenario(
        "crash_down",
        "as crash, but prefill stays dead for 5 s (longer than decode's heartbeat allows) "
        "before its new process serves",
        (RouterSubmitRequest(1), RouterSubmitRequest(2), PrefillRestart()),
        pause_s=0.5,
        env=(("KVHANDOFF_SGLANG_DOWN_S", "5"),),
    ),
)


def default_scenario_config() -> Config:
    from kvhandoff.conformance.campaign import campaign_config

    return campaign_config()


def play(target: Target, config: Config, scenario: Scenario) -> tuple[list[Any], list[Any]]:
    """Run one scenario; returns (headers, events)."""
    target.start(config, "reference")
    events: list[Any] = []
    for action in scenario.program:
        if isinstance(action, RouterSubmitRequest):
            target.submit(action.request)
        elif isinstance(action, ClientCancelRequest):
            if scenario.cancel_after is not None:
                rid = target.request_id(action.request)
                events += _until_logged(target, scenario.cancel_after, rid)
            target.cancel(action.request)
        elif isinstance(action, PrefillRestart):
            target.restart_prefill()
        if scenario.pause_s:
            time.sleep(scenario.pause_s)
    target.settle()
    events += target.take_events()
    return log_headers(target, config), events


def _until_logged(
    target: Target, event: str, request_id: str, timeout_s: float = 30.0
) -> list[Any]:
    """The events up to and including `event` for `request_id` (taken from the target, so the
    caller keeps them); a TargetError if it is not logged in time."""
    taken: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while True:
        taken += target.take_events()
        if any(e["event"] == event and e["args"].get("request_id") == request_id for e in taken):
            return taken
        if time.monotonic() > deadline:
            raise TargetError(
                f"no {event} for {request_id} within {timeout_s:.0f} s ({len(taken)} events so "
                "far): the scenario cancels only after it"
            )
        time.sleep(0.05)


def verdict(
    headers: list[Any], events: list[Any], variant: Variant, settled: bool
) -> tuple[str, str]:
    report = search_logs(headers, split_by_server(events), variant)
    if not report.ok:
        return "diverges", report.message.splitlines()[0]
    if not settled:
        return "diverges", "the run did not settle (every_request_terminates)"
    return "conforms", ""


def write_spec_trace(
    log: Path, out: Path, variant: Variant = REFERENCE, target: str = "sglang"
) -> Path:
    """The spec behaviour that explains `log` up to its first divergence, as a trace that
    `kvhandoff explain` narrates (config as the validator reads it from the log)."""
    from kvhandoff.conformance.validate import _submissions_merged, config_from_logs, read_log

    header, events = read_log(log)
    logs = split_by_server(events)
    report = search_logs([header], logs, variant)
    config, _ = config_from_logs([header], _submissions_merged([list(q) for q in logs]))
    head = {
        "kvhandoff_trace": 1,
        "kind": "scenario",
        "variant": variant.name,
        "target": target,
        "note": (
            f"the spec behaviour explaining {report.explained} of {report.events} events of "
            f"{log.name}" + ("" if report.ok else "; the next event is the first divergence")
        ),
        "config": config.to_json(),
    }
    lines = [json.dumps(head, sort_keys=True)]
    lines += [
        json.dumps({"step": i + 1, **a}, sort_keys=True) for i, a in enumerate(report.spec_actions)
    ]
    out.write_text("\n".join(lines) + "\n")
    return out


def run(
    out: Path,
    make_target: Callable[[], Target],
    names: list[str] | None = None,
    echo: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Play SGLang's scenarios (all, or `names`), judged against the reference, the reference
    without scrubbing, and SGLang's design."""
    variants = (
        ("reference", REFERENCE),
        ("unscrubbed", UNSCRUBBED),
        ("sglang_design", SGLANG_DESIGN),
    )
    return run_scenarios(SCENARIOS, "sglang", variants, out, make_target, names, echo)


def run_scenarios(
    scenarios: tuple[Scenario, ...],
    engine: str,
    variants: tuple[tuple[str, Variant], ...],
    out: Path,
    make_target: Callable[[], Target],
    names: list[str] | None = None,
    echo: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Play an engine's scenarios (all, or `names`); one target per distinct `env`, made by
    `make_target` with those settings in os.environ and shut down after its scenarios. Each
    scenario leaves its trace, merged log and spec trace in `out` and a row of verdicts, one
    per (key, variant) of `variants`."""
    import os

    config = default_scenario_config()
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    chosen = [s for s in scenarios if not names or s.name in names]
    for env in dict.fromkeys(s.env for s in chosen):
        saved = {k: os.environ.get(k) for k, _ in env}
        os.environ.update(dict(env))
        target = make_target()
        try:
            for scenario in (s for s in chosen if s.env == env):
                rows.append(_one(out, target, config, scenario, engine, variants, echo))
        finally:
            target.shutdown()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return rows


def _one(
    out: Path,
    target: Target,
    config: Config,
    scenario: Scenario,
    engine: str,
    variants: tuple[tuple[str, Variant], ...],
    echo: Callable[[str], None],
) -> dict[str, Any]:
    headers, events = play(target, config, scenario)
    answers = target.answers()
    settled = target.quiescent()
    trace = out / f"{scenario.name}.trace.jsonl"
    trace.write_text(
        dump_trace(config, scenario.program, kind="scenario", mode="reference", target=engine)
    )
    log = out / f"{scenario.name}.log.jsonl"
    log.write_text(
        json.dumps({**headers[0], "server": "merged"}, sort_keys=True)
        + "\n"
        + "".join(json.dumps(e, sort_keys=True) + "\n" for e in events)
    )
    write_spec_trace(log, out / f"{scenario.name}.spec.jsonl", target=engine)
    row: dict[str, Any] = {"scenario": scenario.name, "what": scenario.what}
    parts = []
    for key, variant in variants:
        v, why = verdict(headers, events, variant, settled)
        row[key], row[f"{key}_first_divergence"] = v, why
        parts.append(f"{key} {v}{': ' + why if why else ''}")
    row["answers"] = {
        target.request_id(r): ("ok" if a.ok else f"error {a.code}")
        for r, a in sorted(answers.items())
    }
    row["foreign"] = {
        target.request_id(r): a.foreign for r, a in sorted(answers.items()) if a.foreign
    }
    row["settled"] = settled
    row["trace"] = str(trace)
    row["log"] = str(log)
    echo(f"{scenario.name}: " + "; ".join(parts) + f"; answers {row['answers']}")
    return row


def deep_campaign(out: Path, traces: int, steps: int, seed: int) -> int:
    """`kvhandoff conform --target sglang`'s campaign, judged against NO_DIGEST with the
    harness's allocator zeroing freed pages: what SGLang does past its two known differences.
    Exit 0 conforms, 1 diverges, 3 target failed."""
    import os

    from kvhandoff.conformance.campaign import campaign_config
    from kvhandoff.conformance.grpc_target import run_coarse_campaign
    from kvhandoff.conformance.sglang_target import SglangTarget

    os.environ["KVHANDOFF_SGLANG_SCRUB"] = "1"  # read by the harness process at its start
    target = SglangTarget()
    try:
        report = run_coarse_campaign(
            target,
            "sglang",
            "reference",
            traces,
            steps,
            seed,
            campaign_config(),
            out,
            variant=NO_DIGEST,
        )
    except TargetError as exc:
        print(f"sglang campaign: the target failed: {exc}", file=sys.stderr)
        return 3
    finally:
        target.shutdown()
    print(
        f"target sglang (judged against {NO_DIGEST.name}): {report.traces} traces of up to "
        f"{steps} steps ({report.step_count} in all) in {report.seconds:.1f} s: {report.verdict}"
    )
    for f in report.failures:
        print(f"  {f.kind} ({f.property}): {f.message}")
        print(f"  log: {f.trace_file}")
    return 0 if report.conforms else 1


def main(argv: list[str] | None = None) -> int:
    from kvhandoff.conformance.sglang_target import SglangTarget

    p = argparse.ArgumentParser(prog="python -m kvhandoff.conformance.sglang_scenarios")
    p.add_argument("--out", default="kvhandoff-report/sglang", help="where traces and logs go")
    p.add_argument("--json", action="store_true", help="print the rows as one JSON list")
    p.add_argument(
        "--campaign",
        type=int,
        metavar="TRACES",
        help="instead: a random campaign of TRACES programs judged against the reference with "
        "SGLang's transfer check (no digest, no validation), the harness zeroing freed pages",
    )
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--spec-traces",
        action="store_true",
        help="only (re)write NAME.spec.jsonl from the logs already in --out (no SGLang needed)",
    )
    p.add_argument("names", nargs="*", help="scenarios to run (default: all)")
    args = p.parse_args(argv)
    if args.campaign:
        return deep_campaign(Path(args.out), args.campaign, args.steps, args.seed)
    if args.spec_traces:
        for log in sorted(Path(args.out).glob("*.log.jsonl")):
            print(write_spec_trace(log, log.with_name(log.name.replace(".log.", ".spec."))))
        return 0
    try:
        rows = run(Path(args.out), SglangTarget, args.names, echo=lambda s: print(s, flush=True))
    except TargetError as exc:
        print(f"sglang scenarios: the target failed: {exc}", file=sys.stderr)
        return 3
    if args.json:
        print(json.dumps(rows, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
