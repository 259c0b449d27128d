"""`kvhandoff explain`: a trace told step by step, as a chart, and as Markdown."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvhandoff.cli.main import main
from kvhandoff.model_checker.explain import build_story, to_markdown, to_mermaid, to_text
from kvhandoff.model_checker.explore import explore
from kvhandoff.spec.config import default_config
from kvhandoff.spec.trace import load_trace
from kvhandoff.spec.variants import get_variant

MODULES = ["kvhandoff.cli.cmd_explain"]


@pytest.fixture(scope="module")
def incident_trace() -> str:
    """The shortest fault-free run of the incident that reads another tenant's data."""
    config = replace(default_config(), max_faults=0)
    result = explore(get_variant("incident"), config)
    return result.trace_text(result.result_for("no_cross_tenant_read"))


def run(*argv: str) -> tuple[int, str]:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        code = main(list(argv), modules=MODULES)
    return code, buffer.getvalue()


def test_the_narrative_names_each_spec_action_and_only_what_changed(incident_trace: str) -> None:
    story = build_story(get_variant("incident"), load_trace(incident_trace))
    text = to_text(story)
    assert " 15. prefill_reject_request req 1 (tenant b, 3 pages, room 2)" in text
    assert "req 1: prefill's view of the prompt (pages) 0 -> 1" in text
    assert "page 1: freed (still holds data of req 0 / tenant a (gen 1))" in text
    assert (
        "decode reads page 1: data of req 0 / tenant a (gen 1)  <-- not this request's data" in text
    )
    assert "!! VIOLATED no_cross_tenant_read" in text
    assert text.endswith("verdict: no_cross_tenant_read VIOLATED at step 24 (decode_generate)\n")
    # Unchanged state is hidden: decode admitting request 1 changes exactly one thing.
    step16 = [x.strip() for x in text.split(" 16. ")[1].split(" 17. ")[0].strip().splitlines()]
    assert step16 == ["decode_admit_request req 1 (tenant b, 3 pages, room 2)",
                      "req 1: decode received -> admitted"]  # fmt: skip


def test_the_chart_has_worker_and_page_lanes_and_highlights_the_violating_read(
    incident_trace: str,
) -> None:
    story = build_story(get_variant("incident"), load_trace(incident_trace))
    wrapped = to_mermaid(story)
    # Notes and messages are broken into short lines so they stay inside their boxes.
    for line in wrapped.splitlines():
        text = line.split(": ", 1)[1] if ": " in line else ""
        assert all(len(part) <= 40 for part in text.split("<br/>") if " " in part), line
    chart = wrapped.replace("<br/>", " ")
    lines = chart.splitlines()
    assert lines[0] == "sequenceDiagram"
    assert lines[1:7] == [
        "    participant router",
        "    participant prefill",
        "    participant decode",
        "    participant page0 as page 0",
        "    participant page1 as page 1",
        "    participant page2 as page 2",
    ]
    stripped = [line.strip() for line in lines]
    assert (
        "Note over page0,page1: released, NOT zeroed: still data of req 0 / tenant a (gen 1)"
        in stripped
    )
    # The steps the incident turns on are boxed and named, apart from the fatal one.
    keys = [line for line in stripped if line.startswith("Note over router,page2: key step:")]
    assert keys == [
        "Note over router,page2: key step: prefill's view of the prompt changed",
        "Note over router,page2: key step: pages released without zeroing",
        "Note over router,page2: key step: a completion that does not cover the grant is accepted",
    ]
    assert chart.count("rect rgb(255, 236, 190)") == 3
    assert (
        "    prefill->>page0: 21. decode_receive_write: data of req 1 / tenant b (gen 2)" in lines
    )
    box = chart.split("    rect rgb(255, 205, 205)\n")[1].split("\n    end\n")[0]
    assert "24. decode_generate" in box
    assert "page1-->>decode: read: data of req 0 / tenant a (gen 1) NOT ITS OWN" in box
    assert "VIOLATED: no_cross_tenant_read" in box
    # Every activation bar is closed (Mermaid draws an unclosed one not at all), and a page is
    # deactivated only while active.
    depth = dict.fromkeys(range(3), 0)
    for line in stripped:
        if line.startswith(("activate page", "deactivate page")):
            page = int(line.rsplit("page", 1)[1])
            depth[page] += 1 if line.startswith("activate") else -1
            assert depth[page] in (0, 1), line
    assert depth == dict.fromkeys(range(3), 0)
    assert lines[-1] == "    deactivate page2"
    for step in range(1, 25):
        assert f" {step}. " in chart, f"step {step} is not named in the chart"


