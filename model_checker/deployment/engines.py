"""What each engine does with a prompt of L tokens, derived from its flags (engines.md §5).

SGLang (per role; `pool` is `max_total_num_tokens`, already page-aligned):

    max_req_len       = min(context_len - 1, pool - 1)          tp_worker.get_worker_info
    max_req_input_len = max_req_len - 5
    tokenizer  : L >= context_len          -> HTTP 400           tokenizer_manager._validate_one_request
    scheduler  : L >= max_req_input_len    -> placeholder abort, or truncate to max_req_input_len
                                              with --allow-auto-truncate  (managers/utils.py)
    0.5.11     : the one-token placeholder passes bootstrap (it only checks `len > pool`) and is
                 handed off like a real prompt
    0.5.23     : the placeholder is retired at the door (`is_unadmitted_reject`)
    bootstrap  : prefill aborts a prompt longer than its capacity (0.5.11 `len > pool`; 0.5.23
                 `max_bootstrap_input_len`, modelled as the pool: the scheduler limit is always
                 tighter, so the difference cannot show)
    prealloc   : decode aborts a prompt longer than its pool (_check_if_req_exceed_kv_capacity)

vLLM (per role): the request check rejects `L >= max_model_len` with HTTP 400 (`> max_model_len`,
or `== max_model_len` for generation); there is no placeholder. The startup check refuses to start
a server whose pool cannot hold one `max_model_len` request.

The handling functions below build Z3 terms. Their parameters may be Python ints (a concrete
deployment) or Z3 Int constants (tests prove properties of the rules for every deployment).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeAlias

import z3

from kvhandoff.model_checker.deployment.model import Engine, Role, RoleConfig

# Tokens SGLang keeps back below max_req_len for the output (tp_worker: max_req_len - 5).
SGLANG_OUTPUT_RESERVE = 5


class Kind(enum.IntEnum):
    """What one role does with a prompt. The first three stop the request on that role without
    touching KV pages; the last three take part in the handoff."""

    TOKENIZER_REJECT = 1  # HTTP 400 before the scheduler sees it
    RETIRED = 2  # SGLang 0.5.23: the scheduler's placeholder is retired at the door
    CAPACITY_ABORT = 3  # bootstrap (prefill) or preallocation (decode) capacity check
    PLACEHOLDER = 4  # SGLang 0.5.11: prompt swapped for one token, request carries on
    TRUNCATED = 5  # --allow-auto-truncate: prompt cut to max_req_input_len
    FULL = 6  # the whole prompt

    @property
    def proceeds(self) -> bool:
        return self >= Kind.PLACEHOLDER


KIND_WORDS = {
    Kind.TOKENIZER_REJECT: "rejects at the tokenizer (HTTP 400)",
    Kind.RETIRED: "retires the placeholder at the door",
    Kind.CAPACITY_ABORT: "aborts at its capacity check",
    Kind.PLACEHOLDER: "swaps the prompt for a one-token placeholder",
    Kind.TRUNCATED: "truncates the prompt",
    Kind.FULL: "takes the whole prompt",
}

IntLike: TypeAlias = int | z3.ArithRef
BoolLike: TypeAlias = bool | z3.BoolRef


def _int(x: IntLike) -> z3.ArithRef:
    return z3.IntVal(x) if isinstance(x, int) else x


def _bool(x: BoolLike) -> z3.BoolRef:
    return z3.BoolVal(x) if isinstance(x, bool) else x


@dataclass(frozen=True)
class RoleLimits:
    """One role's admission limits as numbers (for the report) and as rules (for Z3)."""

    role: Role
    engine: Engine
    context_length: int
    pool_tokens: int
    # The tokenizer (SGLang) or request check (vLLM) rejects L >= tokenizer_limit.
    tokenizer_limit: int
    # SGLang's scheduler rejects or truncates L >= scheduler_limit (max_req_input_len). vLLM has
    # no such tier: None.
    scheduler_limit: int | None
    # Bootstrap (prefill) / preallocation (decode) abort a prompt whose effective length is larger.
    capacity_limit: int
    allow_auto_truncate: bool
    # SGLang 0.5.11: True (the placeholder is handed off); 0.5.23: False (retired at the door).
    placeholder_proceeds: bool

    @property
    def largest_full_prompt(self) -> int:
        """The longest prompt this role serves whole (0 if none): below every limit."""
        limit = self.tokenizer_limit - 1
        if self.scheduler_limit is not None:
            limit = min(limit, self.scheduler_limit - 1)
        return max(0, min(limit, self.capacity_limit))

    def handling(self, length: IntLike) -> tuple[z3.ArithRef, z3.ArithRef]:
        """(kind, effective length) of a prompt of `length` tokens, as Z3 terms."""
        if self.engine is Engine.VLLM:
            return vllm_handling(length, self.tokenizer_limit)
        assert self.scheduler_limit is not None
        return sglang_handling(
            length,
            context_length=self.context_length,
            scheduler_limit=self.scheduler_limit,
            capacity=self.capacity_limit,
            allow_auto_truncate=self.allow_auto_truncate,
            placeholder_proceeds=self.placeholder_proceeds,
        )


