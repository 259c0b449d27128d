"""Named scenarios (issue 14, item 4): `--scenario NAME` picks the configuration `--set` starts from.

The `wide` scenario is the one with two requests in flight at once and two faults per run; these
tests hold its shape and show that the CLI really checks it (the concurrency shows in the state
count and the scope line), with its fault budget cut so the normal suite stays fast. The whole
scenario's figures are in benchmarks/results/wide_scenario.txt.
"""

from __future__ import annotations

import json

import pytest

from kvhandoff.cli.main import main
from kvhandoff.model_checker.explore import explore
from kvhandoff.spec.config import SCENARIOS, Config, ConfigError, parse_set, scenario_config
from kvhandoff.spec.variants import get_variant


def test_the_default_scenario_is_the_config_defaults() -> None:
    assert scenario_config("default") == Config()


def test_the_wide_scenario_has_two_in_flight_and_two_faults_on_one_room() -> None:
    wide = scenario_config("wide")
    assert wide.max_active == 2 and wide.max_faults == 2
    assert len(wide.requests) == 2
    assert len({r.room for r in wide.requests}) == 1  # a room collision between live requests
    assert len(wide.tenants) == 2
    # The incident's shape: one prompt prefill cannot admit but decode can.
    assert any(wide.prefill_max_prompt < r.pages <= wide.decode_max_prompt for r in wide.requests)


def test_an_unknown_scenario_names_the_known_ones() -> None:
    with pytest.raises(
        ConfigError, match="unknown scenario 'huge'; known scenarios: default, wide"
    ):
        scenario_config("huge")


def test_every_scenario_has_a_description() -> None:
    for name, (text, config) in SCENARIOS.items():
        assert text and isinstance(config, Config), name


def _check(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    code = main(["check", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_check_runs_the_named_scenario_with_set_applied_over_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = _check(capsys, "--scenario", "wide", "--set", "max_faults=0")
    assert code == 0
    wide = parse_set(scenario_config("wide"), ["max_faults=0"])
    assert out["states"] == explore(get_variant("reference"), wide).states
    one_at_a_time = explore(get_variant("reference"), parse_set(wide, ["max_active=1"]))
    assert one_at_a_time.states is not None
    assert isinstance(out["states"], int) and out["states"] > one_at_a_time.states


def test_the_scope_line_says_how_many_requests_are_in_flight(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", "--scenario", "wide", "--set", "max_faults=0"]) == 0
    text = capsys.readouterr().out
    assert "2 requests, 2 in flight at once," in text
    assert main(["check", "--set", "max_faults=0"]) == 0
    assert "in flight" not in capsys.readouterr().out


def test_an_unknown_scenario_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["check", "--scenario", "huge"])
    assert exc.value.code == 2
    assert "invalid choice: 'huge'" in capsys.readouterr().err
