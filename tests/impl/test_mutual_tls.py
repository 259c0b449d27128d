"""Identity and authorization (issue 15): with a PKI, every caller is who its certificate says
(role, and tenant for clients), each internal RPC is open only to the role that sends it in the
protocol, and a tenant acts only on its own requests. Plaintext clients are refused."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from kvhandoff.impl.client import Client, GenerateResult
from kvhandoff.impl.cluster import Cluster
from kvhandoff.impl.errors import RequestFailed
from kvhandoff.impl.proto import rpc
from kvhandoff.impl.proto.gen.kvhandoff.v1 import handoff_pb2 as pb
from kvhandoff.impl.tls import Identity, Pki, TlsFiles, identity_of_pem, make_test_pki
from kvhandoff.impl.tokenizer import encode


@pytest.fixture
def cluster(make_cluster: Callable[..., Cluster], tmp_path: Path) -> Cluster:
    return make_cluster("reference", pki=tmp_path / "pki", pages_per_message=2)


def channel(cluster: Cluster, address: str, tls: TlsFiles) -> grpc.Channel:
    return grpc.secure_channel(address, tls.channel_credentials())


def test_a_cluster_with_a_pki_serves_over_mutual_tls_and_refuses_plaintext(
    cluster: Cluster,
) -> None:
    with cluster.client("acme") as c:
        result = c.generate("acme", encode("over tls"), 8)
    assert result.status == "ok" and result.text == "over tls"
    with cluster.client("acme") as c:  # the tenant comes from the certificate
        assert c.generate("", encode("no tenant field"), 4).status == "ok"
    with Client(cluster.router) as plain:
        refused = plain.generate("acme", encode("plaintext"), 4, timeout=3)
    assert refused.status == "error" and refused.code in {"UNAVAILABLE", "DEADLINE_EXCEEDED"}


def test_certificates_carry_role_and_tenant(tmp_path: Path) -> None:
    pki = Pki.open(tmp_path)
    client = pki.issue("client", "acme")
    assert identity_of_pem(client.cert.read_bytes()) == Identity("client", "acme")
    assert identity_of_pem(pki.issue("decode").cert.read_bytes()) == Identity("decode")
    # A certificate from the CA that names no kvhandoff identity (the old single test cert).
    assert identity_of_pem(make_test_pki(tmp_path / "old").cert.read_bytes()) is None


def test_a_client_cannot_claim_another_tenant(cluster: Cluster) -> None:
    with cluster.client("acme") as c:
        r = c.generate("globex", encode("pretend"), 4)
    assert r.code == "PERMISSION_DENIED" and "client of tenant 'acme'" in r.error
    assert "'globex'" in r.error


def test_a_tenant_cannot_cancel_or_see_another_tenants_request(cluster: Cluster) -> None:
    cluster.stall_prefill_writes("victim-1")
    box: list[GenerateResult] = []

    def run() -> None:
        with cluster.client("acme") as c:
            box.append(c.generate("acme", encode("V" * 40), 8, request_id="victim-1"))

    t = threading.Thread(target=run)
    t.start()
    cluster.wait_for_grant("victim-1", pages_written=2)
    with cluster.client("globex") as other, pytest.raises(RequestFailed) as info:
        other.cancel("victim-1")
    assert info.value.code == "NOT_FOUND"  # as if it did not exist
    cluster.resume_prefill_writes("victim-1")
    t.join(30)
    assert box[0].status == "ok"


# Each internal RPC, and the one role allowed to call it.
INTERNAL = [
    ("decode", "Submit", pb.DecodeSubmitRequest(request_id="x", tenant="t", prompt_tokens=4)),
    ("decode", "Cancel", pb.CancelRequest(request_id="x")),
    ("decode", "Complete", pb.Completion(request_id="x")),
    ("decode", "Reject", pb.Rejection(request_id="x", code="ABORTED")),
    ("decode", "ReceiveAbortAck", pb.AbortAck(request_id="x")),
    ("prefill", "Submit", pb.PrefillSubmitRequest(request_id="x", tenant="t")),
    ("prefill", "Cancel", pb.CancelRequest(request_id="x")),
    ("prefill", "ReceiveGrant", pb.Grant(request_id="x", page_ids=[0])),
    ("prefill", "ReceiveAbort", pb.Abort(request_id="x")),
    ("router", "Generate", pb.GenerateRequest(tenant="t", prompt_tokens=[65])),
    ("router", "Cancel", pb.CancelRequest(request_id="x")),
]
ALLOWED = {
    ("decode", "Submit"): "router",
    ("decode", "Cancel"): "router",
    ("decode", "Complete"): "prefill",
    ("decode", "Reject"): "prefill",
    ("decode", "ReceiveAbortAck"): "prefill",
    ("prefill", "Submit"): "router",
    ("prefill", "Cancel"): "router",
    ("prefill", "ReceiveGrant"): "decode",
    ("prefill", "ReceiveAbort"): "decode",
    ("router", "Generate"): "client",
    ("router", "Cancel"): "client",
}


def test_each_rpc_is_refused_to_every_role_but_its_caller(cluster: Cluster) -> None:
    assert cluster.pki is not None
    callers = {
        "router": cluster.pki.issue("router"),
        "prefill": cluster.pki.issue("prefill"),
        "decode": cluster.pki.issue("decode"),
        "client": cluster.pki.issue("client", "acme"),
        "no identity": make_test_pki_from(cluster.pki),
    }
    stub_of = {"decode": rpc.decode_stub, "prefill": rpc.prefill_stub, "router": rpc.router_stub}
    stubs = {
        (who, server): stub_of[server](channel(cluster, getattr(cluster, server), tls))
        for who, tls in callers.items()
        for server in stub_of
    }
    for server, method, message in INTERNAL:
        allowed = ALLOWED[(server, method)]
        for who in callers:
            try:
                getattr(stubs[(who, server)], method)(message, timeout=5)
                code, details = grpc.StatusCode.OK, ""
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details()  # type: ignore[attr-defined]
            if who == allowed:
                assert "may not call" not in details, (server, method, who, details)
            else:
                assert code is grpc.StatusCode.PERMISSION_DENIED, (server, method, who, code)
                assert ("may not call" in details) or ("no kvhandoff identity" in details)
    with cluster.client("acme") as c:
        assert c.generate("acme", encode("still serving"), 4).status == "ok"


def make_test_pki_from(pki: Pki) -> TlsFiles:
    """A certificate signed by the cluster's CA that carries no kvhandoff identity."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from kvhandoff.impl.tls import _issue

    files = TlsFiles(pki.directory / "anon.crt", pki.directory / "anon.key", pki.ca)
    ca_cert = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    ca_key = serialization.load_pem_private_key((pki.directory / "ca.key").read_bytes(), None)
    _issue(ca_cert, ca_key, files, "anon", [])
    return files
