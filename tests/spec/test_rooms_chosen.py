"""Rooms chosen by the client (`rooms="any"`): every way of sharing rooms among the requests is
checked, as one fixed choice each (`spec.config.placements`)."""

from __future__ import annotations

import pytest

from kvhandoff.cli.main import main
from kvhandoff.conformance.target import UnsupportedScenario, require_one_prefill_rank
from kvhandoff.model_checker.explore import explore
from kvhandoff.model_checker.result import config_summary
from kvhandoff.spec import get_variant, parse_set
from kvhandoff.spec.config import Config, ConfigError, placements, scenario_config

# Two requests in flight, cancels the only fault: small enough to search in about a second.
SMALL = [
    "max_active=2",
    "max_crashes=0",
    "max_drops=0",
    "max_duplicates=0",
    "max_timeouts=0",
    "max_prefill_aborts=0",
]


def _rooms(config: Config) -> tuple[int, ...]:
    return tuple(r.room for r in config.requests)


def test_every_way_of_sharing_rooms_is_one_choice_each() -> None:
    two = parse_set(scenario_config("wide"), ["rooms=any"])
    assert [_rooms(c) for c in placements(two)] == [(1, 1), (1, 2)]
    three = parse_set(Config(), ["rooms=any"])
    # The five partitions of three requests (the Bell number), each in its canonical form.
    assert [_rooms(c) for c in placements(three)] == [
        (1, 1, 1),
        (1, 1, 2),
        (1, 2, 1),
        (1, 2, 2),
        (1, 2, 3),
    ]
    for choice in placements(three):
        assert choice.rooms == "fixed"
        assert [(r.tenant, r.pages) for r in choice.requests] == [
            (r.tenant, r.pages) for r in three.requests
        ]
    # With the rooms given, the scenario is its own only choice.
    assert placements(Config()) == [Config()]


def test_room_choices_and_placements_multiply() -> None:
    config = parse_set(scenario_config("instances"), ["rooms=any"])
    placed_only = placements(scenario_config("instances"))
    both = placements(config)
    assert len(both) == 2 * len(placed_only)
    assert {_rooms(c) for c in both} == {(1, 1), (1, 2)}


@pytest.mark.parametrize("variant", ["reference", "room_keyed_matching"])
def test_renaming_the_rooms_changes_nothing(variant: str) -> None:
    """What the canonical forms rest on: the rules only ask whether two rooms are equal, so
    rooms renamed give the same search (the same states, transitions and verdicts)."""

    def answer(rooms: tuple[int, int]) -> tuple[object, ...]:
        sets = [*SMALL, "max_faults=0", f"requests=a:2:{rooms[0]},b:2:{rooms[1]}"]
        r = explore(get_variant(variant), parse_set(scenario_config("wide"), sets))
        violated = sorted((x.property, x.depth) for x in r.results if x.verdict == "violated")
        return r.states, r.extra["transitions"], r.verdict, violated

    assert answer((1, 2)) == answer((2, 1)) == answer((7, 3))
    assert answer((1, 1)) == answer((5, 5))


def test_client_chosen_rooms_catch_room_keyed_matching_that_unique_rooms_hide(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """With the scenario's own rooms apart, room-keyed matching is safe; clients who may pick
    a room another request has break it, and the report names the choice that does."""
    sets = [*SMALL, "max_faults=1", "requests=a:2:1,b:2:2"]
    args = ["check", "--variant", "room_keyed_matching"]
    for item in sets:
        args += ["--set", item]
    assert main(args) == 0
    assert "verdict: SAFE" in capsys.readouterr().out
    assert main([*args, "--set", "rooms=any"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATED  no_cross_tenant_read" in out
    assert "room choices searched: 2 (request:tenant:room)" in out
    assert "0:a:room 1, 1:b:room 1: violated" in out
    assert "0:a:room 1, 1:b:room 2: safe" in out
    assert "counterexample on 0:a:room 1, 1:b:room 1" in out


def test_rooms_is_checked_written_and_read_back() -> None:
    with pytest.raises(ConfigError, match=r"rooms must be one of fixed, any.*got 'some'"):
        parse_set(Config(), ["rooms=some"])
    assert "rooms" not in Config().to_json()  # the default: configs as they were written
    chosen = parse_set(Config(), ["rooms=any"])
    assert chosen.to_json()["rooms"] == "any"
    assert Config.from_json(chosen.to_json()) == chosen
    # A verdict over every choice says so in its scope.
    assert "rooms chosen by the client (every choice)" in config_summary(chosen)
    assert "rooms chosen" not in config_summary(Config())


def test_a_conformance_run_plays_one_choice_of_rooms_and_says_what_to_do() -> None:
    # A run plays one choice; `conform --rooms-any` draws one per program.
    with pytest.raises(
        UnsupportedScenario, match="rooms=any: a run plays each request with one room"
    ):
        require_one_prefill_rank(parse_set(Config(), ["rooms=any"]), retries=True)
