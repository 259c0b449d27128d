"""Every Z3 model shows it can move: a model that cannot land a write is reported, never SAFE."""

from __future__ import annotations

from typing import Any

import pytest
import z3

from kvhandoff.model_checker import z3_derived
from kvhandoff.model_checker.engines import ENGINES, EngineOptions
from kvhandoff.model_checker.prove import prove
from kvhandoff.model_checker.z3_encoding import Encoding
from kvhandoff.model_checker.z3_witnesses import derived_movement, fixed_movement, spec_reach
from kvhandoff.spec.config import Config, RequestSpec
from kvhandoff.spec.properties import SOMETIMES
from kvhandoff.spec.variants import REFERENCE, get_variant

TINY = Config(
    decode_pages=1,
    requests=(RequestSpec("a", 1, 1),),
    context_window=1,
    prefill_max_prompt=1,
    decode_max_prompt=1,
    max_faults=0,
)


def _derived_without_write_landing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch the any-size model so that decode's step that lands a write changes nothing."""
    real = z3_derived.step

    def broken(model: Any, name: str, view: Any, tag: str) -> Any:
        guard, new, constraints = real(model, name, view, tag)
        return (
            (guard, view, constraints)
            if name == "decode_receive_write"
            else (guard, new, constraints)
        )

    monkeypatch.setattr(z3_derived, "step", broken)


def test_the_any_size_model_takes_every_action_and_reaches_every_witness_the_spec_does() -> None:
    movement = derived_movement(REFERENCE, Config())
    assert movement.problems == []
    taken = {n for n, at in movement.actions.items() if at is not None}
    fired, held = spec_reach(REFERENCE, Config(), movement.depth)
    assert taken == set(fired)
    assert {w for w, at in movement.witnesses.items() if at is not None} == set(held)
    assert set(movement.witnesses) == {w.name for w in SOMETIMES}


def test_prove_reports_an_any_size_model_that_never_lands_a_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The example: with no write landing, every obligation still discharges (vacuously).
    _derived_without_write_landing(monkeypatch)
    result = prove(REFERENCE, TINY)
    assert result.extra["scope"] == "any-size"
    assert all(o["verdict"] == "proved" for o in result.extra["obligations"])
    assert result.verdict == "unknown" and result.exit_code == 3
    assert not any(r.verdict == "holds" for r in result.results)
    findings = result.extra["vacuity"]
    assert any("decode_receive_write" in f and "not a step of the model" in f for f in findings)
    # No page ever holds data in the model, so the spec's handoff is not reached there.
    assert result.witnesses["can_complete_handoff"] is False


def _fixed_without_write_landing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch the fixed-configuration encoding so that decode never receives a write (its guard
    is the spec's formula, translated: the translation is what is broken here)."""
    original = Encoding._translated_guard

    def never(self: Encoding, formula: Any, s: Any, inst: Any) -> Any:
        if inst.name == "decode_receive_write":
            return z3.BoolVal(False)
        return original(self, formula, s, inst)

    monkeypatch.setattr(Encoding, "_translated_guard", never)


def test_the_fixed_encoding_reaches_every_action_and_witness_as_early_as_the_spec() -> None:
    movement = fixed_movement(REFERENCE, TINY, depth=12)
    fired, held = spec_reach(REFERENCE, TINY, 12)
    assert movement.problems == []
    # Shortest depths, each path replayed through the spec: the same first steps as the spec's.
    assert {n: d for n, d in movement.actions.items() if d is not None} == fired
    assert {n: d for n, d in movement.witnesses.items() if d is not None} == held
    assert movement.actions["decode_receive_write"] is not None


@pytest.mark.parametrize(
    "engine",
    # prove's fixed-config obligations take about 15 s here: deep runs are marked slow.
    ["bmc", "kind", "spacer", pytest.param("prove", marks=pytest.mark.slow)],
)
def test_every_fixed_config_engine_reports_an_encoding_that_never_lands_a_write(
    monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    _fixed_without_write_landing(monkeypatch)
    # prove takes the fixed-config obligations for a one-sided design.
    variant = get_variant("one_sided_fenced") if engine == "prove" else REFERENCE
    result = ENGINES[engine](variant, TINY, EngineOptions(depth=12, timeout=60))
    assert result.verdict == "unknown" and result.exit_code == 3, result.results
    assert not any(r.verdict == "holds" for r in result.results)
    assert any("action decode_receive_write never fires" in f for f in result.extra["vacuity"])
    assert result.witnesses["can_complete_handoff"] is False
