"""Differential test (issue 12): no engine says SAFE where the explorer finds a violation.

Every engine runs on every catalogue variant, every file in `examples/` and the override variants
of `differential.py` (the incident written as step overrides, an added action), on the same
configuration as the explorer; `differential.mismatches` lists any property an engine calls
proved (or clean up to a depth) that the explorer's exhaustive search violates (within that
depth). The default run uses the small scenario, shallow bounds and short solver timeouts; the
`slow` run uses each variant's catalogue scenario and the engines' defaults.
"""

from __future__ import annotations

import pytest

import model_checker.z3_engines as z3_engines
from model_checker.engines import ENGINES, EngineOptions
from tests.explored import SMALL
from tests.model_checker.differential import (
    config_for,
    differential,
    every_variant,
    variant_named,
)

NAMES = [v.name for v in every_variant()]


def test_the_rows_cover_the_catalogue_the_examples_and_the_overrides() -> None:
    variants = every_variant()
    assert {"reference", "incident", "override_reject", "skip_digest"} <= set(NAMES)
    assert len(set(NAMES)) == len(NAMES)
    assert any(v.step_overrides for v in variants) and any(v.extra_actions for v in variants)


@pytest.mark.parametrize("name", ["incident_as_overrides", "generate_before_validation"])
def test_the_override_variants_are_really_broken(name: str) -> None:
    """Else the differential test could not catch an engine that proves them."""
    variant = variant_named(name)
    explored, _, _ = differential(variant, config_for(variant, SMALL), [], EngineOptions())
    assert set(variant.breaks) <= {r.property for r in explored.violated()}


@pytest.mark.parametrize("name", NAMES)
def test_no_engine_claims_more_than_the_explorer_on_the_small_scenario(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The depth at which kind and spacer look for a real counterexample once they cannot prove:
    # it decides violated versus unknown, never a "holds", so a shallow one keeps this fast.
    monkeypatch.setattr(z3_engines, "DEFAULT_BMC_DEPTH", 4)
    variant = variant_named(name)
    config = config_for(variant, SMALL)
    options = EngineOptions(depth=4, timeout=2.0)
    _, runs, found = differential(variant, config, list(ENGINES), options)
    assert not found, "\n".join(str(m) for m in found)
    assert [r.engine for r in runs] == list(ENGINES)
    if variant.step_overrides or variant.extra_actions:
        assert all(r.verdict == "cannot_encode" for r in runs if r.engine != "explore")


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("name", NAMES)
def test_no_engine_claims_more_than_the_explorer_on_the_catalogue_scenario(name: str) -> None:
    variant = variant_named(name)
    config = config_for(variant, [])
    _, _, found = differential(variant, config, list(ENGINES), EngineOptions(timeout=60.0))
    assert not found, "\n".join(str(m) for m in found)
