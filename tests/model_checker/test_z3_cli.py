"""The CLI contract of the Z3 engines and of `kvhandoff matrix`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvhandoff.cli.cmd_matrix import Cell, expectation
from kvhandoff.cli.main import main
from kvhandoff.spec.variants import REFERENCE, get_variant
from tests.sequential import SEQUENTIAL


def test_check_prove_json_reports_scope_and_obligations(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", *SEQUENTIAL, "--engine", "prove", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["engine"] == "prove" and out["verdict"] == "safe"
    assert out["scope"] == "any-size"
    assert out["obligations_proved"] == out["obligations_total"] == len(out["obligations"])
    assert "every_request_terminates" in out["not_checked"]


def test_check_bmc_on_the_incident_exits_1_with_a_replayable_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "cex.jsonl"
    code = main(
        [
            "check",
            *SEQUENTIAL,
            "--engine",
            "bmc",
            "--variant",
            "incident",
            "--depth",
            "12",
            "--trace-out",
            str(trace),
        ]
    )
    assert code == 1
    text = capsys.readouterr().out
    assert "counterexample for decode_reads_only_validated_pages (12 steps)" in text
    head = json.loads(trace.read_text().splitlines()[0])
    assert head["engine"] == "bmc" and head["property"] == "decode_reads_only_validated_pages"


def test_a_variant_the_encoder_cannot_translate_is_inconclusive_naming_the_action(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "override.py"
    path.write_text(
        "from kvhandoff.spec.variants import REFERENCE\n"
        "VARIANT = REFERENCE.derive('skip_scrub', 'override', "
        "step_overrides={'decode_release_pages': lambda c, s, a: s})\n"
    )
    assert main(["check", *SEQUENTIAL, "--engine", "bmc", "--variant", str(path)]) == 3
    assert "decode_release_pages" in capsys.readouterr().out


def test_matrix_on_a_subset_meets_expectations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    md = tmp_path / "matrix.md"
    code = main(
        [
            "matrix",
            *SEQUENTIAL,
            "--engines",
            "explore,prove",
            "--variants",
            "reference,m20_unscrubbed_pages",
            "--depth",
            "8",
            "--json",
            "--markdown",
            str(md),
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"]
    cells = {(c["variant"], c["engine"]): c for row in out["rows"] for c in row["cells"]}
    assert cells[("reference", "prove")]["verdict"] == "safe"
    assert (
        cells[("m20_unscrubbed_pages", "prove")]["property"] == "freed_pages_hold_no_readable_data"
    )
    assert "| m20_unscrubbed_pages |" in md.read_text()


def test_kind_proves_the_reference_with_two_prefill_ranks_and_prove_says_why_not_any_size(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sets = ["--set", "prefill_ranks=2", "--set", "max_faults=0"]
    sets += ["--set", "decode_pages=2", "--set", "requests=a:1:1,b:2:2"]
    assert main(["check", *SEQUENTIAL, "--engine", "kind", *sets, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scope"] == "fixed-config"
    # The any-size model has one rank: prove must not carry its proof over to two.
    code = main(["check", *SEQUENTIAL, "--engine", "prove", *sets, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["scope"] == "fixed-config"
    assert "one prefill rank" in out["any_size_unavailable"]
    # The text says why too, beside the scope.
    assert main(["check", *SEQUENTIAL, "--engine", "prove", *sets]) == 0
    text = capsys.readouterr().out
    assert "not proved for any size: prefill_ranks=2: the derived any-size model has one" in text


def test_the_matrix_checks_the_first_rank_variant_with_two_ranks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    variant = "first_rank_completion_accepted"
    code = main(
        ["matrix", *SEQUENTIAL, "--engines", "explore,bmc,kind", "--variants", variant, "--json"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"]
    (row,) = out["rows"]
    assert row["config"]["prefill_ranks"] == 2
    cells = {c["engine"]: c for c in row["cells"]}
    for engine in ("explore", "bmc", "kind"):
        assert cells[engine]["caught"] and cells[engine]["property"] in get_variant(variant).breaks
        # The explorer's shortest run (accepted_completion_implies_full_coverage, 11 steps).
        assert (cells[engine]["property"], cells[engine]["depth"]) == (
            cells["explore"]["property"],
            cells["explore"]["depth"],
        )


def test_check_runs_the_pull_path_under_bmc_and_kind(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["check", *SEQUENTIAL, "--engine", "bmc", "--variant", "m14_silent_receive_failure_pull"]
    )
    assert code == 1
    assert "counterexample for decode_reads_only_validated_pages (12 steps)" in (
        capsys.readouterr().out
    )
    assert (
        main(["check", *SEQUENTIAL, "--engine", "kind", "--variant", "reference_pull", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "safe" and out["scope"] == "fixed-config"


def test_matrix_expectations() -> None:
    safe = Cell("reference", "bmc", "safe", None, None, 0.0)
    unknown = Cell("reference", "spacer", "unknown", None, None, 0.0)
    assert expectation(REFERENCE, [safe])[0]
    # Issue 12: an inconclusive engine never downgrades another's proof; it proves nothing alone.
    assert expectation(REFERENCE, [safe, unknown])[0]
    assert not expectation(REFERENCE, [unknown])[0]
    bounded = Cell("reference", "bmc", "bounded", None, 20, 0.0)
    assert not expectation(REFERENCE, [bounded])[0] and expectation(REFERENCE, [bounded, safe])[0]
    found = Cell("reference", "explore", "violated", "no_cross_tenant_read", 9, 0.0)
    assert not expectation(REFERENCE, [safe, found])[0]
    m15 = get_variant("m15_silent_prefill_abort")
    z3_safe = Cell(m15.name, "prove", "safe", None, None, 0.0)
    caught = Cell(m15.name, "explore", "violated", "every_request_terminates", 9, 0.0)
    assert expectation(m15, [caught, z3_safe])[0]  # liveness: explore alone catches it
    assert not expectation(get_variant("incident"), [z3_safe])[0]


@pytest.mark.slow
@pytest.mark.timeout(3600)  # about 15 minutes on 2 shared cores
def test_the_full_kill_matrix_catches_every_variant_and_proves_the_safe_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every engine but Spacer (which cannot finish the default config: unknown, see below)."""
    code = main(["matrix", *SEQUENTIAL, "--engines", "explore,bmc,kind,prove", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, [r for r in out["rows"] if not r["ok"]]
    caught = {
        row["variant"]: sorted({c["engine"] for c in row["cells"] if c["caught"]})
        for row in out["rows"]
    }
    assert caught["reference"] == [] and caught["one_sided_fenced"] == []
    assert caught["m15_silent_prefill_abort"] == ["explore"]
    assert caught["m18_orphan_grant_accepted"] == ["explore"]
    assert caught["first_rank_completion_accepted"] == ["bmc", "explore", "kind", "prove"]
    for name in ("incident", "m1_placeholder_rejection", "m20_unscrubbed_pages"):
        assert caught[name] == ["bmc", "explore", "kind", "prove"]
    # The pull path is encoded: its bugs are caught by the Z3 engines too, its reference proved.
    for name in ("m13_lease_expiry_pull", "m14_silent_receive_failure_pull"):
        assert {"bmc", "kind", "prove"} <= set(caught[name])
    assert caught["reference_pull"] == []
    # Every catalogue variant is within the Z3 encoding (two prefill ranks and the one checked
    # with a client retry included); that one breaks only termination, a liveness property the Z3
    # engines do not check, so only the explorer catches it.
    assert caught["retry_reuses_request_id"] == ["explore"]
    unencoded = {
        row["variant"]
        for row in out["rows"]
        for c in row["cells"]
        if c["verdict"] == "cannot_encode"
    }
    assert unencoded == set()


def test_bmc_first_stops_at_the_shortest_counterexample_of_any_property(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tests.explored import explored

    shortest = min(r.depth for r in explored("incident").results if r.verdict == "violated")
    assert (
        main(
            ["check", *SEQUENTIAL, "--variant", "incident", "--engine", "bmc", "--first", "--json"]
        )
        == 1
    )
    out = json.loads(capsys.readouterr().out)
    violated = [r for r in out["results"] if r["verdict"] == "violated"]
    assert len(violated) >= 1 and {r["depth"] for r in violated} == {shortest}
    assert all(len(r["trace"]) == shortest for r in violated)
    # The others were searched up to the depth before it: bounded, not proved.
    held = [r for r in out["results"] if r["verdict"] == "bounded"]
    assert held and all(r["depth"] == shortest - 1 for r in held)
    assert len(held) + len(violated) == len(out["results"])
    assert main(["check", *SEQUENTIAL, "--engine", "explore", "--first"]) == 2
    assert "--first applies to --engine bmc only" in capsys.readouterr().err


@pytest.mark.slow
def test_the_matrix_with_examples_checks_each_kind_of_change_by_bmc_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A design option, a replaced guard, a replaced effect, an added action and state field, a
    fault's replaced effect, a per-rank step's replaced guard:
    each example is caught by BMC as by the explorer (formulas, not Python: no cell refuses)."""
    args = [
        "matrix",
        *SEQUENTIAL,
        "--engines",
        "explore,bmc",
        "--variants",
        "reference",
        "--examples",
    ]
    code = main([*args, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ok"]
    rows = {row["variant"]: row for row in out["rows"]}
    assert set(rows) == {
        "reference",
        "skip_digest",
        "release_without_drain_ack",
        "placeholder_effect",
        "preempt_without_scrub_formula",
        "ack_before_drain",
        "timeout_frees_at_once",
    }
    for name, row in rows.items():
        cells = {c["engine"]: c for c in row["cells"]}
        assert all(c["verdict"] != "cannot_encode" for c in cells.values()), name
        if name != "reference":
            assert cells["bmc"]["caught"] and cells["explore"]["caught"], name
            assert cells["bmc"]["depth"] == cells["explore"]["depth"], name
