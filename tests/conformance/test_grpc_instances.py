"""Conformance of the real gRPC servers on several instances: two prefill and two decode servers
behind the router, each request pinned where the program's placement puts it, judged on the
instances' logs read as the spec's several instances."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kvhandoff.conformance import campaign
from kvhandoff.conformance.grpc_target import GrpcTarget, _judge
from kvhandoff.spec.config import Config, RequestSpec


def _placed(*requests: tuple[str, int, int, int, int]) -> Config:
    """The instances campaign's scenario with these requests, (tenant, pages, room, prefill
    instance, decode instance) each."""
    specs = tuple(
        RequestSpec(t, n, m, prefill_instance=p, decode_instance=d) for t, n, m, p, d in requests
    )
    return replace(campaign.campaign_config(instances=True), placement="fixed", requests=specs)


def test_requests_run_where_their_placement_puts_them_and_the_logs_conform() -> None:
    config = _placed(("a", 2, 1, 1, 1), ("b", 1, 2, 0, 1), ("a", 1, 3, 1, 0))
    target = GrpcTarget()
    try:
        target.start(config, "reference")
        for r in range(3):
            target.submit(r)
        target.settle()
        events = target.take_events()
        placed: dict[str, set[str]] = {}
        for ev in events:
            rid = ev.get("args", {}).get("request_id")
            if ev["event"] in ("decode_reserve_pages", "prefill_admit_request"):
                placed.setdefault(rid, set()).add(ev["server"])
        assert placed == {
            target.request_id(0): {"prefill1", "decode1"},
            target.request_id(1): {"prefill", "decode1"},
            target.request_id(2): {"prefill1", "decode"},
        }
        # Decode instance 1's pages are numbered after instance 0's in the spec.
        pool = target.cluster.config.decode_pages
        reserved = [
            q
            for ev in events
            if ev["event"] == "decode_reserve_pages" and ev["server"] == "decode1"
            for q in ev["args"]["pages"]
        ]
        assert reserved and all(q >= pool for q in reserved)
        assert _judge(target, [0, 1, 2], target.last_headers, events) is None
        # A restart of prefill instance 1 is seen by both decode instances.
        target.restart_prefill(pinst=1)
        target.settle()
        restarts = [e for e in target.take_events() if e["event"] == "prefill_restart"]
        assert [(e["server"], e["args"].get("prefill_instance")) for e in restarts] == [
            ("prefill1", 1)
        ]
    finally:
        target.shutdown()


def test_the_reference_conforms_on_two_of_each_real_servers(tmp_path: Path) -> None:
    report = campaign.run(
        "grpc", "reference", traces=6, steps=20, seed=0, out_dir=tmp_path, instances=True
    )
    assert report.verdict == "conforms", report.failures
    assert report.traces == 6
    assert report.coverage is not None
    assert report.coverage.fired["decode_receive_completion"] > 0
    # Two adversarial rounds (traces 1 and 5), played against instance 0 of each.
    assert sum(report.coverage.probes.values()) > 0
    assert report.coverage.probes["write_corrupt_data:refused"] == 2 * 2


@pytest.mark.slow
def test_a_prefill_that_answers_instance_0_whoever_granted_diverges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Prefill that sends its writes, completion and acks to decode instance 0, not to the
    # instance that sent the grant: the request on decode 1 is never completed there.
    from kvhandoff.impl.servers import prefill

    monkeypatch.setattr(prefill.PrefillServer, "_decode_for", lambda self, rid, generation=None: 0)
    report = campaign.run(
        "grpc", "reference", traces=20, steps=20, seed=0, out_dir=tmp_path, instances=True
    )
    assert report.verdict == "diverges"


def test_conform_instances_on_the_grpc_target_from_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvhandoff.cli.main import main

    argv = ["conform", "--instances", "--target", "grpc", "--traces", "3", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert "conforms" in capsys.readouterr().out


def test_a_divergence_names_its_event_log_and_its_program(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvhandoff.cli.main import main

    argv = ["conform", "--target", "grpc", "--instances", "--mode", "incident"]
    assert main([*argv, "--traces", "5", "--out", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    log = next(line for line in lines if line.startswith("  event log: ")).split()[2]
    program = next(line for line in lines if line.startswith("  program: ")).split()[1]
    assert log.endswith(".log.jsonl") and Path(log).exists()
    assert program == log[: -len(".log.jsonl")] + ".jsonl" and Path(program).exists()
    assert f"kvhandoff validate-log {log}" in "\n".join(lines)
    assert f"kvhandoff replay {program} --target grpc" in "\n".join(lines)
    # The saved log, instances and all, is what validate-log reads.
    assert main(["validate-log", log]) == 1
