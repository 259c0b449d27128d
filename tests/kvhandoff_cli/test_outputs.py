"""Machine-readable outputs: --json objects validate against docs/schemas and carry their schema
id, errors under --json are JSON, JUnit reports per trace / per property (and when the target is
unreachable), `generate` tells a refusal from no answer, a closed pipe exits quietly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from kvhandoff.cli.main import main
from kvhandoff.cli.output import KINDS
from tests.schema_check import assert_matches_schema
from tests.sequential import SEQUENTIAL

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "docs" / "schemas"


def _validate(kind: str, obj: Any) -> None:
    assert_matches_schema(kind, obj)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    code = main(list(argv))
    return code, json.loads(capsys.readouterr().out)


def test_every_kind_has_a_schema() -> None:
    assert sorted(p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.json")) == sorted(
        KINDS
    )


def test_check_json_and_junit(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    junit = tmp_path / "check.xml"
    code, out = _run(
        capsys, "check", *SEQUENTIAL, "--variant", "incident", "--json", "--junit", str(junit)
    )
    assert code == 1
    _validate("check", out)
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("name") == "kvhandoff check incident explore"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {r["property"] for r in out["results"]}
    violated = {r["property"] for r in out["results"] if r["verdict"] == "violated"}
    assert {n for n, c in cases.items() if c.find("failure") is not None} == violated
    failure = cases["no_cross_tenant_read"].find("failure")
    assert failure is not None and failure.get("type") == "violated"
    assert failure.get("message", "").startswith("counterexample of ")
    assert "decode_receive_write" in (failure.text or "")
    assert suite.get("failures") == str(len(violated)) and float(suite.get("time", "0")) > 0


def test_conform_json_and_junit_per_program(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    junit = tmp_path / "conform.xml"
    argv = ["conform", "--mode", "m6_asymmetric_truncation", "--traces", "50", "--json"]
    code, out = _run(capsys, *argv, "--junit", str(junit), "--out", str(tmp_path / "fail"))
    assert code == 1
    _validate("conform", out)
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None
    assert suite.get("name") == "kvhandoff conform inproc m6_asymmetric_truncation"
    cases = suite.findall("testcase")
    names = [c.get("name") for c in cases]
    assert names == [f"program {i:04d}" for i in range(1, len(cases) + 1)]
    assert all(float(c.get("time", "-1")) >= 0 for c in cases)
    failed = [c for c in cases if c.find("failure") is not None]
    assert len(failed) == 1 and failed[0] is cases[-1]  # the campaign stops at the first one
    failure = failed[0].find("failure")
    assert failure is not None and failure.get("type") == out["failures"][0]["kind"]
    assert out["failures"][0]["trace_file"] in (failure.text or "")
    # The programs Hypothesis ran while shrinking are not reported as separate testcases.
    assert len(cases) <= out["traces"]


def test_conform_unreachable_target_still_writes_junit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    junit = tmp_path / "conform.xml"
    code = main(["conform", "--target", "127.0.0.1:1", "--traces", "1", "--junit", str(junit)])
    capsys.readouterr()
    assert code == 3
    root = ET.parse(junit).getroot()
    assert root.get("errors") == "1"
    suite = root.find("testsuite")
    assert suite is not None and suite.get("name") == "kvhandoff conform remote reference"
    error = suite.find("testcase/error")
    assert (
        error is not None
        and error.get("type") == "TargetError"
        and "127.0.0.1:1" in (error.get("message") or "")
    )


def test_errors_under_json_are_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(capsys, "check", *SEQUENTIAL, "--variant", "no_such_variant", "--json")
    assert code == 2
    _validate("error", out)
    assert out["command"] == "check" and "no_such_variant" in out["error"]


def test_replay_and_validate_log_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "incident.jsonl"
    assert main(["check", *SEQUENTIAL, "--variant", "incident", "--trace-out", str(trace)]) == 1
    capsys.readouterr()
    _, out = _run(capsys, "replay", str(trace), "--mode", "incident", "--json")
    _validate("replay", out)
    log = ROOT / "tests" / "conformance" / "data" / "cancel_overtakes_submit.log.jsonl"
    _, out = _run(capsys, "validate-log", str(log), "--json")
    _validate("validate-log", out)


def test_check_config_json(capsys: pytest.CaptureFixture[str]) -> None:
    config = ROOT / "docs" / "examples" / "incident.toml"
    code, out = _run(capsys, "check-config", "--config", str(config), "--json")
    assert code == 1
    _validate("check-config", out)
    assert out["verdict"] == "unsafe" and out["protocol"]["variant"] == "incident"


def test_variants_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(capsys, "variants", "--json")
    assert code == 0
    _validate("variants", out)
    assert out["variants"][0]["name"] == "reference"


def test_harness_serve_json(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvhandoff", "harness-serve", "--listen", "127.0.0.1:0", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        out = json.loads(line)
        _validate("harness-serve", out)
        assert out["backend"] == "inproc" and out["address"].startswith("127.0.0.1:")
        # What an orchestrator needs to pick the conform flags: the in-process backend plays all.
        assert out["fine_grained"] and out["retries"] and out["instances"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_generate_exits_3_when_nothing_answers(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["generate", "--router", "127.0.0.1:1", "--tenant", "a", "--prompt", "hi"]
    code, out = _run(capsys, *argv, "--json", "--timeout", "5")
    assert code == 3
    _validate("generate", out)
    assert out["status"] == "error" and out["code"] == "UNAVAILABLE"


def test_a_closed_pipe_exits_quietly() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvhandoff", "variants", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader leaves before the first byte, as `| head -0` would
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_demo_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["demo", "--stages", "prove", "--json", "--out", str(tmp_path / "report")])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    _validate("demo", out)
    assert out["stages"] == ["prove"] and out["proof"]["verdict"] == "safe"


@pytest.mark.slow  # every engine, ~1 minute on two shared cores
def test_check_all_engines_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "check",
        *SEQUENTIAL,
        "--variant",
        "incident",
        "--set",
        "max_faults=0",
        "--engine",
        "all",
    ]
    code, out = _run(capsys, *argv, "--json", "--depth", "4")
    assert code in (1, 3, 4)
    _validate("check-all", out)
