"""The transport interface (see the package docstring)."""

from __future__ import annotations

import abc
from typing import NamedTuple


class WriteOp(NamedTuple):
    """One contiguous one-sided write: ``length`` bytes from local ``src`` to the peer's ``dst``."""

    src: int
    dst: int
    length: int


class GrpcTransport:
    """In-band page data: nothing to set up, the servers stream pages in ``WritePages``."""

    name = "grpc"
    one_sided = False

    def close(self) -> None:
        pass


class OneSidedTransport(abc.ABC):
    """A transport that writes into a peer's registered memory without the peer's code running."""

    name: str
    one_sided = True

    @property
    @abc.abstractmethod
    def endpoint(self) -> str:
        """Where peers reach this process's registered memory (``host:port``)."""

    @abc.abstractmethod
    def register(self, address: int, length: int) -> None:
        """Let peers write into ``length`` bytes at ``address`` (the memory must stay alive until
        `close`)."""

    @abc.abstractmethod
    def write(self, endpoint: str, ops: list[WriteOp]) -> None:
        """Perform ``ops`` against the peer at ``endpoint`` and return once all have landed.
        Blocking (call it from a worker thread); raises TransportError when any write failed."""

    @abc.abstractmethod
    def close(self) -> None:
        """Unregister memory; no write reaches this process's memory afterwards."""


Transport = GrpcTransport | OneSidedTransport
