"""The incident counterexample replayed on the implementation: a real leak in incident mode,
a clear error and no leak in reference mode (in-process and on the real servers)."""

from __future__ import annotations

import pytest

from kvhandoff.conformance.replay import incident_counterexample, replay_trace


@pytest.fixture(scope="module")
def trace():  # type: ignore[no-untyped-def]
    return incident_counterexample()


@pytest.mark.parametrize("target", ["inproc", "grpc"])
def test_incident_mode_leaks_another_tenants_canary(trace, target: str) -> None:  # type: ignore[no-untyped-def]
    report = replay_trace(trace, target, mode="incident")
    assert report.verdict == "diverges"
    reader, writer = report.leaks[0]
    assert reader.endswith("r1") and writer.endswith("r0")
    assert report.answers[reader]["ok"]
    assert report.first_divergence is not None


@pytest.mark.parametrize("target", ["inproc", "grpc"])
def test_reference_mode_gives_the_oversized_request_a_clear_error(trace, target: str) -> None:  # type: ignore[no-untyped-def]
    report = replay_trace(trace, target, mode="reference")
    assert report.verdict == "conforms", report.summary()
    assert report.leaks == []
    oversized = next(a for rid, a in report.answers.items() if rid.endswith("r1"))
    assert not oversized["ok"] and oversized["code"] == "OUT_OF_RANGE"
    assert "exceeds prefill's limit" in oversized["message"]


def test_replay_reports_where_the_target_agrees_and_where_it_diverges(trace) -> None:  # type: ignore[no-untyped-def]
    report = replay_trace(trace, "inproc", mode="incident")
    flags = [s.conforms for s in report.steps]
    assert flags[0] and not flags[-1]
    assert all(s.as_predicted for s in report.steps[:-1])  # it does what the incident predicts
