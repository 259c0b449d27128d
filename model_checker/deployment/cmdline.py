"""Read real SGLang and vLLM launch command lines.

Real command lines carry dozens of flags; only the capacity- and handoff-relevant ones are
modelled (`SGLANG_FLAGS`, `VLLM_FLAGS`). Any other flag is accepted and skipped (with its value,
if the next token is not itself a flag), so a command copied from a deployment manifest parses.
A flag that *is* modelled gets a strict value check: `--page-size abc` is an error naming the flag
and the value, never silently ignored. Leading `KEY=VALUE` words (and `env KEY=VALUE ...`) are the
server's environment, like a shell's.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvhandoff.model_checker.deployment.errors import ConfigInputError
from kvhandoff.model_checker.deployment.model import Engine, Role
from kvhandoff.model_checker.deployment.values import (
    parse_bool,
    parse_choice,
    parse_float,
    parse_int,
)

SGLANG_BACKENDS = ("mooncake", "nixl", "mori", "ascend", "fake")
SGLANG_POLICIES = ("early", "prefill_complete")
SGLANG_MODES = ("null", "prefill", "decode")


@dataclass(frozen=True)
class FlagSpec:
    """A modelled flag: which RoleConfig field it sets (None: validated only) and how to parse."""

    field: str | None
    parse: Callable[[str, str], Any] | None  # None: a boolean switch that takes no value
    switch_value: bool = True


def _int(
    minimum: int = 1, allow: tuple[int, ...] = (), human: bool = False
) -> Callable[[str, str], int]:
    return lambda flag, raw: parse_int(flag, raw, minimum=minimum, allow=allow, human=human)


def _choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    return lambda flag, raw: parse_choice(flag, raw, choices)


def _text(flag: str, raw: str) -> str:
    if not raw:
        raise ConfigInputError(flag, "expected a value", raw)
    return raw


def _fraction(flag: str, raw: str) -> float:
    value = parse_float(flag, raw)
    if not 0 < value <= 1:
        raise ConfigInputError(flag, "must be a fraction in (0, 1]", raw)
    return value


SGLANG_FLAGS: dict[str, FlagSpec] = {
    "--context-length": FlagSpec("context_length", _int()),
    "--max-total-tokens": FlagSpec("max_total_tokens", _int()),
    "--page-size": FlagSpec("page_size", _int()),
    "--chunked-prefill-size": FlagSpec("chunked_prefill_size", _int(allow=(-1,))),
    "--max-prefill-tokens": FlagSpec("max_prefill_tokens", _int()),
    "--allow-auto-truncate": FlagSpec("allow_auto_truncate", None),
    "--kv-cache-dtype": FlagSpec("kv_cache_dtype", _text),
    "--disaggregation-mode": FlagSpec("mode", _choice(SGLANG_MODES)),
    "--disaggregation-transfer-backend": FlagSpec("transfer_backend", _choice(SGLANG_BACKENDS)),
    "--disaggregation-decode-allocation-policy": FlagSpec(
        "allocation_policy", _choice(SGLANG_POLICIES)
    ),
    "--disaggregation-enable-kv-checksum": FlagSpec("kv_checksum", None),
    "--dp-size": FlagSpec("dp_size", _int()),
    "--dp": FlagSpec("dp_size", _int()),
    "--load-balance-method": FlagSpec("load_balance_method", _text),
    "--speculative-algorithm": FlagSpec("speculative_algorithm", _text),
    "--model-path": FlagSpec("model", _text),
    "--model": FlagSpec("model", _text),
    "--mem-fraction-static": FlagSpec(None, _fraction),
    "--tp-size": FlagSpec(None, _int()),
    "--tp": FlagSpec(None, _int()),
}

VLLM_FLAGS: dict[str, FlagSpec] = {
    "--model": FlagSpec("model", _text),
    "--max-model-len": FlagSpec("context_length", _int(allow=(-1,), human=True)),
    "--block-size": FlagSpec("page_size", _int()),
    "--num-gpu-blocks-override": FlagSpec("num_gpu_blocks", _int()),
    "--max-num-batched-tokens": FlagSpec("max_num_batched_tokens", _int(human=True)),
    "--enable-chunked-prefill": FlagSpec("enable_chunked_prefill", None),
    "--no-enable-chunked-prefill": FlagSpec("enable_chunked_prefill", None, switch_value=False),
    "--kv-transfer-config": FlagSpec("kv_transfer_config", _text),
    "--gpu-memory-utilization": FlagSpec(None, _fraction),
    "--kv-cache-memory-bytes": FlagSpec(None, _int(human=True)),
    "--tensor-parallel-size": FlagSpec(None, _int()),
    "-tp": FlagSpec(None, _int()),
}

# Environment variables that are modelled: (RoleConfig field, parser). Others are accepted.
SGLANG_ENV: dict[str, tuple[str | None, Callable[[str, str], Any]]] = {
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": ("bootstrap_timeout_s", parse_float),
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": ("waiting_timeout_s", parse_float),
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": ("deferred_release", parse_bool),
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT": (
        "deferred_release_timeout_s",
        parse_float,
    ),
    "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": ("allow_longer_context", parse_bool),
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": (None, parse_float),
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": (None, lambda f, r: parse_int(f, r)),
}
VLLM_ENV: dict[str, tuple[str | None, Callable[[str, str], Any]]] = {
    "VLLM_NIXL_ABORT_REQUEST_TIMEOUT": (None, parse_float),
    "VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT": (None, parse_float),
}

_ENV_WORD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PYTHON = re.compile(r"^(.*/)?python(\d+(\.\d+)?)?$")


def _looks_like_flag(token: str) -> bool:
    return token.startswith("--") or bool(re.match(r"^-[A-Za-z]", token))


@dataclass
class ParsedCommand:
    """A command line split into engine, environment and modelled flag values (with the flag each
    came from)."""

    engine: Engine
    values: dict[str, tuple[Any, str]] = field(default_factory=dict)  # field -> (value, flag)
    env: dict[str, str] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)


def _detect_engine(words: list[str], where: str) -> tuple[Engine, list[str]]:
    """Find the launcher and return the engine and the words after it. Words before it are a
    wrapper (`uv run`, `numactl --interleave=all`, `srun ...`) and are skipped."""
    for i in range(len(words)):
        rest = words[i:]
        if len(rest) >= 2 and rest[0].endswith("vllm") and rest[1] == "serve":
            return Engine.VLLM, rest[2:]
        if len(rest) >= 3 and _PYTHON.match(rest[0]) and rest[1] == "-m":
            if rest[2] == "sglang.launch_server":
                return Engine.SGLANG, rest[3:]
            if rest[2] == "vllm.entrypoints.openai.api_server":
                return Engine.VLLM, rest[3:]
    shown = " ".join(words[:3]) if words else ""
    raise ConfigInputError(
        where,
        "not an SGLang or vLLM launch command (expected 'python -m sglang.launch_server ...', "
        "'vllm serve MODEL ...' or 'python -m vllm.entrypoints.openai.api_server ...')",
        shown,
    )


def parse_command(text: str, where: str) -> ParsedCommand:
    """Parse one server's command line. `where` names the option it came from (for errors)."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ConfigInputError(where, f"cannot split the command line: {exc}", text) from None
    env: dict[str, str] = {}
    if words and words[0] == "env":
        words = words[1:]
    while words and _ENV_WORD.match(words[0]):
        key, _, assigned = words.pop(0).partition("=")
        env[key] = assigned
    engine, rest = _detect_engine(words, where)
    cmd = ParsedCommand(engine=engine, env=env)
    specs = SGLANG_FLAGS if engine is Engine.SGLANG else VLLM_FLAGS
    if engine is Engine.VLLM and rest and not _looks_like_flag(rest[0]):
        cmd.values["model"] = (rest.pop(0), "model (vllm serve MODEL)")
    i = 0
    while i < len(rest):
        token = rest[i]
        i += 1
        if not _looks_like_flag(token):
            cmd.ignored.append(token)
            continue
        flag, eq, inline = token.partition("=")
        spec = specs.get(flag)
        if spec is None:
            # Not modelled: skip it and, unless it is a switch, its value.
            if not eq and i < len(rest) and not _looks_like_flag(rest[i]):
                i += 1
            cmd.ignored.append(flag)
            continue
        if spec.parse is None:
            if eq:
                value: Any = parse_bool(flag, inline)
                value = value if spec.switch_value else not value
            else:
                value = spec.switch_value
        else:
            if eq:
                raw = inline
            elif i < len(rest) and not rest[i].startswith("--"):
                raw = rest[i]
                i += 1
            else:
                raise ConfigInputError(flag, f"missing value in {where}")
            try:
                value = spec.parse(flag, raw)
            except ConfigInputError as exc:
                raise ConfigInputError(
                    exc.flag, f"{exc.message} in the {where} command line", exc.value
                ) from None
        if spec.field is None:
            continue
        previous = cmd.values.get(spec.field)
        if previous is not None and previous[0] != value:
            raise ConfigInputError(
                flag,
                f"given twice in {where} with different values ({previous[1]} "
                f"{previous[0]!r} and {flag} {value!r}); keep one",
            )
        cmd.values[spec.field] = (value, flag)
    return cmd


