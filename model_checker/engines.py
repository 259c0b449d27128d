"""The engines `kvhandoff check --engine` can run, by name, and how their verdicts combine.

Each engine is a function `(variant, config, options) -> CheckResult`. Engines that cannot handle a
variant (an action override they cannot translate, several prefill ranks) raise
`EngineCannotEncode`, which the CLI reports as inconclusive (exit 3): a variant is never skipped
silently, and never replaced by the part of it an engine understands.

What SAFE means, per engine (anything less is `bounded` or `unknown`, exit 3):

* explore: the search completed; every reachable state of this configuration.
* bmc: no violation up to `--depth` steps is `bounded`; SAFE for this configuration only when the
  depth reaches the state space's depth (measured by the explorer on the same variant and
  configuration, `bmc_completeness`).
* kind: the properties and fixed-config invariants are k-inductive; this configuration.
* spacer: Spacer's inductive invariant, re-checked by plain induction; this configuration.
* prove: an inductive invariant of the any-size model (any size), or of the fixed-config encoding
  for designs outside it (this configuration).

`combine` makes one verdict of several engines' (`--engine all`, `kvhandoff matrix`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kvhandoff.model_checker.explore import explore, union_of_placements
from kvhandoff.model_checker.reduction import merged
from kvhandoff.model_checker.result import EXIT_CODES, CheckResult, PropertyResult
from kvhandoff.spec.config import Config, placements
from kvhandoff.spec.variants import Variant


class EngineCannotEncode(Exception):
    """The engine cannot translate this variant (say which action and why)."""


@dataclass(frozen=True)
class EngineOptions:
    depth: int | None = None
    """Search depth for bounded engines (BMC, k-induction); None uses the engine's default."""
    timeout: float | None = None
    """Seconds per solver call. None: the engine's default (`PROVE_TIMEOUT` for prove, no limit
    for the others); 0: no limit for any engine."""
    max_states: int | None = None
    """Explicit search only: stop after this many states (the verdict is then 'unknown')."""
    first: bool = False
    """BMC only: stop at the first depth where some property fails."""
    invariants: bool = False
    """Explicit search only: evaluate spec/invariants.py's formulas on every state."""
    reduce: bool = True
    """Explicit search only: count states that differ only in what no step or property reads
    (ghost flags only witnesses read, finished requests' prefill fields) as one
    (`model_checker/reduction.py`)."""


Engine = Callable[[Variant, Config, EngineOptions], CheckResult]


def _explore(variant: Variant, config: Config, options: EngineOptions) -> CheckResult:
    result = explore(
        variant,
        config,
        max_states=options.max_states,
        invariants=options.invariants,
        reduce=options.reduce,
    )
    _remember_explored(variant, config, result)
    return result


# --- BMC's completeness threshold -----------------------------------------------------------------

COMPLETENESS_MAX_STATES = 250_000
"""The largest state space BMC explores to learn its depth (`state_space_depth`)."""

_EXPLORED: dict[tuple[int, Config], tuple[Variant, CheckResult]] = {}
"""Completed explicit searches by (variant identity, config): BMC reuses the one `--engine all` or
the matrix has just run. The variant is kept in the value so that its id is not reused."""


def _remember_explored(variant: Variant, config: Config, result: CheckResult) -> None:
    if result.extra.get("complete"):
        _EXPLORED[(id(variant), config)] = (variant, result)


def _up_to(searched: CheckResult) -> str:
    """A reduced search's depth (`model_checker/reduction.py`): every reachable state is, in all
    a property reads, one of its states, so a violation anywhere has one within that depth."""
    what = merged(searched.extra.get("cleared_flags", ()), searched.extra.get("cleared_fields", ()))
    return f", up to {what} no property reads" if what else ""


