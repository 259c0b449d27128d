"""The main job: the incident, from spec to proof to a real leak, in one run and one report.

Stages (each a small function; the demo calls them in this order):

1. `prove_reference`: the reference protocol is safe. Through the Z3 `prove` engine when
   `model_checker.engines.ENGINES` has one (any pool size), otherwise the explorer's exhaustive
   check of the embedded sequential scenario; the output says which.
2. `find_incident_counterexample`: the incident variant on the sequential scenario, and the
   shortest run that breaks `no_cross_tenant_read` with no fault at all (the incident needed none).
3. `replay_on_real_servers`: the requests of that counterexample sent to the real gRPC servers on
   loopback, with each tenant's canary tokens as its prompt: in `incident` mode tenant b's answer
   holds tenant a's canary; in `reference` mode it is a clear error. (When the conformance suite's
   replay API lands, it replaces the body of this function.)
4. `run_conformance_campaign`: a short `kvhandoff conform` campaign, when that subcommand exists.
5. `kill_matrix`: every catalogue variant through the explorer: each bug caught, each safe design safe.

`write_report` then writes `report.md` (sequence chart, proof obligations, kill matrix, figures),
`report.json`, the traces and the servers' event logs into the output folder.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import io
import json
import multiprocessing
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from kvhandoff.model_checker.engines import ENGINES, EngineOptions
from kvhandoff.model_checker.explain import (
    Story,
    build_story,
    same_requests_under,
    to_markdown,
    to_mermaid,
)
from kvhandoff.model_checker.explore import explore
from kvhandoff.model_checker.result import CheckResult
from kvhandoff.spec.actions import RouterSubmitRequest, action_name
from kvhandoff.spec.config import Config, default_config
from kvhandoff.spec.properties import ALWAYS, TERMINATION
from kvhandoff.spec.trace import dump_trace, load_trace
from kvhandoff.spec.variants import REFERENCE, VARIANTS, get_variant

STAGES = ("prove", "counterexample", "replay", "conformance", "matrix")
NOT_AVAILABLE = "not available in this build"
LEAK_PROPERTY = "no_cross_tenant_read"

# Each tenant's prompt is made of its own canary alphabet, so any token of another tenant's
# canary in an answer is a leak (the write-up's "two-account tests with unique canary strings").
CANARIES = ("QZXJALPHAKVW", "qzxjbetakvw", "0123456789")


# --- Stage 1: prove the reference protocol ------------------------------------------------------


@dataclass
class Proof:
    result: CheckResult
    method: str  # how it was shown, in a few words
    any_size: bool
    note: str = ""  # e.g. why not the Z3 proof


def prove_reference(config: Config) -> Proof:
    """Hook for the Z3 engines: uses `ENGINES["prove"]` when registered, else exhaustive search."""
    prove = ENGINES.get("prove")
    if prove is not None:
        result = prove(REFERENCE, config, EngineOptions())
        # Say what was proved: the scope the engine reports, not the one it is meant to reach.
        any_size = result.verdict == "safe" and result.scope == "any-size"
        if any_size:
            method = "proved for any pool size and any number of requests (Z3 prove)"
        else:
            method = f"Z3 prove: {result.verdict} for {result.scope_text()}"
        return Proof(result, method, any_size)
    result = explore(REFERENCE, config)
    method = f"exhaustive search of the sequential scenario, {result.states:,} states stored"
    return Proof(result, method, False, note=f"the Z3 prove engine is {NOT_AVAILABLE}")


# --- Stage 2: the incident counterexample -------------------------------------------------------


@dataclass
class Counterexample:
    default_result: CheckResult  # the incident variant, sequential scenario, with faults
    trace_text: str  # the fault-free counterexample for no_cross_tenant_read
    story: Story
    fault_free_result: CheckResult
    fix: Story  # the same requests under the reference protocol


def find_incident_counterexample(config: Config) -> Counterexample:
    incident = get_variant("incident")
    default_result = explore(incident, config)
    quiet = replace(config, max_faults=0)
    fault_free = explore(incident, quiet)
    prop = fault_free.result_for(LEAK_PROPERTY)
    if prop.trace is None:
        raise RuntimeError("the incident variant no longer breaks no_cross_tenant_read")
    text = fault_free.trace_text(prop)
    trace = load_trace(text)
    story = build_story(incident, trace)
    fix = build_story(REFERENCE, same_requests_under(REFERENCE, trace))
    return Counterexample(default_result, text, story, fault_free, fix)


# --- Stage 3: replay on the real servers --------------------------------------------------------


@dataclass
class ScenarioRequest:
    tenant: str
    pages: int
    oversized: bool  # over prefill's limit but within decode's and the window


def scenario_from_trace(config: Config, actions: Sequence[Any]) -> list[ScenarioRequest]:
    """The client requests a trace submits, in order, and whether each is over prefill's limit."""
    out = []
    for action in actions:
        if isinstance(action, RouterSubmitRequest):
            spec = config.requests[action.request]
            oversized = config.prefill_max_prompt < spec.pages <= config.decode_max_prompt
            out.append(ScenarioRequest(spec.tenant, spec.pages, oversized))
    return out


