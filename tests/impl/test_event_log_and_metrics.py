"""Each server writes a JSON Lines event log of its protocol steps (never prompt content) and
serves Prometheus metrics derived from it."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from kvhandoff.impl.cluster import Cluster
from kvhandoff.impl.eventlog import read_events
from kvhandoff.impl.tokenizer import encode

SECRET = "SECRETCANARYXYZZY"


def test_logs_have_a_header_and_protocol_steps_but_no_prompt_content(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster("reference", log_dir=tmp_path / "logs")
    with cluster.client() as c:
        assert c.generate("acme", encode(SECRET * 3), 8).status == "ok"
        assert c.generate("acme", encode(SECRET * 30), 8).code == "OUT_OF_RANGE"
    assert cluster.wait_quiescent(5)
    kinds: dict[str, set[str]] = {}
    for server in ("router", "prefill", "decode"):
        path = tmp_path / "logs" / f"{server}.jsonl"
        text = path.read_text()
        assert SECRET not in text and "83, 69, 67" not in text  # neither the text nor its token ids
        header, events = read_events(path)
        assert header["kvhandoff_trace"] == 1 and header["kind"] == "event_log"
        assert header["server"] == server and header["mode"] == "reference"
        assert header["config"]["context_window"] == 256
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert all(e["server"] == server for e in events)
        kinds[server] = {e["event"] for e in events}
    assert {"router_submit_request", "router_answer_client", "router_reject_request"} <= kinds[
        "router"
    ]
    assert {
        "prefill_admit_request",
        "prefill_receive_grant",
        "prefill_write_page",
        "prefill_send_completion",
    } <= kinds["prefill"]
    assert "prefill_restart" not in kinds["prefill"] and "decode_restart" not in kinds["decode"]
    assert {
        "decode_admit_request",
        "decode_reserve_pages",
        "decode_receive_write",
        "decode_receive_completion",
        "decode_generate",
        "decode_answer",
        "decode_release_pages",
    } <= kinds["decode"]
    _, decode_events = read_events(tmp_path / "logs" / "decode.jsonl")
    completion = next(e for e in decode_events if e["event"] == "decode_receive_completion")
    assert completion["args"]["verdict"] == "validated" and len(completion["args"]["digest"]) == 32
    release = next(e for e in decode_events if e["event"] == "decode_release_pages")
    assert release["args"]["scrubbed"] is True


def test_metrics_count_admission_failures_and_pages(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster("reference", metrics=True, decode_pages=16, context_window=64)
    with cluster.client() as c:
        c.generate("t", encode("x" * 100), 4)  # over the context window: router rejects
        c.generate("t", encode("hello"), 4)
    port = cluster.decode_server.metrics_port
    assert port
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'kvhandoff_pages_free{server="decode"} 16' in body
    assert 'kvhandoff_pages_used{server="decode"} 0' in body
    router_port = cluster.router_server.metrics_port
    router_body = (
        urllib.request.urlopen(f"http://127.0.0.1:{router_port}/metrics", timeout=5).read().decode()
    )
    assert 'kvhandoff_admission_failures_total{server="router"} 1' in router_body


def test_incident_mode_raises_invariant_alarms_in_metrics(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster("incident", metrics=True)
    with cluster.client() as c:
        c.generate("a", encode("A" * 100), 4)
        assert c.generate("b", encode("b" * 300), 4).status == "ok"
    assert cluster.decode_server.metrics.get("kvhandoff_invariant_alarms_total") == 1
    header, _ = read_events(Path(cluster.config.log_dir) / "decode.jsonl")  # type: ignore[arg-type]
    assert header["mode"] == "incident"
    assert json.dumps(header["config"])  # serialisable limits


def _scrape(port: int | None) -> str:
    assert port
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def test_metrics_exposition_help_integers_and_histograms(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster("reference", metrics=True, decode_pages=16, context_window=64)
    with cluster.client() as c:
        c.generate("t", encode("x" * 100), 4)  # refused at the door
        for _ in range(3):
            assert c.generate("t", encode("hello"), 4).status == "ok"
    router = _scrape(cluster.router_server.metrics_port)
    decode = _scrape(cluster.decode_server.metrics_port)
    prefill = _scrape(cluster.prefill_server.metrics_port)
    for body in (router, decode, prefill):
        # Every family has its help and type; every sample carries the server label.
        helped = set(re.findall(r"^# HELP (\S+) ", body, re.M))
        typed = set(re.findall(r"^# TYPE (\S+) ", body, re.M))
        assert helped == typed and "kvhandoff_events_total" in typed
        for line in body.splitlines():
            if line and not line.startswith("#"):
                assert 'server="' in line, line
        # Whole values print as integers, never as 1.0 or in exponent form.
        assert not re.search(r"^[^#].* -?\d+\.0$", body, re.M)
        assert "e+" not in body
    assert 'kvhandoff_requests_total{code="OK",server="router",status="ok"} 3' in router
    assert re.search(
        r'kvhandoff_requests_total\{code="OUT_OF_RANGE",server="router",status="error"\} 1', router
    )
    assert 'kvhandoff_request_duration_seconds_count{server="router",status="ok"} 3' in router
    assert 'kvhandoff_rpc_duration_seconds_count{code="OK",method="Router/Generate"' in router
    assert 'kvhandoff_handoff_duration_seconds_count{server="decode"} 3' in decode
    assert 'kvhandoff_handoffs_total{server="decode"} 3' in decode
    assert 'kvhandoff_queue_wait_seconds_count{server="prefill"} 3' in prefill
    # Cumulative timers are counters (named _total), pool state is a gauge.
    assert "# TYPE kvhandoff_validation_seconds_total counter" in decode
    assert "# TYPE kvhandoff_pages_free gauge" in decode
    assert cluster.decode_server.metrics.get("kvhandoff_handoff_duration_seconds") == 3


def test_metrics_refuse_a_name_used_with_other_labels() -> None:
    from kvhandoff.impl.metrics import Metrics

    m = Metrics("decode")
    m.inc("kvhandoff_refused_writes_total", reason="bad_token")
    with pytest.raises(ValueError, match=r"takes labels \['reason'\], got \[\]"):
        m.inc("kvhandoff_refused_writes_total")
    m.inc("kvhandoff_events_total", 1234567, event="x")
    assert 'kvhandoff_events_total{event="x",server="decode"} 1234567\n' in m.render()
