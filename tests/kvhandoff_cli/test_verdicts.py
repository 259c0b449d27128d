"""Honest verdicts (issue 12): exit 0 means proved, for the scope printed.

Each bad case the issue lists is pinned here: a variant `prove` cannot translate, a bounded BMC
run, `--engine all` with an inconclusive engine beside a proof, and two engines that disagree.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvhandoff.cli.main as cli
from kvhandoff.cli.main import main
from kvhandoff.model_checker import engines
from kvhandoff.model_checker.engines import ENGINES, EngineOptions, EngineRun, combine
from kvhandoff.model_checker.result import CheckResult, PropertyResult
from kvhandoff.model_checker.z3_engines import spacer
from kvhandoff.spec.config import Config
from kvhandoff.spec.properties import ALWAYS, TERMINATION
from kvhandoff.spec.variants import Variant
from tests.explored import SMALL
from tests.sequential import SEQUENTIAL

ROOT = Path(__file__).resolve().parents[2]
SETS = [arg for value in SMALL for arg in ("--set", value)]
ONE_REQUEST = [
    arg
    for value in (
        "requests=a:1:1",
        "decode_pages=1",
        "prefill_max_prompt=1",
        "decode_max_prompt=1",
        "context_window=1",
        "max_faults=0",
    )
    for arg in ("--set", value)
]
"""A scenario whose state space is 12 steps deep (16 states): BMC can reach its depth."""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_the_disagreement_exit_code_is_one_number_everywhere() -> None:
    assert cli.EXIT_DISAGREE == engines.EXIT_DISAGREE == 4
    assert len({cli.EXIT_OK, cli.EXIT_VIOLATED, cli.EXIT_USAGE, cli.EXIT_INCONCLUSIVE, 4}) == 5


# --- 1. an engine that cannot encode the variant says so (prove included) ----------------------


def test_prove_refuses_the_override_example_instead_of_proving_the_design_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It used to print "349/349 proof obligations discharged (scope: any-size)", SAFE, exit 0,
    for a variant whose override breaks rejected_request_gets_error_not_output in 8 steps."""
    path = "tests/data/python_variants/override_reject.py"
    code, out = run(
        capsys, "check", *SEQUENTIAL, "--variant", str(ROOT / path), "--engine", "prove"
    )
    assert code == 3
    assert "engine prove: cannot encode: " in out
    assert "step_overrides['prefill_reject_request']" in out and path in out
    assert "SAFE" not in out and "obligations discharged" not in out
    code, out = run(
        capsys, "check", *SEQUENTIAL, "--variant", str(ROOT / path), "--engine", "prove", "--json"
    )
    data = json.loads(out)
    assert code == 3 and data["verdict"] == "cannot_encode" and data["exit_code"] == 3
    assert "prefill_reject_request" in data["cannot_encode"][0]["reason"]


