"""The reference implementation conforms in-process over generated traces with faults."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvhandoff.conformance import campaign
from kvhandoff.conformance.inproc import InProcTarget
from kvhandoff.conformance.lockstep import Session
from kvhandoff.spec.actions import RouterSubmitRequest


def test_reference_conforms_over_a_thousand_traces_with_faults(tmp_path: Path) -> None:
    report = campaign.run("inproc", "reference", traces=1000, steps=20, seed=0, out_dir=tmp_path)
    assert report.verdict == "conforms", report.failures
    assert report.traces >= 1000


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_reference_conforms_over_many_more_traces(tmp_path: Path, seed: int) -> None:
    report = campaign.run("inproc", "reference", traces=4000, steps=30, seed=seed, out_dir=tmp_path)
    assert report.verdict == "conforms", report.failures


def test_a_divergence_is_shrunk_and_saved_as_a_replayable_trace(tmp_path: Path) -> None:
    report = campaign.run("inproc", "incident", traces=200, steps=20, seed=0, out_dir=tmp_path)
    assert report.verdict == "diverges"
    failure = report.failures[0]
    text = Path(failure.trace_file).read_text()
    assert '"kind": "failure"' in text.splitlines()[0]
    assert len(text.splitlines()) - 1 <= 8  # shrunk to a short program


def test_the_session_starts_every_program_from_a_clean_target() -> None:
    target = InProcTarget()
    config = campaign.campaign_config()
    for _ in range(2):
        session = Session(target, config, "reference")
        session.do(RouterSubmitRequest(0))
        session.finish()
        assert target.quiescent()
        assert target.answers()[0].ok


# Found by the slow campaign (seed 3): prefill parked grants by room, so a stale parked grant
# of a cancelled request blocked the next request reusing the room until the orphan timeout.
def test_a_stale_parked_grant_does_not_block_a_room() -> None:
    from kvhandoff.conformance.replay import replay_trace

    trace = Path(__file__).parent / "data" / "stale_parked_grant_blocks_room.jsonl"
    assert replay_trace(trace, "inproc", "reference").conforms


def test_the_logs_of_in_process_programs_validate_without_the_lockstep() -> None:
    # The lockstep runner tells its validator which unlogged spec steps it drove (a cancel
    # reaching a worker that logs nothing); `validate-log` has only the events. Every log of a
    # conforming program must be explained from its events alone (the silent-step search).
    import random

    from kvhandoff.conformance.lockstep import run_program
    from kvhandoff.conformance.validate import Ids, Validator

    config = campaign.campaign_config()
    for seed in range(300):
        session = run_program(InProcTarget(), config, "reference", random.Random(seed).choice, 20)
        ids = Ids(config.page_size, {f"r{r}": r for r in range(len(config.requests))})
        report = Validator(config, ids).run(session.events)
        assert report.ok, (seed, report.message)