def state_space_depth(variant: Variant, config: Config) -> CheckResult | None:
    """The completed explicit search of `variant` on `config` (its `extra["max_depth"]` is the
    state space's depth: every reachable state is that many steps from the initial state, or
    fewer), or None when it has more than `COMPLETENESS_MAX_STATES` states."""
    hit = _EXPLORED.get((id(variant), config))
    if hit is not None and hit[0] is variant:
        return hit[1]
    result = explore(variant, config, max_states=COMPLETENESS_MAX_STATES)
    _remember_explored(variant, config, result)
    return result if result.extra.get("complete") else None


def bmc_completeness(variant: Variant, config: Config, result: CheckResult) -> CheckResult:
    """Turn BMC's `bounded` answers into `holds` where the bound is complete, and say why.

    Every reachable state lies on a path from the initial state no longer than the state space's
    depth D (the largest breadth-first distance, which the explorer measures on the same variant
    and configuration). BMC asks at every depth 0..k whether a property fails; when k >= D it has
    asked about every reachable state, so "no violation up to depth k" is a proof for this
    configuration. Otherwise the result stays `bounded` and says which depth would be complete.
    """
    bounded = [r for r in result.results if r.verdict == "bounded"]
    if not bounded or result.violated():
        # A counterexample decides the verdict already: no explicit search for the others.
        return result
    started = time.perf_counter()
    searched = state_space_depth(variant, config)
    result.seconds += time.perf_counter() - started
    if searched is None:
        why = (
            f"the state space has more than {COMPLETENESS_MAX_STATES:,} states: its depth, and "
            "so a complete bound, is not known"
        )
        result.extra["completeness"] = {"complete": False, "reason": why}
        return result
    diameter = int(searched.extra["max_depth"])
    states = searched.states
    depth = min(r.depth or 0 for r in bounded)
    for r in bounded:
        theirs = searched.result_for(r.property)
        if theirs.verdict == "violated" and (theirs.depth or 0) <= (r.depth or 0):
            # The explorer's counterexample is a replayed spec trace within BMC's bound: the
            # Z3 relation misses a spec step. A bug in kvhandoff, never a verdict.
            from kvhandoff.model_checker.z3_encoding import EncodingError

            raise EncodingError(
                f"BMC finds no violation of {r.property} up to depth {r.depth}, but the explorer "
                f"finds one of {theirs.depth} steps on the same variant and configuration"
            )
    up_to = _up_to(searched)
    if depth >= diameter:
        why = (
            f"complete: depth {depth} >= {diameter}, the depth of the state space (explicit "
            f"search of the same variant and configuration: {states:,} states, each within "
            f"{diameter} steps of the initial state{up_to})"
        )
        for r in bounded:
            r.verdict = "holds"
            r.detail = f"no violation up to depth {r.depth}, a complete bound (below)"
        result.extra["completeness"] = {"complete": True, "reason": why, "diameter": diameter}
    else:
        why = (
            f"not complete: the state space is {diameter} steps deep (explicit search: "
            f"{states:,} states{up_to}); --depth {diameter} would make this bound complete"
        )
        result.extra["completeness"] = {"complete": False, "reason": why, "diameter": diameter}
    return result


def _z3(run: Callable[[], CheckResult]) -> CheckResult:
    from kvhandoff.model_checker.z3_encoding import CannotEncode
    from kvhandoff.model_checker.z3_thread_guard import z3_on_this_thread

    try:
        with z3_on_this_thread():
            return run()
    except CannotEncode as exc:
        raise EngineCannotEncode(str(exc)) from exc


def _bmc(variant: Variant, config: Config, options: EngineOptions) -> CheckResult:
    from kvhandoff.model_checker.z3_engines import bmc_cached

    result = _z3(
        lambda: bmc_cached(
            variant,
            config,
            depth=options.depth,
            timeout=solver_timeout("bmc", options.timeout),
            first=options.first,
        )
    )
    return bmc_completeness(variant, config, result)


