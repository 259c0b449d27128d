"""The implementation under a partition in which decode takes a live prefill for dead.

The spec's `decode_suspect_prefill_dead` is, on the in-process target, decode's health probe of
prefill missing `prefill_dead_after_misses` times (prefill stays up), then answering again. The
implementation logs it as `decode_detect_prefill_restart` with no new epoch.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kvhandoff.conformance import campaign
from kvhandoff.conformance.inproc import InProcTarget
from kvhandoff.conformance.lockstep import Divergence, Session
from kvhandoff.conformance.replay import replay_trace
from kvhandoff.conformance.validate import Validator
from kvhandoff.impl.core import decode as dc
from kvhandoff.spec import get_variant
from kvhandoff.spec.actions import (
    DecodeAdmitRequest,
    DecodeSuspectPrefillDead,
    PrefillAdmitRequest,
    PrefillReceiveGrant,
    PrefillWritePage,
    RouterSubmitRequest,
)
from kvhandoff.spec.trace import Trace, load_trace
from tests.explored import explored
from tests.stepping import biased_programs, log_ids, take_in

CONFIG = replace(campaign.campaign_config(), max_partitions=1)
DATA = Path(__file__).parent / "data"


_ids, _take = log_ids, take_in


def _granted_and_writing() -> Session:
    session = Session(InProcTarget(), CONFIG, "reference", probes=False)
    for kind in (
        RouterSubmitRequest,
        PrefillAdmitRequest,
        DecodeAdmitRequest,  # the implementation's decode admits and reserves in one call
        PrefillReceiveGrant,
        PrefillWritePage,
    ):
        assert _take(session, kind), kind.__name__
    return session


def test_the_variant_s_counterexample_replays_and_the_reference_refuses_the_late_write() -> None:
    # The catalogue's partition counterexample, played on the reference implementation: decode
    # gives prefill up while a write is on the wire, frees the page, and the live prefill's
    # write arrives. The real decode refuses it, and every event is the spec's.
    variant = get_variant("release_on_suspected_death")
    result = explored(variant.name)
    late = result.result_for("no_late_write_lands_in_reallocated_page")
    assert late.trace is not None
    header = {"kind": "counterexample", "variant": variant.name, "property": late.property}
    report = replay_trace(Trace(result.config, late.trace, header), "inproc", "reference")
    assert report.conforms, report.summary()
    steps = {s.action["action"]: s for s in report.steps}
    suspect = steps["decode_suspect_prefill_dead"]
    assert suspect.performed and "decode:decode_detect_prefill_restart" in suspect.events
    (detect,) = [e for e in report.events if e["event"] == "decode_detect_prefill_restart"]
    assert detect["args"]["new_epoch"] is None and detect["args"]["failed"] == ["r0"]
    writes = [e for e in report.events if e["event"] == "decode_receive_write"]
    assert writes and writes[-1]["args"]["outcome"] == "refused"
    assert report.answers["r0"]["ok"] is False
    assert "prefill stopped answering health checks" in report.answers["r0"]["message"]


def test_the_partition_in_lockstep_fails_the_waiting_request_and_everything_settles() -> None:
    session = _granted_and_writing()
    assert _take(session, DecodeSuspectPrefillDead)
    state = session.state
    assert state.faults.partitions == 1 and state.requests[0].d in ("failed", "released")
    # Decode stops taking prefill for dead once the partition heals.
    assert isinstance(session.target, InProcTarget) and not session.target.decode.prefill_dead
    session.finish()
    answers = session.target.answers()
    assert not answers[0].ok


def test_the_target_refuses_the_partition_while_a_grant_is_in_flight() -> None:
    # The implementation's decode would keep a request whose grant the live prefill has not
    # acknowledged yet; the spec's decode fails it. The target does not take the step there.
    session = Session(InProcTarget(), CONFIG, "reference", probes=False)
    for kind in (RouterSubmitRequest, PrefillAdmitRequest, DecodeAdmitRequest):
        assert _take(session, kind)
    assert DecodeSuspectPrefillDead() in session.enabled()
    before = len(session.events)
    assert not session.do(DecodeSuspectPrefillDead())
    assert len(session.events) == before
    assert session.state.faults.partitions == 0


def test_a_detection_that_keeps_a_waiting_request_is_unexplained() -> None:
    session = _granted_and_writing()
    assert _take(session, DecodeSuspectPrefillDead)
    events = [dict(e) for e in session.events]
    (i,) = [k for k, e in enumerate(events) if e["event"] == "decode_detect_prefill_restart"]
    assert Validator(CONFIG, _ids(CONFIG)).run(events).ok
    # The same log, but decode claims it failed nothing: r0 would go on to be served by the
    # live prefill, which the spec's decode no longer allows.
    events[i] = {**events[i], "args": {**events[i]["args"], "failed": []}}
    report = Validator(CONFIG, _ids(CONFIG)).run(events)
    assert not report.ok and report.explained == i


def test_random_programs_with_a_partition_conform_and_their_logs_validate() -> None:
    # Take the partition half the times it is offered: uniformly it is rarely drawn.
    counts = biased_programs(
        CONFIG, [(DecodeSuspectPrefillDead, 0.5)], "decode_suspect_prefill_dead"
    )
    assert sum(counts) >= 10


# --- what the default campaign plays, and what it must see logged -------------------------------


def test_the_default_campaign_plays_partitions_and_names_what_it_never_enabled() -> None:
    assert campaign.campaign_config().max_partitions == 2
    report = campaign.run("inproc", "reference", traces=30, seed=0)
    assert report.conforms and report.coverage is not None
    coverage = report.coverage.to_json()
    # Offered to the programs (about one in fifty of the default 1000 takes it; the mutation
    # benchmark's partition mutants are killed there).
    assert "decode_suspect_prefill_dead" in report.coverage.enabled
    assert "decode_suspect_prefill_dead" not in coverage["actions_never_enabled"]
    # Without --max-retries no program's spec offers a retry: the report says so.
    assert "router_retry_request" in coverage["actions_never_enabled"]
    assert "never enabled by these scenarios: " in report.coverage.summary()


def test_a_decode_that_takes_prefill_for_dead_and_logs_nothing_diverges(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The worker marks prefill dead and fails nothing. Its log alone is explained by a run
    # without the partition (the spec allows it); the step was performed, so its event is due.
    def silent(self: dc.DecodeCore, ev: dc.PrefillHeartbeat) -> list[dc.DecodeCommand]:
        if ev.epoch is not None:
            return self._observe_epoch(ev.prefill, ev.epoch)
        peer = self._peer(ev.prefill)
        peer.misses += 1
        if peer.misses >= self.config.prefill_dead_after_misses:
            peer.dead = True
        return []

    monkeypatch.setattr(dc.DecodeCore, "_on_heartbeat", silent)
    session = _granted_and_writing()
    with pytest.raises(Divergence) as caught:
        session.do(DecodeSuspectPrefillDead())
    assert caught.value.kind == "missing_event"
    assert "decode_detect_prefill_restart" in caught.value.message


def test_a_decode_that_never_sees_the_partition_heal_misses_the_second_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = dc.DecodeCore._observe_epoch

    def sticky(self: dc.DecodeCore, prefill: int, epoch: int) -> list[dc.DecodeCommand]:
        dead = self._peer(prefill).dead
        out = original(self, prefill, epoch)
        self._peer(prefill).dead = dead  # the answering probe does not bring prefill back
        return out

    config = replace(CONFIG, max_partitions=2, max_faults=2)
    session = Session(InProcTarget(), config, "reference", probes=False)
    for kind in (RouterSubmitRequest, PrefillAdmitRequest, DecodeAdmitRequest, PrefillReceiveGrant):
        assert _take(session, kind)
    monkeypatch.setattr(dc.DecodeCore, "_observe_epoch", sticky)
    assert session.do(DecodeSuspectPrefillDead())
    with pytest.raises(Divergence) as caught:
        session.do(DecodeSuspectPrefillDead())
    assert caught.value.kind == "missing_event"


def test_a_timeout_fires_for_its_own_request_only() -> None:
    # Found by the campaign once it played partitions (other draws): request 0, cancelled by
    # the client, still waits at decode (the cancel has not reached it) when request 1 is
    # admitted; the spec times out request 0. The target's clock used to jump past every
    # deadline, timing request 1 out too, which no spec step explains.
    trace = load_trace((DATA / "timeout_beside_a_cancelled_request.jsonl").read_text())
    report = replay_trace(trace, "inproc", "reference")
    assert report.conforms, report.summary()
    timeouts = [e for e in report.events if e["event"] == "decode_waiting_timeout"]
    assert [e["args"]["request_id"] for e in timeouts] == ["r0"]
    assert report.answers["r1"]["ok"] is True
