"""Fault campaign over the real gRPC servers on loopback (issue 15).

Each trace is a random (seeded) program over the sequential scenario (3 requests, two tenants,
request 1 longer than prefill's limit: the *oversize* fault is in every trace), with the faults
asked for:

=========  ==================================================================================
crash      prefill or decode crashes and restarts with requests in flight
restart    prefill crashes and restarts once every request has settled
cancel     the client cancels a request it submitted
timeout    prefill's writes of a request stall past decode's waiting timeout (1 s here)
late       control messages between prefill and decode are delayed (they reorder)
dup        control messages are delivered twice
drop       aborts and abort acks are lost (their senders repeat them)
oversize   (always) a prompt over prefill's limit
=========  ==================================================================================

A trace is judged as `run_coarse_campaign` judges one: its merged event log must be explained by
the reference spec (`validate-log`), no answer may carry another tenant's canary, every request
is answered, and every decode page is free once the cluster is quiescent. The campaign stops at
the first failing trace and saves its program and merged log; with ``keep_going`` it counts every
failing trace (each kind of failure apart) and saves each one's log. ``save_logs`` keeps every
trace's logs (gzipped JSON Lines, one trace a line) so that a long campaign can be judged again
later by another validator (`revalidate`) without running the servers again.
"""

from __future__ import annotations

import gzip
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvhandoff.conformance.grpc_target import GrpcTarget, log_headers, split_by_server
from kvhandoff.conformance.target import Target
from kvhandoff.conformance.validate import Event, deployment_of, search_logs
from kvhandoff.spec.actions import Action, ClientCancelRequest, PrefillRestart, RouterSubmitRequest
from kvhandoff.spec.config import Config

FAULTS = ("crash", "restart", "cancel", "timeout", "late", "dup", "drop", "oversize")
DEFAULT_FAULTS = FAULTS


def parse_faults(text: str) -> frozenset[str]:
    """``crash,restart,...`` (or ``all``) -> the set; a ValueError names an unknown fault."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return frozenset(FAULTS)
    unknown = [n for n in names if n not in FAULTS]
    if unknown or not names:
        raise ValueError(
            f"unknown fault {', '.join(unknown) or '(none)'}; faults: {', '.join(FAULTS)}"
        )
    return frozenset(names)


@dataclass
class FaultReport:
    mode: str
    faults: list[str]
    traces: int = 0
    divergences: int = 0
    cross_tenant_reads: int = 0
    unanswered: int = 0
    pages_lost: int = 0
    seconds: float = 0.0
    injected: Counter[str] = field(default_factory=Counter)
    failure: dict[str, str] | None = None
    failures: list[dict[str, str]] = field(default_factory=list)
    """Every failing trace (only the first unless the campaign keeps going)."""

    @property
    def conforms(self) -> bool:
        return self.failure is None

    def to_json(self) -> dict[str, Any]:
        return {
            "target": "grpc",
            "mode": self.mode,
            "faults": self.faults,
            "traces": self.traces,
            "verdict": "conforms" if self.conforms else "diverges",
            "divergences": self.divergences,
            "cross_tenant_reads": self.cross_tenant_reads,
            "unanswered": self.unanswered,
            "pages_lost_at_quiescence": self.pages_lost,
            "seconds": round(self.seconds, 1),
            "injected": dict(sorted(self.injected.items())),
            "failure": self.failure,
        }


Problem = tuple[str, str, str]


def trace_problems(
    target: Target, submitted: list[int], headers: list[dict[str, Any]], events: list[Event]
) -> list[Problem]:
    """Every way a trace fails, as (kind, property, message): unexplained events, another
    tenant's canary in an answer, an unanswered request, pages held at quiescence, data. Each
    kind is judged on its own (a divergent trace is still checked for leaks and answers)."""
    out: list[Problem] = []
    logs = split_by_server(events)
    report = search_logs(headers, logs, deployment=deployment_of(logs, headers))
    if not report.ok:
        prop = report.violated[0] if report.violated else "conformance"
        out.append(("unexplained_event", prop, report.message))
    answers = target.answers()
    for r, ans in answers.items():
        for writer, tenant in ans.foreign:
            out.append(
                (
                    "isolation",
                    "no_cross_tenant_read",
                    f"answer to {target.request_id(r)} carries the canary of tenant {tenant} "
                    f"(requests {writer})",
                )
            )
    for r in submitted:
        if r not in answers:
            out.append(
                ("no_answer", "every_request_terminates", f"{target.request_id(r)} unanswered")
            )
    if not target.quiescent():
        out.append(("not_quiescent", "every_request_terminates", target.describe()))
    problems = getattr(target, "answer_problems", None)
    for problem in problems() if problems is not None else []:
        out.append(("data", "decode_reads_only_validated_pages", problem))
    dirty = getattr(target, "dirty_free_pages", None)
    pages = dirty() if dirty is not None else []
    if pages:
        out.append(
            (
                "data",
                "freed_pages_hold_no_readable_data",
                f"decode pages {pages} are free and not zeroed after the run settled",
            )
        )
    return out


class _FaultTarget(GrpcTarget):
    """GrpcTarget that stalls chosen requests' writes (the timeout fault)."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.stall: set[int] = set()

    def settle(self) -> None:
        super().settle()
        # A delayed control message of this trace must land in this trace's logs, not the next.
        plan = self.cluster.faults
        deadline = time.monotonic() + 5.0
        while plan is not None and plan.in_flight > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        if plan is not None and plan.max_delay_s:
            time.sleep(plan.max_delay_s)  # a send that had not yet entered the plan
        super().settle()
        # The spec starts each trace with every worker up and reachable: wait until the
        # servers' channels to each other have reconnected after this trace's restarts, so a
        # hand-over of the next trace is not held back by this one's reconnect backoff.
        self.cluster.wait_peers_connected()

    def submit(self, r: int) -> None:
        if r in self.stall:
            self.cluster.stall_prefill_writes(self.request_id(r), after_messages=0)
        super().submit(r)


