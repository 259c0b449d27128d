"""Start a prefill + decode + router cluster on loopback, in this process.

    cluster = start_cluster(mode="incident", log_dir=tmp)
    with cluster.client() as c:
        c.generate("tenant-a", encode("hello"))
    cluster.crash_prefill(); cluster.restart_prefill()
    cluster.stop()

All three servers share one asyncio loop on a background thread (`Runtime`). A "crash" stops a
server with no grace (calls in flight are cut, nothing more is sent) and drops its state; a
restart builds a fresh server on the same port (a new boot epoch; decode reads its persisted boot
counter, so generations never repeat).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc

from kvhandoff.impl.client import Client
from kvhandoff.impl.core.common import RequestId
from kvhandoff.impl.core.decode import GrantView
from kvhandoff.impl.errors import ConfigError, TransportError
from kvhandoff.impl.eventlog import EventLog, new_log_key
from kvhandoff.impl.modes import Mode, get_mode
from kvhandoff.impl.pool import PoolShape
from kvhandoff.impl.servers.base import CommonSettings, Runtime
from kvhandoff.impl.servers.decode import DecodeServer, DecodeSettings
from kvhandoff.impl.servers.faults import FaultPlan
from kvhandoff.impl.servers.prefill import PrefillServer, PrefillSettings
from kvhandoff.impl.servers.router import RouterServer, RouterSettings
from kvhandoff.impl.tls import Pki, TlsFiles


@dataclass(frozen=True)
class Limits:
    context_window: int
    prefill_max_prompt: int
    decode_max_prompt: int

    def as_json(self) -> dict[str, int]:
        return {
            "context_window": self.context_window,
            "prefill_max_prompt": self.prefill_max_prompt,
            "decode_max_prompt": self.decode_max_prompt,
        }


@dataclass(frozen=True)
class ClusterConfig:
    """Sizes are in pages and tokens. ``None`` means the mode's default (see `defaults_for`)."""

    mode: str = "reference"
    device: str = "auto"
    page_size: int = 4
    layers: int = 2
    heads: int = 2
    head_dim: int = 16
    decode_pages: int | None = None
    prefill_pages: int | None = None
    context_window: int | None = None
    decode_max_prompt: int | None = None
    """Decode's prompt limit in tokens, below what its pool holds (None: the pool's, capped by
    the window). The conformance suite sets it to a scenario's limit."""
    waiting_timeout_s: float = 30.0
    abort_retry_s: float = 1.0
    release_timeout_s: float = 5.0
    heartbeat_interval_s: float = 0.2
    prefill_dead_after_misses: int = 5
    orphan_grant_timeout_s: float = 10.0
    prefill_grant_timeout_s: float | None = 60.0
    pages_per_message: int = 16
    write_delay_s: float = 0.0
    max_message_bytes: int = 8 << 20
    rpc_timeout_s: float = 30.0
    host: str = "127.0.0.1"
    router_port: int = 0
    prefill_port: int = 0
    decode_port: int = 0
    metrics: bool = False
    log_dir: Path | None = None
    state_dir: Path | None = None
    pki: Path | None = None  # mutual TLS with identities from this CA (created if absent)
    admission_queue_len: int = 256  # decode's and the router's admission queues (0: none)
    admission_timeout_s: float = 10.0
    max_in_flight: int = 1024  # router: requests in the cluster at once; more wait in its queue
    log_key: bytes | None = None  # keys the digests in event logs; None: a fresh one per cluster
    transport: str = "grpc"  # how page data moves: impl.transport.TRANSPORT_NAMES
    # Instances of each worker role (the router places each request on one of each, the least
    # loaded). `prefill_port` and `decode_port` are instance 0's; the others take free ports.
    prefill_instances: int = 1
    decode_instances: int = 1

    def resolved(self) -> ClusterConfig:
        d = defaults_for(get_mode(self.mode))
        return replace(
            self,
            decode_pages=self.decode_pages or d["decode_pages"],
            prefill_pages=self.prefill_pages or d["prefill_pages"],
            context_window=self.context_window or d["context_window"],
        )

    def limits(self) -> Limits:
        c = self.resolved()
        assert c.decode_pages and c.prefill_pages and c.context_window
        return Limits(
            c.context_window,
            min(c.context_window, c.prefill_pages * c.page_size),
            min(c.context_window, c.decode_pages * c.page_size, c.decode_max_prompt or (1 << 62)),
        )


