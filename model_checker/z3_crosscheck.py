"""Checks on the checker: the Z3 transition relation against the explicit explorer's graph.

DESIGN.md §2 rule 2: on small configurations, every edge the explorer takes must be one the Z3
encoding takes (same action, same successor), the encoding must take no other edge out of a
reachable state, and sampled non-edges must be rejected by the solver.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import z3

from kvhandoff.model_checker.z3_encoding import Encoding, SymState, _rename
from kvhandoff.spec.actions import Action
from kvhandoff.spec.config import Config
from kvhandoff.spec.machine import enabled, step
from kvhandoff.spec.state import State
from kvhandoff.spec.variants import Variant


def constants(enc: Encoding, values: dict[str, Any]) -> SymState:
    """A concrete state as Z3 constants of the encoding's sorts."""
    return {
        name: z3.BoolVal(values[name]) if kind == "B" else enc.K(values[name])
        for name, kind in enc.fields
    }


def z3_successors(enc: Encoding, state: State) -> set[tuple[Action, State]]:
    """Every (action, successor) the encoding allows from a spec state, evaluated by Z3."""
    values = enc.abstract(state)
    s = constants(enc, values)
    # The rules over the template state, the very terms `trans` is built from, with the state's
    # values substituted (translating every formula again per state would cost far more).
    tpl = enc.state_at(0, "tpl_")
    sources, targets = list(tpl.values()), [s[name] for name in tpl]
    out = set()
    for i, (guard_t, new_t) in enumerate(enc._rules_on(tpl)):
        names = list(new_t)
        guard, *news = _rename([guard_t, *(new_t[n] for n in names)], sources, targets)
        if not z3.is_true(z3.simplify(guard)):
            continue
        after = dict(values)
        for name, expr in zip(names, news, strict=True):
            x = z3.simplify(expr)
            if z3.is_bool(x):
                after[name] = z3.is_true(x)
            elif enc.width is None:
                after[name] = x.as_long()
            else:
                after[name] = x.as_signed_long()
        out.add((enc.action(values, i), enc.concretize(after)))
    return out


def edge_mismatches(
    variant: Variant, config: Config, states: Sequence[State], width: int | None = 6
) -> list[str]:
    """States whose spec edges and Z3 edges differ (empty when they agree), described."""
    enc = Encoding(variant, config, width=width)
    problems = []
    for state in states:
        spec_edges = {(a, step(variant, config, state, a)) for a in enabled(variant, config, state)}
        z3_edges = z3_successors(enc, state)
        if spec_edges != z3_edges:
            missing = sorted(str(a) for a, _ in spec_edges - z3_edges)
            extra = sorted(str(a) for a, _ in z3_edges - spec_edges)
            problems.append(f"{state}: Z3 lacks {missing}; Z3 adds {extra}")
    return problems


def accepted_non_edges(
    variant: Variant,
    config: Config,
    states: Sequence[State],
    samples: int,
    seed: int = 0,
    width: int | None = 6,
) -> list[str]:
    """Pairs (s, t) with t not a successor of s that the solver still accepts as T(s, a, t)."""
    enc = Encoding(variant, config, width=width)
    rng = random.Random(seed)
    s, s2, act = enc.state_at(0, "ne_"), enc.state_at(1, "ne_"), enc.action_at(0, "ne_")
    trans = enc.trans(s, act, s2)
    problems = []
    for _ in range(samples):
        a, b = rng.choice(states), rng.choice(states)
        successors = {step(variant, config, a, x) for x in enabled(variant, config, a)}
        if b in successors:
            continue
        solver = z3.SolverFor("QF_BV") if width else z3.Solver()
        solver.add(trans)
        for name, value in constants(enc, enc.abstract(a)).items():
            solver.add(s[name] == value)
        for name, value in constants(enc, enc.abstract(b)).items():
            solver.add(s2[name] == value)
        if solver.check() != z3.unsat:
            problems.append(f"accepted non-edge {a} -> {b}")
    return problems
