"""With certificates configured, the servers talk mutual TLS and refuse plaintext clients."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from impl.client import Client
from impl.cluster import Cluster
from impl.tls import make_test_pki
from impl.tokenizer import encode


def test_a_cluster_with_mutual_tls_serves_and_refuses_plaintext(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    tls = make_test_pki(tmp_path / "pki")
    cluster = make_cluster("reference", tls=tls)
    with cluster.client() as c:
        result = c.generate("t", encode("over tls"), 8)
    assert result.status == "ok" and result.text == "over tls"
    with Client(cluster.router) as plain:
        refused = plain.generate("t", encode("plaintext"), 4, timeout=3)
    assert refused.status == "error" and refused.code in {"UNAVAILABLE", "DEADLINE_EXCEEDED"}
