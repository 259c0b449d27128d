"""`kvhandoff explain TRACE --format html`: one offline page holding the replayed trace.

The fast tests parse the page and check the embedded data against the spec's own replay; the
slow one loads it in headless Chromium, steps it, reads the DOM and keeps a screenshot."""

from __future__ import annotations

import contextlib
import io
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from kvhandoff.cli.main import main
from kvhandoff.model_checker.explain import build_story
from kvhandoff.spec.trace import load_trace
from kvhandoff.spec.variants import VARIANTS
from tests.sequential import SEQUENTIAL

INCIDENT = next(v for v in VARIANTS if v.name == "incident")


class _Page(HTMLParser):
    """Collects the tags and attributes that could reach the network, and the data script."""

    def __init__(self) -> None:
        super().__init__()
        self.external: list[str] = []
        self.data = ""
        self._in_data = False
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        for key in ("src", "href"):
            value = a.get(key) or ""
            if re.match(r"^(https?:)?//", value):
                self.external.append(f"<{tag} {key}={value}>")
        if tag == "link" or (tag == "script" and a.get("src")):
            self.external.append(f"<{tag}>")
        self._in_data = tag == "script" and a.get("id") == "trace-data"

    def handle_endtag(self, tag: str) -> None:
        self._in_data = False

    def handle_data(self, data: str) -> None:
        if self._in_data:
            self.data += data


def _explain_html(trace: Path) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["explain", str(trace), "--format", "html"]) == 0
    return buffer.getvalue()


@pytest.fixture(scope="module")
def incident_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("html") / "incident.jsonl"
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(["check", *SEQUENTIAL, "--variant", "incident", "--set", "max_faults=0",
                     "--trace-out", str(path)])  # fmt: skip
    assert code == 1
    return path


def _data(page: str) -> tuple[_Page, dict[str, Any]]:
    parser = _Page()
    parser.feed(page)
    return parser, json.loads(parser.data)


def test_the_page_is_offline_and_embeds_the_replayed_trace(incident_trace: Path) -> None:
    page = _explain_html(incident_trace)
    parser, data = _data(page)
    assert parser.external == []
    assert {"prev", "next", "slider", "stories", "trace-data"} <= parser.ids
    story = build_story(INCIDENT, load_trace(incident_trace.read_text()))
    first = data["stories"][0]
    assert first["variant"] == "incident"
    assert [s["action"] for s in first["steps"]] == [_name(s.action) for s in story.steps]
    bad = story.violation_step
    assert bad is not None and first["violation_step"] == bad.index
    broke = {v["name"] for v in first["steps"][bad.index - 1]["violated"]}
    assert "no_cross_tenant_read" in broke
    # Every page lane after every step is the spec's page state: owner and whose data it holds.
    for step, s in zip(first["steps"], story.steps, strict=True):
        for lane, p in zip(step["state"]["pages"], s.after.pages, strict=True):
            holds = None if p.content is None else p.content.tenant
            assert (lane["content"] or {}).get("tenant") == holds
            assert (lane["owner"] or {}).get("request") == (p.owner[0] if p.owner else None)
    # The leak's shape at the breaking step: a page owned by tenant b holds tenant a's data.
    pages = first["steps"][bad.index - 1]["state"]["pages"]
    assert any(
        p["owner"] and p["content"] and p["owner"]["tenant"] != p["content"]["tenant"]
        for p in pages
    )
    # The reference on the same requests, beside it, breaks nothing.
    assert len(data["stories"]) == 2
    assert data["stories"][1]["violation_step"] is None
    assert set(data["tenants"]) == {"a", "b"}


def _name(action: Any) -> str:
    from kvhandoff.spec.actions import action_name

    return action_name(action)


def test_a_reference_trace_has_one_story_and_no_violation(tmp_path: Path) -> None:
    trace = tmp_path / "ref.jsonl"
    from kvhandoff.model_checker.explain import same_requests_under
    from kvhandoff.spec.trace import Trace, dump_trace

    story = build_story(INCIDENT, _incident_trace_obj())
    ref = next(v for v in VARIANTS if v.name == "reference")
    same = same_requests_under(ref, Trace(story.config, tuple(s.action for s in story.steps)))
    trace.write_text(dump_trace(same.config, same.actions, kind="scenario", variant="reference"))
    _, data = _data(_explain_html(trace))
    assert len(data["stories"]) == 1 and data["stories"][0]["violation_step"] is None


def _incident_trace_obj() -> Any:
    from kvhandoff.model_checker.explore import explore
    from kvhandoff.spec.config import default_config, parse_set
    from kvhandoff.spec.trace import Trace

    config = parse_set(INCIDENT.scenario(default_config()), ["max_faults=0"])
    result = explore(INCIDENT, config)
    r = next(r for r in result.violated() if r.property == "no_cross_tenant_read")
    assert r.trace is not None
    return Trace(config, tuple(r.trace))
