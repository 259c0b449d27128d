"""Decode's protocol core: owns the KV page pool's bookkeeping and decides every handoff step.

Lifecycle of one request (reference mode)::

    SubmitRequest --admit--> WAITING --CompletionReceived (validated)--> GENERATING
         |                     |  \\--WriteReceived (accepted) stores a page, stays WAITING
         | reject              |---CompletionReceived (failed) / RejectionReceived --> released
         v                     |---CancelRequest / Tick past deadline / GrantFailed --> RELEASING
       answered error          |---PrefillHeartbeat shows a new prefill epoch --> released
                               GENERATING --GenerationFinished--> answered OK, released
                               RELEASING --AbortAckReceived (same generation), or the prefill
                                           is seen dead/restarted--> released

Rules:

* A grant is ``(request, room, generation, pages, token)``. Generations come from
  ``generation_base + counter`` and never repeat while the caller gives each incarnation of the
  process a fresh base (the edge persists a boot counter and puts it in the high bits).
* A write is accepted only for a page granted to that request, in its current generation, with the
  grant's capability token, while the request is WAITING, and when its data has the digest it
  claims. Anything else is refused with a reason and changes nothing.
* A completion is validated before a single token is generated: page count equals the grant,
  every granted page holds an accepted write of this generation, and the completion digest equals
  the digest of what was accepted.
* Release is fenced: pages of an aborted request stay owned (and refuse writes) until prefill acks
  that its writes for that generation drained, or prefill is seen dead or restarted. Released
  pages are scrubbed.
* Pages are allocated lowest id first, so reuse is deterministic (and a stale page is easy to see).
* Attempts: a client may retry a failed request under the same id (the router numbers the
  attempts 0, 1, ...). Decode holds one attempt of a request id at a time; every message about
  it carries its attempt, and one of another attempt is dropped (logged with ``stale_attempt``):
  a first attempt's late failure notice, cancel, write, completion or ack cannot act on the
  retry. Early notices and cancels are kept per (request, attempt).

Each `Behaviour` switch flips one of these rules; a mode combines the switches its spec variant
needs (see `impl.modes`).
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

# ---------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class DecodeConfig:
    num_pages: int
    page_size: int
    max_prompt_tokens: int
    max_new_tokens: int = 1024
    waiting_timeout_s: float = 30.0
    abort_retry_s: float = 1.0
    release_timeout_s: float = 5.0  # used only by m8_release_on_timeout
    prefill_dead_after_misses: int = 3
    max_tombstones: int = 4096
    behaviour: Behaviour = field(default_factory=Behaviour)


# ---------------------------------------------------------------------------------------- events


@dataclass(frozen=True)
class SubmitRequest:
    """The router hands decode a request (decode never sees the prompt, only its length)."""

    request_id: RequestId
    tenant: Tenant
    room: Room
    prompt_len: int
    max_tokens: int
    token: bytes  # capability for this grant, chosen by the caller (secrets.token_bytes)
    now: float
    attempt: int = 0  # the router's attempt number for the request id
    prefill: int = 0
    """The prefill instance the router placed the request on (SGLang's decode learns it from
    the request's bootstrap host): the peer whose restart or silence fails the request. A
    deployment with one prefill leaves it 0."""


@dataclass(frozen=True)
class WriteReceived:
    """One page of a write stream arrived. ``data_digest`` is computed by the edge over the bytes
    received; ``claimed_digest`` is what prefill said they hash to. ``problem`` is set by the edge
    when the bytes cannot be a page (wrong size, dtype or shape) and names the offending value."""

    request_id: RequestId
    room: Room
    generation: Generation
    token: bytes
    page_id: int
    message_id: int
    data_digest: bytes
    claimed_digest: bytes
    problem: str = ""
    attempt: int = 0


@dataclass(frozen=True)
class CompletionReceived:
    request_id: RequestId
    room: Room
    generation: Generation
    token: bytes
    page_count: int
    digest: bytes
    attempt: int = 0


@dataclass(frozen=True)
class RejectionReceived:
    """Prefill will not (or no longer) write for this request; it says why."""

    request_id: RequestId
    room: Room
    status: Status
    reason: str
    attempt: int = 0


@dataclass(frozen=True)
class CancelRequest:
    """The router withdraws the request (client cancel, or prefill failed)."""

    request_id: RequestId
    reason: str
    now: float
    attempt: int = 0


@dataclass(frozen=True)
class AbortAckReceived:
    """Prefill's writes of ``generation`` drained. ``token`` echoes the abort's capability:
    the ack releases pages, so it is bound like a write."""

    request_id: RequestId
    room: Room
    generation: Generation
    token: bytes = b""
    attempt: int = 0


@dataclass(frozen=True)
class GrantFailed:
    """The grant could not be delivered to prefill."""

    request_id: RequestId
    generation: Generation
    reason: str
    now: float


@dataclass(frozen=True)
class GrantDelivered:
    """Prefill acknowledged the grant; ``prefill_epoch`` is the boot epoch of the prefill that
    now holds it (so a later restart of that prefill fails exactly the requests it held)."""

    request_id: RequestId
    generation: Generation
    prefill_epoch: int
    now: float
    prefill: int = 0  # the prefill instance that acknowledged it


@dataclass(frozen=True)
class GenerationFinished:
    request_id: RequestId
    generation: Generation
    tokens_generated: int


@dataclass(frozen=True)
class PrefillHeartbeat:
    """Result of one health probe of prefill instance ``prefill``: its boot epoch, or None when
    it did not answer. Decode probes every prefill instance it serves on its own."""

    epoch: int | None
    now: float
    prefill: int = 0


@dataclass(frozen=True)
class Tick:
    now: float


DecodeEvent = (
    SubmitRequest
    | WriteReceived
    | CompletionReceived
    | RejectionReceived
    | CancelRequest
    | AbortAckReceived
    | GrantFailed
    | GrantDelivered
    | GenerationFinished
    | PrefillHeartbeat
    | Tick
)

# -------------------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class SendGrant:
    request_id: RequestId
    room: Room
    generation: Generation
    pages: tuple[PageId, ...]
    token: bytes
    prompt_len: int
    attempt: int = 0
    prefill: int = 0  # the prefill instance the request was placed on: the grant goes there


@dataclass(frozen=True)
class SendAbort:
    """Ask prefill to stop writing this generation and ack once its writes have drained."""

    request_id: RequestId
    room: Room
    generation: Generation
    token: bytes
    attempt: int = 0
    prefill: int = 0  # the prefill instance the request was placed on: the abort goes there


@dataclass(frozen=True)
class StorePage:
    """Copy the data of the write being handled into ``page_id`` of the pool."""

    page_id: PageId


@dataclass(frozen=True)
class ReleasePages:
    pages: tuple[PageId, ...]
    scrub: bool


@dataclass(frozen=True)
class Generate:
    """Run the model over ``pages`` (in order) for a prompt of ``prompt_len`` tokens."""

    request_id: RequestId
    generation: Generation
    pages: tuple[PageId, ...]
    prompt_len: int
    max_tokens: int


@dataclass(frozen=True)
class AnswerRequest:
    """Finish the router's submit call: OK (with the generated tokens the edge holds) or error."""

    request_id: RequestId
    status: Status
    message: str = ""
    attempt: int = 0


DecodeCommand = (
    Log | Reply | SendGrant | SendAbort | StorePage | ReleasePages | Generate | AnswerRequest
)

# --------------------------------------------------------------------------------------- state


class RequestState(enum.Enum):
    WAITING = "waiting"
    GENERATING = "generating"
    RELEASING = "releasing"


@dataclass
class _PeerHealth:
    epoch: int | None = None
    dead: bool = False
    misses: int = 0


@dataclass
class _Request:
    request_id: RequestId
    tenant: Tenant
    room: Room
    prompt_len: int
    max_tokens: int
    generation: Generation
    token: bytes
    pages: tuple[PageId, ...]
    prefill_epoch: int | None
    deadline: float
    prefill: int = 0  # the prefill instance it was placed on
    state: RequestState = RequestState.WAITING
    written: dict[PageId, bytes] = field(default_factory=dict)
    answered: bool = False
    attempt: int = 0


@dataclass(frozen=True)
class GrantView:
    room: Room
    generation: Generation
    pages: tuple[PageId, ...]
    token: bytes
    state: str
    written: tuple[PageId, ...]
    deadline: float
    """When decode next acts on its own: gives up waiting (waiting), or re-sends its abort or,
    in M8's mode, releases (releasing)."""


@dataclass(frozen=True)
class _Tombstone:
    tenant: Tenant
    pages: tuple[PageId, ...]
    token: bytes = b""
    validated: bool = False  # its completion was validated (a second copy is answered OK)


class DecodeCore:
    """Sans-I/O decode worker. Drive it with ``handle(event)``; execute the commands it returns."""

    def __init__(self, config: DecodeConfig, generation_base: int = 0) -> None:
        if config.num_pages < 1 or config.page_size < 1:
            raise LocalProtocolError("decode needs at least one page of at least one token")
        self.config = config
        self._b = config.behaviour
        self._next_generation = generation_base
        self._free: set[PageId] = {PageId(p) for p in range(config.num_pages)}
        self._owner: dict[PageId, RequestId] = {}
        self._requests: dict[RequestId, _Request] = {}
        # Released (request, generation) -> pages: lets a late write get a precise refusal (or,
        # in m7/m8, be stored where the RDMA write would land). Bounded, oldest dropped first.
        self._released: OrderedDict[tuple[RequestId, int], _Tombstone] = OrderedDict()
        # Rejections that arrived before the router's submit (the two race on purpose).
        # Keyed by request, and kept with the room they named: a submit for another room is not
        # refused by them (a guessed request id cannot poison a future request).
        # Per (request, attempt): a notice of a first attempt does not refuse the retry.
        self._early_rejections: OrderedDict[tuple[RequestId, int], tuple[Room, Status, str]] = (
            OrderedDict()
        )
        # Cancels that overtook the router's submit (two separate calls): refuse the submit later.
        self._early_cancels: OrderedDict[tuple[RequestId, int], str] = OrderedDict()
        self._seen_ids: OrderedDict[tuple[RequestId, int], None] = OrderedDict()
        # Each prefill instance's health as decode last saw it, by instance: its boot epoch,
        # whether it is taken for dead, and the probes it missed in a row.
        self._peers: dict[int, _PeerHealth] = {}

    # ------------------------------------------------------------------ read-only views

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def prefill_dead(self) -> bool:
        """Prefill (instance 0) missed enough health checks to be taken for dead (and has not
        come back)."""
        return self.prefill_dead_of(0)

    def prefill_dead_of(self, prefill: int) -> bool:
        """Whether prefill instance ``prefill`` is taken for dead."""
        peer = self._peers.get(prefill)
        return peer is not None and peer.dead

    def prefill_epoch_seen(self, prefill: int = 0) -> int | None:
        """The boot epoch of prefill instance ``prefill`` that decode last saw (None: none yet)."""
        peer = self._peers.get(prefill)
        return None if peer is None else peer.epoch

    def _peer(self, prefill: int) -> _PeerHealth:
        return self._peers.setdefault(prefill, _PeerHealth())

    @property
    def used_pages(self) -> int:
        return self.config.num_pages - len(self._free)

    def active_requests(self) -> dict[RequestId, str]:
        return {rid: r.state.value for rid, r in self._requests.items()}

    def attempt_of(self, request_id: RequestId) -> int | None:
        """The attempt decode holds of an active request, else None."""
        r = self._requests.get(request_id)
        return None if r is None else r.attempt

    def owner_of(self, page: PageId) -> RequestId | None:
        return self._owner.get(page)

    def grant_of(self, request_id: RequestId) -> GrantView | None:
        """The current grant of an active request (for tests and introspection)."""
        r = self._requests.get(request_id)
        if r is None:
            return None
        return GrantView(
            r.room, r.generation, r.pages, r.token, r.state.value, tuple(r.written), r.deadline
        )

    # ------------------------------------------------------------------ entry point

    def handle(self, event: DecodeEvent) -> list[DecodeCommand]:
        match event:
            case SubmitRequest():
                return self._on_submit(event)
            case WriteReceived():
                return self._on_write(event)
            case CompletionReceived():
                return self._on_completion(event)
            case RejectionReceived():
                return self._on_rejection(event)
            case CancelRequest():
                return self._on_cancel(event)
            case AbortAckReceived():
                return self._on_abort_ack(event)
            case GrantFailed():
                return self._on_grant_failed(event)
            case GrantDelivered():
                return self._on_grant_delivered(event)
            case GenerationFinished():
                return self._on_generation_finished(event)
            case PrefillHeartbeat():
                return self._on_heartbeat(event)
            case Tick():
                return self._on_tick(event)
        raise LocalProtocolError(f"decode core cannot handle {event!r}")

    # ------------------------------------------------------------------ admission and grant

    def _on_submit(self, ev: SubmitRequest) -> list[DecodeCommand]:
        base: dict[str, LogValue] = _with_attempt(
            {
                "request_id": ev.request_id,
                "tenant": ev.tenant,
                "room": ev.room,
                "prompt_tokens": ev.prompt_len,
            },
            ev.attempt,
        )
        if ev.request_id in self._requests:
            return [Reply(Status.ALREADY_EXISTS, f"request {ev.request_id!r} is already active")]
        key = (ev.request_id, ev.attempt)
        if key in self._seen_ids:
            return [
                Reply(
                    Status.ALREADY_EXISTS,
                    f"request {ev.request_id!r} attempt {ev.attempt} was already seen",
                )
            ]
        self._seen_ids[key] = None
        while len(self._seen_ids) > self.config.max_tombstones:
            self._seen_ids.popitem(last=False)
        problem: tuple[Status, str] | None = None
        need = pages_for(ev.prompt_len, self.config.page_size) if ev.prompt_len > 0 else 0
        if ev.prompt_len < 1:
            problem = (Status.INVALID_ARGUMENT, f"prompt length {ev.prompt_len} must be >= 1")
        elif ev.prompt_len > self.config.max_prompt_tokens:
            problem = (
                Status.OUT_OF_RANGE,
                f"prompt of {ev.prompt_len} tokens exceeds decode's limit of "
                f"{self.config.max_prompt_tokens} tokens",
            )
        elif not 1 <= ev.max_tokens <= self.config.max_new_tokens:
            problem = (
                Status.INVALID_ARGUMENT,
                f"max_tokens {ev.max_tokens} must be in 1..{self.config.max_new_tokens}",
            )
        elif key in self._early_cancels:
            reason = self._early_cancels.pop(key)
            problem = (Status.CANCELLED, f"request {ev.request_id!r} was cancelled: {reason}")
        elif key in self._early_rejections and self._early_rejections[key][0] == ev.room:
            _, code, reason = self._early_rejections.pop(key)
            problem = (code, f"prefill rejected request {ev.request_id!r}: {reason}")
        elif need > len(self._free):
            problem = (
                Status.RESOURCE_EXHAUSTED,
                f"request needs {need} pages, decode has {len(self._free)} free",
            )
        if problem is not None:
            return [
                Log(
                    "decode_reject_request",
                    {**base, "code": problem[0].value, "reason": problem[1]},
                ),
                Log(
                    "decode_answer",
                    _with_attempt(
                        {"request_id": ev.request_id, "status": "error", "code": problem[0].value},
                        ev.attempt,
                    ),
                ),
                Reply(problem[0], problem[1]),
            ]
        pages = tuple(sorted(self._free)[:need])
        generation = Generation(self._next_generation)
        self._next_generation += 1
        for p in pages:
            self._free.discard(p)
            self._owner[p] = ev.request_id
        self._requests[ev.request_id] = _Request(
            request_id=ev.request_id,
            tenant=ev.tenant,
            room=ev.room,
            prompt_len=ev.prompt_len,
            max_tokens=ev.max_tokens,
            generation=generation,
            token=ev.token,
            pages=pages,
            prefill_epoch=None,
            deadline=ev.now + self.config.waiting_timeout_s,
            prefill=ev.prefill,
            attempt=ev.attempt,
        )
        return [
            Log("decode_admit_request", {**base, "max_tokens": ev.max_tokens}),
            Log(
                "decode_reserve_pages",
                {
                    "request_id": ev.request_id,
                    "tenant": ev.tenant,
                    "room": ev.room,
                    "generation": generation,
                    "pages": list(pages),
                    "page_count": len(pages),
                    **({"attempt": ev.attempt} if ev.attempt else {}),
                },
            ),
            SendGrant(
                ev.request_id,
                ev.room,
                generation,
                pages,
                ev.token,
                ev.prompt_len,
                ev.attempt,
                ev.prefill,
            ),
        ]

    # ------------------------------------------------------------------ writes

    def _on_write(self, ev: WriteReceived) -> list[DecodeCommand]:
        args: dict[str, LogValue] = {
            "request_id": ev.request_id,
            "room": ev.room,
            "generation": ev.generation,
            "page": ev.page_id,
            "message_id": ev.message_id,
            "digest": ev.claimed_digest.hex(),
        }
        args = _with_attempt(args, ev.attempt)

        def refuse(status: Status, reason: str, message: str) -> list[DecodeCommand]:
            return self._refuse_write(args, status, reason, message)

        req = self._requests.get(ev.request_id)
        if req is None or req.generation != ev.generation:
            tomb = self._released.get((ev.request_id, ev.generation))
            if tomb is not None and self._b.late_writes_land and ev.page_id in tomb.pages:
                return self._late_write_lands(ev, args, tomb)
            if tomb is not None:
                return refuse(
                    Status.FAILED_PRECONDITION,
                    "released_generation",
                    f"generation {ev.generation} of request {ev.request_id!r} was released",
                )
            if req is None:
                return refuse(
                    Status.NOT_FOUND, "unknown_request", f"unknown request {ev.request_id!r}"
                )
            return refuse(
                Status.FAILED_PRECONDITION,
                "stale_generation",
                f"generation {ev.generation} is not the current generation {req.generation} "
                f"of request {ev.request_id!r}",
            )
        if ev.attempt != req.attempt:
            return refuse(
                Status.FAILED_PRECONDITION,
                "stale_attempt",
                f"write of attempt {ev.attempt}, decode holds attempt {req.attempt} "
                f"of request {ev.request_id!r}",
            )
        if ev.room != req.room:
            return refuse(
                Status.INVALID_ARGUMENT,
                "room_mismatch",
                f"room {ev.room} is not the room {req.room} of request {ev.request_id!r}",
            )
        if not hmac.compare_digest(ev.token, req.token):
            return refuse(
                Status.PERMISSION_DENIED,
                "bad_token",
                f"capability token does not match generation {req.generation} "
                f"of request {ev.request_id!r}",
            )
        releasing_but_lands = req.state is RequestState.RELEASING and self._b.late_writes_land
        if req.state is not RequestState.WAITING and not releasing_but_lands:
            return refuse(
                Status.FAILED_PRECONDITION,
                "not_waiting",
                f"request {ev.request_id!r} is {req.state.value}, not waiting for writes",
            )
        if not 0 <= ev.page_id < self.config.num_pages:
            return refuse(
                Status.OUT_OF_RANGE,
                "page_out_of_range",
                f"page id {ev.page_id} is outside the pool (0..{self.config.num_pages - 1})",
            )
        if PageId(ev.page_id) not in req.pages:
            return refuse(
                Status.PERMISSION_DENIED,
                "page_not_owned",
                f"page {ev.page_id} is not granted to request {ev.request_id!r} "
                f"generation {req.generation}",
            )
        if ev.problem:
            return refuse(Status.INVALID_ARGUMENT, "bad_data", ev.problem)
        checks_digest = not (self._b.count_only_validation or self._b.decode_trusts_completion)
        if checks_digest and not hmac.compare_digest(ev.data_digest, ev.claimed_digest):
            return refuse(
                Status.DATA_LOSS,
                "digest_mismatch",
                # No digest values in the message: the sender logs it, and an unkeyed page
                # digest in a log gives the page's tokens back (impl.eventlog).
                f"page {ev.page_id}: the data received does not match the digest sent with it",
            )
        req.written[PageId(ev.page_id)] = ev.data_digest
        return [
            Log("decode_receive_write", {**args, "outcome": "accepted"}),
            StorePage(PageId(ev.page_id)),
            Reply(Status.OK),
        ]

    @staticmethod
    def _refuse_write(
        args: dict[str, LogValue], status: Status, reason: str, message: str
    ) -> list[DecodeCommand]:
        return [
            Log("decode_receive_write", {**args, "outcome": "refused", "reason": reason}),
            Reply(status, message),
        ]

    def _late_write_lands(
        self, ev: WriteReceived, args: dict[str, LogValue], tomb: _Tombstone
    ) -> list[DecodeCommand]:
        # m7/m8: a one-sided write cannot be refused once the pages are gone; it lands wherever
        # the page now is, under the new owner's recorded digest (as with RDMA, validation does
        # not see it). Decode knows it happened here, so it raises an alarm for operators.
        page = PageId(ev.page_id)
        cmds: list[DecodeCommand] = [
            Log("decode_receive_write", {**args, "outcome": "accepted", "late": True}),
            StorePage(page),
        ]
        now_owner = self._owner.get(page)
        if now_owner is not None:
            cmds.append(
                Log(
                    "invariant_alarm",
                    {
                        "alarm": "late_write_landed_in_reallocated_page",
                        "page": ev.page_id,
                        "writer_request_id": ev.request_id,
                        "writer_tenant": tomb.tenant,
                        "owner_request_id": now_owner,
                    },
                )
            )
        cmds.append(Reply(Status.OK))
        return cmds

    # ------------------------------------------------------------------ completion

    def _find_for_completion(self, ev: CompletionReceived) -> _Request | None:
        if self._b.match_completion_by_room:
            for r in self._requests.values():
                if r.room == ev.room:
                    return r
            return None
        return self._requests.get(ev.request_id)

    def _on_completion(self, ev: CompletionReceived) -> list[DecodeCommand]:
        args: dict[str, LogValue] = {
            "request_id": ev.request_id,
            "room": ev.room,
            "generation": ev.generation,
            "page_count": ev.page_count,
            "digest": ev.digest.hex(),
        }
        args = _with_attempt(args, ev.attempt)

        def ignore(status: Status, reason: str, message: str) -> list[DecodeCommand]:
            # Not for the current incarnation: refused, and the current one is left alone.
            return [
                Log(
                    "decode_receive_completion",
                    {**args, "verdict": "failed", "reason": reason, "ignored": True},
                ),
                Reply(status, message),
            ]

        def duplicate() -> list[DecodeCommand]:
            # A second copy of a completion already validated (a network that duplicates, a
            # sender that retries): answered as the first was, and nothing changes.
            return [
                Log(
                    "decode_receive_completion",
                    {**args, "verdict": "validated", "ignored": True, "reason": "duplicate"},
                ),
                Reply(Status.OK),
            ]

        req = self._find_for_completion(ev)
        if req is None:
            tomb = self._released.get((ev.request_id, ev.generation))
            if tomb is not None and tomb.validated and hmac.compare_digest(ev.token, tomb.token):
                return duplicate()
            return ignore(Status.NOT_FOUND, "unknown_request", f"unknown request {ev.request_id!r}")
        if ev.room != req.room:
            return ignore(
                Status.INVALID_ARGUMENT,
                "room_mismatch",
                f"room {ev.room} is not the room {req.room} of request {req.request_id!r}",
            )
        identity_checked = not (
            self._b.match_completion_by_room or self._b.decode_trusts_completion
        )
        if identity_checked and ev.attempt != req.attempt:
            return ignore(
                Status.FAILED_PRECONDITION,
                "stale_attempt",
                f"completion of attempt {ev.attempt}, decode holds attempt {req.attempt} "
                f"of request {req.request_id!r}",
            )
        if identity_checked and ev.generation != req.generation:
            return ignore(
                Status.FAILED_PRECONDITION,
                "stale_generation",
                f"generation {ev.generation} is not the current generation {req.generation} "
                f"of request {req.request_id!r}",
            )
        if identity_checked and not hmac.compare_digest(ev.token, req.token):
            return ignore(
                Status.PERMISSION_DENIED,
                "bad_token",
                f"capability token does not match generation {req.generation} "
                f"of request {req.request_id!r}",
            )
        if req.state is RequestState.GENERATING and identity_checked:
            return duplicate()
        if req.state is not RequestState.WAITING:
            return ignore(
                Status.FAILED_PRECONDITION,
                "not_waiting",
                f"request {req.request_id!r} is {req.state.value}, not waiting for a completion",
            )
        failure = self._validate(req, ev)
        if failure is not None:
            message = f"handoff of request {req.request_id!r} failed validation: {failure}"
            cmds: list[DecodeCommand] = [
                Log(
                    "decode_receive_completion",
                    {**args, "request_id": req.request_id, "verdict": "failed", "reason": failure},
                ),
            ]
            cmds += self._answer(req, Status.DATA_LOSS, message)
            # Prefill sends its completion only after its write stream closed, and the request
            # leaves WAITING here, so no write of this generation can still land: release now.
            cmds += self._release(req, "validation_failed")
            cmds.append(Reply(Status.FAILED_PRECONDITION, message))
            return cmds
        req.state = RequestState.GENERATING
        cmds = [
            Log(
                "decode_receive_completion",
                {**args, "request_id": req.request_id, "verdict": "validated"},
            )
        ]
        unwritten = [p for p in req.pages if p not in req.written]
        if unwritten:
            # Only reachable in the trusting modes: decode is about to read pages nobody wrote in
            # this generation. It knows, so an operator can too.
            cmds.append(
                Log(
                    "invariant_alarm",
                    {
                        "alarm": "generating_from_unwritten_pages",
                        "request_id": req.request_id,
                        "generation": req.generation,
                        "pages": list(unwritten),
                    },
                )
            )
        cmds += [
            Generate(req.request_id, req.generation, req.pages, req.prompt_len, req.max_tokens),
            Reply(Status.OK),
        ]
        return cmds

    def _validate(self, req: _Request, ev: CompletionReceived) -> str | None:
        if self._b.decode_trusts_completion:
            return None  # M3: the room matched, that is all it checks
        if ev.page_count != len(req.pages):
            return f"completion covers {ev.page_count} pages, {len(req.pages)} were granted"
        if self._b.count_only_validation:
            return None  # the claimed count is all it checks (m2)
        if self._b.digest_optional and not ev.digest:
            return None  # M5: no digest came, so neither coverage nor digest is checked
        missing = [p for p in req.pages if p not in req.written]
        if missing:
            return f"pages {missing} were never written in generation {req.generation}"
        expected = completion_digest(req.generation, req.pages, [req.written[p] for p in req.pages])
        if not hmac.compare_digest(expected, ev.digest):
            return (
                f"completion digest does not match the digest of the pages accepted in "
                f"generation {req.generation}"
            )
        return None

    def _on_generation_finished(self, ev: GenerationFinished) -> list[DecodeCommand]:
        req = self._requests.get(ev.request_id)
        if (
            req is None
            or req.generation != ev.generation
            or req.state is not RequestState.GENERATING
        ):
            raise LocalProtocolError(f"request {ev.request_id!r} is not generating")
        cmds: list[DecodeCommand] = [
            Log(
                "decode_generate",
                {
                    "request_id": req.request_id,
                    "generation": req.generation,
                    "pages": list(req.pages),
                    "page_count": len(req.pages),
                    "prompt_tokens": req.prompt_len,
                    "tokens_generated": ev.tokens_generated,
                },
            )
        ]
        cmds += self._answer(req, Status.OK)
        cmds += self._release(req, "answered")
        return cmds

    # ------------------------------------------------------------------ failures and release

    def _on_rejection(self, ev: RejectionReceived) -> list[DecodeCommand]:
        args: dict[str, LogValue] = {
            "request_id": ev.request_id,
            "room": ev.room,
            "code": ev.status.value,
            "reason": ev.reason,
        }
        args = _with_attempt(args, ev.attempt)
        req = self._requests.get(ev.request_id)
        if req is not None and req.attempt != ev.attempt:
            # A notice of another attempt of this request id (a retried request's first
            # attempt): stale, dropped; the attempt decode holds carries on.
            why = f"notice of attempt {ev.attempt}, decode holds attempt {req.attempt}"
            return [
                Log("decode_receive_rejection", {**args, "outcome": "stale_attempt", "why": why}),
                Reply(Status.OK),
            ]
        if req is None:
            self._early_rejections[(ev.request_id, ev.attempt)] = (ev.room, ev.status, ev.reason)
            while len(self._early_rejections) > self.config.max_tombstones:
                self._early_rejections.popitem(last=False)
            return [Log("decode_receive_rejection", {**args, "early": True}), Reply(Status.OK)]
        if ev.room != req.room:
            return [
                Reply(
                    Status.INVALID_ARGUMENT,
                    f"room {ev.room} is not the room {req.room} of request {ev.request_id!r}",
                )
            ]
        cmds: list[DecodeCommand] = [Log("decode_receive_rejection", args)]
        if req.state is not RequestState.WAITING:
            return [*cmds, Reply(Status.OK)]
        status = ev.status if ev.status is not Status.OK else Status.ABORTED
        cmds += self._answer(
            req, status, f"prefill rejected request {req.request_id!r}: {ev.reason}"
        )
        # Prefill rejects before writing, or after its write stream closed: nothing in flight.
        cmds += self._release(req, "rejected_by_prefill")
        cmds.append(Reply(Status.OK))
        return cmds

    def _on_cancel(self, ev: CancelRequest) -> list[DecodeCommand]:
        req = self._requests.get(ev.request_id)
        if req is not None and req.attempt != ev.attempt:
            return [
                Reply(
                    Status.NOT_FOUND,
                    f"request {ev.request_id!r}: cancel of attempt {ev.attempt}, decode holds "
                    f"attempt {req.attempt} (stale, ignored)",
                )
            ]
        if req is None:
            if (ev.request_id, ev.attempt) not in self._seen_ids:
                self._early_cancels[(ev.request_id, ev.attempt)] = ev.reason
                while len(self._early_cancels) > self.config.max_tombstones:
                    self._early_cancels.popitem(last=False)
                # Logged: the request's fate at decode is decided here, not at its refusal.
                return [
                    Log(
                        "decode_abort_request",
                        _with_attempt(
                            {"request_id": ev.request_id, "reason": ev.reason, "early": True},
                            ev.attempt,
                        ),
                    ),
                    Reply(Status.NOT_FOUND, f"unknown request {ev.request_id!r}"),
                ]
            return [Reply(Status.NOT_FOUND, f"unknown request {ev.request_id!r}")]
        cmds: list[DecodeCommand] = [
            Log(
                "decode_abort_request",
                _with_attempt(
                    {
                        "request_id": req.request_id,
                        "generation": req.generation,
                        "reason": ev.reason,
                    },
                    req.attempt,
                ),
            )
        ]
        if req.state is RequestState.WAITING:
            cmds += self._answer(
                req, Status.CANCELLED, f"request {req.request_id!r} cancelled: {ev.reason}"
            )
            cmds += self._begin_release(req, ev.now)
        cmds.append(Reply(Status.OK))
        return cmds

    def _on_grant_failed(self, ev: GrantFailed) -> list[DecodeCommand]:
        req = self._requests.get(ev.request_id)
        if req is None or req.generation != ev.generation or req.state is not RequestState.WAITING:
            return []
        # Decode gives up on this one request (it cannot reach the prefill the grant is for):
        # the log says why, so that a validator can tell it from a restart's detection.
        cmds = self._answer(
            req,
            Status.UNAVAILABLE,
            f"could not deliver the grant to prefill: {ev.reason}",
            cause="grant_failed",
        )
        # The grant may have reached prefill before the call broke: fence as for an abort.
        return cmds + self._begin_release(req, ev.now)

    def _begin_release(self, req: _Request, now: float) -> list[DecodeCommand]:
        abort = SendAbort(
            req.request_id, req.room, req.generation, req.token, req.attempt, req.prefill
        )
        if self._b.release_before_drain:
            return [abort, *self._release(req, "aborted_before_drain")]
        if self.prefill_dead_of(req.prefill):
            return self._release(req, "prefill_dead")
        req.state = RequestState.RELEASING
        req.deadline = now + (
            self.config.release_timeout_s
            if self._b.release_on_ack_timeout
            else self.config.abort_retry_s
        )
        return [abort]

    def _on_abort_ack(self, ev: AbortAckReceived) -> list[DecodeCommand]:
        args: dict[str, LogValue] = {
            "request_id": ev.request_id,
            "room": ev.room,
            "generation": ev.generation,
        }
        args = _with_attempt(args, ev.attempt)
        req = self._requests.get(ev.request_id)
        if (
            req is None
            or req.generation != ev.generation
            or req.room != ev.room
            or req.attempt != ev.attempt
        ):
            return [Log("decode_receive_abort_ack", {**args, "matched": False}), Reply(Status.OK)]
        if not hmac.compare_digest(ev.token, req.token):
            # A forged ack would release pages prefill may still be writing: refused, unlogged
            # as a step (nothing happened), and the request keeps waiting for the real one.
            return [
                Reply(
                    Status.PERMISSION_DENIED,
                    f"abort ack's capability token does not match generation {req.generation} "
                    f"of request {req.request_id!r}",
                )
            ]
        cmds: list[DecodeCommand] = [Log("decode_receive_abort_ack", {**args, "matched": True})]
        if req.state is RequestState.RELEASING:
            cmds += self._release(req, "drained")
        return [*cmds, Reply(Status.OK)]

    def _on_grant_delivered(self, ev: GrantDelivered) -> list[DecodeCommand]:
        cmds = self._observe_epoch(ev.prefill, ev.prefill_epoch)
        req = self._requests.get(ev.request_id)
        if req is not None and req.generation == ev.generation:
            req.prefill_epoch = ev.prefill_epoch
        return cmds

    def _on_heartbeat(self, ev: PrefillHeartbeat) -> list[DecodeCommand]:
        if ev.epoch is not None:
            return self._observe_epoch(ev.prefill, ev.epoch)
        peer = self._peer(ev.prefill)
        peer.misses += 1
        if peer.dead or peer.misses < self.config.prefill_dead_after_misses:
            return []
        peer.dead = True
        return self._fail_after_prefill_loss(
            ev.prefill, peer.epoch, None, "prefill stopped answering health checks"
        )

    def _observe_epoch(self, prefill: int, epoch: int) -> list[DecodeCommand]:
        peer = self._peer(prefill)
        peer.misses = 0
        peer.dead = False
        old = peer.epoch
        peer.epoch = epoch
        if old is None or old == epoch:
            return []
        return self._fail_after_prefill_loss(
            prefill, old, epoch, f"prefill restarted (epoch {old} -> {epoch})"
        )

    def _fail_after_prefill_loss(
        self, prefill: int, old_epoch: int | None, new_epoch: int | None, why: str
    ) -> list[DecodeCommand]:
        failed: list[RequestId] = []
        cmds: list[DecodeCommand] = []
        for req in list(self._requests.values()):
            # Only requests held by the lost prefill instance; a grant still in flight has no
            # epoch yet and fails (or succeeds) on its own delivery.
            if req.prefill != prefill:
                continue
            if req.prefill_epoch is None or req.prefill_epoch == new_epoch:
                continue
            if req.state is RequestState.WAITING:
                failed.append(req.request_id)
                cmds += self._answer(
                    req, Status.UNAVAILABLE, f"request {req.request_id!r} failed: {why}"
                )
            if req.state is not RequestState.GENERATING:
                # The writer is gone, so none of its writes can still land: release is safe.
                cmds += self._release(req, "prefill_lost")
        # The line names the requests it failed, so that a log shows which recovery path acted.
        args: dict[str, LogValue] = {
            "old_epoch": old_epoch,
            "new_epoch": new_epoch,
            "reason": why,
            "failed": failed,
        }
        if prefill:
            args["prefill_instance"] = prefill  # absent: instance 0 (one prefill)
        detect = Log("decode_detect_prefill_restart", args)
        return [detect, *cmds]

    def _on_tick(self, ev: Tick) -> list[DecodeCommand]:
        cmds: list[DecodeCommand] = []
        for req in list(self._requests.values()):
            if ev.now < req.deadline:
                continue
            if req.state is RequestState.WAITING:
                cmds.append(
                    Log(
                        "decode_waiting_timeout",
                        {
                            "request_id": req.request_id,
                            "generation": req.generation,
                            "waited_s": self.config.waiting_timeout_s,
                        },
                    )
                )
                cmds += self._answer(
                    req,
                    Status.DEADLINE_EXCEEDED,
                    f"request {req.request_id!r} waited {self.config.waiting_timeout_s}s "
                    "for prefill's completion",
                )
                cmds += self._begin_release(req, ev.now)
            elif req.state is RequestState.RELEASING:
                if self._b.release_on_ack_timeout:
                    cmds += self._release(req, "ack_timeout")
                else:
                    req.deadline = ev.now + self.config.abort_retry_s
                    cmds.append(
                        SendAbort(
                            req.request_id,
                            req.room,
                            req.generation,
                            req.token,
                            req.attempt,
                            req.prefill,
                        )
                    )
        return cmds

    def _answer(
        self, req: _Request, status: Status, message: str = "", cause: str = ""
    ) -> list[DecodeCommand]:
        if req.answered:
            return []
        req.answered = True
        args: dict[str, LogValue] = {
            "request_id": req.request_id,
            "tenant": req.tenant,
            "generation": req.generation,
            "status": "ok" if status is Status.OK else "error",
        }
        if status is not Status.OK:
            args["code"] = status.value
        if cause:
            args["cause"] = cause
        args = _with_attempt(args, req.attempt)
        return [
            Log("decode_answer", args),
            AnswerRequest(req.request_id, status, message, req.attempt),
        ]

    def _release(self, req: _Request, reason: str) -> list[DecodeCommand]:
        scrub = self._b.scrub_on_release
        for p in req.pages:
            if self._owner.get(p) == req.request_id:
                del self._owner[p]
                self._free.add(p)
        del self._requests[req.request_id]
        self._released[(req.request_id, req.generation)] = _Tombstone(
            req.tenant, req.pages, req.token, validated=reason == "answered"
        )
        while len(self._released) > self.config.max_tombstones:
            self._released.popitem(last=False)
        return [
            Log(
                "decode_release_pages",
                {
                    "request_id": req.request_id,
                    "generation": req.generation,
                    "pages": list(req.pages),
                    "page_count": len(req.pages),
                    "scrubbed": scrub,
                    "reason": reason,
                },
            ),
            ReleasePages(req.pages, scrub),
        ]


def _with_attempt(args: dict[str, LogValue], attempt: int) -> dict[str, LogValue]:
    """Log args with the attempt number, named only for a retry (attempt 0 logs as before)."""
    return {**args, "attempt": attempt} if attempt else args
