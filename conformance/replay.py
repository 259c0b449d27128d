"""Replay any trace file against a target, deterministically, with the reference spec as oracle.

    from kvhandoff.conformance.replay import incident_counterexample, replay_trace
    report = replay_trace(incident_counterexample(), "inproc", mode="incident")
    report.leaks        # [("r1", "r0")]: r1's answer carries r0's canary (another tenant)
    report.verdict      # "diverges"; report.first_divergence says where and why

Each trace step is driven on the target (`conformance.lockstep.drive`), whatever happens, so a
counterexample plays out to its end. Two validators watch the target's events: the *oracle*
(the reference protocol: where the target stops conforming) and, when the trace names a variant,
the *trace's own variant* (where the target stops doing what the trace predicted). At the end
the target settles and the answers are checked: every request answered, no canary of another
tenant, ok answers generated from the data the spec says, and the target quiescent (the reference
protocol, once faults stop, ends every request and frees every page: `every_request_terminates`).

`ReplayReport.reproduced` names what the target's run broke: an `always` property that every state
of the trace's own variant explaining the target's events violates (the target did what the
counterexample shows), and `every_request_terminates` when the target did not settle. The first
is as good as the events are telling: where the variant differs from the target in state that no
event shows (say pages the variant leaves unscrubbed on a decode restart), the variant's states
can break a property that the target did not; read it together with `as_predicted`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvhandoff.conformance import adversary
from kvhandoff.conformance.grpc_target import log_headers, split_by_server
from kvhandoff.conformance.lockstep import drive
from kvhandoff.conformance.target import Target, require_one_prefill_rank
from kvhandoff.conformance.validate import Ids, Validator, search_logs
from kvhandoff.spec.actions import RouterSubmitRequest, action_name, action_to_json
from kvhandoff.spec.config import Config
from kvhandoff.spec.properties import check_always
from kvhandoff.spec.trace import Trace, TraceError, load_trace
from kvhandoff.spec.trace import replay as spec_replay
from kvhandoff.spec.variants import REFERENCE, UnknownVariantError, Variant, get_variant


@dataclass
class ReplayStep:
    index: int
    action: dict[str, Any]
    performed: bool
    events: list[str]
    conforms: bool
    """The reference oracle explains every event so far."""
    as_predicted: bool | None
    """The trace's own variant explains every event so far (None: the trace names none)."""


@dataclass
class ReplayReport:
    mode: str
    target: str
    steps: list[ReplayStep] = field(default_factory=list)
    first_divergence: dict[str, Any] | None = None
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    leaks: list[tuple[str, str]] = field(default_factory=list)
    """(reader request id, writer request id): an answer carrying another tenant's canary."""
    problems: list[str] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    not_covered: dict[str, str] = field(default_factory=dict)
    """Operations the target said it cannot perform (their steps were not taken)."""
    reproduced: list[str] = field(default_factory=list)
    """Properties the target's run broke (see the module docstring), in the order seen."""

    @property
    def verdict(self) -> str:
        ok = self.first_divergence is None and not self.leaks and not self.problems
        return "conforms" if ok else "diverges"

    @property
    def conforms(self) -> bool:
        return self.verdict == "conforms"

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "mode": self.mode,
            "verdict": self.verdict,
            "first_divergence": self.first_divergence,
            "leaks": [{"reader": r, "writer": w} for r, w in self.leaks],
            "answers": self.answers,
            "problems": self.problems,
            "not_covered": dict(sorted(self.not_covered.items())),
            "reproduced": self.reproduced,
            "steps": [
                {
                    "step": s.index,
                    "action": s.action,
                    "performed": s.performed,
                    "events": s.events,
                    "conforms": s.conforms,
                    "as_predicted": s.as_predicted,
                }
                for s in self.steps
            ],
        }

    def summary(self) -> str:
        lines = [f"replay on {self.target} in mode {self.mode}: {self.verdict}"]
        for s in self.steps:
            mark = "ok " if s.conforms else "!! "
            done = "" if s.performed else " (nothing to do on the target now)"
            lines.append(
                f"  {mark}{s.index:3d}. {s.action['action']}{done} -> {', '.join(s.events) or '-'}"
            )
        if self.first_divergence:
            lines.append(f"first divergence: {self.first_divergence['message']}")
        for reader, writer in self.leaks:
            lines.append(f"ISOLATION FAILURE: the answer to {reader} carries {writer}'s canary")
        for p in self.problems:
            lines.append(f"problem: {p}")
        for op, why in sorted(self.not_covered.items()):
            lines.append(f"not covered: {op} ({why})")
        if self.reproduced:
            lines.append(f"reproduced: {', '.join(self.reproduced)}")
        for rid, a in sorted(self.answers.items()):
            lines.append(
                f"  answer {rid}: {'ok' if a['ok'] else 'error ' + a['code']} {a['message']}".rstrip()
            )
        return "\n".join(lines)


