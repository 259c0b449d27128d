"""Router's gRPC edge: the client API; forwards to prefill and decode for the router core."""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar

import grpc
import grpc.aio

from kvhandoff.impl.core import router as rc
from kvhandoff.impl.core.common import Log, Reply, RequestId, Room, Status, Tenant
from kvhandoff.impl.eventlog import EventLog
from kvhandoff.impl.modes import Mode
from kvhandoff.impl.proto import rpc
from kvhandoff.impl.proto.gen.kvhandoff.v1 import handoff_pb2 as pb
from kvhandoff.impl.servers.admission import AdmissionQueue
from kvhandoff.impl.servers.base import (
    BaseServer,
    CommonSettings,
    abort_with,
    answered,
    call_quietly,
    check_bounds,
    status_of,
)
from kvhandoff.impl.tls import Identity
from kvhandoff.impl.tokenizer import VOCAB_SIZE

MAX_TENANT = 128
MAX_REQUEST_ID = 128
DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class RouterSettings:
    common: CommonSettings
    # One address per instance of each role, in instance order: the router places each request
    # on one of each (the least loaded, the first among equals).
    prefill_addresses: tuple[str, ...]
    decode_addresses: tuple[str, ...]
    context_window: int = 256
    max_new_tokens: int = 1024
    max_in_flight: int = 1024  # requests in the cluster at once; more wait in the queue
    admission_queue_len: int = 256
    admission_timeout_s: float = 10.0


