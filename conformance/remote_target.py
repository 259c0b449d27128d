"""A `Target` that speaks the harness service (conformance/proto/.../harness.proto) to an engine
at HOST:PORT: `kvhandoff conform --target HOST:PORT`.

Every `Target` operation is one RPC (the table in docs/conformance-guide.md). gRPC errors are
translated once, here, into `TargetError`s that name the address and the RPC:

    TargetError                       conformance.target: the target failed, no verdict
    └── HarnessError                  any failure of a harness call
        ├── HarnessUnreachable        nothing answers at the address (UNAVAILABLE, deadline)
        ├── HarnessRefused            the engine refused a value we sent (INVALID_ARGUMENT, ...)
        ├── HarnessUnimplemented      the engine does not implement an RPC the suite needs
        └── HarnessBroken             the engine failed (INTERNAL) or broke the contract (an
                                      event line that is not a JSON event object, ...)

An RPC answered UNIMPLEMENTED for a step or a fault (`Deliver`, `Drop`, `FireTimeout`,
`RestartPrefill`, ...) is not an error: the operation is recorded in `not_covered()` and not
asked again in this run; the runner treats it as a step not taken, and the report lists it.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

import grpc

from kvhandoff.conformance.target import Event, Target, TargetAnswer, TargetError
from kvhandoff.spec.config import Config

# Events of a coarse engine can be many per trace; gRPC's default 4 MiB is too tight for them.
MAX_MESSAGE_BYTES = 64 << 20
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
_HOSTNAME = re.compile(
    r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$"
)


class AddressError(ValueError):
    """A HOST:PORT that cannot be an address; the message says which part and why."""


def parse_address(text: str, allow_port_zero: bool = False) -> tuple[str, int]:
    """`HOST:PORT` (HOST a name, an IPv4 address or a bracketed IPv6 address) -> (host, port).
    `allow_port_zero`: for a listening address, where 0 means any free port."""
    if "://" in text:
        raise AddressError(f"{text!r}: give HOST:PORT without a scheme (e.g. 127.0.0.1:50061)")
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise AddressError(f"{text!r}: expected HOST:PORT (e.g. 127.0.0.1:50061)")
    if host.startswith("["):
        if not host.endswith("]"):
            raise AddressError(f"{text!r}: an IPv6 host goes in brackets, e.g. [::1]:50061")
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError as exc:
            raise AddressError(f"{text!r}: {host} is not an IPv6 address ({exc})") from None
    elif ":" in host:
        raise AddressError(f"{text!r}: an IPv6 host goes in brackets, e.g. [::1]:50061")
    elif not _HOSTNAME.match(host):
        raise AddressError(f"{text!r}: {host!r} is not a host name or IPv4 address")
    lowest = 0 if allow_port_zero else 1
    if not port_text.isdigit() or not lowest <= int(port_text) <= 65535:
        raise AddressError(
            f"{text!r}: port {port_text!r} is not a number in {lowest}..65535"
            + (" (0: any free port)" if allow_port_zero else "")
        )
    return host, int(port_text)


class HarnessError(TargetError):
    """A harness call failed; the message names the address, the RPC and the engine's reason."""

    def __init__(self, address: str, rpc: str, detail: str, code: str = "") -> None:
        super().__init__(f"harness service at {address}: {rpc}: {detail}")
        self.address = address
        self.rpc = rpc
        self.detail = detail
        self.code = code


class HarnessUnreachable(HarnessError):
    pass


class HarnessRefused(HarnessError):
    pass


class HarnessUnimplemented(HarnessError):
    pass


class HarnessBroken(HarnessError):
    pass


def _translate(address: str, rpc: str, exc: grpc.RpcError) -> HarnessError:
    code = exc.code() if isinstance(exc, grpc.Call) else None
    name = code.name if code is not None else "UNKNOWN"
    detail = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return HarnessUnreachable(
            address,
            rpc,
            f"no answer ({name}: {detail}); is the engine's harness service (or "
            "`kvhandoff harness-serve`) running there?",
            name,
        )
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return HarnessUnimplemented(address, rpc, f"UNIMPLEMENTED: {detail}", name)
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE):
        return HarnessRefused(address, rpc, f"{name}: {detail}", name)
    return HarnessBroken(address, rpc, f"{name}: {detail}", name)


