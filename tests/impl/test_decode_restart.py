"""Decode persists a boot counter, so generations never repeat across restarts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kvhandoff.impl.cluster import Cluster
from kvhandoff.impl.eventlog import read_events
from kvhandoff.impl.servers.decode import next_boot
from kvhandoff.impl.tokenizer import encode


def test_the_boot_counter_increases_on_every_start(tmp_path: Path) -> None:
    assert [next_boot(tmp_path), next_boot(tmp_path), next_boot(tmp_path)] == [1, 2, 3]


def test_generations_after_a_decode_restart_are_all_new(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster("reference", log_dir=tmp_path / "logs", state_dir=tmp_path / "state")

    def generations() -> list[int]:
        _, events = read_events(tmp_path / "logs" / "decode.jsonl")
        return [e["args"]["generation"] for e in events if e["event"] == "decode_reserve_pages"]

    with cluster.client() as c:
        for _ in range(3):
            assert c.generate("t", encode("before"), 4).status == "ok"
    before = generations()
    cluster.crash_decode()
    cluster.restart_decode()
    with cluster.client() as c:
        for _ in range(3):
            assert c.generate("t", encode("after"), 4).status == "ok"
    after = generations()[len(before) :]
    assert len(before) == 3 and len(after) == 3
    assert min(after) > max(before) and not set(after) & set(before)
    assert {g >> 32 for g in before} == {1} and {g >> 32 for g in after} == {2}
    _, events = read_events(tmp_path / "logs" / "decode.jsonl")
    assert any(e["event"] == "decode_restart" and e["args"]["boot"] == 2 for e in events)
