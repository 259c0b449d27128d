"""`kvhandoff review CHANGE.py`: a Markdown page for a protocol change, against the reference."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from kvhandoff.cli.main import main
from tests.sequential import SEQUENTIAL

ROOT = Path(__file__).resolve().parents[2]


def _review(*argv: str) -> tuple[int, str]:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["review", *SEQUENTIAL, *argv])
    return code, buffer.getvalue()


def test_a_breaking_change_names_what_it_breaks_with_the_shortest_chart(tmp_path: Path) -> None:
    out = tmp_path / "review.md"
    # No faults: a few hundred states, so the test stays fast; the breaks need none.
    code, printed = _review(
        str(ROOT / "examples" / "variant_skip_digest.py"),
        *("--engines", "explore", "--set", "max_faults=0", "--out", str(out)),
    )
    assert code == 1 and printed == ""
    page = out.read_text()
    assert page.startswith("# Protocol review: `skip_digest`\n")
    assert (
        "**Breaks 3 properties the reference keeps:** `decode_reads_only_validated_pages`" in page
    )
    # The author declared one break; the page says which were not declared.
    assert (
        "Not declared in `breaks`: `accepted_completion_implies_full_coverage`, "
        "`rejected_request_gets_error_not_output`." in page
    )
    rows = {
        line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("| `")
    }
    assert "| holds | **VIOLATED** | 20 steps |" in rows["`rejected_request_gets_error_not_output`"]
    assert "| holds | holds |" in rows["`no_cross_tenant_read`"]
    # The chart is the shortest counterexample's (20 steps), and the engines' table has the
    # change's run and the reference's.
    assert "## The shortest counterexample: `rejected_request_gets_error_not_output`" in page
    assert "```mermaid\nsequenceDiagram\n" in page
    assert "**verdict: rejected_request_gets_error_not_output VIOLATED at step 20" in page
    assert "| explore | violated | 66 |" in page
    assert "| explore (reference) | safe |" in page


def test_a_safe_change_exits_0(tmp_path: Path) -> None:
    change = tmp_path / "same.py"
    change.write_text(
        "from kvhandoff.spec.variants import REFERENCE\n"
        'VARIANT = REFERENCE.derive("renamed", "The reference under another name.")\n'
    )
    code, page = _review(str(change), "--engines", "explore", "--set", "max_faults=0")
    assert code == 0, page
    assert "**Keeps every property the reference keeps** on this scenario." in page
    assert "shortest counterexample:" not in page


def test_unknown_engine_is_bad_usage() -> None:
    assert main(["review", *SEQUENTIAL, "reference", "--engines", "explore,nope"]) == 2
