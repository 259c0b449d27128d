"""The reference harness server: serves `kvhandoff.harness.v1.Harness` by wrapping a local
`Target` (`kvhandoff harness-serve --backend inproc|grpc`).

It is the worked example for an engine team: each RPC checks its arguments, calls the one
`Target` method it mirrors, and answers. It is also how the tests drive the remote path end to
end (`kvhandoff conform --target HOST:PORT` against it must agree with `--target inproc`).

    server = serve("127.0.0.1:0", "inproc")   # port 0: any free port
    server.address                            # "127.0.0.1:41234"
    server.stop()

Rules it follows (harness.proto's header):
- one session at a time: Reset opens one; a call naming another is FAILED_PRECONDITION;
- bad values (request index, step or message kind, config, mode) are INVALID_ARGUMENT with a
  message that names the value and what was expected;
- an operation the backend cannot perform at all (it does not override that `Target` method:
  the gRPC cluster cannot drop one message) is UNIMPLEMENTED;
- the backend raising is INTERNAL, with the exception in the message;
and after any of them it keeps serving. Calls are serialised: a `Target` is single-threaded.
Info declares what the backend plays (`Target.retries`, `Target.instances`); Reset, Retry, the
message operations' `attempt` and the instance RPCs then accept it, and refuse it otherwise.
"""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import HealthServicer

from kvhandoff.conformance.proto.rpc import add_harness, pb
from kvhandoff.conformance.remote_target import CHANNEL_OPTIONS, parse_address
from kvhandoff.conformance.target import (
    STEP_KINDS,
    Target,
    UnsupportedScenario,
    require_one_prefill_rank,
)
from kvhandoff.spec.config import Config, ConfigError

BACKENDS = ("inproc", "grpc")
MESSAGE_KINDS = ("grant", "completion", "failure", "abort", "abort_ack")
# The grpc backend allocates real KV pools: refuse scenarios that would exhaust the machine.
MAX_POOL_TOKENS = 1 << 20

R = TypeVar("R")


