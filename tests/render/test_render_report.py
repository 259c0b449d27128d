"""The demo report's Mermaid charts render with the real mermaid package in headless Chromium.

Slow (the first run installs the mermaid npm package and Debian's chromium): `make test-render`.
Fails on any Mermaid parse or render error; keeps a screenshot next to the report it renders.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from kvhandoff.cli.main import main
from tests.render.mermaid_render import SetupImpossible, charts_in, ensure_tools, render

pytestmark = pytest.mark.slow


def run_cli(*argv: str) -> tuple[int, str]:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        code = main(list(argv))
    return code, buffer.getvalue()


def test_the_reports_charts_render_without_errors_and_a_screenshot_is_kept(
    tmp_path: Path,
) -> None:
    try:
        ensure_tools()
    except SetupImpossible as exc:
        pytest.skip(f"cannot install the render tools here: {exc}")
    out = tmp_path / "kvhandoff-report"
    code, output = run_cli("demo", "--stages", "counterexample", "--out", str(out))
    assert code == 0, output
    charts = charts_in(out / "report.md")
    assert charts and charts[0].startswith("sequenceDiagram")
    # Also every counterexample of the incident on the default config (faults included), and
    # a lasso, so every kind of element the chart writer emits goes through mermaid.
    for trace in sorted((out / "traces").glob("*.jsonl")):
        code, chart = run_cli("explain", str(trace), "--format", "mermaid")
        assert code == 0, chart
        charts.append(chart)
    first = sorted((out / "traces").glob("*.jsonl"))[0]
    head, rest = first.read_text().split("\n", 1)
    header = json.loads(head)
    header.update(property="every_request_terminates", loop_start=2)
    lasso = tmp_path / "lasso.jsonl"
    lasso.write_text(json.dumps(header) + "\n" + rest)
    code, chart = run_cli("explain", str(lasso), "--format", "mermaid")
    assert code == 0 and "loop repeats forever" in chart
    charts.append(chart)

    result = render(charts, out / "charts", name="rendered")
    assert result.errors == [], result.errors
    assert len(result.results) == len(charts)
    assert result.screenshot.is_file() and result.screenshot.stat().st_size > 10_000
    assert result.dom.count('aria-roledescription="sequence"') == len(charts)
