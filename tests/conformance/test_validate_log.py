"""Event logs of a live cluster (mixed traffic, a cancel, a prefill crash) validate; logs with a
write after release, a completion for an old generation, or an answer before validation are
rejected at exactly that event."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvhandoff.cli.main import main
from kvhandoff.conformance.validate import validate_logs
from kvhandoff.impl.cluster import start_cluster


@pytest.fixture(scope="module")
def live_logs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("live")
    cluster = start_cluster(
        "reference",
        device="cpu",
        log_dir=root / "logs",
        state_dir=root / "state",
        heartbeat_interval_s=0.05,
    )
    try:
        with cluster.client() as client:

            def go(i: int, n: int) -> None:
                client.generate("ab"[i % 2], [65 + i % 2] * n, max_tokens=4, request_id=f"q{i}")

            threads = [
                threading.Thread(target=go, args=(i, [8, 20, 300, 40, 4][i % 5])) for i in range(10)
            ]
            for t in threads:
                t.start()
            try:
                client.cancel("q3")
            except Exception:  # already answered: the cancel is refused, that is fine here
                pass
            for t in threads:
                t.join()
            cluster.crash_prefill()
            cluster.restart_prefill()
            cluster.wait_healthy()
            time.sleep(0.3)
            for i in range(10, 14):
                go(i, 12)
        assert cluster.wait_quiescent(10)
    finally:
        cluster.stop()
    yield root / "logs"


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _write(path: Path, lines: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(x, sort_keys=True) + "\n" for x in lines))


def _copy(live: Path, dst: Path) -> dict[str, list[dict[str, Any]]]:
    dst.mkdir()
    return {s: _read(live / f"{s}.jsonl") for s in ("router", "prefill", "decode")}


def _save(dst: Path, logs: dict[str, list[dict[str, Any]]]) -> list[Path]:
    for s, lines in logs.items():
        _write(dst / f"{s}.jsonl", lines)
    return [dst / f"{s}.jsonl" for s in logs]


def _ok_requests(decode: list[dict[str, Any]]) -> list[str]:
    return [
        e["args"]["request_id"]
        for e in decode[1:]
        if e["event"] == "decode_answer" and e["args"].get("status") == "ok"
    ]


def test_logs_of_a_live_run_with_faults_validate(live_logs: Path) -> None:
    report = validate_logs(sorted(live_logs.glob("*.jsonl")))
    assert report.ok, report.message
    assert report.events > 100


def test_a_write_after_release_is_the_first_unexplained_event(
    live_logs: Path, tmp_path: Path
) -> None:
    logs = _copy(live_logs, tmp_path / "w")
    decode = logs["decode"]
    rid = _ok_requests(decode)[0]
    write = next(
        e
        for e in decode
        if e.get("event") == "decode_receive_write" and e["args"]["request_id"] == rid
    )
    release = next(
        i
        for i, e in enumerate(decode)
        if e.get("event") == "decode_release_pages" and e["args"]["request_id"] == rid
    )
    late = {**write, "args": {**write["args"], "late": True}}
    decode.insert(release + 1, late)
    report = validate_logs(_save(tmp_path / "w", logs))
    assert not report.ok
    assert report.first_unexplained == late
    assert report.enabled_there


def test_a_completion_for_an_old_generation_is_rejected(live_logs: Path, tmp_path: Path) -> None:
    logs = _copy(live_logs, tmp_path / "c")
    decode = logs["decode"]
    first, second = _ok_requests(decode)[:2]
    old_gen = next(
        e["args"]["generation"]
        for e in decode
        if e.get("event") == "decode_reserve_pages" and e["args"]["request_id"] == first
    )
    i = next(
        i
        for i, e in enumerate(decode)
        if e.get("event") == "decode_receive_completion" and e["args"]["request_id"] == second
    )
    decode[i] = {**decode[i], "args": {**decode[i]["args"], "generation": old_gen}}
    report = validate_logs(_save(tmp_path / "c", logs))
    assert not report.ok
    assert report.first_unexplained == decode[i]


def test_an_answer_before_validation_is_rejected(live_logs: Path, tmp_path: Path) -> None:
    logs = _copy(live_logs, tmp_path / "a")
    decode = logs["decode"]
    rid = _ok_requests(decode)[0]
    answer = next(
        i
        for i, e in enumerate(decode)
        if e.get("event") == "decode_answer" and e["args"]["request_id"] == rid
    )
    completion = next(
        i
        for i, e in enumerate(decode)
        if e.get("event") == "decode_receive_completion" and e["args"]["request_id"] == rid
    )
    line = decode.pop(answer)
    decode.insert(completion, line)
    report = validate_logs(_save(tmp_path / "a", logs))
    assert not report.ok
    assert report.first_unexplained == line


def test_a_completion_logged_before_its_writes_is_named_with_its_causes(
    live_logs: Path, tmp_path: Path
) -> None:
    # Decode logs a completion before the writes it covers: no interleaving of the logs keeps
    # each log's order and every cause before its effect. The report must name that completion
    # (or prefill's, which waits for those writes) and the writes, not an unrelated event.
    logs = _copy(live_logs, tmp_path / "x")
    decode = logs["decode"]
    rid = _ok_requests(decode)[0]
    first_write = next(
        i
        for i, e in enumerate(decode)
        if e.get("event") == "decode_receive_write" and e["args"]["request_id"] == rid
    )
    completion = next(
        i
        for i, e in enumerate(decode)
        if e.get("event") == "decode_receive_completion" and e["args"]["request_id"] == rid
    )
    line = decode.pop(completion)
    decode.insert(first_write, line)
    report = validate_logs(_save(tmp_path / "x", logs))
    assert not report.ok
    assert "cannot be placed" in report.message, report.message
    blamed = report.first_unexplained or {}
    assert blamed.get("event") in ("prefill_send_completion", "decode_receive_completion")
    assert blamed["args"]["request_id"] == rid
    assert "decode_receive_write" in report.message, report.message
    assert f"decode #{line['seq']} decode_receive_completion" in report.message, report.message


def test_validate_log_cli_exit_codes(
    live_logs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate-log", *map(str, sorted(live_logs.glob("*.jsonl"))), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "explained"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert main(["validate-log", str(bad)]) == 2


def test_a_refusal_on_a_cancel_that_overtook_the_submit_is_merged_after_the_cancel() -> None:
    # A live gRPC log (campaign seed 13): decode refuses t75r2 with CANCELLED because the
    # router's withdrawal overtook its submit; the merge must place that refusal after the
    # router's `client_cancel_request`, and prefill's early cancel of t75r1 ends prefill's part.
    from kvhandoff.conformance.validate import merge_logs, read_log

    log = Path(__file__).parent / "data" / "cancel_overtakes_submit.log.jsonl"
    report = validate_logs([log])
    assert report.ok, report.message
    _, events = read_log(log)
    by_server: dict[str, list[dict[str, Any]]] = {}
    for ev in events:
        by_server.setdefault(ev["server"], []).append(ev)
    merged = [
        (ev["event"], ev["args"].get("request_id")) for ev in merge_logs(list(by_server.values()))
    ]
    assert merged.index(("client_cancel_request", "t75r2")) < merged.index(
        ("decode_reject_request", "t75r2")
    )
