"""Decode's gRPC edge: the KV page pool (torch), the model, and the decode core's commands."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import grpc
import grpc.aio
import torch

from kvhandoff.impl.core import decode as dc
from kvhandoff.impl.core.common import (
    Generation,
    Log,
    Reply,
    RequestId,
    Room,
    Status,
    Tenant,
    pages_for,
)
from kvhandoff.impl.eventlog import EventLog
from kvhandoff.impl.model import CopyHeadModel
from kvhandoff.impl.modes import Mode
from kvhandoff.impl.pool import (
    DTYPE_NAME,
    PagePool,
    PoolShape,
    page_digest,
    resolve_device,
    tensor_bytes,
    tensor_from_bytes,
)
from kvhandoff.impl.proto import rpc
from kvhandoff.impl.proto.gen.kvhandoff.v1 import handoff_pb2 as pb
from kvhandoff.impl.servers.admission import AdmissionQueue, Entry
from kvhandoff.impl.servers.base import (
    BaseServer,
    CommonSettings,
    abort_with,
    check_bounds,
    refuse_unknown_instance,
)
from kvhandoff.impl.tls import Identity
from kvhandoff.impl.transport import OneSidedTransport, Transport, open_transport

MAX_REQUEST_ID = 128
MAX_TENANT = 128


@dataclass(frozen=True)
class DecodeSettings:
    common: CommonSettings
    # One address per prefill instance, in instance order (the router names an instance in
    # each submit); decode watches each one's health on its own.
    prefill_addresses: tuple[str, ...]
    instance: int = 0  # this decode's instance number, which its grants name
    shape: PoolShape = field(default_factory=PoolShape)
    num_pages: int = 64
    max_prompt_tokens: int = 256
    context_window: int = 256
    waiting_timeout_s: float = 30.0
    abort_retry_s: float = 1.0
    release_timeout_s: float = 5.0
    heartbeat_interval_s: float = 0.2
    prefill_dead_after_misses: int = 5
    device: str = "auto"
    state_dir: Path | None = None
    transport: str = "grpc"  # how page data arrives: impl.transport.TRANSPORT_NAMES
    admission_queue_len: int = 256  # requests waiting for pages (0: refuse at once, as before)
    admission_timeout_s: float = 10.0  # longest wait in the queue


def next_boot(state_dir: Path | None) -> int:
    """Persisted boot counter: each start of decode gets a number never handed out before, and
    generations are ``boot << 32 | counter``, so they never repeat across restarts."""
    if state_dir is None:
        # No state to persist: fall back to a random boot number (repeat chance 2^-31 per start).
        return secrets.randbits(31) | (1 << 31)
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "decode_boot"
    boot = int(path.read_text()) + 1 if path.exists() else 1
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        f.write(str(boot))
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return boot


@dataclass
class _Waiting:
    """A submit waiting in decode's admission queue; ``admitted`` gets the core's reply."""

    event: dc.SubmitRequest
    need: int
    admitted: asyncio.Future[Reply]


class DecodeServer(BaseServer):
    role = "decode"
    allowed_roles: ClassVar[dict[str, frozenset[str]]] = {
        "Submit": frozenset({"router"}),
        "Cancel": frozenset({"router"}),
        "WritePages": frozenset({"prefill"}),
        "Complete": frozenset({"prefill"}),
        "Reject": frozenset({"prefill"}),
        "ReceiveAbortAck": frozenset({"prefill"}),
    }

    def __init__(self, settings: DecodeSettings, mode: Mode, event_log: EventLog | None = None):
        s = settings
        self.settings = s
        config = dc.DecodeConfig(
            num_pages=s.num_pages,
            page_size=s.shape.page_size,
            max_prompt_tokens=s.max_prompt_tokens,
            waiting_timeout_s=s.waiting_timeout_s,
            abort_retry_s=s.abort_retry_s,
            release_timeout_s=s.release_timeout_s,
            prefill_dead_after_misses=s.prefill_dead_after_misses,
            behaviour=mode.behaviour,
        )
        log_config = {
            "num_pages": s.num_pages,
            "page_size": s.shape.page_size,
            "layers": s.shape.layers,
            "heads": s.shape.heads,
            "head_dim": s.shape.head_dim,
            "max_prompt_tokens": s.max_prompt_tokens,
            "context_window": s.context_window,
            "waiting_timeout_s": s.waiting_timeout_s,
        }
        super().__init__(s.common, mode, log_config, event_log)
        self.boot = next_boot(s.state_dir)
        self.core = dc.DecodeCore(config, generation_base=self.boot << 32)
        self.device = resolve_device(s.device)
        self.pool = PagePool(s.shape, s.num_pages, self.device)
        self.model = CopyHeadModel(s.shape, self.device)
        self.transport: Transport = open_transport(s.transport)
        # One-sided transports write into this landing pool (one wire-layout slot per page id),
        # never into `self.pool`: decode copies a slot out, checks the copy, and stores only an
        # accepted copy, so a write that lands late or in the wrong slot is never read.
        self.landing: torch.Tensor | None = None
        if isinstance(self.transport, OneSidedTransport):
            self.landing = torch.zeros((s.num_pages, *s.shape.page_shape), dtype=self.pool.k.dtype)
            self.transport.register(
                self.landing.data_ptr(), self.landing.numel() * self.landing.element_size()
            )
        self._waiters: dict[RequestId, asyncio.Future[tuple[Status, str]]] = {}
        self._answers: dict[RequestId, list[int]] = {}
        self.validation_seconds = 0.0  # digest + coverage checks, for the transfer benchmark
        # Handoff timing for the benchmark: write stream opened -> validated completion.
        # Samples are (pages, bytes, seconds).
        self._handoff_started: dict[RequestId, float] = {}
        self.handoff_samples: deque[tuple[int, int, float]] = deque(maxlen=1024)
        self.queue: AdmissionQueue[_Waiting] = AdmissionQueue(
            s.admission_queue_len, s.admission_timeout_s
        )
        self._queued: dict[RequestId, Entry[_Waiting]] = {}
        self._pumping = False
        # Each prefill instance's prompt limit, from its Info (heartbeat).
        self.prefill_max_prompts: dict[int, int] = {}
        self.metrics.gauge("kvhandoff_admission_queue_length", lambda: float(len(self.queue)))
        self.metrics.gauge("kvhandoff_pages_free", lambda: float(self.core.free_pages))
        self.metrics.gauge("kvhandoff_pages_used", lambda: float(self.core.used_pages))
        self.metrics.gauge("kvhandoff_validation_seconds_total", lambda: self.validation_seconds)

    def _register(self, server: grpc.aio.Server) -> None:
        rpc.add_decode(self, server)

    async def start(self) -> None:
        await super().start()
        if self.boot > 1:
            # Several decode instances log into files of their own: the line names its
            # instance (absent: instance 0, as docs/event-log.md says).
            where = {"decode_instance": self.settings.instance} if self.settings.instance else {}
            self.log_event("decode_restart", boot=self.boot, boot_epoch=self.boot_epoch, **where)
        for prefill in range(len(self.settings.prefill_addresses)):
            self.spawn(self._heartbeat(prefill))

    async def stop(self, grace: float | None = 1.0) -> None:
        await super().stop(grace)
        self.transport.close()

    # -------------------------------------------------------------- core driving

    def feed(self, event: dc.DecodeEvent) -> list[dc.DecodeCommand]:
        """Hand ``event`` to the core and run its commands; Reply and StorePage are returned to
        the caller (they concern the call being handled)."""
        keep: list[dc.DecodeCommand] = []
        released = False
        t0 = time.thread_time()
        cmds = self.core.handle(event)
        if isinstance(event, dc.WriteReceived | dc.CompletionReceived):
            # The core's checks of writes and completions are the protocol's validation cost
            # (CPU time of this thread: wall time would also count preemption by other work).
            self.validation_seconds += time.thread_time() - t0
        for cmd in cmds:
            match cmd:
                case Log():
                    self.log(cmd)
                case Reply() | dc.StorePage():
                    keep.append(cmd)
                case dc.SendGrant():
                    self.spawn(self._send_grant(cmd))
                case dc.SendAbort():
                    self.spawn(self._send_abort(cmd))
                case dc.ReleasePages():
                    if cmd.scrub:
                        self.pool.scrub(cmd.pages)
                        if self.landing is not None:
                            # Never read, but it held a tenant's data: scrub it like the pool.
                            self.landing[list(cmd.pages)] = 0
                    released = True
                case dc.Generate():
                    asyncio.get_running_loop().call_soon(self._generate, cmd)
                case dc.AnswerRequest():
                    fut = self._waiters.get(cmd.request_id)
                    if fut is not None and not fut.done():
                        fut.set_result((cmd.status, cmd.message))
        if released:
            self._pump()
        return keep

    # -------------------------------------------------------------- admission queue

    def _pump(self) -> None:
        """Hand waiting submits to the core while their pages are free, tenants in turn."""
        if self._pumping:
            return
        self._pumping = True
        try:
            while True:
                entry = self.queue.pop_admissible(lambda w: w.need <= self.core.free_pages)
                if entry is None:
                    return
                self._admit(entry, "")
        finally:
            self._pumping = False

    def _admit(self, entry: Entry[_Waiting], why_late: str) -> None:
        """Feed a queued submit to the core now (it fits, or it has waited long enough and the
        core decides), and hand the core's reply to the waiting call."""
        w = entry.item
        self._queued.pop(w.event.request_id, None)
        waited = time.monotonic() - entry.enqueued
        self.metrics.inc("kvhandoff_admission_wait_seconds_total", waited)
        self.metrics.inc("kvhandoff_admission_admitted_total")
        ev = dc.SubmitRequest(
            w.event.request_id,
            w.event.tenant,
            w.event.room,
            w.event.prompt_len,
            w.event.max_tokens,
            w.event.token,
            time.monotonic(),
            w.event.attempt,
            w.event.prefill,
        )
        reply = self.reply_of(self.feed(ev))
        if reply.status is not Status.OK and why_late:
            if self.core.prefill_dead_of(w.event.prefill):
                # The pages are held by requests whose prefill is gone: say so, not only "0 free".
                why_late += " (prefill is not answering decode's health checks)"
            reply = Reply(reply.status, f"{why_late}: {reply.message}")
        if not w.admitted.done():
            w.admitted.set_result(reply)

    def _admit_now(self, request_id: RequestId) -> None:
        """A cancel or a rejection for a queued request: the core decides it at once."""
        entry = self._queued.get(request_id)
        if entry is not None and self.queue.remove(entry):
            self._admit(entry, "")

    def _queue_or_feed(self, ev: dc.SubmitRequest) -> Reply | asyncio.Future[Reply]:
        """The core's reply now, or a future of it when the request waits in the queue."""
        cfg = self.core.config
        valid = 1 <= ev.prompt_len <= cfg.max_prompt_tokens and (
            1 <= ev.max_tokens <= cfg.max_new_tokens
        )
        need = pages_for(ev.prompt_len, cfg.page_size) if valid else 0
        # Over prefill's limit (in a mode whose prefill rejects such prompts): reserve nothing
        # and wait for prefill's rejection, which decides the request (an early rejection).
        b = self.mode.behaviour
        prefill_rejects = not (b.placeholder_rejection or b.truncate_oversized)
        limit = self.prefill_max_prompts.get(ev.prefill)
        held = valid and prefill_rejects and limit is not None and ev.prompt_len > limit
        must_wait = held or (valid and (need > self.core.free_pages or len(self.queue) > 0))
        if not must_wait or self.queue.max_len == 0:
            return self.reply_of(self.feed(ev))
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        entry = self.queue.push(ev.tenant, _Waiting(ev, need, fut), time.monotonic(), held=held)
        if entry is None:
            self.metrics.inc("kvhandoff_admission_refused_total", reason="queue_full")
            reply = self.reply_of(self.feed(ev))
            if reply.status is Status.RESOURCE_EXHAUSTED:
                reply = Reply(
                    reply.status,
                    f"admission queue full ({len(self.queue)} waiting): {reply.message}",
                )
            return reply
        self._queued[ev.request_id] = entry
        self._pump()
        return fut

    @staticmethod
    def reply_of(cmds: Sequence[dc.DecodeCommand]) -> Reply:
        for c in cmds:
            if isinstance(c, Reply):
                return c
        return Reply(Status.OK)

    async def _on_tick(self, now: float) -> None:
        self.feed(dc.Tick(now))
        for entry in self.queue.expired(now):
            self.metrics.inc("kvhandoff_admission_refused_total", reason="deadline")
            self._admit(entry, f"waited {self.queue.timeout_s:g}s in decode's admission queue")

    def _stub(self, prefill: int) -> Any:
        return rpc.prefill_stub(self.channel(self.settings.prefill_addresses[prefill]))

    async def _heartbeat(self, prefill: int) -> None:
        while not self._stopping:
            epoch: int | None
            try:
                info = await self._stub(prefill).Info(
                    pb.InfoRequest(), timeout=max(self.settings.heartbeat_interval_s, 0.5)
                )
                epoch = int(info.boot_epoch)
                limit = int(info.max_prompt_tokens)
                if limit:
                    self.prefill_max_prompts[prefill] = limit
                else:
                    self.prefill_max_prompts.pop(prefill, None)
            except grpc.RpcError:
                epoch = None
            self.feed(dc.PrefillHeartbeat(epoch, time.monotonic(), prefill))
            await asyncio.sleep(self.settings.heartbeat_interval_s)

    async def _send_grant(self, cmd: dc.SendGrant) -> None:
        grant = pb.Grant(
            request_id=cmd.request_id,
            room=cmd.room,
            generation=cmd.generation,
            page_ids=list(cmd.pages),
            token=cmd.token,
            prompt_tokens=cmd.prompt_len,
            attempt=cmd.attempt,
            decode_instance=self.settings.instance,
        )
        if isinstance(self.transport, OneSidedTransport) and self.landing is not None:
            grant.transfer_endpoint = self.transport.endpoint
            grant.transfer_base = self.landing.data_ptr()
            grant.transfer_slot_bytes = self.settings.shape.page_bytes
        status, message, ack = await self.send_control(
            "grant",
            lambda: self._stub(cmd.prefill).ReceiveGrant(
                grant, timeout=self.common.rpc_timeout_s, wait_for_ready=True
            ),
        )
        if ack is None or status is not Status.OK:
            if not self._stopping:
                self.feed(dc.GrantFailed(cmd.request_id, cmd.generation, message, time.monotonic()))
            return
        if not self._stopping:
            self.feed(
                dc.GrantDelivered(
                    cmd.request_id,
                    cmd.generation,
                    int(ack.boot_epoch),
                    time.monotonic(),
                    cmd.prefill,
                )
            )

    async def _send_abort(self, cmd: dc.SendAbort) -> None:
        # A lost abort is retried by the core (Tick), so failures need no handling here.
        abort = pb.Abort(
            request_id=cmd.request_id,
            room=cmd.room,
            generation=cmd.generation,
            token=cmd.token,
            attempt=cmd.attempt,
            decode_instance=self.settings.instance,
        )
        await self.send_control(
            "abort",
            lambda: self._stub(cmd.prefill).ReceiveAbort(
                abort, timeout=self.common.rpc_timeout_s, wait_for_ready=True
            ),
        )

    def _generate(self, cmd: dc.Generate) -> None:
        if cmd.request_id not in self._waiters:
            return
        k, v = self.pool.gather(cmd.pages)
        tokens = self.model.decode(k, v, cmd.prompt_len, cmd.max_tokens)
        self._answers[cmd.request_id] = tokens
        self.feed(dc.GenerationFinished(cmd.request_id, cmd.generation, len(tokens)))

    # -------------------------------------------------------------- RPCs

    async def Submit(
        self, request: pb.DecodeSubmitRequest, context: grpc.aio.ServicerContext
    ) -> pb.DecodeSubmitResponse:
        await check_bounds(context, request)
        await self.refuse_crossed_hand_over(context, request)
        rid = RequestId(request.request_id)
        if not 0 < len(rid) <= MAX_REQUEST_ID:
            await abort_with(
                context,
                Reply(
                    Status.INVALID_ARGUMENT,
                    f"request id {rid!r} must be 1..{MAX_REQUEST_ID} characters",
                ),
            )
        if not 0 < len(request.tenant) <= MAX_TENANT:
            await abort_with(
                context,
                Reply(
                    Status.INVALID_ARGUMENT,
                    f"tenant {request.tenant!r} must be 1..{MAX_TENANT} characters",
                ),
            )
        await refuse_unknown_instance(
            context,
            "prefill instance",
            request.prefill_instance,
            len(self.settings.prefill_addresses),
            "decode",
        )
        if rid in self._waiters:
            await abort_with(
                context, Reply(Status.ALREADY_EXISTS, f"request {rid!r} is already active")
            )
        fut: asyncio.Future[tuple[Status, str]] = asyncio.get_running_loop().create_future()
        self._waiters[rid] = fut
        try:
            first = self._queue_or_feed(
                dc.SubmitRequest(
                    rid,
                    Tenant(request.tenant),
                    Room(request.room),
                    int(request.prompt_tokens),
                    int(request.max_tokens),
                    secrets.token_bytes(16),
                    time.monotonic(),
                    int(request.attempt),
                    int(request.prefill_instance),
                )
            )
            if isinstance(first, Reply):
                reply = first
            else:
                try:
                    reply = await first
                except asyncio.CancelledError:
                    entry = self._queued.pop(rid, None)
                    if entry is not None:
                        self.queue.remove(entry)  # never reached the core: nothing to undo
                    raise
            if reply.status is not Status.OK:
                await abort_with(context, reply)
            try:
                status, message = await fut
            except asyncio.CancelledError:
                if not self._stopping:
                    self.feed(
                        dc.CancelRequest(
                            rid,
                            "the router's call went away",
                            time.monotonic(),
                            int(request.attempt),
                        )
                    )
                raise
        finally:
            self._waiters.pop(rid, None)
        tokens = self._answers.pop(rid, [])
        if status is not Status.OK:
            await abort_with(context, Reply(status, message))
        return pb.DecodeSubmitResponse(request_id=rid, tokens=tokens)

    def _shape_problem(self, msg: pb.PageWrite) -> str:
        shape = self.settings.shape
        n = len(msg.page_ids)
        if msg.landed:
            if self.landing is None:
                return "a landed-pages notice, but this decode runs the in-band grpc transport"
            if msg.data:
                return f"a landed-pages notice carries {len(msg.data)} bytes of data (must be 0)"
        if tuple(msg.page_shape) != shape.page_shape:
            return f"page shape {list(msg.page_shape)} is not the pool's {list(shape.page_shape)}"
        if msg.dtype != DTYPE_NAME:
            return f"dtype {msg.dtype!r} is not the pool's {DTYPE_NAME!r}"
        if not msg.landed and len(msg.data) != n * shape.page_bytes:
            return f"data of {len(msg.data)} bytes is not {n} pages of {shape.page_bytes} bytes"
        if len(msg.digests) != n:
            return f"{len(msg.digests)} digests for {n} pages"
        return ""

    async def WritePages(
        self, request_iterator: AsyncIterator[pb.PageWrite], context: grpc.aio.ServicerContext
    ) -> pb.WriteSummary:
        accepted = 0
        page_bytes = self.settings.shape.page_bytes
        # The handoff clock starts when the stream opens (headers in), before the first page has
        # crossed the wire, so the transfer of every message counts.
        opened = time.perf_counter()
        async for msg in request_iterator:
            if len(self._handoff_started) > 4096:
                self._handoff_started.clear()  # only failed transfers leave entries behind
            await check_bounds(context, msg)
            self._handoff_started.setdefault(RequestId(msg.request_id), opened)
            if not msg.page_ids:
                await abort_with(
                    context,
                    Reply(
                        Status.INVALID_ARGUMENT, f"write message {msg.message_id} carries no pages"
                    ),
                )
            problem = self._shape_problem(msg)
            landed: list[torch.Tensor | None] = []
            t0 = time.thread_time()
            if msg.landed and not problem:
                landed = self._copy_landed(msg.page_ids)
                digests = [page_digest(tensor_bytes(t)) if t is not None else b"" for t in landed]
            else:
                data = memoryview(msg.data)
                digests = [
                    page_digest(data[i * page_bytes : (i + 1) * page_bytes]) if not problem else b""
                    for i in range(len(msg.page_ids))
                ]
            self.validation_seconds += time.thread_time() - t0
            stores: list[tuple[int, int]] = []
            for i, page in enumerate(msg.page_ids):
                cmds = self.feed(
                    dc.WriteReceived(
                        RequestId(msg.request_id),
                        Room(msg.room),
                        Generation(msg.generation),
                        msg.token,
                        int(page),
                        int(msg.message_id),
                        digests[i],
                        msg.digests[i] if i < len(msg.digests) else b"",
                        problem,
                        int(msg.attempt),
                    )
                )
                reply = self.reply_of(cmds)
                if reply.status is not Status.OK:
                    if stores:
                        self._store(msg, stores, landed)
                    await abort_with(context, reply)
                if any(isinstance(c, dc.StorePage) for c in cmds):
                    stores.append((i, int(page)))
            if stores:
                self._store(msg, stores, landed)
                accepted += len(stores)
                if msg.landed:
                    self.metrics.inc("kvhandoff_landed_pages_total", len(stores))
        return pb.WriteSummary(pages_accepted=accepted)

    def _copy_landed(self, page_ids: Sequence[int]) -> list[torch.Tensor | None]:
        """Private copies of the landing slots of ``page_ids`` (None for an id outside the pool,
        which the core refuses). The digest is taken of the copy and the copy is what gets stored:
        a one-sided write landing in the slot meanwhile cannot change what was checked."""
        assert self.landing is not None
        n = self.settings.num_pages
        return [self.landing[p].clone() if p < n else None for p in page_ids]

    def _store(
        self, msg: pb.PageWrite, stores: list[tuple[int, int]], landed: list[torch.Tensor | None]
    ) -> None:
        if msg.landed:
            copies = [landed[i] for i, _ in stores]
            self.pool.store(
                [p for _, p in stores], torch.stack([c for c in copies if c is not None])
            )
            return
        view = tensor_from_bytes(msg.data, len(msg.page_ids), self.settings.shape)
        idx = [i for i, _ in stores]
        data = view if len(idx) == len(msg.page_ids) else view[idx]
        self.pool.store([p for _, p in stores], data)

    async def Complete(
        self, request: pb.Completion, context: grpc.aio.ServicerContext
    ) -> pb.CompletionVerdict:
        await check_bounds(context, request)
        cmds = self.feed(
            dc.CompletionReceived(
                RequestId(request.request_id),
                Room(request.room),
                Generation(request.generation),
                request.token,
                int(request.page_count),
                request.digest,
                int(request.attempt),
            )
        )
        done = time.perf_counter()
        started = self._handoff_started.pop(RequestId(request.request_id), None)
        reply = self.reply_of(cmds)
        if reply.status is not Status.OK:
            await abort_with(context, reply)
        if started is not None:
            pages = int(request.page_count)
            nbytes = pages * self.settings.shape.page_bytes
            self.handoff_samples.append((pages, nbytes, done - started))
            self.metrics.inc("kvhandoff_handoffs_total")
            self.metrics.inc("kvhandoff_handoff_seconds_total", done - started)
            self.metrics.inc("kvhandoff_handoff_pages_total", pages)
            self.metrics.inc("kvhandoff_handoff_bytes_total", nbytes)
        return pb.CompletionVerdict(validated=True)

    async def Reject(
        self, request: pb.Rejection, context: grpc.aio.ServicerContext
    ) -> pb.RejectionAck:
        await check_bounds(context, request)
        try:
            status = Status[request.code]
        except KeyError:
            await abort_with(
                context, Reply(Status.INVALID_ARGUMENT, f"unknown status code {request.code!r}")
            )
        reply = self.reply_of(
            self.feed(
                dc.RejectionReceived(
                    RequestId(request.request_id),
                    Room(request.room),
                    status,
                    request.reason,
                    int(request.attempt),
                )
            )
        )
        self._admit_now(RequestId(request.request_id))
        if reply.status is not Status.OK:
            await abort_with(context, reply)
        return pb.RejectionAck()

    async def ReceiveAbortAck(
        self, request: pb.AbortAck, context: grpc.aio.ServicerContext
    ) -> pb.AbortAckResponse:
        await check_bounds(context, request)
        reply = self.reply_of(
            self.feed(
                dc.AbortAckReceived(
                    RequestId(request.request_id),
                    Room(request.room),
                    Generation(request.generation),
                    request.token,
                    int(request.attempt),
                )
            )
        )
        if reply.status is not Status.OK:
            await abort_with(context, reply)
        return pb.AbortAckResponse()

    def cancel(
        self, request_id: RequestId, reason: str, caller: Identity | None = None, attempt: int = 0
    ) -> Reply:
        reply = self.reply_of(
            self.feed(
                dc.CancelRequest(request_id, reason or "cancelled", time.monotonic(), attempt)
            )
        )
        self._admit_now(request_id)
        return reply

    def info_fields(self) -> dict[str, int]:
        return {
            "max_prompt_tokens": self.settings.max_prompt_tokens,
            "context_window": self.settings.context_window,
            "page_size": self.settings.shape.page_size,
            "num_pages": self.settings.num_pages,
        }
