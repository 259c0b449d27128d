"""Shared builders for the deployment checker's tests."""

from __future__ import annotations

from kvhandoff.model_checker.deployment import CheckerOptions, from_commands
from kvhandoff.model_checker.deployment.engines import Kind
from kvhandoff.model_checker.deployment.model import Deployment

INCIDENT_CONTEXT = 1_048_576
INCIDENT_PREFILL_POOL = 681_280


def sglang(role: str, *flags: str) -> str:
    """A realistic SGLang launch line with flags the checker does not model mixed in."""
    return " ".join(
        [
            "python -m sglang.launch_server --model-path zai-org/GLM-5.3 --trust-remote-code",
            f"--disaggregation-mode {role} --tp 8 --host 0.0.0.0 --port 30000",
            "--disaggregation-ib-device mlx5_0 --mem-fraction-static 0.88",
            *flags,
        ]
    )


def incident(
    prefill_pool: int = INCIDENT_PREFILL_POOL,
    decode_pool: int = 2_097_152,
    version: str = "0.5.11",
    prefill_flags: tuple[str, ...] = (),
    decode_flags: tuple[str, ...] = (),
    context: int = INCIDENT_CONTEXT,
) -> Deployment:
    return from_commands(
        sglang(
            "prefill",
            f"--context-length {context}",
            f"--max-total-tokens {prefill_pool}",
            *prefill_flags,
        ),
        sglang(
            "decode",
            f"--context-length {context}",
            f"--max-total-tokens {decode_pool}",
            *decode_flags,
        ),
        CheckerOptions(sglang_version=version),
    )


def oracle_sglang(n: int, context: int, pool: int, truncate: bool, v0511: bool) -> tuple[Kind, int]:
    """engines.md §5.1 written out longhand, independently of the Z3 encoding."""
    if n >= context:
        return Kind.TOKENIZER_REJECT, 0
    limit = min(context - 1, pool - 1) - 5
    if n >= limit:
        if truncate:
            kind, eff = Kind.TRUNCATED, limit
        elif v0511:
            kind, eff = Kind.PLACEHOLDER, 1
        else:
            return Kind.RETIRED, 0
    else:
        kind, eff = Kind.FULL, n
    if eff > pool:
        return Kind.CAPACITY_ABORT, 0
    return kind, eff