def _kind(variant: Variant, config: Config, options: EngineOptions) -> CheckResult:
    from kvhandoff.model_checker.z3_engines import kinduction

    return _z3(
        lambda: kinduction(
            variant, config, depth=options.depth, timeout=solver_timeout("kind", options.timeout)
        )
    )


PROVE_TIMEOUT = 300.0
"""prove's limit per solver call when none is given (seconds). Without one, an obligation Z3
cannot decide (a reviewer's own variant can make one) holds the whole check, printing nothing,
for ever; with it that obligation comes back `unknown` and is reported so. The slowest catalogue
proof measured takes about two minutes in all (docs/z3.md)."""


def solver_timeout(engine: str, given: float | None) -> float | None:
    """The limit per solver call `engine` runs under: `given`, or the engine's default when none
    is given; 0 means no limit."""
    if given is None:
        return PROVE_TIMEOUT if engine == "prove" else None
    if given < 0:
        raise ValueError(f"a solver timeout must be 0 (no limit) or more seconds, got {given}")
    return None if given == 0 else given


def _prove(variant: Variant, config: Config, options: EngineOptions) -> CheckResult:
    from kvhandoff.model_checker.prove import prove

    timeout = solver_timeout("prove", options.timeout)
    result = _z3(lambda: prove(variant, config, timeout=timeout, depth=options.depth))
    result.extra["solver_timeout_s"] = timeout
    return result


def _spacer(variant: Variant, config: Config, options: EngineOptions) -> CheckResult:
    from kvhandoff.model_checker.z3_engines import spacer

    return _z3(lambda: spacer(variant, config, timeout=solver_timeout("spacer", options.timeout)))


ENGINES: dict[str, Engine] = {
    "explore": _explore,
    "bmc": _bmc,
    "kind": _kind,
    "prove": _prove,
    "spacer": _spacer,
}


# --- one verdict from several engines -------------------------------------------------------------

RunVerdict = Literal["safe", "violated", "bounded", "unknown", "cannot_encode"]
CombinedVerdict = Literal["safe", "violated", "bounded", "unknown", "disagree"]

EXIT_DISAGREE = 4
"""Exit code when two engines reach opposite conclusive verdicts (see `combine`)."""


@dataclass
class EngineRun:
    """One engine on one variant and configuration: its result, or why it cannot encode it."""

    engine: str
    result: CheckResult | None
    cannot_encode: str = ""
    seconds: float = 0.0

    @property
    def verdict(self) -> RunVerdict:
        return "cannot_encode" if self.result is None else self.result.verdict

    @property
    def scope(self) -> str:
        """What the run covered, in a few words (the configuration is printed once, apart)."""
        if self.result is None:
            return "-"
        if self.result.scope == "any-size" and self.verdict == "safe":
            return "any size"
        if self.verdict == "bounded":
            depth = min(r.depth or 0 for r in self.result.results if r.verdict == "bounded")
            return f"this configuration, paths of at most {depth} steps"
        return "this configuration"

    @property
    def note(self) -> str:
        """Why the run is inconclusive, or what it found, in one line."""
        if self.result is None:
            return f"cannot encode: {self.cannot_encode}"
        result = self.result
        if self.verdict == "violated":
            names = [f"{r.property} @{r.depth}" for r in result.violated()]
            return "violated: " + ", ".join(names)
        if self.verdict == "unknown":
            details = [r.detail for r in result.results if r.verdict == "unknown" and r.detail]
            return details[0] if details else ""
        completeness = result.extra.get("completeness")
        if completeness:
            return str(completeness["reason"])
        return ""

    @property
    def conclusive(self) -> bool:
        return self.verdict in ("safe", "violated")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "engine": self.engine,
            "verdict": self.verdict,
            "scope": None if self.result is None else self.result.scope,
            "scope_text": self.scope,
            "seconds": round(self.seconds, 3),
            "note": self.note,
        }
        if self.cannot_encode:
            out["cannot_encode"] = self.cannot_encode
        return out


