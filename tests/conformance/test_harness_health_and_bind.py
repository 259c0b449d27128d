"""harness-serve answers the standard gRPC health check, and refuses a port already in use
(gRPC's default SO_REUSEPORT would let a second server bind it and take half the calls)."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvhandoff.cli.main import main
from kvhandoff.conformance.harness_server import HEALTH_SERVICE, ListenError, serve


def test_health_serving_then_not_serving_on_stop() -> None:
    server = serve("127.0.0.1:0", "inproc")
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for service in ("", HEALTH_SERVICE):
                reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.RpcError) as err:
                stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        server.stop(grace=0)
    assert server.health is not None


def test_a_second_server_on_the_same_port_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    first = serve("127.0.0.1:0", "inproc")
    try:
        with pytest.raises(ListenError, match=r"cannot listen on .*port in use"):
            serve(first.address, "inproc")
        assert main(["harness-serve", "--listen", first.address]) == 2
        assert "cannot listen on" in capsys.readouterr().err
    finally:
        first.stop(grace=0)
