import json

import pytest

from kvhandoff.cli.main import main
from kvhandoff.spec import VARIANTS, get_variant
from kvhandoff.spec.trace import load_trace, replay
from tests.sequential import SEQUENTIAL


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_check_reference_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "check", *SEQUENTIAL, "--variant", "reference")
    assert code == 0
    assert "verdict: SAFE" in out


def test_check_incident_json_follows_the_contract(
    capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    from pathlib import Path

    trace_file = Path(str(tmp_path)) / "incident.jsonl"
    code, out, _ = run(
        capsys,
        "check",
        *SEQUENTIAL,
        "--variant",
        "incident",
        "--json",
        "--trace-out",
        str(trace_file),
    )
    assert code == 1
    data = json.loads(out)
    assert set(data) >= {
        "variant",
        "engine",
        "config",
        "verdict",
        "results",
        "witnesses",
        "states",
        "seconds",
    }
    assert data["verdict"] == "violated" and data["engine"] == "explore"
    by_name = {r["property"]: r for r in data["results"]}
    for prop in ("decode_reads_only_validated_pages", "no_cross_tenant_read"):
        assert by_name[prop]["verdict"] == "violated"
        steps = by_name[prop]["trace"]
        assert steps and all(set(s) == {"action", "args"} for s in steps)
    assert by_name["page_has_single_owner"]["trace"] is None
    trace = load_trace(trace_file.read_text())
    assert trace.header["property"] == "decode_reads_only_validated_pages"
    replay(get_variant("incident"), trace.config, trace.actions)


def test_unknown_variant_is_exit_2_listing_the_known_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "check", *SEQUENTIAL, "--variant", "nonesuch")
    assert code == 2
    assert "unknown variant 'nonesuch'" in err and "reference" in err


def test_bad_set_is_exit_2_naming_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "check", *SEQUENTIAL, "--set", "decode_pages=-1")
    assert code == 2 and "decode_pages" in err
    code, _, err = run(capsys, "check", *SEQUENTIAL, "--set", "nonsense")
    assert code == 2 and "KEY=VALUE" in err


def test_unreadable_variant_file_is_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    from pathlib import Path

    code, _, err = run(capsys, "check", *SEQUENTIAL, "--variant", "missing_file.py")
    assert code == 2 and "does not exist" in err
    broken = Path(str(tmp_path)) / "broken.py"
    broken.write_text("VARIANT = 3\n")
    code, _, err = run(capsys, "check", *SEQUENTIAL, "--variant", str(broken))
    assert code == 2 and "must define VARIANT" in err
    raising = Path(str(tmp_path)) / "raising.py"
    raising.write_text("raise RuntimeError('boom')\n")
    code, _, err = run(capsys, "check", *SEQUENTIAL, "--variant", str(raising))
    assert code == 2 and "boom" in err


def test_unknown_engine_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "check", *SEQUENTIAL, "--engine", "telepathy")
    assert code == 2 and "unknown engine" in err


def test_variants_lists_every_variant_with_its_catalogue_entry(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "variants", "--json")
    assert code == 0
    listed = json.loads(out)["variants"]
    assert [v["name"] for v in listed] == [v.name for v in VARIANTS]
    by_name = {v["name"]: v for v in listed}
    assert by_name["incident"]["m_numbers"] == ["M1", "M2", "M3", "M6", "M20"]
    catalogued = {m for v in listed for m in v["m_numbers"]}
    for m in (
        "M1",
        "M2",
        "M3",
        "M5",
        "M6",
        "M7",
        "M8",
        "M10",
        "M13",
        "M14",
        "M15",
        "M16",
        "M18",
        "M20",
    ):
        assert m in catalogued
    assert all(v["summary"] and (v["breaks"] or v["expected"] == "safe") for v in listed)
    assert by_name["first_rank_completion_accepted"]["config"]["prefill_ranks"] == 2
    assert by_name["reference"]["config"] == {}


def test_the_first_rank_variant_is_caught_with_two_ranks_and_masked_with_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    variant = get_variant("first_rank_completion_accepted")
    code, out, _ = run(capsys, "check", *SEQUENTIAL, "--variant", variant.name, "--json")
    assert code == 1
    data = json.loads(out)
    assert data["config"]["prefill_ranks"] == 2  # the variant's own scenario
    violated = {r["property"] for r in data["results"] if r["verdict"] == "violated"}
    assert violated == set(variant.breaks)
    # --set comes after the variant's scenario: with one rank the first rank is every rank.
    code, out, _ = run(
        capsys, "check", *SEQUENTIAL, "--variant", variant.name, "--set", "prefill_ranks=1"
    )
    assert code == 0 and "verdict: SAFE" in out


@pytest.mark.slow
def test_the_reference_is_safe_with_two_prefill_ranks_with_every_witness_reached(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "check", *SEQUENTIAL, "--set", "prefill_ranks=2", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["verdict"] == "safe" and all(data["witnesses"].values())
    assert data["states"] == 524_922


@pytest.mark.parametrize("module", ["kvhandoff.cli.main", "kvhandoff_cli"])
def test_python_dash_m_reports_a_usage_error_as_exit_2(module: str) -> None:
    # Under `python -m kvhandoff.cli.main` the module runs twice (as __main__ and as imported by
    # the commands); a usage error must still be exit 2 with one line, not a traceback.
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run(
        [sys.executable, "-m", module, "check", *SEQUENTIAL, "--variant", "nope"],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("kvhandoff check: error: unknown variant 'nope'")
    assert "Traceback" not in proc.stderr