def parse_env_assignments(items: Sequence[str], where: str) -> dict[str, str]:
    """`KEY=VALUE` strings from --env / --prefill-env / --decode-env."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ConfigInputError(where, "expected KEY=VALUE", item)
        out[key] = value
    return out


def apply_env(
    engine: Engine, env: Mapping[str, str], where: Mapping[str, str]
) -> dict[str, tuple[Any, str]]:
    """Modelled environment variables as field values. `where[key]` says where each came from."""
    table = SGLANG_ENV if engine is Engine.SGLANG else VLLM_ENV
    out: dict[str, tuple[Any, str]] = {}
    for key, raw in env.items():
        entry = table.get(key)
        if entry is None:
            continue
        target, parse = entry
        value = parse(key, raw)
        if target is not None:
            out[target] = (value, f"{key} ({where[key]})")
    return out


def parse_kv_transfer_config(raw: str) -> dict[str, tuple[Any, str]]:
    """vLLM's --kv-transfer-config JSON: the fields the checker models."""
    flag = "--kv-transfer-config"
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigInputError(flag, f"not valid JSON ({exc.msg})", raw) from None
    if not isinstance(data, dict):
        raise ConfigInputError(flag, "expected a JSON object", raw)
    out: dict[str, tuple[Any, str]] = {}
    for key in ("kv_connector", "kv_role"):
        if key in data:
            if not isinstance(data[key], str):
                raise ConfigInputError(f"{flag} {key}", "expected a string", repr(data[key]))
            out[key] = (data[key], f"{flag} {key}")
    if "kv_load_failure_policy" in data:
        out["kv_load_failure_policy"] = (
            parse_choice(
                f"{flag} kv_load_failure_policy",
                str(data["kv_load_failure_policy"]),
                ("recompute", "fail"),
            ),
            f"{flag} kv_load_failure_policy",
        )
    extra = data.get("kv_connector_extra_config", {})
    if not isinstance(extra, dict):
        raise ConfigInputError(
            f"{flag} kv_connector_extra_config", "expected an object", repr(extra)
        )
    if "kv_lease_duration" in extra:
        key = f"{flag} kv_connector_extra_config.kv_lease_duration"
        lease = extra["kv_lease_duration"]
        if isinstance(lease, bool) or not isinstance(lease, int | float) or lease <= 0:
            raise ConfigInputError(key, "expected a positive number of seconds", repr(lease))
        out["kv_lease_duration_s"] = (float(lease), key)
    if "enforce_handshake_compat" in extra:
        key = f"{flag} kv_connector_extra_config.enforce_handshake_compat"
        compat = extra["enforce_handshake_compat"]
        if not isinstance(compat, bool):
            raise ConfigInputError(key, "expected true or false", repr(compat))
        out["enforce_handshake_compat"] = (compat, key)
    return out


def role_of(option: str) -> Role:
    return Role.PREFILL if "prefill" in option else Role.DECODE
