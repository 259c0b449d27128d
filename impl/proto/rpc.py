"""Typed entry points into the generated gRPC service module (which has no annotations).

Servers implement the service methods directly (no generated base class), and stubs are built
here, so mypy --strict sees one explicit ``Any`` boundary instead of untyped calls everywhere.

Servers are registered here too, not with the generated ``add_*Servicer_to_server``: those parse
each request with ``FromString``, and a message that does not parse (corrupt wire format, a
string field that is not UTF-8) then reaches the client as UNKNOWN with a Python exception name.
Here a request that does not parse becomes a `Malformed` value, and the call is answered
INVALID_ARGUMENT naming the message type and what was wrong, before the servicer sees it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from kvhandoff.impl.proto.gen.kvhandoff.v1 import handoff_pb2 as _pb
from kvhandoff.impl.proto.gen.kvhandoff.v1 import handoff_pb2_grpc as _generated

ANSWERED_KEY = "kvhandoff-answered"
"""Trailing metadata on every error a server answers, so a caller can tell an answer from a
broken call (see `impl.servers.base.answered`)."""


@dataclass(frozen=True)
class Malformed:
    """A request whose bytes are not a valid message of its type."""

    type_name: str
    error: str

    def message(self) -> str:
        return f"malformed {self.type_name} message: {self.error}"


def _parser(cls: Any) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except DecodeError as exc:
            # protobuf's text repeats the type name: keep only what was wrong.
            return Malformed(cls.DESCRIPTOR.full_name, str(exc).rsplit("': ", 1)[-1])

    return parse


async def _refuse(context: grpc.aio.ServicerContext, bad: Malformed) -> None:
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT, bad.message(), trailing_metadata=((ANSWERED_KEY, "1"),)
    )


Authorize = Callable[[str, grpc.aio.ServicerContext], "tuple[grpc.StatusCode, str] | None"]


async def _authorized(
    authorize: Authorize | None, method: str, context: grpc.aio.ServicerContext
) -> None:
    # Before the request is looked at: a caller without the right role learns nothing else.
    refusal = authorize(method, context) if authorize is not None else None
    if refusal is not None:
        await context.abort(refusal[0], refusal[1], trailing_metadata=((ANSWERED_KEY, "1"),))


def _checked_unary(
    fn: Callable[[Any, Any], Awaitable[Any]], method: str, authorize: Authorize | None
) -> Callable[..., Awaitable[Any]]:
    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _authorized(authorize, method, context)
        if isinstance(request, Malformed):
            await _refuse(context, request)
        return await fn(request, context)

    return call


def _checked_stream(
    fn: Callable[[Any, Any], Awaitable[Any]], method: str, authorize: Authorize | None
) -> Callable[..., Awaitable[Any]]:
    async def call(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        await _authorized(authorize, method, context)

        async def checked() -> AsyncIterator[Any]:
            async for msg in requests:
                if isinstance(msg, Malformed):
                    await _refuse(context, msg)
                yield msg

        return await fn(checked(), context)

    return call


def _add(service: str, servicer: object, server: Any) -> None:
    desc = _pb.DESCRIPTOR.services_by_name[service]
    authorize: Authorize | None = getattr(servicer, "authorize", None)
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in desc.methods:
        request_cls = getattr(_pb, method.input_type.name)
        response_cls = getattr(_pb, method.output_type.name)
        fn = getattr(servicer, method.name)
        if method.client_streaming:
            handlers[method.name] = grpc.stream_unary_rpc_method_handler(
                _checked_stream(fn, method.name, authorize),
                request_deserializer=_parser(request_cls),
                response_serializer=response_cls.SerializeToString,
            )
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _checked_unary(fn, method.name, authorize),
                request_deserializer=_parser(request_cls),
                response_serializer=response_cls.SerializeToString,
            )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(desc.full_name, handlers),)
    )


def router_stub(channel: grpc.Channel | Any) -> Any:
    return _generated.RouterStub(channel)  # type: ignore[no-untyped-call]


def prefill_stub(channel: grpc.Channel | Any) -> Any:
    return _generated.PrefillStub(channel)  # type: ignore[no-untyped-call]


def decode_stub(channel: grpc.Channel | Any) -> Any:
    return _generated.DecodeStub(channel)  # type: ignore[no-untyped-call]


def add_router(servicer: object, server: Any) -> None:
    _add("Router", servicer, server)


def add_prefill(servicer: object, server: Any) -> None:
    _add("Prefill", servicer, server)


def add_decode(servicer: object, server: Any) -> None:
    _add("Decode", servicer, server)
