"""`kvhandoff demo` (what `make demo` runs) tells the whole story and writes the report."""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvhandoff.cli import main as cli
from kvhandoff.cli.demo import (
    kill_matrix,
    prove_reference,
    run_conformance_campaign,
    scenario_from_trace,
)
from kvhandoff.model_checker import engines
from kvhandoff.model_checker.engines import EngineOptions
from kvhandoff.model_checker.explore import explore
from kvhandoff.model_checker.result import CheckResult
from kvhandoff.spec.config import Config, default_config
from kvhandoff.spec.trace import load_trace
from kvhandoff.spec.variants import Variant


@dataclass
class DemoRun:
    code: int
    output: str
    seconds: float
    out: Path


def run_cli(*argv: str) -> tuple[int, str]:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        code = cli.main(list(argv))
    return code, buffer.getvalue()


QUICK = "prove,counterexample,replay,conformance"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    """Every stage but the kill matrix (which the slow test below and `make demo` run)."""
    out = tmp_path_factory.mktemp("demo") / "kvhandoff-report"
    started = time.perf_counter()
    code, output = run_cli("demo", "--stages", QUICK, "--out", str(out))
    yield DemoRun(code, output, time.perf_counter() - started, out)


def test_the_demo_proves_finds_and_replays_the_leak(demo: DemoRun) -> None:
    assert demo.code == 0, demo.output
    out = demo.output
    for stage in ("[1/4] prove", "[2/4] find", "[3/4] replay", "[4/4] run a short conformance"):
        assert stage in out
    assert "SAFE: proved for any pool size and any number of requests (Z3 prove)" in out
    assert "shortest run breaking no_cross_tenant_read with no fault: 24 steps" in out
    assert "LEAK, " in out and "tokens of another tenant's canary" in out
    assert "reference tenant b, 320 tokens (over prefill's limit): error OUT_OF_RANGE" in out
    summary = [line for line in out.splitlines() if line.startswith("  conformance ")]
    assert summary and "conforms" in summary[0], summary
    assert out.rstrip().endswith(f"report: {demo.out / 'report.md'}")
    assert "verdict: the story holds" in out


def test_the_report_holds_the_chart_obligations_figures_and_traces(demo: DemoRun) -> None:
    md = (demo.out / "report.md").read_text()
    for heading in ("## The incident as a counterexample", "### Sequence chart",
                    "## Replayed on the real servers", "## Conformance",
                    "## Proof obligations: the reference protocol",
                    "## Figures measured", "## The counterexample trace (JSON Lines)"):  # fmt: skip
        assert heading in md
    assert md.count("```mermaid\nsequenceDiagram\n") == 2  # the leak, and the fix
    assert (demo.out / "charts" / "incident.mmd").read_text().startswith("sequenceDiagram\n")
    assert "| `no_cross_tenant_read` | nothing a request's answer" in md
    trace = demo.out / "traces" / "incident-no_cross_tenant_read.jsonl"
    assert load_trace(trace.read_text()).header["property"] == "no_cross_tenant_read"
    figures = json.loads((demo.out / "report.json").read_text())
    assert figures["problems"] == []
    assert figures["proof"]["engine"] in engines.ENGINES
    real = {r["mode"]: r for r in figures["real_servers"]}
    assert real["incident"]["leak"] and not real["reference"]["leak"]
    assert (demo.out / "logs" / "incident" / "decode.jsonl").is_file()


def test_the_kill_matrix_catches_each_bug_and_clears_each_safe_design() -> None:
    names = [
        "incident",
        "m1_placeholder_rejection",
        "m16_router_ignores_prefill_error",
        "first_rank_completion_accepted",  # on its own scenario: two prefill ranks
    ]
    rows = kill_matrix(default_config(), workers=1, names=names)
    assert [r.variant for r in rows] == names
    assert all(r.caught for r in rows)
    assert "no_cross_tenant_read" in rows[0].violated


@pytest.mark.slow
def test_the_whole_demo_runs_in_under_two_minutes(tmp_path: Path) -> None:
    """What `make demo` runs, every stage (about 45 s on two idle cores)."""
    started = time.perf_counter()
    code, out = run_cli("demo", "--out", str(tmp_path / "report"))
    assert time.perf_counter() - started < 120
    assert code == 0, out
    assert "[5/5] kill matrix" in out and "20/20 variants as expected" in out
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Kill matrix" in md and "| `m7_release_before_drain` | M7 |" in md
    figures = json.loads((tmp_path / "report" / "report.json").read_text())
    assert all(row["as_expected"] for row in figures["matrix"])


