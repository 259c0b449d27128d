"""Value parsing shared by the command-line and TOML readers. Each parser names the flag (or key)
it was reading in its error, with the value it refused, so the user knows what to fix."""

from __future__ import annotations

import re

from kvhandoff.model_checker.deployment.errors import ConfigInputError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
# vLLM's human-readable ints: lower-case suffixes are decimal (k = 1000), upper-case binary
# (K = 1024), as in vllm's `human_readable_int`.
_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}
_HUMAN = re.compile(r"^(\d+(?:\.\d+)?)([kmgKMG])$")


def parse_int(
    flag: str,
    raw: str,
    *,
    minimum: int | None = 1,
    allow: tuple[int, ...] = (),
    human: bool = False,
) -> int:
    """An integer >= minimum (or one of `allow`, e.g. -1 for "disabled" / "auto")."""
    text = raw.strip().replace("_", "")
    value: int | None = None
    if re.fullmatch(r"[+-]?\d+", text):
        value = int(text)
    elif human and (m := _HUMAN.match(text)):
        value = int(float(m.group(1)) * _SUFFIX[m.group(2)])
    if value is None:
        raise ConfigInputError(flag, "expected an integer", raw)
    if value in allow:
        return value
    if minimum is not None and value < minimum:
        extra = f" (or {', '.join(map(str, allow))})" if allow else ""
        raise ConfigInputError(flag, f"must be at least {minimum}{extra}", raw)
    return value


def parse_float(flag: str, raw: str, *, minimum: float = 0.0) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigInputError(flag, "expected a number", raw) from None
    if value != value or value < minimum or value == float("inf"):
        raise ConfigInputError(flag, f"must be a finite number ≥ {minimum:g}", raw)
    return value


def parse_bool(flag: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ConfigInputError(flag, "expected true or false", raw)


def parse_choice(flag: str, raw: str, choices: tuple[str, ...]) -> str:
    if raw not in choices:
        raise ConfigInputError(flag, f"must be one of {', '.join(choices)}", raw)
    return raw