def run_engine(name: str, variant: Variant, config: Config, options: EngineOptions) -> EngineRun:
    """Run one engine; `EngineCannotEncode` becomes a run with the reason (no result)."""
    started = time.perf_counter()
    try:
        fixed = placements(config)
        if name == "explore" or fixed == [config]:
            result = ENGINES[name](variant, config, options)
        else:
            # A router placing as it likes on several instances: each fixed placement, as the
            # explorer does (`explore`), and one result from theirs.
            runs = []
            for choice in fixed:
                run = ENGINES[name](variant, choice, options)
                runs.append(run)
                if run.scope == "any-size" and run.verdict == "safe":
                    # A proof for any size is one for every configuration, so for every
                    # other choice too: it is not made again for each.
                    runs += [replace(run, config=c, seconds=0.0) for c in fixed[len(runs) :]]
                    break
            result = union_of_placements(config, runs)
    except EngineCannotEncode as exc:
        return EngineRun(name, None, str(exc), time.perf_counter() - started)
    return EngineRun(name, result, seconds=time.perf_counter() - started)


@dataclass
class Disagreement:
    """A property one engine proves and another violates: a bug in kvhandoff."""

    property: str
    proved_by: list[str]
    violated_by: list[str]

    def text(self) -> str:
        return (
            f"{self.property}: proved by {', '.join(self.proved_by)}, violated by "
            f"{', '.join(self.violated_by)}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "property": self.property,
            "proved_by": self.proved_by,
            "violated_by": self.violated_by,
        }


@dataclass
class Combined:
    """The verdict of several engines on one variant and configuration (see `combine`)."""

    runs: list[EngineRun]
    verdict: CombinedVerdict
    deciding: list[str]
    """The engines whose results give the verdict (strongest scope first)."""
    disagreements: list[Disagreement] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return EXIT_DISAGREE if self.verdict == "disagree" else EXIT_CODES[self.verdict]

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "decided_by": self.deciding,
            "disagreements": [d.to_json() for d in self.disagreements],
            "table": [r.to_json() for r in self.runs],
        }


def _proof(r: PropertyResult) -> bool:
    return r.verdict == "holds"


def combine(runs: Sequence[EngineRun]) -> Combined:
    """One verdict from several engines' runs on the same variant and configuration.

    The strongest conclusive result wins: a violation (a replayed counterexample) or a proof. An
    engine's unknown, timeout, `bounded` or cannot-encode never downgrades another's proof or
    violation; they only decide when no engine is conclusive (`bounded` when some engine searched
    to a depth, else `unknown`). A property that one engine proves and another violates is a bug
    in kvhandoff, not a verdict about the protocol: `disagree` (exit `EXIT_DISAGREE`).
    """
    runs = list(runs)
    proved: dict[str, list[str]] = {}
    violated: dict[str, list[str]] = {}
    for run in runs:
        if run.result is None:
            continue
        label = f"{run.engine} ({run.result.scope})"
        for r in run.result.results:
            if _proof(r):
                proved.setdefault(r.property, []).append(label)
            elif r.verdict == "violated":
                violated.setdefault(r.property, []).append(run.engine)
    disagreements = [
        Disagreement(name, proved[name], violated[name]) for name in proved if name in violated
    ]
    if disagreements:
        return Combined(runs, "disagree", [], disagreements)
    by_verdict: dict[str, list[EngineRun]] = {}
    for run in runs:
        by_verdict.setdefault(run.verdict, []).append(run)
    order: tuple[CombinedVerdict, ...] = ("violated", "safe", "bounded")
    for verdict in order:
        hits = by_verdict.get(verdict, [])
        if hits and verdict == "safe":
            # A proof for any size is stronger than one for this configuration.
            hits.sort(key=lambda r: r.result is None or r.result.scope != "any-size")
        if hits:
            return Combined(runs, verdict, [r.engine for r in hits])
    return Combined(runs, "unknown", [])
