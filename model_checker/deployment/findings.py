"""Findings: what the checker reports, one per broken rule (engines.md §5.1 C1–C7, §5.2)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kvhandoff.model_checker.deployment.model import Role


class Severity(enum.StrEnum):
    ERROR = "error"  # the deployment is unsafe (or will not start): exit code 1
    WARNING = "warning"  # worth changing; does not change the verdict
    NOTE = "note"  # a fact about the deployment an operator should know


@dataclass(frozen=True)
class LengthRange:
    """Prompt lengths in tokens, both ends included. `contiguous` is False when Z3 found a length
    between `lo` and `hi` that does not break the rule."""

    lo: int
    hi: int
    contiguous: bool = True

    @property
    def count(self) -> int | None:
        return self.hi - self.lo + 1 if self.contiguous else None


@dataclass(frozen=True)
class Finding:
    rule: str  # "C1".."C7" (engines.md §5.1) or "V" for vLLM's own checks (§5.2)
    code: str  # stable identifier, for --json consumers and tests
    severity: Severity
    title: str
    detail: str
    fix: str
    flags: tuple[str, ...]  # the flags, env vars or TOML keys to change
    roles: tuple[Role, ...] = ()
    lengths: LengthRange | None = None
    # True when decode can generate from pages no prefill wrote for this request: with unscrubbed
    # pages that is a cross-tenant read (the incident).
    leak: bool = False
