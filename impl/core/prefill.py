"""Prefill's protocol core: admits prompts, pairs them with decode's grants, drives the writes.

The router sends each request to prefill and decode at the same time (SGLang's early policy), so
a grant may arrive before or after prefill admits the request. Lifecycle (reference mode)::

    SubmitRequest --admit--> ADMITTED --GrantReceived (matches)--> WRITING
        |                        \\-- grant covers a different length --> rejected (nothing written)
        | over the limit         WRITING --PageSent* .. WritesFinished(OK)--> COMPLETING
        v                        COMPLETING --CompletionAnswered(OK)--> done, answered OK
      rejected: RejectionNotice to decode, error to the router, nothing written

Rules:

* A rejection writes nothing and is told to decode and to the client.
* Prefill writes exactly the granted pages, in grant order, tagged with (request, room,
  generation, token); its completion carries the number of pages written and the digest of their
  data, computed from what it actually sent (`PageSent`).
* An abort from decode stops the writes; the ack goes out only once the write stream has closed
  (drained), which is what makes decode's release fenced.
* A grant for a request prefill has not (yet) admitted is parked, keyed by (request, room), until
  a deadline; then it is dropped and decode told.
* A prefill-side abort (router cancel, failed write stream, `FailRequest`) is told to decode.
* Attempts: a client may retry a failed request under the same id (the router numbers the
  attempts 0, 1, ...). Every message about a request carries its attempt; prefill holds one
  attempt of a request id at a time and drops a grant, an abort or a cancel of another attempt
  (logged with ``outcome: "stale_attempt"``), so a first attempt's late message cannot act on the
  retry. Tombstones are kept per (request, attempt): a retry with a higher attempt is admitted, a
  replay of an attempt already seen (or older than one seen) is still refused.

Modes change these rules; see `impl.modes`. A prompt that prefill itself swapped for a placeholder
(M1) or truncated (M6) bootstraps normally: prefill writes the pages it has data for and never
compares its view with the grant's (the reference refuses a grant for another length).
"""

from __future__ import annotations

import enum
import hmac
from collections import OrderedDict
from dataclasses import dataclass, field

from kvhandoff.impl.core.common import (
    Generation,
    Log,
    LogValue,
    PageId,
    Reply,
    RequestId,
    Room,
    Status,
    Tenant,
    completion_digest,
    pages_for,
)
from kvhandoff.impl.errors import LocalProtocolError
from kvhandoff.impl.modes import Behaviour


@dataclass(frozen=True)
class PrefillConfig:
    page_size: int
    max_prompt_tokens: int
    orphan_grant_timeout_s: float = 10.0
    max_parked_grants: int = 1024
    max_tombstones: int = 4096
    max_active_requests: int = 1024  # admitted requests not yet finished (pending state bound)
    # An admitted request whose grant has not come by then fails (SGLang's bootstrap timeout):
    # its decode side may be gone (a hand-over that crossed a restart, a request decode already
    # failed), and nothing else would ever end it. None: wait forever (the in-process cores).
    grant_timeout_s: float | None = None
    behaviour: Behaviour = field(default_factory=Behaviour)


# ---------------------------------------------------------------------------------------- events


@dataclass(frozen=True)
class SubmitRequest:
    request_id: RequestId
    tenant: Tenant
    room: Room
    prompt_len: int
    now: float
    attempt: int = 0


@dataclass(frozen=True)
class GrantReceived:
    request_id: RequestId
    room: Room
    generation: Generation
    pages: tuple[PageId, ...]
    token: bytes
    prompt_len: int  # decode's view of the prompt length
    now: float
    attempt: int = 0


@dataclass(frozen=True)
class PageSent:
    """The edge put one page on the write stream (``index`` is its position in the grant)."""

    request_id: RequestId
    generation: Generation
    page_id: PageId
    index: int
    digest: bytes
    message_id: int


@dataclass(frozen=True)
class WritesFinished:
    """The write stream closed: OK when decode accepted every page, else why not."""

    request_id: RequestId
    generation: Generation
    status: Status
    message: str = ""


