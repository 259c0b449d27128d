"""Issue 12, part 5: a trace names its variant, so `explain` and `replay` need no `--variant`.

A catalogue variant is named; a variant file is named by its path and the sha256 of its content,
and a trace of a variant that adds actions reads back with the variant's own action classes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from kvhandoff.cli.main import main
from kvhandoff.spec.trace import TraceError, load_trace
from tests.explored import SMALL
from tests.sequential import SEQUENTIAL

ROOT = Path(__file__).resolve().parents[2]
SMALL_SET = [arg for kv in SMALL for arg in ("--set", kv)]
ADDED = Path(__file__).with_name("variant_added_action.py")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def skip_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the skip-digest example in a scratch folder (the cwd), to change or delete."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "examples" / "variant_skip_digest.py", tmp_path / "skip.py")
    return Path("skip.py")


def check_to(capsys: pytest.CaptureFixture[str], variant: str, trace: str, *more: str) -> None:
    code, _, err = run(
        capsys, "check", *SEQUENTIAL, "--variant", variant, "--trace-out", trace, *more
    )
    assert code == 1, err


def test_a_file_variant_trace_names_the_file_and_its_hash_and_explains_alone(
    capsys: pytest.CaptureFixture[str], skip_digest: Path
) -> None:
    check_to(capsys, str(skip_digest), "skip.jsonl", *SMALL_SET)
    header = json.loads(Path("skip.jsonl").read_text().split("\n", 1)[0])
    assert header["variant"] == "skip_digest"
    assert header["variant_file"] == "skip.py"
    digest = hashlib.sha256(skip_digest.read_bytes()).hexdigest()
    assert header["variant_sha256"] == f"sha256:{digest}"
    code, out, err = run(capsys, "explain", "skip.jsonl")
    assert code == 0 and err == ""
    assert out.startswith("trace: counterexample of variant skip_digest")
    assert "VIOLATED at step" in out


def test_a_changed_variant_file_is_said_and_a_missing_one_is_exit_2(
    capsys: pytest.CaptureFixture[str], skip_digest: Path
) -> None:
    check_to(capsys, str(skip_digest), "skip.jsonl", *SMALL_SET)
    skip_digest.write_text(skip_digest.read_text() + "# reviewed\n")
    code, out, err = run(capsys, "explain", "skip.jsonl")
    assert code == 0 and "VIOLATED at step" in out
    assert "variant file skip.py has changed since the trace was made" in err
    skip_digest.unlink()
    code, _, err = run(capsys, "explain", "skip.jsonl")
    assert code == 2
    assert "variant file 'skip.py', which no longer exists (pass --variant PATH.py)" in err


def test_a_catalogue_variant_trace_still_names_only_the_variant(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    check_to(capsys, "incident", "incident.jsonl", *SMALL_SET)
    header = json.loads(Path("incident.jsonl").read_text().split("\n", 1)[0])
    assert header["variant"] == "incident" and "variant_file" not in header
    assert run(capsys, "explain", "incident.jsonl")[0] == 0


def test_a_trace_of_an_added_action_explains_without_variant(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copy(ADDED, tmp_path / "warm.py")
    check_to(capsys, "warm.py", "warm.jsonl", "--set", "requests=a:1:1", "--set", "max_faults=0")
    text = Path("warm.jsonl").read_text()
    assert '"action": "decode_warm_page"' in text
    with pytest.raises(TraceError, match=r"unknown action 'decode_warm_page' \(a step of an"):
        load_trace(text)  # without the variant's action classes
    code, out, err = run(capsys, "explain", "warm.jsonl")
    assert code == 0, err
    assert "1. decode_warm_page page 0" in out
    assert "page 0: now holds data of another tenant's traffic (other)" in out
    assert "verdict: freed_pages_hold_no_readable_data VIOLATED at step 1 (decode_warm_page)" in out
    code, out, _ = run(capsys, "explain", "warm.jsonl", "--format", "mermaid")
    assert code == 0 and "sequenceDiagram" in out
    code, out, _ = run(capsys, "explain", "warm.jsonl", "--variant", "warm.py")
    assert code == 0 and "decode_warm_page" in out
    # replay reads the added step too; the implementation has no counterpart for it
    code, out, err = run(capsys, "replay", "warm.jsonl")
    assert code == 0, err
    assert "1. decode_warm_page (nothing to do on the target now)" in out


def test_a_header_naming_an_unknown_variant_without_a_file_is_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"kvhandoff_trace": 1, "kind": "scenario", "variant": "mine"}))
    code, _, err = run(capsys, "explain", str(trace))
    assert code == 2
    assert "variant 'mine', which is not in the catalogue and comes with no variant_file" in err


def test_replay_reads_the_variant_file_the_trace_names(
    capsys: pytest.CaptureFixture[str], skip_digest: Path
) -> None:
    check_to(capsys, str(skip_digest), "skip.jsonl", *SMALL_SET)
    skip_digest.write_text(skip_digest.read_text() + "# reviewed\n")
    code, out, err = run(capsys, "replay", "skip.jsonl", "--json")
    assert code in (0, 1), err
    assert "kvhandoff replay: note: variant file skip.py has changed" in err
    # The trace's own variant was loaded from the file: every step has a prediction.
    steps = json.loads(out)["steps"]
    assert steps and all(s["as_predicted"] is not None for s in steps)
