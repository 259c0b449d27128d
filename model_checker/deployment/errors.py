"""Errors of the deployment checker, one tree:

- `DeploymentError`: base class.
  - `ConfigInputError`: the input cannot be checked (unknown or malformed flag, missing value,
    contradictory settings, pool size that cannot be determined). Carries the flag or key at
    fault and the offending value; the CLI maps it to exit code 2.
  - `InconclusiveError`: Z3 answered `unknown` (or timed out). Never read as "safe"; exit code 3.
"""

from __future__ import annotations


class DeploymentError(Exception):
    """Base class of the deployment checker's errors."""


class ConfigInputError(DeploymentError):
    """Bad input: `flag` is what the user has to change, `value` what they gave (if anything)."""

    def __init__(self, flag: str, message: str, value: str | None = None) -> None:
        self.flag = flag
        self.message = message
        self.value = value
        shown = f" (got {value!r})" if value is not None else ""
        super().__init__(f"{flag}: {message}{shown}")


class InconclusiveError(DeploymentError):
    """Z3 could not decide a query; the verdict is inconclusive, not safe."""
