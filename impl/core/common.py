"""Vocabulary shared by the three sans-I/O protocol cores.

Rules every core follows (h11 style):

* A core is a plain object with one entry point, ``handle(event) -> list[Command]``. Events are
  frozen dataclasses; so are commands. Nothing else changes a core's state.
* No sockets, no tensors, no clock, no randomness: time arrives as ``now`` (seconds, any monotonic
  origin) inside events; capability tokens, rooms and generation bases are chosen by the caller.
  Given the same events, a core returns the same commands.
* Bad input from a peer is never an exception: the core answers with a ``Reply`` command whose
  ``status`` names what went wrong, and leaves its state as it was. Exceptions
  (``LocalProtocolError``) are reserved for a caller that drives the core against its own state.
* Every protocol step is reported as a ``Log`` command (event kind + args). Args hold ids, tenants,
  rooms, generations, page ids, lengths and digests, never prompt content or token ids.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NewType

RequestId = NewType("RequestId", str)
Tenant = NewType("Tenant", str)
Room = NewType("Room", int)
Generation = NewType("Generation", int)
PageId = NewType("PageId", int)
Epoch = NewType("Epoch", int)

LogValue = str | int | float | bool | None | Sequence[int] | Sequence[str]


class Status(enum.Enum):
    """Outcome of a call; the names are gRPC status code names, so the edge maps them 1:1."""

    OK = "OK"
    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"
    DATA_LOSS = "DATA_LOSS"
    UNAUTHENTICATED = "UNAUTHENTICATED"


@dataclass(frozen=True)
class Log:
    """Write one line of the event log: ``kind`` is a snake_case protocol step."""

    kind: str
    args: Mapping[str, LogValue] = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    """Answer the call that carried the event being handled (OK or a clear error)."""

    status: Status
    message: str = ""


def pages_for(tokens: int, page_size: int) -> int:
    """Pages needed to hold ``tokens`` tokens."""
    return math.ceil(tokens / page_size)


def completion_digest(
    generation: int, pages: Sequence[int], page_digests: Sequence[bytes]
) -> bytes:
    """The digest a completion carries: binds the generation, the page ids in grant order and the
    digest of each page's data, so decode can compare it with what actually landed in its pool."""
    h = hashlib.sha256()
    h.update(generation.to_bytes(16, "big", signed=False))
    for page, digest in zip(pages, page_digests, strict=True):
        h.update(page.to_bytes(8, "big", signed=False))
        h.update(len(digest).to_bytes(2, "big"))
        h.update(digest)
    return h.digest()[:16]
