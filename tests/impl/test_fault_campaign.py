"""A short fault campaign over the real gRPC servers (issue 15): crashes with requests in
flight, restarts, cancels, waiting timeouts, delayed, duplicated and lost control messages and an
over-limit prompt, each trace judged on its event logs, answers, canaries and quiescence.
The long run is `benchmarks/fault_campaign.py`."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.fault_campaign import parse_faults, run_fault_campaign
from kvhandoff_cli.main import main


def test_a_short_fault_campaign_conforms_with_every_fault_injected(tmp_path: Path) -> None:
    faults = parse_faults("all")
    report = run_fault_campaign("reference", 12, 4, faults, tmp_path)
    assert report.conforms, report.failure
    assert report.traces == 12
    assert (report.divergences, report.cross_tenant_reads, report.pages_lost) == (0, 0, 0)
    kinds = {k.split("_")[0] for k in report.injected}
    assert {"crash", "late", "dup", "drop", "timeout"} <= kinds, report.injected


def test_the_incident_mode_is_caught_by_the_fault_campaign(tmp_path: Path) -> None:
    report = run_fault_campaign("incident", 10, 0, parse_faults("cancel,oversize"), tmp_path)
    assert not report.conforms and report.failure is not None
    assert Path(report.failure["log"]).exists()


def test_bad_fault_lists_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conform", "--target", "grpc", "--faults", "crash,meteor"]) == 2
    assert "unknown fault meteor" in capsys.readouterr().err
    assert main(["conform", "--target", "inproc", "--faults", "crash"]) == 2
    assert "--target grpc" in capsys.readouterr().err
