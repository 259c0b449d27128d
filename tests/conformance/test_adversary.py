"""Adversarial probes, boundary prompts and the sharper oracles of the lockstep session."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from kvhandoff.conformance import adversary
from kvhandoff.conformance.campaign import boundary_tokens, campaign_config
from kvhandoff.conformance.inproc import InProcTarget
from kvhandoff.conformance.lockstep import Divergence, Session
from kvhandoff.conformance.validate import Ids, Validator
from kvhandoff.spec.actions import (
    Action,
    DecodeReceiveCompletion,
    NetworkDuplicateMessage,
    PrefillRestart,
    PrefillSendCompletion,
    is_fault,
)
from kvhandoff.spec.config import Config


def _drive_until(session: Session, stop: type, limit: int = 60) -> Action:
    """Take the first protocol step the spec lists until `stop` is enabled; return it."""
    for _ in range(limit):
        options = [a for a in session.enabled() if not is_fault(a)]
        hit = [a for a in options if isinstance(a, stop)]
        if hit:
            return hit[0]
        session.do(options[0])
    raise AssertionError(f"{stop.__name__} never became enabled")


def test_boundary_prompts_sit_at_and_around_every_limit_and_page_edge() -> None:
    cfg = campaign_config()  # 16-token pages; limits 2, 3 and 4 pages
    assert boundary_tokens(cfg) == [1, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65]


def test_every_attack_on_a_granted_request_gets_the_reaction_the_spec_requires() -> None:
    session = Session(InProcTarget(), campaign_config(), "reference")
    _drive_until(session, PrefillSendCompletion)  # every page of r0 landed, no completion yet
    state = session.state
    seen = {}
    for attack in adversary.attacks_for(state):
        want = adversary.expected(session.variant, session.config, state, attack)
        got = session.target.probe(attack)
        assert want is not None and got is not None, attack
        assert adversary.judge(attack, want, got) is None, (attack, want, got)
        seen[attack.kind] = got.outcome
    assert seen["completion_early"] == "validated"  # every page landed: the honest one passes
    assert seen["completion_undercount"] == seen["completion_bad_digest"] == "failed"
    assert seen["completion_forged_token"] == seen["completion_wrong_room"] == "ignored"
    assert seen["write_corrupt_data"] == seen["write_page_not_granted"] == "refused"


def test_probes_leave_the_run_as_it_was() -> None:
    def run(probes: bool) -> tuple[list[Any], dict[int, Any]]:
        session = Session(InProcTarget(), campaign_config(), "reference", probes=probes)
        _drive_until(session, DecodeReceiveCompletion)
        for _ in range(12):
            options = [a for a in session.enabled() if not is_fault(a)]
            if not options:
                break
            session.do(options[0])
        session.finish()
        events = [(e["server"], e["event"], e["args"]) for e in session.events]
        return events, session.target.answers()

    with_probes, answers = run(True)
    without, answers_without = run(False)
    assert with_probes == without
    assert answers.keys() == answers_without.keys()


def test_a_decode_that_accepts_a_forged_completion_diverges() -> None:
    class Trusting(InProcTarget):
        def probe(self, attack: adversary.Attack) -> adversary.ProbeResult | None:
            got = super().probe(attack)
            if got is not None and attack.kind == "completion_bad_digest":
                return adversary.ProbeResult("validated", True, "trusting decode")
            return got

    session = Session(Trusting(), campaign_config(), "reference")
    with pytest.raises(Divergence) as caught:
        _drive_until(session, PrefillSendCompletion)
        session.do(_drive_until(session, PrefillSendCompletion))
    assert caught.value.kind == "adversarial"
    assert "completion_bad_digest" in caught.value.message
    assert "the spec requires failed" in caught.value.message


def _validator(cfg: Config, target: InProcTarget) -> Validator:
    ids = Ids(cfg.page_size)
    ids.requests.update({target.request_id(r): r for r in range(len(cfg.requests))})
    return Validator(cfg, ids)


def test_a_second_validated_verdict_for_a_duplicated_completion_is_unexplained() -> None:
    cfg = campaign_config()
    target = InProcTarget()
    session = Session(target, cfg, "reference", probes=False)
    receive = _drive_until(session, DecodeReceiveCompletion)
    assert isinstance(receive, DecodeReceiveCompletion)
    session.do(NetworkDuplicateMessage(receive.message))  # two copies in flight
    session.do(receive)
    verdict = session.events[-1]
    verdicts = [e for e in session.events if e["event"] == "decode_receive_completion"]
    assert verdicts[-1]["args"]["verdict"] == "validated"
    validator = _validator(cfg, target)
    assert all(validator.feed(e) for e in session.events)
    # A decode that took the duplicate as well would log a second `validated`.
    again = copy.deepcopy(verdicts[-1])
    again["seq"] = verdict["seq"] + 1
    assert not validator.feed(again)
    assert "unexplained" in validator.report().message


def test_restart_detection_must_name_the_requests_it_failed() -> None:
    cfg = campaign_config()
    target = InProcTarget()
    session = Session(target, cfg, "reference", probes=False)
    _drive_until(session, PrefillSendCompletion)  # r0's grant held by prefill, pages landed
    session.do(PrefillRestart())
    detect = next(e for e in session.events if e["event"] == "decode_detect_prefill_restart")
    assert detect["args"]["failed"] == ["r0"]
    at = session.events.index(detect)
    honest = _validator(cfg, target)
    assert all(honest.feed(e) for e in session.events[: at + 1])
    silent = _validator(cfg, target)
    assert all(silent.feed(e) for e in session.events[:at])
    forgot = copy.deepcopy(detect)
    forgot["args"]["failed"] = []  # a restart that did not fail the request its prefill held
    assert not silent.feed(forgot)


def test_a_probe_failure_is_shrunk_saved_and_replays(tmp_path: Any) -> None:
    from kvhandoff.conformance import campaign
    from kvhandoff.conformance.replay import replay_trace

    class Trusting(InProcTarget):
        def probe(self, attack: adversary.Attack) -> adversary.ProbeResult | None:
            got = super().probe(attack)
            if got is not None and attack.kind == "write_corrupt_data":
                return adversary.ProbeResult("accepted", True, "no per-page digest check")
            return got

    report = campaign.run("inproc", "reference", traces=30, out_dir=tmp_path, target=Trusting())
    assert report.verdict == "diverges" and report.traces_to_failure is not None
    failure = report.failures[0]
    assert failure.kind == "adversarial" and "write_corrupt_data" in failure.message
    replayed = replay_trace(Path(failure.trace_file), Trusting())
    assert replayed.verdict == "diverges"
    assert replayed.first_divergence is not None
    assert "write_corrupt_data" in replayed.first_divergence["message"]
    assert replay_trace(Path(failure.trace_file), InProcTarget()).verdict == "conforms"
