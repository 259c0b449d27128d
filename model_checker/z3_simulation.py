"""Does the any-size model cover the spec? A check of `z3_prove` against `spec/`, step by step.

`kvhandoff check --engine prove` proves the invariants of an abstract model (`z3_prove`) whose
requests and pages are uninterpreted sorts. Its proofs speak about the spec only if the model
*over-approximates* the spec: every spec step must map to zero or more model steps, and every
reachable spec state must satisfy the model's inductive invariant. Nothing else checks that: the
model is a second, hand-written copy of the protocol. This module checks it on concrete steps.

For an edge `s --a--> s'` of the explorer's graph it asks Z3 whether there are

    values of the model's history symbols (messages ever sent, pages ever written, ghost flags)
    such that   Inv(α(s))  and  α(s) -->^{<=k} α(s')  in the model,

where α maps the state's protocol fields onto the model's vocabulary over a universe of exactly
the config's requests and pages (`_abstract`), and `k` bounds the model steps one spec step may
need (a prefill restart stops every live request: one `prefill_stop` each). `unsat` is a
*divergence*: the spec did something the model cannot do (so its proofs do not cover the spec),
or a reachable state lies outside the invariant. Fields α leaves free are existentially chosen
(so the check is weaker there, never wrong).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import z3

from kvhandoff.model_checker import z3_prove as M
from kvhandoff.model_checker.z3_encoding import D, P
from kvhandoff.spec.actions import Action, action_name
from kvhandoff.spec.config import Config
from kvhandoff.spec.state import State
from kvhandoff.spec.variants import Variant

# Symbols α gives a value from the spec state alone.
_EXACT = (
    "submitted",
    "p",
    "d",
    "p_gen",
    "d_gen",
    "not_as_is",
    "ans_set",
    "ans_ok",
    "granted",
    "p_pages",
    "own",
    "own_req",
    "own_gen",
    "has",
    "c_req",
    "c_gen",
    "next_gen",
)


@dataclass(frozen=True)
class Divergence:
    """A spec step the model cannot take (or a reachable state outside its invariant)."""

    action: str
    args: str
    why: str


class Universe:
    """The model's sorts pinned to the config's requests, pages, tenants and rooms."""

    def __init__(self, config: Config) -> None:
        n, m = len(config.requests), config.decode_pages
        self.reqs = [z3.Const(f"R{i}", M.Req) for i in range(n)]
        self.pages = [z3.Const(f"Q{j}", M.Page) for j in range(m)]
        tenants = sorted({r.tenant for r in config.requests})
        rooms = sorted({r.room for r in config.requests})
        self.tenant = {t: z3.Const(f"T_{t}", M.Tenant) for t in tenants}
        self.room = {x: z3.Const(f"Room{x}", M.Room) for x in rooms}
        x, q = z3.Const("u_r", M.Req), z3.Const("u_q", M.Page)
        self.axioms: list[Any] = [
            z3.Distinct(*self.reqs) if n > 1 else z3.BoolVal(True),
            z3.Distinct(*self.pages) if m > 1 else z3.BoolVal(True),
            z3.ForAll([x], z3.Or([x == r for r in self.reqs])),
            z3.ForAll([q], z3.Or([q == p for p in self.pages])),
        ]
        if len(tenants) > 1:
            self.axioms.append(z3.Distinct(*self.tenant.values()))
        if len(rooms) > 1:
            self.axioms.append(z3.Distinct(*self.room.values()))
        rigid = M.state("")
        for i, spec in enumerate(config.requests):
            r = self.reqs[i]
            self.axioms += [
                rigid.tenant(r) == self.tenant[spec.tenant],
                rigid.room(r) == self.room[spec.room],
                rigid.too_long_for_window(r) == z3.BoolVal(spec.pages > config.context_window),
                rigid.too_long_for_prefill(r) == z3.BoolVal(spec.pages > config.prefill_max_prompt),
                rigid.too_long_for_decode(r) == z3.BoolVal(spec.pages > config.decode_max_prompt),
            ]


def _abstract(u: Universe, s: M.St, state: State, exact: Iterable[str] = _EXACT) -> list[Any]:
    """α(state) as constraints on the model state `s` (history symbols only bounded below)."""
    keep = set(exact)
    out: list[Any] = []

    def put(name: str, *args_value: Any) -> None:
        if name in keep:
            *args, value = args_value
            out.append(s.syms[name](*args) == value if args else s.syms[name] == value)

    for i, req in enumerate(state.requests):
        r = u.reqs[i]
        put("submitted", r, z3.BoolVal(req.submitted))
        put("p", r, z3.IntVal(P[req.p]))
        put("d", r, z3.IntVal(D[req.d]))
        put("p_gen", r, z3.IntVal(req.p_gen))
        put("d_gen", r, z3.IntVal(req.d_gen))
        put("not_as_is", r, z3.BoolVal(req.not_as_is))
        put("ans_set", r, z3.BoolVal(req.answer is not None))
        put("ans_ok", r, z3.BoolVal(req.answer is not None and req.answer.ok))
        for j, q in enumerate(u.pages):
            put("granted", r, q, z3.BoolVal(j in req.d_pages))
            put("p_pages", r, q, z3.BoolVal(j in req.p_pages))
        # Pages written so far for prefill's grant were issued: `wrote` is monotone in the model.
        for j in req.p_pages[: req.p_wrote]:
            out.append(s.wrote(r, u.pages[j]))
    for j, page in enumerate(state.pages):
        q = u.pages[j]
        put("own", q, z3.BoolVal(page.owner is not None))
        if page.owner is not None:
            put("own_req", q, u.reqs[page.owner[0]])
            put("own_gen", q, z3.IntVal(page.owner[1]))
        put("has", q, z3.BoolVal(page.content is not None))
        if page.content is not None and page.content.request >= 0:
            put("c_req", q, u.reqs[page.content.request])
            put("c_gen", q, z3.IntVal(page.content.generation))
    put("next_gen", z3.IntVal(state.next_generation))
    for w in state.writes:
        out.append(s.wrote(u.reqs[w.data.request], u.pages[w.page]))
    for m in (*state.network, *state.lost):
        if m.kind == "grant":
            out.append(s.grant_sent(u.reqs[m.request]))
        elif m.kind == "completion":
            out.append(s.comp_sent(u.reqs[m.request]))
    return out


class Simulator:
    """Checks spec steps of one variant and config against the any-size model."""

    def __init__(
        self, variant: Variant, config: Config, max_steps: int | None = None, invariant: bool = True
    ) -> None:
        why_not = M.supports(variant.design)
        if why_not is not None:
            raise ValueError(f"variant {variant.name}: {why_not}")
        self.variant, self.config = variant, config
        self.u = Universe(config)
        self.k = max_steps if max_steps is not None else len(config.requests) + 1
        self.invariant = invariant
        self.actions = M.actions(variant.design)
        self.states = [M.state(f"@{i}") for i in range(self.k + 1)]
        self.solver = z3.Solver()
        self.solver.add(self.u.axioms)
        if invariant:
            s0 = self.states[0]
            self.solver.add(*M.invariants(s0).values(), *M.properties(s0).values())
        for i in range(self.k):
            self.solver.add(self._step(i))

    def _step(self, i: int) -> Any:
        """Model step i: one of the model's actions (fresh parameters), or a stutter."""
        s, s2 = self.states[i], self.states[i + 1]
        a_r, a_t = z3.Consts("a_r a_t", M.Req)
        a_q = z3.Const("a_q", M.Page)
        a_lost = z3.Bool("a_lost")
        a_chosen = z3.Function("a_chosen", M.Page, M.BOOL)
        pairs = [
            (a_r, z3.Const(f"a_r@{i}", M.Req)),
            (a_t, z3.Const(f"a_t@{i}", M.Req)),
            (a_q, z3.Const(f"a_q@{i}", M.Page)),
            (a_lost, z3.Bool(f"a_lost@{i}")),
        ]
        chosen = z3.Function(f"a_chosen@{i}", M.Page, M.BOOL)

        def fresh(e: Any) -> Any:
            return z3.substitute_funs(
                z3.substitute(e, *pairs), (a_chosen, chosen(z3.Var(0, M.Page)))
            )

        options = [self._frame(s, s2, {})]
        for act in self.actions:
            update = act.update(s)
            options.append(fresh(z3.And(act.guard(s), act.extra(s), self._frame(s, s2, update))))
        return z3.Or(options)

    def _frame(self, s: M.St, s2: M.St, update: M.Update) -> Any:
        out = []
        for name, (args, _result) in M.SYMBOLS.items():
            new, old = s2.syms[name], s.syms[name]
            fn = update.get(name)
            if not args:
                out.append(new == (fn() if fn is not None else old))
                continue
            xs = [z3.Const(f"f_{name}_{n}", a) for n, a in enumerate(args)]
            value = fn(*xs) if fn is not None else old(*xs)
            out.append(z3.ForAll(xs, new(*xs) == value))
        return z3.And(out)

    def check_state(self, state: State) -> Divergence | None:
        """Is α(state) inside the invariant (some history symbols chosen)?"""
        self.solver.push()
        self.solver.add(_abstract(self.u, self.states[0], state))
        for i in range(self.k):  # no model steps needed: stutter throughout
            self.solver.add(self._same(self.states[i], self.states[i + 1]))
        answer = self.solver.check()
        self.solver.pop()
        return _verdict(answer, "state", "", "the state's abstraction is outside the invariant")

    def check_step(self, before: State, action: Action, after: State) -> Divergence | None:
        self.solver.push()
        self.solver.add(_abstract(self.u, self.states[0], before))
        self.solver.add(_abstract(self.u, self.states[self.k], after))
        answer = self.solver.check()
        self.solver.pop()
        return _verdict(
            answer,
            action_name(action),
            repr(action),
            f"no run of at most {self.k} model steps takes α(before) to α(after)",
        )

    @staticmethod
    def _same(s: M.St, s2: M.St) -> Any:
        out = []
        for name, (args, _result) in M.SYMBOLS.items():
            if not args:
                out.append(s2.syms[name] == s.syms[name])
            else:
                xs = [z3.Const(f"e_{name}_{n}", a) for n, a in enumerate(args)]
                out.append(z3.ForAll(xs, s2.syms[name](*xs) == s.syms[name](*xs)))
        return z3.And(out)


def _verdict(answer: Any, action: str, args: str, why: str) -> Divergence | None:
    if answer == z3.sat:
        return None
    if answer == z3.unknown:
        return Divergence(action, args, f"solver answered unknown ({why}?)")
    return Divergence(action, args, why)


def simulate(
    variant: Variant,
    config: Config,
    edges: Sequence[tuple[State, Action, State]],
    invariant: bool = True,
    max_steps: int | None = None,
) -> list[Divergence]:
    """Check each edge; the divergences found (empty: the model covered every step)."""
    sim = Simulator(variant, config, max_steps=max_steps, invariant=invariant)
    out = []
    for before, action, after in edges:
        d = sim.check_step(before, action, after)
        if d is not None:
            out.append(d)
    return out


__all__ = ["Divergence", "Simulator", "Universe", "simulate"]
