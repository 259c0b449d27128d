"""The spec's `router_retry_request` on the in-process target: a client's retry under the same
request id, whose attempt number every message carries (`Design.attempt_fence`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvhandoff.conformance import campaign
from kvhandoff.conformance.inproc import InProcTarget
from kvhandoff.conformance.registry import BY_ACTION
from kvhandoff.conformance.replay import replay_trace
from kvhandoff.conformance.target import UnsupportedScenario, require_one_prefill_rank
from kvhandoff.conformance.validate import Ids, Validator
from kvhandoff.impl.core import prefill as pc
from kvhandoff.spec.trace import load_trace

DATA = Path(__file__).parent / "data"
TRACE = DATA / "retry_stale_abort.jsonl"


def test_a_trace_whose_retry_meets_its_first_attempt_s_abort_conforms() -> None:
    report = replay_trace(TRACE, InProcTarget())
    assert report.conforms, report.first_divergence
    retry = next(s for s in report.steps if s.action["action"] == "router_retry_request")
    assert retry.performed and "router:router_retry_request" in retry.events
    stale = [
        e
        for e in report.events
        if e["event"] == "prefill_receive_abort" and e["args"].get("outcome") == "stale_attempt"
    ]
    assert stale, "the first attempt's abort reaches prefill after the retry and is dropped"
    assert report.answers["r0"]["ok"] and report.answers["r0"]["read"] == ["a", "a"]


def ignore_attempts_on_abort(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant abort_matched_by_request_id_only (benchmarks/mutants/catalogue.py), by
    another route: prefill's abort handler never finds an abort stale."""
    original = pc.PrefillCore._on_abort

    def on_abort(self: pc.PrefillCore, ev: pc.AbortReceived) -> list[pc.PrefillCommand]:
        self._stale = lambda rid, attempt: None  # type: ignore[method-assign]
        try:
            return original(self, ev)
        finally:
            del self._stale

    monkeypatch.setattr(pc.PrefillCore, "_on_abort", on_abort)


def test_a_prefill_that_ignores_attempts_diverges_on_that_trace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ignore_attempts_on_abort(monkeypatch)
    report = replay_trace(TRACE, InProcTarget())
    assert not report.conforms
    assert report.first_divergence is not None
    event = report.first_divergence["event"]
    assert event["event"] == "prefill_finish_request"
    assert event["args"]["reason"] == "decode aborted the request"
    assert event["args"]["attempt"] == 1


def test_a_short_campaign_with_retries_conforms_and_plays_them() -> None:
    report = campaign.run("inproc", "reference", traces=60, steps=20, seed=3, max_retries=1)
    assert report.conforms, report.failures
    assert report.coverage is not None
    assert report.coverage.fired.get("router_retry_request", 0) > 0


def test_the_registry_maps_the_retry_to_the_target_s_retry() -> None:
    row = BY_ACTION["router_retry_request"]
    assert row.operation == "retry" and row.events == ("router_retry_request",)


def test_a_target_that_plays_no_retry_refuses_a_scenario_with_retries() -> None:
    config = campaign.campaign_config(max_retries=1)
    with pytest.raises(UnsupportedScenario, match="max_retries=1"):
        require_one_prefill_rank(config)
    require_one_prefill_rank(config, retries=True)
    assert InProcTarget.retries is True


def test_an_earlier_attempt_s_cancel_reaching_prefill_first_does_not_cancel_the_retry() -> None:
    # Found by `conform --max-retries 1 --seed 3`: prefill restarts, decode fails attempt 0 and
    # the router withdraws it; the client retries and cancels. The withdrawal of attempt 0
    # reaches the restarted prefill first (an early cancel, kept for attempt 0), then the retry's
    # submission: prefill admits attempt 1, rightly. The validator took the early cancel for the
    # retry's own and could not explain the admission.
    trace = load_trace((DATA / "retry_after_an_early_cancel.jsonl").read_text())
    report = replay_trace(trace, InProcTarget())
    assert report.conforms, report.first_divergence
    events = [dict(e) for e in report.events]
    (early,) = [
        i
        for i, e in enumerate(events)
        if e["event"] == "prefill_cancel_request" and e["args"].get("early")
    ]
    assert "attempt" not in events[early]["args"]  # attempt 0
    admit = events[early + 1]
    assert admit["event"] == "prefill_admit_request" and admit["args"]["attempt"] == 1
    ids = Ids(trace.config.page_size, {f"r{r}": r for r in range(len(trace.config.requests))})
    assert Validator(trace.config, ids).run(events).ok
    # Had that early cancel been the retry's own, admitting the retry would be unexplained.
    events[early] = {**events[early], "args": {**events[early]["args"], "attempt": 1}}
    report_then = Validator(trace.config, ids).run(events)
    assert not report_then.ok and report_then.explained == early + 1
