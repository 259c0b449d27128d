"""The any-size model covers the spec: each spec step is a run of the model (z3_simulation).

`prove`'s "any size" verdict is only about the spec if the model over-approximates it. These tests
check that on sampled edges of the explorer's graph (every kind of step), and that the check
itself has teeth: a model that cannot land a write, and the model as it was before the fix of its
decode restart (which erased OK answers the spec keeps), are both caught.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import z3

from kvhandoff.model_checker import z3_prove
from kvhandoff.model_checker.z3_simulation import Simulator
from kvhandoff.spec.actions import DecodeReceiveWrite, action_name
from kvhandoff.spec.config import Config, parse_set
from kvhandoff.spec.variants import Variant, get_variant
from tests.explored import SMALL, Edge, edges_by_kind, sample_edges


def _restart_with_an_ok_answer(by_kind: dict[str, list[Edge]]) -> Edge:
    """Decode restarts while an answered request still holds its pages (the spec keeps the
    client's OK answer)."""
    for before, action, after in by_kind["decode_restart"]:
        if any(q.d == "answered" and q.answer and q.answer.ok for q in before.requests):
            return before, action, after
    raise AssertionError("the small scenario has no such decode restart")


def test_every_kind_of_reference_step_is_a_run_of_the_any_size_model() -> None:
    config, by_kind = edges_by_kind("reference")
    sim = Simulator(get_variant("reference"), config)
    edges = [*sample_edges(by_kind, per_kind=1), _restart_with_an_ok_answer(by_kind)]
    assert len({action_name(a) for _, a, _ in edges}) >= 20
    divergences = [d for b, a, af in edges if (d := sim.check_step(b, a, af)) is not None]
    assert divergences == []


def test_reachable_states_lie_inside_the_any_size_invariant() -> None:
    config, by_kind = edges_by_kind("reference")
    sim = Simulator(get_variant("reference"), config)
    states = [after for _, _, after in sample_edges(by_kind, per_kind=1, seed=1)][::2]
    assert [d for s in states if (d := sim.check_state(s)) is not None] == []


def _patched_actions(
    monkeypatch: pytest.MonkeyPatch, name: str, change: Callable[[Any, z3_prove.St], Any]
) -> None:
    """Replace the update of one action of the any-size model."""
    original = z3_prove.actions

    def actions(design: Any, *args: Any, **kwargs: Any) -> list[z3_prove.Action]:
        out = original(design, *args, **kwargs)
        for act in out:
            if act.name == name:
                act.update = (lambda old: lambda s: change(old(s), s))(act.update)
        return out

    monkeypatch.setattr(z3_prove, "actions", actions)


def test_a_model_whose_writes_never_land_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    config, by_kind = edges_by_kind("reference")
    _patched_actions(monkeypatch, "decode_receive_write", lambda update, s: {})
    sim = Simulator(get_variant("reference"), config, invariant=False)
    landed = [
        (b, a, af)
        for b, a, af in by_kind["decode_receive_write"]
        if isinstance(a, DecodeReceiveWrite)
        and b.pages[a.write.page].content != af.pages[a.write.page].content
    ][:3]
    assert landed
    found = [sim.check_step(b, a, af) for b, a, af in landed]
    assert all(d is not None and d.action == "decode_receive_write" for d in found)


def test_the_old_decode_restart_that_erased_ok_answers_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config, by_kind = edges_by_kind("reference")

    def erase_ok_answers(update: dict[str, Any], s: z3_prove.St) -> dict[str, Any]:
        # The model before the fix: an OK answer of a request decode still held was erased.
        kept = update["d"]
        return {
            **update,
            "ans_ok": lambda x: z3.And(s.ans_ok(x), kept(x) == s.d(x)),
        }

    _patched_actions(monkeypatch, "decode_restart", erase_ok_answers)
    sim = Simulator(get_variant("reference"), config, invariant=False)
    before, action, after = _restart_with_an_ok_answer(by_kind)
    divergence = sim.check_step(before, action, after)
    assert divergence is not None and divergence.action == "decode_restart"


def test_a_design_outside_the_any_size_fragment_is_refused() -> None:
    variant: Variant = get_variant("m7_release_before_drain")
    with pytest.raises(ValueError, match="one-sided"):
        Simulator(variant, parse_set(Config(), SMALL))


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "reference",
        "incident",
        "m10_stale_status_adopted",
        "m20_unscrubbed_pages",
        "m18_orphan_grant_accepted",
    ],
)
def test_every_sampled_step_of_a_variant_in_the_fragment_is_a_run_of_the_model(name: str) -> None:
    variant = get_variant(name)
    config, by_kind = edges_by_kind(name)
    sim = Simulator(variant, config, invariant=not variant.breaks)
    edges = sample_edges(by_kind, per_kind=12, seed=2)
    assert [d for b, a, af in edges if (d := sim.check_step(b, a, af)) is not None] == []
