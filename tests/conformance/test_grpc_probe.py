"""Adversarial rounds over real gRPC (`conformance.grpc_probe`): the live reference decode reacts
to every forged message as the spec requires, and a decode that skips one of its checks is
caught by the round, not by a white-box test."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvhandoff.conformance import campaign
from kvhandoff.conformance.adversary import ATTACKS
from kvhandoff.conformance.campaign import campaign_config
from kvhandoff.conformance.grpc_probe import FINALES
from kvhandoff.conformance.grpc_target import GrpcTarget
from kvhandoff.impl.core import decode as dc


@pytest.fixture(scope="module")
def target() -> Iterator[GrpcTarget]:
    t = GrpcTarget()
    t.probe_every = 1
    try:
        yield t
    finally:
        t.shutdown()


def _round(target: GrpcTarget) -> tuple[str, str, str] | None:
    config = campaign_config()
    target.start(config, "reference")
    return target.adversary_round(config)


def test_reference_decode_reacts_as_the_spec_to_every_forged_message(target: GrpcTarget) -> None:
    target.probe_outcomes.clear()
    for _ in FINALES:  # one round per way of ending A's handoff
        assert _round(target) is None
        assert target.quiescent()
    kinds = {pair.split(":")[0] for pair in target.probe_outcomes}
    assert set(ATTACKS) <= kinds, sorted(set(ATTACKS) - kinds)
    # Refusals and the spec's reactions to the state-changing completions, all seen.
    for pair in (
        "write_corrupt_data:refused",
        "write_page_not_granted:refused",
        "completion_forged_token:ignored",
        "completion_undercount:failed",
        "completion_early:validated",
        "write_replay_released:refused",
        "abort_ack_replay_released:ignored",
        "prefill_restart:failed",
        "client_cancel:released",
    ):
        assert target.probe_outcomes.get(pair), (pair, target.probe_outcomes)


def test_a_decode_that_trusts_the_claimed_page_digest_is_caught(
    target: GrpcTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = dc.DecodeCore._on_write

    def trusting(self: dc.DecodeCore, ev: dc.WriteReceived) -> Any:
        return real(self, dataclasses.replace(ev, data_digest=ev.claimed_digest))

    monkeypatch.setattr(dc.DecodeCore, "_on_write", trusting)
    problem = _round(target)
    assert problem is not None
    kind, prop, message = problem
    assert (kind, prop) == ("adversarial", "decode_reads_only_validated_pages")
    assert "write_corrupt_data" in message and "'accepted'" in message, message
    target.shutdown()  # the cluster ran the broken decode: the next test starts a fresh one


def test_a_completion_with_a_forged_token_that_is_taken_is_caught(
    target: GrpcTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = dc.DecodeCore._on_completion

    def no_token_check(self: dc.DecodeCore, ev: dc.CompletionReceived) -> Any:
        req = self._requests.get(ev.request_id)
        if req is not None:
            ev = dataclasses.replace(ev, token=req.token)
        return real(self, ev)

    monkeypatch.setattr(dc.DecodeCore, "_on_completion", no_token_check)
    problem = _round(target)
    assert problem is not None
    assert problem[0] == "adversarial"
    assert "completion_forged_token" in problem[2], problem
    target.shutdown()


def test_a_campaign_reports_a_round_divergence_with_the_rounds_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = dc.DecodeCore._on_write

    def trusting(self: dc.DecodeCore, ev: dc.WriteReceived) -> Any:
        return real(self, dataclasses.replace(ev, data_digest=ev.claimed_digest))

    monkeypatch.setattr(dc.DecodeCore, "_on_write", trusting)
    report = campaign.run("grpc", "reference", traces=3, steps=20, seed=0, out_dir=tmp_path)
    assert report.verdict == "diverges"
    failure = report.failures[0]
    assert failure.kind == "adversarial" and "write_corrupt_data" in failure.message
    assert failure.trace_file.endswith(".round.jsonl")
    lines = [json.loads(x) for x in Path(failure.trace_file).read_text().splitlines()[1:]]
    # The corrupt page the decode took is in the saved events, under the round's request id.
    assert any(
        e["event"] == "decode_receive_write"
        and e["args"]["outcome"] == "accepted"
        and "adv" in e["args"]["request_id"]
        and e["args"]["message_id"] > 1_000_000
        for e in lines
    )