def test_the_scenario_comes_from_the_counterexample(demo: DemoRun) -> None:
    trace = load_trace((demo.out / "traces" / "incident-no_cross_tenant_read.jsonl").read_text())
    scenario = scenario_from_trace(trace.config, trace.actions)
    assert [(r.tenant, r.oversized) for r in scenario] == [("a", False), ("b", True)]


def test_unknown_stages_are_exit_2() -> None:
    code, out = run_cli("demo", "--stages", "prove,teleport")
    assert code == 2 and "unknown stage teleport" in out


def test_the_prove_hook_uses_a_registered_z3_prove_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    scope = "any-size"

    def fake_prove(variant: Variant, config: Config, options: EngineOptions) -> CheckResult:
        calls.append(variant.name)
        small = Config(max_faults=0)
        result = explore(variant, small)
        result.extra["scope"] = scope
        return result

    monkeypatch.setitem(engines.ENGINES, "prove", fake_prove)
    proof = prove_reference(default_config())
    assert calls == ["reference"]
    assert proof.any_size and "Z3 prove" in proof.method
    # A proof for the configuration only is not reported as one for any size.
    scope = "fixed-config"
    proof = prove_reference(default_config())
    assert not proof.any_size
    assert proof.method.startswith("Z3 prove: safe for this configuration (3 decode pages")


def test_the_conformance_hook_runs_the_conform_command(tmp_path: Path) -> None:
    result = run_conformance_campaign(tmp_path)
    assert result is not None
    assert result["exit_code"] == 0 and result["verdict"] == "conforms"
    assert result["result"]["traces"] >= 30 and result["result"]["failures"] == []
    assert (tmp_path / "conformance-junit.xml").is_file()


def test_the_report_links_the_offline_trace_explorer(demo: DemoRun) -> None:
    md = (demo.out / "report.md").read_text()
    assert "[explorer.html](explorer.html)" in md
    page = (demo.out / "explorer.html").read_text()
    assert '<script type="application/json" id="trace-data">' in page
    assert "https://" not in page and "http://" not in page
    assert '"title": "reference on the same requests"' in page


def test_the_report_grids_and_glossary(demo: DemoRun) -> None:
    md = (demo.out / "report.md").read_text()
    proof = md.split("## Proof obligations: the reference protocol", 1)[1].split("\n## ", 1)[0]
    grid = [line for line in proof.splitlines() if line.startswith("| `")]
    header = next(line for line in proof.splitlines() if line.startswith("| invariant |"))
    # One row per inductive invariant, one column per action (named, not numbered).
    assert header.startswith("| invariant | initial state |")
    assert "| decode admit request |" in header and "| decode receive write |" in header
    obligations = [r for r in grid if r.count("|") == header.count("|")]
    assert len(obligations) >= 10
    assert all(set(r.split("|")[2:-1]) <= {" ✓ ", " ", " **✗** ", " ? "} for r in obligations)
    assert re.search(r"; \d+ obligations, \d+\.\d s of solver time in all", proof)
    # A proof searches no runs: its witnesses are not reported as "NOT reached".
    assert "NOT reached" not in proof
    rows = [r for r in proof.splitlines() if r.startswith("| `") and "`can_" in r]
    assert rows and all(re.search(r"reached \(step \d+\)|not checked by this", r) for r in rows)
    assert re.search(r"model can move: \d+/\d+ of its actions fire", proof)
    glossary = md.split("## Glossary", 1)[1]
    for term in ("ghost", "witness", "generation", "room", "M-number"):
        assert f"- **{term}**: " in glossary


def test_the_kill_matrix_names_its_columns() -> None:
    from kvhandoff.cli.demo import DemoRun as Run
    from kvhandoff.cli.demo import MatrixRow, _matrix_lines

    run = Run(Path("."), ("matrix",))
    run.matrix = [
        MatrixRow("incident", ["M1"], "", ["no_cross_tenant_read"], ["no_cross_tenant_read"], 1, 0)
    ]
    lines = _matrix_lines(run)
    header = next(line for line in lines if line.startswith("| variant |"))
    assert "| no cross tenant read |" in header and "`1`" not in header
    assert not any(line.startswith("Columns:") for line in lines)
    row = next(line for line in lines if line.startswith("| `incident`"))
    assert "**✗**" in row and row.endswith("| yes |")