@dataclass(frozen=True)
class CompletionAnswered:
    request_id: RequestId
    generation: Generation
    status: Status
    message: str = ""


@dataclass(frozen=True)
class AbortReceived:
    """Decode asks prefill to stop writing ``generation`` and ack once drained. ``token`` is the
    grant's capability: an abort binds request, room, generation and token like a write does."""

    request_id: RequestId
    room: Room
    generation: Generation
    token: bytes = b""
    attempt: int = 0


@dataclass(frozen=True)
class CancelRequest:
    """The router withdraws the request (its attempt ``attempt``)."""

    request_id: RequestId
    reason: str
    attempt: int = 0


@dataclass(frozen=True)
class FailRequest:
    """Prefill gives up on a request on its own before writing any page: its scheduler aborted
    it (a failed forward pass, out of memory, an operator's abort). Once the writes started, a
    failure is the write stream's (`WritesFinished` with an error)."""

    request_id: RequestId
    status: Status
    reason: str


@dataclass(frozen=True)
class Tick:
    now: float


PrefillEvent = (
    SubmitRequest
    | GrantReceived
    | PageSent
    | WritesFinished
    | CompletionAnswered
    | AbortReceived
    | CancelRequest
    | FailRequest
    | Tick
)

# -------------------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class StartWrites:
    """Compute the KV of the prompt (``prompt_len`` tokens of prefill's own view, or the
    placeholder) and stream it into ``pages`` (in order), tagged with the grant's identity."""

    request_id: RequestId
    room: Room
    generation: Generation
    token: bytes
    pages: tuple[PageId, ...]
    prompt_len: int
    placeholder: bool
    attempt: int = 0


@dataclass(frozen=True)
class CancelWrites:
    request_id: RequestId
    generation: Generation


@dataclass(frozen=True)
class SendCompletion:
    request_id: RequestId
    room: Room
    generation: Generation
    token: bytes
    page_count: int
    digest: bytes
    attempt: int = 0


@dataclass(frozen=True)
class SendRejection:
    request_id: RequestId
    room: Room
    status: Status
    reason: str
    attempt: int = 0


@dataclass(frozen=True)
class SendAbortAck:
    """The ack echoes the abort's capability token, so decode can tell it from a forgery."""

    request_id: RequestId
    room: Room
    generation: Generation
    token: bytes = b""
    attempt: int = 0


@dataclass(frozen=True)
class AnswerRequest:
    """Finish the router's submit call."""

    request_id: RequestId
    status: Status
    message: str = ""
    attempt: int = 0


PrefillCommand = (
    Log
    | Reply
    | StartWrites
    | CancelWrites
    | SendCompletion
    | SendRejection
    | SendAbortAck
    | AnswerRequest
)


class PrefillState(enum.Enum):
    ADMITTED = "admitted"
    WRITING = "writing"
    COMPLETING = "completing"


@dataclass(frozen=True)
class _Grant:
    request_id: RequestId
    room: Room
    generation: Generation
    pages: tuple[PageId, ...]
    token: bytes
    prompt_len: int
    deadline: float | None
    attempt: int = 0


@dataclass
class _Request:
    request_id: RequestId
    tenant: Tenant
    room: Room
    prompt_len: int  # prefill's own view (1 for a placeholder, the limit when truncated)
    placeholder: bool
    truncated: bool = False
    state: PrefillState = PrefillState.ADMITTED
    grant: _Grant | None = None
    sent: list[tuple[PageId, bytes]] = field(default_factory=list)
    stop_reason: str = ""  # set when writes are being cancelled: "abort" or "cancel"
    grant_deadline: float | None = None
    attempt: int = 0


