"""What the three gRPC servers share: settings, status mapping, channels, health, logging, ticks,
and the runtime thread that hosts their asyncio loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NoReturn, TypeVar

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from kvhandoff.impl.core.common import Log, Reply, RequestId, Status
from kvhandoff.impl.errors import ConfigError
from kvhandoff.impl.eventlog import EventLog
from kvhandoff.impl.metrics import Metrics, RpcTimer
from kvhandoff.impl.modes import Mode
from kvhandoff.impl.proto.gen.kvhandoff.v1 import handoff_pb2 as pb
from kvhandoff.impl.proto.rpc import ANSWERED_KEY
from kvhandoff.impl.servers.faults import FaultPlan
from kvhandoff.impl.tls import Identity, TlsFiles, identity_of_pem

T = TypeVar("T")


@dataclass(frozen=True)
class CommonSettings:
    host: str = "127.0.0.1"
    port: int = 0
    log_dir: Path | None = None
    metrics_port: int | None = None  # None: no /metrics endpoint; 0: any free port
    tls: TlsFiles | None = None
    max_message_bytes: int = 8 << 20
    tick_interval_s: float = 0.05
    rpc_timeout_s: float = 30.0
    log_key: bytes | None = None  # keys event-log digests (impl.eventlog); None: a fresh one


# Bounds on every size a peer or client controls (docs/impl.md, "Bounds", lists them with the
# error each gets). Message bytes are bounded by `CommonSettings.max_message_bytes`; page lists by
# each role's pool and prompt limits; pending state by the cores' own caps.
MAX_ID_CHARS = 128  # request ids and tenants
MAX_REASON_CHARS = 4096  # reasons in rejections and cancels
MAX_SECRET_BYTES = 64  # capability tokens and digests

_STRING_BOUNDS = {
    "request_id": MAX_ID_CHARS,
    "tenant": MAX_ID_CHARS,
    "reason": MAX_REASON_CHARS,
    "code": 32,
    "dtype": 32,
}
_BYTES_BOUNDS = {"token": MAX_SECRET_BYTES, "digest": MAX_SECRET_BYTES}


def bounds_problem(msg: Any) -> Reply | None:
    """The first field of ``msg`` over its bound, as an INVALID_ARGUMENT reply naming the field,
    its size and the bound; None when every bounded field fits. Fields are looked up by name,
    so one function serves every message type."""
    fields = msg.DESCRIPTOR.fields_by_name
    for name, bound in _STRING_BOUNDS.items():
        if name in fields and len(getattr(msg, name)) > bound:
            size = len(getattr(msg, name))
            return Reply(
                Status.INVALID_ARGUMENT, f"{name} of {size} characters is over the bound of {bound}"
            )
    for name, bound in _BYTES_BOUNDS.items():
        if name in fields and len(getattr(msg, name)) > bound:
            size = len(getattr(msg, name))
            return Reply(
                Status.INVALID_ARGUMENT, f"{name} of {size} bytes is over the bound of {bound}"
            )
    if "digests" in fields:
        for i, d in enumerate(msg.digests):
            if len(d) > MAX_SECRET_BYTES:
                return Reply(
                    Status.INVALID_ARGUMENT,
                    f"digest {i} of {len(d)} bytes is over the bound of {MAX_SECRET_BYTES}",
                )
    return None


async def check_bounds(context: grpc.aio.ServicerContext, msg: Any) -> None:
    """Answer the call INVALID_ARGUMENT when a field of ``msg`` is over its bound."""
    problem = bounds_problem(msg)
    if problem is not None:
        await abort_with(context, problem)


def grpc_code(status: Status) -> grpc.StatusCode:
    return grpc.StatusCode[status.value]


def answered(exc: grpc.RpcError) -> bool:
    """True when the failed call was answered by a kvhandoff server (`abort_with`), False when
    it broke (peer down, unreachable, deadline)."""
    if not isinstance(exc, grpc.aio.AioRpcError | grpc.Call):
        return False
    metadata = exc.trailing_metadata() or ()
    return any(key == ANSWERED_KEY for key, _ in metadata)


def status_of(exc: grpc.RpcError) -> tuple[Status, str]:
    """Translate a failed call (raised by grpc) into a core Status and a message."""
    code = exc.code() if isinstance(exc, grpc.aio.AioRpcError | grpc.Call) else None
    name = code.name if code is not None else "UNKNOWN"
    details = exc.details() if isinstance(exc, grpc.aio.AioRpcError | grpc.Call) else str(exc)
    try:
        return Status[name], str(details or name)
    except KeyError:
        return Status.UNKNOWN, str(details or name)


async def abort_with(context: grpc.aio.ServicerContext, reply: Reply) -> NoReturn:
    """End the current call with the reply's status (raises, as grpc does)."""
    await context.abort(
        grpc_code(reply.status), reply.message, trailing_metadata=((ANSWERED_KEY, "1"),)
    )
    raise AssertionError("grpc's abort returned")  # it always raises