def _variant_of(trace: Trace) -> Variant | None:
    name = trace.header.get("variant")
    if not isinstance(name, str):
        return None
    try:
        return get_variant(name)
    except UnknownVariantError:
        return None


def replay_trace(
    trace: Trace | str | Path,
    target: Target | str,
    mode: str | None = None,
    variant: Variant | None = None,
) -> ReplayReport:
    """Play `trace` on `target` (a Target or a target name) in `mode` (default: the trace's
    `mode` header, else its `variant` when that is a mode name, else reference). `variant`: the
    trace's own variant when the caller has loaded it (a variant file); default: the catalogue
    variant the header names, if any."""
    from kvhandoff.conformance.campaign import make_target
    from kvhandoff.impl.modes import MODES

    if isinstance(trace, Path):
        trace = load_trace(trace.read_text())
    elif isinstance(trace, str):
        trace = load_trace(trace)
    if isinstance(target, str):
        # A target made here is released here: a gRPC target keeps its servers between traces.
        owned = make_target(target)
        try:
            return replay_trace(trace, owned, mode, variant)
        finally:
            owned.shutdown()
    if mode is None:
        named = trace.header.get("mode") or trace.header.get("variant")
        mode = named if isinstance(named, str) and named in MODES else "reference"
    config: Config = trace.config
    require_one_prefill_rank(config, retries=target.retries, instances=target.instances)
    report = ReplayReport(mode=mode, target=target.name)
    # Prompts that ended inside a page when the trace was recorded (`Target.shortfall`).
    target.shortfall = {int(r): int(n) for r, n in dict(trace.header.get("shortfall", {})).items()}
    target.start(config, mode)
    try:
        ids = Ids(config.page_size)
        for r in range(len(config.requests)):
            ids.requests[target.request_id(r)] = r
        oracle = Validator(config, ids, REFERENCE)
        if variant is None:
            variant = _variant_of(trace)
        predicted = None
        if variant is not None:
            ids2 = Ids(config.page_size, dict(ids.requests))
            predicted = Validator(config, ids2, variant, check_properties=False)

        def absorb() -> list[str]:
            kinds: list[str] = []
            if not target.fine_grained:
                return kinds
            for ev in target.take_events():
                report.events.append(ev)
                kinds.append(f"{ev['server']}:{ev['event']}")
                if not oracle.feed(ev) and report.first_divergence is None:
                    rep = oracle.report()
                    report.first_divergence = {
                        "step": len(report.steps) + 1,
                        "message": rep.message,
                        "event": rep.first_unexplained,
                        "violated": rep.violated,
                        "enabled_there": rep.enabled_there,
                    }
                if predicted is not None and predicted.feed(ev):
                    note_reproduced(predicted)
            return kinds

        # A probe's failure counts only where the events themselves diverge nowhere (the
        # event that first diverges says more about what the target did).
        probed: list[dict[str, Any]] = []
        answered = 0  # probes the target answered

        def probe_divergence(at: int) -> None:
            # The adversarial probes of a lockstep run (`conformance.adversary`), so that a
            # campaign failure they found replays too.
            nonlocal answered
            state = next(iter(oracle.frontier))
            for attack in adversary.attacks_for(state):
                want = adversary.expected(REFERENCE, config, state, attack)
                got = target.probe(attack) if want is not None else None
                if want is None or got is None:
                    continue
                answered += 1
                problem = adversary.judge(attack, want, got)
                if problem is not None:
                    probed.append(
                        {
                            "step": at,
                            "message": problem,
                            "event": None,
                            "violated": [want.prop],
                            "enabled_there": [],
                        }
                    )
                    return

        def note_reproduced(v: Validator) -> None:
            # Broken in *every* state that explains the events: the target's run, not one of
            # several spec behaviours that fit it, broke the property.
            states = list(v.frontier)
            common = {p.name for p in check_always(config, states[0])}
            for st in states[1:]:
                common &= {p.name for p in check_always(config, st)}
            for name in sorted(common - set(report.reproduced)):
                report.reproduced.append(name)

        absorb()
        states = None
        if not target.fine_grained and variant is not None:
            try:
                states = spec_replay(variant, config, trace.actions)
            except TraceError:
                states = None
        for i, action in enumerate(trace.actions, start=1):
            if states is not None and isinstance(action, RouterSubmitRequest):
                # A coarse target runs each request on its own: keep the trace's order by
                # waiting for the requests the trace had answered by now.
                for r, req in enumerate(states[i - 1].requests):
                    if req.submitted and req.answer is not None:
                        target.wait_answered(r)
            performed = drive(target, action)
            kinds = absorb()
            if target.fine_grained and not probed and oracle.failed is None:
                probe_divergence(len(report.steps) + 1)
            report.steps.append(
                ReplayStep(
                    i,
                    action_to_json(action),
                    performed,
                    kinds,
                    oracle.failed is None,
                    None if predicted is None else predicted.failed is None,
                )
            )
        target.settle()
        if not target.fine_grained:
            # A coarse target's servers log concurrently: validate the whole run at once,
            # searching the interleavings of the per-server logs.
            events = target.take_events()
            report.events.extend(events)
            head = log_headers(target, config)
            logs = split_by_server(events)
            rep = search_logs(head, logs)
            if not rep.ok:
                report.first_divergence = {
                    "step": None,
                    "message": rep.message,
                    "event": rep.first_unexplained,
                    "violated": rep.violated,
                    "enabled_there": rep.enabled_there,
                }
            if predicted is not None and variant is not None:
                pred = search_logs(head, logs, variant)
                for s_ in report.steps:
                    s_.as_predicted = pred.ok
            for s_ in report.steps:
                s_.conforms = rep.ok
        settle_kinds = absorb() if target.fine_grained else []
        if settle_kinds:
            report.steps.append(
                ReplayStep(
                    len(trace.actions) + 1,
                    {"action": "settle", "args": {}},
                    True,
                    settle_kinds,
                    oracle.failed is None,
                    None if predicted is None else predicted.failed is None,
                )
            )
        for r, ans in sorted(target.answers().items()):
            rid = target.request_id(r)
            report.answers[rid] = {
                "ok": ans.ok,
                "code": ans.code,
                "message": ans.message,
                "read": ans.read,
                "tenant": config.requests[r].tenant,
            }
            for writer, _tenant in ans.foreign:
                report.leaks.append((rid, writer))
        submitted = {
            ev["args"].get("request_id")
            for ev in report.events
            if ev["event"] in ("router_submit_request", "router_reject_request")
        }
        for rid in sorted(str(x) for x in submitted):
            if rid not in report.answers:
                report.problems.append(f"{rid} was never answered")
        if not target.quiescent():
            report.problems.append(
                "every_request_terminates: the target settled (no further faults) with requests "
                "in progress or pages held, where the spec ends every request and frees its "
                "pages: " + target.describe()
            )
            report.reproduced.append("every_request_terminates")
        if report.first_divergence is None and probed:
            report.first_divergence = probed[0]
        report.not_covered = target.not_covered()
        if trace.header.get("failure") == "adversarial" and not answered:
            # The saved failure was a forged message's; a target that answered no probe cannot
            # show it again, and its "conforms" must not read as if it had.
            note = (
                "this trace's failure was found by an adversarial probe (a forged message "
                "against decode), and the target answered none (Target.probe)"
            )
            why = report.not_covered.get("probe")
            report.not_covered["probe"] = f"{why}; {note}" if why else note
    finally:
        target.close()
        target.shortfall = {}
    return report


def incident_counterexample(prop: str = "no_cross_tenant_read", max_faults: int = 0) -> Trace:
    """The model checker's shortest counterexample for `prop` on the incident variant (default:
    the fault-free cross-tenant read, which leaks on real servers too)."""
    from kvhandoff.model_checker.engines import ENGINES, EngineOptions
    from kvhandoff.spec.config import default_config

    config = replace(default_config(), max_faults=max_faults)
    variant = get_variant("incident")
    result = ENGINES["explore"](variant, config, EngineOptions())
    for r in result.results:
        if r.property == prop and r.trace:
            return Trace(config, tuple(r.trace), {"variant": "incident", "property": prop})
    raise LookupError(f"the explorer found no counterexample for {prop} on the incident variant")


def step_names(report: ReplayReport) -> list[str]:
    return [str(s.action["action"]) for s in report.steps]


__all__ = ["ReplayReport", "ReplayStep", "action_name", "incident_counterexample", "replay_trace"]
