"""How page data moves from prefill to decode.

Control (grants, completions, aborts and their acks) always travels over gRPC. Page data takes one
of two paths, chosen per server with ``kvhandoff serve --transport``:

* ``grpc`` (the default): pages ride inside the ``WritePages`` stream. Decode sees every byte
  before it lands and refuses a write into a page that the writer does not hold (the spec's
  ``receiver_checked`` write path).
* ``mooncake``: prefill writes the pages one-sided (Mooncake's TransferEngine over TCP) into a
  *landing pool* that decode registered, one slot per page id, and then sends a data-less
  ``PageWrite`` notice (``landed``) on the same stream. Decode copies the slot out, digests the copy,
  hands it to its core exactly as an in-band write, and stores only an accepted copy into the pool
  it generates from. A one-sided write cannot be refused when it lands (the spec's ``one_sided``
  write path); see docs/impl.md "Transports" for what that changes and how the drain fence keeps the
  reference safe.

The interface is deliberately small: a transport says whether it is one-sided; a one-sided one can
register decode's landing memory, name its endpoint, and perform a blocking batch of writes.
"""

from __future__ import annotations

from kvhandoff.impl.transport.base import GrpcTransport, OneSidedTransport, Transport, WriteOp

TRANSPORT_NAMES = ("grpc", "mooncake")


def open_transport(name: str) -> Transport:
    """The transport called ``name``; raises ConfigError for an unknown name or a transport that
    cannot run here (the message says why and what to install)."""
    from kvhandoff.impl.errors import ConfigError

    if name == "grpc":
        return GrpcTransport()
    if name == "mooncake":
        from kvhandoff.impl.transport.mooncake import MooncakeTransport

        return MooncakeTransport()
    raise ConfigError(f"unknown transport {name!r}; choose one of {', '.join(TRANSPORT_NAMES)}")


__all__ = [
    "TRANSPORT_NAMES",
    "GrpcTransport",
    "OneSidedTransport",
    "Transport",
    "WriteOp",
    "open_transport",
]
