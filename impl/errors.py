"""The one exception tree of `impl`.

::

    KvhandoffError                 anything raised on purpose by impl/
    ├── ConfigError                a setting or mode that cannot work (bad flag, unknown mode,
    │                              page size that does not divide, TLS files missing); usage fault
    ├── LocalProtocolError         this process asked a protocol core to do something its own
    │                              state forbids (a bug in the caller, never a peer's fault)
    ├── TransportError             a peer could not be reached or broke a call; translated once,
    │   │                          at the edge, from grpc.RpcError (`raise ... from exc`)
    │   └── RequestFailed          a generate call that ended with a clear error status; carries
    │                              the gRPC status code name and the server's message
    └── DeviceError                torch could not place or move the KV pool (e.g. `--device cuda`
                                   without CUDA); translated from torch's RuntimeError

Bad input *from a peer* is never an exception inside a core: the sans-I/O cores answer it with a
`Reply` command carrying a status and a message that names the offending value, and the gRPC edge
turns that into the call's status. The server keeps serving.
"""

from __future__ import annotations


class KvhandoffError(Exception):
    """Base of every error raised on purpose by `impl`."""


class ConfigError(KvhandoffError):
    """A setting, mode or file that cannot work; the CLI maps it to exit code 2."""


class LocalProtocolError(KvhandoffError):
    """The local caller drove a core against its own state (a bug here, not at the peer)."""


class TransportError(KvhandoffError):
    """A peer was unreachable or broke the call (translated from grpc.RpcError)."""


class RequestFailed(TransportError):
    """A request ended with a clear error status from the cluster."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class DeviceError(KvhandoffError):
    """torch could not allocate or use the requested device."""
