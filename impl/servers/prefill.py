"""Prefill's gRPC edge: computes K/V with the model and streams pages to decode for the core."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

import grpc
import grpc.aio
import torch

from kvhandoff.impl.core import prefill as pc
from kvhandoff.impl.core.common import (
    Generation,
    Log,
    PageId,
    Reply,
    RequestId,
    Room,
    Status,
    Tenant,
    pages_for,
)
from kvhandoff.impl.errors import TransportError
from kvhandoff.impl.eventlog import EventLog
from kvhandoff.impl.model import CopyHeadModel
from kvhandoff.impl.modes import Mode
from kvhandoff.impl.pool import (
    DTYPE_NAME,
    PoolShape,
    page_digest,
    resolve_device,
    tensor_bytes,
    wire_pages,
)
from kvhandoff.impl.proto import rpc
from kvhandoff.impl.proto.gen.kvhandoff.v1 import handoff_pb2 as pb
from kvhandoff.impl.servers.base import (
    BaseServer,
    CommonSettings,
    abort_with,
    check_bounds,
    refuse_unknown_instance,
    status_of,
)
from kvhandoff.impl.tls import Identity
from kvhandoff.impl.tokenizer import PLACEHOLDER_TOKEN, VOCAB_SIZE
from kvhandoff.impl.transport import OneSidedTransport, Transport, WriteOp, open_transport

WRITE_PAGES = "/kvhandoff.v1.Decode/WritePages"


# How many recent grants prefill remembers the sender of (a few bytes each).
MAX_REMEMBERED_GRANTS = 65536


@dataclass(frozen=True)
class _Batch:
    """One serialised write message and the pages it carries."""

    message_id: int
    start: int  # index of its first page in the grant
    pages: Sequence[PageId]
    digests: list[bytes]
    payload: bytes
    ops: list[WriteOp] = field(default_factory=list)  # one-sided writes to do before the notice


@dataclass(frozen=True)
class _Destination:
    """Where a one-sided transport writes a grant's pages (from the grant)."""

    endpoint: str
    base: int
    slot_bytes: int


@dataclass(frozen=True)
class PrefillSettings:
    common: CommonSettings
    # One address per decode instance, in instance order: a grant names the instance that sent
    # it, and a submit the instance the router placed the request on.
    decode_addresses: tuple[str, ...]
    instance: int = 0  # this prefill's instance number, which its restart line names
    shape: PoolShape = field(default_factory=PoolShape)
    num_pages: int = 64
    max_prompt_tokens: int = 256
    context_window: int = 256
    pages_per_message: int = 16
    write_delay_s: float = 0.0  # pause between write messages (tests use it to open a window)
    orphan_grant_timeout_s: float = 10.0
    grant_timeout_s: float | None = 60.0  # an admitted request without a grant fails then
    device: str = "auto"
    transport: str = "grpc"  # how page data leaves: impl.transport.TRANSPORT_NAMES