class RemoteTarget(Target):
    """An engine behind the harness service. Nothing is sent until the first operation (or
    `connect()`); `fine_grained` and `name` come from the engine's Info."""

    def __init__(
        self, address: str, timeout_s: float = 120.0, connect_timeout_s: float = 10.0
    ) -> None:
        parse_address(address)  # raises AddressError before any I/O
        self.address = address
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._info: Any = None
        self._session = ""
        self._ids: list[str] = []
        self._uncovered: dict[str, str] = {}
        self.last_headers: list[dict[str, Any]] = []
        """The engine's event-log headers from the last `take_events` (read by coarse runs)."""

    # ------------------------------------------------------------------ plumbing

    def _rpc(self, rpc: str, request: Any, timeout: float | None = None) -> Any:
        if self._stub is None:
            from kvhandoff.conformance.proto.rpc import harness_stub

            self._channel = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)
            self._stub = harness_stub(self._channel)
        try:
            return getattr(self._stub, rpc)(request, timeout=timeout or self.timeout_s)
        except grpc.RpcError as exc:
            raise _translate(self.address, rpc, exc) from exc

    def connect(self) -> Any:
        """Ask the engine who it is (Info); raises `HarnessUnreachable` naming the address when
        nothing answers. Cached: the answer is the engine's `InfoResponse`."""
        if self._info is None:
            from kvhandoff.conformance.proto.rpc import pb

            self._info = self._rpc("Info", pb.InfoRequest(), timeout=self.connect_timeout_s)
        return self._info

    @property
    def name(self) -> str:
        info = self._info
        return f"{info.name} at {self.address}" if info is not None and info.name else self.address

    @name.setter
    def name(self, value: str) -> None:
        raise AttributeError("a remote target is named by its engine (Info.name)")

    @property
    def fine_grained(self) -> bool:
        return bool(self.connect().fine_grained)

    @fine_grained.setter
    def fine_grained(self, value: bool) -> None:
        raise AttributeError("a remote target's granularity is the engine's (Info.fine_grained)")

    @property
    def retries(self) -> bool:  # type: ignore[override]
        """Whether the engine plays retries (Info.retries): `retry`, and the attempt of a message."""
        return bool(self.connect().retries)

    @property
    def instances(self) -> bool:  # type: ignore[override]
        """Whether the engine plays several prefill and decode instances (Info.instances)."""
        return bool(self.connect().instances)

    def modes(self) -> list[str]:
        """The modes the engine accepts (empty: it does not say)."""
        return list(self.connect().modes)

    def _session_ref(self) -> Any:
        from kvhandoff.conformance.proto.rpc import pb

        return pb.SessionRef(session=self._session)

    def _request_ref(self, r: int) -> Any:
        from kvhandoff.conformance.proto.rpc import pb

        return pb.RequestRef(session=self._session, request=r)

    def _optional(self, op: str, rpc: str, request: Any) -> bool:
        """A step or fault: UNIMPLEMENTED means not covered (recorded once, not asked again)."""
        if op in self._uncovered:
            return False
        try:
            return bool(self._rpc(rpc, request).performed)
        except HarnessUnimplemented as exc:
            self._uncovered[op] = exc.detail
            return False

    def not_covered(self) -> dict[str, str]:
        return dict(self._uncovered)

    # ------------------------------------------------------------------ the Target API

    def start(self, config: Config, mode: str) -> None:
        from kvhandoff.conformance.proto.rpc import pb

        self.connect()
        reset = pb.ResetRequest(config_json=json.dumps(config.to_json()), mode=mode)
        reset.shortfall.update({r: n for r, n in self.shortfall.items() if n})
        reply = self._rpc("Reset", reset)
        if len(reply.request_ids) != len(config.requests):
            raise HarnessBroken(
                self.address,
                "Reset",
                f"returned {len(reply.request_ids)} request ids for a scenario of "
                f"{len(config.requests)} requests",
            )
        self._session = reply.session
        self._ids = list(reply.request_ids)

    def request_id(self, r: int) -> str:
        return self._ids[r] if r < len(self._ids) else f"r{r}"

    def submit(self, r: int) -> None:
        self._rpc("Submit", self._request_ref(r))

    def cancel(self, r: int) -> bool:
        return self._optional("cancel", "Cancel", self._request_ref(r))

    # Fine-grained operations: a coarse engine is never asked them (the Target contract: it
    # supports submit, cancel, crashes and settle only), so its report lists no noise.

    def deliver(
        self, kind: str, r: int, page: int | None = None, attempt: int | None = None
    ) -> bool:
        from kvhandoff.conformance.proto.rpc import pb

        if not self.fine_grained:
            return False
        req = pb.DeliverRequest(session=self._session, kind=kind, request=r)
        if page is not None:
            req.page = page
        if attempt is not None:
            req.attempt = attempt
        return self._optional(f"deliver {kind}", "Deliver", req)

    def _message_fault(self, rpc: str, kind: str, r: int, attempt: int | None) -> bool:
        from kvhandoff.conformance.proto.rpc import pb

        if not self.fine_grained:
            return False
        req = pb.MessageRef(session=self._session, kind=kind, request=r)
        if attempt is not None:
            req.attempt = attempt
        return self._optional(f"{rpc.lower()} {kind}", rpc, req)

    def drop(self, kind: str, r: int, attempt: int | None = None) -> bool:
        return self._message_fault("Drop", kind, r, attempt)

    def retransmit(self, kind: str, r: int, attempt: int | None = None) -> bool:
        return self._message_fault("Retransmit", kind, r, attempt)

    def duplicate(self, kind: str, r: int, attempt: int | None = None) -> bool:
        return self._message_fault("Duplicate", kind, r, attempt)

    def retry(self, r: int) -> bool:
        if not self.retries:
            return False
        return self._optional("retry", "Retry", self._request_ref(r))

    def fire_timeout(self, r: int) -> bool:
        if not self.fine_grained:
            return False
        return self._optional("fire_timeout", "FireTimeout", self._request_ref(r))

    def prefill_abort(self, r: int) -> bool:
        if not self.fine_grained:
            return False
        return self._optional("prefill_abort", "PrefillAbort", self._request_ref(r))

    def _instance_ref(self, pinst: int = 0, dinst: int = 0) -> Any:
        from kvhandoff.conformance.proto.rpc import pb

        if (pinst or dinst) and not self.instances:
            # The suite asks for another instance only of an engine that said it has them.
            raise ValueError(
                f"prefill instance {pinst}, decode instance {dinst} asked of {self.address}, "
                "which plays one instance of each (Info.instances is false)"
            )
        return pb.InstanceRef(session=self._session, prefill_instance=pinst, decode_instance=dinst)

    def _restart(self, op: str, rpc: str, ref: Any) -> None:
        # The Target API has no "not performed" for a crash; an engine that cannot crash a
        # worker says UNIMPLEMENTED, and the crash is reported as not covered.
        if op in self._uncovered:
            return
        try:
            self._rpc(rpc, ref)
        except HarnessUnimplemented as exc:
            self._uncovered[op] = exc.detail

    def suspect_prefill_dead(self, dinst: int = 0, pinst: int = 0) -> bool:
        if not self.fine_grained:
            return False
        req = self._instance_ref(pinst, dinst)
        return self._optional("suspect_prefill_dead", "SuspectPrefillDead", req)

    def restart_prefill(self, pinst: int = 0) -> None:
        self._restart("restart_prefill", "RestartPrefill", self._instance_ref(pinst=pinst))

    def restart_decode(self, dinst: int = 0) -> None:
        self._restart("restart_decode", "RestartDecode", self._instance_ref(dinst=dinst))

    def probe(self, attack: Any) -> Any:
        """The engine's decode against one forged message (the Probe RPC); None where the engine
        has nothing to forge it from now, or cannot probe at all (then reported not covered)."""
        from kvhandoff.conformance.adversary import ProbeResult
        from kvhandoff.conformance.proto.rpc import pb

        if not self.fine_grained or "probe" in self._uncovered:
            return None
        req = pb.ProbeRequest(session=self._session, attack=attack.kind, request=attack.request)
        try:
            got = self._rpc("Probe", req)
        except HarnessUnimplemented as exc:
            self._uncovered["probe"] = exc.detail
            return None
        if not got.performed:
            return None
        return ProbeResult(got.outcome, got.changed, got.detail)

    def page_contents(self) -> dict[int, str | None] | None:
        """Whose data each decode page holds (the PageContents RPC); None where the engine
        cannot tell (then reported not covered, and the data check is not made)."""
        if "page_contents" in self._uncovered:
            return None
        try:
            got = self._rpc("PageContents", self._session_ref())
        except HarnessUnimplemented as exc:
            self._uncovered["page_contents"] = exc.detail
            return None
        if not got.known:
            return None
        return {c.page: (c.writer if c.HasField("writer") else None) for c in got.pages}

    def settle(self) -> None:
        self._rpc("Settle", self._session_ref())

    def take_events(self) -> list[Event]:
        reply = self._rpc("Events", self._session_ref())
        self.last_headers = [
            self._json_object("Events", "header", i, line) for i, line in enumerate(reply.headers)
        ]
        events = []
        for i, line in enumerate(reply.events):
            ev = self._json_object("Events", "event", i, line)
            if not (
                isinstance(ev.get("server"), str)
                and isinstance(ev.get("event"), str)
                and isinstance(ev.get("args"), dict)
            ):
                raise HarnessBroken(
                    self.address,
                    "Events",
                    f"event {i} is not an event line of docs/event-log.md (needs string "
                    f"'server' and 'event', object 'args'): {line[:200]}",
                )
            events.append(ev)
        return events

    def _json_object(self, rpc: str, what: str, i: int, line: str) -> dict[str, Any]:
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HarnessBroken(
                self.address, rpc, f"{what} {i} is not JSON ({exc}): {line[:200]}"
            ) from None
        if not isinstance(value, dict):
            raise HarnessBroken(self.address, rpc, f"{what} {i} is not a JSON object: {line[:200]}")
        return value

    def answers(self) -> dict[int, TargetAnswer]:
        reply = self._rpc("Answers", self._session_ref())
        out: dict[int, TargetAnswer] = {}
        for a in reply.answers:
            if a.request >= len(self._ids):
                raise HarnessBroken(
                    self.address,
                    "Answers",
                    f"an answer for request {a.request}, but the scenario has "
                    f"{len(self._ids)} requests",
                )
            out[a.request] = TargetAnswer(
                ok=a.ok,
                code=a.code,
                message=a.message,
                read=[p.tenant if p.HasField("tenant") else None for p in a.read],
                foreign=[(f.writer, f.tenant) for f in a.foreign],
            )
        return out

    def quiescent(self) -> bool:
        return bool(self._rpc("Quiescent", self._session_ref()).quiescent)

    def describe(self) -> str:
        try:
            return str(self._rpc("Describe", self._session_ref()).text)
        except HarnessUnimplemented:
            return "(the engine does not implement Describe)"

    def wait_answered(self, r: int) -> None:
        try:
            self._rpc("WaitAnswered", self._request_ref(r))
        except HarnessUnimplemented:
            return None  # optional: the runner then relies on the engine's own ordering

    def close(self) -> None:
        if self._session:
            try:
                self._rpc("Close", self._session_ref())
            except HarnessUnimplemented:
                pass  # optional: Reset starts clean anyway

    def shutdown(self) -> None:
        try:
            if self._session:
                try:
                    self._rpc("Shutdown", self._session_ref())
                except HarnessUnimplemented:
                    pass  # optional: the engine keeps its resources
        finally:
            self._session = ""
            if self._channel is not None:
                self._channel.close()
                self._channel = None
                self._stub = None


__all__ = [
    "AddressError",
    "HarnessBroken",
    "HarnessError",
    "HarnessRefused",
    "HarnessUnimplemented",
    "HarnessUnreachable",
    "RemoteTarget",
    "parse_address",
]
