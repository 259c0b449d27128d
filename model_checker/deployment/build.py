"""Turn parsed inputs (two command lines, or a TOML file) into a `Deployment`.

The one judgement call here is the KV pool. Engines size it from GPU memory at startup, so a
command line alone rarely fixes it. We take it from what bounds it explicitly (SGLang
`--max-total-tokens`, vLLM `--num-gpu-blocks-override` × `--block-size`) and/or from the checker's
`--prefill-pool-tokens` / `--decode-pool-tokens` (the size the engine logged at startup), apply the
engine's own rounding, and refuse (exit 2) rather than guess when neither is given.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from kvhandoff.model_checker.deployment.cmdline import (
    SGLANG_BACKENDS,
    SGLANG_POLICIES,
    apply_env,
    parse_command,
    parse_env_assignments,
    parse_kv_transfer_config,
)
from kvhandoff.model_checker.deployment.errors import ConfigInputError
from kvhandoff.model_checker.deployment.model import (
    DEFAULT_SGLANG_VERSION,
    DEFAULT_VLLM_VERSION,
    SGLANG_DEFAULT_PAGE_SIZE,
    SGLANG_VERSIONS,
    VLLM_DEFAULT_BLOCK_SIZE,
    VLLM_VERSIONS,
    Deployment,
    Engine,
    Role,
    RoleConfig,
    Setting,
)

_ROLE_FIELDS = {f.name for f in fields(RoleConfig)} - {"role", "engine", "notes"}


@dataclass(frozen=True)
class CheckerOptions:
    """Checker options that complete what the command lines leave open."""

    env: Sequence[str] = ()
    prefill_env: Sequence[str] = ()
    decode_env: Sequence[str] = ()
    prefill_pool_tokens: int | None = None
    decode_pool_tokens: int | None = None
    router_window: int | None = None
    model_context_length: int | None = None
    sglang_version: str | None = None
    max_decode_queueing_s: float | None = None


def _pool_option(role: Role) -> str:
    return f"--{role}-pool-tokens"


def _resolve_sglang_pool(
    role: Role,
    cap: tuple[int, str] | None,
    given: tuple[int, str] | None,
    page: int,
    notes: list[str],
) -> Setting[int]:
    """pool = page_align(min(profiled, --max-total-tokens)) (kv_cache_configurator)."""
    option = _pool_option(role)
    profiled = given[0] if given is not None else None
    if given is not None:
        option = given[1]
    if cap is None and profiled is None:
        raise ConfigInputError(
            option,
            f"cannot determine the {role} KV pool size: the {role} command line has no "
            "--max-total-tokens, and SGLang sizes the pool from GPU memory at startup "
            "(--mem-fraction-static). Add --max-total-tokens to the command, or pass the size "
            f"the server logs at startup (max_total_num_tokens=...) as {option}",
        )
    if cap is not None and profiled is not None:
        value, source = (cap[0], cap[1]) if cap[0] <= profiled else (profiled, option)
        if cap[0] > profiled:
            notes.append(
                f"{role}: --max-total-tokens {cap[0]:,} exceeds the profiled pool "
                f"{profiled:,}; SGLang uses the smaller"
            )
    elif cap is not None:
        value, source = cap
        notes.append(
            f"{role}: pool taken from --max-total-tokens, assuming the GPU fits that many tokens "
            f"(if it fits fewer, SGLang uses fewer; pass {option} to check that case)"
        )
    else:
        assert profiled is not None
        value, source = profiled, option
    aligned = value // page * page
    if aligned != value:
        notes.append(
            f"{role}: pool {value:,} is not a multiple of page size {page}; SGLang rounds it "
            f"down to {aligned:,}"
        )
    if aligned <= 0:
        raise ConfigInputError(
            source, f"the {role} pool holds no whole page of {page} tokens", str(value)
        )
    return Setting(aligned, source)


def _resolve_vllm_pool(
    role: Role,
    blocks: tuple[int, str] | None,
    given: tuple[int, str] | None,
    block: int,
    notes: list[str],
) -> Setting[int]:
    option = given[1] if given is not None else _pool_option(role)
    profiled = given[0] if given is not None else None
    if blocks is not None and profiled is not None:
        raise ConfigInputError(
            option,
            f"both --num-gpu-blocks-override ({blocks[0]:,}) on the {role} command line and "
            f"{option} ({profiled:,}) were given; vLLM uses the override, so drop one",
        )
    if blocks is not None:
        # One block is vLLM's null block and never holds a request's KV.
        tokens = (blocks[0] - 1) * block
        notes.append(
            f"{role}: pool = (--num-gpu-blocks-override {blocks[0]:,} - 1 null block) × "
            f"block size {block} = {tokens:,} tokens"
        )
        if tokens <= 0:
            raise ConfigInputError(
                blocks[1], "leaves no usable block after the null block", str(blocks[0])
            )
        return Setting(tokens, f"{blocks[1]} × --block-size")
    if profiled is None:
        raise ConfigInputError(
            option,
            f"cannot determine the {role} KV pool size: the {role} command line has no "
            "--num-gpu-blocks-override, and vLLM sizes the pool from GPU memory at startup "
            "(--gpu-memory-utilization). Add --num-gpu-blocks-override to the command, or pass "
            f"the size the server logs at startup (GPU KV cache size: N tokens) as {option}",
        )
    return Setting(profiled, option)


def _setting(values: Mapping[str, tuple[Any, str]], key: str) -> Setting[Any] | None:
    if key not in values:
        return None
    value, source = values[key]
    return Setting(value, source)


def _finish_role(
    role: Role,
    engine: Engine,
    values: dict[str, tuple[Any, str]],
    *,
    profiled_pool: int | None,
    model_context_length: int | None,
    notes: list[str],
) -> RoleConfig:
    """Common to both readers: `values` maps RoleConfig fields (plus max_total_tokens /
    num_gpu_blocks) to (value, where it came from)."""
    kwargs: dict[str, Any] = {}
    for key in _ROLE_FIELDS - {"context_length", "pool_tokens", "page_size"}:
        s = _setting(values, key)
        if s is not None:
            kwargs[key] = s
    default_page = SGLANG_DEFAULT_PAGE_SIZE if engine is Engine.SGLANG else VLLM_DEFAULT_BLOCK_SIZE
    page = _setting(values, "page_size") or Setting(default_page, "default")
    # The real pool size, if known: from the TOML file, or the checker's --<role>-pool-tokens.
    given = values.get("pool_tokens")
    if given is None and profiled_pool is not None:
        given = (profiled_pool, _pool_option(role))
    if engine is Engine.SGLANG:
        pool = _resolve_sglang_pool(role, values.get("max_total_tokens"), given, page.value, notes)
    else:
        pool = _resolve_vllm_pool(role, values.get("num_gpu_blocks"), given, page.value, notes)
    context = _setting(values, "context_length")
    flag = engine.context_flag
    if context is None:
        if model_context_length is None:
            raise ConfigInputError(
                flag,
                f"missing from the {role} command line, and the model's own window is unknown "
                "to the checker; add it, or pass --model-context-length N",
            )
        context = Setting(model_context_length, "--model-context-length")
    if engine is Engine.VLLM and context.value == -1:
        # vLLM's auto-fit picks the largest window the pool can hold.
        notes.append(f"{role}: --max-model-len -1 auto-fits to the pool: {pool.value:,} tokens")
        context = Setting(pool.value, f"{context.source} -1 (auto-fit)")
    return RoleConfig(
        role=role,
        engine=engine,
        context_length=context,
        pool_tokens=pool,
        page_size=page,
        notes=tuple(notes),
        **kwargs,
    )


def _version(engine: Engine, given: str | None, where: str) -> str:
    versions = SGLANG_VERSIONS if engine is Engine.SGLANG else VLLM_VERSIONS
    if given is None:
        return DEFAULT_SGLANG_VERSION if engine is Engine.SGLANG else DEFAULT_VLLM_VERSION
    if given not in versions:
        raise ConfigInputError(
            where, f"{engine.label} versions modelled: {', '.join(versions)}", given
        )
    return given


def _deployment(
    engine: Engine,
    version: str,
    prefill: RoleConfig,
    decode: RoleConfig,
    router_window: Setting[int] | None,
    queueing: Setting[float] | None,
    model_context_length: int | None = None,
) -> Deployment:
    if router_window is None:
        router_window = Setting(
            max(prefill.context_length.value, decode.context_length.value),
            "default (the larger role window)",
        )
    return Deployment(
        engine=engine,
        version=version,
        prefill=prefill,
        decode=decode,
        router_window=router_window,
        max_decode_queueing_s=queueing or Setting(0.0, "default"),
        model_context_length=Setting(model_context_length, "--model-context-length")
        if model_context_length is not None
        else Setting(None, "default"),
    )


def from_commands(prefill_cmd: str, decode_cmd: str, opts: CheckerOptions) -> Deployment:
    # `--env KEY=VALUE` is both roles' environment; `--env prefill:KEY=VALUE` (or decode:) is one
    # role's, like `--prefill-env KEY=VALUE`.
    scoped = {r: [e.split(":", 1)[1] for e in opts.env if e.startswith(f"{r}:")] for r in Role}
    both_env = parse_env_assignments(
        [e for e in opts.env if not e.startswith(("prefill:", "decode:"))], "--env"
    )
    if opts.router_window is not None and opts.router_window < 2:
        raise ConfigInputError(
            "--context-window",
            "must be at least 2 (a window of 1 admits no prompt)",
            str(opts.router_window),
        )
    roles: dict[Role, RoleConfig] = {}
    engines: dict[Role, Engine] = {}
    for role, text in ((Role.PREFILL, prefill_cmd), (Role.DECODE, decode_cmd)):
        where = f"--{role}"
        cmd = parse_command(text, where)
        engines[role] = cmd.engine
        scoped_env = parse_env_assignments(scoped[role], f"--env {role}:")
        own = parse_env_assignments(
            opts.prefill_env if role is Role.PREFILL else opts.decode_env, f"--{role}-env"
        )
        for key in scoped_env.keys() & own.keys():
            if scoped_env[key] != own[key]:
                raise ConfigInputError(
                    f"--{role}-env {key}",
                    f"contradicts --env {role}:{key}={scoped_env[key]}",
                    own[key],
                )
        origin = {
            **{k: f"{role} command line" for k in cmd.env},
            **{k: "--env" for k in both_env},
            **{k: f"--env {role}:" for k in scoped_env},
            **{k: f"--{role}-env" for k in own},
        }
        own = {**scoped_env, **own}
        for key in both_env.keys() & own.keys():
            if both_env[key] != own[key]:
                raise ConfigInputError(
                    f"--{role}-env {key}",
                    f"contradicts --env {key}={both_env[key]}",
                    own[key],
                )
        env = {**cmd.env, **both_env, **own}
        values = dict(cmd.values)
        values.update(apply_env(cmd.engine, env, origin))
        if cmd.engine is Engine.SGLANG:
            mode = values.pop("mode", None)
            if mode is None:
                raise ConfigInputError(
                    "--disaggregation-mode",
                    f"missing from the {role} command line; a {role} server is launched with "
                    f"--disaggregation-mode {role}",
                )
            if mode[0] != role.value:
                raise ConfigInputError(
                    "--disaggregation-mode",
                    f"the {where} command line launches a {mode[0]} server; expected {role}",
                    mode[0],
                )
        else:
            raw = values.pop("kv_transfer_config", None)
            if raw is None:
                raise ConfigInputError(
                    "--kv-transfer-config",
                    f"missing from the {role} command line; without it vLLM serves without "
                    "disaggregation",
                )
            values.update(parse_kv_transfer_config(raw[0]))
        roles[role] = _finish_role(
            role,
            cmd.engine,
            values,
            profiled_pool=opts.prefill_pool_tokens
            if role is Role.PREFILL
            else opts.decode_pool_tokens,
            model_context_length=opts.model_context_length,
            notes=[],
        )
    if engines[Role.PREFILL] is not engines[Role.DECODE]:
        raise ConfigInputError(
            "--decode",
            f"prefill runs {engines[Role.PREFILL].label} but decode runs "
            f"{engines[Role.DECODE].label}; the two cannot hand KV to each other",
        )
    engine = engines[Role.PREFILL]
    if engine is Engine.VLLM and opts.sglang_version is not None:
        raise ConfigInputError(
            "--sglang-version", "given, but both servers run vLLM", opts.sglang_version
        )
    version = _version(engine, opts.sglang_version, "--sglang-version")
    return _deployment(
        engine,
        version,
        roles[Role.PREFILL],
        roles[Role.DECODE],
        Setting(opts.router_window, "--context-window") if opts.router_window is not None else None,
        Setting(opts.max_decode_queueing_s, "--max-decode-queueing")
        if opts.max_decode_queueing_s is not None
        else None,
        opts.model_context_length,
    )


# The neutral file: keys, their types, and the RoleConfig field each sets.
_TOML_ROLE_KEYS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "context_length": (int, "context_length"),
    "pool_tokens": (int, "pool_tokens"),
    "page_size": (int, "page_size"),
    "allow_auto_truncate": (bool, "allow_auto_truncate"),
    "chunked_prefill_size": (int, "chunked_prefill_size"),
    "max_prefill_tokens": (int, "max_prefill_tokens"),
    "kv_cache_dtype": (str, "kv_cache_dtype"),
    "transfer_backend": (str, "transfer_backend"),
    "allocation_policy": (str, "allocation_policy"),
    "kv_checksum": (bool, "kv_checksum"),
    "dp_size": (int, "dp_size"),
    "load_balance_method": (str, "load_balance_method"),
    "speculative_algorithm": (str, "speculative_algorithm"),
    "model": (str, "model"),
    "bootstrap_timeout_s": ((int, float), "bootstrap_timeout_s"),
    "waiting_timeout_s": ((int, float), "waiting_timeout_s"),
    "deferred_release": (bool, "deferred_release"),
    "deferred_release_timeout_s": ((int, float), "deferred_release_timeout_s"),
    "kv_connector": (str, "kv_connector"),
    "kv_role": (str, "kv_role"),
    "kv_load_failure_policy": (str, "kv_load_failure_policy"),
    "enforce_handshake_compat": (bool, "enforce_handshake_compat"),
    "kv_lease_duration_s": ((int, float), "kv_lease_duration_s"),
    "max_num_batched_tokens": (int, "max_num_batched_tokens"),
    "enable_chunked_prefill": (bool, "enable_chunked_prefill"),
}
_TOML_DEPLOYMENT_KEYS = {"engine", "version", "context_window", "max_decode_queueing_s"}
_TOML_CHOICES = {
    "transfer_backend": SGLANG_BACKENDS,
    "allocation_policy": SGLANG_POLICIES,
    "kv_load_failure_policy": ("recompute", "fail"),
}
_POSITIVE = {
    "context_length",
    "pool_tokens",
    "page_size",
    "max_prefill_tokens",
    "dp_size",
    "max_num_batched_tokens",
}


def _toml_value(section: str, key: str, value: object) -> Any:
    where = f"[{section}] {key}"
    if key not in _TOML_ROLE_KEYS:
        known = ", ".join(sorted(_TOML_ROLE_KEYS))
        raise ConfigInputError(where, f"unknown key (known: {known})")
    expected, _ = _TOML_ROLE_KEYS[key]
    # bool is an int in Python; a TOML `true` is never a valid count.
    if isinstance(value, bool) and expected is not bool:
        raise ConfigInputError(where, "expected a number, not true/false", repr(value))
    if not isinstance(value, expected):
        names = expected.__name__ if isinstance(expected, type) else "number"
        raise ConfigInputError(where, f"expected {names}", repr(value))
    if key in _POSITIVE and isinstance(value, int) and value < 1:
        raise ConfigInputError(where, "must be at least 1", repr(value))
    if key == "chunked_prefill_size" and isinstance(value, int) and value != -1 and value < 1:
        raise ConfigInputError(where, "must be at least 1 (or -1)", repr(value))
    if isinstance(value, float | int) and not isinstance(value, bool) and key.endswith("_s"):
        if value < 0:
            raise ConfigInputError(where, "must be ≥ 0 seconds", repr(value))
        return float(value)
    if key in _TOML_CHOICES and value not in _TOML_CHOICES[key]:
        raise ConfigInputError(
            where, f"must be one of {', '.join(_TOML_CHOICES[key])}", repr(value)
        )
    return value


def from_toml(path: Path) -> Deployment:
    """The neutral format (docs/check-config.md): [deployment] plus [prefill] and [decode] tables.
    Role keys under [deployment] apply to both roles unless a role table sets them."""
    where = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigInputError("--config", f"cannot read the file: {exc.strerror}", where) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigInputError("--config", f"not valid TOML: {exc}", where) from None
    for section in data:
        if section not in ("deployment", "prefill", "decode"):
            raise ConfigInputError(
                f"[{section}]", "unknown table (expected [deployment], [prefill], [decode])"
            )
    for section in ("deployment", "prefill", "decode"):
        if not isinstance(data.get(section), dict):
            raise ConfigInputError(f"[{section}]", f"missing table in {where}")
    dep: dict[str, Any] = data["deployment"]
    engine_raw = dep.get("engine")
    if engine_raw not in ("sglang", "vllm"):
        raise ConfigInputError("[deployment] engine", "must be sglang or vllm", repr(engine_raw))
    engine = Engine(engine_raw)
    version_raw = dep.get("version")
    if version_raw is not None and not isinstance(version_raw, str):
        raise ConfigInputError("[deployment] version", "expected a string", repr(version_raw))
    version = _version(engine, version_raw, "[deployment] version")
    shared: dict[str, tuple[Any, str]] = {}
    for key, value in dep.items():
        if key in _TOML_DEPLOYMENT_KEYS:
            continue
        shared[_TOML_ROLE_KEYS.get(key, (object, key))[1]] = (
            _toml_value("deployment", key, value),
            f"[deployment] {key}",
        )
    roles: dict[Role, RoleConfig] = {}
    for role in (Role.PREFILL, Role.DECODE):
        values = dict(shared)
        table: dict[str, Any] = data[role.value]
        for key, value in table.items():
            values[_TOML_ROLE_KEYS.get(key, (object, key))[1]] = (
                _toml_value(role.value, key, value),
                f"[{role}] {key}",
            )
        if "pool_tokens" not in values:
            raise ConfigInputError(
                f"[{role}] pool_tokens",
                f"missing: the checker cannot determine the {role} KV pool size without it",
            )
        if "context_length" not in values:
            raise ConfigInputError(
                f"[{role}] context_length", "missing (or set it under [deployment])"
            )
        roles[role] = _finish_role(
            role, engine, values, profiled_pool=None, model_context_length=None, notes=[]
        )
    window: Setting[int] | None = None
    if "context_window" in dep:
        cw = dep["context_window"]
        if isinstance(cw, bool) or not isinstance(cw, int) or cw < 2:
            raise ConfigInputError(
                "[deployment] context_window", "expected an integer ≥ 2", repr(cw)
            )
        window = Setting(cw, "[deployment] context_window")
    queueing: Setting[float] | None = None
    if "max_decode_queueing_s" in dep:
        q = dep["max_decode_queueing_s"]
        if isinstance(q, bool) or not isinstance(q, int | float) or q < 0:
            raise ConfigInputError(
                "[deployment] max_decode_queueing_s", "expected seconds ≥ 0", repr(q)
            )
        queueing = Setting(float(q), "[deployment] max_decode_queueing_s")
    return _deployment(engine, version, roles[Role.PREFILL], roles[Role.DECODE], window, queueing)
