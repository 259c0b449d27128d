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
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis import target as hypothesis_target

from kvhandoff.conformance.lockstep import Divergence, Session, run_program
from kvhandoff.conformance.target import Target, TargetError, require_one_prefill_rank
from kvhandoff.model_checker import progress as progress_display
from kvhandoff.spec.actions import (
    FAULT_ACTIONS,
    Action,
    DecodeWaitingTimeout,
    PrefillAbortRequest,
    PrefillWriteError,
    action_name,
    is_fault,
)
from kvhandoff.spec.config import Config, default_config, placements
from kvhandoff.spec.trace import dump_trace


class UnknownTarget(ValueError):
    pass


def make_target(name: str) -> Target:
    """`inproc`, `grpc` (real servers on loopback), `sglang` (SGLang's classes, `make
    venv-sglang`), `vllm` (vLLM's schedulers, `make venv-vllm`), or `HOST:PORT` (a harness service: a
    `conformance.remote_target.RemoteTarget`; a malformed address is an `UnknownTarget`)."""
    if name == "inproc":
        from kvhandoff.conformance.inproc import InProcTarget

        return InProcTarget()
    if name == "grpc":
        from kvhandoff.conformance.grpc_target import GrpcTarget

        return GrpcTarget()
    if name == "sglang":
        # SGLang's disaggregation classes, in their own environment (docs/sglang.md).
        from kvhandoff.conformance.sglang_target import SglangTarget

        return SglangTarget()
    if name == "vllm":
        # vLLM's scheduler and the NIXL connector's scheduler side (docs/vllm.md).
        from kvhandoff.conformance.vllm_target import VllmTarget

        return VllmTarget()
    if ":" in name:
        from kvhandoff.conformance.remote_target import AddressError, RemoteTarget

        try:
            # Nothing is sent yet: the first operation (or `connect()`) reaches the engine.
            return RemoteTarget(name)
        except AddressError as exc:
            raise UnknownTarget(
                f"target {exc} (targets: inproc, grpc, sglang, vllm, HOST:PORT of a harness service)"
            ) from exc
    raise UnknownTarget(f"unknown target {name!r}; targets: inproc, grpc, sglang, vllm, HOST:PORT")


class _TargetFailed(BaseException):
    """Carries a `TargetError` out of Hypothesis. Hypothesis shrinks any `Exception` as a test
    failure, but lets other `BaseException`s (like KeyboardInterrupt) stop the run at once."""

    def __init__(self, error: TargetError) -> None:
        super().__init__(str(error))
        self.error = error


def campaign_config(
    max_retries: int = 0,
    instances: bool = False,
    rooms_any: bool = False,
    write_errors: bool = True,
) -> Config:
    """The sequential scenario (3 requests, tenants a/b, request 1 too long for prefill, rooms
    reused) with a budget of up to 4 faults per program, up to two partitions among them (decode takes
    the live prefill for dead: `decode_suspect_prefill_dead`, off in the scenario itself), one
    failed page write (`write_errors`, below), and
    `max_retries` client retries under the same request id (`router_retry_request`; only a
    target with `Target.retries` plays them).

    `instances`: the same requests on two prefill and two decode instances of three pages each,
    the router placing each request anywhere (each program plays one placement, drawn from
    `spec.config.placements`); a crash restarts one instance, a partition cuts one decode
    instance off one prefill instance.

    `rooms_any`: the clients choose the requests' rooms (`rooms="any"`, the spec's client-chosen
    room): each program plays one way of sharing rooms among the requests, drawn like a
    placement (three requests: five ways, from all apart to all on one room).

    `write_errors` (on unless asked otherwise): one failed page write per program too (prefill
    fails a transfer with writes still on the wire: `prefill_write_error`, off in the scenario),
    allowed in the programs whose swarm allows prefill's own abort (`_WITH`)."""
    cfg = replace(
        default_config(),
        max_faults=4,
        max_partitions=2,
        max_write_errors=1 if write_errors else 0,
        max_retries=max_retries,
    )
    if instances:
        cfg = replace(cfg, prefill_instances=2, decode_instances=2, decode_pages=6)
    if rooms_any:
        cfg = replace(cfg, rooms="any")
    return cfg


