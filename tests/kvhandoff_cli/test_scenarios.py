"""Named scenarios (issue 14, item 4): `--scenario NAME` picks the configuration `--set` starts from.

The `wide` scenario, the CLI's default, is the one with two requests in flight at once and two
faults per run; `sequential` is `Config()`, one in flight at a time. These tests hold their shapes
and show that the CLI really checks the one it says (the concurrency shows in the state count and
the scope line), with the fault budget cut so the normal suite stays fast: the whole default
scenario's check is measured by benchmarks/explore.py, not timed here.
"""

from __future__ import annotations

import json

import pytest

from kvhandoff.cli.main import main
from kvhandoff.model_checker.explore import explore
from kvhandoff.spec.config import (
    DEFAULT_SCENARIO,
    SCENARIOS,
    Config,
    ConfigError,
    parse_set,
    scenario_config,
)
from kvhandoff.spec.variants import VARIANTS, Variant, VariantError, get_variant


def test_the_sequential_scenario_is_the_config_defaults() -> None:
    assert scenario_config("sequential") == Config()


def test_the_default_scenario_has_at_least_two_in_flight_and_two_faults() -> None:
    # The bar for the default: two requests in flight at once, two faults per run.
    default = scenario_config(DEFAULT_SCENARIO)
    assert DEFAULT_SCENARIO == "wide"
    assert min(default.max_active, len(default.requests)) >= 2 and default.max_faults >= 2


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
        ConfigError,
        match="unknown scenario 'huge'; known scenarios: wide, instances, instance_faults, sequential",
    ):
        scenario_config("huge")


def test_the_instances_scenario_is_wide_on_two_instances_of_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    instances = scenario_config("instances")
    wide = scenario_config("wide")
    assert (instances.prefill_instances, instances.decode_instances) == (2, 2)
    assert instances.placement == "any"
    assert [(r.tenant, r.pages, r.room) for r in instances.requests] == [
        (r.tenant, r.pages, r.room) for r in wide.requests
    ]
    # Every decode instance's pool holds the longest prompt decode admits.
    assert instances.decode_pages // 2 >= instances.decode_max_prompt
    code = main(["check", "--scenario", "instances", "--set", "max_faults=0"])
    out = capsys.readouterr().out
    assert code == 0
    assert "2 prefill and 2 decode instances" in out
    assert "placements searched: 4" in out


def test_instance_faults_is_instances_with_a_crash_or_partition_of_any_one_instance() -> None:
    """The scenario the notes' per-instance figures are for: the instances scenario, one fault
    per run, which may be a restart of one instance or a partition of one pair."""
    faults = scenario_config("instance_faults")
    instances = scenario_config("instances")
    assert parse_set(faults, ["max_crashes=0", "max_partitions=0", "max_faults=2"]) == instances
    assert (faults.max_faults, faults.max_crashes, faults.max_partitions) == (1, 1, 1)


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
    assert main(["check", "--scenario", "sequential", "--set", "max_faults=0"]) == 0
    scope = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("scope:")]
    assert scope and "in flight" not in scope[0]


def test_check_without_a_scenario_checks_the_default_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The state count pins which configuration ran: the default's, not Config()'s.
    code, out = _check(capsys, "--set", "max_faults=0")
    assert code == 0
    expected = explore(
        get_variant("reference"), parse_set(scenario_config("wide"), ["max_faults=0"])
    )
    assert out["states"] == expected.states
    assert out["config"] == parse_set(scenario_config("wide"), ["max_faults=0"]).to_json()
    assert main(["check", "--set", "max_faults=0"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert (
        first.startswith("scenario: wide (default: two requests") and "--set max_faults=0" in first
    )


def test_a_variant_with_a_scenario_of_its_own_is_checked_on_it_unless_one_is_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    own = [v for v in VARIANTS if v.scenario_name is not None]
    assert [v.name for v in own] == ["retry_reuses_request_id"]
    variant = own[0]
    # --max-states keeps it short: the run stops early (inconclusive) but reports its config.
    code, out = _check(capsys, "--variant", variant.name, "--max-states", "50")
    assert code == 3
    assert out["config"] == variant.scenario(scenario_config("sequential")).to_json()
    code, out = _check(
        capsys, "--variant", variant.name, "--scenario", "wide", "--max-states", "50"
    )
    assert out["config"] == variant.scenario(scenario_config("wide")).to_json()
    assert main(["check", "--variant", variant.name, "--max-states", "50"]) == 3
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("scenario: sequential (the variant's:") and "max_retries=1" in first


def test_variants_lists_the_scenario_each_is_checked_on(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["variants", "--json"]) == 0
    listed = {v["name"]: v["scenario"] for v in json.loads(capsys.readouterr().out)["variants"]}
    assert listed["reference"] == "wide" and listed["retry_reuses_request_id"] == "sequential"
    assert main(["variants"]) == 0
    text = capsys.readouterr().out
    assert "checked on: --scenario sequential --set max_retries=1" in text
    assert "checked on: --scenario wide --set max_partitions=1" in text


def test_a_variant_naming_an_unknown_scenario_is_refused() -> None:
    with pytest.raises(VariantError, match="scenario_name 'huge' is not a named scenario"):
        Variant("mine", "a variant", scenario_name="huge")


def test_an_unknown_scenario_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["check", "--scenario", "huge"])
    assert exc.value.code == 2
    assert "invalid choice: 'huge'" in capsys.readouterr().err
