"""vLLM 0.33.0 as a conformance target (docs/vllm.md).

The default suite checks what needs no vLLM: the target is named, a missing vLLM environment
is a clear target error (exit 3), and the committed findings (docs/findings/vllm/) are still
judged as docs/vllm.md says. `make test-engines` runs the slow tests: the real vLLM classes,
in `.venv-vllm` (skipped with the reason when it is absent).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvhandoff.conformance.campaign import make_target
from kvhandoff.conformance.grpc_target import split_by_server
from kvhandoff.conformance.sglang_scenarios import UNSCRUBBED
from kvhandoff.conformance.validate import read_log, search_logs
from kvhandoff.conformance.vllm_scenarios import SCENARIOS, VLLM_DESIGN
from kvhandoff.conformance.vllm_target import VllmTarget, VllmUnavailable, available
from kvhandoff.spec.variants import REFERENCE

ROOT = Path(__file__).resolve().parents[2]
FINDINGS = ROOT / "docs" / "findings" / "vllm"
VERDICTS = json.loads((FINDINGS / "verdicts.json").read_text())
needs_vllm = pytest.mark.skipif(
    not available(), reason="no .venv-vllm: run `make venv-vllm` (docs/vllm.md)"
)


def test_vllm_is_a_named_target() -> None:
    target = make_target("vllm")  # no I/O until the first operation
    assert isinstance(target, VllmTarget)


def test_missing_environment_is_a_target_error(tmp_path: Path) -> None:
    target = VllmTarget(venv=tmp_path / "nowhere")
    with pytest.raises(VllmUnavailable, match="make venv-vllm"):
        target.connect()
    target.shutdown()


def test_cli_without_the_environment_exits_3(tmp_path: Path) -> None:
    env = {**os.environ, "KVHANDOFF_VLLM_VENV": str(tmp_path / "nowhere")}
    out = subprocess.run(
        [sys.executable, "-m", "kvhandoff", "conform", "--target", "vllm", "--traces", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 3, out.stdout + out.stderr
    assert "make venv-vllm" in out.stderr


@pytest.mark.parametrize("row", VERDICTS, ids=[r["scenario"] for r in VERDICTS])
def test_committed_findings_are_judged_as_documented(row: dict[str, object]) -> None:
    """Each committed vLLM log, judged again by the validator under the three variants, gets
    the verdict and the first divergence that docs/vllm.md reports."""
    header, events = read_log(FINDINGS / f"{row['scenario']}.log.jsonl")
    for variant, key in (
        (REFERENCE, "reference"),
        (UNSCRUBBED, "unscrubbed"),
        (VLLM_DESIGN, "vllm_design"),
    ):
        report = search_logs([header], split_by_server(events), variant)
        want = row[key]
        if want == "conforms" or not row["settled"]:
            assert report.ok == (want == "conforms" or not row["settled"]), (key, report.message)
        else:
            assert not report.ok, key
            assert report.message.splitlines()[0] == row[f"{key}_first_divergence"], key
    assert (FINDINGS / f"{row['scenario']}.trace.jsonl").exists()


@pytest.mark.parametrize("row", VERDICTS, ids=[r["scenario"] for r in VERDICTS])
def test_committed_spec_traces_are_what_explain_narrates(
    row: dict[str, object], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """NAME.spec.jsonl is the spec behaviour the validator found for the log (written again
    here from the log, it is the same file) and `kvhandoff explain` replays it."""
    from kvhandoff.cli.main import main
    from kvhandoff.conformance.sglang_scenarios import write_spec_trace

    committed = FINDINGS / f"{row['scenario']}.spec.jsonl"
    again = write_spec_trace(
        FINDINGS / f"{row['scenario']}.log.jsonl", tmp_path / "spec.jsonl", target="vllm"
    )
    assert again.read_text() == committed.read_text()
    assert main(["explain", str(committed)]) == 0
    assert "verdict: no property violated" in capsys.readouterr().out


def test_every_scenario_has_a_committed_finding() -> None:
    assert sorted(r["scenario"] for r in VERDICTS) == sorted(s.name for s in SCENARIOS)


@pytest.mark.slow
@needs_vllm
def test_smoke_campaign_gives_a_verdict(tmp_path: Path) -> None:
    """The random campaign over vLLM's classes ends in a verdict (0 or 1), never a target
    failure (3); a divergence leaves its program and log."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvhandoff",
            "conform",
            "--target",
            "vllm",
            "--traces",
            "3",
            "--steps",
            "6",
            "--out",
            str(tmp_path),
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode in (0, 1), out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["traces"] >= 1
    if out.returncode == 1:
        assert list(tmp_path.glob("*.log.jsonl"))


@pytest.mark.slow
@needs_vllm
def test_scenarios_reproduce_the_behaviours_table(tmp_path: Path) -> None:
    """The catalogue's scenarios on vLLM again: each verdict is the documented one."""
    from kvhandoff.conformance import vllm_scenarios

    rows = vllm_scenarios.run(tmp_path, VllmTarget, echo=lambda s: None)
    got = {r["scenario"]: (r["reference"], r["unscrubbed"], r["vllm_design"]) for r in rows}
    want = {r["scenario"]: (r["reference"], r["unscrubbed"], r["vllm_design"]) for r in VERDICTS}
    assert got == want
