"""Every step anyone can take, named role-verb-object.

Protocol steps come first, faults last: `enabled` lists actions in this order, so that a
Hypothesis strategy sampling from it shrinks towards fault-free runs, and so that breadth-first
search meets the simplest counterexample first among equally short ones.

Faults are ordinary actions (as in stateright): a crash, a lost message or a client that gives up
is something the environment *does*, bounded by the config's fault budget.

The snake_case form of each class name (`DecodeReservePages` -> `decode_reserve_pages`) is the name
used in traces, in the Z3 encoders and in the implementation's event log.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any

from kvhandoff.spec.state import Message, Tag, Write, field_names

# --- Protocol steps -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RouterSubmitRequest:
    """The router sends the request to prefill and decode at once (SGLang's `early` policy)."""

    request: int


@dataclass(frozen=True)
class PrefillAdmitRequest:
    request: int


@dataclass(frozen=True)
class PrefillRejectRequest:
    """Prefill's path for a prompt over its limit. What it does is the crux of the incident."""

    request: int


@dataclass(frozen=True)
class DecodeAdmitRequest:
    request: int


@dataclass(frozen=True)
class DecodeRejectRequest:
    request: int


@dataclass(frozen=True)
class DecodeReservePages:
    """Decode takes free pages under a fresh generation and grants them to prefill."""

    request: int


@dataclass(frozen=True)
class PrefillReceiveGrant:
    message: Message


@dataclass(frozen=True)
class PrefillWritePage:
    """Prefill sends the next page of the grant (a write RPC, or a one-sided RDMA write)."""

    request: int


@dataclass(frozen=True)
class DecodeReceiveWrite:
    """A page write reaches decode's memory: checked by decode, or landing unconditionally."""

    write: Write


@dataclass(frozen=True)
class PrefillSendCompletion:
    """One prefill rank reports its shards of the grant: page count and digest."""

    request: int
    rank: int = 0


@dataclass(frozen=True)
class DecodeReceiveCompletion:
    """Decode receives prefill's completion and validates it before it may generate."""

    message: Message


@dataclass(frozen=True)
class DecodeReceiveFailure:
    """Decode hears from prefill that the request was rejected or aborted there."""

    message: Message


@dataclass(frozen=True)
class DecodeReceiveCancel:
    """The router's word that the client cancelled reaches decode.

    The router answers the client at once but tells decode by a call of its own, so decode may
    take steps in between: validate a completion that was already on its way, even generate.
    """

    request: int


@dataclass(frozen=True)
class PrefillReceiveCancel:
    """The router's word that the client cancelled reaches prefill (its own call, as for decode).

    It stops a request prefill has not started writing; once prefill holds a grant, decode's
    abort (sent when the cancel reaches decode) is what stops and fences the writes.
    """

    request: int


@dataclass(frozen=True)
class DecodeGenerate:
    """Decode runs the model over the request's pages. This is where data is read."""

    request: int


@dataclass(frozen=True)
class DecodeAnswer:
    request: int


@dataclass(frozen=True)
class DecodeReleasePages:
    request: int


@dataclass(frozen=True)
class PrefillReceiveAbort:
    message: Message


@dataclass(frozen=True)
class PrefillSendAbortAck:
    """Once no write of (room, generation) of this rank is in flight, the rank acknowledges the
    abort (each rank drains and acknowledges its own writes). `dinst`: the decode instance the
    abort came from, and the ack goes to: with several, each counting its own generations, two
    of them can abort the same (room, generation) (0 with one, and then left out of traces)."""

    room: int
    generation: int
    rank: int = 0
    dinst: int = 0


@dataclass(frozen=True)
class DecodeReceiveAbortAck:
    message: Message


@dataclass(frozen=True)
class DecodeReleaseTimeout:
    """A deferred release stops waiting for prefill's drain ack when its deadline passes.

    Only designs whose release rule has a deadline (`ack_or_timeout`) have it. It is part of
    that protocol's own rule, not an environment fault, so it spends no fault budget.
    """

    request: int


@dataclass(frozen=True)
class DecodeDetectPrefillRestart:
    """Decode instance `dinst`'s health check sees a new boot epoch of prefill instance `pinst`:
    its requests waiting on that instance fail."""

    dinst: int = 0
    pinst: int = 0


@dataclass(frozen=True)
class PrefillDetectDecodeRestart:
    """Prefill instance `pinst`'s health check sees a new boot epoch of decode instance `dinst`:
    its transfers to that instance stop."""

    pinst: int = 0
    dinst: int = 0


@dataclass(frozen=True)
class RetransmitMessage:
    """The sender of a message whose RPC failed sends it again (at-least-once delivery)."""

    message: Message


@dataclass(frozen=True)
class RouterRetryRequest:
    """The client, having got an error, submits the request again: same request id, same room.

    Client behaviour, not a fault: bounded by its own budget (`Config.max_retries`), and listed
    after every other protocol step so that no existing counterexample changes."""

    request: int


# --- Faults -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientCancelRequest:
    request: int


@dataclass(frozen=True)
class DecodeWaitingTimeout:
    """Decode stops waiting for prefill's completion (SGLang's 300 s waiting timeout)."""

    request: int


@dataclass(frozen=True)
class PrefillAbortRequest:
    """Prefill fails a request on its own (client abort at prefill, grammar error, timeout)."""

    request: int


@dataclass(frozen=True)
class PrefillWriteError:
    """Push path: one of prefill's page writes for the request fails (an RDMA or session error),
    and prefill fails the transfer while its other writes of the grant are still on the wire
    (SGLang's `transfer_worker`: Failed, and the status to decode, `conclude_failure`). Those
    writes may still land: an error on one queue does not recall what another already carries.
    Spends the write-error budget."""

    request: int


@dataclass(frozen=True)
class PrefillRestart:
    """Prefill instance `pinst` crashes and restarts: it forgets every request it worked on;
    writes already issued may land.

    With several ranks the whole instance restarts: its ranks are processes of one server that
    run every forward pass together (a collective with a dead rank cannot finish), and SGLang's
    launcher takes the server down when one of them dies; the health check reports one boot
    epoch for the instance. So ranks crash together, and a lone rank crash is not modelled.
    """

    pinst: int = 0


@dataclass(frozen=True)
class DecodeRestart:
    """Decode instance `dinst` crashes and restarts: it forgets every request it held; its pool
    memory survives."""

    dinst: int = 0


@dataclass(frozen=True)
class DecodeSuspectPrefillDead:
    """A network partition: decode instance `dinst`'s health check of prefill instance `pinst`
    misses, so it takes that prefill for dead, though it is alive and keeps working (SGLang:
    `HEARTBEAT_MAX_FAILURE` misses -> `_handle_node_failure`). Decode fails the requests it
    waits on from that prefill; prefill, cut off but running, may keep writing and later send
    completions. Spends the partition budget."""

    dinst: int = 0
    pinst: int = 0


@dataclass(frozen=True)
class PrefillLeaseExpire:
    """Pull path: prefill's lease on the request's pinned blocks runs out and they are freed.

    Counts against the timeout budget.
    """

    request: int


@dataclass(frozen=True)
class NetworkFailTransfer:
    """Pull path: a page read fails (RDMA error, unreleasable handle). Counts as a lost message."""

    write: Write


@dataclass(frozen=True)
class NetworkDropMessage:
    message: Message


@dataclass(frozen=True)
class NetworkDuplicateMessage:
    message: Message


Action = (
    RouterSubmitRequest
    | PrefillAdmitRequest
    | PrefillRejectRequest
    | DecodeAdmitRequest
    | DecodeRejectRequest
    | DecodeReservePages
    | PrefillReceiveGrant
    | PrefillWritePage
    | DecodeReceiveWrite
    | PrefillSendCompletion
    | DecodeReceiveCompletion
    | DecodeReceiveFailure
    | DecodeReceiveCancel
    | PrefillReceiveCancel
    | DecodeGenerate
    | DecodeAnswer
    | DecodeReleasePages
    | PrefillReceiveAbort
    | PrefillSendAbortAck
    | DecodeReceiveAbortAck
    | DecodeReleaseTimeout
    | DecodeDetectPrefillRestart
    | PrefillDetectDecodeRestart
    | RetransmitMessage
    | RouterRetryRequest
    | ClientCancelRequest
    | DecodeWaitingTimeout
    | PrefillAbortRequest
    | PrefillWriteError
    | PrefillRestart
    | DecodeRestart
    | DecodeSuspectPrefillDead
    | PrefillLeaseExpire
    | NetworkFailTransfer
    | NetworkDropMessage
    | NetworkDuplicateMessage
)

PROTOCOL_ACTIONS: tuple[type, ...] = (
    RouterSubmitRequest,
    PrefillAdmitRequest,
    PrefillRejectRequest,
    DecodeAdmitRequest,
    DecodeRejectRequest,
    DecodeReservePages,
    PrefillReceiveGrant,
    PrefillWritePage,
    DecodeReceiveWrite,
    PrefillSendCompletion,
    DecodeReceiveCompletion,
    DecodeReceiveFailure,
    DecodeReceiveCancel,
    PrefillReceiveCancel,
    DecodeGenerate,
    DecodeAnswer,
    DecodeReleasePages,
    PrefillReceiveAbort,
    PrefillSendAbortAck,
    DecodeReceiveAbortAck,
    DecodeReleaseTimeout,
    DecodeDetectPrefillRestart,
    PrefillDetectDecodeRestart,
    RetransmitMessage,
    RouterRetryRequest,
)
FAULT_ACTIONS: tuple[type, ...] = (
    ClientCancelRequest,
    DecodeWaitingTimeout,
    PrefillAbortRequest,
    PrefillWriteError,
    PrefillRestart,
    DecodeRestart,
    DecodeSuspectPrefillDead,
    PrefillLeaseExpire,
    NetworkFailTransfer,
    NetworkDropMessage,
    NetworkDuplicateMessage,
)
ALL_ACTIONS: tuple[type, ...] = PROTOCOL_ACTIONS + FAULT_ACTIONS


@cache
def snake_case(class_name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", class_name).lower()


ACTIONS_BY_NAME: dict[str, type] = {snake_case(cls.__name__): cls for cls in ALL_ACTIONS}


def action_name(action: object) -> str:
    return snake_case(type(action).__name__)


def is_fault(action: object) -> bool:
    return isinstance(action, FAULT_ACTIONS)


def _message_from_json(data: dict[str, Any]) -> Message:
    digest = data.get("digest")
    return Message(
        kind=data["kind"],
        room=int(data["room"]),
        generation=int(data["generation"]),
        request=int(data["request"]),
        pages=tuple(int(p) for p in data.get("pages", ())),
        count=int(data.get("count", 0)),
        digest=None if digest is None else tuple((int(a), int(b), int(c)) for a, b, c in digest),
        reason=str(data.get("reason", "")),
        epoch=int(data.get("epoch", 0)),
        rank=int(data.get("rank", 0)),
        attempt=int(data.get("attempt", 0)),
        dinst=int(data.get("dinst", 0)),
    )


def _write_from_json(data: dict[str, Any]) -> Write:
    tag = data["data"]
    return Write(
        room=int(data["room"]),
        generation=int(data["generation"]),
        page=int(data["page"]),
        data=Tag(int(tag["request"]), int(tag["generation"]), str(tag["tenant"])),
        epoch=int(data.get("epoch", 0)),
        rank=int(data.get("rank", 0)),
    )


def _without_rank_0(data: dict[str, Any]) -> dict[str, Any]:
    """Leave out a `rank` of 0: one-rank traces read exactly as before ranks were modelled."""
    if data.get("rank") == 0:
        del data["rank"]
    return data


def action_to_json(action: object) -> dict[str, Any]:
    """`{"action": snake_case_name, "args": {...}}`: the trace format's step.

    A prefill rank (of an action, message or write) is written only when it is not 0, and read
    as 0 when absent, so traces of the one-rank model are unchanged; so are a message's attempt
    and decode instance.
    """
    args: dict[str, Any] = {}
    for name in _field_names(type(action)):
        value = getattr(action, name)
        if isinstance(value, Message | Write):
            value = _without_rank_0(_as_dict(value))
            # As a rank of 0: traces without retries, or with one decode instance, read as
            # before those were modelled.
            for name_of_zero in ("attempt", "dinst"):
                if value.get(name_of_zero, 1) == 0:
                    del value[name_of_zero]
        args[name] = value
    for name_of_zero in ("dinst", "pinst"):
        # A drain ack's decode instance, a restarted or watched instance: as a rank of 0.
        if args.get(name_of_zero, 1) == 0:
            del args[name_of_zero]
    return {"action": action_name(action), "args": _without_rank_0(args)}


def _as_dict(value: Message | Write | Tag) -> dict[str, Any]:
    """`dataclasses.asdict` for a message or write (whose fields hold only a `Tag`, numbers,
    strings and tuples of them), without its deep copies."""
    out: dict[str, Any] = {}
    for name in _field_names(type(value)):
        item = getattr(value, name)
        out[name] = _as_dict(item) if isinstance(item, Tag) else item
    return out


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """The names of a dataclass's fields, in order (`dataclasses.fields` is slow to ask again
    for every action of a long trace)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = field_names(cls)
    return names


def action_from_json(data: dict[str, Any], added: Iterable[type] = ()) -> Action:
    """Inverse of `action_to_json`; raises ValueError naming what is wrong.

    `added`: the classes of actions a variant adds (`Variant.extra_action_types`). The spec cannot
    know them, so whoever reads a trace of such a variant passes them along; without them a step
    of an added action is an unknown action."""
    name = data.get("action")
    known = ACTIONS_BY_NAME
    extra = {snake_case(cls.__name__): cls for cls in added}
    if extra:
        known = {**ACTIONS_BY_NAME, **extra}
    if name not in known:
        hint = ""
        if not extra:
            hint = " (a step of an action a variant adds reads back only with that variant)"
        raise ValueError(f"unknown action {name!r}{hint}; known actions: {sorted(known)}")
    cls = known[name]
    args = dict(data.get("args", {}))
    try:
        if "message" in args:
            args["message"] = _message_from_json(args["message"])
        if "write" in args:
            args["write"] = _write_from_json(args["write"])
        action: Action = cls(**args)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"action {name!r}: bad arguments {args!r}: {exc}") from exc
    return action
