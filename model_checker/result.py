"""What every engine reports: one result per property, witnesses, and figures.

All engines (explicit search, BMC, k-induction, proofs, Spacer) return a `CheckResult`, so the CLI,
the kill matrix and the demo treat them alike. Its JSON form is the `--json` contract of
`kvhandoff check`.

A verdict says what was checked, never more:

* `holds` (per property) / `safe` (overall): proved for the result's *scope*: every reachable
  state of this configuration (`fixed-config`: a completed explicit search, a k-induction or
  Spacer proof, a BMC run as deep as the state space), or every size (`any-size`: `prove`).
* `violated`: a counterexample, replayed through the spec.
* `bounded`: no violation on any path of up to `depth` steps, and no argument that deeper paths
  add nothing. Not a proof: exit 3, like `unknown`.
* `unknown`: the engine could not decide (solver unknown, timeout, state limit, failed proof).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from kvhandoff.spec.actions import Action, action_to_json
from kvhandoff.spec.config import Config
from kvhandoff.spec.trace import dump_trace

Verdict = Literal["holds", "violated", "bounded", "unknown"]
OverallVerdict = Literal["safe", "violated", "bounded", "unknown"]
Scope = Literal["any-size", "fixed-config", "bounded"]

EXIT_CODES: dict[OverallVerdict, int] = {"safe": 0, "violated": 1, "bounded": 3, "unknown": 3}
"""The `kvhandoff check` exit code of each overall verdict (see `kvhandoff_cli.main`)."""


def config_summary(config: Config) -> str:
    """The configuration in a few words, for a verdict's scope line."""
    n = len(config.requests)
    tenants = len(config.tenants)
    ranks = config.prefill_ranks
    # Said only when it is more than one, so the one-in-flight scopes read as they always have.
    active = min(config.max_active, n)
    in_flight = f"{active} in flight at once, " if active > 1 else ""
    # A retry is not a fault (its own budget), so a scope with retries says so on its own.
    n_retries = config.max_retries
    retries = f" and {n_retries} client retr{'ies' if n_retries != 1 else 'y'}" if n_retries else ""
    instances = ""
    if config.prefill_instances > 1 or config.decode_instances > 1:
        # Said only when there are several, so one-instance scopes read as they always have.
        instances = (
            f"{config.prefill_instances} prefill and {config.decode_instances} decode instances"
            f" ({'every placement' if config.placement == 'any' else 'placed as given'}), "
        )
    # Said only when the clients choose, so the scopes of scenarios with given rooms read as
    # they always have.
    rooms = "rooms chosen by the client (every choice), " if config.rooms == "any" else ""
    return (
        f"{config.decode_pages} decode page{'s' * (config.decode_pages != 1)}, {instances}"
        f"{rooms}"
        f"{n} request{'s' * (n != 1)}, {in_flight}"
        f"{tenants} tenant{'s' * (tenants != 1)}, {ranks} prefill rank{'s' * (ranks != 1)}, "
        f"at most {config.max_faults} fault{'s' * (config.max_faults != 1)}{retries}"
    )


@dataclass
class PropertyResult:
    property: str
    verdict: Verdict
    depth: int | None = None
    """Length of the counterexample (steps), or the depth up to which the property was checked."""
    trace: tuple[Action, ...] | None = None
    loop_start: int | None = None
    """For a lasso (a cycle that never ends): index of the first step of the repeating part."""
    detail: str = ""
    scope: Scope | None = None
    """What this property's `holds` covers, where an engine says so per property (`prove`: some
    properties may be proved for any size and others for the configuration only); None: the
    result's scope."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "property": self.property,
            "verdict": self.verdict,
            "depth": self.depth,
            "trace": None if self.trace is None else [action_to_json(a) for a in self.trace],
        }
        if self.loop_start is not None:
            out["loop_start"] = self.loop_start
        if self.scope is not None:
            out["scope"] = self.scope
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass
class CheckResult:
    variant: str
    engine: str
    config: Config
    results: list[PropertyResult]
    witnesses: dict[str, bool] = field(default_factory=dict)
    states: int | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> OverallVerdict:
        if any(r.verdict == "violated" for r in self.results):
            return "violated"
        if any(r.verdict == "unknown" for r in self.results):
            return "unknown"
        if any(r.verdict == "bounded" for r in self.results):
            return "bounded"
        return "safe"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def scope(self) -> Scope:
        """What a `holds` of this result covers: `any-size` (prove's any-size model), otherwise
        this configuration; `bounded` when some property was only searched to a depth."""
        if any(r.verdict == "bounded" for r in self.results):
            return "bounded"
        return "any-size" if self.extra.get("scope") == "any-size" else "fixed-config"

    def scope_text(self) -> str:
        """The scope in words, with the configuration: what exit 0 would mean."""
        if self.scope == "any-size":
            # The any-size model leaves `max_retries` free only where the scenario has retries:
            # without them the retry's action is left out, and the scope says so. Every design
            # in its fragment, room-keyed ones too, is proved for any number of instances
            # (docs/z3.md).
            counted = ["requests", "tenants", "faults", "instances"]
            if self.config.max_retries > 0:
                counted.append("client retries")
                tail = ")"
            else:
                tail = "; no client retries: --set max_retries=1 covers any number)"
            return (
                f"any size (every pool size and number of {', '.join(counted[:-1])} and "
                f"{counted[-1]}{tail}"
            )
        where = f"this configuration ({config_summary(self.config)})"
        wider = self.extra.get("any_size_properties")
        if wider and self.scope == "fixed-config":
            # prove: some properties were proved for any size, and the result says which.
            where += f"; {', '.join(wider)} for any size"
        if self.scope == "bounded":
            depth = min(r.depth or 0 for r in self.results if r.verdict == "bounded")
            return f"{where}, paths of at most {depth} steps"
        return where

    def violated(self) -> list[PropertyResult]:
        return [r for r in self.results if r.verdict == "violated"]

    def result_for(self, name: str) -> PropertyResult:
        for r in self.results:
            if r.property == name:
                return r
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "engine": self.engine,
            "config": self.config.to_json(),
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "results": [r.to_json() for r in self.results],
            "witnesses": dict(self.witnesses),
            "states": self.states,
            "seconds": round(self.seconds, 4),
            **self.extra,
            "scope": self.scope,
            "scope_text": self.scope_text(),
        }

    def trace_text(self, prop: PropertyResult) -> str:
        """The counterexample of `prop` in the trace format."""
        assert prop.trace is not None
        header: dict[str, Any] = {
            "variant": self.variant,
            "property": prop.property,
            "engine": self.engine,
        }
        if prop.loop_start is not None:
            header["loop_start"] = prop.loop_start
        return dump_trace(self.config, prop.trace, kind="counterexample", **header)
