"""`kvhandoff examples`: the example variant files reach those who installed the wheel (the slow
wheel test in tests/test_packaging.py runs the same commands from an installed wheel)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvhandoff.cli.main import main
from tests.sequential import SEQUENTIAL

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py"))


def test_the_list_names_every_example_with_what_it_changes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["examples"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("example variant files (in ")
    assert [line.split()[0] for line in out[1:]] == EXAMPLES
    skip = next(line for line in out if "variant_skip_digest.py" in line)
    assert "decode skips the digest and checks only the page count" in skip


def test_copied_examples_run_as_the_guides_show_and_are_not_overwritten(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["examples", "--copy", str(tmp_path)]) == 0
    assert "kvhandoff check --variant examples/variant_skip_digest.py" in capsys.readouterr().out
    for name in EXAMPLES:
        assert (tmp_path / "examples" / name).read_text() == (ROOT / "examples" / name).read_text()
    assert main(["examples", "--copy", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not overwriting" in err and str(tmp_path / "examples" / EXAMPLES[0]) in err
    monkeypatch.chdir(tmp_path)
    assert main(["check", *SEQUENTIAL, "--variant", "examples/variant_skip_digest.py"]) == 1
    assert "decode_reads_only_validated_pages" in capsys.readouterr().out
