"""Typed entry points into the generated gRPC service module (which has no annotations).

Servers implement the service methods directly (no generated base class), and stubs are built
here, so mypy --strict sees one explicit ``Any`` boundary instead of untyped calls everywhere.
"""

from __future__ import annotations

from typing import Any

import grpc

from impl.proto.gen.kvhandoff.v1 import handoff_pb2_grpc as _generated


def router_stub(channel: grpc.Channel | Any) -> Any:
    return _generated.RouterStub(channel)  # type: ignore[no-untyped-call]


def prefill_stub(channel: grpc.Channel | Any) -> Any:
    return _generated.PrefillStub(channel)  # type: ignore[no-untyped-call]


def decode_stub(channel: grpc.Channel | Any) -> Any:
    return _generated.DecodeStub(channel)  # type: ignore[no-untyped-call]


def add_router(servicer: object, server: Any) -> None:
    _generated.add_RouterServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


def add_prefill(servicer: object, server: Any) -> None:
    _generated.add_PrefillServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


def add_decode(servicer: object, server: Any) -> None:
    _generated.add_DecodeServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