def boundary_tokens(config: Config) -> list[int]:
    """Prompt lengths in tokens at and around every limit and page boundary of `config` (a
    target's advertised limits): 1, page-1, page, page+1, and limit-1, limit, limit+1 for the
    prefill limit, the decode limit and the context window. (An empty prompt is a bad request
    the spec does not model: the scenario's requests have at least one page.)"""
    ps = config.page_size
    out = [1, ps - 1, ps, ps + 1]
    for limit in (config.prefill_max_prompt, config.decode_max_prompt, config.context_window):
        out += [limit * ps - 1, limit * ps, limit * ps + 1]
    return sorted({t for t in out if t >= 1})


def draw_scenario(data: st.DataObject, config: Config) -> tuple[Config, dict[int, int]]:
    """A program's scenario: `config` itself (what a failure shrinks to), or `config` with each
    request's prompt drawn from `boundary_tokens` and, sometimes, one more request in flight
    at once. Returns the scenario and each request's shortfall in tokens (`Target.shortfall`).
    Where the router places requests as it likes on several instances, the program plays one
    placement (`spec.config.placements`; a failure shrinks towards the first)."""
    choices = placements(config)
    if len(choices) > 1:
        config = data.draw(st.sampled_from(choices), label="placement")
    if not data.draw(st.booleans(), label="boundary scenario"):
        return config, {}
    ps = config.page_size
    lengths = boundary_tokens(config)
    requests = []
    shortfall: dict[int, int] = {}
    for r, q in enumerate(config.requests):
        tokens = data.draw(st.sampled_from([q.pages * ps, *lengths]), label=f"tokens of {r}")
        pages = -(-tokens // ps)
        requests.append(replace(q, pages=pages))
        if pages * ps != tokens:
            shortfall[r] = pages * ps - tokens
    # Sometimes a second request in flight (pages of two requests held at once).
    active = data.draw(st.sampled_from([config.max_active, config.max_active + 1]))
    return replace(config, requests=tuple(requests), max_active=active), shortfall


FAULT_KINDS: tuple[type, ...] = tuple(
    k
    for k in FAULT_ACTIONS
    if k.__name__ not in ("PrefillLeaseExpire", "NetworkFailTransfer", "PrefillWriteError")
)
"""The fault kinds a program's swarm draws from. A failed write (`PrefillWriteError`) is not
drawn on its own: it goes with `PrefillAbortRequest` (`_WITH`)."""

_WITH: dict[type, type] = {PrefillWriteError: PrefillAbortRequest}
"""Fault kinds a program allows whenever it allows another: a failed write is prefill failing
a request on its own, with writes still on the wire, and the target is asked the same call
(`prefill_abort`). Drawn as a kind of its own it would move every later draw of every campaign,
`write_errors` or not."""


# The outcome fields of event-log lines: (event, outcome) pairs are counted by them.
_OUTCOME_FIELDS = ("outcome", "verdict", "status")


@dataclass
class Coverage:
    """What a campaign reached of the spec: the spec actions that explained the target's events
    (fired), the actions the spec enabled somewhere but that never fired, (event, outcome)
    pairs of the target's log, adversarial probes by (attack, reaction), and the distinct
    abstract states (each request's prefill and decode phase and answer, the kinds of messages
    in flight, whether writes are in flight) the runs went through."""

    fired: dict[str, int] = field(default_factory=dict)
    enabled: set[str] = field(default_factory=set)
    outcomes: dict[str, int] = field(default_factory=dict)
    probes: dict[str, int] = field(default_factory=dict)
    states: set[tuple[Any, ...]] = field(default_factory=set)

    def add_log(self, events: list[dict[str, Any]], actions: list[dict[str, Any]]) -> None:
        """A coarse target's trace: its events' (event, outcome) pairs, and the spec actions of
        the behaviour that explained its log (`ValidationReport.spec_actions`)."""
        for ev in events:
            args = ev.get("args", {})
            for key in _OUTCOME_FIELDS:
                if key in args:
                    pair = f"{ev.get('event')}:{args[key]}"
                    self.outcomes[pair] = self.outcomes.get(pair, 0) + 1
                    break
        for a in actions:
            name = str(a.get("action"))
            self.fired[name] = self.fired.get(name, 0) + 1

    def add(self, session: Session, options_seen: set[str]) -> None:
        from kvhandoff.spec.machine import step
        from kvhandoff.spec.state import initial_state

        self.enabled |= options_seen
        for ev in session.events:
            for key in _OUTCOME_FIELDS:
                if key in ev["args"]:
                    pair = f"{ev['event']}:{ev['args'][key]}"
                    self.outcomes[pair] = self.outcomes.get(pair, 0) + 1
                    break
        for pair, n in session.probe_outcomes.items():
            self.probes[pair] = self.probes.get(pair, 0) + n
        s = initial_state(session.config)
        self.states.add(_abstract(s))
        for a in session.explained_actions():
            name = action_name(a)
            self.fired[name] = self.fired.get(name, 0) + 1
            s = step(session.variant, session.config, s, a)
            self.states.add(_abstract(s))

    def never_enabled(self) -> list[str]:
        """The spec actions the implementation has a counterpart for (`conformance.registry`)
        that no program's spec enabled: the scenario's budgets leave them out (client retries
        without --max-retries, say), so the campaign says nothing about them."""
        from kvhandoff.conformance.registry import REGISTRY

        performable = {c.action for c in REGISTRY if c.operation != "none"}
        return sorted(performable - self.enabled - set(self.fired))

    def to_json(self) -> dict[str, Any]:
        unfired = sorted(self.enabled - set(self.fired))
        return {
            "actions_fired": dict(sorted(self.fired.items())),
            "actions_unfired": unfired,
            "actions_never_enabled": self.never_enabled(),
            "outcomes": dict(sorted(self.outcomes.items())),
            "probes": dict(sorted(self.probes.items())),
            "abstract_states": len(self.states),
        }

    def summary(self) -> str:
        j = self.to_json()
        line = (
            f"coverage: {len(j['actions_fired'])} spec actions fired, "
            f"{len(j['outcomes'])} (event, outcome) pairs, {sum(self.probes.values())} "
            f"adversarial probes"
        )
        # (A coarse target's runs are explained from logs: no spec states are walked.)
        if self.states:
            line += f", {j['abstract_states']} abstract states"
        if j["actions_unfired"]:
            line += f"; enabled but never fired: {', '.join(j['actions_unfired'])}"
        if j["actions_never_enabled"] and self.enabled:
            line += f"; never enabled by these scenarios: {', '.join(j['actions_never_enabled'])}"
        return line


def _abstract(s: Any) -> tuple[Any, ...]:
    reqs = tuple((q.p, q.d, None if q.answer is None else q.answer.ok) for q in s.requests)
    return reqs, tuple(sorted({m.kind for m in s.network})), bool(s.writes)


def progress(session: Session) -> float:
    """How deep a program got (Hypothesis `target()` steers towards more): writes landed,
    completions validated and answers generated (the same on every target that explains the
    same spec steps, so a seed draws the same programs in-process and through the harness)."""
    score = 0.0
    for ev in session.events:
        kind = ev["event"]
        if kind == "decode_receive_write" and ev["args"].get("outcome") == "accepted":
            score += 1
        elif kind == "decode_receive_completion" and ev["args"].get("verdict") == "validated":
            score += 3
        elif kind == "decode_generate":
            score += 3
    return score


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
    # "directed" (written by hand: `DIRECTED`) | "generate" | "shrink" (Hypothesis re-running
    # smaller programs after a failure)
    phase: str


@dataclass(frozen=True)
class Directed:
    """A program written by hand, for a hazard the random programs reach only by luck.

    It plays request `request` of the campaign's scenario alone, and takes `steps` in order, each
    the first enabled action of that name; the run then settles, which delivers what is still in
    flight. A step the spec does not enable ends it early (a shorter program, not a failure)."""

    name: str
    hazard: str
    request: int
    steps: tuple[str, ...]


DIRECTED: tuple[Directed, ...] = (
    Directed(
        "stale_abort_meets_retry",
        "decode's abort of a first attempt, still in flight across a prefill restart, reaches "
        "prefill after the client's retry was admitted there: prefill must tell it by its attempt "
        "and keep the retry (random programs of --max-retries 1 first met it at the 966th)",
        0,
        (
            "router_submit_request",
            "prefill_admit_request",
            "decode_admit_request",
            "prefill_receive_grant",
            "prefill_write_page",
            "decode_waiting_timeout",
            "prefill_restart",
            "router_retry_request",
            "prefill_admit_request",
        ),
    ),
    Directed(
        "stale_notice_meets_retry",
        "prefill's rejection notice of a first attempt, still in flight across a decode restart, "
        "reaches decode after the retry was admitted there: decode must tell it by its attempt "
        "(random programs of --max-retries 1 first met it at the 618th)",
        1,
        (
            "router_submit_request",
            "prefill_reject_request",
            "decode_admit_request",
            "decode_restart",
            "router_retry_request",
            "decode_admit_request",
        ),
    ),
)
"""The directed programs a campaign with client retries runs before its random ones (on a
target that plays retries, with the scenario's rooms). Each was found by the random campaign once
and is kept so that finding it again does not rest on the draws: the catalogue mutants
`abort_matched_by_request_id_only` and `stale_attempt_notice_taken` each diverge on one."""


def _follower(
    hand: Directed, taken: list[Action], seen: set[str]
) -> Callable[[list[Action]], Action | None]:
    """A program chooser that takes the directed program's next step (appending it to `taken`)
    while the spec enables it, and ends the program otherwise."""

    def choose(options: list[Action]) -> Action | None:
        seen.update(action_name(a) for a in options)
        if len(taken) == len(hand.steps):
            return None
        for a in options:
            if action_name(a) == hand.steps[len(taken)]:
                taken.append(a)
                return a
        return None

    return choose


def _directed_scenario(cfg: Config, directed: Directed) -> Config:
    """The campaign's scenario (its first placement) with the directed program's request alone."""
    first = placements(cfg)[0]
    return replace(first, requests=(first.requests[directed.request],))


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
    coverage: Coverage | None = None
    """What the campaign reached of the spec (fine-grained targets)."""
    traces_to_failure: int | None = None
    """The program (1-based) that first diverged, before shrinking (`traces` counts those too)."""
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
            **({"coverage": self.coverage.to_json()} if self.coverage is not None else {}),
            **(
                {"traces_to_failure": self.traces_to_failure}
                if self.traces_to_failure is not None
                else {}
            ),
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
    max_retries: int = 0,
    instances: bool = False,
    rooms_any: bool = False,
    write_errors: bool = True,
) -> CampaignReport:
    """Run a campaign; never raises for a divergence (it is reported). `max_retries` is the
    sequential scenario's retry budget, `instances` puts it on several instances,
    `rooms_any` lets the clients choose the rooms and `write_errors` lets a page write fail
    mid-transfer (`campaign_config`; all ignored when `config` is given)."""
    cfg = config or campaign_config(max_retries, instances, rooms_any, write_errors)
    # (Before a target is made: a scenario no target plays is refused at once; whether this
    # one plays retries and instances is asked once it exists. Each program plays one fixed
    # placement: the first stands for them all here.)
    require_one_prefill_rank(
        placements(cfg)[0],
        retries=True if target is None else target.retries,
        instances=True if target is None else target.instances,
    )
    out = out_dir or Path("kvhandoff-report")
    if target is None:
        # A target made here is released here: a gRPC target keeps its servers between traces.
        owned = make_target(target_name)
        try:
            return run(target_name, mode, traces, steps, seed, cfg, out_dir, owned)
        finally:
            owned.shutdown()
    if not target.fine_grained:
        from kvhandoff.conformance.grpc_target import run_coarse_campaign

        coarse: CampaignReport = run_coarse_campaign(
            target, target_name, mode, traces, steps, seed, cfg, out
        )
        coarse.not_covered = target.not_covered()
        if getattr(target, "adversary_round", None) is None:
            # Only the gRPC target plays a malicious prefill against a coarse decode; a verdict
            # without it says nothing of decode's integrity checks.
            coarse.not_covered["adversarial rounds"] = (
                "this coarse target plays none (the suite cannot forge messages against its "
                "decode), so decode's integrity checks (token, room, generation, page digest, "
                "completion count and digest, release fence) were not tested"
            )
        return coarse
    program: list[Action] = []
    programs: list[ProgramRecord] = []
    counters = {"traces": 0, "steps": 0}
    used: dict[str, Any] = {"config": cfg, "shortfall": {}}
    coverage = Coverage()
    start = time.perf_counter()
    failures: list[Failure] = []

    def report() -> CampaignReport:
        return CampaignReport(
            target=target_name,
            mode=mode,
            traces=counters["traces"],
            steps=steps,
            verdict="diverges" if failures else "conforms",
            failures=failures,
            seconds=time.perf_counter() - start,
            step_count=counters["steps"],
            not_covered=target.not_covered(),
            coverage=coverage,
            traces_to_failure=counters.get("first_failure"),
            programs=programs,
        )

    directed = DIRECTED if cfg.max_retries > 0 and target.retries and cfg.rooms != "any" else ()
    for hand in directed:
        scenario = _directed_scenario(cfg, hand)
        taken: list[Action] = []
        seen_here: set[str] = set()
        follow = _follower(hand, taken, seen_here)
        counters["traces"] += 1
        began, outcome = time.perf_counter(), "passed"
        try:
            try:
                session = run_program(target, scenario, mode, follow, len(hand.steps))
                coverage.add(session, seen_here)
            finally:
                target.close()
        except Divergence as exc:
            counters.setdefault("first_failure", counters["traces"])
            outcome = "diverged"
            path = save_failure(out, target_name, mode, seed, scenario, taken, exc)
            failures.append(Failure(exc.kind, exc.property, str(path), exc.message))
        finally:
            counters["steps"] += len(taken)
            programs.append(
                ProgramRecord(
                    counters["traces"], len(taken), time.perf_counter() - began, outcome, "directed"
                )
            )
        if failures:
            return report()

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
        progress_display.report("conform", traces=counters["traces"], steps=counters["steps"])

        # The length is drawn first so that a failure shrinks to a short program.
        length = data.draw(st.integers(min_value=1, max_value=steps))
        scenario, shortfall = draw_scenario(data, cfg)
        used["config"], used["shortfall"] = scenario, shortfall
        target.shortfall = shortfall
        # Swarm testing: each program allows its own subset of fault kinds, and the first
        # `calm` steps none (so that programs reach the handoff before a fault strikes).
        kinds = data.draw(st.sets(st.sampled_from(FAULT_KINDS)), label="fault kinds")
        kinds = kinds | {k for k, along in _WITH.items() if along in kinds}
        if scenario.max_active > cfg.max_active:
            # With several requests in flight the spec's one-request timeout is often no step
            # the target can take (a target's clock may fire every waiting request's timeout at
            # once; the in-process target refuses it there), and such programs are left to the
            # other fault kinds (measured: allowing it there moved the campaign's draws so that
            # two retry mutants of the catalogue were no longer killed in 1000 programs).
            kinds = kinds - {DecodeWaitingTimeout}
        calm = data.draw(st.integers(min_value=0, max_value=length), label="fault-free steps")
        # A scripted prefix: the calm steps take the first step the spec lists (protocol order:
        # submit, admit, reserve, grant, write, ...), which drives a request into its handoff.
        scripted = data.draw(st.booleans(), label="scripted prefix")
        # Strike: the first step after the calm ones is a fault (when one is allowed), so that
        # the state the prefix reached is the one a fault hits.
        strike = data.draw(st.booleans(), label="fault right after the calm steps")

        seen: set[str] = set()

        def choose(options: list[Action]) -> Action | None:
            seen.update(action_name(a) for a in options)
            allowed = [
                a for a in options if not is_fault(a) or (type(a) in kinds and len(program) >= calm)
            ]
            if not allowed:
                return None
            faults = [a for a in allowed if is_fault(a)]
            if scripted and len(program) < calm:
                action = allowed[0]
            elif strike and len(program) == calm and faults:
                action = data.draw(st.sampled_from(faults))
            else:
                action = data.draw(st.sampled_from(allowed))
            program.append(action)
            counters["steps"] += 1
            return action

        phase = "shrink" if any(p.outcome == "diverged" for p in programs) else "generate"
        began, outcome = time.perf_counter(), "passed"
        try:
            try:
                session = run_program(target, scenario, mode, choose, length)
                hypothesis_target(progress(session), label="progress")
                coverage.add(session, seen)
            finally:
                target.close()
                target.shortfall = {}
        except TargetError as exc:
            # A target that fails (not diverges) must not be shrunk as if it were a bug.
            raise _TargetFailed(exc) from exc
        except Divergence:
            counters.setdefault("first_failure", counters["traces"])
            outcome = "diverged"
            raise
        finally:
            programs.append(
                ProgramRecord(
                    counters["traces"], len(program), time.perf_counter() - began, outcome, phase
                )
            )

    try:
        one_program()
    except _TargetFailed as stop:
        raise stop.error from None
    except Divergence as exc:
        path = save_failure(
            out, target_name, mode, seed, used["config"], list(program), exc, used["shortfall"]
        )
        failures.append(Failure(exc.kind, exc.property, str(path), exc.message))
    return report()


def save_failure(
    out: Path,
    target_name: str,
    mode: str,
    seed: int,
    config: Config,
    program: list[Action],
    exc: Divergence,
    shortfall: Mapping[int, int] | None = None,
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
            # Requests whose prompt ends inside a page (tokens short of whole pages).
            **({"shortfall": {str(r): n for r, n in shortfall.items()}} if shortfall else {}),
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
