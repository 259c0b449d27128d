"""Issue 15, admission queue: a request that does not fit yet waits (bounded, with a deadline,
tenants in turn) instead of being refused; a prompt over prefill's limit reserves nothing."""

from __future__ import annotations

import threading
from collections.abc import Callable

from kvhandoff.impl.client import GenerateResult
from kvhandoff.impl.cluster import Cluster
from kvhandoff.impl.eventlog import read_events
from kvhandoff.impl.servers.admission import AdmissionQueue
from kvhandoff.impl.tokenizer import encode


def test_the_queue_serves_tenants_in_turn_and_never_lets_a_small_request_overtake() -> None:
    q: AdmissionQueue[int] = AdmissionQueue(max_len=5, timeout_s=10)
    for tenant, item in [("a", 1), ("a", 2), ("a", 3), ("b", 10), ("c", 20)]:
        assert q.push(tenant, item, now=0.0) is not None
    assert q.push("d", 99, now=0.0) is None  # bounded
    order = []
    while (e := q.pop_admissible(lambda _: True)) is not None:
        order.append(e.item)
    assert order == [1, 10, 20, 2, 3]  # round-robin by tenant, FIFO within one
    q.push("a", 8, now=0.0)
    q.push("b", 1, now=0.0)
    assert q.pop_admissible(lambda need: need <= 4) is None  # a's head blocks: no overtaking
    assert [e.item for e in q.expired(now=10.0)] == [8, 1] and len(q) == 0


def generate_in_background(
    cluster: Cluster, tenant: str, prompt: list[int], rid: str, box: dict[str, GenerateResult]
) -> threading.Thread:
    def run() -> None:
        with cluster.client() as c:
            box[rid] = c.generate(tenant, prompt, 8, request_id=rid, timeout=30)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_request_that_does_not_fit_waits_for_pages_instead_of_failing(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster("reference", decode_pages=10, pages_per_message=2)
    big = encode("X" * 24)  # 6 pages: two of them never fit in 10 pages at once
    box: dict[str, GenerateResult] = {}
    cluster.stall_prefill_writes("first")
    t1 = generate_in_background(cluster, "a", big, "first", box)
    cluster.wait_for_grant("first", pages_written=2)
    t2 = generate_in_background(cluster, "b", big, "second", box)
    server = cluster.decode_server
    assert _eventually(lambda: cluster.runtime.call(lambda: len(server.queue)) == 1)
    cluster.resume_prefill_writes("first")
    t1.join(30)
    t2.join(30)
    assert box["first"].status == "ok" and box["second"].status == "ok", box
    assert server.metrics.get("kvhandoff_admission_admitted_total") == 1
    assert server.metrics.get("kvhandoff_admission_wait_seconds_total") > 0
    assert cluster.wait_quiescent(10)


def test_a_queued_request_past_its_deadline_gets_a_clear_error(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(
        "reference", decode_pages=10, pages_per_message=2, admission_timeout_s=0.5
    )
    big = encode("X" * 24)
    box: dict[str, GenerateResult] = {}
    cluster.stall_prefill_writes("first")
    t1 = generate_in_background(cluster, "a", big, "first", box)
    cluster.wait_for_grant("first", pages_written=2)
    t2 = generate_in_background(cluster, "b", big, "late", box)
    t2.join(30)
    assert box["late"].code == "RESOURCE_EXHAUSTED"
    assert "waited 0.5s in decode's admission queue" in box["late"].error
    assert "needs 6 pages, decode has 4 free" in box["late"].error
    cluster.resume_prefill_writes("first")
    t1.join(30)
    assert box["first"].status == "ok"


def test_a_prompt_over_prefills_limit_reserves_no_decode_page(
    make_cluster: Callable[..., Cluster], tmp_path: object
) -> None:
    # Issue 15: oversized prompts held up to 128 decode pages until prefill refused them.
    cluster = make_cluster("reference", prefill_pages=8, decode_pages=64, context_window=200)
    server = cluster.decode_server
    assert _eventually(lambda: server.prefill_max_prompts.get(0) == 32)
    with cluster.client() as c:
        r = c.generate("t", encode("Y" * 100), 4, request_id="too-long")
    assert r.code == "OUT_OF_RANGE" and "prefill's limit of 32 tokens" in r.error
    assert cluster.wait_quiescent(10)
    assert cluster.config.log_dir is not None
    _, events = read_events(cluster.config.log_dir / "decode.jsonl")
    mine = [e["event"] for e in events if e["args"].get("request_id") == "too-long"]
    assert "decode_reserve_pages" not in mine and "decode_reject_request" in mine, mine


def _eventually(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def test_the_router_bounds_requests_in_flight_and_queues_the_rest(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster("reference", max_in_flight=1, admission_queue_len=1, pages_per_message=2)
    box: dict[str, GenerateResult] = {}
    cluster.stall_prefill_writes("first")
    t1 = generate_in_background(cluster, "a", encode("A" * 40), "first", box)
    cluster.wait_for_grant("first", pages_written=1)
    t2 = generate_in_background(cluster, "b", encode("B" * 8), "second", box)
    router = cluster.router_server
    assert _eventually(lambda: cluster.runtime.call(lambda: len(router.queue)) == 1)
    with cluster.client() as c:  # the queue holds one: a third is refused at once, saying why
        third = c.generate("c", encode("C" * 8), 4, request_id="third")
    assert third.code == "RESOURCE_EXHAUSTED" and "admission queue is full" in third.error
    cluster.resume_prefill_writes("first")
    t1.join(30)
    t2.join(30)
    assert box["first"].status == "ok" and box["second"].status == "ok", box
    assert router.metrics.get("kvhandoff_admission_admitted_total") == 1


def test_while_prefill_is_down_a_queued_request_is_told_so(
    make_cluster: Callable[..., Cluster],
) -> None:
    # Issue 15: clients used to read only "decode has 0 free" while prefill was down.
    cluster = make_cluster(
        "reference", decode_pages=10, admission_timeout_s=0.5, heartbeat_interval_s=0.05
    )
    cluster.crash_prefill()
    server = cluster.decode_server
    assert _eventually(lambda: cluster.runtime.call(lambda: server.core.prefill_dead))
    big = encode("X" * 24)
    box: dict[str, GenerateResult] = {}
    held = generate_in_background(cluster, "a", big, "held", box)  # reserves, waits for prefill
    assert _eventually(lambda: cluster.runtime.call(lambda: server.core.free_pages) == 4)
    with cluster.client() as c:
        r = c.generate("b", big, 4, request_id="late", timeout=10)
    assert r.code == "RESOURCE_EXHAUSTED"
    assert "prefill is not answering decode's health checks" in r.error
    assert "needs 6 pages, decode has 4 free" in r.error
    cluster.restart_prefill()
    held.join(40)
