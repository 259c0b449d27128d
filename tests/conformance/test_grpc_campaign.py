"""The reference implementation conforms against the real gRPC servers on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance import campaign


# Slow since session 2: the real servers occasionally diverge (about one run in ten here) where a
# client cancel races a completion already on its way to decode. The spec's cancel fails the
# request at decode in the same step; the implementation's router answers the client at once and
# tells decode by an RPC, and decode may validate and answer first. Safe (the client got
# CANCELLED, nothing leaks) but unexplained; the log is kept in
# data/cancel_races_completion.log.jsonl and pinned below as a known mismatch.
@pytest.mark.slow
def test_reference_conforms_over_a_hundred_traces_on_real_servers(tmp_path: Path) -> None:
    report = campaign.run("grpc", "reference", traces=100, steps=20, seed=0, out_dir=tmp_path)
    assert report.verdict == "conforms", report.failures
    assert report.traces == 100


def test_incident_mode_diverges_on_real_servers(tmp_path: Path) -> None:
    report = campaign.run("grpc", "incident", traces=20, steps=20, seed=0, out_dir=tmp_path)
    assert report.verdict == "diverges"
    assert Path(report.failures[0].trace_file).exists()


@pytest.mark.slow
@pytest.mark.xfail(
    reason="known finding: an early-cancelled request's hand-over that crosses a "
    "prefill crash is admitted by the new prefill and held forever",
    strict=False,
)
def test_crashes_with_requests_in_flight(tmp_path: Path) -> None:
    from conformance.campaign import campaign_config
    from conformance.grpc_target import GrpcTarget, run_coarse_campaign

    report = run_coarse_campaign(
        GrpcTarget(),
        "grpc",
        "reference",
        300,
        20,
        7,
        campaign_config(),
        tmp_path,
        crash_in_flight=True,
    )
    assert report.verdict == "conforms", report.failures


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reference_conforms_over_more_traces_on_real_servers(tmp_path: Path, seed: int) -> None:
    report = campaign.run("grpc", "reference", traces=200, steps=20, seed=seed, out_dir=tmp_path)
    assert report.verdict == "conforms", report.failures


def test_the_cancel_completion_race_is_a_known_granularity_mismatch() -> None:
    # When the spec models the cancel's trip to decode, this log should validate: then flip this
    # test and move the 100-trace test back into the default run.
    from conformance.validate import validate_logs

    log = Path(__file__).parent / "data" / "cancel_races_completion.log.jsonl"
    report = validate_logs([log])
    assert not report.ok
    assert report.first_unexplained is not None
    assert report.first_unexplained["event"] == "decode_receive_completion"
    assert report.first_unexplained["args"]["request_id"] == "t64r0"
