"""The engine limit models say what engines.md §5 says, at every boundary."""

from __future__ import annotations

import pytest
import z3
from deploy_helpers import incident, oracle_sglang
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhandoff.model_checker.deployment.decision import handled_alike
from kvhandoff.model_checker.deployment.engines import (
    Kind,
    RoleLimits,
    role_limits,
    sglang_handling,
    sglang_scheduler_limit,
    vllm_handling,
)
from kvhandoff.model_checker.deployment.model import Engine, Role


def evaluate(lim: RoleLimits, n: int) -> tuple[Kind, int]:
    kind, eff = lim.handling(n)
    k, e = z3.simplify(kind), z3.simplify(eff)
    assert isinstance(k, z3.IntNumRef) and isinstance(e, z3.IntNumRef)
    return Kind(k.as_long()), e.as_long()


def test_incident_scheduler_limit_is_681274() -> None:
    assert sglang_scheduler_limit(1_048_576, 681_280) == 681_274


@pytest.mark.parametrize(
    ("version", "length", "expected"),
    [
        ("0.5.11", 681_273, (Kind.FULL, 681_273)),
        ("0.5.11", 681_274, (Kind.PLACEHOLDER, 1)),
        ("0.5.11", 1_048_575, (Kind.PLACEHOLDER, 1)),
        ("0.5.11", 1_048_576, (Kind.TOKENIZER_REJECT, 0)),
        ("0.5.23", 681_273, (Kind.FULL, 681_273)),
        ("0.5.23", 681_274, (Kind.RETIRED, 0)),
        ("0.5.23", 1_048_576, (Kind.TOKENIZER_REJECT, 0)),
    ],
)
def test_incident_prefill_handles_each_boundary_as_engines_md_says(
    version: str, length: int, expected: tuple[Kind, int]
) -> None:
    lim = role_limits(incident(version=version).prefill, version)
    assert evaluate(lim, length) == expected


def test_auto_truncate_cuts_to_max_req_input_len() -> None:
    d = incident(prefill_flags=("--allow-auto-truncate",))
    lim = role_limits(d.prefill, d.version)
    assert evaluate(lim, 900_000) == (Kind.TRUNCATED, 681_274)


def test_vllm_rejects_a_prompt_as_long_as_max_model_len() -> None:
    def kind_at(n: int) -> int:
        k = z3.simplify(vllm_handling(n, 4096)[0])
        assert isinstance(k, z3.IntNumRef)
        return k.as_long()

    assert kind_at(4095) == Kind.FULL
    assert kind_at(4096) == Kind.TOKENIZER_REJECT


@settings(max_examples=60, deadline=None)
@given(
    context=st.integers(2, 200),
    pool=st.integers(7, 200),
    truncate=st.booleans(),
    v0511=st.booleans(),
    data=st.data(),
)
def test_z3_encoding_agrees_with_the_longhand_rules(
    context: int, pool: int, truncate: bool, v0511: bool, data: st.DataObject
) -> None:
    lim = RoleLimits(
        role=Role.PREFILL,
        engine=Engine.SGLANG,
        context_length=context,
        pool_tokens=pool,
        tokenizer_limit=context,
        scheduler_limit=min(context - 1, pool - 1) - 5,
        capacity_limit=pool,
        allow_auto_truncate=truncate,
        placeholder_proceeds=v0511,
    )
    n = data.draw(st.integers(1, context + 3))
    assert evaluate(lim, n) == oracle_sglang(n, context, pool, truncate, v0511)


def _symbolic_role(
    name: str, truncate: z3.BoolRef, v0511: z3.BoolRef
) -> tuple[z3.ArithRef, z3.ArithRef, z3.ArithRef, z3.ArithRef]:
    context, pool = z3.Ints(f"context_{name} pool_{name}")
    n = z3.Int("n")
    limit = sglang_scheduler_limit(context, pool)
    kind, eff = sglang_handling(
        n,
        context_length=context,
        scheduler_limit=limit,
        capacity=pool,
        allow_auto_truncate=truncate,
        placeholder_proceeds=v0511,
    )
    return kind, eff, context, pool


def test_a_prompt_sglang_serves_whole_fits_its_pool_for_every_deployment() -> None:
    truncate, v0511 = z3.Bools("truncate v0511")
    kind, _eff, context, pool = _symbolic_role("r", truncate, v0511)
    n = z3.Int("n")
    s = z3.Solver()
    s.add(context >= 2, pool >= 7, n >= 1, kind == int(Kind.FULL), z3.Not(n <= pool - 6))
    assert s.check() == z3.unsat


def test_identically_configured_roles_agree_on_every_prompt_for_every_deployment() -> None:
    """The decision property cannot fail for a symmetric pair, whatever the sizes."""
    truncate, v0511 = z3.Bools("truncate v0511")
    kp, ep, cp, pp = _symbolic_role("p", truncate, v0511)
    kd, ed, cd, pd = _symbolic_role("d", truncate, v0511)
    s = z3.Solver()
    s.add(cp == cd, pp == pd, cp >= 2, pp >= 7, z3.Int("n") >= 1)
    s.add(z3.Not(handled_alike(kp, ep, kd, ed)))
    assert s.check() == z3.unsat


def test_a_smaller_prefill_pool_breaks_agreement_for_some_deployment() -> None:
    """The must-fail partner of the proof above: the property is not vacuous."""
    truncate, v0511 = z3.Bools("truncate v0511")
    kp, ep, cp, pp = _symbolic_role("p", truncate, v0511)
    kd, ed, cd, pd = _symbolic_role("d", truncate, v0511)
    s = z3.Solver()
    s.add(cp == cd, pp < pd, cp >= 2, pp >= 7, z3.Int("n") >= 1)
    s.add(z3.Not(handled_alike(kp, ep, kd, ed)))
    assert s.check() == z3.sat