@pytest.mark.parametrize("engine", ["bmc", "kind", "prove", "spacer"])
def test_every_z3_engine_refuses_an_added_action(
    engine: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "added.py"
    path.write_text(
        "from kvhandoff.spec.actions import DecodeGenerate\n"
        "from kvhandoff.spec.variants import REFERENCE\n"
        "def generate_early(config, state):\n"
        "    return [DecodeGenerate(r) for r, q in enumerate(state.requests) if q.d == 'reserved']\n"
        "VARIANT = REFERENCE.derive('added', 'generate early', extra_actions=generate_early)\n"
    )
    code, out = run(capsys, "check", *SEQUENTIAL, "--variant", str(path), "--engine", engine)
    assert code == 3
    assert f"engine {engine}: cannot encode: " in out and "extra_actions hook generate_early" in out


def test_bmc_refuses_an_override_variant_after_checking_its_design(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """BMC remembers results per design: an override variant with the reference's design got the
    reference's result when it came second in one process (as in the differential test)."""
    path = str(ROOT / "tests/data/python_variants/override_reject.py")
    assert main(["check", *SEQUENTIAL, "--engine", "bmc", "--depth", "2", *ONE_REQUEST]) == 3
    capsys.readouterr()
    code, out = run(
        capsys,
        "check",
        *SEQUENTIAL,
        "--variant",
        path,
        "--engine",
        "bmc",
        "--depth",
        "2",
        *ONE_REQUEST,
    )
    assert code == 3 and "engine bmc: cannot encode: " in out


# --- 1. a bounded search is not a proof ---------------------------------------------------------


def test_bmc_on_the_reference_is_bounded_with_the_depth_that_would_be_complete(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run(capsys, "check", *SEQUENTIAL, "--engine", "bmc", "--depth", "4", *SETS)
    assert code == 3
    assert "verdict: BOUNDED: no violation up to depth 4 (not a proof)" in out
    assert "scope: this configuration (2 decode pages, 2 requests, 2 tenants" in out
    assert "paths of at most 4 steps" in out
    assert (
        "the state space is 22 steps deep (explicit search: 2,607 states, up to ghost flags and "
        "finished requests' prefill fields no property reads); --depth 22" in out
    )
    assert "verdict: SAFE" not in out
    code, out = run(
        capsys, "check", *SEQUENTIAL, "--engine", "bmc", "--depth", "4", "--json", *SETS
    )
    data = json.loads(out)
    assert data["verdict"] == "bounded" and data["exit_code"] == 3 and data["scope"] == "bounded"
    assert {r["verdict"] for r in data["results"]} == {"bounded"}
    assert data["completeness"]["complete"] is False and data["completeness"]["diameter"] == 22


def test_bmc_says_safe_once_its_depth_reaches_the_state_space_and_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run(capsys, "check", *SEQUENTIAL, "--engine", "bmc", "--depth", "11", *ONE_REQUEST)
    assert code == 3 and "--depth 12 would make this bound complete" in out
    code, out = run(capsys, "check", *SEQUENTIAL, "--engine", "bmc", "--depth", "12", *ONE_REQUEST)
    assert code == 0
    assert "complete: depth 12 >= 12, the depth of the state space" in out
    assert "verdict: SAFE\nscope: this configuration (1 decode page, 1 request" in out


@pytest.mark.slow
def test_bmc_at_its_default_depth_on_the_default_scenario_is_bounded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The case the issue names: depth 20 of a state space 38 steps deep."""
    code, out = run(capsys, "check", *SEQUENTIAL, "--variant", "reference", "--engine", "bmc")
    assert code == 3
    assert "verdict: BOUNDED: no violation up to depth 20 (not a proof)" in out
    assert "the state space is 38 steps deep" in out


# --- 2. --engine all is one verdict -------------------------------------------------------------


def test_all_with_spacer_unknown_is_safe_by_the_engines_that_proved_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spacer times out (here after 0.3 s); explore, kind and prove prove it: exit 0."""

    def quick_spacer(variant: Variant, config: Config, options: EngineOptions) -> CheckResult:
        return engines._z3(lambda: spacer(variant, config, timeout=0.3))

    monkeypatch.setitem(ENGINES, "spacer", quick_spacer)
    code, out = run(capsys, "check", *SEQUENTIAL, "--engine", "all", "--depth", "2", *SETS)
    assert code == 0, out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[-9:] if "  " in line}
    assert rows["explore"] == "SAFE" and rows["prove"] == "SAFE" and rows["kind"] == "SAFE"
    assert rows["bmc"] == "BOUNDED" and rows["spacer"] == "UNKNOWN"
    assert "configuration: 2 decode pages, 2 requests, 2 tenants" in out
    assert "Spacer: timed out after 0.3 s" in out
    assert "verdict: SAFE (by prove, explore, kind)" in out
    assert "scope: any size (prove); this configuration (explore, kind)" in out


def _broken_prover(variant: Variant, config: Config, options: EngineOptions) -> CheckResult:
    """A deliberately broken engine: proves every safety property of anything."""
    results = [PropertyResult(p.name, "holds", detail="broken") for p in ALWAYS]
    return CheckResult(variant.name, "broken", config, results, extra={"scope": "any-size"})


@pytest.fixture
def broken_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in ENGINES if n != "explore"]:
        monkeypatch.delitem(ENGINES, name)
    monkeypatch.setitem(ENGINES, "broken", _broken_prover)


@pytest.mark.usefixtures("broken_engines")
def test_engines_that_disagree_exit_4_showing_both_sides(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run(capsys, "check", *SEQUENTIAL, "--variant", "incident", "--engine", "all", *SETS)
    assert code == 4
    assert "variant incident, engine explore" in out and "variant incident, engine broken" in out
    assert "ENGINES DISAGREE (a bug in kvhandoff, not a verdict on the protocol):" in out
    assert (
        "  decode_reads_only_validated_pages: proved by broken (any-size), violated by explore"
        in out
    )
    assert out.rstrip().endswith("verdict: ENGINES DISAGREE (exit 4)")
    code, out = run(
        capsys, "check", *SEQUENTIAL, "--variant", "incident", "--engine", "all", "--json", *SETS
    )
    data = json.loads(out)
    assert code == 4 and data["verdict"] == "disagree" and data["exit_code"] == 4
    props = {d["property"] for d in data["disagreements"]}
    assert "decode_reads_only_validated_pages" in props
    assert [row["engine"] for row in data["table"]] == ["explore", "broken"]


@pytest.mark.usefixtures("broken_engines")
def test_the_matrix_exits_4_when_engines_disagree(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "matrix",
        *SEQUENTIAL,
        "--engines",
        "explore,broken",
        "--variants",
        "incident,reference",
        *SETS,
    ]
    code, out = run(capsys, *argv)
    assert code == 4
    assert "ENGINES DISAGREE (a bug in kvhandoff): decode_reads_only_validated_pages" in out
    assert "matrix: ENGINES DISAGREE on incident (exit 4)" in out
    code, out = run(capsys, *argv, "--json")
    data = json.loads(out)
    assert code == 4 and data["engines_disagree"] is True
    rows = {r["variant"]: r for r in data["rows"]}
    assert rows["incident"]["disagreements"] and not rows["reference"]["disagreements"]
    assert rows["reference"]["ok"] and not rows["incident"]["ok"]


# --- combine: the rule, on hand-made results ----------------------------------------------------


def _run(engine: str, verdicts: dict[str, str], scope: str = "fixed-config") -> EngineRun:
    results = [
        PropertyResult(p.name, verdicts.get(p.name, verdicts.get("*", "holds")), depth=5)
        for p in [*ALWAYS, TERMINATION]
        if p.name in verdicts or "*" in verdicts
    ]
    result = CheckResult("v", engine, Config(), results, extra={"scope": scope})
    return EngineRun(engine, result, seconds=1.0)


def test_combine_never_lets_an_inconclusive_engine_downgrade_a_proof_or_a_violation() -> None:
    proof = _run("prove", {"*": "holds"}, "any-size")
    unknown = _run("spacer", {"*": "unknown"})
    bounded = _run("bmc", {"*": "bounded"})
    cannot = EngineRun("kind", None, "several prefill ranks")
    combined = combine([unknown, bounded, cannot, proof])
    assert combined.verdict == "safe" and combined.exit_code == 0
    assert combined.deciding == ["prove"]
    found = _run("explore", {"no_cross_tenant_read": "violated", "*": "holds"})
    combined = combine([unknown, bounded, cannot, found])
    assert combined.verdict == "violated" and combined.exit_code == 1
    assert combine([unknown, bounded, cannot]).verdict == "bounded"
    assert combine([unknown, cannot]).exit_code == 3
    assert combine([]).verdict == "unknown"


def test_combine_flags_a_property_proved_by_one_engine_and_violated_by_another() -> None:
    proof = _run("prove", {p.name: "holds" for p in ALWAYS}, "any-size")
    liveness = _run("explore", {TERMINATION.name: "violated", "*": "holds"})
    # Prove does not check liveness: no disagreement, the violation stands.
    assert combine([proof, liveness]).verdict == "violated"
    leak = _run("explore", {"no_cross_tenant_read": "violated", "*": "holds"})
    combined = combine([proof, leak])
    assert combined.verdict == "disagree" and combined.exit_code == 4
    (d,) = combined.disagreements
    assert d.property == "no_cross_tenant_read"
    assert d.proved_by == ["prove (any-size)"] and d.violated_by == ["explore"]
    # A bounded search that missed a violation deeper than its bound is not a disagreement.
    shallow = _run("bmc", {"*": "bounded"})
    assert combine([shallow, leak]).verdict == "violated"
