"""The directed programs a campaign with client retries runs before its random ones.

Each is a hazard the random programs found once, by luck of the draws (the catalogue mutants
`abort_matched_by_request_id_only` and `stale_attempt_notice_taken` diverged only at the 966th and
618th program); written out, a campaign meets it in its first programs whatever the seed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kvhandoff.conformance import campaign
from kvhandoff.impl.core import decode as dc
from tests.conformance.test_retry import ignore_attempts_on_abort


def take_stale_notices(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant stale_attempt_notice_taken by another route: decode reads every rejection
    notice as one of the attempt it holds."""
    original = dc.DecodeCore._on_rejection

    def on_rejection(self: dc.DecodeCore, ev: dc.RejectionReceived) -> list[dc.DecodeCommand]:
        req = self._requests.get(ev.request_id)
        if req is not None:
            ev = dataclasses.replace(ev, attempt=req.attempt)
        return original(self, ev)

    monkeypatch.setattr(dc.DecodeCore, "_on_rejection", on_rejection)


def _run(tmp_path: Path, traces: int = 5, **options: object) -> campaign.CampaignReport:
    return campaign.run("inproc", "reference", traces=traces, seed=0, out_dir=tmp_path, **options)  # type: ignore[arg-type]


def test_a_retry_campaign_plays_the_directed_programs_first_and_conforms(tmp_path: Path) -> None:
    report = _run(tmp_path, max_retries=1)
    assert report.conforms, report.failures
    directed = [p for p in report.programs if p.phase == "directed"]
    assert [p.index for p in directed] == [1, 2]
    # Every step of each was taken: the spec enabled it and the target performed it.
    assert [p.steps for p in directed] == [len(d.steps) for d in campaign.DIRECTED]
    assert report.traces == len(directed) + len(
        [p for p in report.programs if p.phase == "generate"]
    )


def test_a_campaign_without_retries_plays_none(tmp_path: Path) -> None:
    report = _run(tmp_path)
    assert not [p for p in report.programs if p.phase == "directed"]


@pytest.mark.parametrize(
    ("patch", "program", "event"),
    [
        (ignore_attempts_on_abort, 1, "prefill_finish_request"),
        (take_stale_notices, 2, "decode_receive_rejection"),
    ],
)
def test_each_directed_program_catches_its_bug_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, patch: object, program: int, event: str
) -> None:
    patch(monkeypatch)  # type: ignore[operator]
    report = _run(tmp_path, traces=1, max_retries=1)
    assert not report.conforms
    assert report.traces_to_failure == program
    (failure,) = report.failures
    assert failure.kind == "unexplained_event" and event in failure.message
    assert Path(failure.trace_file).exists()