async def refuse_unknown_instance(
    context: grpc.aio.ServicerContext, what: str, instance: int, count: int, server: str
) -> None:
    """Refuse a message naming a peer instance the server does not know (`what`, e.g. "decode
    instance 3"): INVALID_ARGUMENT naming it and the instances there are."""
    if instance >= count:
        await abort_with(
            context,
            Reply(
                Status.INVALID_ARGUMENT,
                f"{what} {instance} does not exist: this {server} serves {count} (0..{count - 1})",
            ),
        )


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        # A restarted peer comes back on the same port: reconnect within ~100 ms rather than
        # grpc's default backoff of seconds.
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        # Page writes are MiB-sized: larger HTTP/2 frames and a deeper receive window cut the
        # per-frame and flow-control round trips of a handoff.
        ("grpc.http2.max_frame_size", 4 << 20),
        ("grpc.http2.lookahead_bytes", 32 << 20),
        # A channel leaves READY only when its connection breaks, never for being idle: the
        # router takes leaving READY as "the peer may have restarted" (router.py).
        ("grpc.client_idle_timeout_ms", 2**31 - 1),
    ]


class BaseServer:
    """One gRPC server hosting one role. Subclasses add their servicer and command execution."""

    role = "base"

    def __init__(
        self,
        common: CommonSettings,
        mode: Mode,
        log_config: Mapping[str, Any],
        event_log: EventLog | None = None,
    ) -> None:
        self.common = common
        self.mode = mode
        self.boot_epoch = secrets.randbits(48) | 1
        path = common.log_dir / f"{self.role}.jsonl" if common.log_dir is not None else None
        self.event_log = event_log or EventLog(
            path, self.role, mode.name, log_config, key=common.log_key
        )
        self.metrics = Metrics(self.role)
        self.port = 0
        self.metrics_port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self.health = health_aio.HealthServicer()
        self.faults: FaultPlan | None = None  # fault campaigns only (impl.servers.faults)

    @property
    def address(self) -> str:
        return f"{self.common.host}:{self.port}"

    # -------------------------------------------------------------- lifecycle

    def _register(self, server: grpc.aio.Server) -> None:
        raise NotImplementedError

    # -------------------------------------------------------------- identity and authorization

    allowed_roles: ClassVar[dict[str, frozenset[str]]] = {}
    """Method name -> the roles that may call it; a method not listed is open to every
    authenticated caller (Info: peers probe each other's health and limits with it)."""

    def caller(self, context: grpc.aio.ServicerContext) -> Identity | None:
        """The identity in the caller's client certificate; None without TLS (``--insecure``)
        or when the certificate carries no kvhandoff identity."""
        if self.common.tls is None:
            return None
        pems = context.auth_context().get("x509_pem_cert") or []
        return identity_of_pem(bytes(pems[0])) if pems else None

    def authorize(
        self, method: str, context: grpc.aio.ServicerContext
    ) -> tuple[grpc.StatusCode, str] | None:
        """None when the caller may call ``method``, else the refusal (called by impl.proto.rpc
        before the request is parsed). Without TLS everything is allowed: that is what
        ``--insecure`` means, and `kvhandoff serve` says so when it starts."""
        if self.common.tls is None:
            return None
        identity = self.caller(context)
        if identity is None:
            return (
                grpc.StatusCode.PERMISSION_DENIED,
                "the client certificate carries no kvhandoff identity (a subject-alternative-"
                "name URI kvhandoff:role=ROLE)",
            )
        allowed = self.allowed_roles.get(method)
        if allowed is not None and identity.role not in allowed:
            return (
                grpc.StatusCode.PERMISSION_DENIED,
                f"{identity} may not call {self.role} {method} "
                f"(only {' or '.join(sorted(allowed))} may)",
            )
        return None

    async def _on_tick(self, now: float) -> None:
        """Feed the core a Tick; subclasses override."""

    # -------------------------------------------------------------- RPCs every role serves

    def cancel(
        self, request_id: RequestId, reason: str, caller: Identity | None = None, attempt: int = 0
    ) -> Reply:
        """Feed the core this role's cancel event (of the request's `attempt`, which the router
        names to a worker); subclasses override."""
        raise NotImplementedError

    def info_fields(self) -> dict[str, int]:
        """The role's limits for `Info`; subclasses override."""
        raise NotImplementedError

    async def Cancel(
        self, request: pb.CancelRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelResponse:
        await check_bounds(context, request)
        reply = self.cancel(
            RequestId(request.request_id),
            request.reason,
            self.caller(context),
            int(request.attempt),
        )
        if reply.status is not Status.OK:
            await abort_with(context, reply)
        return pb.CancelResponse()

    async def refuse_crossed_hand_over(
        self, context: grpc.aio.ServicerContext, request: Any
    ) -> None:
        """A hand-over addressed to another incarnation of this server crossed its restart: it
        is lost with the crash (as the spec says), so it is refused as a broken call would be
        (no "answered" mark: for the router this is the crash, seen through this call)."""
        if request.peer_epoch and request.peer_epoch != self.boot_epoch:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"request {request.request_id!r} was handed to {self.role} incarnation "
                f"{request.peer_epoch}, which has restarted (now {self.boot_epoch}): "
                "it was lost in the crash",
            )

    async def Info(
        self, request: pb.InfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerInfo:
        return pb.ServerInfo(
            role=self.role, mode=self.mode.name, boot_epoch=self.boot_epoch, **self.info_fields()
        )

    async def start(self) -> None:
        server = grpc.aio.server(
            options=channel_options(self.common.max_message_bytes),
            interceptors=[RpcTimer(self.metrics)],
        )
        self._register(server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        bind = f"{self.common.host}:{self.common.port}"
        try:
            if self.common.tls is not None:
                self.port = server.add_secure_port(bind, self.common.tls.server_credentials())
            else:
                self.port = server.add_insecure_port(bind)
        except RuntimeError as exc:  # grpc's way of saying the address is unusable
            raise ConfigError(f"{self.role} cannot listen on {bind}: {exc}") from exc
        await server.start()
        self._server = server
        if self.common.metrics_port is not None:
            self.metrics_port = self.metrics.serve(self.common.host, self.common.metrics_port)
        self.spawn(self._ticker())
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.health.set(
            f"kvhandoff.v1.{self.role.capitalize()}", health_pb2.HealthCheckResponse.SERVING
        )

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop serving. ``grace=0`` models a crash: calls in flight are cut, nothing more is sent."""
        self._stopping = True
        if grace:
            await self.health.enter_graceful_shutdown()  # peers see NOT_SERVING first
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            await self._server.stop(grace)
        for ch in self._channels.values():
            await ch.close()
        self._channels.clear()
        self.metrics.close()

    async def _ticker(self) -> None:
        while not self._stopping:
            await self._on_tick(time.monotonic())
            await asyncio.sleep(self.common.tick_interval_s)

    # -------------------------------------------------------------- helpers

    def channel(self, address: str) -> grpc.aio.Channel:
        ch = self._channels.get(address)
        if ch is None:
            opts = channel_options(self.common.max_message_bytes)
            if self.common.tls is not None:
                ch = grpc.aio.secure_channel(
                    address, self.common.tls.channel_credentials(), options=opts
                )
            else:
                ch = grpc.aio.insecure_channel(address, options=opts)
            self._channels[address] = ch
        return ch

    async def send_control(
        self, kind: str, call: Callable[[], Awaitable[T]]
    ) -> tuple[Status, str, T | None]:
        """Send one control message (``call`` makes the gRPC call) through the fault plan, if
        any: it may be delayed, duplicated or (for messages the protocol repeats) lost without
        the sender knowing. Returns the call's status, message and response."""
        plan = self.faults
        if plan is None:
            try:
                return Status.OK, "", await call()
            except grpc.RpcError as exc:
                status, message = status_of(exc)
                return status, message, None
        plan.in_flight += 1
        try:
            delay = plan.delay(kind)
            if delay:
                await asyncio.sleep(delay)
            if plan.lose(kind):
                return Status.OK, "", None
            if plan.duplicate(kind):
                plan.in_flight += 1
                copy = self.spawn(call_quietly(call()))
                copy.add_done_callback(lambda _: setattr(plan, "in_flight", plan.in_flight - 1))
            try:
                return Status.OK, "", await call()
            except grpc.RpcError as exc:
                status, message = status_of(exc)
                return status, message, None
        finally:
            plan.in_flight -= 1

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def log(self, cmd: Log) -> None:
        self.event_log.write(cmd.kind, cmd.args)
        self.metrics.observe(cmd.kind, cmd.args)

    def log_event(self, kind: str, **args: Any) -> None:
        self.log(Log(kind, args))


class Runtime:
    """A thread running one asyncio loop that hosts any number of servers."""

    def __init__(self, name: str = "kvhandoff-runtime") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = 60.0) -> T:
        fut: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def call(self, fn: Callable[[], T], timeout: float | None = 10.0) -> T:
        async def wrapper() -> T:
            return fn()

        return self.run(wrapper(), timeout)

    def close(self) -> None:
        if not self.loop.is_running():
            return

        async def drain() -> None:
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        try:
            self.run(drain(), timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            self.loop.close()


async def call_quietly(aw: Awaitable[Any]) -> tuple[Status, str]:
    """Await a unary call; translate a grpc failure into (Status, message) instead of raising."""
    try:
        await aw
    except grpc.RpcError as exc:
        return status_of(exc)
    return Status.OK, ""
