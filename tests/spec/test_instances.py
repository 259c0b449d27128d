"""Several prefill and decode instances (`Config.prefill_instances`, `Config.decode_instances`).

The fields are validated and documented, but the rulebook does not model several instances yet:
every engine, the conformance targets and `init` refuse a scenario with more than one instance,
with a reason that names the fields, rather than check the one-instance model under another
name. With one instance of each (the default) nothing changes: the state spaces are the same.
"""

from __future__ import annotations

import pytest

from kvhandoff.cli.main import main
from kvhandoff.conformance.target import UnsupportedScenario, require_one_prefill_rank
from kvhandoff.model_checker.engines import EngineOptions, run_engine
from kvhandoff.model_checker.explore import build_graph, explore
from kvhandoff.spec import Config, get_variant
from kvhandoff.spec.config import ConfigError, instances_unsupported, parse_set
from kvhandoff.spec.machine import init
from tests.explored import SMALL

TWO_BY_TWO = ["prefill_instances=2", "decode_instances=2"]


@pytest.mark.parametrize(
    ("assignments", "message"),
    [
        (["prefill_instances=0"], "prefill_instances must be an integer from 1 to 3, got 0"),
        (["prefill_instances=4"], "prefill_instances must be an integer from 1 to 3"),
        (["decode_instances=-1"], "decode_instances must be an integer from 1 to 3"),
        (["decode_instances=3", "decode_pages=2"], "decode_pages=2 is fewer than"),
    ],
)
def test_out_of_range_instances_are_refused_naming_the_value(
    assignments: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_set(Config(), assignments)
    text = str(caught.value)
    head, _, _ = message.partition(", got")
    assert head.split(" must")[0] in text
    assert ("got" not in message) or message.split("got ")[1] in text


def test_instances_are_settable_with_set_and_split_the_pool_in_blocks() -> None:
    config = parse_set(Config(), [*TWO_BY_TWO, "decode_pages=4"])
    assert (config.prefill_instances, config.decode_instances) == (2, 2)
    assert [config.page_instance(q) for q in range(4)] == [0, 0, 1, 1]
    three = parse_set(Config(), ["decode_instances=3", "decode_pages=3"])
    assert [three.page_instance(q) for q in range(3)] == [0, 1, 2]
    assert all(Config().page_instance(q) == 0 for q in range(Config().decode_pages))
    assert Config.from_json(config.to_json()) == config


def test_one_instance_is_supported_and_keeps_the_small_state_space() -> None:
    config = parse_set(Config(), SMALL)
    assert instances_unsupported(config) is None
    explicit = parse_set(config, ["prefill_instances=1", "decode_instances=1"])
    assert explicit == config
    reference = get_variant("reference")
    before = build_graph(reference, config)[0]
    again = build_graph(reference, explicit)[0]
    assert (again.transitions, len(again.depth_of)) == (before.transitions, len(before.depth_of))
    assert explore(reference, explicit).states == explore(reference, config).states


def test_several_instances_are_refused_by_init_with_the_reason() -> None:
    config = parse_set(Config(), [*TWO_BY_TWO, "decode_pages=4"])
    with pytest.raises(ConfigError, match="prefill_instances=2, decode_instances=2"):
        init(config)


@pytest.mark.parametrize("engine", ["explore", "bmc", "kind", "spacer", "prove"])
def test_every_engine_refuses_several_instances(engine: str) -> None:
    config = parse_set(Config(), ["decode_instances=2"])
    run = run_engine(engine, get_variant("reference"), config, EngineOptions(depth=2, timeout=5))
    assert run.result is None
    assert "decode_instances=2" in run.cannot_encode


def test_conformance_refuses_several_instances() -> None:
    with pytest.raises(UnsupportedScenario, match="prefill_instances=2"):
        require_one_prefill_rank(parse_set(Config(), ["prefill_instances=2"]))


def test_the_cli_reports_several_instances_as_cannot_encode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["check", "--set", "prefill_instances=2", "--set", "decode_instances=2"])
    out = capsys.readouterr().out
    assert code == 3
    assert "prefill_instances=2, decode_instances=2" in out


def test_json_names_instances_only_when_there_are_several() -> None:
    """Every config written before instances existed reads and writes the same."""
    assert "prefill_instances" not in Config().to_json()
    assert "decode_instances" not in Config().to_json()
    two = parse_set(Config(), ["decode_instances=2"])
    assert two.to_json()["decode_instances"] == 2
    assert "prefill_instances" not in two.to_json()
    assert Config.from_json(two.to_json()) == two
    assert Config.from_json(Config().to_json()) == Config()
