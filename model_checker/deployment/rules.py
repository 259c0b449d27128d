"""The rules that do not depend on a prompt's length: C3–C7 of engines.md §5.1 and vLLM's §5.2.

These compare settings across the two roles (the bootstrap handshake checks some of them, but not
capacity, truncation, checksums or timeouts) and against known-bad values. They need no solver:
each is one comparison, and stating it plainly is the clearest proof. The length-dependent rules
(C1, C2 and the length effects of C3) are decided by Z3 in `decision.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

from kvhandoff.model_checker.deployment.engines import RoleLimits
from kvhandoff.model_checker.deployment.findings import Finding, Severity
from kvhandoff.model_checker.deployment.model import (
    MOONCAKE_MAX_OP_TIME_S,
    Deployment,
    Engine,
    Role,
    Setting,
)

T = TypeVar("T")

BOTH = (Role.PREFILL, Role.DECODE)


def name(setting: Setting[T], flag: str) -> str:
    """The flag to change: where the value came from, or the engine flag if it was a default."""
    return flag if setting.is_default else setting.source


def _fmt(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int):
        return f"{value:,}"
    return "unset" if value is None else str(value)


def _mismatch(
    rule: str,
    code: str,
    d: Deployment,
    pick: str,
    flag: str,
    why: str,
    fix: str | None = None,
) -> Iterator[Finding]:
    p: Setting[object] = getattr(d.prefill, pick)
    q: Setting[object] = getattr(d.decode, pick)
    if p.value == q.value:
        return
    yield Finding(
        rule=rule,
        code=code,
        severity=Severity.ERROR,
        title=f"{flag} differs: prefill {_fmt(p.value)}, decode {_fmt(q.value)}",
        detail=why,
        fix=fix or f"set {flag} to the same value on both roles",
        # Name what the user set; a side left at its default is changed through the same flag.
        flags=tuple(dict.fromkeys(s.source for s in (p, q) if not s.is_default)) or (flag,),
        roles=BOTH,
    )


def sglang_rules(d: Deployment, limits: dict[Role, RoleLimits]) -> Iterator[Finding]:
    p, q = d.prefill, d.decode
    for cfg in (p, q):
        lim = limits[cfg.role]
        assert lim.scheduler_limit is not None
        if lim.scheduler_limit <= 0:
            yield Finding(
                rule="C1",
                code=f"{cfg.role}-pool-too-small-to-start",
                severity=Severity.ERROR,
                title=f"{cfg.role} will not start: max_req_input_len is {lim.scheduler_limit}",
                detail=(
                    f"min(context {lim.context_length:,} - 1, pool {lim.pool_tokens:,} - 1) - 5 "
                    f"= {lim.scheduler_limit}; SGLang asserts it is positive "
                    '("Memory pool size is too small")'
                ),
                fix="give the server a larger KV pool",
                flags=(name(cfg.pool_tokens, "--max-total-tokens"),),
                roles=(cfg.role,),
            )
    model_window = d.model_context_length.value
    for cfg in (p, q):
        ctx = cfg.context_length
        if (
            model_window is not None
            and not ctx.is_default
            and ctx.source != "--model-context-length"
            and ctx.value > model_window
            and not cfg.allow_longer_context.value
        ):
            yield Finding(
                rule="C1",
                code=f"{cfg.role}-context-beyond-model",
                severity=Severity.ERROR,
                title=(
                    f"{cfg.role} will not start: --context-length {ctx.value:,} exceeds the "
                    f"model's window {model_window:,}"
                ),
                detail=(
                    "SGLang refuses a --context-length above the model's own window unless "
                    "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set (and then the model runs "
                    "past the positions it was trained on)"
                ),
                fix=f"lower --context-length to ≤ {model_window:,} on {cfg.role}",
                flags=(ctx.source,),
                roles=(cfg.role,),
            )
    # C3: truncation on one side only cuts the prompt on that side; the other side's page count
    # no longer matches (the length ranges are in decision.py; this names the flag once).
    yield from _mismatch(
        "C3",
        "auto-truncate-asymmetric",
        d,
        "allow_auto_truncate",
        "--allow-auto-truncate",
        "a prompt over max_req_input_len is truncated on one role and whole (or refused) on the "
        "other, so prefill's page count and decode's differ (mutant M6)",
        "set --allow-auto-truncate on both roles or on neither (safest: neither, so over-long "
        "prompts get an error)",
    )
    # C4: settings the two roles must agree on.
    yield from _mismatch(
        "C4",
        "page-size-mismatch",
        d,
        "page_size",
        "--page-size",
        "pages are the transfer unit: the bootstrap handshake rejects the pair (RuntimeError in "
        "try_ensure_parallel_info) and page counts computed on one side are wrong on the other",
    )
    yield from _mismatch(
        "C4",
        "kv-cache-dtype-mismatch",
        d,
        "kv_cache_dtype",
        "--kv-cache-dtype",
        "KV bytes written by prefill are read by decode as another dtype; the handshake rejects it",
    )
    yield from _mismatch(
        "C4",
        "allocation-policy-mismatch",
        d,
        "allocation_policy",
        "--disaggregation-decode-allocation-policy",
        "early and prefill_complete are different protocols; decode's receiver init refuses the pair",
    )
    yield from _mismatch(
        "C4",
        "kv-checksum-asymmetric",
        d,
        "kv_checksum",
        "--disaggregation-enable-kv-checksum",
        "with the checksum on one side only, decode admits transfers unverified (mutant M5)",
        "set --disaggregation-enable-kv-checksum on both roles",
    )
    if not p.kv_checksum.value and not q.kv_checksum.value:
        yield Finding(
            rule="C4",
            code="kv-checksum-off",
            severity=Severity.WARNING,
            title="KV checksum is off on both roles",
            detail=(
                "decode cannot detect pages that a transfer did not cover; it is the only data "
                "check SGLang has (mutant M5)"
            ),
            fix="add --disaggregation-enable-kv-checksum to both command lines",
            flags=("--disaggregation-enable-kv-checksum",),
            roles=BOTH,
        )
    yield from _mismatch(
        "C4",
        "model-mismatch",
        d,
        "model",
        "--model-path",
        "prefill's KV is only meaningful to decode for the same model and revision",
    )
    yield from _mismatch(
        "C4",
        "speculative-mismatch",
        d,
        "speculative_algorithm",
        "--speculative-algorithm",
        "speculative settings change the aux/metadata rows both sides exchange",
    )
    if "follow_bootstrap_room" in (p.load_balance_method.value, q.load_balance_method.value):
        yield from _mismatch(
            "C4",
            "dp-size-mismatch",
            d,
            "dp_size",
            "--dp-size",
            "with follow_bootstrap_room the DP rank is room % dp_size on each side; different "
            "sizes send a room's KV to a rank that does not hold it",
        )
        yield from _mismatch(
            "C4",
            "load-balance-mismatch",
            d,
            "load_balance_method",
            "--load-balance-method",
            "room → DP rank mapping must agree on both sides",
        )
    # C5: the fake backend moves no KV at all.
    for cfg in (p, q):
        if cfg.transfer_backend.value == "fake":
            yield Finding(
                rule="C5",
                code=f"{cfg.role}-fake-backend",
                severity=Severity.ERROR,
                title=f"{cfg.role} uses the fake transfer backend",
                detail=(
                    "--disaggregation-transfer-backend fake moves no KV: decode generates from "
                    "whatever its pages held before (every page stale)"
                ),
                fix="use mooncake, nixl, mori or ascend on both roles",
                flags=(name(cfg.transfer_backend, "--disaggregation-transfer-backend"),),
                roles=(cfg.role,),
            )
    yield from _mismatch(
        "C5",
        "transfer-backend-mismatch",
        d,
        "transfer_backend",
        "--disaggregation-transfer-backend",
        "the two sides must speak the same transfer engine",
    )
    yield from _timeout_rules(d)
    # C7: chunking and prefill-batch sizes against the pool.
    for cfg in (p, q):
        pool = limits[cfg.role].pool_tokens
        chunk = cfg.chunked_prefill_size.value
        if chunk is not None and chunk > pool:
            yield Finding(
                rule="C7",
                code=f"{cfg.role}-chunk-larger-than-pool",
                severity=Severity.ERROR,
                title=f"{cfg.role} --chunked-prefill-size {chunk:,} exceeds its pool {pool:,}",
                detail="one prefill chunk must fit the KV pool (it is also the staging grid)",
                fix=f"set --chunked-prefill-size ≤ {pool:,} (or -1 to disable chunking)",
                flags=(name(cfg.chunked_prefill_size, "--chunked-prefill-size"),),
                roles=(cfg.role,),
            )
        batch = cfg.max_prefill_tokens.value
        if batch is not None and batch > pool:
            yield Finding(
                rule="C7",
                code=f"{cfg.role}-prefill-batch-larger-than-pool",
                severity=Severity.WARNING,
                title=f"{cfg.role} --max-prefill-tokens {batch:,} exceeds its pool {pool:,}",
                detail="a prefill batch that large can never be scheduled",
                fix=f"set --max-prefill-tokens ≤ {pool:,}",
                flags=(name(cfg.max_prefill_tokens, "--max-prefill-tokens"),),
                roles=(cfg.role,),
            )


def _timeout_rules(d: Deployment) -> Iterator[Finding]:
    """C6: a request refused or lost on one side must not hold the other side's pages forever, and
    pages must not be freed while writes can still land in them."""
    p, q = d.prefill, d.decode
    boot, wait, queue = p.bootstrap_timeout_s, q.waiting_timeout_s, d.max_decode_queueing_s
    if boot.value < wait.value + queue.value:
        yield Finding(
            rule="C6",
            code="bootstrap-timeout-below-waiting-timeout",
            severity=Severity.ERROR,
            title=(
                f"prefill bootstrap timeout {_fmt(boot.value)} s < decode waiting timeout "
                f"{_fmt(wait.value)} s + decode queueing {_fmt(queue.value)} s"
            ),
            detail=(
                "prefill gives up on a room while decode still waits for it (or has not yet "
                "allocated): decode holds its pages until its own timeout and the client hangs "
                "(sglang #9726)"
            ),
            fix=(
                f"set SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT ≥ "
                f"{_fmt(wait.value + queue.value)} on prefill, or lower "
                "SGLANG_DISAGGREGATION_WAITING_TIMEOUT on decode"
            ),
            flags=(
                name(boot, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"),
                name(wait, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"),
            ),
            roles=BOTH,
        )
    if not q.deferred_release.value:
        yield Finding(
            rule="C6",
            code="deferred-release-off",
            severity=Severity.ERROR,
            title="decode frees aborted requests' pages without waiting for prefill's writes",
            detail=(
                "with deferred release off, a page freed on abort can be reallocated while an RDMA "
                "write of the old request is in flight: the late write lands in another request's "
                "pages (mutant M7, sglang #24527)"
            ),
            fix="set SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=true on decode",
            flags=(name(q.deferred_release, "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"),),
            roles=(Role.DECODE,),
        )
    elif (
        q.transfer_backend.value == "mooncake"
        and q.deferred_release_timeout_s.value < MOONCAKE_MAX_OP_TIME_S
    ):
        yield Finding(
            rule="C6",
            code="deferred-release-timeout-too-short",
            severity=Severity.ERROR,
            title=(
                f"decode's deferred-release timeout {_fmt(q.deferred_release_timeout_s.value)} s "
                f"is shorter than a Mooncake transfer ({_fmt(MOONCAKE_MAX_OP_TIME_S)} s)"
            ),
            detail=(
                "the timeout frees pages without a drain ACK, but a Mooncake write cannot be "
                "cancelled and can land up to ~30 s later (mutant M8, sglang PR #38961)"
            ),
            fix=(
                "set SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT ≥ "
                f"{_fmt(MOONCAKE_MAX_OP_TIME_S)} on decode"
            ),
            flags=(
                name(
                    q.deferred_release_timeout_s,
                    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT",
                ),
            ),
            roles=(Role.DECODE,),
        )


def vllm_rules(d: Deployment, limits: dict[Role, RoleLimits]) -> Iterator[Finding]:
    p, q = d.prefill, d.decode
    for cfg in (p, q):
        lim = limits[cfg.role]
        if lim.pool_tokens < lim.context_length:
            yield Finding(
                rule="C1",
                code=f"{cfg.role}-startup-check-fails",
                severity=Severity.ERROR,
                title=(
                    f"{cfg.role} will not start: pool {lim.pool_tokens:,} tokens < "
                    f"--max-model-len {lim.context_length:,}"
                ),
                detail=(
                    "vLLM's startup check (check_enough_kv_cache_memory) raises ValueError when "
                    "the pool cannot hold one max_model_len request"
                ),
                fix=(
                    f"lower --max-model-len to ≤ {lim.pool_tokens:,} or give the pool more "
                    "blocks (--num-gpu-blocks-override, --gpu-memory-utilization)"
                ),
                flags=(name(cfg.context_length, "--max-model-len"), cfg.pool_tokens.source),
                roles=(cfg.role,),
            )
        if (
            not cfg.enable_chunked_prefill.value
            and cfg.max_num_batched_tokens.value is not None
            and cfg.max_num_batched_tokens.value < lim.context_length
        ):
            yield Finding(
                rule="C7",
                code=f"{cfg.role}-batched-tokens-below-max-model-len",
                severity=Severity.ERROR,
                title=(
                    f"{cfg.role} will not start: --max-num-batched-tokens "
                    f"{cfg.max_num_batched_tokens.value:,} < --max-model-len "
                    f"{lim.context_length:,} with chunked prefill off"
                ),
                detail="config/scheduler.py::verify_max_model_len rejects it",
                fix="enable chunked prefill or raise --max-num-batched-tokens",
                flags=(name(cfg.max_num_batched_tokens, "--max-num-batched-tokens"),),
                roles=(cfg.role,),
            )
    yield from _mismatch(
        "C4",
        "block-size-mismatch",
        d,
        "page_size",
        "--block-size",
        "decode reads prefill's blocks by id; the NIXL handshake validates block size",
    )
    yield from _mismatch(
        "C4",
        "model-mismatch",
        d,
        "model",
        "model (vllm serve MODEL)",
        "prefill's KV is only meaningful to decode for the same model and revision",
    )
    yield from _mismatch(
        "C4",
        "kv-connector-mismatch",
        d,
        "kv_connector",
        "--kv-transfer-config kv_connector",
        "both sides must use the same KV connector",
    )
    allowed = {Role.PREFILL: ("kv_producer", "kv_both"), Role.DECODE: ("kv_consumer", "kv_both")}
    for cfg in (p, q):
        if cfg.kv_role.value not in allowed[cfg.role]:
            yield Finding(
                rule="C4",
                code=f"{cfg.role}-kv-role-wrong",
                severity=Severity.ERROR,
                title=f"{cfg.role} has kv_role {_fmt(cfg.kv_role.value)}",
                detail=f"a {cfg.role} server needs kv_role {' or '.join(allowed[cfg.role])}",
                fix=f"set kv_role to {allowed[cfg.role][0]} in --kv-transfer-config",
                flags=(name(cfg.kv_role, "--kv-transfer-config kv_role"),),
                roles=(cfg.role,),
            )
    if q.kv_load_failure_policy.value != "fail":
        yield Finding(
            rule="V",
            code="decode-load-failure-recompute",
            severity=Severity.ERROR,
            title=f"decode kv_load_failure_policy is {q.kv_load_failure_policy.value}",
            detail=(
                "with recompute, a failed or partial KV load is repaired locally and has returned "
                "wrong output with HTTP 200 (vLLM #49250, mutant M14), and a read still in flight "
                "can land on a recomputed block (the spec's `recompute_without_fence`); fail "
                "closes the request"
            ),
            fix='set "kv_load_failure_policy": "fail" in decode\'s --kv-transfer-config',
            flags=(name(q.kv_load_failure_policy, "--kv-transfer-config kv_load_failure_policy"),),
            roles=(Role.DECODE,),
        )
    for cfg in (p, q):
        if not cfg.enforce_handshake_compat.value:
            yield Finding(
                rule="V",
                code=f"{cfg.role}-handshake-compat-off",
                severity=Severity.WARNING,
                title=f"{cfg.role} disables the NIXL compatibility-hash check",
                detail="mismatched model, dtype or layout would then transfer without error",
                fix="remove enforce_handshake_compat=false from kv_connector_extra_config",
                flags=(name(cfg.enforce_handshake_compat, "enforce_handshake_compat"),),
                roles=(cfg.role,),
            )
    lease, queue = p.kv_lease_duration_s, d.max_decode_queueing_s
    if lease.value < queue.value:
        yield Finding(
            rule="C6",
            code="lease-shorter-than-decode-queueing",
            severity=Severity.ERROR,
            title=(
                f"prefill's KV lease {_fmt(lease.value)} s < decode queueing {_fmt(queue.value)} s"
            ),
            detail=(
                "prefill frees pinned blocks at lease expiry; a decode that reads them later gets "
                "another prompt's KV (vLLM #21570, mutant M13)"
            ),
            fix=f"set kv_lease_duration ≥ {_fmt(queue.value)} in prefill's kv_connector_extra_config",
            flags=(name(lease, "kv_connector_extra_config.kv_lease_duration"),),
            roles=(Role.PREFILL,),
        )


def static_rules(d: Deployment, limits: dict[Role, RoleLimits]) -> list[Finding]:
    if d.engine is Engine.SGLANG:
        return list(sglang_rules(d, limits))
    return list(vllm_rules(d, limits))


__all__ = ["name", "static_rules"]
