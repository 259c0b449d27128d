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
    first: bool = False
    """BMC only: stop at the first depth where some property fails."""


Engine = Callable[[Variant, Config, EngineOptions], CheckResult]


def _explore(variant: Variant, config: Config, options: EngineOptions) -> CheckResult:
    return explore(variant, config, max_states=options.max_states)


def _z3(run: Callable[[], CheckResult]) -> CheckResult:
    from model_checker.z3_encoding import CannotEncode
    from model_checker.z3_thread_guard import z3_on_this_thread

    try:
        with z3_on_this_thread():
            return run()
    except CannotEncode as exc:
        raise EngineCannotEncode(str(exc)) from exc


def _bmc(variant: Variant, config: Config, options: EngineOptions) -> CheckResult:
    from model_checker.z3_engines import bmc_cached

    return _z3(
        lambda: bmc_cached(
            variant, config, depth=options.depth, timeout=options.timeout, first=options.first
        )
    )


def _kind(variant: Variant, config: Config, options: EngineOptions) -> CheckResult:
    from model_checker.z3_engines import kinduction

    return _z3(lambda: kinduction(variant, config, depth=options.depth, timeout=options.timeout))


def _prove(variant: Variant, config: Config, options: EngineOptions) -> CheckResult:
    from model_checker.prove import prove

    return _z3(lambda: prove(variant, config, timeout=options.timeout, depth=options.depth))


def _spacer(variant: Variant, config: Config, options: EngineOptions) -> CheckResult:
    from model_checker.z3_engines import spacer

    return _z3(lambda: spacer(variant, config, timeout=options.timeout))


ENGINES: dict[str, Engine] = {
    "explore": _explore,
    "bmc": _bmc,
    "kind": _kind,
    "prove": _prove,
    "spacer": _spacer,
}