class _Refusal(Exception):
    """Answer the call with `code` and `message` (raised inside a handler)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def make_backend(name: str) -> Target:
    if name == "inproc":
        from kvhandoff.conformance.inproc import InProcTarget

        return InProcTarget()
    if name == "grpc":
        from kvhandoff.conformance.grpc_target import GrpcTarget

        return GrpcTarget()
    raise ValueError(f"unknown backend {name!r}; backends: {', '.join(BACKENDS)}")


def _overrides(target: Target, method: str) -> bool:
    """Whether the backend implements `method` (the base class's default means "cannot")."""
    return getattr(type(target), method) is not getattr(Target, method)


class HarnessServicer:
    """The service methods; gRPC calls them on its worker threads."""

    def __init__(self, backend: str, factory: Callable[[], Target] | None = None) -> None:
        self.backend = backend
        self._factory = factory or (lambda: make_backend(backend))
        # Made now, started by Reset (a gRPC backend starts its cluster only then).
        self._target: Target | None = self._factory()
        self._fine_grained = self._target.fine_grained
        # What the backend plays beyond version 1's one instance of each and no retries: told
        # in Info, and what Reset, Retry, the attempts and the instance RPCs then accept.
        self._retries = self._target.retries
        self._instances = self._target.instances
        self._lock = threading.Lock()
        self._session = ""
        self._config: Config | None = None

    def plays(self) -> dict[str, bool]:
        """What the backend plays, as Info says it (and `harness-serve --json` prints it)."""
        return {
            "fine_grained": self._fine_grained,
            "retries": self._retries,
            "instances": self._instances,
        }

    # ------------------------------------------------------------------ plumbing

    def _serve(self, rpc: str, context: Any, body: Callable[[], R]) -> R:
        """Run `body` under the lock; turn refusals and backend failures into statuses."""
        try:
            with self._lock:
                return body()
        except _Refusal as exc:
            context.abort(exc.code, exc.message)
        except Exception as exc:  # the backend failed: report it, keep serving
            print(f"harness-serve: {rpc} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            context.abort(
                grpc.StatusCode.INTERNAL,
                f"{rpc}: the {self.backend} backend failed: {type(exc).__name__}: {exc}",
            )
        raise AssertionError("unreachable: context.abort raises")

    def _check_session(self, session: str) -> Target:
        if self._target is None or not self._session:
            raise _Refusal(grpc.StatusCode.FAILED_PRECONDITION, "no session: call Reset first")
        if session != self._session:
            raise _Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"session {session!r} is not the current one ({self._session!r}): another client "
                "reset the target since (one run at a time)",
            )
        return self._target

    def _check_request(self, r: int) -> None:
        assert self._config is not None
        n = len(self._config.requests)
        if not 0 <= r < n:
            raise _Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request {r} is out of range: the scenario has {n} requests (0..{n - 1})",
            )

    def _check_instance(self, role: str, i: int) -> None:
        """An instance number of the current scenario (instance 0 always exists)."""
        assert self._config is not None
        n = self._config.prefill_instances if role == "prefill" else self._config.decode_instances
        if not 0 <= i < n:
            raise _Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{role} instance {i} is out of range: the scenario has {n} {role} "
                f"instance{'s' if n != 1 else ''} (0..{n - 1})",
            )

    def _attempt(self, request: Any) -> dict[str, int | None]:
        """The `attempt=` keyword for a backend that plays retries (None where the message
        names none); nothing for one that does not, which is refused an attempt."""
        given = request.attempt if request.HasField("attempt") else None
        if self._retries:
            return {"attempt": given}
        if given is not None:
            raise _Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"attempt {given} given, but the {self.backend} backend does not play retries "
                "(Info.retries is false): leave it unset",
            )
        return {}

    def _capable(self, target: Target, method: str, rpc: str) -> None:
        if not _overrides(target, method):
            raise _Refusal(
                grpc.StatusCode.UNIMPLEMENTED,
                f"the {self.backend} backend cannot perform {rpc} "
                f"({'fine-grained' if target.fine_grained else 'coarse'} target: Target."
                f"{method} is not implemented)",
            )

    def _kind(self, kind: str, allowed: tuple[str, ...], what: str) -> None:
        if kind not in allowed:
            raise _Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown {what} {kind!r}; expected one of: {', '.join(allowed)}",
            )

    # ------------------------------------------------------------------ lifecycle

    def Info(self, request: Any, context: Any) -> Any:
        # Without the lock: a client may ask who we are while another call (a long Settle) runs.
        from kvhandoff.impl.modes import MODES

        return pb.InfoResponse(
            name=self.backend,
            fine_grained=self._fine_grained,
            modes=list(MODES),
            event_log_version=1,
            retries=self._retries,
            instances=self._instances,
        )

    def Reset(self, request: Any, context: Any) -> Any:
        from kvhandoff.impl.modes import MODES

        def body() -> Any:
            try:
                data = json.loads(request.config_json)
            except json.JSONDecodeError as exc:
                raise _Refusal(
                    grpc.StatusCode.INVALID_ARGUMENT, f"config_json is not JSON: {exc}"
                ) from None
            if not isinstance(data, dict):
                raise _Refusal(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"config_json must be a JSON object (a trace header's config), got "
                    f"{type(data).__name__}",
                )
            try:
                config = Config.from_json(data)
                require_one_prefill_rank(config, retries=self._retries, instances=self._instances)
            except (ConfigError, TypeError, UnsupportedScenario) as exc:
                raise _Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"config_json: {exc}") from None
            pool = max(config.decode_pages, sum(q.pages for q in config.requests))
            if pool * config.page_size > MAX_POOL_TOKENS:
                raise _Refusal(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"config_json: a pool of {pool} pages of {config.page_size} tokens is over "
                    f"this server's limit of {MAX_POOL_TOKENS} tokens",
                )
            shortfall = dict(request.shortfall)
            for r, tokens in sorted(shortfall.items()):
                if r >= len(config.requests) or tokens >= config.page_size:
                    raise _Refusal(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"shortfall {{{r}: {tokens}}}: a shortfall names a request of the "
                        f"scenario (0..{len(config.requests) - 1}) and is under page_size "
                        f"({config.page_size}) tokens",
                    )
            if request.mode not in MODES:
                raise _Refusal(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"unknown mode {request.mode!r}; modes: {', '.join(MODES)}",
                )
            if self._target is None:
                self._target = self._factory()
            self._session = ""  # the old session ends even if start fails
            self._config = config
            self._target.shortfall = shortfall
            self._target.start(config, request.mode)
            self._session = uuid.uuid4().hex
            return pb.ResetResponse(
                session=self._session,
                request_ids=[self._target.request_id(r) for r in range(len(config.requests))],
            )

        return self._serve("Reset", context, body)

    def Close(self, request: Any, context: Any) -> Any:
        def body() -> Any:
            self._check_session(request.session).close()
            return pb.Done()

        return self._serve("Close", context, body)

    def Shutdown(self, request: Any, context: Any) -> Any:
        # Releases the backend (a gRPC cluster stops); the service keeps serving, and the next
        # Reset starts a fresh backend.
        def body() -> Any:
            target = self._check_session(request.session)
            self._session = ""
            self._target = None
            target.shutdown()
            return pb.Done()

        return self._serve("Shutdown", context, body)

    # ------------------------------------------------------------------ operations

    def _on_request(self, rpc: str, method: str, request: Any, context: Any) -> Any:
        """An operation on one request: Submit, Cancel, FireTimeout, PrefillAbort, WaitAnswered."""

        def body() -> Any:
            target = self._check_session(request.session)
            self._check_request(request.request)
            if method in ("fire_timeout", "prefill_abort"):
                self._capable(target, method, rpc)
            result = getattr(target, method)(request.request)
            if isinstance(result, bool):
                return pb.Performed(performed=result)
            return pb.Done()

        return self._serve(rpc, context, body)

    def Submit(self, request: Any, context: Any) -> Any:
        return self._on_request("Submit", "submit", request, context)

    def Cancel(self, request: Any, context: Any) -> Any:
        return self._on_request("Cancel", "cancel", request, context)

    def FireTimeout(self, request: Any, context: Any) -> Any:
        return self._on_request("FireTimeout", "fire_timeout", request, context)

    def PrefillAbort(self, request: Any, context: Any) -> Any:
        return self._on_request("PrefillAbort", "prefill_abort", request, context)

    def WaitAnswered(self, request: Any, context: Any) -> Any:
        return self._on_request("WaitAnswered", "wait_answered", request, context)

    def Deliver(self, request: Any, context: Any) -> Any:
        def body() -> Any:
            target = self._check_session(request.session)
            self._kind(request.kind, STEP_KINDS, "step kind")
            page = request.page if request.HasField("page") else None
            if request.kind == "heartbeat":
                # Names no request: decode instance `request` probes prefill instance `page`.
                self._check_instance("decode", request.request)
                self._check_instance("prefill", page or 0)
            else:
                self._check_request(request.request)
            self._capable(target, "deliver", "Deliver")
            if request.kind == "write" and page is None:
                raise _Refusal(
                    grpc.StatusCode.INVALID_ARGUMENT, "Deliver of kind 'write' needs a page"
                )
            attempt = self._attempt(request)
            performed = target.deliver(request.kind, request.request, page, **attempt)
            return pb.Performed(performed=performed)

        return self._serve("Deliver", context, body)

    def _message_fault(self, rpc: str, method: str, request: Any, context: Any) -> Any:
        def body() -> Any:
            target = self._check_session(request.session)
            self._kind(request.kind, MESSAGE_KINDS, "message kind")
            self._check_request(request.request)
            self._capable(target, method, rpc)
            attempt = self._attempt(request)
            performed = getattr(target, method)(request.kind, request.request, **attempt)
            return pb.Performed(performed=bool(performed))

        return self._serve(rpc, context, body)

    def Drop(self, request: Any, context: Any) -> Any:
        return self._message_fault("Drop", "drop", request, context)

    def Retransmit(self, request: Any, context: Any) -> Any:
        return self._message_fault("Retransmit", "retransmit", request, context)

    def Duplicate(self, request: Any, context: Any) -> Any:
        return self._message_fault("Duplicate", "duplicate", request, context)

    def _on_target(self, rpc: str, method: str, request: Any, context: Any) -> Any:
        def body() -> Any:
            getattr(self._check_session(request.session), method)()
            return pb.Done()

        return self._serve(rpc, context, body)

    def _instances_of(self, request: Any, which: tuple[str, ...]) -> dict[str, int]:
        """The `pinst=` / `dinst=` keywords of an instance RPC, where not 0 (a backend of one
        instance of each is called as in version 1, with none)."""
        where: dict[str, int] = {}
        for role in which:
            i = getattr(request, f"{role}_instance")
            self._check_instance(role, i)
            if i:
                where["pinst" if role == "prefill" else "dinst"] = i
        return where

    def Retry(self, request: Any, context: Any) -> Any:
        def body() -> Any:
            target = self._check_session(request.session)
            self._check_request(request.request)
            if not self._retries:
                raise _Refusal(
                    grpc.StatusCode.UNIMPLEMENTED,
                    f"the {self.backend} backend does not play retries (Info.retries is false)",
                )
            return pb.Performed(performed=bool(target.retry(request.request)))

        return self._serve("Retry", context, body)

    def RestartPrefill(self, request: Any, context: Any) -> Any:
        def body() -> Any:
            target = self._check_session(request.session)
            target.restart_prefill(**self._instances_of(request, ("prefill",)))
            return pb.Done()

        return self._serve("RestartPrefill", context, body)

    def RestartDecode(self, request: Any, context: Any) -> Any:
        def body() -> Any:
            target = self._check_session(request.session)
            target.restart_decode(**self._instances_of(request, ("decode",)))
            return pb.Done()

        return self._serve("RestartDecode", context, body)

    def SuspectPrefillDead(self, request: Any, context: Any) -> Any:
        # A partition (spec decode_suspect_prefill_dead): performed or not, like a step.
        def body() -> Any:
            target = self._check_session(request.session)
            self._capable(target, "suspect_prefill_dead", "SuspectPrefillDead")
            where = self._instances_of(request, ("decode", "prefill"))
            return pb.Performed(performed=bool(target.suspect_prefill_dead(**where)))

        return self._serve("SuspectPrefillDead", context, body)

    def Probe(self, request: Any, context: Any) -> Any:
        from kvhandoff.conformance.adversary import ATTACKS, Attack

        def body() -> Any:
            target = self._check_session(request.session)
            self._kind(request.attack, ATTACKS, "attack")
            self._check_request(request.request)
            self._capable(target, "probe", "Probe")
            got = target.probe(Attack(request.attack, request.request))
            if got is None:
                return pb.ProbeResponse(performed=False)
            return pb.ProbeResponse(
                performed=True, outcome=got.outcome, changed=got.changed, detail=got.detail
            )

        return self._serve("Probe", context, body)

    def Settle(self, request: Any, context: Any) -> Any:
        return self._on_target("Settle", "settle", request, context)

    # ------------------------------------------------------------------ results

    def Events(self, request: Any, context: Any) -> Any:
        def body() -> Any:
            target = self._check_session(request.session)
            events = target.take_events()
            # A coarse backend's scenario is read from its servers' log headers (GrpcTarget
            # keeps the last ones it read); a fine-grained one has none.
            headers = getattr(target, "last_headers", None) or []
            return pb.EventsResponse(
                headers=[json.dumps(h, sort_keys=True) for h in headers],
                events=[json.dumps(e, sort_keys=True) for e in events],
            )

        return self._serve("Events", context, body)

    def Answers(self, request: Any, context: Any) -> Any:
        def body() -> Any:
            answers = self._check_session(request.session).answers()
            return pb.AnswersResponse(
                answers=[
                    pb.Answer(
                        request=r,
                        ok=a.ok,
                        code=a.code,
                        message=a.message,
                        read=[
                            pb.PageRead(tenant=t) if t is not None else pb.PageRead()
                            for t in a.read
                        ],
                        foreign=[pb.ForeignCanary(writer=w, tenant=t) for w, t in a.foreign],
                    )
                    for r, a in sorted(answers.items())
                ]
            )

        return self._serve("Answers", context, body)

    def PageContents(self, request: Any, context: Any) -> Any:
        def body() -> Any:
            target = self._check_session(request.session)
            self._capable(target, "page_contents", "PageContents")
            contents = target.page_contents()
            if contents is None:
                return pb.PageContentsResponse(known=False)
            pages = [
                pb.PageContent(page=p, writer=w) if w is not None else pb.PageContent(page=p)
                for p, w in sorted(contents.items())
            ]
            return pb.PageContentsResponse(known=True, pages=pages)

        return self._serve("PageContents", context, body)

    def Quiescent(self, request: Any, context: Any) -> Any:
        def body() -> Any:
            return pb.QuiescentResponse(quiescent=self._check_session(request.session).quiescent())

        return self._serve("Quiescent", context, body)

    def Describe(self, request: Any, context: Any) -> Any:
        def body() -> Any:
            return pb.DescribeResponse(text=self._check_session(request.session).describe())

        return self._serve("Describe", context, body)

    def release(self) -> None:
        """Release the backend (server stop)."""
        with self._lock:
            target, self._target, self._session = self._target, None, ""
        if target is not None:
            target.shutdown()


