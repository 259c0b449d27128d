"""A small synchronous client for the router (used by the CLI, tests and benchmarks)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from kvhandoff.impl.errors import RequestFailed, TransportError
from kvhandoff.impl.proto import rpc
from kvhandoff.impl.proto.gen.kvhandoff.v1 import handoff_pb2 as pb
from kvhandoff.impl.servers.base import channel_options
from kvhandoff.impl.tls import TlsFiles
from kvhandoff.impl.tokenizer import decode


@dataclass(frozen=True)
class GenerateResult:
    request_id: str
    tenant: str
    status: str  # "ok" | "error"
    error: str = ""
    code: str = "OK"
    tokens: list[int] = field(default_factory=list)

    @property
    def text(self) -> str:
        return decode(self.tokens)

    def as_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "tenant": self.tenant,
            "status": self.status,
            "error": self.error,
            "code": self.code,
            "tokens": self.tokens,
            "text": self.text,
        }


class Client:
    def __init__(
        self, router: str, tls: TlsFiles | None = None, max_message_bytes: int = 8 << 20
    ) -> None:
        opts = channel_options(max_message_bytes)
        if tls is not None:
            self._channel = grpc.secure_channel(router, tls.channel_credentials(), options=opts)
        else:
            self._channel = grpc.insecure_channel(router, options=opts)
        self._stub = rpc.router_stub(self._channel)

    def generate(
        self,
        tenant: str,
        prompt_tokens: Sequence[int],
        max_tokens: int = 16,
        request_id: str = "",
        timeout: float = 60.0,
        retry: bool = False,
    ) -> GenerateResult:
        """Generate; a clear error from the cluster comes back as ``status="error"``.

        ``retry=True`` resubmits ``request_id`` after its earlier call got an error: the router
        serves it as the next attempt of the same request (same id, tenant and room), and a late
        message of the failed attempt cannot act on it. The router refuses a retry of an id it
        does not hold as failed (FAILED_PRECONDITION), of one still in progress (ALREADY_EXISTS:
        retry once both workers have finished with it), and past its retry limit."""
        try:
            resp = self._stub.Generate(
                pb.GenerateRequest(
                    tenant=tenant,
                    prompt_tokens=list(prompt_tokens),
                    max_tokens=max_tokens,
                    request_id=request_id,
                    retry=retry,
                ),
                timeout=timeout,
            )
        except grpc.RpcError as exc:
            code = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            return GenerateResult(request_id, tenant, "error", str(details), code)
        return GenerateResult(resp.request_id, tenant, "ok", tokens=list(resp.tokens))

    def generate_or_raise(
        self, tenant: str, prompt_tokens: Sequence[int], max_tokens: int = 16
    ) -> list[int]:
        result = self.generate(tenant, prompt_tokens, max_tokens)
        if result.status != "ok":
            raise RequestFailed(result.code, result.error)
        return result.tokens

    def cancel(self, request_id: str, timeout: float = 10.0) -> None:
        try:
            self._stub.Cancel(pb.CancelRequest(request_id=request_id), timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise RequestFailed(code, str(details)) from exc

    def info(self, timeout: float = 5.0) -> pb.ServerInfo:
        try:
            info: pb.ServerInfo = self._stub.Info(pb.InfoRequest(), timeout=timeout)
            return info
        except grpc.RpcError as exc:
            raise TransportError(f"router unreachable: {exc}") from exc

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