def run_fault_campaign(
    mode: str,
    traces: int,
    seed: int,
    faults: frozenset[str],
    out: Path,
    config: Config | None = None,
    steps: int = 20,
    device: str = "cpu",
    keep_going: bool = False,
    save_logs: Path | None = None,
    instances: bool = False,
    rooms_any: bool = False,
) -> FaultReport:
    """`instances`: the scenario on two prefill and two decode servers (`campaign_config`),
    each trace drawing one placement of the requests; a crash or restart is of one instance."""
    from kvhandoff.conformance.campaign import campaign_config
    from kvhandoff.impl.servers.faults import FaultPlan
    from kvhandoff.spec.config import placements

    cfg = config or campaign_config(instances=instances, rooms_any=rooms_any)
    # One placement per trace where there are several instances (nothing is drawn with one of
    # each, so such a campaign's traces are as before).
    placed = placements(cfg)
    prefills, decodes = cfg.prefill_instances, cfg.decode_instances
    report = FaultReport(mode, sorted(faults))
    # Short timers so a trace with lost aborts or stalled writes settles in well under a second.
    settings: dict[str, Any] = {
        "admission_timeout_s": 5.0,
        "prefill_grant_timeout_s": 5.0,
        "abort_retry_s": 0.2,
    }
    if "timeout" in faults:
        settings["waiting_timeout_s"] = 1.0
    target = _FaultTarget(device=device, **settings)
    plan = FaultPlan(
        late=0.3 if "late" in faults else 0.0,
        dup=0.15 if "dup" in faults else 0.0,
        drop=0.3 if "drop" in faults else 0.0,
    )
    start = time.perf_counter()
    saved = None
    if save_logs is not None:
        save_logs.parent.mkdir(parents=True, exist_ok=True)
        saved = gzip.open(save_logs, "wt")
    try:
        for i in range(traces):
            rng = random.Random(seed * 1_000_003 + i)
            scenario = rng.choice(placed) if len(placed) > 1 else cfg
            target.stall = (
                {r for r in range(len(cfg.requests)) if rng.random() < 0.15}
                if "timeout" in faults
                else set()
            )
            target.start(scenario, mode)
            target.cluster.set_faults(plan)
            plan.reseed(seed * 7_919 + i)
            program: list[Action] = []
            submitted: list[int] = []
            crashes = 0
            for _ in range(steps):
                choices: list[str] = []
                if len(submitted) < len(cfg.requests):
                    choices.append("submit")
                if "cancel" in faults and submitted:
                    choices.append("cancel")
                if crashes < cfg.max_crashes and rng.random() < 0.1:
                    if "crash" in faults:
                        choices += ["crash_prefill", "crash_decode"]
                    if "restart" in faults:
                        choices.append("restart")
                if not choices:
                    break
                what = rng.choice(choices)
                if what == "submit":
                    r = len(submitted)
                    submitted.append(r)
                    program.append(RouterSubmitRequest(r))
                    target.submit(r)
                    time.sleep(rng.choice((0.0, 0.002, 0.01)))
                elif what == "cancel":
                    r = rng.choice(submitted)
                    program.append(ClientCancelRequest(r))
                    target.cancel(r)
                elif what in ("restart", "crash_prefill"):
                    if what == "restart":
                        for r in submitted:
                            target.wait_answered(r)
                        target.settle()
                    crashes += 1
                    pinst = rng.randrange(prefills) if prefills > 1 else 0
                    program.append(PrefillRestart(pinst=pinst))
                    target.restart_prefill(pinst)
                    report.injected[what] += 1
                else:
                    crashes += 1
                    target.restart_decode(rng.randrange(decodes) if decodes > 1 else 0)
                    report.injected["crash_decode"] += 1
            for r in sorted(target.stall):
                if r in submitted:
                    report.injected["timeout"] += 1
                    target.cluster.resume_prefill_writes(target.request_id(r))
            target.settle()
            report.traces += 1
            events = target.take_events()
            headers = log_headers(target, scenario)
            problems = trace_problems(target, submitted, headers, events)
            program_text = " ".join(type(a).__name__ for a in program)
            if saved is not None:
                record = {
                    "seed": seed,
                    "trace": i,
                    "program": program_text,
                    "headers": headers,
                    "events": events,
                    "problems": [list(p) for p in problems],
                }
                saved.write(json.dumps(record, sort_keys=True) + "\n")
            if not problems:
                continue
            kinds = {kind for kind, _, _ in problems}
            report.divergences += "unexplained_event" in kinds
            report.cross_tenant_reads += "isolation" in kinds
            report.unanswered += "no_answer" in kinds
            report.pages_lost += "not_quiescent" in kinds
            kind, prop, message = problems[0]
            out.mkdir(parents=True, exist_ok=True)
            log_path = out / f"faults-{mode}-seed{seed}-trace{i}.log.jsonl"
            log_path.write_text(
                json.dumps({**headers[0], "server": "merged"}, sort_keys=True)
                + "\n"
                + "".join(json.dumps(e, sort_keys=True) + "\n" for e in events)
            )
            failure = {
                "trace": str(i),
                "kind": kind,
                "property": prop,
                "message": message,
                "program": program_text,
                "log": str(log_path),
            }
            report.failures.append(failure)
            if report.failure is None:
                report.failure = failure
            if not keep_going:
                break
    finally:
        if saved is not None:
            saved.close()
        report.injected.update(plan.counts)
        target.shutdown()
        report.seconds = time.perf_counter() - start
    return report


def revalidate(path: Path) -> tuple[int, list[dict[str, Any]]]:
    """Judge the event logs a campaign kept (``save_logs``) again with this validator:
    (traces read, the traces whose logs it cannot explain, each with its seed, trace, program
    and the validator's message). The other checks (answers, canaries, quiescence) were made
    on the live servers and are kept in each record's ``problems``."""
    traces = 0
    unexplained: list[dict[str, Any]] = []
    with gzip.open(path, "rt") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            traces += 1
            logs = split_by_server(rec["events"])
            report = search_logs(
                rec["headers"], logs, deployment=deployment_of(logs, rec["headers"])
            )
            if not report.ok:
                unexplained.append(
                    {
                        "seed": rec["seed"],
                        "trace": rec["trace"],
                        "program": rec["program"],
                        "message": report.message,
                    }
                )
    return traces, unexplained