def defaults_for(mode: Mode) -> dict[str, int]:
    """Default pool sizes. The incident's shape: a context window (512 tokens) larger than the
    prefill pool (32 pages x 4 = 128 tokens) and a decode pool that admits the whole window."""
    if mode.behaviour.incident_shaped_limits:
        return {"decode_pages": 128, "prefill_pages": 32, "context_window": 512}
    return {"decode_pages": 64, "prefill_pages": 64, "context_window": 256}


class Cluster:
    def __init__(self, config: ClusterConfig) -> None:
        self.config = config.resolved()
        for role in ("prefill", "decode"):
            n = getattr(self.config, f"{role}_instances")
            if not 1 <= n <= MAX_INSTANCES:
                raise ConfigError(
                    f"{role}_instances={n}: a cluster runs 1..{MAX_INSTANCES} instances of a role"
                )
        self.mode = get_mode(self.config.mode)
        self.limits = self.config.limits()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        state_dir = self.config.state_dir
        if state_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="kvhandoff-state-")
            state_dir = Path(self._tmp.name)
        self.state_dir = state_dir
        # With a PKI every server gets a certificate naming its role, and callers are
        # authorized by theirs; without one the servers run plaintext and allow every call.
        self.pki = Pki.open(self.config.pki) if self.config.pki is not None else None
        self._tls: dict[str, TlsFiles] = {}
        if self.pki is not None:
            for role in ("router", "prefill", "decode"):
                self._tls[role] = self.pki.issue(role)
        self.runtime = Runtime()
        # One key for the three logs of a deployment, so their digests compare; never logged.
        self.log_key = self.config.log_key or new_log_key()
        self._logs: dict[str, EventLog] = {}
        self.faults: FaultPlan | None = None
        # One server per instance, in instance order.
        self.prefill_servers: list[PrefillServer] = []
        self.decode_servers: list[DecodeServer] = []
        self.router_server: RouterServer
        try:
            self.runtime.run(self._start_all())
        except BaseException:
            self.runtime.close()
            raise
        try:
            for server in (*self.prefill_servers, *self.decode_servers):
                self._router_sees(server.address, server.boot_epoch)
        except BaseException:
            self.stop()
            raise

    # ------------------------------------------------------------------ settings

    def _common(self, port: int, role: str) -> CommonSettings:
        c = self.config
        return CommonSettings(
            host=c.host,
            port=port,
            log_dir=c.log_dir,
            metrics_port=0 if c.metrics else None,
            tls=self._tls.get(role),
            max_message_bytes=c.max_message_bytes,
            rpc_timeout_s=c.rpc_timeout_s,
        )

    def _shape(self) -> PoolShape:
        c = self.config
        return PoolShape(c.layers, c.page_size, c.heads, c.head_dim)

    def _decode_settings(
        self, port: int, prefills: tuple[str, ...], instance: int = 0
    ) -> DecodeSettings:
        c = self.config
        assert c.decode_pages is not None and c.context_window is not None
        return DecodeSettings(
            common=self._common(port, "decode"),
            prefill_addresses=prefills,
            instance=instance,
            shape=self._shape(),
            num_pages=c.decode_pages,
            max_prompt_tokens=self.limits.decode_max_prompt,
            context_window=c.context_window,
            waiting_timeout_s=c.waiting_timeout_s,
            abort_retry_s=c.abort_retry_s,
            release_timeout_s=c.release_timeout_s,
            heartbeat_interval_s=c.heartbeat_interval_s,
            prefill_dead_after_misses=c.prefill_dead_after_misses,
            device=c.device,
            # Each decode instance persists its own boot counter.
            state_dir=self.state_dir if not instance else self.state_dir / f"decode{instance}",
            transport=c.transport,
            admission_queue_len=c.admission_queue_len,
            admission_timeout_s=c.admission_timeout_s,
        )

    def _prefill_settings(
        self, port: int, decodes: tuple[str, ...], instance: int = 0
    ) -> PrefillSettings:
        c = self.config
        assert c.prefill_pages is not None and c.context_window is not None
        return PrefillSettings(
            common=self._common(port, "prefill"),
            decode_addresses=decodes,
            instance=instance,
            shape=self._shape(),
            num_pages=c.prefill_pages,
            max_prompt_tokens=self.limits.prefill_max_prompt,
            context_window=c.context_window,
            pages_per_message=c.pages_per_message,
            write_delay_s=c.write_delay_s,
            orphan_grant_timeout_s=c.orphan_grant_timeout_s,
            grant_timeout_s=c.prefill_grant_timeout_s,
            device=c.device,
            transport=c.transport,
        )

    def _log(self, role: str, instance: int = 0) -> EventLog | None:
        # Logs outlive restarts so each server keeps one file with increasing seq numbers; an
        # instance other than the first has a file of its own (`prefill1.jsonl`, ...), whose
        # header names its instance.
        c = self.config
        if c.log_dir is None:
            return None
        name = f"{role}{instance}" if instance else role
        if name not in self._logs:
            self._logs[name] = EventLog(
                c.log_dir / f"{name}.jsonl",
                role,
                self.mode.name,
                {
                    "page_size": c.page_size,
                    "layers": c.layers,
                    "heads": c.heads,
                    "head_dim": c.head_dim,
                    "decode_pages": c.decode_pages,
                    "prefill_pages": c.prefill_pages,
                    **self.limits.as_json(),
                    **({"instance": instance} if instance else {}),
                },
                key=self.log_key,
            )
        return self._logs[name]

    async def _start_all(self) -> None:
        c = self.config
        # Ports first (decode and prefill name each other), then the servers.
        decode_ports = [c.decode_port or _free_port(c.host)]
        decode_ports += [_free_port(c.host) for _ in range(1, c.decode_instances)]
        prefill_ports = [c.prefill_port or _free_port(c.host)]
        prefill_ports += [_free_port(c.host) for _ in range(1, c.prefill_instances)]
        decodes = tuple(f"{c.host}:{port}" for port in decode_ports)
        prefills = tuple(f"{c.host}:{port}" for port in prefill_ports)
        for i, port in enumerate(prefill_ports):
            prefill = PrefillServer(
                self._prefill_settings(port, decodes, i), self.mode, self._log("prefill", i)
            )
            await prefill.start()
            self.prefill_servers.append(prefill)
        for j, port in enumerate(decode_ports):
            decode = DecodeServer(
                self._decode_settings(port, prefills, j), self.mode, self._log("decode", j)
            )
            await decode.start()
            self.decode_servers.append(decode)
        self.router_server = RouterServer(
            RouterSettings(
                self._common(c.router_port, "router"),
                prefills,
                decodes,
                context_window=self.limits.context_window,
                max_in_flight=c.max_in_flight,
                admission_queue_len=c.admission_queue_len,
                admission_timeout_s=c.admission_timeout_s,
            ),
            self.mode,
            self._log("router"),
        )
        await self.router_server.start()

    # ------------------------------------------------------------------ public API

    @property
    def router(self) -> str:
        return self.router_server.address

    @property
    def prefill_server(self) -> PrefillServer:
        """Prefill instance 0 (the only one in a cluster of one of each)."""
        return self.prefill_servers[0]

    @property
    def decode_server(self) -> DecodeServer:
        """Decode instance 0 (the only one in a cluster of one of each)."""
        return self.decode_servers[0]

    @property
    def prefill(self) -> str:
        return self.prefill_server.address

    @property
    def decode(self) -> str:
        return self.decode_server.address

    def _workers(self) -> list[PrefillServer | DecodeServer]:
        return [*self.prefill_servers, *self.decode_servers]

    def addresses(self) -> dict[str, Any]:
        several = len(self.prefill_servers) > 1 or len(self.decode_servers) > 1
        return {
            "router": self.router,
            "prefill": self.prefill,
            "decode": self.decode,
            **(
                {
                    "prefills": [s.address for s in self.prefill_servers],
                    "decodes": [s.address for s in self.decode_servers],
                }
                if several
                else {}
            ),
            "limits": self.limits.as_json(),
            **({"metrics": self.metrics_addresses()} if self.config.metrics else {}),
        }

    def metrics_addresses(self) -> dict[str, str]:
        """Each server's /metrics address (host:port), when the cluster serves metrics."""
        servers: dict[str, Any] = {"router": self.router_server}
        for role, group in (("prefill", self.prefill_servers), ("decode", self.decode_servers)):
            for i, server in enumerate(group):
                servers[f"{role}{i}" if i else role] = server
        return {
            role: f"{self.config.host}:{server.metrics_port}"
            for role, server in servers.items()
            if server.metrics_port is not None
        }

    def wait_healthy(self, timeout: float = 10.0) -> None:
        """Block until the standard gRPC health service of all three servers says SERVING."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout
        for address in [*(s.address for s in self._workers()), self.router]:
            channel = self._sync_channel(address)
            try:
                stub = health_pb2_grpc.HealthStub(channel)
                while True:
                    try:
                        status = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0).status
                    except grpc.RpcError:
                        status = None
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        break
                    if time.monotonic() > deadline:
                        raise TransportError(f"{address} is not SERVING after {timeout}s")
                    time.sleep(0.05)
            finally:
                channel.close()

    def _sync_channel(self, address: str) -> grpc.Channel:
        if "router" in self._tls:  # health checks are open to any certificate of the CA
            return grpc.secure_channel(address, self._tls["router"].channel_credentials())
        return grpc.insecure_channel(address)

    def client_tls(self, tenant: str) -> TlsFiles | None:
        """A client certificate for ``tenant`` (None without a PKI)."""
        if self.pki is None:
            return None
        return self.pki.issue("client", tenant)

    def client(self, tenant: str | None = None) -> Client:
        """A router client; with a PKI it acts for ``tenant``, which its certificate names."""
        tls = None
        if self.pki is not None:
            if tenant is None:
                raise ConfigError("with a PKI a client acts for one tenant: client(tenant=...)")
            tls = self.client_tls(tenant)
        return Client(self.router, tls=tls, max_message_bytes=self.config.max_message_bytes)

    def crash_prefill(self, instance: int = 0) -> None:
        self.runtime.run(self.prefill_servers[instance].stop(grace=0))

    def wait_peers_connected(self, timeout: float = 5.0) -> bool:
        """True once every channel the servers hold to each other is READY (after a restart a
        channel reconnects with a backoff: calls made meanwhile wait for it)."""

        async def ready() -> bool:
            servers = (self.router_server, *self._workers())
            deadline = time.monotonic() + timeout
            for server in servers:
                for channel in list(server._channels.values()):
                    while True:
                        state = channel.get_state(try_to_connect=True)
                        if state is grpc.ChannelConnectivity.READY:
                            break
                        left = deadline - time.monotonic()
                        if left <= 0:
                            return False
                        try:
                            await asyncio.wait_for(channel.wait_for_state_change(state), left)
                        except TimeoutError:
                            return False
            return True

        return bool(self.runtime.run(ready(), timeout + 5))

    def _router_sees(self, address: str, epoch: int, timeout: float = 5.0) -> None:
        """A restart is complete once the router knows the new incarnation (until then it
        refuses to hand requests over to that role: they could reach either incarnation)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.runtime.call(lambda: self.router_server.known_epoch(address)) == epoch:
                return
            time.sleep(0.005)
        raise TransportError(f"the router did not reconnect to {address} within {timeout}s")

    def set_faults(self, plan: FaultPlan | None) -> None:
        """Fault campaigns: send every control message between prefill and decode through
        ``plan`` (impl.servers.faults), restarted servers included; None turns faults off."""
        self.faults = plan
        for server in self._workers():
            server.faults = plan

    def restart_prefill(self, instance: int = 0) -> None:
        old = self.prefill_servers[instance]
        server = PrefillServer(
            old.settings, self.mode, self._log("prefill", instance), restarted=True
        )
        server.faults = self.faults
        self.runtime.run(server.start())
        self.prefill_servers[instance] = server
        self._router_sees(server.address, server.boot_epoch)

    def crash_decode(self, instance: int = 0) -> None:
        self.runtime.run(self.decode_servers[instance].stop(grace=0))

    def restart_decode(self, instance: int = 0) -> None:
        old = self.decode_servers[instance]
        server = DecodeServer(old.settings, self.mode, self._log("decode", instance))
        server.faults = self.faults
        self.runtime.run(server.start())
        self.decode_servers[instance] = server
        self._router_sees(server.address, server.boot_epoch)

    def placement(self, request_id: str) -> tuple[int, int] | None:
        """The (prefill, decode) instances the router placed an active request on (None once
        the router has answered it)."""
        router = self.router_server
        rid = RequestId(request_id)
        return self.runtime.call(lambda: router._placed.get(rid))

    def pin_placement(self, request_id: str, prefill: int, decode: int) -> None:
        """Test harness hook: the router places the next request of this id on these instances
        instead of the least loaded ones (the conformance target plays the spec's fixed
        placements with it)."""
        n, m = len(self.prefill_servers), len(self.decode_servers)
        if not (0 <= prefill < n and 0 <= decode < m):
            raise ConfigError(
                f"placement ({prefill}, {decode}) of {request_id!r}: the cluster runs prefill "
                f"instances 0..{n - 1} and decode instances 0..{m - 1}"
            )
        router = self.router_server
        rid = RequestId(request_id)
        self.runtime.call(lambda: router.pinned.__setitem__(rid, (prefill, decode)))

    def stall_prefill_writes(self, request_id: str, after_messages: int = 1) -> None:
        """Fault injection: prefill pauses the writes of ``request_id`` after that many messages
        (on every prefill instance: the request's is the one that writes)."""
        servers = list(self.prefill_servers)

        def stall() -> None:
            for server in servers:
                server.stall_after[RequestId(request_id)] = after_messages

        self.runtime.call(stall)

    def resume_prefill_writes(self, request_id: str) -> None:
        servers = list(self.prefill_servers)

        def resume() -> None:
            for server in servers:
                server.stall_after.pop(RequestId(request_id), None)

        self.runtime.call(resume)

    def decode_grant(self, request_id: str) -> GrantView | None:
        """The grant a decode instance holds for ``request_id`` (the first that holds one)."""
        cores = [server.core for server in self.decode_servers]

        def find() -> GrantView | None:
            for core in cores:
                view = core.grant_of(RequestId(request_id))
                if view is not None:
                    return view
            return None

        return self.runtime.call(find)

    def wait_for_grant(
        self, request_id: str, pages_written: int = 0, timeout: float = 10.0
    ) -> GrantView:
        """Block until decode holds a grant for ``request_id`` with at least that many pages written."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            view = self.decode_grant(request_id)
            if view is not None and len(view.written) >= pages_written:
                return view
            time.sleep(0.01)
        raise TimeoutError(
            f"decode never held a grant for {request_id!r} with {pages_written} pages written"
        )

    def decode_pages(self, instance: int = 0) -> tuple[int, int]:
        """(free, used) pages of a decode instance's pool."""
        core = self.decode_servers[instance].core
        return self.runtime.call(lambda: (core.free_pages, core.used_pages))

    def quiescent(self) -> bool:
        def check() -> bool:
            return (
                all(
                    not d.core.active_requests() and d.core.used_pages == 0
                    for d in self.decode_servers
                )
                and not any(p.core.active_requests() for p in self.prefill_servers)
                and not self.router_server.core.active_requests()
            )

        return self.runtime.call(check)

    def wait_quiescent(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.quiescent():
                return True
            time.sleep(0.05)
        return self.quiescent()

    def stop(self) -> None:
        async def stop_all() -> None:
            for server in (self.router_server, *self.decode_servers, *self.prefill_servers):
                if not server._stopping:
                    await server.stop(grace=0.5)

        try:
            self.runtime.run(stop_all(), timeout=30)
        finally:
            self.runtime.close()
            for log in self._logs.values():
                log.close()
            if self._tmp is not None:
                self._tmp.cleanup()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


MAX_INSTANCES = 16
"""The most instances of one role a cluster starts (each is a server with its own pool)."""


def start_cluster(mode: str = "reference", **settings: Any) -> Cluster:
    """Start a cluster; ``settings`` are `ClusterConfig` fields (unknown names: ConfigError)."""
    known = set(ClusterConfig.__dataclass_fields__)
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConfigError(f"unknown cluster settings {unknown}; known: {sorted(known)}")
    return Cluster(ClusterConfig(mode=mode, **settings))


def _free_port(host: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


__all__ = ["Cluster", "ClusterConfig", "Limits", "defaults_for", "start_cluster"]
