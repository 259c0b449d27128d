"""Conformance on several instances: the in-process target runs one core per instance, and the
spec, placing each request on its instances, judges it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from kvhandoff.cli.main import main
from kvhandoff.conformance import campaign
from kvhandoff.conformance.inproc import InProcTarget
from kvhandoff.conformance.lockstep import Divergence, Session, run_program
from kvhandoff.conformance.target import (
    UnsupportedScenario,
    require_one_prefill_rank,
    require_playable_instances,
)
from kvhandoff.impl.core import decode as dc
from kvhandoff.spec.actions import (
    Action,
    DecodeSuspectPrefillDead,
    PrefillRestart,
    is_fault,
)
from kvhandoff.spec.config import Config, RequestSpec, placements


def _placed(*requests: tuple[str, int, int, int, int], **changes: Any) -> Config:
    """The instances campaign's scenario with these requests, (tenant, pages, room, prefill
    instance, decode instance) each, placed where they say."""
    specs = tuple(
        RequestSpec(t, n, m, prefill_instance=p, decode_instance=d) for t, n, m, p, d in requests
    )
    config = campaign.campaign_config(instances=True)
    return replace(config, placement="fixed", requests=specs, **changes)


# Requests 0 and 2 share room 1 and are placed on different decode instances: each instance
# numbers its generations on its own, so both grants carry the same generation.
COLLIDING = _placed(("a", 2, 1, 0, 0), ("b", 3, 2, 1, 0), ("b", 2, 1, 1, 1), max_faults=0)


def _protocol_first(options: list[Action]) -> Action | None:
    steps = [a for a in options if not is_fault(a)]
    return steps[0] if steps else None


def _events(session: Session, name: str) -> list[dict[str, Any]]:
    return [ev for ev in session.events if ev["event"] == name]


def test_two_decode_instances_issue_the_same_generation_and_the_spec_tells_them_apart() -> None:
    session = run_program(InProcTarget(), COLLIDING, "reference", _protocol_first, 80)
    reserved = _events(session, "decode_reserve_pages")
    grants = {ev["args"]["request_id"]: ev["args"] for ev in reserved}
    assert {"r0", "r2"} <= set(grants)
    # The same implementation generation from both decode instances, for the same room ...
    assert grants["r0"]["generation"] == grants["r2"]["generation"]
    assert grants["r0"]["room"] == grants["r2"]["room"] == 1
    # ... on pages of each instance's own block, under the spec's numbers (instance 1: 3..5).
    assert all(q < 3 for q in grants["r0"]["pages"])
    assert all(q >= 3 for q in grants["r2"]["pages"])
    writes = {ev["args"]["page"] for ev in _events(session, "decode_receive_write")}
    assert writes & {3, 4, 5}
    answers = session.target.answers()
    assert answers[0].ok and answers[2].ok and not answers[1].ok
    assert answers[2].read == ["b", "b"]
    # Both generations are spec generation 1 of their own instance.
    state = session.state
    assert state.requests[0].d_gen == state.requests[2].d_gen


class _OnePool(InProcTarget):
    """A deployment bug: both decode instances map the same memory, so instance 1's page k is
    instance 0's page k (two decode workers configured onto one pool). Their logs still name
    the pages each was granted."""

    def _slot(self, j: int, page: int) -> int:
        return int(page)


class _OwnNumbers(InProcTarget):
    """A harness bug: decode instances' log lines keep each instance's own page numbers."""

    def _globalize(self, j: int, args: dict[str, Any]) -> dict[str, Any]:
        return args


def test_a_shared_pool_across_decode_instances_is_caught() -> None:
    with pytest.raises(Divergence) as caught:
        run_program(_OnePool(), COLLIDING, "reference", _protocol_first, 80)
    assert caught.value.kind == "data"
    assert caught.value.property == "freed_pages_hold_no_readable_data"


def test_page_numbers_of_another_block_are_caught() -> None:
    with pytest.raises(Divergence) as caught:
        run_program(_OwnNumbers(), COLLIDING, "reference", _protocol_first, 80)
    assert caught.value.kind == "unexplained_event"
    assert "decode_reserve_pages" in caught.value.message
    assert '"request_id": "r2"' in caught.value.message


def test_the_instances_campaign_conforms_and_draws_placements() -> None:
    config = campaign.campaign_config(instances=True)
    assert len(placements(config)) > 1
    report = campaign.run("inproc", "reference", traces=60, steps=20, seed=3, instances=True)
    assert report.verdict == "conforms", report.failures
    assert report.traces >= 60


def test_a_mode_with_a_bug_still_diverges_on_instances(tmp_path: Path) -> None:
    report = campaign.run(
        "inproc",
        "m7_release_before_drain",
        traces=300,
        steps=20,
        seed=0,
        instances=True,
        out_dir=tmp_path,
    )
    assert report.verdict == "diverges"
    assert report.failures[0].property == "no_late_write_lands_in_reallocated_page"
    # The shrunk program names its placement: replayed, it diverges again.
    from kvhandoff.conformance.replay import replay_trace

    replayed = replay_trace(
        Path(report.failures[0].trace_file), "inproc", "m7_release_before_drain"
    )
    assert not replayed.conforms


# Two requests on one decode instance, each from its own prefill instance.
TWO_PREFILLS = _placed(("a", 2, 1, 0, 0), ("b", 1, 2, 1, 0), max_active=2)


def _run_with(target: InProcTarget, fault: Action) -> Session:
    """Protocol steps until prefill holds both requests' grants, then `fault`, then protocol
    steps to the end."""
    session = Session(target, TWO_PREFILLS, "reference")
    struck = False
    for _ in range(60):
        options = session.enabled()
        both = all(req.p == "granted" for req in session.state.requests)
        if both and not struck and fault in options:
            action: Action | None = fault
            struck = True
        else:
            action = _protocol_first(options)
        if action is None:
            break
        session.do(action)
    session.finish()
    return session


@pytest.mark.parametrize(
    "fault", [PrefillRestart(pinst=1), DecodeSuspectPrefillDead(dinst=0, pinst=1)]
)
def test_losing_one_prefill_instance_fails_only_its_requests(fault: Action) -> None:
    session = _run_with(InProcTarget(), fault)
    assert fault in [step.action for step in session.steps if step.performed]
    detect = _events(session, "decode_detect_prefill_restart")
    lost = [ev["args"] for ev in detect if ev["args"].get("prefill_instance") == 1]
    assert lost and lost[0]["failed"] == ["r1"]
    answers = session.target.answers()
    assert answers[0].ok and answers[0].read == ["a", "a"]
    assert not answers[1].ok


class _OnePeer(InProcTarget):
    """A decode that cannot tell prefill instances apart: every health probe is taken for the
    one prefill's (the implementation's decode before it tracked a peer per instance)."""

    def _heartbeats(self, dinst: int | None = None, pinst: int | None = None) -> None:
        for j in range(len(self.decodes)) if dinst is None else [dinst]:
            for i in range(len(self.prefills)) if pinst is None else [pinst]:
                self._to_decode(dc.PrefillHeartbeat(self.prefill_epochs[i], self.now), j)


def test_a_decode_that_takes_every_prefill_for_one_is_caught() -> None:
    with pytest.raises(Divergence) as caught:
        _run_with(_OnePeer(), PrefillRestart(pinst=1))
    # It fails r0 too, whose prefill instance did not restart: an error the spec cannot explain.
    assert caught.value.kind == "unexplained_event"
    assert "decode_answer" in caught.value.message
    assert '"request_id": "r0"' in caught.value.message
    assert '"status": "error"' in caught.value.message


def test_what_several_instances_still_refuse() -> None:
    config = campaign.campaign_config(instances=True)
    with pytest.raises(UnsupportedScenario, match="placement=any"):
        require_playable_instances(config)
    fixed = placements(config)[0]
    require_one_prefill_rank(fixed, retries=True, instances=True)
    # Restarts and partitions of one instance are played.
    require_playable_instances(replace(fixed, max_crashes=1, max_partitions=1))
    with pytest.raises(UnsupportedScenario, match="this target runs one prefill"):
        require_one_prefill_rank(fixed)
    # One instance of each: nothing to refuse.
    require_playable_instances(Config())


def test_the_cli_runs_and_refuses_instances(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["conform", "--instances", "--traces", "20", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "conforms" in out
    # A fault campaign runs the real servers only, one of each or several.
    code = main(["conform", "--instances", "--faults", "crash"])
    assert code == 2
    assert "--faults runs over the real gRPC servers: use --target grpc" in capsys.readouterr().err


@pytest.mark.parametrize("seed", [0, 1])
def test_the_instances_campaign_conforms_over_many_programs(tmp_path: Path, seed: int) -> None:
    report = campaign.run(
        "inproc", "reference", traces=2000, steps=30, seed=seed, out_dir=tmp_path, instances=True
    )
    assert report.verdict == "conforms", report.failures


def test_the_logs_of_programs_on_instances_validate_without_the_lockstep() -> None:
    # As for one instance (test_inprocess_campaign.py): every log of a conforming program is
    # explained from its events alone, placement by placement.
    import random

    from kvhandoff.conformance.validate import Ids, Validator

    config = campaign.campaign_config(instances=True)
    choices = placements(config)
    for seed in range(160):
        placed = choices[seed % len(choices)]
        session = run_program(InProcTarget(), placed, "reference", random.Random(seed).choice, 20)
        ids = Ids(placed.page_size, {f"r{r}": r for r in range(len(placed.requests))})
        report = Validator(placed, ids).run(session.events)
        assert report.ok, (seed, report.message)
