"""Typed entry points into the generated harness service module (which has no annotations), as
impl/proto/rpc.py does for the handoff service: one explicit `Any` boundary for mypy --strict."""

from __future__ import annotations

from typing import Any

import grpc

from kvhandoff.conformance.proto.gen.kvhandoff.harness.v1 import harness_pb2 as pb
from kvhandoff.conformance.proto.gen.kvhandoff.harness.v1 import harness_pb2_grpc as _generated

SERVICE = "kvhandoff.harness.v1.Harness"


def harness_stub(channel: grpc.Channel | Any) -> Any:
    return _generated.HarnessStub(channel)  # type: ignore[no-untyped-call]


def add_harness(servicer: object, server: Any) -> None:
    _generated.add_HarnessServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]


__all__ = ["SERVICE", "add_harness", "harness_stub", "pb"]
