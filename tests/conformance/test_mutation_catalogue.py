"""The mutation catalogue (benchmarks/mutants/) still applies to the tree, and the default
in-process campaign kills a few cheap mutants (the full score: benchmarks/conformance_mutation.py).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Appended, not prepended: benchmarks/conformance.py must not shadow the `conformance` package.
sys.path.append(str(ROOT / "benchmarks"))

import conformance_mutation as bench  # noqa: E402
from mutants.catalogue import BY_NAME, MUTANTS, Edit, Mutant, PatchMismatch  # noqa: E402


def test_every_mutant_applies_exactly_once_and_still_compiles(tmp_path: Path) -> None:
    assert len(MUTANTS) >= 20
    assert len(BY_NAME) == len(MUTANTS), "mutant names must be unique"
    for m in MUTANTS:
        root = tmp_path / m.name
        for e in m.edits:  # only the files it edits: copying the whole tree 30 times is slow
            (root / e.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / e.path, root / e.path)
        m.apply_to(root)
        for e in m.edits:
            text = (root / e.path).read_text()
            assert e.new in text
            assert (ROOT / e.path).read_text() != text
            compile(text, str(root / e.path), "exec")


def test_a_stale_patch_fails_loudly(tmp_path: Path) -> None:
    bench.copy_tree(tmp_path)
    stale = Mutant(
        "stale", "text no longer in the tree", (Edit("impl/core/decode.py", "no such text", "x"),)
    )
    with pytest.raises(PatchMismatch, match="occurs 0 times"):
        stale.apply_to(tmp_path)
    twice = Mutant("twice", "ambiguous text", (Edit("impl/core/decode.py", "return", "x"),))
    with pytest.raises(PatchMismatch, match="expected exactly 1"):
        twice.apply_to(tmp_path)


def test_equivalent_mutants_are_argued_not_dropped() -> None:
    for m in MUTANTS:
        assert m.where in ("core", "edge"), m.name
        assert m.bug, m.name
        if m.equivalent:
            assert len(m.equivalent) > 80, f"{m.name}: argue why it is equivalent"


@pytest.mark.parametrize("name", ["prefill_limit_off_by_one", "completion_before_writes_landed"])
def test_the_default_inproc_campaign_kills_a_cheap_mutant(name: str) -> None:
    # The first traces of the default campaign (same seed): these two die within 3.
    outcome = bench.run_one(BY_NAME[name], "inproc", timeout=120, extra=["--traces", "10"])
    assert outcome.verdict == "killed", outcome
    assert outcome.traces is not None and outcome.traces >= 1


@pytest.mark.parametrize("name", ["pages_not_zeroed", "page_count_rounded_down"])
def test_the_harness_target_kills_what_the_pages_and_short_prompts_show(name: str) -> None:
    # Unzeroed pages are seen only by reading the pages back (PageContents); a page too few
    # only with a prompt that ends inside a page (Reset's shortfall).
    outcome = bench.run_one(BY_NAME[name], "harness", timeout=120, extra=["--traces", "20"])
    assert outcome.verdict == "killed", outcome


def test_the_harness_target_kills_a_mutant_only_a_forged_message_shows() -> None:
    # Decode takes any capability token: no honest prefill sends a wrong one, so only the
    # adversarial probes (through the service's Probe) can show it.
    mutant = BY_NAME["write_token_not_checked"]
    outcome = bench.run_one(mutant, "harness", timeout=120, extra=["--traces", "10"])
    assert outcome.verdict == "killed", outcome
    assert "forged write_forged_token" in outcome.detail


def test_the_unmutated_tree_survives_the_same_run() -> None:
    # Without this, a campaign broken for every tree would "kill" every mutant.
    outcome = bench.run_one(None, "inproc", timeout=120, extra=["--traces", "20"])
    assert outcome.verdict == "survived", outcome