def test_markdown_holds_the_chart_and_the_steps(incident_trace: str) -> None:
    story = build_story(get_variant("incident"), load_trace(incident_trace))
    md = to_markdown(story)
    assert md.startswith("# no_cross_tenant_read: variant incident\n")
    assert "```mermaid\nsequenceDiagram\n" in md
    assert "24. `decode_generate` req 1 (tenant b, 3 pages, room 2)" in md
    # Sub-items are indented to their item's text, so CommonMark keeps one numbered list.
    assert "\n    - req 1: decode validated &rarr; generated\n" in md
    assert "\n2. `" in md and "\n   - " in md
    assert "**VIOLATED `no_cross_tenant_read`**" in md


def test_a_lasso_is_drawn_as_a_loop(incident_trace: str) -> None:
    head, rest = incident_trace.split("\n", 1)
    header = json.loads(head)
    header.update(property="every_request_terminates", loop_start=20)
    story = build_story(get_variant("incident"), load_trace(json.dumps(header) + "\n" + rest))
    assert "    loop repeats forever, never ending every request" in to_mermaid(story)
    assert "-- from here the run repeats forever --" in to_text(story)


def test_every_format_from_the_command_line(tmp_path: Path, incident_trace: str) -> None:
    trace = tmp_path / "incident.jsonl"
    trace.write_text(incident_trace)
    for fmt, start in (("text", "trace: counterexample"), ("mermaid", "sequenceDiagram"),
                       ("markdown", "# no_cross_tenant_read")):  # fmt: skip
        code, out = run("explain", str(trace), "--format", fmt)
        assert code == 0 and out.startswith(start), (fmt, out[:200])


def test_a_bad_trace_is_exit_2_naming_the_line(tmp_path: Path, incident_trace: str) -> None:
    lines = incident_trace.splitlines()
    cases = {
        "not-json": ([*lines[:3], "{not json", *lines[4:]], "line 4: "),
        "not-enabled": ([lines[0], *lines[2:]], "line 2 (step 1): "),
        "no-header": (lines[1:], "line 1: "),
        "unknown-action": ([*lines[:2], '{"action": "decode_teleport", "args": {}}'], "line 3: "),
    }
    for name, (content, where) in cases.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text("\n".join(content) + "\n")
        code, out = run("explain", str(path))
        assert code == 2, (name, out)
        assert out.startswith(f"kvhandoff explain: error: {path}: {where}"), (name, out)
    code, out = run("explain", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "no such trace file" in out


def test_a_user_variant_is_named_with_variant(tmp_path: Path, incident_trace: str) -> None:
    head, rest = incident_trace.split("\n", 1)
    header = json.loads(head)
    header["variant"] = "my_change"
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps(header) + "\n" + rest)
    code, out = run("explain", str(path))
    assert code == 2 and "pass --variant PATH.py" in out
    code, out = run("explain", str(path), "--variant", "incident")
    assert code == 0 and "verdict: no_cross_tenant_read VIOLATED at step 24" in out


def test_against_explains_the_same_requests_under_another_variant(
    tmp_path: Path, incident_trace: str
) -> None:
    trace = tmp_path / "incident.jsonl"
    trace.write_text(incident_trace)
    code, out = run("explain", str(trace), "--against", "reference")
    assert code == 0, out
    assert out.startswith("trace: scenario of variant reference, 17 steps")
    assert "req 1: prefill received -> rejected" in out
    assert "page 1: freed (zeroed)" in out
    assert out.endswith("verdict: no property violated in 17 steps\n")
    code, out = run("explain", str(trace), "--against", "nope")
    assert code == 2 and "--against: unknown variant 'nope'" in out