class PrefillCore:
    """Sans-I/O prefill worker."""

    def __init__(self, config: PrefillConfig) -> None:
        if config.page_size < 1:
            raise LocalProtocolError("page size must be >= 1")
        self.config = config
        self._b = config.behaviour
        self._requests: dict[RequestId, _Request] = {}
        # Keyed by (request, room), not by room alone: rooms may be shared (client-chosen rooms,
        # fan-outs), and a stale grant parked for a request prefill forgot in a restart must not
        # block the next request that reuses its room.
        self._parked: dict[tuple[RequestId, Room], _Grant] = {}
        # Tombstones, per (request, attempt): a retry (a higher attempt) is admitted, a replay
        # of an attempt already seen is refused.
        self._finished: OrderedDict[tuple[RequestId, int], str] = OrderedDict()
        # Aborts that overtook the router's submit, with the room they named: only a submit for
        # that room is refused later, so a guessed request id cannot poison a future request.
        self._early_aborts: OrderedDict[tuple[RequestId, int], Room] = OrderedDict()
        # The highest attempt seen of each request id: a message or submit of an older one is
        # stale. Bounded like the tombstones.
        self._latest: OrderedDict[RequestId, int] = OrderedDict()

    @property
    def parked_grants(self) -> int:
        return len(self._parked)

    def active_requests(self) -> dict[RequestId, str]:
        return {rid: r.state.value for rid, r in self._requests.items()}

    def attempt_of(self, request_id: RequestId) -> int | None:
        """The attempt prefill holds of an active request, else None."""
        req = self._requests.get(request_id)
        return None if req is None else req.attempt

    def _stale(self, rid: RequestId, attempt: int) -> int | None:
        """The attempt that makes `attempt` of `rid` stale (a newer one prefill has seen or
        holds), else None."""
        req = self._requests.get(rid)
        if req is not None and req.attempt != attempt:
            return req.attempt
        latest = self._latest.get(rid)
        if latest is not None and attempt < latest:
            return latest
        return None

    def _note_attempt(self, rid: RequestId, attempt: int) -> None:
        if self._latest.get(rid, -1) < attempt:
            self._latest[rid] = attempt
            self._latest.move_to_end(rid)
            while len(self._latest) > self.config.max_tombstones:
                self._latest.popitem(last=False)

    def handle(self, event: PrefillEvent) -> list[PrefillCommand]:
        match event:
            case SubmitRequest():
                return self._on_submit(event)
            case GrantReceived():
                return self._on_grant(event)
            case PageSent():
                return self._on_page_sent(event)
            case WritesFinished():
                return self._on_writes_finished(event)
            case CompletionAnswered():
                return self._on_completion_answered(event)
            case AbortReceived():
                return self._on_abort(event)
            case CancelRequest():
                return self._on_cancel(event)
            case FailRequest():
                return self._on_fail_request(event)
            case Tick():
                return self._on_tick(event)
        raise LocalProtocolError(f"prefill core cannot handle {event!r}")

    # ------------------------------------------------------------------ admission

    def _on_submit(self, ev: SubmitRequest) -> list[PrefillCommand]:
        tomb = (ev.request_id, ev.attempt)
        early_room = self._early_aborts.pop(tomb, None)
        if early_room is not None and early_room == ev.room:
            self._remember_finished(ev.request_id, "aborted", ev.attempt)
        live = self._requests.get(ev.request_id)
        if live is not None and live.attempt != ev.attempt:
            return [
                Reply(
                    Status.ALREADY_EXISTS,
                    f"request {ev.request_id!r}: attempt {live.attempt} is still in progress "
                    f"(attempt {ev.attempt} refused)",
                )
            ]
        if live is not None or tomb in self._finished:
            return [
                Reply(
                    Status.ALREADY_EXISTS,
                    f"request {ev.request_id!r} already seen"
                    + (f" (attempt {ev.attempt})" if ev.attempt else ""),
                )
            ]
        newer = self._stale(ev.request_id, ev.attempt)
        if newer is not None:
            return [
                Reply(
                    Status.ALREADY_EXISTS,
                    f"request {ev.request_id!r}: attempt {ev.attempt} is stale, attempt {newer} "
                    "was already seen",
                )
            ]
        self._note_attempt(ev.request_id, ev.attempt)
        base: dict[str, LogValue] = _with_attempt(
            {
                "request_id": ev.request_id,
                "tenant": ev.tenant,
                "room": ev.room,
                "prompt_tokens": ev.prompt_len,
            },
            ev.attempt,
        )
        if ev.prompt_len < 1:
            return [Reply(Status.INVALID_ARGUMENT, f"prompt length {ev.prompt_len} must be >= 1")]
        if len(self._requests) >= self.config.max_active_requests:
            return [
                Reply(
                    Status.RESOURCE_EXHAUSTED,
                    f"prefill already holds {len(self._requests)} requests, its bound "
                    f"(max_active_requests={self.config.max_active_requests})",
                )
            ]
        limit = self.config.max_prompt_tokens
        own_len, placeholder, truncated = ev.prompt_len, False, False
        cmds: list[PrefillCommand] = []
        if ev.prompt_len > limit:
            reason = f"prompt of {ev.prompt_len} tokens exceeds prefill's limit of {limit} tokens"
            if self._b.placeholder_rejection:
                # M1: the verdict is recorded but the request carries on as a 1-token stub.
                own_len, placeholder = 1, True
                cmds.append(
                    Log("prefill_reject_request", {**base, "reason": reason, "placeholder": True})
                )
            elif self._b.truncate_oversized:
                own_len, truncated = limit, True  # M6: silently keep only what fits
                cmds.append(Log("prefill_admit_request", {**base, "truncated_to": limit}))
            else:
                self._remember_finished(ev.request_id, "rejected", ev.attempt)
                self._parked.pop((ev.request_id, ev.room), None)
                return [
                    Log("prefill_reject_request", {**base, "reason": reason, "placeholder": False}),
                    SendRejection(ev.request_id, ev.room, Status.OUT_OF_RANGE, reason, ev.attempt),
                    AnswerRequest(ev.request_id, Status.OUT_OF_RANGE, reason, ev.attempt),
                ]
        else:
            cmds.append(Log("prefill_admit_request", base))
        req = _Request(ev.request_id, ev.tenant, ev.room, own_len, placeholder, truncated)
        req.attempt = ev.attempt
        if self.config.grant_timeout_s is not None:
            req.grant_deadline = ev.now + self.config.grant_timeout_s
        self._requests[ev.request_id] = req
        key = (ev.request_id, ev.room)
        if key not in self._parked and self._b.accept_orphan_grants:
            # M18: any grant parked for the room is adopted, whoever it was issued for.
            key = next((k for k in self._parked if k[1] == ev.room), key)
        parked = self._parked.pop(key, None)
        if parked is not None and parked.attempt < ev.attempt and not self._b.accept_orphan_grants:
            parked = None  # a grant of an earlier attempt of this id: stale, dropped
        if parked is not None:
            cmds += self._attach(req, parked)
        return cmds

    # ------------------------------------------------------------------ grants

    def _grant_args(self, ev: GrantReceived) -> dict[str, LogValue]:
        args: dict[str, LogValue] = {
            "request_id": ev.request_id,
            "room": ev.room,
            "generation": ev.generation,
            "pages": list(ev.pages),
            "page_count": len(ev.pages),
            "prompt_tokens": ev.prompt_len,
        }
        return _with_attempt(args, ev.attempt)

    def _on_grant(self, ev: GrantReceived) -> list[PrefillCommand]:
        args = self._grant_args(ev)
        grant = _Grant(
            ev.request_id,
            ev.room,
            ev.generation,
            ev.pages,
            ev.token,
            ev.prompt_len,
            None if self._b.accept_orphan_grants else ev.now + self.config.orphan_grant_timeout_s,
            ev.attempt,
        )
        newer = self._stale(ev.request_id, ev.attempt)
        if newer is not None:
            # A grant of another attempt of this request id than the one prefill holds (a
            # retried request's first attempt): stale, dropped, never taken for the retry's.
            reason = f"grant of attempt {ev.attempt}, prefill holds attempt {newer}"
            return [
                Log(
                    "prefill_receive_grant",
                    {**args, "outcome": "stale_attempt", "reason": reason},
                ),
                Reply(Status.FAILED_PRECONDITION, f"request {ev.request_id!r}: {reason}"),
            ]
        req = self._requests.get(ev.request_id)
        if req is None:
            finished = self._finished.get((ev.request_id, ev.attempt))
            if finished is None and self._early_aborts.get((ev.request_id, ev.attempt)) == ev.room:
                finished = "aborted"
            if finished == "failed" and self._b.silent_prefill_abort:
                # M15: prefill's own failure stays local; the grant is acked and goes nowhere
                # (SGLang's bootstrap thread stores it), so decode keeps waiting.
                return [
                    Log(
                        "prefill_receive_grant", {**args, "outcome": "dropped", "reason": finished}
                    ),
                    Reply(Status.OK),
                ]
            if finished is not None:
                return [
                    Log(
                        "prefill_receive_grant", {**args, "outcome": "refused", "reason": finished}
                    ),
                    Reply(Status.FAILED_PRECONDITION, f"request {ev.request_id!r} is {finished}"),
                ]
            key = (ev.request_id, ev.room)
            parked = self._parked.get(key)
            if parked is not None and parked.attempt < ev.attempt:
                parked = None  # a grant of an earlier attempt: replaced by this one
            if parked is not None and parked.generation == ev.generation:
                return [Reply(Status.OK)]  # duplicate delivery of the parked grant
            if parked is not None and parked.generation > ev.generation:
                # Generations only grow, across decode restarts too: this one is stale.
                return [
                    Reply(
                        Status.FAILED_PRECONDITION,
                        f"grant generation {ev.generation} for request {ev.request_id!r} is older "
                        f"than the parked generation {parked.generation}",
                    )
                ]
            if (
                parked is None
                and len(self._parked) >= self.config.max_parked_grants
                and not self._b.accept_orphan_grants
            ):
                return [
                    Reply(
                        Status.RESOURCE_EXHAUSTED,
                        f"{len(self._parked)} grants already wait for their requests",
                    )
                ]
            self._parked[key] = grant  # a newer generation replaces the parked one
            return [Log("prefill_receive_grant", {**args, "outcome": "parked"}), Reply(Status.OK)]
        if ev.room != req.room:
            return [
                Reply(
                    Status.INVALID_ARGUMENT,
                    f"room {ev.room} is not the room {req.room} of request {ev.request_id!r}",
                )
            ]
        if req.grant is not None:
            if req.grant.generation == ev.generation:
                return [Reply(Status.OK)]  # duplicate delivery
            return [
                Reply(
                    Status.FAILED_PRECONDITION,
                    f"request {ev.request_id!r} already holds generation {req.grant.generation}",
                )
            ]
        return [*self._attach(req, grant), Reply(Status.OK)]

    def _attach(self, req: _Request, grant: _Grant) -> list[PrefillCommand]:
        req.grant = grant
        cmds: list[PrefillCommand] = [
            Log(
                "prefill_receive_grant",
                {
                    "request_id": req.request_id,
                    "room": grant.room,
                    "generation": grant.generation,
                    "pages": list(grant.pages),
                    "page_count": len(grant.pages),
                    "prompt_tokens": grant.prompt_len,
                    "outcome": "matched",
                    **({"attempt": req.attempt} if req.attempt else {}),
                },
            )
        ]
        own_pages = pages_for(req.prompt_len, self.config.page_size)
        if own_pages != len(grant.pages) or req.prompt_len != grant.prompt_len:
            # A prompt prefill swapped (M1) or cut (M6) itself bootstraps like any other, and
            # M2 never compares its own view with the grant: they write what they have.
            if not (req.placeholder or req.truncated or self._b.local_completion_count):
                reason = (
                    f"grant of {len(grant.pages)} pages for {grant.prompt_len} tokens does not "
                    f"match prefill's {req.prompt_len} tokens ({own_pages} pages)"
                )
                cmds.append(
                    Log(
                        "prefill_reject_request",
                        {
                            "request_id": req.request_id,
                            "room": req.room,
                            "reason": reason,
                            "placeholder": False,
                        },
                    )
                )
                cmds += self._fail(req, Status.FAILED_PRECONDITION, reason, tell_decode=True)
                return cmds
        # Prefill writes only pages it has data for: its own view, never more than granted (the
        # whole grant in the reference, where the two agree).
        targets = grant.pages[: min(own_pages, len(grant.pages))]
        req.state = PrefillState.WRITING
        cmds.append(
            StartWrites(
                req.request_id,
                grant.room,
                grant.generation,
                grant.token,
                targets,
                req.prompt_len,
                req.placeholder,
                req.attempt,
            )
        )
        return cmds

    # ------------------------------------------------------------------ writes and completion

    def _current(self, rid: RequestId, generation: Generation) -> _Request:
        req = self._requests.get(rid)
        if req is None or req.grant is None or req.grant.generation != generation:
            raise LocalProtocolError(f"no writes of generation {generation} for request {rid!r}")
        return req

    def _on_page_sent(self, ev: PageSent) -> list[PrefillCommand]:
        req = self._current(ev.request_id, ev.generation)
        req.sent.append((ev.page_id, ev.digest))
        return [
            Log(
                "prefill_write_page",
                {
                    "request_id": ev.request_id,
                    "room": req.room,
                    "generation": ev.generation,
                    "page": ev.page_id,
                    "index": ev.index,
                    "message_id": ev.message_id,
                    "digest": ev.digest.hex(),
                },
            )
        ]

    def _on_writes_finished(self, ev: WritesFinished) -> list[PrefillCommand]:
        req = self._current(ev.request_id, ev.generation)
        grant = req.grant
        assert grant is not None
        if req.stop_reason == "abort":
            cmds: list[PrefillCommand] = [
                SendAbortAck(req.request_id, req.room, grant.generation, grant.token, req.attempt)
            ]
            return cmds + self._fail(
                req, Status.ABORTED, "decode aborted the handoff", tell_decode=False
            )
        if req.stop_reason == "cancel":
            return self._fail(req, Status.CANCELLED, "cancelled by the router", tell_decode=True)
        if ev.status is not Status.OK:
            return self._fail(
                req, ev.status, f"writing pages to decode failed: {ev.message}", tell_decode=True
            )
        pages = [p for p, _ in req.sent]
        digest = completion_digest(grant.generation, pages, [d for _, d in req.sent])
        if self._b.omit_completion_digest:
            digest = b""  # M5: the integrity check is off on the sending side
        # M2: "done" by its own view of the prompt, claiming every granted page is covered.
        count = len(grant.pages) if self._b.local_completion_count else len(pages)
        req.state = PrefillState.COMPLETING
        return [
            Log(
                "prefill_send_completion",
                {
                    "request_id": req.request_id,
                    "room": req.room,
                    "generation": grant.generation,
                    "page_count": count,
                    "pages_written": len(pages),
                    "prompt_tokens": req.prompt_len,
                    "digest": digest.hex(),
                },
            ),
            SendCompletion(
                req.request_id, req.room, grant.generation, grant.token, count, digest, req.attempt
            ),
        ]

    def _on_completion_answered(self, ev: CompletionAnswered) -> list[PrefillCommand]:
        req = self._requests.get(ev.request_id)
        if req is None or req.state is not PrefillState.COMPLETING:
            return []
        if ev.status is Status.OK:
            self._forget(req, "finished")
            return [
                Log(
                    "prefill_finish_request",
                    _with_attempt({"request_id": req.request_id, "status": "ok"}, req.attempt),
                ),
                AnswerRequest(req.request_id, Status.OK, attempt=req.attempt),
            ]
        # Decode refused the completion and has already failed the request: no notice needed.
        return self._fail(
            req, ev.status, f"decode refused the completion: {ev.message}", tell_decode=False
        )

    # ------------------------------------------------------------------ aborts

    def _on_abort(self, ev: AbortReceived) -> list[PrefillCommand]:
        args: dict[str, LogValue] = _with_attempt(
            {
                "request_id": ev.request_id,
                "room": ev.room,
                "generation": ev.generation,
            },
            ev.attempt,
        )
        newer = self._stale(ev.request_id, ev.attempt)
        if newer is not None:
            # An abort of another attempt of this request id (a retried request's first
            # attempt): stale, never taken for the attempt prefill holds, which carries on. An
            # earlier attempt is over at prefill (nothing of it can be in flight), so its abort
            # is acked: a decode still releasing that attempt's pages waits for the ack.
            reason = f"abort of attempt {ev.attempt}, prefill holds attempt {newer}"
            cmds: list[PrefillCommand] = [
                Log(
                    "prefill_receive_abort",
                    {**args, "in_flight": False, "outcome": "stale_attempt", "reason": reason},
                )
            ]
            if ev.attempt < newer:
                cmds.append(
                    SendAbortAck(ev.request_id, ev.room, ev.generation, ev.token, ev.attempt)
                )
            return [*cmds, Reply(Status.OK)]
        req = self._requests.get(ev.request_id)
        # An abort kills a request, so it is checked like a write: the room must be the
        # request's, and where prefill knows the grant (held or parked), generation and token
        # must be the grant's. A refused abort changes nothing and is not acked.
        if req is not None and ev.room != req.room:
            return [
                Reply(
                    Status.INVALID_ARGUMENT,
                    f"abort names room {ev.room}, not the room {req.room} of request "
                    f"{ev.request_id!r}",
                )
            ]
        known = req.grant if req is not None else self._parked.get((ev.request_id, ev.room))
        if known is not None and known.attempt != ev.attempt:
            known = None
        if (
            known is not None
            and known.generation == ev.generation
            and not hmac.compare_digest(known.token, ev.token)
        ):
            return [
                Reply(
                    Status.PERMISSION_DENIED,
                    f"abort's capability token does not match generation {ev.generation} "
                    f"of request {ev.request_id!r}",
                )
            ]
        parked = self._parked.get((ev.request_id, ev.room))
        if (
            parked is not None
            and parked.attempt == ev.attempt
            and parked.generation == ev.generation
            and not self._b.accept_orphan_grants
        ):
            del self._parked[
                (ev.request_id, ev.room)
            ]  # M18 keeps the orphan's transfer state regardless
        ack = SendAbortAck(ev.request_id, ev.room, ev.generation, ev.token, ev.attempt)
        if req is None or req.grant is None or req.grant.generation != ev.generation:
            cmds = [Log("prefill_receive_abort", {**args, "in_flight": False})]
            if req is not None and req.grant is None:
                cmds += self._fail(
                    req, Status.ABORTED, "decode aborted the request", tell_decode=False
                )
            elif req is None and (ev.request_id, ev.attempt) not in self._finished:
                # The abort overtook the router's submit: refuse the request when it arrives
                # (for this room and attempt only).
                self._early_aborts[(ev.request_id, ev.attempt)] = ev.room
                while len(self._early_aborts) > self.config.max_tombstones:
                    self._early_aborts.popitem(last=False)
            return [*cmds, ack, Reply(Status.OK)]
        if req.state is PrefillState.WRITING:
            if not req.stop_reason:
                req.stop_reason = "abort"
                return [
                    Log("prefill_receive_abort", {**args, "in_flight": True}),
                    CancelWrites(req.request_id, ev.generation),
                    Reply(Status.OK),
                ]
            req.stop_reason = "abort"  # a router cancel is already stopping it; ack when drained
            return [Log("prefill_receive_abort", {**args, "in_flight": True}), Reply(Status.OK)]
        cmds = [Log("prefill_receive_abort", {**args, "in_flight": False})]
        cmds += self._fail(req, Status.ABORTED, "decode aborted the handoff", tell_decode=False)
        return [*cmds, ack, Reply(Status.OK)]

    def _on_cancel(self, ev: CancelRequest) -> list[PrefillCommand]:
        newer = self._stale(ev.request_id, ev.attempt)
        if newer is not None:
            return [
                Reply(
                    Status.NOT_FOUND,
                    f"request {ev.request_id!r}: cancel of attempt {ev.attempt}, prefill holds "
                    f"attempt {newer} (stale, ignored)",
                )
            ]
        req = self._requests.get(ev.request_id)
        if req is None:
            if (ev.request_id, ev.attempt) not in self._finished:
                # The cancel overtook the router's submit: refuse the request when it arrives.
                self._remember_finished(ev.request_id, "cancelled", ev.attempt)
                return [
                    Log(
                        "prefill_cancel_request",
                        _with_attempt(
                            {"request_id": ev.request_id, "reason": ev.reason, "early": True},
                            ev.attempt,
                        ),
                    ),
                    Reply(Status.NOT_FOUND, f"unknown request {ev.request_id!r}"),
                ]
            return [Reply(Status.NOT_FOUND, f"unknown request {ev.request_id!r}")]
        cmds: list[PrefillCommand] = [
            Log(
                "prefill_cancel_request",
                _with_attempt({"request_id": req.request_id, "reason": ev.reason}, req.attempt),
            )
        ]
        if req.state is PrefillState.WRITING:
            if not req.stop_reason:
                req.stop_reason = "cancel"
                assert req.grant is not None
                cmds.append(CancelWrites(req.request_id, req.grant.generation))
            return [*cmds, Reply(Status.OK)]
        cmds += self._fail(req, Status.CANCELLED, "cancelled by the router", tell_decode=True)
        return [*cmds, Reply(Status.OK)]

    def _on_fail_request(self, ev: FailRequest) -> list[PrefillCommand]:
        req = self._requests.get(ev.request_id)
        if req is None:
            return [Reply(Status.NOT_FOUND, f"unknown request {ev.request_id!r}")]
        if req.state is not PrefillState.ADMITTED:
            return [
                Reply(
                    Status.FAILED_PRECONDITION,
                    f"request {ev.request_id!r} is {req.state.value}: only a request waiting for "
                    "its grant fails on its own (a write stream fails through WritesFinished)",
                )
            ]
        return [*self._fail(req, ev.status, ev.reason, tell_decode=True), Reply(Status.OK)]

    def _on_tick(self, ev: Tick) -> list[PrefillCommand]:
        cmds: list[PrefillCommand] = []
        for req in list(self._requests.values()):
            if (
                req.state is PrefillState.ADMITTED
                and req.grant is None
                and req.grant_deadline is not None
                and ev.now >= req.grant_deadline
            ):
                reason = (
                    f"no grant from decode for request {req.request_id!r} within "
                    f"{self.config.grant_timeout_s:g}s"
                )
                cmds += self._fail(req, Status.DEADLINE_EXCEEDED, reason, tell_decode=True)
        for key, grant in list(self._parked.items()):
            if grant.deadline is None or ev.now < grant.deadline:
                continue
            del self._parked[key]
            room = grant.room
            reason = f"no request {grant.request_id!r} was submitted to prefill for this grant"
            cmds += [
                Log(
                    "prefill_drop_orphan_grant",
                    _with_attempt(
                        {
                            "request_id": grant.request_id,
                            "room": room,
                            "generation": grant.generation,
                        },
                        grant.attempt,
                    ),
                ),
                SendRejection(
                    grant.request_id, room, Status.FAILED_PRECONDITION, reason, grant.attempt
                ),
            ]
        return cmds

    # ------------------------------------------------------------------ helpers

    def _fail(
        self, req: _Request, status: Status, reason: str, *, tell_decode: bool
    ) -> list[PrefillCommand]:
        self._forget(req, "failed")
        cmds: list[PrefillCommand] = [
            Log(
                "prefill_finish_request",
                _with_attempt(
                    {
                        "request_id": req.request_id,
                        "status": "error",
                        "code": status.value,
                        "reason": reason,
                    },
                    req.attempt,
                ),
            )
        ]
        if tell_decode and not self._b.silent_prefill_abort:
            cmds.append(SendRejection(req.request_id, req.room, status, reason, req.attempt))
        cmds.append(AnswerRequest(req.request_id, status, reason, req.attempt))
        return cmds

    def _forget(self, req: _Request, how: str) -> None:
        self._requests.pop(req.request_id, None)
        self._remember_finished(req.request_id, how, req.attempt)

    def _remember_finished(self, rid: RequestId, how: str, attempt: int = 0) -> None:
        self._finished[(rid, attempt)] = how
        self._note_attempt(rid, attempt)
        while len(self._finished) > self.config.max_tombstones:
            self._finished.popitem(last=False)


def _with_attempt(args: dict[str, LogValue], attempt: int) -> dict[str, LogValue]:
    """Log args with the attempt number, named only for a retry (attempt 0 logs as before)."""
    return {**args, "attempt": attempt} if attempt else args
