"""`kvhandoff conform --target vllm`: vLLM 0.33.0's scheduler-side KV-transfer lifecycle.

vLLM lives in an environment of its own (`make venv-vllm` makes `.venv-vllm`, pinned in
tests/engines/vllm-requirements.txt); its harness (`conformance.vllm_harness`) runs there, started
and spoken to as `conformance.engine_target` describes, exactly as `--target sglang` is. Nothing of
vLLM's listens: the NIXL connector's scheduler side starts its handshake listener only when
workers publish their metadata, and there are no workers (docs/vllm.md); the harness service
itself listens on 127.0.0.1, and the side channel is pinned there should it ever open.
"""

from __future__ import annotations

from pathlib import Path

from kvhandoff.conformance.engine_target import EngineTarget, EngineUnavailable


class VllmUnavailable(EngineUnavailable):
    """The vLLM environment is missing or its harness did not start."""


class VllmTarget(EngineTarget):
    """Starts the harness in `.venv-vllm` on first use; stops it at `shutdown`."""

    ENGINE = "vllm"
    TITLE = "vLLM"
    SIZE = "about 2.2 GB"
    START_TIMEOUT_S = 180.0
    """vLLM's import takes 5-30 s on two busy cores."""
    UNAVAILABLE = VllmUnavailable

    def harness_env(self, env: dict[str, str]) -> dict[str, str]:
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "127.0.0.1"
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        return env


def available(venv: Path | None = None) -> bool:
    return VllmTarget.available(venv)
