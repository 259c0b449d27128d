"""Rooms the client chooses, played on the implementation: `kvhandoff conform --rooms-any` draws
one way of sharing rooms among the requests per program (the spec's `rooms="any"`, every choice
of which `kvhandoff check --set rooms=any` checks), instead of the scenario's rooms."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from kvhandoff.cli.main import main
from kvhandoff.conformance import campaign
from kvhandoff.conformance.inproc import InProcTarget
from kvhandoff.conformance.target import UnsupportedScenario, require_one_prefill_rank
from kvhandoff.spec.config import Config, placements


class _Rooms(InProcTarget):
    """The in-process target, counting the rooms of the scenarios it is started on."""

    def __init__(self) -> None:
        super().__init__()
        self.rooms: Counter[tuple[int, ...]] = Counter()

    def start(self, config: Config, mode: str) -> None:
        self.rooms[tuple(r.room for r in config.requests)] += 1
        super().start(config, mode)


def test_the_campaign_plays_every_way_of_sharing_rooms_and_conforms(tmp_path: Path) -> None:
    config = campaign.campaign_config(rooms_any=True)
    assert len(placements(config)) == 5  # three requests: all apart, three pairs, all on one
    target = _Rooms()
    report = campaign.run(
        "inproc", "reference", traces=40, seed=0, out_dir=tmp_path, target=target, rooms_any=True
    )
    assert report.verdict == "conforms", report.failures
    # Not the scenario's rooms (1, 2, 1) alone: all apart, all on one room, and others.
    assert {(1, 1, 1), (1, 2, 3)} <= set(target.rooms) and len(target.rooms) >= 4


def test_a_bug_is_still_caught_when_the_clients_choose_the_rooms(tmp_path: Path) -> None:
    report = campaign.run(
        "inproc", "m7_release_before_drain", traces=100, seed=0, out_dir=tmp_path, rooms_any=True
    )
    assert report.verdict == "diverges"
    assert report.failures[0].property == "no_late_write_lands_in_reallocated_page"


def test_a_run_plays_one_choice_of_rooms_and_says_how_to_play_them_all() -> None:
    with pytest.raises(UnsupportedScenario, match="kvhandoff conform --rooms-any"):
        require_one_prefill_rank(campaign.campaign_config(rooms_any=True))


def test_the_cli_takes_rooms_any(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["conform", "--rooms-any", "--traces", "20", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert "conforms" in capsys.readouterr().out


def test_the_real_servers_play_the_clients_rooms(tmp_path: Path) -> None:
    report = campaign.run(
        "grpc", "reference", traces=6, steps=20, seed=0, out_dir=tmp_path, rooms_any=True
    )
    assert report.verdict == "conforms", report.failures
