"""The deployment as the checker sees it: two roles' settings, engine-neutral.

Parsers (command lines, TOML) produce a `Deployment`; the engine models derive admission limits
from it; the decision procedure reasons over it. Every value keeps a note of where it came from
(`source`), so a finding can name the flag an operator has to change.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


class Engine(enum.StrEnum):
    SGLANG = "sglang"
    VLLM = "vllm"

    @property
    def label(self) -> str:
        return "SGLang" if self is Engine.SGLANG else "vLLM"

    @property
    def context_flag(self) -> str:
        return "--context-length" if self is Engine.SGLANG else "--max-model-len"

    @property
    def page_flag(self) -> str:
        return "--page-size" if self is Engine.SGLANG else "--block-size"


class Role(enum.StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


# SGLang releases whose admission rules differ (engines.md §1, §2.4): 0.5.11 lets the one-token
# placeholder through bootstrap, 0.5.23 retires it at the door.
SGLANG_VERSIONS = ("0.5.11", "0.5.23")
DEFAULT_SGLANG_VERSION = "0.5.23"
VLLM_VERSIONS = ("0.33.0",)
DEFAULT_VLLM_VERSION = "0.33.0"

# Defaults from sglang 0.5.23 srt/environ.py (engines.md §5.1).
SGLANG_DEFAULT_BOOTSTRAP_TIMEOUT_S = 300.0
SGLANG_DEFAULT_WAITING_TIMEOUT_S = 300.0
SGLANG_DEFAULT_DEFERRED_RELEASE = True
SGLANG_DEFAULT_DEFERRED_RELEASE_TIMEOUT_S = 30.0
SGLANG_DEFAULT_PAGE_SIZE = 1
SGLANG_DEFAULT_BACKEND = "mooncake"
SGLANG_DEFAULT_ALLOCATION_POLICY = "early"
# A Mooncake transfer-engine operation can last about this long (sglang PR #27372, engines.md §4.1);
# a deferred release that times out sooner can free pages an RDMA write still lands in.
MOONCAKE_MAX_OP_TIME_S = 30.0

# Defaults from vllm 0.33.0 (engines.md §3, §5.2).
VLLM_DEFAULT_BLOCK_SIZE = 16
VLLM_DEFAULT_LEASE_S = 30.0
VLLM_DEFAULT_LOAD_FAILURE_POLICY = "fail"


@dataclass(frozen=True)
class Setting(Generic[T]):
    """A value and where it came from ("--page-size", "env SGLANG_...", "[prefill] pool_tokens",
    "default"), so that findings and errors can name what to change."""

    value: T
    source: str

    @property
    def is_default(self) -> bool:
        return self.source == "default"


@dataclass(frozen=True)
class RoleConfig:
    """One server's capacity-relevant settings. Engine-specific fields are None for the other
    engine. `pool_tokens` is the KV pool the server will really have, in tokens, after the engine's
    own rounding (SGLang page-aligns; vLLM subtracts its null block)."""

    role: Role
    engine: Engine
    context_length: Setting[int]  # SGLang --context-length, vLLM --max-model-len
    pool_tokens: Setting[int]
    page_size: Setting[int]  # SGLang --page-size, vLLM --block-size
    model: Setting[str | None] = Setting(None, "default")
    # SGLang
    allow_auto_truncate: Setting[bool] = Setting(False, "default")
    chunked_prefill_size: Setting[int | None] = Setting(None, "default")
    max_prefill_tokens: Setting[int | None] = Setting(None, "default")
    kv_cache_dtype: Setting[str] = Setting("auto", "default")
    transfer_backend: Setting[str] = Setting(SGLANG_DEFAULT_BACKEND, "default")
    allocation_policy: Setting[str] = Setting(SGLANG_DEFAULT_ALLOCATION_POLICY, "default")
    kv_checksum: Setting[bool] = Setting(False, "default")
    dp_size: Setting[int] = Setting(1, "default")
    load_balance_method: Setting[str | None] = Setting(None, "default")
    speculative_algorithm: Setting[str | None] = Setting(None, "default")
    bootstrap_timeout_s: Setting[float] = Setting(SGLANG_DEFAULT_BOOTSTRAP_TIMEOUT_S, "default")
    waiting_timeout_s: Setting[float] = Setting(SGLANG_DEFAULT_WAITING_TIMEOUT_S, "default")
    deferred_release: Setting[bool] = Setting(SGLANG_DEFAULT_DEFERRED_RELEASE, "default")
    deferred_release_timeout_s: Setting[float] = Setting(
        SGLANG_DEFAULT_DEFERRED_RELEASE_TIMEOUT_S, "default"
    )
    # SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN: lets --context-length exceed the model's window.
    allow_longer_context: Setting[bool] = Setting(False, "default")
    # vLLM
    kv_connector: Setting[str | None] = Setting(None, "default")
    kv_role: Setting[str | None] = Setting(None, "default")
    kv_load_failure_policy: Setting[str] = Setting(VLLM_DEFAULT_LOAD_FAILURE_POLICY, "default")
    enforce_handshake_compat: Setting[bool] = Setting(True, "default")
    kv_lease_duration_s: Setting[float] = Setting(VLLM_DEFAULT_LEASE_S, "default")
    max_num_batched_tokens: Setting[int | None] = Setting(None, "default")
    enable_chunked_prefill: Setting[bool] = Setting(True, "default")
    # Things the parser wants the report to mention (assumptions it made, values it rounded).
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Deployment:
    """A prefill server, a decode server and the router in front of them."""

    engine: Engine
    version: str
    prefill: RoleConfig
    decode: RoleConfig
    # The longest prompt the router lets through is `router_window - 1` tokens: the same strict
    # rule as the engines' own tokenizers (a prompt as long as the window leaves no room to
    # generate). Defaults to the larger advertised window of the two servers.
    router_window: Setting[int]
    # Time a request can spend in decode's queues before its pages are allocated (C6).
    max_decode_queueing_s: Setting[float] = Setting(0.0, "default")
    # The model's own window (max_position_embeddings), when the user told us (C1 startup check).
    model_context_length: Setting[int | None] = Setting(None, "default")

    def role(self, role: Role) -> RoleConfig:
        return self.prefill if role is Role.PREFILL else self.decode
