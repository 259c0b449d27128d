"""The mapping table and the validator's matchers describe the same event kinds."""

from __future__ import annotations

from kvhandoff.conformance.mapping import MAPPING, render_markdown
from kvhandoff.conformance.validate import MATCHED_KINDS


def test_every_mapped_event_kind_has_exactly_one_matcher() -> None:
    rows = [row.event for row in MAPPING]
    assert len(rows) == len(set(rows))
    missing = sorted(set(rows) - MATCHED_KINDS - {"invariant_alarm"})
    assert missing == []


def test_every_matcher_is_documented_in_the_table() -> None:
    assert sorted(MATCHED_KINDS - {row.event for row in MAPPING}) == []


def test_the_table_renders_every_row_as_markdown() -> None:
    text = render_markdown()
    for row in MAPPING:
        assert f"`{row.event}`" in text


def test_the_docs_show_the_table_as_the_code_renders_it() -> None:
    # docs/conformance.md carries the rendered table (regenerate it with render_markdown()).
    from pathlib import Path

    docs = (Path(__file__).parents[2] / "docs" / "conformance.md").read_text()
    assert render_markdown() in docs
