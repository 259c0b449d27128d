"""Page data over Mooncake's TransferEngine: one-sided TCP writes with a peer-to-peer handshake.

No metadata server: each engine is initialised with ``P2PHANDSHAKE``, so a peer is named by
``127.0.0.1:<rpc port>`` and the engines exchange segment descriptors on first contact. A write
outside the peer's registered memory is refused by the peer's engine, and a write to a dead peer
fails at once (connection refused), which the caller sees as a TransportError.
"""

from __future__ import annotations

import threading
from typing import Any

from kvhandoff.impl.errors import ConfigError, TransportError
from kvhandoff.impl.transport import loopback
from kvhandoff.impl.transport.base import OneSidedTransport, WriteOp

HOST = "127.0.0.1"
PACKAGE = "mooncake-transfer-engine-non-cuda"


def _engine_class() -> Any:
    try:
        from mooncake.engine import TransferEngine  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError as exc:
        raise ConfigError(
            f"the mooncake transport needs the {PACKAGE} package and the libibverbs1 library "
            f"(`make venv` installs both; or pip install 'kvhandoff[mooncake]' and apt-get "
            f"install libibverbs1): importing mooncake.engine failed: {exc}"
        ) from exc
    return TransferEngine


class MooncakeTransport(OneSidedTransport):
    name = "mooncake"

    def __init__(self) -> None:
        engine_class = _engine_class()
        if not loopback.is_loaded():
            raise ConfigError(
                "the mooncake transport must run with the loopback bind wrapper preloaded "
                "(Mooncake binds its listeners to every interface otherwise): start the process "
                f"with LD_PRELOAD={loopback.library_path()} (`python -m kvhandoff.impl.transport.loopback "
                "build` makes it; `kvhandoff serve` and the test suite preload it themselves)"
            )
        self._engine: Any = engine_class()
        rc = self._engine.initialize(HOST, "P2PHANDSHAKE", "tcp", "")
        if rc != 0:
            raise TransportError(f"Mooncake TransferEngine.initialize on {HOST} failed (rc {rc})")
        self._endpoint = f"{HOST}:{self._engine.get_rpc_port()}"
        self._registered: list[int] = []
        self._lock = threading.Lock()
        self._closed = False

    @property
    def endpoint(self) -> str:
        return self._endpoint

    def register(self, address: int, length: int) -> None:
        rc = self._engine.register_memory(address, length)
        if rc != 0:
            raise TransportError(
                f"Mooncake could not register {length} bytes at {address:#x} (rc {rc})"
            )
        self._registered.append(address)

    def write(self, endpoint: str, ops: list[WriteOp]) -> None:
        if not ops:
            return
        with self._lock:
            if self._closed:
                raise TransportError("the mooncake transport is closed")
        rc = self._engine.batch_transfer_sync_write(
            endpoint, [o.src for o in ops], [o.dst for o in ops], [o.length for o in ops]
        )
        if rc < 0:
            total = sum(o.length for o in ops)
            raise TransportError(
                f"one-sided write of {len(ops)} ranges ({total} bytes) to {endpoint} failed "
                f"(rc {rc}): the peer is gone or a range is outside its registered memory"
            )

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for address in self._registered:
            self._engine.unregister_memory(address)
        self._registered.clear()
