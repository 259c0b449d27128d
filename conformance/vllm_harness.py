"""vLLM 0.33.0's scheduler-side KV-transfer lifecycle behind kvhandoff's harness service.

Runs in the vLLM environment (`make venv-vllm`); `kvhandoff conform --target vllm`
(`conformance.vllm_target`) starts it as a subprocess and speaks the harness protocol to it.

What is vLLM's and what is ours:
- vLLM's: two real `vllm.v1.core.sched.scheduler.Scheduler`s (a prefill instance and a decode
  instance, one process), each with the NIXL connector's real scheduler side
  (`NixlPullConnector` in role SCHEDULER: `NixlPullConnectorScheduler`), their KV cache managers
  and block pools. Every decision about a request's blocks is theirs: when decode allocates blocks
  and parks a request in WAITING_FOR_REMOTE_KVS, what finished_recving / failed_recving do to it,
  the failed-load policy (`kv_load_failure_policy`), what an abort does to a request still
  waiting for its KV, prefill's delayed free of a finished request's blocks until
  finished_sending, and the lease deadline it hands its worker.
- Ours: everything a GPU worker would be. There is no data path: no NIXL agent, no model, no
  worker. A stub "worker" per instance reads each step's `NixlConnectorMetadata` and answers
  with a `KVConnectorOutput`, as NIXL's worker side would: decode's worker reads the source
  blocks named in `reqs_to_recv` (a page here is one byte per block: the tenant's canary, so an
  answer says whose data it was generated from), reports the request in finished_recving (and,
  when a read fails, in failed_recving with its blocks in invalid_block_ids, as NIXL's worker
  does) and notifies prefill, whose worker then reports finished_sending; prefill's worker
  reports finished_sending at the lease deadline the scheduler set if no notification came (as
  `_reap_expired_send_leases`). The "model" samples one token per scheduled request (decode reads
  its blocks' canaries). The router (vLLM's disaggregated proxy: prefill first, then decode with
  prefill's `kv_transfer_params`), the intake limits, and the read latency are ours.

The event mapping (vLLM's step -> the kvhandoff event; docs/vllm.md has the table):
    prefill Scheduler.add_request(do_remote_decode)          prefill_admit_request
    decode Scheduler.add_request(prefill's params)           decode_admit_request
    decode schedule(): WAITING_FOR_REMOTE_KVS, blocks        decode_reserve_pages
    the worker's reads of reqs_to_recv start                 prefill_receive_grant
    one read lands in a decode block                         prefill_write_page
    the reads are done (NIXL's transfer state DONE)          prefill_send_completion (no digest)
    decode update_from_output(finished_recving)              decode_receive_write (accepted),
                                                             decode_receive_completion validated
    decode request finished (its token sampled)              decode_generate, decode_answer
    decode update_from_output(failed_recving), policy fail   decode_answer error
    decode finish_requests(FINISHED_ABORTED)                 decode_abort_request
    decode frees the blocks (request leaves the scheduler)   decode_release_pages (scrubbed false)
    prefill frees the blocks (finished_sending)              prefill_finish_request
Page ids are named in the spec's allocation order (lowest free first); vLLM's block ids are in
each event's `blocks` field.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kvhandoff.conformance.target import (
    Event,
    Target,
    TargetAnswer,
    UnsupportedScenario,
    _tenant_byte,
    canary_owner,
    require_one_prefill_rank,
)
from kvhandoff.spec.config import Config

VLLM_VERSION = "0.33.0"
PREFILL_BLOCKS = 64
"""Usable blocks of the prefill instance's pool (vLLM keeps block 0 as its null block)."""
SETTLE_S = 20.0
LEASE_S = int(os.environ.get("KVHANDOFF_VLLM_LEASE_S", "3"))
"""NIXL's `kv_lease_duration` for these runs (vLLM's default: 30 s)."""
READ_S = float(os.environ.get("KVHANDOFF_VLLM_READ_S", "0.3"))
"""How long the stub worker's reads take (a cancel can land while decode waits)."""
FAIL_READS = os.environ.get("KVHANDOFF_VLLM_FAIL_READS") == "1"
"""The stub worker's reads fail (the failed-load scenarios)."""
PREFILL_S = float(os.environ.get("KVHANDOFF_VLLM_PREFILL_S", "0"))
"""How long the stub prefill model's forward pass takes (a cancel can land while it runs)."""
POLICY = os.environ.get("KVHANDOFF_VLLM_LOAD_FAILURE_POLICY", "fail")
"""vLLM's `kv_load_failure_policy`: "fail" (vLLM's default) or "recompute"."""
EOS = 2


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