def sglang_scheduler_limit(context_length: IntLike, pool_tokens: IntLike) -> IntLike:
    """max_req_input_len = min(context_len - 1, pool - 1) - 5."""
    if isinstance(context_length, int) and isinstance(pool_tokens, int):
        return min(context_length - 1, pool_tokens - 1) - SGLANG_OUTPUT_RESERVE
    c, p = context_length - 1, pool_tokens - 1
    return z3.If(c <= p, c, p) - SGLANG_OUTPUT_RESERVE


def _k(kind: Kind) -> z3.ArithRef:
    return z3.IntVal(int(kind))


def _gate(
    kind: z3.ArithRef, eff: z3.ArithRef, capacity: IntLike
) -> tuple[z3.ArithRef, z3.ArithRef]:
    """The bootstrap / preallocation capacity check, applied to whatever the scheduler let on."""
    over = z3.And(kind >= int(Kind.PLACEHOLDER), eff > capacity)
    return (
        z3.If(over, _k(Kind.CAPACITY_ABORT), kind),
        z3.If(over, z3.IntVal(0), eff),
    )


def sglang_handling(
    length: IntLike,
    *,
    context_length: IntLike,
    scheduler_limit: IntLike,
    capacity: IntLike,
    allow_auto_truncate: BoolLike,
    placeholder_proceeds: BoolLike,
) -> tuple[z3.ArithRef, z3.ArithRef]:
    """SGLang's tiers in the order a request meets them (engines.md §1, §5.1)."""
    n = _int(length)
    truncate = _bool(allow_auto_truncate)
    passes = _bool(placeholder_proceeds)
    # Scheduler tier: at or over max_req_input_len the prompt is truncated or swapped.
    over_limit_kind = z3.If(
        truncate, _k(Kind.TRUNCATED), z3.If(passes, _k(Kind.PLACEHOLDER), _k(Kind.RETIRED))
    )
    over_limit_eff = z3.If(
        truncate, _int(scheduler_limit), z3.If(passes, z3.IntVal(1), z3.IntVal(0))
    )
    kind = z3.If(
        n >= context_length,
        _k(Kind.TOKENIZER_REJECT),
        z3.If(n >= scheduler_limit, over_limit_kind, _k(Kind.FULL)),
    )
    eff = z3.If(
        n >= context_length,
        z3.IntVal(0),
        z3.If(n >= scheduler_limit, over_limit_eff, n),
    )
    return _gate(kind, eff, capacity)


def vllm_handling(length: IntLike, max_model_len: IntLike) -> tuple[z3.ArithRef, z3.ArithRef]:
    """vLLM: the request check only. The pool needs no gate: a server whose pool cannot hold a
    max_model_len request does not start at all (reported as C1 by `rules.py`)."""
    n = _int(length)
    kind = z3.If(n >= max_model_len, _k(Kind.TOKENIZER_REJECT), _k(Kind.FULL))
    eff = z3.If(n >= max_model_len, z3.IntVal(0), n)
    return kind, eff


def role_limits(cfg: RoleConfig, version: str) -> RoleLimits:
    """Numbers behind the rules for one role."""
    pool = cfg.pool_tokens.value
    context = cfg.context_length.value
    if cfg.engine is Engine.VLLM:
        return RoleLimits(
            role=cfg.role,
            engine=cfg.engine,
            context_length=context,
            pool_tokens=pool,
            tokenizer_limit=context,
            scheduler_limit=None,
            capacity_limit=pool,
            allow_auto_truncate=False,
            placeholder_proceeds=False,
        )
    limit = sglang_scheduler_limit(context, pool)
    assert isinstance(limit, int)
    return RoleLimits(
        role=cfg.role,
        engine=cfg.engine,
        context_length=context,
        pool_tokens=pool,
        tokenizer_limit=context,
        scheduler_limit=limit,
        capacity_limit=pool,
        allow_auto_truncate=cfg.allow_auto_truncate.value,
        placeholder_proceeds=version == "0.5.11",
    )