class PrefillServer(BaseServer):
    role = "prefill"
    allowed_roles: ClassVar[dict[str, frozenset[str]]] = {
        "Submit": frozenset({"router"}),
        "Cancel": frozenset({"router"}),
        "ReceiveGrant": frozenset({"decode"}),
        "ReceiveAbort": frozenset({"decode"}),
    }

    def __init__(
        self,
        settings: PrefillSettings,
        mode: Mode,
        event_log: EventLog | None = None,
        restarted: bool = False,
    ):
        s = settings
        self.settings = s
        self.restarted = restarted
        log_config = {
            "num_pages": s.num_pages,
            "page_size": s.shape.page_size,
            "layers": s.shape.layers,
            "heads": s.shape.heads,
            "head_dim": s.shape.head_dim,
            "max_prompt_tokens": s.max_prompt_tokens,
            "context_window": s.context_window,
            "pages_per_message": s.pages_per_message,
        }
        super().__init__(s.common, mode, log_config, event_log)
        self.core = pc.PrefillCore(
            pc.PrefillConfig(
                page_size=s.shape.page_size,
                max_prompt_tokens=s.max_prompt_tokens,
                orphan_grant_timeout_s=s.orphan_grant_timeout_s,
                grant_timeout_s=s.grant_timeout_s,
                behaviour=mode.behaviour,
            )
        )
        self.max_grant_pages = pages_for(
            max(s.context_window, s.max_prompt_tokens), s.shape.page_size
        )
        self.device = resolve_device(s.device)
        self.model = CopyHeadModel(s.shape, self.device)
        self.transport: Transport = open_transport(s.transport)
        self._destinations: dict[tuple[RequestId, int], _Destination] = {}
        # The drain fence of one-sided writes: a write already handed to the transport cannot be
        # called back, so a writer that is stopped waits for these before reporting its writes
        # finished (which is what lets the core ack an abort, and decode reuse the pages).
        self._in_flight: dict[tuple[RequestId, int], set[asyncio.Future[None]]] = {}
        self._write_errors: dict[tuple[RequestId, int], str] = {}
        self._prompts: dict[RequestId, list[int]] = {}
        self._waiters: dict[RequestId, asyncio.Future[tuple[Status, str]]] = {}
        self._writers: dict[tuple[RequestId, int], asyncio.Task[None]] = {}
        # Fault injection for tests: request id -> number of write messages after which its
        # writes pause until the entry is removed (opens a reliable "mid-transfer" window).
        self.stall_after: dict[RequestId, int] = {}
        self._stopped_writes: set[tuple[RequestId, int]] = set()
        self.digest_seconds = 0.0  # sender-side digests, for the transfer benchmark
        # Which decode instance each message goes to: the one that sent the grant (for the
        # writes, the completion and the drain ack), else the one the router placed the request
        # on (a rejection before any grant). The sender of each recent grant and abort is
        # remembered (a bounded number): an ack can follow a request's answer, so they are not
        # dropped with it, and an abort names its sender, so that a restarted prefill acks it to
        # the right instance.
        self._placed_decode: dict[RequestId, int] = {}
        self._grant_sender: OrderedDict[tuple[RequestId, int], int] = OrderedDict()
        self.metrics.gauge("kvhandoff_parked_grants", lambda: float(self.core.parked_grants))
        self.metrics.gauge("kvhandoff_sender_digest_seconds_total", lambda: self.digest_seconds)

    def _register(self, server: grpc.aio.Server) -> None:
        rpc.add_prefill(self, server)

    async def start(self) -> None:
        await super().start()
        if self.restarted or self.event_log.resumed:
            where = {"prefill_instance": self.settings.instance} if self.settings.instance else {}
            self.log_event("prefill_restart", boot_epoch=self.boot_epoch, **where)

    async def stop(self, grace: float | None = 1.0) -> None:
        await super().stop(grace)
        self.transport.close()

    # -------------------------------------------------------------- core driving

    def _remember_sender(self, rid: RequestId, generation: int, decode: int) -> None:
        key = (rid, generation)
        self._grant_sender[key] = decode
        self._grant_sender.move_to_end(key)
        while len(self._grant_sender) > MAX_REMEMBERED_GRANTS:
            self._grant_sender.popitem(last=False)

    def _decode_for(self, rid: RequestId, generation: int | None = None) -> int:
        """The decode instance a message about `rid` (and that grant) goes to."""
        sender = self._grant_sender.get((rid, generation)) if generation is not None else None
        return sender if sender is not None else self._placed_decode.get(rid, 0)

    def feed(self, event: pc.PrefillEvent) -> Reply:
        reply = Reply(Status.OK)
        answered: list[RequestId] = []
        for cmd in self.core.handle(event):
            match cmd:
                case Log():
                    self.log(cmd)
                case Reply():
                    reply = cmd
                case pc.StartWrites():
                    key = (cmd.request_id, int(cmd.generation))
                    task = self.spawn(self._write(cmd))
                    self._writers[key] = task
                    task.add_done_callback(partial(self._writer_done, cmd))
                case pc.CancelWrites():
                    key = (cmd.request_id, int(cmd.generation))
                    writer = self._writers.get(key)
                    if writer is not None:
                        # The stream iterator may be consumed by gRPC outside the task: stop it
                        # putting pages on the wire too.
                        self._stopped_writes.add(key)
                        writer.cancel()
                case pc.SendCompletion():
                    to = self._decode_for(cmd.request_id, int(cmd.generation))
                    self.spawn(self._send_completion(cmd, to))
                case pc.SendRejection():
                    self.spawn(self._send_rejection(cmd, self._decode_for(cmd.request_id)))
                case pc.SendAbortAck():
                    to = self._decode_for(cmd.request_id, int(cmd.generation))
                    self.spawn(self._send_abort_ack(cmd, to))
                case pc.AnswerRequest():
                    answered.append(cmd.request_id)
                    fut = self._waiters.get(cmd.request_id)
                    if fut is not None and not fut.done():
                        fut.set_result((cmd.status, cmd.message))
                    self._prompts.pop(cmd.request_id, None)
                    for key in [k for k in self._destinations if k[0] == cmd.request_id]:
                        if key not in self._writers:
                            del self._destinations[key]
        for rid in answered:  # after the loop: the commands before the answer still named it
            self._placed_decode.pop(rid, None)
        return reply

    def _writer_done(self, cmd: pc.StartWrites, task: asyncio.Task[Any]) -> None:
        # A writer cancelled before its first step never runs `_write`'s own reporting: the
        # stream is closed all the same, so say so (otherwise the abort is never acked).
        key = (cmd.request_id, int(cmd.generation))
        if self._writers.get(key) is task and task.cancelled() and not self._stopping:
            del self._writers[key]
            self._stopped_writes.discard(key)
            self.feed(
                pc.WritesFinished(
                    cmd.request_id, cmd.generation, Status.CANCELLED, "writes cancelled"
                )
            )

    async def _on_tick(self, now: float) -> None:
        self.feed(pc.Tick(now))

    def _stub(self, decode: int) -> Any:
        return rpc.decode_stub(self.channel(self.settings.decode_addresses[decode]))

    async def _write(self, cmd: pc.StartWrites) -> None:
        rid, gen = cmd.request_id, cmd.generation
        key = (rid, int(gen))
        status, message = Status.OK, ""
        try:
            prompt = self._prompts.get(rid, [])
            tokens = [PLACEHOLDER_TOKEN] if cmd.placeholder else prompt[: cmd.prompt_len]
            k, v = self.model.prefill(tokens)
            wire = wire_pages(k, v, self.settings.shape)
            dest = self._destinations.get(key)
            if isinstance(self.transport, OneSidedTransport) and dest is None:
                raise TransportError(
                    f"prefill runs the {self.transport.name} transport but decode's grant for "
                    f"{rid!r} names no landing pool (is decode running --transport grpc?)"
                )
            batches = self._encode(cmd, wire, dest)
            address = self.settings.decode_addresses[self._decode_for(rid, int(gen))]
            write_pages = self.channel(address).stream_unary(
                WRITE_PAGES,
                request_serializer=None,
                response_deserializer=pb.WriteSummary.FromString,
            )
            await write_pages(
                self._stream(cmd, batches, wire),
                timeout=self.common.rpc_timeout_s,
                wait_for_ready=True,
            )
            if key in self._write_errors:
                status, message = Status.UNAVAILABLE, self._write_errors[key]
        except asyncio.CancelledError:
            if self._stopping:
                raise  # a crash: nothing more leaves this process
            status, message = Status.CANCELLED, "writes cancelled"
        except grpc.RpcError as exc:
            status, message = status_of(exc)
        except TransportError as exc:
            status, message = Status.FAILED_PRECONDITION, str(exc)
        finally:
            self._writers.pop(key, None)
            self._stopped_writes.discard(key)
            self._destinations.pop(key, None)
            self._write_errors.pop(key, None)
        if not self._stopping:
            await self._drain(key)
        if not self._stopping:
            self.feed(pc.WritesFinished(rid, gen, status, message))

    async def _drain(self, key: tuple[RequestId, int]) -> None:
        """Wait until no one-sided write of ``key`` is in flight (the drain fence)."""
        pending = self._in_flight.pop(key, set())
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def _write_one_sided(
        self, key: tuple[RequestId, int], dest: _Destination, batch: _Batch, wire: torch.Tensor
    ) -> bool:
        """Do ``batch``'s one-sided writes; False (and the error recorded) if they failed."""
        transport = self.transport
        assert isinstance(transport, OneSidedTransport)

        def write() -> None:
            _ = wire  # keeps the source pages alive while the transport reads them
            transport.write(dest.endpoint, batch.ops)

        fut = asyncio.get_running_loop().run_in_executor(None, write)
        self._in_flight.setdefault(key, set()).add(fut)
        try:
            # Shielded: cancelling the writer must not forget a write the transport still does.
            await asyncio.shield(fut)
        except TransportError as exc:
            self._write_errors[key] = str(exc)
            return False
        finally:
            if fut.done():
                self._in_flight.get(key, set()).discard(fut)
        return True

    def _encode(
        self, cmd: pc.StartWrites, wire: torch.Tensor, dest: _Destination | None = None
    ) -> list[_Batch]:
        """Serialise every write message up front, as part of producing the KV: the stream then
        only moves ready buffers (like an RDMA write from registered memory). With a one-sided
        destination the messages are data-less notices and each batch carries its writes."""
        shape = self.settings.shape
        step = max(1, self.settings.pages_per_message)
        page_bytes = shape.page_bytes
        batches: list[_Batch] = []
        for message_id, start in enumerate(range(0, len(cmd.pages), step)):
            pages = cmd.pages[start : start + step]
            data = tensor_bytes(wire[start : start + len(pages)])
            ops: list[WriteOp] = []
            if dest is not None:
                src = wire.data_ptr() + start * page_bytes
                ops = [
                    WriteOp(src + i * page_bytes, dest.base + p * dest.slot_bytes, page_bytes)
                    for i, p in enumerate(pages)
                ]
            t0 = time.thread_time()
            view = memoryview(data)
            digests = [
                page_digest(view[i * page_bytes : (i + 1) * page_bytes]) for i in range(len(pages))
            ]
            self.digest_seconds += time.thread_time() - t0
            msg = pb.PageWrite(
                request_id=cmd.request_id,
                room=cmd.room,
                generation=cmd.generation,
                token=cmd.token,
                attempt=cmd.attempt,
                message_id=message_id,
                page_ids=list(pages),
                digests=digests,
                page_shape=list(shape.page_shape),
                dtype=DTYPE_NAME,
                data=b"" if dest is not None else data,
                landed=dest is not None,
            )
            batches.append(_Batch(message_id, start, pages, digests, msg.SerializeToString(), ops))
        return batches

    async def _stream(
        self, cmd: pc.StartWrites, batches: list[_Batch], wire: torch.Tensor
    ) -> AsyncIterator[bytes]:
        key = (cmd.request_id, int(cmd.generation))
        dest = self._destinations.get(key)
        for batch in batches:
            if key in self._stopped_writes:
                return
            if batch.message_id and self.settings.write_delay_s:
                await asyncio.sleep(self.settings.write_delay_s)
            while self.stall_after.get(cmd.request_id, len(batches) + 1) <= batch.message_id:
                await asyncio.sleep(0.01)
            if key in self._stopped_writes:
                return
            for i, page in enumerate(batch.pages):
                self.feed(
                    pc.PageSent(
                        cmd.request_id,
                        cmd.generation,
                        page,
                        batch.start + i,
                        batch.digests[i],
                        batch.message_id,
                    )
                )
            if batch.ops and dest is not None:
                if not await self._write_one_sided(key, dest, batch, wire):
                    return
                if key in self._stopped_writes:
                    return  # stopped while the pages were on the wire: no notice for them
            yield batch.payload

    async def _send_completion(self, cmd: pc.SendCompletion, decode: int) -> None:
        completion = pb.Completion(
            request_id=cmd.request_id,
            room=cmd.room,
            generation=cmd.generation,
            token=cmd.token,
            page_count=cmd.page_count,
            digest=cmd.digest,
            attempt=cmd.attempt,
        )
        status, message, _ = await self.send_control(
            "completion",
            lambda: self._stub(decode).Complete(
                completion, timeout=self.common.rpc_timeout_s, wait_for_ready=True
            ),
        )
        if not self._stopping:
            self.feed(pc.CompletionAnswered(cmd.request_id, cmd.generation, status, message))

    async def _send_rejection(self, cmd: pc.SendRejection, decode: int) -> None:
        rejection = pb.Rejection(
            request_id=cmd.request_id,
            room=cmd.room,
            code=cmd.status.value,
            reason=cmd.reason,
            attempt=cmd.attempt,
        )
        status, message, _ = await self.send_control(
            "rejection",
            lambda: self._stub(decode).Reject(
                rejection, timeout=self.common.rpc_timeout_s, wait_for_ready=True
            ),
        )
        if status is not Status.OK:
            self.log_event(
                "prefill_notice_failed", request_id=cmd.request_id, code=status.value, error=message
            )

    async def _send_abort_ack(self, cmd: pc.SendAbortAck, decode: int) -> None:
        ack = pb.AbortAck(
            request_id=cmd.request_id,
            room=cmd.room,
            generation=cmd.generation,
            token=cmd.token,
            attempt=cmd.attempt,
        )
        await self.send_control(
            "abort_ack",
            lambda: self._stub(decode).ReceiveAbortAck(
                ack, timeout=self.common.rpc_timeout_s, wait_for_ready=True
            ),
        )

    # -------------------------------------------------------------- RPCs

    async def Submit(
        self, request: pb.PrefillSubmitRequest, context: grpc.aio.ServicerContext
    ) -> pb.PrefillSubmitResponse:
        await check_bounds(context, request)
        await self.refuse_crossed_hand_over(context, request)
        rid = RequestId(request.request_id)
        if not rid or not request.tenant:
            await abort_with(
                context,
                Reply(
                    Status.INVALID_ARGUMENT,
                    f"request id {rid!r} and tenant {request.tenant!r} must be non-empty",
                ),
            )
        bad = next((t for t in request.prompt_tokens if t >= VOCAB_SIZE), None)
        if bad is not None:
            await abort_with(
                context,
                Reply(
                    Status.INVALID_ARGUMENT,
                    f"token id {bad} is outside the vocabulary (0..{VOCAB_SIZE - 1})",
                ),
            )
        if rid in self._waiters:
            await abort_with(
                context, Reply(Status.ALREADY_EXISTS, f"request {rid!r} is already active")
            )
        await refuse_unknown_instance(
            context,
            "decode instance",
            request.decode_instance,
            len(self.settings.decode_addresses),
            "prefill",
        )
        fut: asyncio.Future[tuple[Status, str]] = asyncio.get_running_loop().create_future()
        self._waiters[rid] = fut
        self._prompts[rid] = list(request.prompt_tokens)
        self._placed_decode[rid] = int(request.decode_instance)
        try:
            reply = self.feed(
                pc.SubmitRequest(
                    rid,
                    Tenant(request.tenant),
                    Room(request.room),
                    len(request.prompt_tokens),
                    time.monotonic(),
                    int(request.attempt),
                )
            )
            if reply.status is not Status.OK:
                self._prompts.pop(rid, None)
                if rid not in self.core.active_requests():
                    self._placed_decode.pop(rid, None)
                await abort_with(context, reply)
            try:
                status, message = await fut
            except asyncio.CancelledError:
                if not self._stopping:
                    self.feed(
                        pc.CancelRequest(rid, "the router's call went away", int(request.attempt))
                    )
                raise
        finally:
            self._waiters.pop(rid, None)
        if status is not Status.OK:
            await abort_with(context, Reply(status, message))
        return pb.PrefillSubmitResponse(request_id=rid)

    async def ReceiveGrant(
        self, request: pb.Grant, context: grpc.aio.ServicerContext
    ) -> pb.GrantAck:
        await check_bounds(context, request)
        if not request.page_ids or len(request.page_ids) > self.max_grant_pages:
            # The bound is the longest prompt this deployment serves, in pages: a grant can
            # never need more, and a parked one then holds kilobytes, not megabytes.
            await abort_with(
                context,
                Reply(
                    Status.INVALID_ARGUMENT,
                    f"grant of {len(request.page_ids)} pages must have 1..{self.max_grant_pages}",
                ),
            )
        await refuse_unknown_instance(
            context,
            "grant from decode instance",
            request.decode_instance,
            len(self.settings.decode_addresses),
            "prefill",
        )
        self._remember_sender(
            RequestId(request.request_id), int(request.generation), int(request.decode_instance)
        )
        if request.transfer_endpoint:
            if request.transfer_slot_bytes != self.settings.shape.page_bytes:
                await abort_with(
                    context,
                    Reply(
                        Status.INVALID_ARGUMENT,
                        f"grant's landing slots of {request.transfer_slot_bytes} bytes do not "
                        f"fit pages of {self.settings.shape.page_bytes} bytes",
                    ),
                )
            self._destinations[(RequestId(request.request_id), int(request.generation))] = (
                _Destination(
                    request.transfer_endpoint, request.transfer_base, request.transfer_slot_bytes
                )
            )
        reply = self.feed(
            pc.GrantReceived(
                RequestId(request.request_id),
                Room(request.room),
                Generation(request.generation),
                tuple(PageId(p) for p in request.page_ids),
                request.token,
                int(request.prompt_tokens),
                time.monotonic(),
                int(request.attempt),
            )
        )
        if reply.status is not Status.OK:
            self._destinations.pop((RequestId(request.request_id), int(request.generation)), None)
            await abort_with(context, reply)
        return pb.GrantAck(boot_epoch=self.boot_epoch)

    async def ReceiveAbort(
        self, request: pb.Abort, context: grpc.aio.ServicerContext
    ) -> pb.AbortResponse:
        await check_bounds(context, request)
        await refuse_unknown_instance(
            context,
            "abort from decode instance",
            request.decode_instance,
            len(self.settings.decode_addresses),
            "prefill",
        )
        # The drain ack goes back to the abort's sender: a prefill that restarted since the
        # grant has no other record of it.
        self._remember_sender(
            RequestId(request.request_id), int(request.generation), int(request.decode_instance)
        )
        reply = self.feed(
            pc.AbortReceived(
                RequestId(request.request_id),
                Room(request.room),
                Generation(request.generation),
                request.token,
                int(request.attempt),
            )
        )
        if reply.status is not Status.OK:
            await abort_with(context, reply)
        return pb.AbortResponse()

    def cancel(
        self, request_id: RequestId, reason: str, caller: Identity | None = None, attempt: int = 0
    ) -> Reply:
        return self.feed(pc.CancelRequest(request_id, reason or "cancelled", attempt))

    def info_fields(self) -> dict[str, int]:
        return {
            "max_prompt_tokens": self.settings.max_prompt_tokens,
            "context_window": self.settings.context_window,
            "page_size": self.settings.shape.page_size,
            "num_pages": self.settings.num_pages,
        }