@dataclass
class _Read:
    """The stub decode worker's reads for one request (NIXL's READs of prefill's blocks)."""

    rid: str
    local: list[int]
    remote: list[int]
    remote_rid: str
    done_at: float
    fail: bool


@dataclass
class _Req:
    r: int
    rid: str
    tenant: str
    tokens: int
    room: int
    state: str = "prefill"  # prefill, decode, done
    p_blocks: list[int] = field(default_factory=list)
    d_blocks: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    generation: int = 0
    cancelled: bool = False
    aborted_at_decode: bool = False
    prefill_done: bool = False
    decode_done: bool = False
    received: bool = False
    params: dict[str, Any] | None = None
    error: str = ""


class VllmEngine(Target):
    """The coarse target the harness serves: client submits and cancels, settle."""

    name = "vllm"
    fine_grained = False

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.trace_no = 0
        self.events: list[Event] = []
        self.seq: dict[str, int] = {}
        self.reqs: dict[int, _Req] = {}
        self.by_rid: dict[str, _Req] = {}
        self.results: dict[int, TargetAnswer] = {}
        self.gen_counter = 0
        self.P: Any = None
        self.D: Any = None
        self._stop = threading.Event()
        self._driver: threading.Thread | None = None
        self._model_dir = ""
        self.last_headers: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ vLLM's schedulers

    def _model_config(self) -> Any:
        """A hand-made model config (no hub here): a tiny OPT config.json in a temp folder, as
        vLLM's own connector unit tests build theirs without loading weights."""
        import json
        import tempfile

        from vllm.config import ModelConfig

        if not self._model_dir:
            self._model_dir = tempfile.mkdtemp(prefix="kvhandoff-vllm-model-")
            cfg = {
                "architectures": ["OPTForCausalLM"],
                "model_type": "opt",
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_hidden_layers": 2,
                "ffn_dim": 128,
                "vocab_size": 256,
                "max_position_embeddings": 4096,
                "word_embed_proj_dim": 64,
                "torch_dtype": "float32",
                "eos_token_id": EOS,
                "bos_token_id": EOS,
                "pad_token_id": 1,
                "do_layer_norm_before": True,
            }
            with open(os.path.join(self._model_dir, "config.json"), "w") as f:
                json.dump(cfg, f)
        return ModelConfig(
            model=self._model_dir,
            tokenizer=self._model_dir,
            skip_tokenizer_init=True,
            dtype="float32",
            seed=0,
            max_model_len=4096,
        )

    def _scheduler(self, role: str, usable_blocks: int, block_size: int) -> Any:
        import torch
        from vllm.config import (
            CacheConfig,
            DeviceConfig,
            KVTransferConfig,
            SchedulerConfig,
            VllmConfig,
        )
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager

        num_blocks = usable_blocks + 1  # block 0 is vLLM's null block
        model_config = self._model_config()
        vllm_config = VllmConfig(
            scheduler_config=SchedulerConfig(
                max_num_seqs=16,
                max_num_batched_tokens=1024,
                max_model_len=4096,
                enable_chunked_prefill=True,
                is_encoder_decoder=False,
            ),
            model_config=model_config,
            cache_config=CacheConfig(
                block_size=block_size,
                gpu_memory_utilization=0.9,
                cache_dtype="auto",
                enable_prefix_caching=True,
            ),
            kv_transfer_config=KVTransferConfig(
                kv_connector="NixlConnector",
                kv_role=role,
                kv_load_failure_policy=POLICY,
                kv_connector_extra_config={"kv_lease_duration": LEASE_S},
            ),
            device_config=DeviceConfig("cpu"),
        )
        kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[
                KVCacheGroupSpec(
                    ["layer"],
                    FullAttentionSpec(
                        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
                    ),
                )
            ],
        )
        vllm_config.cache_config.num_gpu_blocks = num_blocks
        return Scheduler(
            vllm_config=vllm_config,
            kv_cache_config=kv_cache_config,
            log_stats=True,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=block_size,
        )

    # ------------------------------------------------------------------ the log

    def emit(self, server: str, event: str, **args: Any) -> None:
        with self.lock:
            n = self.seq.get(server, 0) + 1
            self.seq[server] = n
            self.events.append({"seq": n, "server": server, "event": event, "args": args})

    # ------------------------------------------------------------------ Target API

    def start(self, config: Config, mode: str) -> None:
        require_one_prefill_rank(config)
        if mode != "reference":
            raise UnsupportedScenario(
                f"mode {mode!r}: the vllm target runs vLLM as installed (mode reference)"
            )
        if any(q.pages > PREFILL_BLOCKS for q in config.requests):
            raise UnsupportedScenario(f"the vllm target's prefill pool holds {PREFILL_BLOCKS}")
        if self._driver is not None:
            self.settle()
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import init_none_hash

        init_none_hash(sha256)
        with self.lock:
            if self.P is not None:
                self._shutdown_schedulers()
            self.trace_no += 1
            self.config = config
            self.page_size = config.page_size
            self.P = self._scheduler("kv_producer", PREFILL_BLOCKS, config.page_size)
            self.D = self._scheduler("kv_consumer", config.decode_pages, config.page_size)
            self.p_pool = bytearray(PREFILL_BLOCKS + 1)
            self.d_pool = bytearray(config.decode_pages + 1)
            self.free_pages = list(range(config.decode_pages))
            self.reads: dict[str, _Read] = {}
            self.d_recved: set[str] = set()
            self.d_failed: set[str] = set()
            self.d_invalid: set[int] = set()
            self.p_sent: set[str] = set()
            self.p_leases: dict[str, float] = {}
            self.p_why: dict[str, str] = {}
            self.p_step: tuple[Any, float] | None = None
            self._recomputed: set[str] = set()
            self.events = []
            self.seq = {}
            self.reqs = {}
            self.by_rid = {}
            self.results = {}
            self.last_headers = [self.header()]
        if self._driver is None:
            self._driver = threading.Thread(target=self._drive, daemon=True)
            self._driver.start()

    def _shutdown_schedulers(self) -> None:
        for s in (self.P, self.D):
            try:
                s.shutdown()
            except Exception as exc:  # a scheduler that cannot shut down is still dropped
                print(f"vllm harness: shutdown: {exc}", file=sys.stderr)

    def header(self) -> dict[str, Any]:
        c = self.config
        return {
            "kvhandoff_trace": 1,
            "kind": "event_log",
            "server": "merged",
            "mode": "reference",
            "engine": f"vllm {VLLM_VERSION} (scheduler + NIXL scheduler side, stub workers)",
            "config": {
                "page_size": c.page_size,
                "decode_pages": c.decode_pages,
                "context_window": c.context_window * c.page_size,
                "prefill_max_prompt": c.prefill_max_prompt * c.page_size,
                "decode_max_prompt": c.decode_max_prompt * c.page_size,
            },
        }

    def request_id(self, r: int) -> str:
        return f"t{self.trace_no}r{r}"

    def _request(self, rid: str, tokens: list[int], params: dict[str, Any]) -> Any:
        from vllm import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher
        from vllm.v1.request import Request

        sp = SamplingParams(max_tokens=1)
        sp.update_from_generation_config({}, EOS)
        req = Request(
            request_id=rid,
            prompt_token_ids=tokens,
            sampling_params=sp,
            pooling_params=None,
            mm_features=None,
            block_hasher=get_request_block_hasher(self.page_size, sha256),
        )
        req.kv_transfer_params = params
        return req

    def submit(self, r: int) -> None:
        c = self.config
        q = c.requests[r]
        tokens = self.prompt_tokens(c, r)
        room = self.trace_no * 1000 + 100 + r  # the proxy's fresh id per request
        req = _Req(r, self.request_id(r), q.tenant, tokens, room)
        with self.lock:
            self.reqs[r] = req
            self.by_rid[req.rid] = req
            if tokens > c.context_window * c.page_size:
                self.emit(
                    "router",
                    "router_reject_request",
                    request_id=req.rid,
                    tenant=q.tenant,
                    room=room,
                    prompt_tokens=tokens,
                    max_tokens=tokens,
                    code="OUT_OF_RANGE",
                    reason=f"prompt of {tokens} tokens is over the context window",
                )
                self.results[r] = TargetAnswer(False, "OUT_OF_RANGE", "over the context window")
                req.state, req.prefill_done, req.decode_done = "done", True, True
                return
            self.emit(
                "router",
                "router_submit_request",
                request_id=req.rid,
                tenant=q.tenant,
                room=room,
                prompt_tokens=tokens,
                max_tokens=tokens,
            )
            if tokens > c.prefill_max_prompt * c.page_size:
                # vLLM's input processor refuses a prompt over the instance's max_model_len
                # before the scheduler sees it; the proxy answers with prefill's error and never
                # asks decode.
                self.emit(
                    "prefill",
                    "prefill_reject_request",
                    request_id=req.rid,
                    room=room,
                    tenant=q.tenant,
                    prompt_tokens=tokens,
                    placeholder=False,
                    reason=f"prompt of {tokens} tokens is over prefill's max_model_len",
                )
                req.state, req.prefill_done, req.decode_done = "done", True, True
                self._answer(req, False, "OUT_OF_RANGE", "over prefill's limit")
                return
            prompt = [_tenant_byte(q.tenant)] * tokens
            self.P.add_request(
                self._request(
                    req.rid, prompt, {"do_remote_decode": True, "do_remote_prefill": False}
                )
            )
            self.emit(
                "prefill",
                "prefill_admit_request",
                request_id=req.rid,
                tenant=q.tenant,
                room=room,
                prompt_tokens=tokens,
            )

    def cancel(self, r: int) -> bool:
        from vllm.v1.request import RequestStatus

        with self.lock:
            req = self.reqs.get(r)
            if req is None or r in self.results:
                return False
            self.emit("router", "client_cancel_request", request_id=req.rid, tenant=req.tenant)
            self.results[r] = TargetAnswer(False, "CANCELLED", "cancelled by the client")
            self.emit(
                "router",
                "router_answer_client",
                request_id=req.rid,
                tenant=req.tenant,
                status="error",
                code="CANCELLED",
            )
            req.cancelled = True
            if req.state == "prefill" and not req.prefill_done:
                # The proxy aborts the prefill request (the engine's abort_requests) and never
                # asks decode.
                self.P.finish_requests([req.rid], RequestStatus.FINISHED_ABORTED)
                self.emit("prefill", "prefill_cancel_request", request_id=req.rid, reason="cancel")
                req.decode_done = True
                req.state = "done"
                # An abort frees the blocks at once (no transfer was promised).
                req.prefill_done = req.rid not in self.P.requests
            elif req.state == "decode" and req.rid in self.D.requests:
                d = self.D.requests[req.rid]
                if not d.is_finished():
                    was = d.status.name
                    self.D.finish_requests([req.rid], RequestStatus.FINISHED_ABORTED)
                    self.emit(
                        "decode",
                        "decode_abort_request",
                        request_id=req.rid,
                        generation=req.generation or None,
                        reason="client cancelled",
                        vllm_status=was,
                    )
                    req.aborted_at_decode = True
                    self._decode_freed(req)
        return True

    def restart_prefill(self) -> None:
        raise UnsupportedScenario("the vllm target has no process to crash (scheduler side only)")

    def restart_decode(self) -> None:
        raise UnsupportedScenario("the vllm target has no process to crash (scheduler side only)")

    def settle(self) -> None:
        deadline = time.monotonic() + SETTLE_S + LEASE_S
        while time.monotonic() < deadline:
            with self.lock:
                busy = [q for q in self.reqs.values() if not (q.decode_done and q.prefill_done)]
            if not busy:
                return
            time.sleep(0.02)

    def wait_answered(self, r: int) -> None:
        deadline = time.monotonic() + SETTLE_S
        while r in self.reqs and r not in self.results and time.monotonic() < deadline:
            time.sleep(0.01)

    def take_events(self) -> list[Event]:
        with self.lock:
            out, self.events = self.events, []
        return out

    def answers(self) -> dict[int, TargetAnswer]:
        with self.lock:
            return dict(self.results)

    def quiescent(self) -> bool:
        with self.lock:
            if self.D is None:
                return True
            return (
                all(q.decode_done and q.prefill_done for q in self.reqs.values())
                and self.D.kv_cache_manager.block_pool.get_num_free_blocks()
                == self.config.decode_pages
                and self.P.kv_cache_manager.block_pool.get_num_free_blocks() == PREFILL_BLOCKS
            )

    def describe(self) -> str:
        with self.lock:
            return "; ".join(
                f"{q.rid}: {q.state}{'' if q.prefill_done else ', prefill holds blocks'}"
                + (f" (vLLM raised {q.error})" if q.error else "")
                for q in self.reqs.values()
                if not (q.decode_done and q.prefill_done)
            )

    def shutdown(self) -> None:
        self._stop.set()
        if self._driver is not None:
            self._driver.join(timeout=5)
        with self.lock:
            if self.P is not None:
                self._shutdown_schedulers()

    # ------------------------------------------------------------------ the loop

    def _answer(self, req: _Req, ok: bool, code: str, reason: str) -> None:
        if req.r in self.results:
            return
        self.results[req.r] = TargetAnswer(ok, "" if ok else code, reason)
        args: dict[str, Any] = {
            "request_id": req.rid,
            "tenant": req.tenant,
            "status": "ok" if ok else "error",
        }
        if not ok:
            args["code"] = code
        self.emit("router", "router_answer_client", **args)

    def _drive(self) -> None:
        while not self._stop.is_set():
            try:
                with self.lock:
                    if self.P is not None:
                        self._step_prefill()
                        self._step_decode()
            except Exception as exc:  # keep driving; the run will not settle
                import traceback

                traceback.print_exc()
                print(f"vllm harness: driver: {type(exc).__name__}: {exc}", file=sys.stderr)
                with self.lock:
                    for q in self.reqs.values():
                        if not (q.decode_done and q.prefill_done) and not q.error:
                            q.error = f"{type(exc).__name__}: {exc}"
            time.sleep(0.005)

    @staticmethod
    def _runner_output(reqs: list[Any], tokens: list[int], **kv: Any) -> Any:
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        ids = [r.request_id for r in reqs]
        return ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={x: i for i, x in enumerate(ids)},
            sampled_token_ids=[[t] for t in tokens],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=None,
            kv_connector_output=KVConnectorOutput(**kv) if kv else None,
        )

    def _sampled(self, so: Any, sched: Any) -> tuple[list[Any], list[int]]:
        """The requests a step computed to the end of their prompt, and the token each samples
        (the stub model: a request samples a token once its prompt is all computed)."""
        reqs, toks = [], []
        for rid, n in so.num_scheduled_tokens.items():
            req = sched.requests[rid]
            reqs.append(req)
            toks.append(7 if req.num_computed_tokens + n >= req.num_tokens else -1)
        return reqs, toks

    def _step_prefill(self) -> None:
        P = self.P
        now = time.perf_counter()
        notified, self.p_sent = self.p_sent, set()
        sent: set[str] = set()
        for rid, expiry in list(self.p_leases.items()):
            if rid in notified or now >= expiry:
                # NIXL's prefill worker: decode's notification (all reads done), or the lease
                # deadline the scheduler set (`_reap_expired_send_leases`).
                sent.add(rid)
                self.p_why[rid] = (
                    "finished_sending: decode's reads done"
                    if rid in notified
                    else f"finished_sending: lease of {LEASE_S} s expired"
                )
                del self.p_leases[rid]
        if self.p_step is None:
            if not (P.requests or sent):
                return
            so = P.schedule()
            self.p_step = (so, time.monotonic() + (PREFILL_S if so.num_scheduled_tokens else 0))
        so, done_at = self.p_step
        if time.monotonic() < done_at:
            # The forward pass is still running; the worker's notifications wait for it too.
            self.p_sent |= notified - sent
            for rid in sent:
                self.p_leases.setdefault(rid, 0.0)
            return
        self.p_step = None
        meta = so.kv_connector_metadata
        if meta is not None:
            for rid, expiry in meta.reqs_to_send.items():
                self.p_leases[rid] = expiry
        reqs, toks = self._sampled(so, P)
        for req, tok in zip(reqs, toks, strict=True):
            if tok >= 0:  # the prompt is computed: its KV is in the request's blocks
                for b in P.kv_cache_manager.get_block_ids(req.request_id)[0]:
                    q = self.by_rid.get(req.request_id)
                    if q is not None:
                        self.p_pool[b] = _tenant_byte(q.tenant)
        kv: dict[str, Any] = {"finished_sending": sent} if sent else {}
        keep = [(r, t) for r, t in zip(reqs, toks, strict=True) if t >= 0]
        before = {rid for rid in P.requests}
        eco = P.update_from_output(
            so,
            self._runner_output([r for r, _ in keep], [t for _, t in keep], **kv),
        )
        for outs in eco.values():
            for o in outs.outputs:
                q = self.by_rid.get(o.request_id)
                if q is None or o.finish_reason is None:
                    continue
                if q.cancelled or o.kv_transfer_params is None:
                    continue
                # The proxy hands prefill's kv_transfer_params to decode.
                q.params = dict(o.kv_transfer_params)
                q.p_blocks = list(q.params["remote_block_ids"][0])
                self._to_decode(q)
        for rid in before - set(P.requests):
            q = self.by_rid.get(rid)
            if q is not None and not q.prefill_done:
                q.prefill_done = True
                self.emit(
                    "prefill",
                    "prefill_finish_request",
                    request_id=rid,
                    status="ok",
                    blocks=q.p_blocks,
                    reason=self.p_why.get(rid, "freed at finish"),
                )

    def _to_decode(self, q: _Req) -> None:
        c = self.config
        assert q.params is not None
        prompt = [_tenant_byte(q.tenant)] * q.tokens
        self.D.add_request(self._request(q.rid, prompt, q.params))
        q.state = "decode"
        self.emit(
            "decode",
            "decode_admit_request",
            request_id=q.rid,
            tenant=q.tenant,
            room=q.room,
            prompt_tokens=q.tokens,
            max_tokens=q.tokens,
        )
        if q.tokens > c.decode_max_prompt * c.page_size:
            from vllm.v1.request import RequestStatus

            # Refused at decode's serving layer: vLLM aborts it at once (the abort_immediately
            # path), and the NIXL scheduler asks its worker to tell prefill to free its blocks.
            self.D.finish_requests([q.rid], RequestStatus.FINISHED_ABORTED)
            self.emit(
                "decode",
                "decode_reject_request",
                request_id=q.rid,
                tenant=q.tenant,
                room=q.room,
                prompt_tokens=q.tokens,
                code="OUT_OF_RANGE",
                reason="over decode's limit",
            )
            q.decode_done = True
            self._answer(q, False, "OUT_OF_RANGE", "over decode's limit")

    def _pages_for(self, blocks: list[int]) -> list[int]:
        n = len(blocks)
        pages, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return pages

    def _step_decode(self) -> None:
        from vllm.v1.request import RequestStatus

        D = self.D
        now = time.monotonic()
        recved, failed, invalid = set(), set(), set()
        for rid, rd in list(self.reads.items()):
            if now < rd.done_at:
                continue
            del self.reads[rid]
            q = self.by_rid[rid]
            recved.add(rid)
            if rd.fail:
                # NIXL's worker: the request is done receiving and failed; its local blocks are
                # invalid; prefill is not notified (its blocks wait for the lease).
                failed.add(rid)
                invalid.update(rd.local)
                continue
            for i, (lb, pb) in enumerate(zip(rd.local, rd.remote, strict=True)):
                self.d_pool[lb] = self.p_pool[pb]
                self.emit(
                    "prefill",
                    "prefill_write_page",
                    request_id=rid,
                    room=q.room,
                    generation=q.generation,
                    page=q.pages[i],
                    index=i,
                    message_id=0,
                    digest=_digest(bytes([self.d_pool[lb]])),
                    block=lb,
                    source_block=pb,
                )
            self.emit(
                "prefill",
                "prefill_send_completion",
                request_id=rid,
                room=q.room,
                generation=q.generation,
                page_count=len(rd.local),
                pages_written=len(rd.local),
                prompt_tokens=q.tokens,
                digest="",
            )
            self.p_sent.add(rd.remote_rid)
        if not (D.requests or recved):
            return
        so = D.schedule()
        meta = so.kv_connector_metadata
        if meta is not None:
            for rid, m in meta.reqs_to_recv.items():
                q = self.by_rid[rid]
                local = list(m.local_block_ids[0]) if m.local_block_ids else []
                remote = list(m.remote.block_ids[0]) if m.remote is not None else []
                if not local:
                    # Nothing to read (an abort before the load was scheduled): the worker
                    # only tells prefill to free its blocks.
                    self.p_sent.add(m.remote.request_id if m.remote is not None else rid)
                    continue
                self.gen_counter += 1
                q.generation = (1 << 32) | self.gen_counter
                q.d_blocks = local
                q.pages = self._pages_for(local)
                self.emit(
                    "decode",
                    "decode_reserve_pages",
                    request_id=rid,
                    tenant=q.tenant,
                    room=q.room,
                    generation=q.generation,
                    pages=q.pages,
                    page_count=len(q.pages),
                    blocks=local,
                    vllm_status=D.requests[rid].status.name,
                )
                self.emit(
                    "prefill",
                    "prefill_receive_grant",
                    request_id=rid,
                    room=q.room,
                    generation=q.generation,
                    pages=q.pages,
                    page_count=len(q.pages),
                    prompt_tokens=q.tokens,
                    outcome="matched",
                    source_blocks=remote,
                )
                self.reads[rid] = _Read(
                    rid, local, remote[: len(local)], rid, now + READ_S, FAIL_READS
                )
        reqs, toks = self._sampled(so, D)
        keep = [(r, t) for r, t in zip(reqs, toks, strict=True) if t >= 0]
        kv: dict[str, Any] = {}
        if recved:
            kv["finished_recving"] = recved
        if failed:
            kv["failed_recving"] = failed
            kv["invalid_block_ids"] = invalid
        generated = {}
        for r, _ in keep:
            if r.request_id in self.by_rid:
                blocks = list(D.kv_cache_manager.get_block_ids(r.request_id)[0])
                generated[r.request_id] = [self.d_pool[b] for b in blocks]
        eco = D.update_from_output(
            so, self._runner_output([r for r, _ in keep], [t for _, t in keep], **kv)
        )
        for rid in recved - failed:
            q = self.by_rid[rid]
            if q.aborted_at_decode:
                continue
            for i, b in enumerate(q.d_blocks):
                self.emit(
                    "decode",
                    "decode_receive_write",
                    request_id=rid,
                    room=q.room,
                    generation=q.generation,
                    page=q.pages[i],
                    message_id=0,
                    digest=_digest(bytes([self.d_pool[b]])),
                    outcome="accepted",
                    block=b,
                )
            self.emit(
                "decode",
                "decode_receive_completion",
                request_id=rid,
                room=q.room,
                generation=q.generation,
                page_count=len(q.pages),
                digest="",
                verdict="validated",
            )
            q.received = True
        for outs in eco.values():
            for o in outs.outputs:
                found = self.by_rid.get(o.request_id)
                if found is None or o.finish_reason is None:
                    continue
                q = found
                finished = self.D.requests.get(o.request_id)
                vstatus = finished.status if finished is not None else None
                if q.aborted_at_decode:
                    continue
                if o.request_id in failed or vstatus == RequestStatus.FINISHED_ERROR:
                    self.emit(
                        "decode",
                        "decode_answer",
                        request_id=q.rid,
                        tenant=q.tenant,
                        generation=q.generation or None,
                        status="error",
                        code="INTERNAL",
                        reason=f"KV load failed (kv_load_failure_policy={POLICY})",
                        vllm_status=str(o.finish_reason),
                    )
                    self._answer(q, False, "INTERNAL", "KV load failed")
                else:
                    read = [
                        canary_owner(t, list(self.config.tenants))
                        for t in generated.get(o.request_id, [])
                    ]
                    self.emit(
                        "decode",
                        "decode_generate",
                        request_id=q.rid,
                        generation=q.generation,
                        pages=q.pages,
                        page_count=len(q.pages),
                        prompt_tokens=q.tokens,
                        tokens_generated=1,
                        recomputed=o.request_id in self._recomputed,
                    )
                    self.emit(
                        "decode",
                        "decode_answer",
                        request_id=q.rid,
                        tenant=q.tenant,
                        generation=q.generation,
                        status="ok",
                    )
                    if q.r not in self.results:
                        foreign = [
                            (
                                ",".join(
                                    self.request_id(i)
                                    for i, s in enumerate(self.config.requests)
                                    if s.tenant == t
                                ),
                                t,
                            )
                            for t in sorted({t for t in read if t is not None and t != q.tenant})
                        ]
                        self.results[q.r] = TargetAnswer(True, read=read, foreign=foreign)
                        self.emit(
                            "router",
                            "router_answer_client",
                            request_id=q.rid,
                            tenant=q.tenant,
                            status="ok",
                        )
        for rid in failed:
            if POLICY == "recompute":
                self._recomputed.add(rid)
        for q in self.reqs.values():
            if q.state == "decode" and not q.decode_done:
                self._decode_freed(q)

    def _decode_freed(self, q: _Req) -> None:
        """Log decode's release once vLLM's scheduler has let go of the request's blocks."""
        if q.decode_done or q.rid in self.D.requests:
            return
        q.decode_done = True
        q.state = "done"
        if q.aborted_at_decode and q.pages:
            # The blocks were held until the worker reported the reads done: the drain.
            self.emit(
                "decode",
                "decode_receive_abort_ack",
                request_id=q.rid,
                room=q.room,
                generation=q.generation,
                matched=True,
            )
        if q.pages:
            self.emit(
                "decode",
                "decode_release_pages",
                request_id=q.rid,
                generation=q.generation,
                pages=q.pages,
                page_count=len(q.pages),
                scrubbed=False,
                blocks=q.d_blocks,
                reason="aborted" if q.aborted_at_decode else "finished",
            )
            self.free_pages = sorted(self.free_pages + q.pages)


def main(argv: list[str]) -> int:
    import argparse

    from kvhandoff.conformance.harness_server import ListenError, serve

    p = argparse.ArgumentParser(prog="python -m kvhandoff.conformance.vllm_harness")
    p.add_argument("--listen", default="127.0.0.1:0")
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
    engine = VllmEngine()
    try:
        server = serve(args.listen, "vllm", factory=lambda: engine)
    except ListenError as exc:
        print(f"vllm harness: {exc}", file=sys.stderr)
        return 2
    print(f"LISTENING {server.address}", flush=True)
    try:
        sys.stdin.read()  # the parent closes stdin (or dies): stop
    finally:
        engine.shutdown()
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