class RouterServer(BaseServer):
    role = "router"
    allowed_roles: ClassVar[dict[str, frozenset[str]]] = {
        "Generate": frozenset({"client"}),
        "Cancel": frozenset({"client"}),
    }

    def __init__(self, settings: RouterSettings, mode: Mode, event_log: EventLog | None = None):
        self.settings = settings
        super().__init__(
            settings.common,
            mode,
            {"context_window": settings.context_window, "max_new_tokens": settings.max_new_tokens},
            event_log,
        )
        self.core = rc.RouterCore(
            rc.RouterConfig(settings.context_window, settings.max_new_tokens, mode.behaviour)
        )
        self._prompts: dict[RequestId, list[int]] = {}
        self._answers: dict[RequestId, list[int]] = {}
        self._waiters: dict[RequestId, asyncio.Future[tuple[Status, str]]] = {}
        self.queue: AdmissionQueue[asyncio.Future[Reply]] = AdmissionQueue(
            settings.admission_queue_len, settings.admission_timeout_s
        )
        self._in_flight = 0
        self._epochs: dict[str, int] = {}
        # Where each active request was placed: (prefill instance, decode instance), and how many
        # active requests each instance holds (the placement's load).
        self._placed: dict[RequestId, tuple[int, int]] = {}
        # Where recent requests ran: a retry under the same id goes back there (the spec's
        # request keeps its placement across attempts), bounded like the router's failed ids.
        self._ran_on: OrderedDict[RequestId, tuple[int, int]] = OrderedDict()
        # Placements fixed from outside for the next request of that id (a test harness that
        # plays the spec's fixed placements: `Cluster.pin_placement`); taken when placed.
        self.pinned: dict[RequestId, tuple[int, int]] = {}
        self._prefill_load = [0] * len(settings.prefill_addresses)
        self._decode_load = [0] * len(settings.decode_addresses)
        self._epoch_seen = asyncio.Event()
        self.metrics.gauge("kvhandoff_admission_queue_length", lambda: float(len(self.queue)))
        self.metrics.gauge("kvhandoff_requests_in_flight", lambda: float(self._in_flight))

    def _register(self, server: grpc.aio.Server) -> None:
        rpc.add_router(self, server)

    async def start(self) -> None:
        await super().start()
        for address in self.settings.prefill_addresses:
            self.spawn(self._track_epoch(address, rpc.prefill_stub))
        for address in self.settings.decode_addresses:
            self.spawn(self._track_epoch(address, rpc.decode_stub))

    # -------------------------------------------------------------- admission queue

    def _pump(self) -> None:
        while self._in_flight < self.settings.max_in_flight:
            entry = self.queue.pop_admissible(lambda _: True)
            if entry is None:
                return
            self.metrics.inc(
                "kvhandoff_admission_wait_seconds_total", time.monotonic() - entry.enqueued
            )
            self.metrics.inc("kvhandoff_admission_admitted_total")
            self._in_flight += 1  # the slot is the waiting call's from here
            if not entry.item.done():
                entry.item.set_result(Reply(Status.OK))

    async def _on_tick(self, now: float) -> None:
        for entry in self.queue.expired(now):
            self.metrics.inc("kvhandoff_admission_refused_total", reason="deadline")
            if not entry.item.done():
                entry.item.set_result(
                    Reply(
                        Status.RESOURCE_EXHAUSTED,
                        f"waited {self.queue.timeout_s:g}s in the router's admission queue "
                        f"({self._in_flight} requests in flight, the bound is "
                        f"{self.settings.max_in_flight})",
                    )
                )

    async def _admission(self, tenant: str, context: grpc.aio.ServicerContext) -> None:
        """Take an in-flight slot, waiting in the queue (tenants in turn) when none is free."""
        if self._in_flight < self.settings.max_in_flight and not len(self.queue):
            self._in_flight += 1
            return
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        entry = self.queue.push(tenant, fut, time.monotonic())
        if entry is None:
            self.metrics.inc("kvhandoff_admission_refused_total", reason="queue_full")
            await abort_with(
                context,
                Reply(
                    Status.RESOURCE_EXHAUSTED,
                    f"the router's admission queue is full ({len(self.queue)} waiting, "
                    f"{self._in_flight} in flight)",
                ),
            )
        try:
            reply = await fut
        except asyncio.CancelledError:
            if not self.queue.remove(entry) and fut.done() and fut.result().status is Status.OK:
                self._finished_one()  # it had been given a slot
            raise
        if reply.status is not Status.OK:
            await abort_with(context, reply)

    def _finished_one(self) -> None:
        self._in_flight -= 1
        self._pump()

    def feed(self, event: rc.RouterEvent) -> Reply:
        reply = Reply(Status.OK)
        for cmd in self.core.handle(event):
            match cmd:
                case Log():
                    self.log(self._with_placement(cmd))
                case Reply():
                    reply = cmd
                case rc.ForwardToPrefill():
                    i, j = self.placement(cmd.request_id)
                    address = self.settings.prefill_addresses[i]
                    self.spawn(self._to_prefill(cmd, address, j, self._epoch_now(address)))
                case rc.ForwardToDecode():
                    i, j = self.placement(cmd.request_id)
                    address = self.settings.decode_addresses[j]
                    self.spawn(self._to_decode(cmd, address, i, self._epoch_now(address)))
                case rc.CancelAtPrefill():
                    self.spawn(
                        call_quietly(
                            self._prefill(cmd.request_id).Cancel(
                                pb.CancelRequest(
                                    request_id=cmd.request_id,
                                    reason=cmd.reason,
                                    attempt=cmd.attempt,
                                ),
                                timeout=self.common.rpc_timeout_s,
                                wait_for_ready=True,
                            )
                        )
                    )
                case rc.AbortAtDecode():
                    self.spawn(
                        call_quietly(
                            self._decode(cmd.request_id).Cancel(
                                pb.CancelRequest(
                                    request_id=cmd.request_id,
                                    reason=cmd.reason,
                                    attempt=cmd.attempt,
                                ),
                                timeout=self.common.rpc_timeout_s,
                                wait_for_ready=True,
                            )
                        )
                    )
                case rc.AnswerClient():
                    fut = self._waiters.get(cmd.request_id)
                    if fut is not None and not fut.done():
                        fut.set_result((cmd.status, cmd.message))
        return reply

    def _with_placement(self, line: Log) -> Log:
        """A submission's log line names where the request was placed, where there is a choice:
        a worker that never logs the request (a hand-over lost in its crash) cannot say."""
        several = len(self._prefill_load) > 1 or len(self._decode_load) > 1
        if not several or line.kind not in ("router_submit_request", "router_retry_request"):
            return line
        rid = RequestId(str(line.args["request_id"]))
        i, j = self.placement(rid)
        return Log(line.kind, {**line.args, "prefill_instance": i, "decode_instance": j})

    def placement(self, request_id: RequestId) -> tuple[int, int]:
        """The (prefill, decode) instances `request_id` was placed on; a request the router no
        longer holds (its answer went out) is addressed where instance 0 serves."""
        return self._placed.get(request_id, (0, 0))

    def _place(self, request_id: RequestId, retry: bool) -> None:
        # The least loaded instance of each role (the first among equals), as a router that
        # balances by requests in flight does; a retry goes where the request ran before.
        before = self._ran_on.get(request_id) if retry else None
        before = self.pinned.pop(request_id, before)
        if before is not None:
            i, j = before
        else:
            i = self._prefill_load.index(min(self._prefill_load))
            j = self._decode_load.index(min(self._decode_load))
        self._placed[request_id] = (i, j)
        self._prefill_load[i] += 1
        self._decode_load[j] += 1

    def _unplace(self, request_id: RequestId) -> None:
        placed = self._placed.pop(request_id, None)
        if placed is not None:
            self._prefill_load[placed[0]] -= 1
            self._decode_load[placed[1]] -= 1
            self._ran_on[request_id] = placed
            self._ran_on.move_to_end(request_id)
            while len(self._ran_on) > self.core.config.max_failed_ids:
                self._ran_on.popitem(last=False)

    def _prefill(self, request_id: RequestId) -> Any:
        i = self.placement(request_id)[0]
        return rpc.prefill_stub(self.channel(self.settings.prefill_addresses[i]))

    def _decode(self, request_id: RequestId) -> Any:
        j = self.placement(request_id)[1]
        return rpc.decode_stub(self.channel(self.settings.decode_addresses[j]))

    # -------------------------------------------------------------- peer incarnations
    #
    # A hand-over (the Submit to prefill or decode) is addressed to the incarnation of the peer
    # that was up when the router accepted the request: it carries that boot epoch, and a
    # restarted peer refuses it. Otherwise a hand-over that waited in the channel while the peer
    # was down (gRPC's wait-for-ready) reached the next incarnation, which knew nothing of the
    # request's cancel or of its other side's failure, and served or held a request the protocol
    # had lost in the crash (issue 15, "crash in flight"). The router learns each peer's epoch
    # from its Info whenever its channel becomes READY, and forgets it whenever the channel
    # leaves READY (the connection broke: the peer may be another incarnation when it is back).
    # A request accepted while the epoch is unknown came after the crash: it waits for the next
    # incarnation and is bound to it.

    def _epoch_now(self, address: str) -> int | None:
        """The peer's epoch as known when the router accepts a request: the hand-over is bound
        to it. None when it is not known (never learned, or the connection broke since): the
        request came after the crash, so it waits for the next incarnation and goes there."""
        return self._epochs.get(address)

    async def _track_epoch(self, address: str, stub: Any) -> None:
        channel = self.channel(address)
        while not self._stopping:
            state = channel.get_state(try_to_connect=True)
            if state is grpc.ChannelConnectivity.READY:
                try:
                    info = await stub(channel).Info(pb.InfoRequest(), timeout=2.0)
                    if channel.get_state() is grpc.ChannelConnectivity.READY:
                        self._epochs[address] = int(info.boot_epoch)
                        self._epoch_seen.set()
                except grpc.RpcError:
                    pass
            await channel.wait_for_state_change(state)
            self._epochs.pop(address, None)

    def known_epoch(self, address: str) -> int | None:
        return self._epochs.get(address)

    async def _resolve_epoch(self, address: str, epoch: int | None) -> int | None:
        if epoch is not None:
            return epoch
        deadline = time.monotonic() + self.common.rpc_timeout_s
        while (got := self._epochs.get(address)) is None and time.monotonic() < deadline:
            self._epoch_seen.clear()
            try:
                await asyncio.wait_for(self._epoch_seen.wait(), 0.1)
            except TimeoutError:
                pass
        return got

    @staticmethod
    def _unreachable(role: str) -> tuple[Status, str]:
        return (Status.UNAVAILABLE, f"{role} did not come back within the call's deadline")

    async def _to_prefill(
        self, cmd: rc.ForwardToPrefill, address: str, decode: int, epoch: int | None = None
    ) -> None:
        prompt = self._prompts.get(cmd.request_id, [])
        peer = await self._resolve_epoch(address, epoch)
        if peer is None:
            if not self._stopping:
                status, message = self._unreachable("prefill")
                self.feed(rc.PrefillFinished(cmd.request_id, status, message, True))
            return
        try:
            await rpc.prefill_stub(self.channel(address)).Submit(
                pb.PrefillSubmitRequest(
                    request_id=cmd.request_id,
                    tenant=cmd.tenant,
                    room=cmd.room,
                    prompt_tokens=prompt,
                    peer_epoch=peer,
                    attempt=cmd.attempt,
                    decode_instance=decode,
                ),
                timeout=self.common.rpc_timeout_s,
                wait_for_ready=True,
            )
            status, message, broken = Status.OK, "", False
        except grpc.RpcError as exc:
            status, message = status_of(exc)
            broken = not answered(exc)
        if not self._stopping:
            self.feed(rc.PrefillFinished(cmd.request_id, status, message, broken))

    async def _to_decode(
        self, cmd: rc.ForwardToDecode, address: str, prefill: int, epoch: int | None = None
    ) -> None:
        peer = await self._resolve_epoch(address, epoch)
        if peer is None:
            if not self._stopping:
                status, message = self._unreachable("decode")
                self.feed(rc.DecodeFinished(cmd.request_id, status, message))
            return
        try:
            resp = await rpc.decode_stub(self.channel(address)).Submit(
                pb.DecodeSubmitRequest(
                    request_id=cmd.request_id,
                    tenant=cmd.tenant,
                    room=cmd.room,
                    prompt_tokens=cmd.prompt_len,
                    max_tokens=cmd.max_tokens,
                    peer_epoch=peer,
                    attempt=cmd.attempt,
                    prefill_instance=prefill,
                ),
                timeout=self.common.rpc_timeout_s,
                wait_for_ready=True,
            )
            if cmd.request_id in self._waiters:
                self._answers[cmd.request_id] = list(resp.tokens)
            status, message = Status.OK, ""
        except grpc.RpcError as exc:
            status, message = status_of(exc)
        if not self._stopping:
            self.feed(rc.DecodeFinished(cmd.request_id, status, message))

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> pb.GenerateResponse:
        await check_bounds(context, request)
        caller = self.caller(context)
        if caller is not None:
            # The tenant is the certificate's; a request may repeat it, never name another.
            if request.tenant and request.tenant != caller.tenant:
                await abort_with(
                    context,
                    Reply(
                        Status.PERMISSION_DENIED,
                        f"{caller} may not act for tenant {request.tenant!r}",
                    ),
                )
            request.tenant = caller.tenant or ""
        if not 0 < len(request.tenant) <= MAX_TENANT:
            await abort_with(
                context,
                Reply(
                    Status.INVALID_ARGUMENT,
                    f"tenant {request.tenant!r} must be 1..{MAX_TENANT} characters",
                ),
            )
        if len(request.request_id) > MAX_REQUEST_ID:
            await abort_with(
                context,
                Reply(
                    Status.INVALID_ARGUMENT,
                    f"request id of {len(request.request_id)} characters is over {MAX_REQUEST_ID}",
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
        rid = RequestId(request.request_id or uuid.uuid4().hex)
        if rid in self._waiters:
            await abort_with(
                context, Reply(Status.ALREADY_EXISTS, f"request {rid!r} is already active")
            )
        max_tokens = request.max_tokens or DEFAULT_MAX_TOKENS
        await self._admission(request.tenant, context)
        try:
            return await self._generate(request, context, rid, max_tokens)
        finally:
            self._finished_one()

    async def _generate(
        self,
        request: pb.GenerateRequest,
        context: grpc.aio.ServicerContext,
        rid: RequestId,
        max_tokens: int,
    ) -> pb.GenerateResponse:
        if rid in self._waiters:
            await abort_with(
                context, Reply(Status.ALREADY_EXISTS, f"request {rid!r} is already active")
            )
        fut: asyncio.Future[tuple[Status, str]] = asyncio.get_running_loop().create_future()
        self._waiters[rid] = fut
        self._prompts[rid] = list(request.prompt_tokens)
        self._place(rid, request.retry)
        try:
            reply = self.feed(
                rc.ClientSubmit(
                    rid,
                    Tenant(request.tenant),
                    Room(secrets.randbits(63)),
                    len(request.prompt_tokens),
                    max_tokens,
                    time.monotonic(),
                    retry=request.retry,
                )
            )
            if reply.status is not Status.OK:
                await abort_with(context, reply)
            try:
                status, message = await fut
            except asyncio.CancelledError:
                if not self._stopping:
                    self.feed(rc.ClientCancel(rid, "the client's call went away"))
                raise
        finally:
            self._waiters.pop(rid, None)
            self._prompts.pop(rid, None)
            self._unplace(rid)
        tokens = self._answers.pop(rid, [])
        if status is not Status.OK:
            await abort_with(context, Reply(status, message))
        return pb.GenerateResponse(request_id=rid, tokens=tokens)

    def cancel(
        self, request_id: RequestId, reason: str, caller: Identity | None = None, attempt: int = 0
    ) -> Reply:
        if caller is not None and self.core.tenant_of(request_id) != caller.tenant:
            # Another tenant's request answers exactly as an unknown one: a tenant can neither
            # cancel it nor learn that it exists.
            return Reply(Status.NOT_FOUND, f"no active request {request_id!r}")
        return self.feed(rc.ClientCancel(request_id, reason or "client cancelled"))

    def info_fields(self) -> dict[str, int]:
        return {
            "max_prompt_tokens": self.settings.context_window,
            "context_window": self.settings.context_window,
        }
