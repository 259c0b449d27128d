"""Several prefill and decode servers behind one router: the router places each request on one
of each, every message of a handoff goes between the two it was placed on, losing one prefill
fails only the requests placed on it, and the logs of such a run validate against the spec (with
several instances) while a log whose writes were tampered with does not."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from kvhandoff.conformance.validate import LogError, validate_logs
from kvhandoff.impl.client import GenerateResult
from kvhandoff.impl.cluster import Cluster
from kvhandoff.impl.errors import ConfigError
from kvhandoff.impl.proto import rpc
from kvhandoff.impl.proto.gen.kvhandoff.v1 import handoff_pb2 as pb
from kvhandoff.impl.tokenizer import encode


def _events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()[1:]]


def _in_parallel(cluster: Cluster, n: int, prompt: str) -> list[GenerateResult]:
    results: list[GenerateResult | None] = [None] * n

    def one(i: int) -> None:
        with cluster.client() as c:
            results[i] = c.generate(f"tenant-{i % 3}", encode(f"{prompt} {i}"), 4, f"r{i}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def test_two_of_each_serve_every_request_and_their_logs_validate(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    one = make_cluster("reference", log_dir=tmp_path / "one")
    expected = {r.request_id: r.tokens for r in _in_parallel(one, 4, "the same prompts")}
    cluster = make_cluster(
        "reference", prefill_instances=2, decode_instances=2, log_dir=tmp_path / "four"
    )
    results = _in_parallel(cluster, 4, "the same prompts")
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    assert {r.request_id: r.tokens for r in results} == expected
    assert cluster.wait_quiescent()
    logs = sorted((tmp_path / "four").glob("*.jsonl"))
    assert [p.name for p in logs] == [
        "decode.jsonl",
        "decode1.jsonl",
        "prefill.jsonl",
        "prefill1.jsonl",
        "router.jsonl",
    ]
    # Every instance served some of the requests (the router balances by requests in flight).
    for path in logs[:4]:
        kinds = {e["event"] for e in _events(path)}
        assert kinds & {"decode_reserve_pages", "prefill_send_completion"}, path.name
    report = validate_logs(logs)
    assert report.ok, report.message


def test_a_tampered_instance_log_is_not_explained(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(
        "reference", prefill_instances=2, decode_instances=2, log_dir=tmp_path / "four"
    )
    _in_parallel(cluster, 4, "the same prompts")
    assert cluster.wait_quiescent()
    logs = sorted((tmp_path / "four").glob("*.jsonl"))
    assert validate_logs(logs).ok
    # Pages of decode instance 1 are numbered after instance 0's in the spec; with its own page
    # numbers, prefill 1's writes for a request on decode 1 would not be explained.
    tampered = tmp_path / "tampered"
    tampered.mkdir()
    for path in logs:
        (tampered / path.name).write_text(path.read_text())
    lines = (tampered / "prefill1.jsonl").read_text().splitlines()
    for k, line in enumerate(lines):
        ev = json.loads(line)
        if ev.get("event") == "prefill_write_page":
            ev["args"]["page"] = int(ev["args"]["page"]) + 1000
            lines[k] = json.dumps(ev)
            break
    else:
        pytest.fail("prefill instance 1 wrote no page")
    (tampered / "prefill1.jsonl").write_text("\n".join(lines) + "\n")
    assert not validate_logs(sorted(tampered.glob("*.jsonl"))).ok


def test_an_instance_log_given_twice_or_missing_is_refused(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster("reference", decode_instances=2, log_dir=tmp_path / "logs")
    _in_parallel(cluster, 2, "two requests")
    assert cluster.wait_quiescent()
    logs = tmp_path / "logs"
    with pytest.raises(LogError, match="decode instance 1 but not instance"):
        validate_logs([logs / "router.jsonl", logs / "prefill.jsonl", logs / "decode1.jsonl"])
    copy = tmp_path / "copy.jsonl"
    copy.write_text((logs / "decode1.jsonl").read_text())
    with pytest.raises(LogError, match="both the log of decode instance 1"):
        validate_logs([*sorted(logs.glob("*.jsonl")), copy])


def test_losing_one_prefill_fails_only_the_requests_placed_on_it(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(
        "reference",
        prefill_instances=2,
        pages_per_message=1,
        heartbeat_interval_s=0.05,
        prefill_dead_after_misses=4,
    )
    results: dict[str, GenerateResult] = {}

    def run(rid: str) -> None:
        with cluster.client() as c:
            results[rid] = c.generate("tenant-a", encode(f"held request {rid} " * 2), 4, rid)

    threads = []
    for rid in ("on-0", "on-1"):
        cluster.stall_prefill_writes(rid)
        threads.append(threading.Thread(target=run, args=(rid,)))
        threads[-1].start()
        cluster.wait_for_grant(rid, pages_written=1)
    assert cluster.placement("on-0") == (0, 0)
    assert cluster.placement("on-1") == (1, 0)
    cluster.crash_prefill(1)
    threads[1].join(30)
    assert results["on-1"].status == "error", results["on-1"]
    cluster.resume_prefill_writes("on-0")
    threads[0].join(30)
    assert results["on-0"].status == "ok", results["on-0"].error
    cluster.restart_prefill(1)
    # A later request placed on the restarted instance is served.
    results.clear()
    cluster.stall_prefill_writes("after-0")
    threads = [threading.Thread(target=run, args=("after-0",))]
    threads[0].start()
    cluster.wait_for_grant("after-0", pages_written=1)
    run("after-1")
    assert results["after-1"].status == "ok", results["after-1"].error
    cluster.resume_prefill_writes("after-0")
    threads[0].join(30)
    assert results["after-0"].status == "ok", results["after-0"].error
    assert cluster.wait_quiescent()


def test_an_instance_that_does_not_exist_is_refused_and_nothing_is_lost(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster("reference", prefill_instances=2)
    with grpc.insecure_channel(cluster.decode) as channel:
        with pytest.raises(grpc.RpcError) as err:
            rpc.decode_stub(channel).Submit(
                pb.DecodeSubmitRequest(
                    request_id="r",
                    tenant="t",
                    room=1,
                    prompt_tokens=4,
                    max_tokens=1,
                    prefill_instance=2,
                ),
                timeout=10,
            )
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "prefill instance 2 does not exist: this decode serves 2 (0..1)" in str(
        err.value.details()
    )
    with grpc.insecure_channel(cluster.prefill) as channel:
        with pytest.raises(grpc.RpcError) as err:
            rpc.prefill_stub(channel).ReceiveGrant(
                pb.Grant(request_id="r", room=1, generation=1, page_ids=[0], decode_instance=3),
                timeout=10,
            )
    assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "grant from decode instance 3 does not exist: this prefill serves 1 (0..0)" in str(
        err.value.details()
    )
    [result] = _in_parallel(cluster, 1, "still serving")
    assert result.status == "ok", result.error
    assert cluster.decode_pages() == (64, 0)


@pytest.mark.parametrize("field", ["prefill_instances", "decode_instances"])
def test_a_cluster_of_no_instances_is_refused(
    make_cluster: Callable[..., Cluster], field: str
) -> None:
    with pytest.raises(ConfigError, match=f"{field}=0: a cluster runs 1..16 instances"):
        make_cluster("reference", **{field: 0})


def test_a_retry_goes_back_to_the_instances_it_ran_on(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    # The spec's request keeps its placement across attempts; the router does the same, even
    # where another instance is now the less loaded.
    cluster = make_cluster(
        "reference", prefill_instances=2, prefill_pages=4, log_dir=tmp_path / "logs"
    )
    too_long = encode("Z" * 40)  # over prefill's 16 tokens, within decode's and the window
    with cluster.client() as c:
        first = c.generate("t", too_long, 2, "x")
    assert first.code == "OUT_OF_RANGE", first
    cluster.stall_prefill_writes("h", 0)
    held = threading.Thread(
        target=lambda: cluster.client().generate("t", encode("hold"), 2, "h", timeout=30)
    )
    held.start()
    cluster.wait_for_grant("h")
    assert cluster.placement("h") == (0, 0)  # so instance 1 is now the less loaded
    with cluster.client() as c:
        again = c.generate("t", too_long, 2, "x", retry=True)
    assert again.code == "OUT_OF_RANGE", again
    cluster.resume_prefill_writes("h")
    held.join(30)
    logs = tmp_path / "logs"
    rejected = [
        e["args"]["request_id"]
        for e in _events(logs / "prefill.jsonl")
        if e["event"] == "prefill_reject_request"
    ]
    assert rejected == ["x", "x"]
    assert not (logs / "prefill1.jsonl").exists() or all(
        e["args"].get("request_id") != "x" for e in _events(logs / "prefill1.jsonl")
    )


def test_a_restart_of_one_decode_instance_leaves_the_other_serving(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster("reference", decode_instances=2)
    boots = [server.boot for server in cluster.decode_servers]
    cluster.stall_prefill_writes("on-0", 0)
    held: list[GenerateResult] = []
    thread = threading.Thread(
        target=lambda: held.append(
            cluster.client().generate("t", encode("held on decode 0"), 2, "on-0", timeout=30)
        )
    )
    thread.start()
    cluster.wait_for_grant("on-0")
    assert cluster.placement("on-0") == (0, 0)
    cluster.crash_decode(1)
    cluster.restart_decode(1)
    # Each instance counts its own boots (its generations never repeat across its restarts).
    assert [server.boot for server in cluster.decode_servers] == [boots[0], boots[1] + 1]
    cluster.resume_prefill_writes("on-0")
    thread.join(30)
    assert held and held[0].status == "ok", held
    results = _in_parallel(cluster, 4, "after the restart")
    assert all(r.status == "ok" for r in results), [r.error for r in results]
    assert cluster.wait_quiescent()


def test_prefill_acks_an_abort_to_the_decode_instance_that_sent_it(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    # Found by the fault campaign on instances: decode instance 1's grant was lost when prefill
    # crashed under it, and the new incarnation, which knows nothing of the grant, acked decode
    # 1's aborts to decode instance 0, leaving instance 1's pages fenced for good.
    cluster = make_cluster("reference", decode_instances=2, log_dir=tmp_path / "logs")
    with grpc.insecure_channel(cluster.prefill) as channel:
        rpc.prefill_stub(channel).ReceiveAbort(
            pb.Abort(request_id="never-granted", room=7, generation=5, decode_instance=1),
            timeout=10,
        )
        with pytest.raises(grpc.RpcError) as err:
            rpc.prefill_stub(channel).ReceiveAbort(
                pb.Abort(request_id="x", room=7, generation=5, decode_instance=2), timeout=10
            )
    assert "abort from decode instance 2 does not exist" in str(err.value.details())

    def acked() -> dict[str, list[object]]:
        return {
            name: [
                e["args"]["request_id"]
                for e in _events(tmp_path / "logs" / f"{name}.jsonl")
                if e["event"] == "decode_receive_abort_ack"
            ]
            for name in ("decode", "decode1")
        }

    deadline = time.monotonic() + 10
    while not any(acked().values()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert acked() == {"decode": [], "decode1": ["never-granted"]}
