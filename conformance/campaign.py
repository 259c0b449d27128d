"""A conformance campaign: many Hypothesis-generated lockstep programs against one target.

    report = campaign.run("inproc", "reference", traces=1000, steps=20, seed=0)
    report.verdict            # "conforms" | "diverges"
    report.failures[0].trace_file   # the shrunk program, as a trace file (kind "failure")

Each example is one program: 1..`steps` spec actions (the length is drawn first), each drawn with `st.sampled_from` from
what the spec enables in the state explaining the target so far (protocol steps first, faults last,
so failures shrink towards short, fault-free programs). The first failure stops the campaign;
Hypothesis shrinks it and the shrunk program is written as a trace file that `kvhandoff replay`
plays back deterministically.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from conformance.lockstep import Divergence, run_program
from conformance.target import Target, TargetError, require_one_prefill_rank
from model_checker import progress
from spec.actions import Action
from spec.config import Config, default_config
from spec.trace import dump_trace


class UnknownTarget(ValueError):
    pass


def make_target(name: str) -> Target:
    """`inproc`, `grpc` (real servers on loopback), or `HOST:PORT` (a harness service: a
    `conformance.remote_target.RemoteTarget`; a malformed address is an `UnknownTarget`)."""
    if name == "inproc":
        from conformance.inproc import InProcTarget

        return InProcTarget()
    if name == "grpc":
        from conformance.grpc_target import GrpcTarget

        return GrpcTarget()
    if ":" in name:
        from conformance.remote_target import AddressError, RemoteTarget

        try:
            # Nothing is sent yet: the first operation (or `connect()`) reaches the engine.
            return RemoteTarget(name)
        except AddressError as exc:
            raise UnknownTarget(
                f"target {exc} (targets: inproc, grpc, HOST:PORT of a harness service)"
            ) from exc
    raise UnknownTarget(f"unknown target {name!r}; targets: inproc, grpc, HOST:PORT")


class _TargetFailed(BaseException):
    """Carries a `TargetError` out of Hypothesis. Hypothesis shrinks any `Exception` as a test
    failure, but lets other `BaseException`s (like KeyboardInterrupt) stop the run at once."""

    def __init__(self, error: TargetError) -> None:
        super().__init__(str(error))
        self.error = error


def campaign_config() -> Config:
    """The default scenario (3 requests, tenants a/b, request 1 too long for prefill, rooms
    reused) with a budget of up to 4 faults per program."""
    return replace(default_config(), max_faults=4)


@dataclass
class Failure:
    kind: str
    property: str
    trace_file: str
    message: str


@dataclass
class ProgramRecord:
    """One program the campaign ran (for per-program reports such as JUnit)."""

    index: int
    steps: int
    seconds: float
    outcome: str  # "passed" | "diverged"
    phase: str  # "generate" | "shrink" (Hypothesis re-running smaller programs after a failure)


@dataclass
class CampaignReport:
    target: str
    mode: str
    traces: int
    steps: int
    verdict: str
    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0
    step_count: int = 0
    """Spec steps driven in all (for steps/s)."""
    not_covered: dict[str, str] = field(default_factory=dict)
    """Operations the target said it cannot perform (skipped, not failed): operation -> why."""
    programs: list[ProgramRecord] = field(default_factory=list)

    @property
    def conforms(self) -> bool:
        return self.verdict == "conforms"

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "mode": self.mode,
            "traces": self.traces,
            "steps": self.steps,
            "verdict": self.verdict,
            "failures": [asdict(f) for f in self.failures],
            "seconds": round(self.seconds, 3),
            "not_covered": dict(sorted(self.not_covered.items())),
        }


def run(
    target_name: str,
    mode: str,
    traces: int = 100,
    steps: int = 20,
    seed: int = 0,
    config: Config | None = None,
    out_dir: Path | None = None,
    target: Target | None = None,
) -> CampaignReport:
    """Run a campaign; never raises for a divergence (it is reported)."""
    cfg = config or campaign_config()
    require_one_prefill_rank(cfg)
    out = out_dir or Path("kvhandoff-report")
    if target is None:
        # A target made here is released here: a gRPC target keeps its servers between traces.
        owned = make_target(target_name)
        try:
            return run(target_name, mode, traces, steps, seed, cfg, out_dir, owned)
        finally:
            owned.shutdown()
    if not target.fine_grained:
        from conformance.grpc_target import run_coarse_campaign

        coarse: CampaignReport = run_coarse_campaign(
            target, target_name, mode, traces, steps, seed, cfg, out
        )
        coarse.not_covered = target.not_covered()
        return coarse
    program: list[Action] = []
    programs: list[ProgramRecord] = []
    counters = {"traces": 0, "steps": 0}

    @settings(
        max_examples=traces,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.generate, Phase.shrink),
        report_multiple_bugs=False,
        print_blob=False,
    )
    @hypothesis_seed(seed)
    @given(st.data())
    def one_program(data: st.DataObject) -> None:
        program.clear()
        counters["traces"] += 1
        progress.report("conform", traces=counters["traces"], steps=counters["steps"])

        def choose(options: list[Action]) -> Action:
            action = data.draw(st.sampled_from(options))
            program.append(action)
            counters["steps"] += 1
            return action

        # The length is drawn first so that a failure shrinks to a short program.
        length = data.draw(st.integers(min_value=1, max_value=steps))
        phase = "shrink" if any(p.outcome == "diverged" for p in programs) else "generate"
        began, outcome = time.perf_counter(), "passed"
        try:
            try:
                run_program(target, cfg, mode, choose, length)
            finally:
                target.close()
        except TargetError as exc:
            # A target that fails (not diverges) must not be shrunk as if it were a bug.
            raise _TargetFailed(exc) from exc
        except Divergence:
            outcome = "diverged"
            raise
        finally:
            programs.append(
                ProgramRecord(
                    counters["traces"], len(program), time.perf_counter() - began, outcome, phase
                )
            )

    start = time.perf_counter()
    failures: list[Failure] = []
    try:
        one_program()
    except _TargetFailed as stop:
        raise stop.error from None
    except Divergence as exc:
        path = save_failure(out, target_name, mode, seed, cfg, list(program), exc)
        failures.append(Failure(exc.kind, exc.property, str(path), exc.message))
    seconds = time.perf_counter() - start
    return CampaignReport(
        target=target_name,
        mode=mode,
        traces=counters["traces"],
        steps=steps,
        verdict="diverges" if failures else "conforms",
        failures=failures,
        seconds=seconds,
        step_count=counters["steps"],
        not_covered=target.not_covered(),
        programs=programs,
    )


def save_failure(
    out: Path,
    target_name: str,
    mode: str,
    seed: int,
    config: Config,
    program: list[Action],
    exc: Divergence,
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    safe = target_name.replace(":", "_").replace("/", "_")
    path = out / f"conform-{safe}-{mode}-seed{seed}.jsonl"
    path.write_text(
        dump_trace(
            config,
            program,
            kind="failure",
            variant="reference",
            mode=mode,
            target=target_name,
            property=exc.property,
            failure=exc.kind,
            message=exc.message,
        )
    )
    return path


__all__ = [
    "CampaignReport",
    "Failure",
    "UnknownTarget",
    "campaign_config",
    "make_target",
    "run",
    "save_failure",
]
