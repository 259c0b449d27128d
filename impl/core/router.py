"""Router's protocol core: fans each client request out to prefill and decode, answers the client.

Like SGLang's router it sends the request to both workers at once (same room) and returns decode's
answer. The reference router also honours prefill: it answers OK only when both sides finished OK;
a prefill error cancels decode and is what the client sees; a decode error cancels prefill.
A client cancel withdraws the request from both. `m16_router_ignores_prefill_error` answers with
decode's result alone; `m15_silent_prefill_abort` answers prefill's error but does not relay it
to decode.

Retries: a client that got an error for a request may submit it again under the same request id
(`ClientSubmit(retry=True)`, the API's `GenerateRequest.retry`). The router keeps the ids it
answered with an error (bounded), and hands a retry to both workers with the same tenant and room
and the next attempt number (0 for a first submission, then 1, 2, ...), which every message about
the request carries: prefill and decode drop a message of another attempt than the one they hold,
so the first attempt's late messages cannot act on the retry. A retry is refused while the id is
still in progress, when its last answer was OK, for another tenant, and past `max_retries`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from kvhandoff.impl.core.common import Log, LogValue, Reply, RequestId, Room, Status, Tenant
from kvhandoff.impl.errors import LocalProtocolError
from kvhandoff.impl.modes import Behaviour


@dataclass(frozen=True)
class RouterConfig:
    context_window: int
    max_new_tokens: int = 1024
    behaviour: Behaviour = field(default_factory=Behaviour)
    max_retries: int = 1  # retries a client may make of one request id (0: none)
    max_failed_ids: int = 4096  # ids answered with an error kept for a retry (oldest dropped)


@dataclass(frozen=True)
class ClientSubmit:
    request_id: RequestId
    tenant: Tenant
    room: Room  # chosen by the caller (random in the edge)
    prompt_len: int
    max_tokens: int
    now: float
    retry: bool = False
    """Retry a request id the router answered with an error: same tenant and room (``room`` is
    ignored), the next attempt."""


@dataclass(frozen=True)
class PrefillFinished:
    request_id: RequestId
    status: Status
    message: str = ""
    broken: bool = False
    """The call broke (prefill crashed or cannot be reached) rather than prefill answering."""


@dataclass(frozen=True)
class DecodeFinished:
    request_id: RequestId
    status: Status
    message: str = ""


@dataclass(frozen=True)
class ClientCancel:
    request_id: RequestId
    reason: str = "client cancelled"


RouterEvent = ClientSubmit | PrefillFinished | DecodeFinished | ClientCancel


@dataclass(frozen=True)
class ForwardToPrefill:
    request_id: RequestId
    tenant: Tenant
    room: Room
    prompt_len: int
    attempt: int = 0


@dataclass(frozen=True)
class ForwardToDecode:
    request_id: RequestId
    tenant: Tenant
    room: Room
    prompt_len: int
    max_tokens: int
    attempt: int = 0


@dataclass(frozen=True)
class CancelAtPrefill:
    request_id: RequestId
    reason: str
    attempt: int = 0


@dataclass(frozen=True)
class AbortAtDecode:
    request_id: RequestId
    reason: str
    attempt: int = 0


@dataclass(frozen=True)
class AnswerClient:
    """Finish the client's generate call: OK carries decode's tokens (held by the edge)."""

    request_id: RequestId
    status: Status
    message: str = ""


RouterCommand = (
    Log
    | Reply
    | ForwardToPrefill
    | ForwardToDecode
    | CancelAtPrefill
    | AbortAtDecode
    | AnswerClient
)


@dataclass
class _Request:
    request_id: RequestId
    tenant: Tenant
    room: Room
    prefill: tuple[Status, str] | None = None
    prefill_broken: bool = False
    decode: tuple[Status, str] | None = None
    answered: bool = False
    attempt: int = 0
    ok: bool = False  # the client's answer was OK


@dataclass(frozen=True)
class _Failed:
    """A request id answered with an error, kept so that the client may retry it."""

    tenant: Tenant
    room: Room
    attempt: int


class RouterCore:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self._b = config.behaviour
        self._requests: dict[RequestId, _Request] = {}
        self._failed: OrderedDict[RequestId, _Failed] = OrderedDict()

    def active_requests(self) -> list[RequestId]:
        return list(self._requests)

    def attempt_of(self, request_id: RequestId) -> int | None:
        """The attempt of an active request, else None."""
        req = self._requests.get(request_id)
        return None if req is None else req.attempt

    def tenant_of(self, request_id: RequestId) -> Tenant | None:
        """The tenant of an active request (for the edge's authorization), else None."""
        req = self._requests.get(request_id)
        return req.tenant if req is not None else None

    def handle(self, event: RouterEvent) -> list[RouterCommand]:
        match event:
            case ClientSubmit():
                return self._on_submit(event)
            case PrefillFinished():
                req = self._requests.get(event.request_id)
                if req is not None and req.prefill is None:
                    req.prefill_broken = event.broken
                return self._on_side(event.request_id, "prefill", event.status, event.message)
            case DecodeFinished():
                return self._on_side(event.request_id, "decode", event.status, event.message)
            case ClientCancel():
                return self._on_cancel(event)
        raise LocalProtocolError(f"router core cannot handle {event!r}")

    def _on_submit(self, ev: ClientSubmit) -> list[RouterCommand]:
        if ev.request_id in self._requests:
            return [Reply(Status.ALREADY_EXISTS, f"request {ev.request_id!r} is already active")]
        attempt, room = 0, ev.room
        if ev.retry:
            failed = self._failed.get(ev.request_id)
            if failed is None or failed.tenant != ev.tenant:
                # Another tenant's id is refused like an unknown one (no id enumeration).
                return [
                    Reply(
                        Status.FAILED_PRECONDITION,
                        f"no failed request {ev.request_id!r} to retry (a retry follows an error "
                        "answer, once both workers have finished with the request)",
                    )
                ]
            if failed.attempt >= self.config.max_retries:
                return [
                    Reply(
                        Status.RESOURCE_EXHAUSTED,
                        f"request {ev.request_id!r} was already tried {failed.attempt + 1} times "
                        f"(max_retries={self.config.max_retries})",
                    )
                ]
            attempt, room = failed.attempt + 1, failed.room
        args: dict[str, LogValue] = {
            "request_id": ev.request_id,
            "tenant": ev.tenant,
            "room": room,
            "prompt_tokens": ev.prompt_len,
            "max_tokens": ev.max_tokens,
        }
        if attempt:
            args["attempt"] = attempt
        problem: tuple[Status, str] | None = None
        if ev.prompt_len < 1:
            problem = (Status.INVALID_ARGUMENT, f"prompt length {ev.prompt_len} must be >= 1")
        elif ev.prompt_len > self.config.context_window:
            problem = (
                Status.OUT_OF_RANGE,
                f"prompt of {ev.prompt_len} tokens exceeds the context window of "
                f"{self.config.context_window} tokens",
            )
        elif not 1 <= ev.max_tokens <= self.config.max_new_tokens:
            problem = (
                Status.INVALID_ARGUMENT,
                f"max_tokens {ev.max_tokens} must be in 1..{self.config.max_new_tokens}",
            )
        if problem is not None:
            return [
                Log(
                    "router_reject_request",
                    {**args, "code": problem[0].value, "reason": problem[1]},
                ),
                Reply(problem[0], problem[1]),
            ]
        if attempt:
            # Taken: the id is in progress again (and failed again, kept again, on an error).
            del self._failed[ev.request_id]
        req = _Request(ev.request_id, ev.tenant, room, attempt=attempt)
        self._requests[ev.request_id] = req
        return [
            Log("router_retry_request" if attempt else "router_submit_request", args),
            ForwardToPrefill(ev.request_id, ev.tenant, room, ev.prompt_len, attempt),
            ForwardToDecode(ev.request_id, ev.tenant, room, ev.prompt_len, ev.max_tokens, attempt),
        ]

    def _on_side(
        self, rid: RequestId, side: str, status: Status, message: str
    ) -> list[RouterCommand]:
        req = self._requests.get(rid)
        if req is None:
            return []
        result = (status, message)
        cmds: list[RouterCommand] = [
            Log(
                f"router_receive_{side}_result",
                {
                    "request_id": rid,
                    "status": "ok" if status is Status.OK else "error",
                    "code": status.value,
                },
            )
        ]
        if side == "prefill":
            req.prefill = result
        else:
            req.decode = result
        if not req.answered:
            cmds += self._decide(req)
        if req.answered and req.prefill is not None and req.decode is not None:
            self._finish(req)
        return cmds

    def _finish(self, req: _Request) -> None:
        """Both workers have reported: the id leaves the router; an error answer is kept so
        that the client may retry it."""
        del self._requests[req.request_id]
        if not req.ok:
            self._failed[req.request_id] = _Failed(req.tenant, req.room, req.attempt)
            self._failed.move_to_end(req.request_id)
            while len(self._failed) > self.config.max_failed_ids:
                self._failed.popitem(last=False)

    def _decide(self, req: _Request) -> list[RouterCommand]:
        p, d = req.prefill, req.decode
        if self._b.router_ignores_prefill_error:
            # M16: prefill's verdict is drained and ignored; decode's answer goes back as is.
            return self._answer(req, *d) if d is not None else []
        if p is not None and p[0] is not Status.OK:
            cmds: list[RouterCommand] = []
            # Relaying prefill's failure to decode is the reference's second path for prefill's
            # own notice; M15 has neither (decode keeps waiting until its timeout). A broken call
            # is relayed even then: it is a prefill crash seen by the router first, which decode
            # would also detect itself.
            silent = self._b.silent_prefill_abort and not req.prefill_broken
            if d is None and not silent:
                cmds.append(AbortAtDecode(req.request_id, f"prefill failed: {p[1]}", req.attempt))
            return cmds + self._answer(req, p[0], f"prefill: {p[1]}")
        if d is not None and d[0] is not Status.OK:
            cmds = []
            if p is None:
                cmds.append(CancelAtPrefill(req.request_id, f"decode failed: {d[1]}", req.attempt))
            return cmds + self._answer(req, d[0], f"decode: {d[1]}")
        if p is not None and d is not None:
            return self._answer(req, Status.OK)
        return []

    def _on_cancel(self, ev: ClientCancel) -> list[RouterCommand]:
        req = self._requests.get(ev.request_id)
        if req is None or req.answered:
            return [Reply(Status.NOT_FOUND, f"no active request {ev.request_id!r}")]
        cmds: list[RouterCommand] = [
            Log("client_cancel_request", {"request_id": req.request_id, "tenant": req.tenant})
        ]
        if req.decode is None:
            cmds.append(AbortAtDecode(req.request_id, ev.reason, req.attempt))
        if req.prefill is None:
            cmds.append(CancelAtPrefill(req.request_id, ev.reason, req.attempt))
        cmds += self._answer(req, Status.CANCELLED, f"request {req.request_id!r} cancelled")
        if req.prefill is not None and req.decode is not None:
            self._finish(req)
        return [*cmds, Reply(Status.OK)]

    def _answer(self, req: _Request, status: Status, message: str = "") -> list[RouterCommand]:
        req.answered = True
        req.ok = status is Status.OK
        args: dict[str, LogValue] = {
            "request_id": req.request_id,
            "tenant": req.tenant,
            "status": "ok" if status is Status.OK else "error",
        }
        if status is not Status.OK:
            args["code"] = status.value
        return [Log("router_answer_client", args), AnswerClient(req.request_id, status, message)]