@dataclass
class HarnessServer:
    server: grpc.Server
    servicer: HarnessServicer
    address: str
    health: HealthServicer | None = None

    def stop(self, grace: float | None = 1.0) -> None:
        if self.health is not None:
            self.health.enter_graceful_shutdown()  # probes see NOT_SERVING first
        self.server.stop(grace).wait()
        self.servicer.release()


HEALTH_SERVICE = "kvhandoff.harness.v1.Harness"


class ListenError(ValueError):
    """The listening address is malformed or cannot be bound."""


def serve(
    listen: str = "127.0.0.1:0",
    backend: str = "inproc",
    factory: Callable[[], Target] | None = None,
) -> HarnessServer:
    """Start serving on `listen` (port 0: any free port); returns at once (threads serve)."""
    from kvhandoff.conformance.remote_target import AddressError

    try:
        host, _ = parse_address(listen, allow_port_zero=True)
    except AddressError as exc:
        raise ListenError(f"--listen {exc}") from exc
    if backend not in BACKENDS and factory is None:
        raise ListenError(f"unknown backend {backend!r}; backends: {', '.join(BACKENDS)}")
    servicer = HarnessServicer(backend, factory)
    # A few workers so Info answers while a long Settle runs; the servicer's lock keeps the
    # backend single-threaded.
    # gRPC sets SO_REUSEPORT by default on Linux: a second harness-serve on the same port would
    # bind too and silently take half the connections. Without it the second bind fails.
    options = [*CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=options)
    add_harness(servicer, server)
    # The standard health service, so orchestrators and `grpc_health_probe` can wait for it.
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError as exc:  # grpc's way of saying the address is unusable (or taken)
        raise ListenError(f"cannot listen on {listen}: {exc} (is the port in use?)") from exc
    server.start()
    for service in ("", HEALTH_SERVICE):
        health.set(service, health_pb2.HealthCheckResponse.SERVING)
    return HarnessServer(server, servicer, f"{host}:{port}", health)


__all__ = [
    "BACKENDS",
    "MESSAGE_KINDS",
    "HarnessServer",
    "HarnessServicer",
    "ListenError",
    "make_backend",
    "serve",
]
