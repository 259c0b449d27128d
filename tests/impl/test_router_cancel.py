"""A client cancel withdraws a hand-over that is still waiting for a crashed prefill.

Found by the gRPC conformance campaign with crashes in flight: the router's Submit to prefill
waits for prefill to be ready; if the client cancels meanwhile and prefill restarts, a Submit
delivered afterwards reaches a prefill that has no memory of the cancel, which admits the
request and holds it forever (decode, already aborted, never sends a grant).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from impl.client import GenerateResult
from impl.cluster import Cluster
from impl.eventlog import read_events


def _events_of(log: Path, request_id: str) -> list[str]:
    if not log.exists():
        return []
    return [e["event"] for e in read_events(log)[1] if e["args"].get("request_id") == request_id]


def test_cancel_withdraws_a_submit_waiting_for_a_crashed_prefill(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster()
    logs = tmp_path / "logs-0"
    cluster.crash_prefill()
    out: list[GenerateResult] = []
    with cluster.client() as client:
        worker = threading.Thread(
            target=lambda: out.append(client.generate("A", [65] * 8, 4, request_id="early"))
        )
        worker.start()
        deadline = time.monotonic() + 10
        while "router_submit_request" not in _events_of(logs / "router.jsonl", "early"):
            assert time.monotonic() < deadline, "the router never logged the submit"
            time.sleep(0.01)
        client.cancel("early")
        worker.join(10)
    assert out and out[0].status == "error" and out[0].code == "CANCELLED", out
    # While prefill is still down, the router has already withdrawn its Submit (without the
    # withdrawal the Submit would wait for prefill, up to the RPC timeout of 30 s).
    deadline = time.monotonic() + 5
    while "router_receive_prefill_result" not in _events_of(logs / "router.jsonl", "early"):
        assert time.monotonic() < deadline, "the Submit to the crashed prefill is still pending"
        time.sleep(0.01)
    cluster.restart_prefill()
    cluster.wait_healthy()
    assert cluster.wait_quiescent(10)
    # The new prefill may see the cancel (and refuse the request early), never the request.
    seen = _events_of(logs / "prefill.jsonl", "early")
    assert "prefill_admit_request" not in seen and "prefill_reject_request" not in seen, seen
    with cluster.client() as client:
        assert client.generate("A", [65] * 8, 4).status == "ok"  # and it serves on
