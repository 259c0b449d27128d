"""docs/sources.md: every upstream issue or PR number the docs, the variant catalogue and
check-config's findings cite has a line there, and every link there is the page of its number."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "docs" / "sources.md"
# Where engine behaviour is cited by number: the guides, the catalogue (`kvhandoff variants`),
# check-config's findings.
CITING = [
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "README.md",
    ROOT / "spec" / "variants.py",
    *sorted((ROOT / "model_checker" / "deployment").glob("*.py")),
]
# A number with 3-6 digits after '#', not part of a longer word (colours like #1565c0 are not).
NUMBER = re.compile(r"(?<![\w&])#(\d{3,6})\b")
LINK = re.compile(r"\[#(\d+)\]\((https://github\.com/([\w.-]+/[\w.-]+)/(issues|pull)/(\d+))\)")


def test_every_cited_number_is_listed_in_the_sources_page() -> None:
    listed = set(NUMBER.findall(SOURCES.read_text()))
    missing: dict[str, list[str]] = {}
    for path in CITING:
        if path == SOURCES:
            continue
        for number in NUMBER.findall(path.read_text()):
            if number not in listed:
                missing.setdefault(number, []).append(str(path.relative_to(ROOT)))
    assert not missing, f"cited but not in docs/sources.md: {missing}"


def test_each_link_points_at_its_own_number_on_an_engine_tracker() -> None:
    links = LINK.findall(SOURCES.read_text())
    assert len(links) >= 10
    for text, _url, repo, _kind, number in links:
        assert text == number, f"[#{text}] links to number {number}"
        assert repo in ("sgl-project/sglang", "vllm-project/vllm"), repo
    # A number is linked once at most: the table is the one place that says where it lives.
    numbers = [n for *_, n in links]
    assert len(numbers) == len(set(numbers))
