"""The engines `kvhandoff check --engine` can run, by name.

Each engine is a function `(variant, config, options) -> CheckResult`. Engines that cannot handle a
variant (an action override they cannot translate) raise `EngineCannotEncode`, which the CLI reports
as inconclusive (exit 3): a variant is never skipped silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from model_checker.explore import explore
from model_checker.result import CheckResult
from spec.config import Config
from spec.variants import Variant


class EngineCannotEncode(Exception):
    """The engine cannot translate this variant (say which action and why)."""


@dataclass(frozen=True)
class EngineOptions:
    depth: int | None = None
    """Search depth for bounded engines (BMC, k-induction); None uses the engine's default."""
    timeout: float | None = None
    """Seconds per solver call; None means no limit."""
    max_states: int | None = None
    """Explicit search only: stop after this many states (the verdict is then 'unknown')."""


Engine = Callable[[Variant, Config, EngineOptions], CheckResult]


def _explore(variant: Variant, config: Config, options: EngineOptions) -> CheckResult:
    return explore(variant, config, max_states=options.max_states)


ENGINES: dict[str, Engine] = {"explore": _explore}
