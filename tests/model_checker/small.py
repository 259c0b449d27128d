"""What the Z3 tests of the model checker share: the small configuration they encode and the
validity check their equivalence tests use."""

from __future__ import annotations

import z3

from kvhandoff.spec.config import Config, RequestSpec

SMALL = Config(
    decode_pages=2,
    requests=(RequestSpec("a", 1, 1), RequestSpec("b", 2, 1)),
    context_window=2,
    prefill_max_prompt=1,
    decode_max_prompt=2,
)
"""Two requests (the second over prefill's one-token limit) and two pages: every phase of the
handoff is reachable, and the state space stays small enough to enumerate in a test."""


def valid(claim: z3.ExprRef, *assumptions: z3.ExprRef) -> bool:
    """`claim` holds in every model of `assumptions` (its negation is unsatisfiable)."""
    solver = z3.Solver()
    solver.add(*assumptions, z3.Not(claim))
    return solver.check() == z3.unsat