@dataclass
class RealAnswer:
    tenant: str
    prompt_tokens: int
    oversized: bool
    status: str
    code: str
    error: str
    tokens: list[int]
    leaked: list[int]  # positions of tokens from another tenant's canary
    seconds: float

    @property
    def text(self) -> str:
        return "".join(chr(t) if 32 <= t < 127 else "." for t in self.tokens)

    def as_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "prompt_tokens": self.prompt_tokens,
            "oversized": self.oversized,
            "status": self.status,
            "code": self.code,
            "error": self.error,
            "answer_text": self.text,
            "leaked_tokens": len(self.leaked),
            "seconds": round(self.seconds, 4),
        }


@dataclass
class RealReplay:
    mode: str
    limits: dict[str, int]
    answers: list[RealAnswer]
    seconds: float
    quiescent: bool

    @property
    def leaked(self) -> bool:
        return any(a.leaked for a in self.answers)

    def as_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "limits": self.limits,
            "answers": [a.as_json() for a in self.answers],
            "leak": self.leaked,
            "quiescent_after": self.quiescent,
            "seconds": round(self.seconds, 3),
        }


def replay_on_real_servers(
    scenario: Sequence[ScenarioRequest], mode: str, log_dir: Path | None = None
) -> RealReplay:
    """Start prefill, decode and router on loopback in `mode` and send the scenario's requests.

    The pools have the incident's shape (a context window and a decode pool larger than the
    prefill pool), so an oversized request passes the router and decode but not prefill.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*NumPy.*")  # torch without numpy: harmless
        from kvhandoff.impl.cluster import start_cluster
        from kvhandoff.impl.tokenizer import encode

    tenants = sorted({r.tenant for r in scenario})
    canary = {t: CANARIES[i % len(CANARIES)] for i, t in enumerate(tenants)}
    alphabet = {t: set(encode(c)) for t, c in canary.items()}
    started = time.perf_counter()
    settings: dict[str, Any] = {
        "decode_pages": 128,
        "prefill_pages": 32,
        "context_window": 512,
        "waiting_timeout_s": 5.0,
        "heartbeat_interval_s": 0.1,
    }
    if log_dir is not None:
        settings["log_dir"] = log_dir
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*NumPy.*")
        cluster = start_cluster(mode, **settings)
    answers: list[RealAnswer] = []
    with cluster:
        lim = cluster.limits
        with cluster.client() as client:
            for req in scenario:
                if req.oversized:
                    length = (lim.prefill_max_prompt + lim.decode_max_prompt) // 2
                else:
                    length = lim.prefill_max_prompt * 3 // 4
                text = (canary[req.tenant] * (length // len(canary[req.tenant]) + 1))[:length]
                t0 = time.perf_counter()
                rid = f"demo-{mode}-{len(answers) + 1}"
                r = client.generate(
                    req.tenant, encode(text), max_tokens=32, request_id=rid, timeout=30
                )
                seconds = time.perf_counter() - t0
                others = set().union(*(alphabet[t] for t in tenants if t != req.tenant))
                leaked = [i for i, tok in enumerate(r.tokens) if tok in others]
                answers.append(
                    RealAnswer(
                        req.tenant,
                        length,
                        req.oversized,
                        r.status,
                        r.code,
                        r.error,
                        list(r.tokens),
                        leaked,
                        seconds,
                    )
                )
        quiescent = cluster.wait_quiescent(10)
    return RealReplay(mode, lim.as_json(), answers, time.perf_counter() - started, quiescent)


# --- Stage 4: conformance -----------------------------------------------------------------------


CONFORM_ARGS = ["--target", "inproc", "--traces", "30", "--steps", "30", "--seed", "1", "--json"]


def run_conformance_campaign(out_dir: Path) -> dict[str, Any] | None:
    """Hook for the conformance suite: a short `kvhandoff conform` campaign, or None.

    Runs only when a `conform` subcommand is registered in `kvhandoff_cli.main.COMMAND_MODULES`
    (the CLI contract: `conform --target inproc --traces N --steps N --seed S --junit F --json`).
    """
    from kvhandoff.cli import main as cli

    parser = cli.build_parser(cli.COMMAND_MODULES)
    commands: set[str] = set()
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        commands |= set(getattr(action, "choices", {}) or {})
    if "conform" not in commands:
        return None
    junit = out_dir / "conformance-junit.xml"
    buffer = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(buffer):
        code = cli.main(["conform", *CONFORM_ARGS, "--junit", str(junit)], cli.COMMAND_MODULES)
    output = buffer.getvalue()
    try:
        parsed: Any = json.loads(output)
    except json.JSONDecodeError:
        parsed = output
    return {
        "exit_code": code,
        "verdict": {0: "conforms", 1: "diverges"}.get(code, "inconclusive"),
        "command": "kvhandoff conform " + " ".join(CONFORM_ARGS),
        "result": parsed,
        "seconds": round(time.perf_counter() - started, 3),
    }


# --- Stage 5: the kill matrix -------------------------------------------------------------------


@dataclass
class MatrixRow:
    variant: str
    m_numbers: list[str]
    summary: str
    expected: list[str]
    violated: list[str]
    states: int
    seconds: float

    @property
    def caught(self) -> bool:
        if not self.expected:
            return not self.violated
        return all(p in self.violated for p in self.expected)

    def as_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "m_numbers": self.m_numbers,
            "expected_breaks": self.expected,
            "violated": self.violated,
            "as_expected": self.caught,
            "states": self.states,
            "seconds": round(self.seconds, 3),
        }


def _matrix_row(name: str, config_json: dict[str, Any]) -> MatrixRow:
    variant = get_variant(name)
    # On the variant's own scenario (e.g. two prefill ranks for a rank-quorum bug).
    result = explore(variant, variant.scenario(Config.from_json(config_json)))
    return _row(result)


def _row(result: CheckResult) -> MatrixRow:
    variant = get_variant(result.variant)
    return MatrixRow(
        variant.name,
        list(variant.m_numbers),
        variant.summary,
        list(variant.breaks),
        [r.property for r in result.violated()],
        result.states or 0,
        result.seconds,
    )


def kill_matrix(
    config: Config,
    known: Sequence[CheckResult] = (),
    workers: int | None = None,
    names: Sequence[str] | None = None,
) -> list[MatrixRow]:
    """Catalogue variants (all, or `names`) through the explorer, in parallel processes.

    Results in `known` (explicit search on the same config) are reused rather than run again.
    """
    wanted = [v.name for v in VARIANTS if names is None or v.name in names]
    done = {
        r.variant: _row(r)
        for r in known
        if r.engine == "explore" and r.config == get_variant(r.variant).scenario(config)
    }
    todo = [name for name in wanted if name not in done]
    workers = workers or min(len(todo), max(1, os.cpu_count() or 1))
    from kvhandoff.model_checker import progress as shown_progress

    def finished(row: MatrixRow) -> None:
        done[row.variant] = row
        shown_progress.report("matrix", variants=f"{len(done)}/{len(wanted)}", last=row.variant)

    if todo and workers > 1:
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            # As each finishes (not in order), so the progress line moves with the work.
            futures = [pool.submit(_matrix_row, name, config.to_json()) for name in todo]
            for future in concurrent.futures.as_completed(futures):
                finished(future.result())
    else:
        for name in todo:
            finished(_matrix_row(name, config.to_json()))
    return [done[name] for name in wanted]


# --- Running it all -----------------------------------------------------------------------------


@dataclass
class DemoRun:
    out_dir: Path
    stages: tuple[str, ...]
    config: Config = field(default_factory=default_config)
    proof: Proof | None = None
    counterexample: Counterexample | None = None
    replays: list[RealReplay] = field(default_factory=list)
    conformance: dict[str, Any] | None = None
    matrix: list[MatrixRow] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # outcomes that differ from the story

    @property
    def ok(self) -> bool:
        return not self.problems


class Progress:
    def __init__(self, stream: TextIO, total: int) -> None:
        self.stream = stream
        self.total = total
        self.index = 0

    def stage(self, title: str) -> None:
        from kvhandoff.model_checker import progress as shown_progress

        self.index += 1
        self.say(f"[{self.index}/{self.total}] {title} ...")
        shown_progress.report("demo", stage=f"{self.index}/{self.total} {title}")

    def say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def detail(self, line: str) -> None:
        self.say(f"      {line}")


def _timed(run: DemoRun, name: str, fn: Callable[[], Any]) -> Any:
    t0 = time.perf_counter()
    try:
        return fn()
    finally:
        run.seconds[name] = time.perf_counter() - t0


def run_demo(out_dir: Path, stages: Sequence[str], stream: TextIO) -> DemoRun:
    run = DemoRun(out_dir, tuple(s for s in STAGES if s in stages))
    started = time.perf_counter()
    progress = Progress(stream, len(run.stages))
    out_dir.mkdir(parents=True, exist_ok=True)
    progress.say(f"kvhandoff demo: the incident from spec to proof to a real leak -> {out_dir}/")
    if "prove" in run.stages:
        progress.stage("prove the reference protocol safe")
        run.proof = _timed(run, "prove", lambda: prove_reference(run.config))
        result = run.proof.result
        note = f" ({run.proof.note})" if run.proof.note else ""
        progress.detail(
            f"{result.verdict.upper()}: {run.proof.method}{note}, {result.seconds:.1f} s"
        )
        if result.verdict != "safe":
            run.problems.append(f"the reference protocol is {result.verdict}, not safe")
    if "counterexample" in run.stages or "replay" in run.stages:
        if "counterexample" in run.stages:
            progress.stage("find the incident's counterexample")
        cx = _timed(run, "counterexample", lambda: find_incident_counterexample(run.config))
        run.counterexample = cx
        if "counterexample" in run.stages:
            broken = [r.property for r in cx.default_result.violated()]
            progress.detail(
                f"incident on the sequential scenario: VIOLATED {len(broken)} properties "
                f"({cx.default_result.states:,} states, {cx.default_result.seconds:.1f} s)"
            )
            bad = cx.story.violation_step
            where = f"step {bad.index} ({action_name(bad.action)})" if bad else "?"
            progress.detail(
                f"shortest run breaking {LEAK_PROPERTY} with no fault: "
                f"{len(cx.story.steps)} steps, the leak at {where}"
            )
    if "replay" in run.stages:
        assert run.counterexample is not None
        progress.stage("replay it on the real servers (gRPC on loopback)")
        cx = run.counterexample
        scenario = scenario_from_trace(cx.story.config, [s.action for s in cx.story.steps])
        for mode in ("incident", "reference"):
            replay_run: RealReplay = _timed(
                run,
                f"replay_{mode}",
                functools.partial(replay_on_real_servers, scenario, mode, out_dir / "logs" / mode),
            )
            run.replays.append(replay_run)
            for a in replay_run.answers:
                progress.detail(f"{mode:9s} {_answer_line(a)}")
        _check_replays(run)
    if "conformance" in run.stages:
        progress.stage("run a short conformance campaign")
        run.conformance = _timed(run, "conformance", lambda: run_conformance_campaign(out_dir))
        if run.conformance is None:
            progress.detail(NOT_AVAILABLE)
        else:
            progress.detail(
                f"{run.conformance['verdict']} (exit {run.conformance['exit_code']}): "
                f"{run.conformance['command']}"
            )
    if "matrix" in run.stages:
        progress.stage("kill matrix: every catalogue variant, exhaustive search")
        known = [r for r in (run.proof.result if run.proof else None,) if r is not None]
        if run.counterexample:
            known.append(run.counterexample.default_result)
        run.matrix = _timed(run, "matrix", lambda: kill_matrix(run.config, known))
        bugs = [r for r in run.matrix if r.expected]
        safe = [r for r in run.matrix if not r.expected]
        progress.detail(
            f"{sum(r.caught for r in bugs)}/{len(bugs)} bug variants caught, "
            f"{sum(r.caught for r in safe)}/{len(safe)} safe designs found safe "
            f"({sum(r.states for r in run.matrix):,} states)"
        )
        for r in run.matrix:
            if not r.caught:
                run.problems.append(f"variant {r.variant}: expected {r.expected}, got {r.violated}")
    run.seconds["total"] = time.perf_counter() - started
    write_report(run)
    run.seconds["total"] = time.perf_counter() - started
    progress.say("")
    for line in summary_lines(run):
        progress.say(line)
    progress.say(f"report: {out_dir / 'report.md'}")
    return run


def _answer_line(a: RealAnswer) -> str:
    who = f"tenant {a.tenant}, {a.prompt_tokens} tokens"
    if a.oversized:
        who += " (over prefill's limit)"
    if a.status != "ok":
        # The error is prefill's, relayed by the router or by decode (whichever answers first):
        # its last clause is the same either way.
        return f"{who}: error {a.code}: {a.error.rsplit(': ', 1)[-1]}"
    if a.leaked:
        return f'{who}: answer "{a.text}": LEAK, {len(a.leaked)} tokens of another tenant\'s canary'
    return f'{who}: answer "{a.text}": own data only'


def _check_replays(run: DemoRun) -> None:
    by_mode = {r.mode: r for r in run.replays}
    inc, ref = by_mode.get("incident"), by_mode.get("reference")
    if inc is not None and not inc.leaked:
        run.problems.append("incident mode did not leak another tenant's canary")
    if ref is not None:
        if ref.leaked:
            run.problems.append("reference mode leaked another tenant's canary")
        if not any(a.oversized and a.status == "error" for a in ref.answers):
            run.problems.append("reference mode did not answer the oversized request with an error")


def summary_lines(run: DemoRun) -> list[str]:
    out = ["summary:"]
    if run.proof:
        out.append(f"  reference protocol   {run.proof.result.verdict.upper()}: {run.proof.method}")
        if run.proof.note:
            out.append(f"                       ({run.proof.note})")
    if run.counterexample and "counterexample" in run.stages:
        n = len(run.counterexample.story.steps)
        out.append(f"  incident variant     VIOLATED {LEAK_PROPERTY} ({n}-step counterexample)")
    for r in run.replays:
        if r.mode == "incident":
            verdict = "LEAK: tenant b's answer holds tenant a's canary" if r.leaked else "no leak"
        else:
            errors = [a for a in r.answers if a.status != "ok"]
            verdict = "no leak; the oversized request gets a clear error" if errors else "no leak"
            if r.leaked:
                verdict = "LEAK"
        out.append(f"  {'real ' + r.mode + ' mode':20s} {verdict}")
    if "conformance" in run.stages:
        conf = run.conformance
        out.append(f"  conformance          {conf['verdict'] if conf else NOT_AVAILABLE}")
    if run.matrix:
        ok = sum(r.caught for r in run.matrix)
        out.append(f"  kill matrix          {ok}/{len(run.matrix)} variants as expected")
    out.append(f"  took {run.seconds.get('total', 0.0):.1f} s")
    if run.problems:
        out.append("UNEXPECTED: " + "; ".join(run.problems))
    else:
        out.append("verdict: the story holds")
    return out


# --- The report ---------------------------------------------------------------------------------


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    return out


def _header(name: str) -> str:
    """A column header that can wrap: `decode_admit_request` -> `decode admit request`."""
    return name.replace("_", " ")


_MARK = {"proved": "✓", "failed": "**✗**", "unknown": "?"}


def _obligation_grid(listed: Sequence[dict[str, Any]]) -> list[str]:
    """Obligations as an invariant-by-action grid: row = inductive invariant, column = what must
    preserve it (`initial state`, then each action), cell = the solver's verdict. Hundreds of
    rows of a flat list become one screen, and a failed or unknown cell stands out."""
    consecution = [o for o in listed if o.get("kind") == "consecution"]
    invariants = list(dict.fromkeys(str(o["invariant"]) for o in listed if o.get("invariant")))
    actions = sorted({str(o["action"]) for o in consecution if o.get("action")})
    cell: dict[tuple[str, str], str] = {}
    for o in listed:
        column = "initial state" if o.get("kind") == "initiation" else str(o.get("action"))
        if o.get("kind") in ("initiation", "consecution"):
            cell[(str(o["invariant"]), column)] = _MARK.get(str(o.get("verdict")), "?")
    columns = ["initial state", *actions]
    rows = [[f"`{inv}`", *[cell.get((inv, col), "") for col in columns]] for inv in invariants]
    lines = _table(["invariant", *[_header(c) for c in columns]], rows)
    safety = [o for o in listed if o.get("kind") == "safety"]
    if safety:
        done = sum(1 for o in safety if o.get("verdict") == "proved")
        lines += [
            "",
            f"Safety: the invariants together imply each property ({done}/{len(safety)} "
            "proved: "
            + ", ".join(f"`{o.get('invariant')}` {_MARK.get(str(o.get('verdict')), '?')}"
                        for o in safety)
            + ").",
        ]  # fmt: skip
    seconds = sum(float(o.get("seconds") or 0) for o in listed)
    lines += [
        "",
        f"✓ proved, ✗ failed, ? solver unknown; {len(listed)} obligations, "
        f"{seconds:.1f} s of solver time in all.",
    ]
    return lines


def _obligations(run: DemoRun) -> list[str]:
    assert run.proof is not None
    result = run.proof.result
    listed = result.extra.get("obligations")
    note = f" ({run.proof.note})" if run.proof.note else ""
    lines = [f"Method: {run.proof.method}{note}.", ""]
    if isinstance(listed, list) and listed and all(isinstance(o, dict) for o in listed):
        lines += _obligation_grid(listed)
        lines.append("")
    witnesses = result.witnesses
    movement = result.extra.get("movement") or {}
    depths = movement.get("witnesses") or {}
    unchecked = movement.get("not_checked") or {}
    claims = {p.name: p for p in (*ALWAYS, TERMINATION)}
    rows = []
    for r in result.results:
        prop = claims.get(r.property)
        witness = prop.witness if prop else ""
        # Only what this engine checked: a witness it cannot express is said so, not "NOT reached".
        if not witness:
            w = ""
        elif witness in witnesses:
            at = depths.get(witness)
            w = f"`{witness}` " + ("NOT reached" if not witnesses[witness] else "reached")
            w += f" (step {at})" if at is not None else ""
        elif witness in unchecked:
            w = f"`{witness}` not checked by this engine: {unchecked[witness]}"
        else:
            w = f"`{witness}` not checked by this engine"
        rows.append([f"`{r.property}`", prop.claim if prop else "", r.verdict, w])
    lines += _table(["property", "claim", "verdict", "non-vacuity witness"], rows)
    if movement:
        actions = movement.get("actions") or {}
        fired = sum(1 for at in actions.values() if at is not None)
        idle = [n for n in movement.get("spec_unreached") or () if n in actions]
        lines += [
            "",
            f"The {movement.get('model')} model can move: {fired}/{len(actions)} of its actions "
            f"fire and {sum(witnesses.values())}/{len(witnesses)} witnesses are reached within "
            f"{movement.get('depth')} steps"
            + (f" (the spec takes none of the other {len(idle)} either)" if idle else "")
            + (
                f"; findings: {'; '.join(result.extra['vacuity'])}"
                if result.extra.get("vacuity")
                else ""
            )
            + ".",
        ]
    if result.extra.get("response_bound") is not None:
        lines += [
            "",
            f"Bounded response: once faults stop, every request ends within "
            f"{result.extra['response_bound']} protocol steps.",
        ]
    return lines


def _matrix_lines(run: DemoRun) -> list[str]:
    short = [p.name for p in ALWAYS] + [TERMINATION.name]
    header = ["variant", "M", *[_header(name) for name in short], "as expected"]
    rows = []
    for r in run.matrix:
        cells = []
        for name in short:
            if name in r.violated:
                cells.append("**✗**" if name in r.expected else "✗")
            else:
                cells.append("·")
        rows.append(
            [f"`{r.variant}`", ",".join(r.m_numbers) or "-", *cells, "yes" if r.caught else "NO"]
        )
    return [
        "Explicit-state search of every catalogue variant on the sequential scenario. "
        "✗ = violated (bold: a break the variant is expected to cause), · = holds. "
        "M = the variant's bug numbers in the catalogue (see the glossary).",
        "",
        *_table(header, rows),
    ]


GLOSSARY = (
    (
        "variant",
        "a version of the protocol: `reference` (the fix), `incident` (what ran in "
        "production), or one catalogue bug (`m1_...`, `m20_...`).",
    ),
    (
        "M-number",
        "a bug's number in the catalogue of known handoff failures (M1 placeholder "
        "rejection, M5 digest skipped, ...): `kvhandoff variants` lists them with their summaries.",
    ),
    (
        "room",
        "the id the router gives a request and sends to prefill and decode; workers match "
        "messages by room and generation, as real ones do, never by the model's request index.",
    ),
    (
        "generation",
        "one incarnation of a grant of decode pages; a retry or a restart gets a new "
        "one, so a late write or completion for an old generation can be told apart and refused.",
    ),
    (
        "epoch",
        "a worker's boot count: a restart bumps it, and a peer that sees it change drops "
        "what it held for the old one.",
    ),
    (
        "placeholder",
        "what the incident's prefill did with a prompt over its limit: it sent a "
        "one-page stand-in instead of rejecting, so decode waited on pages nobody would write.",
    ),
    (
        "ghost",
        "state kept only to state a property (which tenant's data a page holds, whom an "
        "answer was generated from); no worker reads it.",
    ),
    (
        "witness",
        "a state that must be reachable for a property's proof to mean something (e.g. "
        "a request answered from its own pages); a property that holds only because nothing "
        "happens is vacuous.",
    ),
    (
        "obligation",
        "one solver query of an inductive proof: the invariant holds initially "
        "(initiation), each action preserves it (consecution), the invariants imply the property "
        "(safety).",
    ),
    (
        "counterexample",
        "the shortest run of the spec that breaks a property, as a trace file "
        "(`traces/`) that `kvhandoff explain` and `kvhandoff replay` read.",
    ),
)


def _glossary() -> list[str]:
    return ["## Glossary", ""] + [f"- **{term}**: {text}" for term, text in GLOSSARY] + [""]


def write_report(run: DemoRun) -> Path:
    out = run.out_dir
    (out / "traces").mkdir(parents=True, exist_ok=True)
    (out / "charts").mkdir(parents=True, exist_ok=True)
    md = ["# kvhandoff demo report", ""]
    md += ["The incident, from spec to proof to a real leak. Written by `kvhandoff demo`.", ""]
    md += ["```text", *summary_lines(run), "```", ""]
    figures: dict[str, Any] = {"seconds": {k: round(v, 3) for k, v in run.seconds.items()}}
    cx = run.counterexample
    if cx is not None:
        (out / "traces" / "incident-no_cross_tenant_read.jsonl").write_text(cx.trace_text)
        for prop in cx.default_result.violated():
            if prop.trace is not None:
                name = f"incident-default-{prop.property}.jsonl"
                (out / "traces" / name).write_text(cx.default_result.trace_text(prop))
        chart = to_mermaid(cx.story)
        (out / "charts" / "incident.mmd").write_text(chart)
        from kvhandoff.model_checker.html_explorer import to_html

        (out / "explorer.html").write_text(
            to_html(cx.story, cx.fix, "reference on the same requests"), encoding="utf-8"
        )
        md += ["## The incident as a counterexample", ""]
        md += [
            "The shortest run of the `incident` variant, on the sequential scenario with no "
            "fault at all, in which a request's answer is generated from another tenant's data. "
            "Replayed through the spec; each step shows only what changed.",
            "",
            "**Step through it in a browser:** [explorer.html](explorer.html) (one offline page: "
            "decode's pages as lanes coloured by the tenant whose data they hold, the messages in "
            "flight, the property highlighted where it breaks, the reference protocol on the same "
            "requests beside it; `kvhandoff explain TRACE --format html` makes one for any trace).",
            "",
        ]
        md.append(to_markdown(cx.story, title="Counterexample", level=3))
        md += [
            "### The fix: the same requests under the reference protocol",
            "",
            "The shortest fault-free run of the reference protocol that sends the same requests "
            "in the same order and ends them all: prefill rejects tenant b's prompt and says so, "
            "decode frees what it held, the client gets an error, and released pages are zeroed.",
            "",
        ]
        md.append(to_markdown(cx.fix, title="Reference protocol, same requests", level=4))
        (out / "traces" / "reference-same-requests.jsonl").write_text(
            dump_trace(
                cx.fix.config,
                [s.action for s in cx.fix.steps],
                kind="scenario",
                variant="reference",
            )
        )
        md += ["### The incident variant on the sequential scenario (faults allowed)", ""]
        rows: list[list[Any]] = [
            [
                f"`{r.property}`",
                r.verdict,
                f"{len(r.trace)} steps" if r.trace is not None else "",
            ]
            for r in cx.default_result.results
        ]
        md += _table(["property", "verdict", "shortest counterexample"], rows)
        md += [
            "",
            "Every counterexample is in `traces/` (explain one: `kvhandoff explain FILE`).",
            "",
        ]
        figures["incident"] = {
            "states": cx.default_result.states,
            "seconds": round(cx.default_result.seconds, 3),
            "violated": [r.property for r in cx.default_result.violated()],
            "fault_free_steps": len(cx.story.steps),
        }
    if run.replays:
        md += ["## Replayed on the real servers", ""]
        md += [
            "The counterexample's requests, sent to prefill, decode and router (gRPC on loopback, "
            "KV pages in torch tensors) with each tenant's canary as its prompt. The pools have "
            "the incident's shape: the context window and decode admit more than prefill's pool. "
            "Event logs are in `logs/`.",
            "",
        ]
        rows = []
        for r in run.replays:
            for a in r.answers:
                rows.append(
                    [
                        r.mode,
                        a.tenant,
                        a.prompt_tokens,
                        "yes" if a.oversized else "no",
                        a.status if a.status == "ok" else f"error {a.code}: {a.error}",
                        f"`{a.text}`" if a.tokens else "",
                        f"**{len(a.leaked)}**" if a.leaked else "0",
                        f"{a.seconds * 1000:.0f} ms",
                    ]
                )
        md += _table(
            [
                "mode",
                "tenant",
                "prompt tokens",
                "over prefill's limit",
                "result",
                "answer",
                "leaked tokens",
                "latency",
            ],
            rows,
        )
        md.append("")
        figures["real_servers"] = [r.as_json() for r in run.replays]
    if "conformance" in run.stages:
        md += ["## Conformance", ""]
        if run.conformance is None:
            md += [f"The conformance campaign is {NOT_AVAILABLE}.", ""]
        else:
            md += [f"`{run.conformance['command']}`: **{run.conformance['verdict']}**", ""]
            md += ["```json", json.dumps(run.conformance["result"], indent=2)[:20000], "```", ""]
        figures["conformance"] = run.conformance
    if run.proof is not None:
        md += ["## Proof obligations: the reference protocol", ""]
        md += _obligations(run)
        md.append("")
        figures["proof"] = {
            "method": run.proof.method,
            "note": run.proof.note,
            "engine": run.proof.result.engine,
            "any_size": run.proof.any_size,
            "verdict": run.proof.result.verdict,
            "states": run.proof.result.states,
            "seconds": round(run.proof.result.seconds, 3),
            "states_per_second": run.proof.result.extra.get("states_per_second"),
        }
    if run.matrix:
        md += ["## Kill matrix", ""]
        md += _matrix_lines(run)
        md.append("")
        figures["matrix"] = [r.as_json() for r in run.matrix]
    md += ["## Figures measured", ""]
    rows = [[k, f"{v:.2f} s"] for k, v in run.seconds.items()]
    if run.proof is not None:
        rows.append(["reference: states explored", f"{run.proof.result.states or 0:,}"])
        rate = run.proof.result.extra.get("states_per_second")
        if rate:
            rows.append(["reference: states per second", f"{rate:,}"])
    if run.matrix:
        rows.append(["kill matrix: states explored", f"{sum(r.states for r in run.matrix):,}"])
    md += _table(["figure", "value"], rows)
    md.append("")
    if cx is not None:
        md += ["## The counterexample trace (JSON Lines)", ""]
        md += ["<details><summary>traces/incident-no_cross_tenant_read.jsonl</summary>", ""]
        md += ["```json", cx.trace_text.rstrip("\n"), "```", "", "</details>", ""]
    md += _glossary()
    figures["problems"] = run.problems
    figures["stages"] = list(run.stages)
    (out / "report.json").write_text(json.dumps(figures, indent=2) + "\n")
    (out / "report.md").write_text("\n".join(md) + "\n")
    return out / "report.md"


def summary_json(run: DemoRun) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run.out_dir / "report.json").read_text())
    data["report"] = str(run.out_dir / "report.md")
    data["ok"] = run.ok
    return data


__all__ = [
    "NOT_AVAILABLE",
    "STAGES",
    "DemoRun",
    "dump_trace",
    "find_incident_counterexample",
    "kill_matrix",
    "prove_reference",
    "replay_on_real_servers",
    "run_conformance_campaign",
    "run_demo",
    "scenario_from_trace",
    "write_report",
]
