"""`kvhandoff conform --target sglang`: SGLang 0.5.23's disaggregation classes as a target.

SGLang lives in an environment of its own (`make venv-sglang` makes `.venv-sglang`, pinned in
tests/engines/sglang-requirements.txt), since its dependencies and kvhandoff's differ. The
harness (`conformance.sglang_harness`) runs there with the loopback bind wrapper preloaded
(impl/transport/loopback_bind.c), so that Mooncake's listeners stay on 127.0.0.1; see
`conformance.engine_target` for how the target starts it and speaks to it.
"""

from __future__ import annotations

from pathlib import Path

from kvhandoff.conformance.engine_target import EngineTarget, EngineUnavailable


class SglangUnavailable(EngineUnavailable):
    """The SGLang environment is missing or its harness did not start."""


class SglangTarget(EngineTarget):
    """Starts the harness in `.venv-sglang` on first use; stops it at `shutdown`."""

    ENGINE = "sglang"
    TITLE = "SGLang"
    SIZE = "about 2.6 GB"
    START_TIMEOUT_S = 240.0
    """SGLang's import takes 15-40 s on two busy cores, twice (decode, then prefill's process)."""
    UNAVAILABLE = SglangUnavailable

    def harness_env(self, env: dict[str, str]) -> dict[str, str]:
        from kvhandoff.impl.errors import ConfigError
        from kvhandoff.impl.transport import loopback

        try:
            return loopback.preload_env(env)
        except ConfigError as exc:
            raise SglangUnavailable(f"the loopback bind wrapper: {exc}") from exc


def available(venv: Path | None = None) -> bool:
    return SglangTarget.available(venv)
