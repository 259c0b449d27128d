"""`kvhandoff explain` on the program a failing `conform` campaign writes: the implementation's
run as the reference spec explains it, then the divergence (the program lists operations, not
spec steps, so replaying it through the spec alone stopped at "not enabled")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvhandoff.cli.main import main


def test_a_shrunk_conformance_program_explains_up_to_its_divergence(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["conform", "--mode", "m6_asymmetric_truncation", "--traces", "50", "--json"]
    assert main([*argv, "--out", str(tmp_path)]) == 1
    failure = json.loads(capsys.readouterr().out)["failures"][0]
    program = failure["trace_file"]
    assert json.loads(Path(program).read_text().splitlines()[0])["kind"] == "failure"

    assert main(["explain", program]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"conformance program {program}: what the implementation did")
    assert out[1].startswith("trace: m6_asymmetric_truncation run of variant reference, ")
    assert out[-1] == f"then {failure['kind']} ({failure['property']}): {failure['message']}"
    # The run the spec explains includes the steps the program's operations took implicitly.
    assert any("decode_reserve_pages" in line for line in out)

    assert main(["explain", program, "--format", "mermaid"]) == 0
    chart = capsys.readouterr()
    assert chart.out.startswith("sequenceDiagram\n")
    assert chart.err.strip() == f"kvhandoff explain: {out[-1]}"
