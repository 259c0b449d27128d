"""`kvhandoff conform` and `kvhandoff replay`: exit codes and the --json contract."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvhandoff.cli.main import main


def test_conform_exits_0_when_the_target_conforms(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junit = tmp_path / "junit.xml"
    code = main(
        [
            "conform",
            "--traces",
            "50",
            "--seed",
            "3",
            "--json",
            "--junit",
            str(junit),
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {
        "schema",  # kvhandoff.conform/1 (docs/schemas/conform.schema.json)
        "target",
        "mode",
        "traces",
        "steps",
        "verdict",
        "failures",
        "seconds",
        "not_covered",
        "coverage",
    }
    assert out["verdict"] == "conforms" and out["target"] == "inproc"
    coverage = out["coverage"]
    # The campaign reached the handoff and probed decode with forged messages.
    assert coverage["actions_fired"]["decode_receive_completion"] > 0
    assert coverage["outcomes"]["decode_receive_write:accepted"] > 0
    assert coverage["probes"]["completion_bad_digest:failed"] > 0
    assert coverage["abstract_states"] > 10
    assert out["not_covered"] == {}  # the in-process target performs every operation
    assert "<testsuite" in junit.read_text()


def test_conform_exits_1_with_the_shrunk_trace_and_replay_reproduces_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["conform", "--mode", "incident", "--traces", "100", "--json", "--out", str(tmp_path)]
    )
    assert code == 1
    failure = json.loads(capsys.readouterr().out)["failures"][0]
    assert set(failure) == {"kind", "property", "trace_file", "message"}
    assert main(["replay", failure["trace_file"], "--json"]) == 1
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["verdict"] == "diverges" and replayed["mode"] == "incident"
    assert main(["replay", failure["trace_file"], "--mode", "reference"]) == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["conform", "--mode", "nope"],
        ["conform", "--target", "carrier-pigeon"],
        ["conform", "--traces", "0"],
        ["replay", "/nonexistent/trace.jsonl"],
    ],
)
def test_bad_usage_exits_2(argv: list[str]) -> None:
    assert main(argv) == 2


def test_a_trace_with_several_prefill_ranks_is_refused_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dataclasses import replace

    from kvhandoff.spec import default_config
    from kvhandoff.spec.actions import RouterSubmitRequest
    from kvhandoff.spec.trace import dump_trace

    trace = tmp_path / "ranks.jsonl"
    config = replace(default_config(), prefill_ranks=2)
    trace.write_text(dump_trace(config, [RouterSubmitRequest(0)], kind="scenario"))
    assert main(["replay", str(trace)]) == 2
    err = capsys.readouterr().err
    assert "prefill_ranks=2" in err and "one prefill server" in err


def test_the_targets_refuse_to_start_a_scenario_with_several_prefill_ranks() -> None:
    from dataclasses import replace

    from kvhandoff.conformance.campaign import run
    from kvhandoff.conformance.inproc import InProcTarget
    from kvhandoff.conformance.target import UnsupportedScenario
    from kvhandoff.spec import default_config

    config = replace(default_config(), prefill_ranks=2)
    with pytest.raises(UnsupportedScenario, match="prefill_ranks=2"):
        InProcTarget().start(config, "reference")
    with pytest.raises(UnsupportedScenario, match="prefill_ranks=2"):
        run("inproc", "reference", traces=1, config=config, target=InProcTarget())
