"""What every engine reports: one result per property, witnesses, and figures.

All engines (explicit search, BMC, k-induction, proofs, Spacer) return a `CheckResult`, so the CLI,
the kill matrix and the demo treat them alike. Its JSON form is the `--json` contract of
`kvhandoff check`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from spec.actions import Action, action_to_json
from spec.config import Config
from spec.trace import dump_trace

Verdict = Literal["holds", "violated", "unknown"]
OverallVerdict = Literal["safe", "violated", "unknown"]


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

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "property": self.property,
            "verdict": self.verdict,
            "depth": self.depth,
            "trace": None if self.trace is None else [action_to_json(a) for a in self.trace],
        }
        if self.loop_start is not None:
            out["loop_start"] = self.loop_start
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
        return "safe"

    @property
    def exit_code(self) -> int:
        return {"safe": 0, "violated": 1, "unknown": 3}[self.verdict]

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
            "results": [r.to_json() for r in self.results],
            "witnesses": dict(self.witnesses),
            "states": self.states,
            "seconds": round(self.seconds, 4),
            **self.extra,
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
