"""Setting SGLang's disaggregation classes up without a model, a GPU or a scheduler.

Imported only inside the SGLang environment (`make venv-sglang`) by `conformance.sglang_prefill`
and `conformance.sglang_harness`. Three things stand between SGLang 0.5.23 and a CPU machine:

- PyPI's torchvision wheel is a CUDA build whose C operators do not load here; its import then
  fails registering fake kernels for `torchvision::nms` and `torchvision::qnms` ("operator ...
  does not exist"). Declaring those two schemas first lets the import finish; nothing here calls
  them (SGLang imports torchvision for its multimodal processors).
- SGLang reads its configuration from a process-wide context: a role publishes its ServerArgs
  (`override_server_args`) and states its rank in each parallel group (one of each here).
- Mooncake picks the machine's address unless told: SGLANG_HOST_IP and MC_FORCE_TCP keep it on
  127.0.0.1 over TCP; its listeners bind the wildcard address, which the harness's
  LD_PRELOAD bind wrapper (impl/transport/loopback_bind.c) turns into loopback.
"""

from __future__ import annotations

import os
from typing import Any

KV_LAYERS = 2
PAGE_BYTES = 64
"""Bytes of one page in one layer: the KV pools are uint8 tensors [layers, pages, PAGE_BYTES],
so a page is what SGLang calls one item of `kv_item_lens` (page-granular transfers)."""

ENV = {
    "SGLANG_HOST_IP": "127.0.0.1",
    "MOONCAKE_PROTOCOL": "tcp",
    "MC_FORCE_TCP": "1",
    # SGLang's defaults are minutes; the conformance runs use seconds (both are settings of
    # SGLang, read from the environment by its own code).
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "4",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "6",
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "2",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "1",
}

_prepared: list[Any] = []


def prepare_sglang() -> None:
    """Environment and the torchvision schemas; then SGLang's disaggregation modules import."""
    if _prepared:
        return
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    import torch

    lib = torch.library.Library("torchvision", "DEF")  # type: ignore[no-untyped-call]
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")  # type: ignore[no-untyped-call]
    _prepared.append(lib)  # the schemas live as long as the library object
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("sglang").setLevel(logging.ERROR)
    import sglang.srt.disaggregation.mooncake.conn  # noqa: F401


def publish_role(role: str, bootstrap_port: int) -> Any:
    """Publish this process's ServerArgs for `role` (prefill or decode) and its ranks; start the
    process's Mooncake transfer engine. Returns the ServerArgs."""
    from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import (
        init_mooncake_transfer_engine,
    )
    from sglang.srt.runtime_context import get_context, get_parallel

    server_args = (
        get_context()
        .override_server_args(
            disaggregation_mode=role,
            disaggregation_transfer_backend="mooncake",
            disaggregation_bootstrap_port=bootstrap_port,
            host="127.0.0.1",
        )
        .install()
    )
    get_parallel().override_permanently(
        attn_tp_rank=0,
        attn_cp_rank=0,
        attn_dcp_rank=0,
        attn_dp_rank=0,
        pp_rank=0,
        tp_rank=0,
        pp_group=None,
    )
    init_mooncake_transfer_engine(hostname="127.0.0.1", gpu_id=0, ib_device=None)
    return server_args


def kv_args(pool: Any, aux: Any, page_size: int) -> Any:
    """SGLang's KVArgs for one rank whose KV pool is `pool` ([layers, pages, bytes], CPU) and
    whose metadata buffer is `aux`: plain MHA layout, one KV head, no extra state."""
    from sglang.srt.disaggregation.base.conn import KVArgs

    a = KVArgs()
    a.engine_rank = 0
    layers = pool.shape[0]
    a.kv_data_ptrs = [pool[layer].data_ptr() for layer in range(layers)]
    a.kv_data_lens = [pool[layer].numel() for layer in range(layers)]
    a.kv_item_lens = [pool.shape[2]] * layers
    a.kv_layer_ids = list(range(layers))
    a.kv_cache_dtype_str = "uint8"
    a.aux_data_ptrs = [aux.data_ptr()]
    a.aux_data_lens = [aux.numel()]
    a.aux_item_lens = [aux.shape[1]]
    a.state_types = []
    a.state_data_ptrs = []
    a.state_data_lens = []
    a.state_item_lens = []
    a.state_layer_ids = []
    a.state_dim_per_tensor = []
    a.state_slice_outer_counts = []
    a.state_conv_shard_groups = []
    a.is_hybrid_mla_backend = False
    a.swa_kv_cache_layout = None
    a.ib_device = ""
    a.gpu_id = 0
    a.kv_head_num = 1
    a.total_kv_head_num = 1
    a.page_size = page_size
    a.system_dp_rank = 0
    a.rust_http_port = None
    a.pp_rank = 0
    a.prefill_start_layer = 0
    a.prefill_end_layer = layers
    a.mla_compression_ratios = None
    a.kv_buf_groups = 1
    a.hidden_kv_layers = layers
    a.draft_kv_layers = 0
    return a


DEFERRED_ENV = {"SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT": "3"}
"""Decode holds an aborted transfer's pages until prefill's drain ack or this many seconds."""
