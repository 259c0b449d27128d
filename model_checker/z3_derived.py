"""The any-size model derived from the rules: the spec's guard and effect formulas, read over
uninterpreted sorts, with no Z3 code of its own per action.

`prove` proves the invariants for any pool size over this model. It is built from the spec
itself, in the style of mypyvy and Ivy: every action of the design is `rule_guard(design, name)`
and `rule_effect(design, name)` translated over a state made of one uninterpreted function per
vocabulary symbol, and the obligations (initiation, consecution per action and claim, safety)
are over the formulas of `spec/invariants.py` and `spec/properties.py` read over that state.
(It replaced a hand-written any-size model, `z3_prove.py`, a second copy of the protocol that
nothing checked against the spec: `git show 0c2c4ff:model_checker/z3_prove.py`.)

The state (`_BASE`): requests, pages and tenants are uninterpreted sorts (`Req`, `Page`,
`Tenant`); each state symbol of `spec/vocabulary.py` is a function over them (phases and
generations are integers, phases by their codes in `z3_encoding`); one prefill rank, so a rank
argument is dropped and the rank sets (`p_rank_done`, `d_rank`, `d_ack`, `p_acked`) are not kept
(an effect may only clear them, as in the one-rank fixed encoding). The answer is three functions
(`ans_set`, `ans_ok`, `ans_timeout`: given, output, the "timed out waiting" error). Messages are
elements of a sort `Msg` with rigid field functions (kind, request, generation, epoch, count,
digest, the pages a grant names and a digest covers, the failure reason) and a mutable relation
`sent`; page writes in flight are elements of a sort `Wr` with rigid fields and a mutable relation
`inflight`. A message or write that an effect creates is a fresh Skolem function of the effect's
bound variables whose fields are constrained to the values the effect gives; a guard's parameters
(a request, a message sent, a write in flight) are fresh constants.

An effect `assign(f(args), v, when=c)` (under `each`) becomes the next state's `f'(x) =
ite(x == args and c, v, f(x))`, the later update winning, inlined where the claims read `f'`
(no frame axioms: an unassigned symbol is the same function).

What it over-approximates (more behaviours, so a proof still holds for the spec):

* **Messages are never removed.** `consume`, `lose`, `resend` and `copy` change nothing: once
  sent, a message may be received (again) at any later time, from the network or the lost
  buffer alike. This covers loss, retransmission, duplication, reordering and delay; it is sound
  because no guard asks that a message be *absent* (`_check_no_absence` refuses a rule whose
  guard or effect quantifies over the messages in flight).
* **Writes are exact**: consumed writes leave `inflight` (guards do ask that no write be in
  flight: prefill's completion, its abort).
* **Counts** (`count(sort, body)` over requests or pages) are uninterpreted functions of the
  count's free variables, one per state and per count's shape, constrained only by facts true of
  every count: not negative, and unchanged by a step that leaves the counted set unchanged (the
  same function where the step changes no symbol the count reads). "Zero exactly when nothing
  satisfies the body" is true too, and available (`zero_axiom=True`), but no proof of the
  catalogue needs it, and with it a failing obligation tends to come back `unknown` instead of
  with its counterexample (the solver finds no model for that quantifier alternation). So "the
  first N free pages" (`decode_reserve_pages`) is any set of free pages, "the next page in grant
  order" (`prefill_write_page`) any set of granted pages at the same unknown position, and the
  router's load any number.
* **A flag set when some element qualifies** (`assign(drain_acked(), True, when=...)` under
  `each(REQ, ...)`: the bound variable names no entry of the symbol) takes its condition and value
  at an element chosen with the step: the spec's (the last that qualifies) is one choice.
* **Page and request order** (`o < q`) are rigid relations with no axioms (any order, or none).
* **Instances**: where the router placed each request (`d_inst`, `p_inst`) and whose pool each
  page is in (`page_inst`) are rigid and free, elements of a sort `Inst` (any number of
  instances, any placement, any split of the pool); `next_gen(i)` is a counter per decode
  instance; the decode instance of prefill's grant (`p_dinst`) is the one that sent the grant
  prefill holds (`p_grant_dinst`, a state function into `Inst`), as in the spec. Restarts and
  partitions act on every request at once, as the spec writes them for its one instance of
  each. The same holds under room-keyed matching, where a request may take a grant another
  decode instance made for another request on its room.
* **The scenario's facts** (`over_prefill_limit`, `prompt_pages`, `room`, `tenant`, the fault
  limits, `waits_for`, `truncated_len`) are rigid and unconstrained: every configuration at once.
* **Derived symbols** are their definitions over the state: `answered`/`answered_ok`/
  `timed_out_waiting` over the answer, `p_granted_count(r)` the count of r's granted pages,
  `p_written(r, q)` a granted page whose position in the grant (a count) is below `p_wrote(r)`,
  `issued` written or in flight, `faults_spent` the sum of the fault counts, `read_tenant` the
  tenant of the request read; `shard_outside` is false (push path only).
* **Prefill's orphan grants** (`adopt_orphan`, M18) are not kept: nothing the claims read
  depends on them.
* **Initial state**: every symbol at the value it has in the spec's initial state (read off
  `initial_state` through the vocabulary's concrete reading); request-, page- and tenant-valued
  symbols, meaningless there, are free.

Two facts of the spec's types that the model's integers and functions do not carry are claims
of its `well_formed`, proved inductive with the others (not assumed): prefill's page count is
not negative, and decode read a page only when it read (`read_page -> read_done`).

A variant's own formulas are read where it has them (`Model(design, variant)`): a replaced guard
or effect, an added action (its formula guard and effect) and a state field (a constant of its
own in each state, at its declared initial value in `init`).

Refused (`Untranslatable`, naming the construct): the pull path and one-sided writes
(`supports`), a variant with Python hooks, a rank set set to true, and a guard, effect or
property that quantifies over the messages in flight (the model keeps every message sent).

`prove_derived` translates the claims once, over the state before the step, and reads them over
each action's next state by substitution (`claims_after`); a consecution obligation whose claim
reads nothing the step changes is the same Z3 term as its hypothesis, proved without the solver.

`Simulator` checks the model against the spec on explorer edges (its simulation check,
tests/model_checker/test_derived_any_size.py) and replays the spec's paths for the witness check
(`z3_witnesses.derived_movement`).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, cast

import z3

from kvhandoff.model_checker import progress
from kvhandoff.model_checker.logic_z3 import Untranslatable
from kvhandoff.model_checker.z3_encoding import D_PHASES, FAULT_FIELDS, P_PHASES, D, P
from kvhandoff.spec import vocabulary as V
from kvhandoff.spec.actions import snake_case
from kvhandoff.spec.effects import (
    DECODE_SENDS,
    WRITABLE,
    Adopt,
    Assign,
    EffectFormula,
    Forget,
    IssueWrites,
    Move,
    Reply,
    Send,
)
from kvhandoff.spec.logic import (
    BOOL,
    D_PHASE,
    DINST,
    FAILURE_REASONS,
    INT,
    P_PHASE,
    PAGE,
    PINST,
    RANK,
    REQ,
    TENANT,
    App,
    Bound,
    Count,
    Field,
    FieldSymbol,
    GuardFormula,
    InFlight,
    Lit,
    Op,
    Quant,
    Sort,
    Term,
    Var,
    clauses,
    count,
    each_write,
)
from kvhandoff.spec.logic import And as LAnd
from kvhandoff.spec.logic import Not as LNot
from kvhandoff.spec.logic import Or as LOr
from kvhandoff.spec.variants import Design, Variant

Req = z3.DeclareSort("Req")
Page = z3.DeclareSort("Page")
Tenant = z3.DeclareSort("Tenant")
Msg = z3.DeclareSort("Msg")
Wr = z3.DeclareSort("Wr")
Inst = z3.DeclareSort("Inst")
"""Instances: the spec numbers them, but only compares them and picks a counter by one, so the
model gives them a sort of their own (a model of a failing obligation is then found as readily
as with requests and pages; over the integers Z3 often answered unknown)."""
INST0 = z3.Const("inst0", Inst)
"""Instance 0: the one a formula names by its number (a restart's `next_gen(0)`, a cleared
`p_grant_dinst`), and the only one of the narrowed query (`_one_instance_facts`)."""


NARROW_MS = 2000
"""How long `prove_derived` looks for a counterexample on one instance of each before it asks
the general query (milliseconds)."""


def _one_instance_facts(view: View | None = None) -> list[Any]:
    """Every instance term is `INST0` (with `view`, also the state's `p_grant_dinst`): one
    prefill and one decode instance."""
    r, q, m = z3.Const("oi_r", Req), z3.Const("oi_q", Page), z3.Const("oi_m", Msg)
    f = RIGID.f
    held = [] if view is None else [z3.ForAll([r], view["p_grant_dinst"](r) == INST0)]
    return [
        *held,
        z3.ForAll([r], z3.And(f["d_inst"](r) == INST0, f["p_inst"](r) == INST0)),
        z3.ForAll([q], f["page_inst"](q) == INST0),
        z3.ForAll([m], RIGID.msg["dinst"](m) == INST0),
    ]


def _p_dinst(view: View, r: Any) -> Any:
    """`p_dinst(r)`: the decode instance that sent the grant prefill holds for r (the spec's
    `p_grant_dinst`), or before any grant the one r was placed on."""
    return _ite(view["p_gen"](r) != 0, view["p_grant_dinst"](r), RIGID.f["d_inst"](r))


def _instance(x: Any) -> Any:
    """An instance term; the number 0 (the spec's first instance) as `INST0`."""
    if isinstance(x, int) and not isinstance(x, bool):
        if x != 0:
            raise Untranslatable(f"instance {x} named by its number")
        return INST0
    return x


_Z3_SORT: dict[Sort, Any] = {
    REQ: Req,
    PAGE: Page,
    TENANT: Tenant,
    INT: z3.IntSort(),
    BOOL: z3.BoolSort(),
    P_PHASE: z3.IntSort(),
    D_PHASE: z3.IntSort(),
    PINST: Inst,
    DINST: Inst,
}
_CODES: dict[Sort, dict[str, int]] = {P_PHASE: P, D_PHASE: D}
_KINDS = ("grant", "completion", "failure", "abort", "abort_ack")
_TIMEOUT = "timed out waiting for prefill"

_NOT_KEPT = frozenset({"p_rank_done", "d_rank", "d_ack", "p_acked"})
"""Rank sets: with one prefill rank the spec keeps them empty (an effect sets one only when not
every rank has reported, which one rank always has)."""
_INSTANCE_TERMS = frozenset({"d_inst", "p_inst", "page_inst", "p_dinst"})
_INSTANCE_VALUED = frozenset({"p_grant_dinst"})
"""State symbols whose value is an instance: functions into `Inst`."""
_INSTANCE_INDEXED = frozenset(
    {
        "next_gen",
        "prefill_epoch",
        "decode_epoch",
        "decode_seen_prefill_epoch",
        "prefill_seen_decode_epoch",
    }
)
"""State symbols of an instance or a pair of instances: functions over `Inst`."""
_DERIVED = frozenset(
    {
        "answered",
        "answered_ok",
        "timed_out_waiting",
        "p_granted_count",
        "p_written",
        "issued",
        "faults_spent",
        "read_tenant",
        "shard_outside",
        "prefill_ranks",
        "drain_fence",
        # The decode instance of prefill's grant, or r's own before any (`Model.apply`).
        "p_dinst",
    }
)
_ANSWER = {"ans_set": (REQ,), "ans_ok": (REQ,), "ans_timeout": (REQ,)}
FAULT_COUNTS = FAULT_FIELDS
"""The fault counts whose sum is `faults_spent` (`X_spent` each), those of the fixed encoding."""


def _kept_args(args: Sequence[Sort]) -> tuple[Sort, ...]:
    return tuple(a for a in args if a != RANK)


_SYMBOLS = {s.name: s for s in V.SYMBOLS}
_BASE: dict[str, tuple[tuple[Sort, ...], Sort]] = {
    **{
        n: (_kept_args(s.args), s.result)
        for n, s in _SYMBOLS.items()
        if n in WRITABLE and n not in _NOT_KEPT and n not in _DERIVED
    },
    **{n: (a, BOOL) for n, a in _ANSWER.items()},
}
"""The mutable symbols, with their argument sorts (rank dropped) and result sort. The
generation counters are one function of the decode instance (`next_gen(i)`, over `Inst`)."""
_RIGID: dict[str, tuple[tuple[Sort, ...], Sort]] = {
    n: (_kept_args(s.args), s.result)
    for n, s in _SYMBOLS.items()
    if n not in WRITABLE and n not in _DERIVED
}
"""The scenario's facts: rigid, unconstrained. Among them where the router placed each request
(`d_inst`, `p_inst`) and whose pool each page is in (`page_inst`): any number of instances, any
placement, any split of the pool."""

# Rigid fields of messages and writes.
_MSG_FIELDS = {
    "kind": z3.IntSort(),
    "req": Req,
    "gen": z3.IntSort(),
    "epoch": z3.IntSort(),
    "count": z3.IntSort(),
    "has_digest": z3.BoolSort(),
    "reason": z3.IntSort(),
    "attempt": z3.IntSort(),
    "dinst": Inst,
}
_WR_FIELDS = {
    "req": Req,
    "page": Page,
    "gen": z3.IntSort(),
    "data_gen": z3.IntSort(),
    "epoch": z3.IntSort(),
    "right_tenant": z3.BoolSort(),
    "room": z3.IntSort(),
}


def _fn(name: str, args: Sequence[Any], result: Any) -> Any:
    return z3.Function(name, *args, result) if args else z3.Const(name, result)


class _Rigid:
    """Rigid functions: the scenario's facts, the fields of messages and writes, the orders."""

    def __init__(self) -> None:
        self.f = {
            n: _fn(n, [_Z3_SORT[a] for a in args], Inst if n in _INSTANCE_TERMS else _Z3_SORT[r])
            for n, (args, r) in _RIGID.items()
        }
        self.msg = {n: z3.Function(f"m_{n}", Msg, s) for n, s in _MSG_FIELDS.items()}
        self.msg_page = {
            n: z3.Function(f"m_{n}", Msg, Page, z3.BoolSort()) for n in ("has_page", "digest_page")
        }
        self.wr = {n: z3.Function(f"w_{n}", Wr, s) for n, s in _WR_FIELDS.items()}
        self.lt = {
            Req: z3.Function("req_lt", Req, Req, z3.BoolSort()),
            Page: z3.Function("page_lt", Page, Page, z3.BoolSort()),
        }


RIGID = _Rigid()


def _rigid_decls() -> list[Any]:
    """Every rigid declaration, as an expression (an unrolling keeps them across its steps)."""
    out: list[Any] = []
    for f in [*RIGID.f.values(), *RIGID.msg.values(), *RIGID.msg_page.values()]:
        out.append(f)
    out += [*RIGID.wr.values(), *RIGID.lt.values()]
    return [f if isinstance(f, z3.ExprRef) else _apply_fresh(f) for f in out]


def _apply_fresh(f: Any) -> Any:
    return f(*[z3.Const(f"_rigid{i}", f.domain(i)) for i in range(f.arity())])


View = dict[str, Callable[..., Any]]
"""A state: each mutable symbol (and `sent`, `inflight`) as a function of its arguments."""


def base_view(tag: str, fields: dict[str, Any] | None = None) -> View:
    """The state whose symbols are fresh functions named with `tag`; `fields`: a variant's state
    fields (`Model.fields`), each a constant keyed `field:<name>`."""
    out: View = {}
    for name, initial in (fields or {}).items():
        sort = z3.BoolSort() if isinstance(initial, bool) else z3.IntSort()
        out[f"field:{name}"] = _applier(z3.Const(f"field:{name}{tag}", sort))
    for name, (args, result) in _BASE.items():
        sort = Inst if name in _INSTANCE_VALUED else _Z3_SORT[result]
        out[name] = _applier(_fn(f"{name}{tag}", _arg_sorts(name, args), sort))
    out["sent"] = _applier(z3.Function(f"sent{tag}", Msg, z3.BoolSort()))
    out["inflight"] = _applier(z3.Function(f"inflight{tag}", Wr, z3.BoolSort()))
    return out


def _arg_sorts(name: str, args: Sequence[Sort]) -> list[Any]:
    """The Z3 sorts of a mutable symbol's arguments: `next_gen`'s is an instance (as are the
    epochs', by their sorts)."""
    return [Inst] if name == "next_gen" else [_Z3_SORT[a] for a in args]


def _applier(f: Any) -> Callable[..., Any]:
    out: Any
    if isinstance(f, z3.FuncDeclRef):
        out = lambda *xs: f(*xs)  # noqa: E731
    else:
        out = lambda: f  # noqa: E731
    out.decl = f if isinstance(f, z3.FuncDeclRef) else f.decl()
    return cast(Callable[..., Any], out)


def _decl(fn: Callable[..., Any]) -> Any:
    """The declaration of a base state's symbol (`base_view`) or of a count function."""
    return getattr(fn, "decl")  # noqa: B009


def _z(x: Any) -> Any:
    if isinstance(x, bool):
        return z3.BoolVal(x)
    if isinstance(x, int):
        return z3.IntVal(x)
    return x


def _and(xs: Sequence[Any]) -> Any:
    if any(x is False for x in xs):
        return False
    rest = [x for x in xs if x is not True]
    return True if not rest else rest[0] if len(rest) == 1 else z3.And([_z(x) for x in rest])


def _or(xs: Sequence[Any]) -> Any:
    if any(x is True for x in xs):
        return True
    rest = [x for x in xs if x is not False]
    return False if not rest else rest[0] if len(rest) == 1 else z3.Or([_z(x) for x in rest])


def _ite(c: Any, a: Any, b: Any) -> Any:
    if c is True:
        return a
    if c is False:
        return b
    if isinstance(c, z3.ExprRef) and z3.is_false(c):
        return b
    return z3.If(_z(c), _z(a), _z(b))


# --- derived symbols, defined over the state in the spec's own language --------------------------

_DR, _DQ = Var(REQ, "r"), Var(PAGE, "q")
_DEFS: dict[str, tuple[tuple[Var, ...], Term]] = {
    # Written like the rules' own counts, so that the same count is the same function.
    "p_granted_count": ((_DR,), count(PAGE, lambda q: V.p_granted(_DR, q))),
    "p_written": (
        (_DR, _DQ),
        LAnd(
            V.p_granted(_DR, _DQ),
            count(PAGE, lambda o: LAnd(o < _DQ, V.p_granted(_DR, o))) < V.p_wrote(_DR),
        ),
    ),
    "issued": (
        (_DR, _DQ),
        LOr(
            V.p_written(_DR, _DQ),
            LNot(each_write(lambda w: LNot(LAnd(w.req == _DR, w.page == _DQ)))),
        ),
    ),
}


_FRESH = itertools.count()


def _fresh(prefix: str, sort: Any) -> Any:
    """A constant named apart from every other (a bound variable, a parameter of a step)."""
    return z3.Const(f"{prefix}!{next(_FRESH)}", sort)


@dataclass
class Obligation:
    """One proof obligation and its answer: the initiation or consecution (under `action`) of an
    invariant, or the safety of a property, with a counterexample where it failed."""

    kind: str  # initiation, consecution, safety
    invariant: str
    action: str | None
    verdict: str  # proved, failed, unknown
    seconds: float
    counterexample: dict[str, Any] | None = None
    assumed: frozenset[str] | None = None
    """For a proved obligation of the fixed-config prove: the claims its proof used (an unsat
    core over one assumption per claim), so a later Houdini round that still keeps them all
    need not ask again. None: not known (never reused)."""
    reused: bool = False
    """Carried over from an earlier round of the same proof, not asked again (see `assumed`)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "invariant": self.invariant,
            "action": self.action,
            "verdict": self.verdict,
            "seconds": round(self.seconds, 4),
        }
        if self.counterexample is not None:
            out["counterexample"] = self.counterexample
        if self.reused:
            out["reused"] = True
        return out


class Model:
    """The derived model of one design: translation of terms over a state, counts, obligations.
    With a `variant`, its own formulas replace the rulebook's: the guards and effects it replaces
    (`formula_guards`, `formula_effects`), the actions it adds (`extra_action_types`, whose
    guard and effect are formulas) and its state fields (`state_fields`, read and assigned through
    `spec.logic.state_field`). A variant with Python hooks is refused (`Untranslatable`)."""

    def __init__(self, design: Design, variant: Variant | None = None) -> None:
        from kvhandoff.spec.machine import RULE_EFFECTS, RULE_GUARDS

        self.design = design
        self.guards: dict[str, GuardFormula | None] = {n: None for n in RULE_GUARDS}
        """Each action's guard: None for the rulebook's (`rule_guard`), else the variant's."""
        self.effects: dict[str, EffectFormula | None] = {n: None for n in RULE_EFFECTS}
        self.fields: dict[str, Any] = {}
        """The variant's state fields and their initial values."""
        if variant is not None:
            if variant.design != design:
                raise ValueError("the variant's design is not the model's")
            hooks = variant.untranslated()
            if hooks:
                raise Untranslatable(
                    f"the variant's Python code ({', '.join(hooks)}) is not in the derived model"
                )
            self.guards.update({n: h.formula for n, h in variant.formula_guards().items()})
            self.effects.update({n: h.formula for n, h in variant.formula_effects().items()})
            self.fields = dict(variant.state_fields)
        self.drain = design.drain_fenced
        self.counts: dict[str, tuple[Count, list[tuple[Var, Any]]]] = {}
        """Each count's shape: the term and its free variables (with their Z3 sorts)."""
        self._count_fns: dict[tuple[str, str], Any] = {}
        self.changed: set[str] = set()
        """The symbols the step being translated changes (`effect` sets it)."""
        self.translated: dict[tuple[Any, ...], tuple[Any, View, list[Any], set[str], View]] = {}
        """`translated_step`'s memo (the view is kept so that its id stays its own)."""
        self.zero_axiom = False

    # --- terms ---------------------------------------------------------------------------------

    def tr(self, t: Term, view: View, tag: str, env: dict[int, Any]) -> Any:
        """`t` over the state `view` (named `tag`, for its counts), with bound variables `env`."""

        def go(t: Term) -> Any:
            if isinstance(t, Lit):
                if isinstance(t.value, tuple):
                    return t.value
                codes = _CODES.get(t.sort)
                return codes[t.value] if codes is not None else t.value
            if isinstance(t, Field):
                return self._field(t, env, view, tag)
            if isinstance(t, Var):
                return env[id(t)]
            if isinstance(t, App) and isinstance(t.symbol, FieldSymbol):
                key = f"field:{t.symbol.name}"
                if key not in view:
                    raise Untranslatable(
                        f"state field {t.symbol.name!r} is not declared in the variant's "
                        "state_fields"
                    )
                return view[key]()
            if isinstance(t, App):
                return self.apply(t.symbol.name, [go(a) for a in t.args], view, tag)
            if isinstance(t, Quant):
                if t.var.sort == RANK:
                    env[id(t.var)] = 0
                    return go(t.body)
                x = _fresh(t.var.name, _Z3_SORT[t.var.sort])
                env[id(t.var)] = x
                body = _z(go(t.body))
                return z3.ForAll([x], body) if t.every else z3.Exists([x], body)
            if isinstance(t, Count):
                return self._count(t, env, view, tag)
            if isinstance(t, InFlight):
                return self._in_flight(t, env, view, tag)
            if isinstance(t, Op):
                return self._op(t, [go(a) for a in t.args])
            raise TypeError(f"cannot translate {t!r}")

        return go(t)

    def _op(self, t: Op, a: list[Any]) -> Any:
        op = t.op
        if op == "and":
            return _and(a)
        if op == "or":
            return _or(a)
        if op == "not":
            return (not a[0]) if isinstance(a[0], bool) else z3.Not(a[0])
        if op == "implies":
            if a[0] is False or a[1] is True:
                return True
            if a[0] is True:
                return a[1]
            return z3.Implies(_z(a[0]), _z(a[1]))
        if op == "ite":
            return _ite(a[0], a[1], a[2])
        if op == "in":
            codes = _CODES[t.args[0].sort]
            return _or([a[0] == codes[n] for n in a[1]])
        x, y = a
        sort = t.args[0].sort
        if op in ("lt", "le") and sort in (REQ, PAGE):
            # The order of requests or pages: a rigid relation with no axioms (any order).
            if isinstance(x, int) and isinstance(y, int):
                return x < y if op == "lt" else x <= y
            lt = RIGID.lt[_Z3_SORT[sort]](x, y)
            return lt if op == "lt" else z3.Or(lt, x == y)
        if op == "eq":
            return x == y if not (isinstance(x, bool) and isinstance(y, bool)) else x is y
        if op == "ne":
            return x != y if not (isinstance(x, bool) and isinstance(y, bool)) else x is not y
        if op == "lt":
            return x < y
        if op == "le":
            return x <= y
        if op == "add":
            return x + y
        if op == "sub":
            return x - y
        raise TypeError(f"unknown operator {op}")

    def apply(self, name: str, args: list[Any], view: View, tag: str) -> Any:
        symbol = _SYMBOLS.get(name)
        if symbol is None:
            raise Untranslatable(f"symbol {name!r} is not in the vocabulary")
        kept = [x for x, s in zip(args, symbol.args, strict=True) if s != RANK]
        if name in _NOT_KEPT:
            return False
        if name == "p_dinst":
            return _p_dinst(view, kept[0])
        if name in _INSTANCE_INDEXED:
            return view[name](*(_instance(x) for x in kept))
        if name in _BASE:
            return view[name](*kept)
        if name in _RIGID:
            f = RIGID.f[name]
            return f(*kept) if kept else f
        if name in _DEFS:
            params, body = _DEFS[name]
            env = {id(v): x for v, x in zip(params, kept, strict=True)}
            return self.tr(body, view, tag, env)
        if name == "answered":
            return view["ans_set"](*kept)
        if name == "answered_ok":
            return z3.And(view["ans_set"](*kept), view["ans_ok"](*kept))
        if name == "timed_out_waiting":
            return z3.And(view["ans_set"](*kept), view["ans_timeout"](*kept))
        if name == "faults_spent":
            return z3.Sum([view[f"{n}_spent"]() for n in FAULT_COUNTS])
        if name == "read_tenant":
            return RIGID.f["tenant"](view["read_req"](*kept))
        if name == "shard_outside":
            return False  # push path: every shard holds data of a request of the scenario
        if name == "prefill_ranks":
            return 1
        if name == "drain_fence":
            return self.drain
        raise Untranslatable(f"symbol {name!r} has no reading in the derived model")

    def _field(self, t: Field, env: dict[int, Any], view: View, tag: str) -> Any:
        what, x = env[id(t.var)]
        name = t.name
        if what == "message":
            m = RIGID.msg
            if name == "rank":
                return 0
            if name == "rank_done":
                return False
            if name == "room":
                return RIGID.f["room"](m["req"](x))
            if name in ("has_page", "digest_page"):
                assert t.arg is not None
                return RIGID.msg_page[name](x, self.tr(t.arg, view, tag, env))
            if name == "reason_is":
                assert isinstance(t.arg, Lit)
                return m["reason"](x) == FAILURE_REASONS.index(t.arg.value)
            return m[name](x)
        if what == "write":
            if name == "rank":
                return 0
            if name == "rank_acked":
                return False
            if name == "right_room":  # its room is its request's (the concrete reading)
                return RIGID.wr["room"](x) == RIGID.f["room"](RIGID.wr["req"](x))
            return RIGID.wr[name](x)
        if what == "pending_ack":
            if name == "req":
                return x
            return view["pending_ack_gen"](x)
        raise TypeError(f"no field {name} of {what}")

    def _in_flight(self, t: InFlight, env: dict[int, Any], view: View, tag: str) -> Any:
        if t.what == "message":
            x = _fresh("m", Msg)
            kinds = t.kinds or _KINDS
            present = z3.And(
                view["sent"](x), z3.Or([RIGID.msg["kind"](x) == _KINDS.index(k) for k in kinds])
            )
        elif t.what == "write":
            x = _fresh("w", Wr)
            present = view["inflight"](x)
        elif t.what == "pending_ack":
            x = _fresh("a", Req)
            present = view["pending_ack"](x)
        else:
            raise Untranslatable(f"{t.what} in flight is not in the derived model")
        env[id(t.var)] = (t.what, x)
        body = self.tr(t.body, view, tag, env)
        if body is True:
            return True
        return z3.ForAll([x], z3.Implies(present, _z(body)))

    # --- counts --------------------------------------------------------------------------------

    def _count(self, t: Count, env: dict[int, Any], view: View, tag: str) -> Any:
        if t.var.sort == RANK:
            env[id(t.var)] = 0
            return _ite(self.tr(t.body, view, tag, env), 1, 0)
        shape, free = _shape(t)
        args = []
        sorts = []
        for v in free:
            value = env[id(v)]
            if isinstance(value, tuple):
                value = value[1]
            if isinstance(value, int) and not isinstance(value, z3.ExprRef):
                raise Untranslatable(f"a count over a fixed {v.sort.name} ({shape})")
            args.append(value)
            sorts.append(value.sort())
        if shape not in self.counts:
            self.counts[shape] = (t, [(v, s) for v, s in zip(free, sorts, strict=True)])
        return self.count_fn(shape, tag)(*args)

    def unchanged(self, shape: str, tag: str) -> bool:
        """The count at `tag` is the count before the step: the step changes nothing its body
        reads (so it is the same function, with no axiom to say so)."""
        return tag == "'" and not (_reads(self.counts[shape][0].body) & self.changed)

    def count_fn(self, shape: str, tag: str) -> Any:
        if self.unchanged(shape, tag):
            tag = ""
        key = (shape, tag)
        if key not in self._count_fns:
            _t, free = self.counts[shape]
            n = len(self._count_fns)
            self._count_fns[key] = _applier(
                _fn(f"count{n}{tag}", [s for _v, s in free], z3.IntSort())
            )
        return self._count_fns[key]

    def _count_parts(
        self, shape: str, view: View, tag: str, at: tuple[list[Any], Any] | None = None
    ) -> tuple[list[Any], Any, Any, Any]:
        """Arguments (fresh, or `at`), the counted element, the body and the count's value."""
        t, free = self.counts[shape]
        if at is None:
            ys = [_fresh("y", s) for _v, s in free]
            x = _fresh("x", _Z3_SORT[t.var.sort])
        else:
            ys, x = at
        env: dict[int, Any] = {}
        for (v, _s), y in zip(free, ys, strict=True):
            env[id(v)] = (v.what_of, y) if isinstance(v, Bound) else y
        env[id(t.var)] = x
        body = _z(self.tr(t.body, view, tag, env))
        return ys, x, body, self.count_fn(shape, tag)(*ys)

    def count_axioms(self, views: Sequence[tuple[View, str]]) -> list[Any]:
        """What every count satisfies, in each state of `views`, and, between consecutive states,
        that a count whose counted set is unchanged is unchanged."""
        out: list[Any] = []
        done: set[tuple[str, str]] = set()
        while True:  # a count's body may hold counts of its own
            todo = [(s, v, tag) for s in list(self.counts) for v, tag in views]
            todo = [
                (s, v, tag)
                for s, v, tag in todo
                if (s, tag) not in done and not self.unchanged(s, tag)
            ]
            steps = [
                (s, a, b)
                for s in list(self.counts)
                for a, b in itertools.pairwise(views)
                if (s, f"{a[1]}>{b[1]}") not in done and not self.unchanged(s, b[1])
            ]
            if not todo and not steps:
                break
            for shape, view, tag in todo:
                done.add((shape, tag))
                ys, x, body, k = self._count_parts(shape, view, tag)
                fact = k >= 0
                if self.zero_axiom:
                    fact = z3.And(fact, (k == 0) == z3.Not(z3.Exists([x], body)))
                out.append(z3.ForAll(ys, fact) if ys else fact)
            for shape, (v1, t1), (v2, t2) in steps:
                done.add((shape, f"{t1}>{t2}"))
                ys, x, b1, k1 = self._count_parts(shape, v1, t1)
                _ys, _x, b2, k2 = self._count_parts(shape, v2, t2, (ys, x))
                same = z3.Implies(z3.ForAll([x], b1 == b2), k2 == k1)
                out.append(z3.ForAll(ys, same) if ys else same)
        return out

    def _message_dinst(self, kind: str, r: Any, view: View, tag: str) -> Any:
        if kind in DECODE_SENDS:
            return RIGID.f["d_inst"](r)
        return _p_dinst(view, r)

    # --- rules ---------------------------------------------------------------------------------

    def guard(
        self, gf: GuardFormula, view: View, tag: str
    ) -> tuple[list[Any], dict[int, Any], Any]:
        """The action's parameters (values to bind the effect's), and its guard over `view`."""
        env: dict[int, Any] = {}
        values: list[Any] = []
        pre: list[Any] = []
        for v in gf.params:
            if isinstance(v, Bound) and v.what_of == "message":
                m = _fresh("a_m", Msg)
                kinds = gf.kinds or _KINDS
                pre += [
                    view["sent"](m),
                    z3.Or([RIGID.msg["kind"](m) == _KINDS.index(k) for k in kinds]),
                ]
                value: Any = ("message", m)
            elif isinstance(v, Bound) and v.what_of == "write":
                w = _fresh("a_w", Wr)
                pre.append(view["inflight"](w))
                value = ("write", w)
            elif v.sort == RANK:
                value = 0
            else:
                value = _fresh(f"a_{v.name}", _Z3_SORT[v.sort])
            env[id(v)] = value
            values.append(value)
        _check_no_absence(gf.formula, "guard")
        return values, env, _and([*pre, self.tr(gf.formula, view, tag, env)])

    def effect(
        self, eff: EffectFormula, values: list[Any], view: View, tag: str
    ) -> tuple[View, list[Any]]:
        """The next state (the symbols `eff` changes, as functions of their arguments) and the
        constraints on what it creates (messages, writes)."""
        if len(eff.params) != len(values):
            raise Untranslatable(f"{eff!r}: its guard takes {len(values)} arguments")
        env0 = {id(p): x for p, x in zip(eff.params, values, strict=True)}
        entries: dict[str, list[Callable[[tuple[Any, ...]], tuple[Any, Any]]]] = {}
        replies: list[Callable[[Any], tuple[Any, bool, bool]]] = []
        sent: list[Callable[[Any], Any]] = []
        writes: list[tuple[str, Callable[[Any], Any]]] = []
        constraints: list[Any] = []

        def tr(t: Term, env: dict[int, Any]) -> Any:
            return self.tr(t, view, tag, dict(env))

        for u in eff.updates:
            for t in _terms(u):
                _check_no_absence(t, "effect")
            env = dict(env0)
            elems = [v for v in u.over if v.sort != RANK]
            for v in u.over:
                if v.sort == RANK:
                    env[id(v)] = 0
            if isinstance(u, Assign):
                name = u.target.symbol.name
                if isinstance(u.target.symbol, FieldSymbol):
                    name = f"field:{name}"
                    if name not in view:
                        raise Untranslatable(
                            f"state field {u.target.symbol.name!r} is not declared in the "
                            "variant's state_fields"
                        )
                    entries.setdefault(name, []).append(
                        _entry([], elems, u.when, u.value, env, tr, name)
                    )
                    continue
                targets = [
                    a for a, s in zip(u.target.args, u.target.symbol.args, strict=True) if s != RANK
                ]
                if name == "answered":
                    # A withdrawn answer (a client's retry): given, output and timed-out all
                    # false again, as in the spec's initial state.
                    for part in _ANSWER:
                        entries.setdefault(part, []).append(
                            _entry(targets, elems, u.when, u.value, env, tr, part)
                        )
                    continue
                entry = _entry(targets, elems, u.when, u.value, env, tr, name)
                if name in _NOT_KEPT:
                    xs = tuple(_fresh("n", _Z3_SORT[a]) for a in _kept_args(_SYMBOLS[name].args))
                    cond, value = entry(xs)
                    both = z3.simplify(_z(_and([cond, value])))
                    if not z3.is_false(both):
                        raise Untranslatable(f"{name} is set, and the one-rank model keeps none")
                    continue
                entries.setdefault(name, []).append(entry)
            elif isinstance(u, Reply):
                reason_timeout = (not u.ok) and u.reason == _TIMEOUT
                get = _entry([u.req], elems, u.when, Lit(True, BOOL), env, tr, "answer")
                replies.append(_reply(get, u.ok, reason_timeout))
            elif isinstance(u, Send):
                sent.append(self._send(u, elems, env, tr, constraints, view, tag))
            elif isinstance(u, IssueWrites):
                writes.append(("add", self._issue(u, elems, env, tr, constraints, view)))
            elif isinstance(u, Move):
                what, x = env[id(u.m)]
                if what == "write":
                    writes.append(("remove", _removed(x, tr(u.when, env))))
                # A message stays: see the module docstring.
            elif isinstance(u, Forget):
                # Prefill forgets the drain acks it owed: every entry of `pending_ack`.
                forgot = tr(u.when, env)
                entries.setdefault("pending_ack", []).append(_cleared(forgot))
            elif isinstance(u, Adopt):
                pass  # orphans: see the module docstring
            else:
                raise Untranslatable(f"update {u!r}")

        self.changed = set(entries)
        if replies:
            self.changed |= set(_ANSWER)
        if sent:
            self.changed.add("sent")
        if writes:
            self.changed.add("inflight")
        new: View = dict(view)
        for name, es in entries.items():
            new[name] = _updated(view[name], es)
        if replies:
            ans_set, ans_ok, ans_to = view["ans_set"], view["ans_ok"], view["ans_timeout"]

            def set_(x: Any) -> Any:
                return _z(_or([ans_set(x), *(rep(x)[0] for rep in replies)]))

            def first(x: Any, old: Any, pick: Callable[[bool, bool], bool]) -> Any:
                acc = old
                for rep in reversed(replies):  # the first answer given stands
                    c, ok, to = rep(x)
                    acc = _ite(_and([c, z3.Not(ans_set(x))]), pick(ok, to), acc)
                return _z(acc)

            new["ans_set"] = set_
            new["ans_ok"] = lambda x: first(x, ans_ok(x), lambda ok, to: ok)
            new["ans_timeout"] = lambda x: first(x, ans_to(x), lambda ok, to: to)
        if sent:
            old_sent = view["sent"]
            new["sent"] = lambda m: _z(_or([old_sent(m), *(s(m) for s in sent)]))
        if writes:
            old_w = view["inflight"]

            def inflight(y: Any) -> Any:
                acc = old_w(y)
                for op, f in writes:
                    acc = _and([acc, z3.Not(_z(f(y)))]) if op == "remove" else _or([acc, f(y)])
                return _z(acc)

            new["inflight"] = inflight
        return new, constraints

    def _send(
        self,
        u: Send,
        elems: list[Var],
        env: dict[int, Any],
        tr: Callable[[Term, dict[int, Any]], Any],
        constraints: list[Any],
        view: View,
        tag: str,
    ) -> Callable[[Any], Any]:
        """A message sent (for each value of the update's bound variables): a fresh element of
        `Msg` with the fields the update gives; the fields it leaves unsaid are free."""
        ys = [_fresh(f"s_{v.name}", _Z3_SORT[v.sort]) for v in elems]
        made = _fn(f"new_msg!{id(u)}!{len(constraints)}", [y.sort() for y in ys], Msg)
        msg = made(*ys) if ys else made
        e = dict(env)
        e.update({id(v): y for v, y in zip(elems, ys, strict=True)})
        f = RIGID.msg
        when = _z(tr(u.when, e))
        fields = [
            f["kind"](msg) == _KINDS.index(u.kind),
            f["req"](msg) == tr(u.req, e),
            f["gen"](msg) == _z(tr(u.gen, e)),
            f["has_digest"](msg) == z3.BoolVal(u.digest),
            # Every message about a request carries its sender's attempt (`run_effect`).
            f["attempt"](msg) == _z(view["attempt"](tr(u.req, e))),
            # And the decode instance at its decode end (`effects.message_dinst`): decode's
            # own, or for what prefill sends the one its grant's pages are in.
            f["dinst"](msg) == _z(self._message_dinst(u.kind, tr(u.req, e), view, tag)),
        ]
        if u.epoch is not None:
            fields.append(f["epoch"](msg) == _z(tr(u.epoch, e)))
        if u.count is not None:
            fields.append(f["count"](msg) == _z(tr(u.count, e)))
        if u.reason:
            fields.append(f["reason"](msg) == FAILURE_REASONS.index(u.reason))
        for name, term in (("has_page", u.has_page), ("digest_page", u.digest_page)):
            if u.page is None:
                continue
            q = _fresh("s_q", Page)
            e[id(u.page)] = q
            if term is None and name == "digest_page" and u.digest:
                continue
            value = False if term is None else _z(tr(term, e))
            fields.append(z3.ForAll([q], RIGID.msg_page[name](msg, q) == value))
        fact = z3.Implies(when, z3.And(fields))
        constraints.append(z3.ForAll(ys, fact) if ys else fact)

        def is_new(m: Any) -> Any:
            hit = z3.And(when, m == msg)
            return z3.Exists(ys, hit) if ys else hit

        return is_new

    def _issue(
        self,
        u: IssueWrites,
        elems: list[Var],
        env: dict[int, Any],
        tr: Callable[[Term, dict[int, Any]], Any],
        constraints: list[Any],
        view: View,
    ) -> Callable[[Any], Any]:
        """The writes issued: a fresh element of `Wr` per page (and bound variables) where the
        condition holds, carrying the writer's grant, room, data and epoch (`run_effect`)."""
        ys = [_fresh(f"i_{v.name}", _Z3_SORT[v.sort]) for v in elems]
        q = _fresh("i_q", Page)
        made = z3.Function(f"new_wr!{id(u)}!{len(constraints)}", *[y.sort() for y in ys], Page, Wr)
        w = made(*ys, q)
        e = dict(env)
        e.update({id(v): y for v, y in zip(elems, ys, strict=True)})
        e[id(u.page)] = q
        r = tr(u.req, e)
        cond = _z(_and([tr(u.when, e), tr(u.cond, e)]))
        f = RIGID.wr
        gen = _z(view["p_gen"](r))
        fields = z3.And(
            f["req"](w) == r,
            f["page"](w) == q,
            f["gen"](w) == gen,
            f["data_gen"](w) == gen,
            f["epoch"](w) == view["p_epoch"](r),
            f["room"](w) == RIGID.f["room"](r),
            f["right_tenant"](w),
        )
        constraints.append(z3.ForAll([*ys, q], z3.Implies(cond, fields)))
        return lambda x: z3.Exists([*ys, q], z3.And(cond, x == w))


_DERIVED_READS: dict[str, set[str]] = {
    "answered": {"ans_set"},
    "answered_ok": {"ans_set", "ans_ok"},
    "timed_out_waiting": {"ans_set", "ans_timeout"},
    "p_granted_count": {"p_granted"},
    "p_written": {"p_granted", "p_wrote"},
    "issued": {"p_granted", "p_wrote", "inflight"},
    "faults_spent": {f"{n}_spent" for n in FAULT_COUNTS},
    "read_tenant": {"read_req"},
    "p_dinst": {"p_gen", "p_grant_dinst"},
}


def _reads(t: Term) -> set[str]:
    """The mutable symbols (and `sent`, `inflight`) a term reads."""
    out: set[str] = set()
    if isinstance(t, App) and isinstance(t.symbol, FieldSymbol):
        out.add(f"field:{t.symbol.name}")
    elif isinstance(t, App):
        out |= _DERIVED_READS.get(t.symbol.name, {t.symbol.name})
    if isinstance(t, InFlight):
        out |= {"message": {"sent"}, "write": {"inflight"}}.get(
            t.what, {"pending_ack", "pending_ack_gen"}
        )
    if isinstance(t, Field) and t.name == "gen":
        out.add("pending_ack_gen")  # a pending ack's generation is read off the state
    for child in _children(t):
        out |= _reads(child)
    return out


def _terms(u: Any) -> list[Term]:
    from kvhandoff.spec.effects import terms_of

    return terms_of(u)


def _check_no_absence(t: Term, where: str) -> None:
    """Messages are never removed in this model: a rule that asks about the messages in flight
    (their absence) would lose behaviours. Refused."""
    if isinstance(t, InFlight) and t.what == "message":
        raise Untranslatable(
            f"a {where} quantifies over the messages in flight, which the derived model keeps for "
            "ever"
        )
    for child in _children(t):
        _check_no_absence(child, where)


def _children(t: Term) -> list[Term]:
    if isinstance(t, (App, Op)):
        return list(t.args)
    if isinstance(t, (Quant, Count, InFlight)):
        return [t.body]
    if isinstance(t, Field) and t.arg is not None:
        return [t.arg]
    return []


def _entry(
    targets: list[Term],
    elems: list[Var],
    when: Term,
    value: Term,
    env: dict[int, Any],
    tr: Callable[[Term, dict[int, Any]], Any],
    name: str,
) -> Callable[[tuple[Any, ...]], tuple[Any, Any]]:
    """The entry an update writes: for the symbol's arguments `xs`, whether the update writes
    it (`cond`) and the value. Each bound variable must name an argument (it is bound to it)."""
    named = {id(v) for v in elems if any(t is v for t in targets)}
    env = dict(env)
    for v in elems:
        if id(v) not in named:
            # A bound variable that names no entry (a flag set when some request qualifies):
            # some element, chosen with the step. The spec's (the last that qualifies) is one
            # of the choices; the others are more behaviours.
            env[id(v)] = _fresh(f"some_{v.name}", _Z3_SORT[v.sort])

    def entry(xs: tuple[Any, ...]) -> tuple[Any, Any]:
        e = dict(env)
        conds: list[Any] = []
        for t, x in zip(targets, xs, strict=True):
            if isinstance(t, Var) and id(t) in named:
                if id(t) in e:
                    conds.append(e[id(t)] == x)
                else:
                    e[id(t)] = x
        for t, x in zip(targets, xs, strict=True):
            if not (isinstance(t, Var) and id(t) in named):
                at = tr(t, e)
                # An instance by its number (`next_gen(0)`).
                conds.append((_instance(at) if name in _INSTANCE_INDEXED else at) == x)
        conds.append(tr(when, e))
        out = tr(value, e)
        # An instance by its number (a cleared `p_grant_dinst`).
        return _and(conds), _instance(out) if name in _INSTANCE_VALUED else out

    return entry


def _reply(
    get: Callable[[tuple[Any, ...]], tuple[Any, Any]], ok: bool, timeout: bool
) -> Callable[[Any], tuple[Any, bool, bool]]:
    """An answer: for a request x, whether it is answered by this update, output or not, and
    whether it is the "timed out waiting" error."""
    return lambda x: (get((x,))[0], ok, timeout)


def _cleared(when: Any) -> Callable[[tuple[Any, ...]], tuple[Any, Any]]:
    """Every entry set to false where `when` holds."""
    return lambda xs: (when, False)


def _removed(w: Any, when: Any) -> Callable[[Any], Any]:
    """The step's own write leaves the wire (where `when` holds)."""
    return lambda y: _and([y == w, when])


def _updated(
    old: Callable[..., Any], es: list[Callable[[tuple[Any, ...]], tuple[Any, Any]]]
) -> Callable[..., Any]:
    """The next state's function: each update's entry, the later winning where its condition
    holds. Each update is translated once, at fresh arguments, and instantiated by substitution
    where the claims apply the function (translating it again at every application cost more
    than the proof)."""
    at: list[tuple[list[Any], Any, Any]] = []

    def new(*xs: Any) -> Any:
        if not at:
            params = [_fresh("e", x.sort()) for x in xs]
            at.extend((params, *(_z(v) for v in entry(tuple(params)))) for entry in es)
        acc = old(*xs)
        for params, cond, value in at:
            pairs = list(zip(params, xs, strict=True))
            c = z3.substitute(cond, *pairs) if pairs else cond
            v = z3.substitute(value, *pairs) if pairs else value
            acc = _ite(c, v, acc)
        return _z(acc)

    return new


def _shape(t: Count) -> tuple[str, list[Var]]:
    """The count as text with its variables named by the order they occur (so that the same
    count written at two places is one function), and its free variables in that order."""
    names: dict[int, str] = {id(t.var): "_x"}
    free: list[Var] = []

    def name(v: Var) -> str:
        if id(v) not in names:
            names[id(v)] = f"_f{len(free)}"
            free.append(v)
        return names[id(v)]

    def go(t: Term) -> str:
        if isinstance(t, Lit):
            return repr(t.value)
        if isinstance(t, Field):
            arg = f"({go(t.arg)})" if t.arg is not None else ""
            return f"{name(t.var)}.{t.name}{arg}"
        if isinstance(t, Var):
            return name(t)
        if isinstance(t, App):
            return f"{t.symbol.name}({', '.join(go(a) for a in t.args)})"
        if isinstance(t, (Quant, Count, InFlight)):
            names[id(t.var)] = f"_b{len(names)}"
            head = type(t).__name__ + (f"[{t.what}{t.kinds}]" if isinstance(t, InFlight) else "")
            every = f"{t.every}" if isinstance(t, Quant) else ""
            return f"{head}{every}({names[id(t.var)]}: {go(t.body)})"
        if isinstance(t, Op):
            return f"{t.op}({', '.join(go(a) for a in t.args)})"
        raise TypeError(f"cannot name {t!r}")

    text = f"count({t.var.sort.name}: {go(t.body)})"
    return text, free


# --- the initial state ---------------------------------------------------------------------------


def _initial_values() -> dict[str, Any]:
    """Each mutable symbol's value in the spec's initial state (the same for every request and
    page), read through the vocabulary's concrete reading; None where it means nothing there (a
    request, page or tenant)."""
    from kvhandoff.spec.config import default_config
    from kvhandoff.spec.state import initial_state

    config = default_config()
    state = initial_state(config)
    scope = {
        "S": state,
        "C": config,
        "DRAIN": False,
        "_shard": V._shard,
        "_read_pages": V._read_pages,
        "_read_shard": V._read_shard,
    }
    out: dict[str, Any] = {}
    for name, (_args, result) in _BASE.items():
        if name in _ANSWER:
            out[name] = False
            continue
        if result in (REQ, PAGE, TENANT):
            out[name] = None
            continue
        if name in _INSTANCE_VALUED:
            out[name] = INST0
            continue
        source = V.CONCRETE.symbols[name].format("0", "0", "0")
        try:
            value = eval(source, scope)  # the vocabulary's own reading
        except (TypeError, IndexError):  # read only where it means something (an owner's)
            out[name] = None
            continue
        if result in _CODES:
            value = _CODES[result][value]
        out[name] = value
    return out


def init(view: View, fields: dict[str, Any] | None = None) -> Any:
    """The initial state: every symbol at its initial value, nothing sent, no write in flight;
    `fields`: a variant's state fields at theirs."""
    facts = [view[f"field:{n}"]() == _z(v) for n, v in (fields or {}).items()]
    for name, value in _initial_values().items():
        if value is None:
            continue
        args, _result = _BASE[name]
        xs = [_fresh("i", sort) for sort in _arg_sorts(name, args)]
        fact = view[name](*xs) == _z(value)
        facts.append(z3.ForAll(xs, fact) if xs else fact)
    m, w = _fresh("im", Msg), _fresh("iw", Wr)
    facts += [z3.ForAll([m], z3.Not(view["sent"](m))), z3.ForAll([w], z3.Not(view["inflight"](w)))]
    return z3.And(facts)


# --- claims and obligations ----------------------------------------------------------------------


def well_formed(view: View) -> Any:
    """Facts of the spec's types that the model's integers do not carry: phases are codes of
    the spec's phases, and prefill's count of pages written is a natural number. (A claim like
    the others: proved inductive, not assumed.)"""
    r, q = _fresh("wf", Req), _fresh("wf", Page)
    return z3.ForAll(
        [r],
        z3.And(
            view["p"](r) >= 0,
            view["p"](r) < len(P_PHASES),
            view["d"](r) >= 0,
            view["d"](r) < len(D_PHASES),
            view["p_wrote"](r) >= 0,
            # The concrete reading: decode read pages only when it read (`_read_pages`).
            z3.ForAll([q], z3.Implies(view["read_page"](r, q), view["read_done"](r))),
        ),
    )


@cache
def _claim_terms(design: Design) -> tuple[tuple[str, tuple[Term, ...]], ...]:
    """Each invariant of spec/invariants.py the design's proof uses (`invariants_for`: room-keyed
    matching has its own versions of some) as its clauses, and each `ALWAYS` property of
    spec/properties.py, built once per design (so a clause is the same object at every state)."""
    from kvhandoff.spec.invariants import invariants_for
    from kvhandoff.spec.properties import ALWAYS

    out = [(inv.name, tuple(clauses(inv.formula))) for inv in invariants_for(design)]
    for prop in ALWAYS:
        if prop.formula is None:
            raise Untranslatable(f"{prop.name} has no formula")
        # Sent messages stay in this model: a property read over them must only claim
        # something of every one (it then holds of those still in flight).
        _check_no_absence(prop.formula, "property")
        out.append((prop.name, (prop.formula,)))
    return tuple(out)


def claims(
    model: Model,
    view: View,
    tag: str,
    memo: dict[int, Any] | None = None,
    before: dict[int, Any] | None = None,
) -> dict[str, Any]:
    """`well_formed`, each invariant of spec/invariants.py and each `ALWAYS` property of
    spec/properties.py, read over the state `view`. `memo` collects each clause's translation;
    with `before` (a `memo` of the state before the step), a clause that reads nothing the step
    changes (`model.changed`) is that translation again: it is the same formula."""
    out = {"well_formed": well_formed(view)}
    for name, terms in _claim_terms(model.design):
        parts = []
        for t in terms:
            if before is not None and id(t) in before and not (_reads(t) & model.changed):
                parts.append(before[id(t)])
                continue
            value = model.tr(t, view, tag, {})
            if memo is not None:
                memo[id(t)] = value
            parts.append(value)
        out[name] = _z(_and(parts))
    return out


def claims_after(model: Model, cs: dict[str, Any], s: View, s2: View) -> dict[str, Any]:
    """The claims `cs` (over the base state `s`) read over the next state `s2` of the step just
    translated: each symbol the step changes (`model.changed`), and each count whose counted set
    it may change, replaced by its next-state definition (`substitute_funs`, in Z3). The same
    formulas `claims(model, s2, "'")` builds, for a fraction of the cost: the claims are
    translated once, not once per action."""
    pairs = []
    for key in sorted(model.changed):
        decl = _decl(s[key])
        sorts = [decl.domain(i) for i in range(decl.arity())]
        params = [_fresh("sub", srt) for srt in sorts]
        body = _z(s2[key](*params))
        if params:
            body = z3.substitute(body, *[(p, z3.Var(i, p.sort())) for i, p in enumerate(params)])
        pairs.append((decl, body))
    for shape in list(model.counts):
        if model.unchanged(shape, "'"):
            continue
        old = _decl(model.count_fn(shape, ""))
        new = _decl(model.count_fn(shape, "'"))
        sorts = [old.domain(i) for i in range(old.arity())]
        pairs.append((old, new(*[z3.Var(i, srt) for i, srt in enumerate(sorts)])))
    if not pairs:
        return dict(cs)
    return {n: z3.substitute_funs(_z(c), *pairs) for n, c in cs.items()}


def supports(d: Design) -> str | None:
    """Why the derived model cannot represent design d (None when it can): the push path with
    receiver-checked writes (the pull path's lease and one-sided writes' fences need clauses no
    any-size proof here has been shown to hold)."""
    if d.transfer != "push":
        return "the pull path (read-time data, lease expiry) is outside the derived any-size model"
    if d.write_path != "receiver_checked":
        return "one-sided writes and their fences are outside the derived any-size model"
    return None


def actions(design: Design, variant: Variant | None = None) -> list[str]:
    """The model's actions: the rulebook's (with a guard and an effect), then those the variant
    adds."""
    from kvhandoff.spec.machine import RULE_EFFECTS, RULE_GUARDS

    out = [n for n in RULE_GUARDS if n in RULE_EFFECTS]
    if variant is not None:
        out += [snake_case(t.__name__) for t in variant.extra_action_types]
    return out


def step(model: Model, name: str, view: View, tag: str) -> tuple[Any, View, list[Any]]:
    """Action `name`'s guard over `view`, the next state, and the constraints of its effect
    (the variant's formula where it replaces the rulebook's)."""
    from kvhandoff.spec.machine import rule_effect, rule_guard

    gf, ef = model.guards.get(name), model.effects.get(name)
    if (gf is None and name not in model.guards) or (ef is None and name not in model.effects):
        raise Untranslatable(f"action {name!r} has no guard and effect formula")
    gf = gf or rule_guard(model.design, name)
    ef = ef or rule_effect(model.design, name)
    values, _env, guard = model.guard(gf, view, tag)
    new, constraints = model.effect(ef, values, view, tag)
    return guard, new, constraints


_SHARED: dict[tuple[Any, ...], tuple[Model, View]] = {}


def shared_model(design: Design, variant: Variant | None = None) -> tuple[Model, View]:
    """One model (and its base state, tag "") per design or variant, shared by `prove_derived`
    and `Simulator`: the witness check after a proof then reuses the proof's translation of every
    step (`translated_step`) instead of making it again. Keyed by `step` too, so that a test
    that patches the translation gets a model of its own."""
    key = (variant.rules_key() if variant is not None else design, id(step))
    if key not in _SHARED:
        model = Model(design, variant)
        _SHARED[key] = (model, base_view("", model.fields))
    return _SHARED[key]


def translated_step(model: Model, name: str, view: View, tag: str) -> tuple[Any, View, list[Any]]:
    """`step`, remembered on the model per (action, state, tag), with the symbols it changes
    (`model.changed` is set as `step` sets it)."""
    key = (name, id(view), tag)
    if key not in model.translated:
        guard, new, constraints = step(model, name, view, tag)
        model.translated[key] = (guard, new, constraints, set(model.changed), view)
    guard, new, constraints, changed, _view = model.translated[key]
    model.changed = set(changed)
    return guard, new, constraints


def prove_derived(
    design: Design,
    timeout: float | None = 60.0,
    weaken: dict[str, Callable[[Model, View, str], Any]] | None = None,
    only: set[str] | None = None,
    names: Sequence[str] | None = None,
    zero_axiom: bool = False,
    variant: Variant | None = None,
    retries: bool = False,
) -> list[Obligation]:
    """Discharge every obligation of the derived model: initiation and consecution of each
    claim, safety of each property. `weaken` replaces claims
    by name (tests plant a broken one); `only` keeps these claims; `names` these actions;
    `variant` (of this design): its own formulas, actions and state fields (see `Model`).
    `retries`: whether the scenario allows client retries (`Config.max_retries`): the model
    leaves the scenario's numbers free, but without retries the retry's guard never holds, so
    its action is left out (and four invariants are not preserved by it: docs/spec.md)."""
    why = supports(design)
    if why is not None:
        raise Untranslatable(why)
    if zero_axiom:
        model = Model(design, variant)
        model.zero_axiom = True
        s = base_view("", model.fields)
    else:
        model, s = shared_model(design, variant)
    cs = claims(model, s, "")
    if weaken:
        cs.update({n: _z(f(model, s, "")) for n, f in weaken.items()})
    if only is not None:
        cs = {n: c for n, c in cs.items() if n in only}
    inv_all = z3.And(list(cs.values()))
    out: list[Obligation] = []

    def solver() -> Any:
        sv = z3.Solver()
        if timeout is not None:
            sv.set("timeout", max(1, int(timeout * 1000)))
        return sv

    def check(
        sv: Any, kind: str, claim: str, action: str | None, goal: Any, after: View | None
    ) -> None:
        report_obligation("any-size", len(out), kind, claim, action)
        started = time.perf_counter()
        sv.push()
        sv.add(z3.Not(goal))
        # Free instances make a model harder to find than a proof (over them Z3 may search
        # long for a counterexample it finds at once with one instance of each). So ask
        # first, briefly, for a counterexample on one instance of each: that query is the
        # same one narrowed (each of its models is one of the general query's), so `sat`
        # there is a real failure; otherwise the general query decides.
        sv.push()
        sv.add(*_one_instance_facts(s))
        sv.set("timeout", NARROW_MS if timeout is None else min(NARROW_MS, int(timeout * 1000)))
        if sv.check() == z3.sat:
            cex = describe(sv.model(), s, after)
            seconds = time.perf_counter() - started
            out.append(Obligation(kind, claim, action, "failed", seconds, cex))
            sv.pop()
            sv.pop()
            return
        sv.pop()
        sv.set("timeout", 4294967295 if timeout is None else max(1, int(timeout * 1000)))
        answer = sv.check()
        seconds = time.perf_counter() - started
        if answer == z3.unsat:
            out.append(Obligation(kind, claim, action, "proved", seconds))
        elif answer == z3.sat:
            cex = describe(sv.model(), s, after)
            out.append(Obligation(kind, claim, action, "failed", seconds, cex))
        else:
            out.append(Obligation(kind, claim, action, "unknown", seconds))
        sv.pop()

    sv = solver()
    sv.add(init(s, model.fields), *model.count_axioms([(s, "")]))
    for name, claim in cs.items():
        check(sv, "initiation", name, None, claim, None)
    if names is None:
        names = [n for n in actions(design, variant) if retries or n != "router_retry_request"]
    for name in names:
        guard, s2, constraints = translated_step(model, name, s, "")
        after = claims_after(model, cs, s, s2)
        if weaken:
            after.update({n: _z(f(model, s2, "'")) for n, f in weaken.items()})
        sv = solver()
        sv.add(inv_all, _z(guard), *constraints)
        sv.add(*model.count_axioms([(s, ""), (s2, "'")]))
        for claim_name in cs:
            if z3.eq(_z(after[claim_name]), _z(cs[claim_name])):
                # The step changes nothing the claim reads: its next-state formula is the very
                # formula assumed before the step (the same Z3 term), so the obligation holds
                # without asking the solver (which would only find that out, 600 times).
                out.append(Obligation("consecution", claim_name, name, "proved", 0.0))
                continue
            check(sv, "consecution", claim_name, name, after[claim_name], s2)
    sv = solver()
    sv.add(inv_all)
    for name in cs:
        if name in _property_names():
            check(sv, "safety", name, None, cs[name], None)
    return out


def report_obligation(stage: str, done: int, kind: str, claim: str, action: str | None) -> None:
    """Tell the progress display (`model_checker.progress`) which obligation a proof asks the
    solver next and how many it has settled: a proof runs for minutes, and one obligation can
    take up to the solver's limit; Ctrl-C then says how far it got."""
    what = f"{kind} of {claim}" + (f" under {action}" if action else "")
    progress.report("prove", stage=stage, obligations=done, checking=what)


def _property_names() -> set[str]:
    from kvhandoff.spec.properties import ALWAYS

    return {p.name for p in ALWAYS}


def describe(model: Any, s: View, s2: View | None) -> dict[str, Any]:
    """A readable finite counterexample to induction: sort sizes and some function tables."""
    out: dict[str, Any] = {}
    for sort in (Req, Page, Tenant, Msg, Wr):
        universe = model.get_universe(sort)
        out[f"{sort}s"] = 0 if universe is None else len(universe)
    reqs = model.get_universe(Req) or []
    pages = model.get_universe(Page) or []
    for label, st in (("before", s), ("after", s2)):
        if st is None:
            continue
        table: dict[str, Any] = {}
        for name in ("submitted", "d", "p", "d_gen", "p_gen", "p_wrote", "not_as_is", "ans_set"):
            table[name] = {
                str(x): _show(name, model.eval(_z(st[name](x)), model_completion=True))
                for x in reqs
            }
        for name in ("owned", "owner", "owner_gen", "shard_has", "shard_req", "shard_gen"):
            table[name] = {
                str(x): str(model.eval(_z(st[name](x)), model_completion=True)) for x in pages
            }
        table["d_holds"] = [
            f"{x}:{y}"
            for x in reqs
            for y in pages
            if z3.is_true(model.eval(_z(st["d_holds"](x, y)), model_completion=True))
        ]
        table["next_gen"] = {
            str(i): str(model.eval(_z(st["next_gen"](i)), model_completion=True))
            for i in model.get_universe(Inst) or [INST0]
        }
        table["d_inst"] = {
            str(x): str(model.eval(RIGID.f["d_inst"](x), model_completion=True)) for x in reqs
        }
        out[label] = table
    return out


def _show(name: str, value: Any) -> str:
    names: tuple[str, ...] | None = {"d": D_PHASES, "p": P_PHASES}.get(name)
    if names is not None and z3.is_int_value(value):
        code = int(value.as_long())
        if 0 <= code < len(names):
            return names[code]
    return str(value)


# --- the simulation check: spec steps are steps of the derived model ----------------------------


_READING_CODE: dict[tuple[Any, ...], Any] = {}
"""The vocabulary's concrete reading of each symbol at each entry, compiled once."""

_MEANINGFUL: dict[str, tuple[str, ...]] = {
    "shard_req": ("shard_has",),
    "shard_gen": ("shard_has",),
    "read_has": ("read_page",),
    "read_req": ("read_page", "read_has"),
    "read_gen": ("read_page", "read_has"),
    "accepted_full": ("accepted_set",),
    "pending_ack_gen": ("pending_ack",),
}
"""Entries the spec's state gives a value only where another symbol holds (a zeroed shard has
no writer; what decode read exists only for the pages it read): α leaves them free elsewhere
(the concrete reading's default there, request 0 or generation 0, is no fact of the state)."""


class Simulator:
    """Does the derived model cover the spec? For an edge `before --a--> after` of the explorer's
    graph it asks whether the model's step `a` (its parameters free) takes α(before), a state
    inside every claim, to a state that agrees with α(after): α reads every mutable symbol of
    the spec state through the vocabulary's concrete reading, over a universe of exactly the
    config's requests and pages; the messages in the network or lost are `sent` (after the step,
    among those sent: the model keeps messages), the writes in flight exactly `inflight`, a
    variant's state fields their values. Counts are left to the model's own facts. `unsat` is a
    divergence: a spec step the model cannot take, or a reachable state outside the claims.

    With a `variant`, the model is the variant's (`Model(design, variant)`: its formulas, added
    actions and state fields). The same edges are asked many times over (the witness check
    replays paths that share their first steps), so each state's reading, each action's step
    and the claims are built once."""

    def __init__(self, design: Design, config: Any, variant: Variant | None = None) -> None:
        why = supports(design)
        if why is not None:
            raise Untranslatable(why)
        if config.prefill_ranks != 1:
            raise Untranslatable("the derived any-size model has one prefill rank")
        self.design, self.config = design, config
        self.model, self._before = shared_model(design, variant)
        self.drain = design.drain_fenced
        n, m = len(config.requests), config.decode_pages
        self.reqs = [z3.Const(f"R{i}", Req) for i in range(n)]
        self.pages = [z3.Const(f"Q{j}", Page) for j in range(m)]
        tenants = sorted({r.tenant for r in config.requests} | {"other"})
        self.tenants = {t: z3.Const(f"T_{t}", Tenant) for t in tenants}
        x, q = z3.Const("u_r", Req), z3.Const("u_q", Page)
        self.axioms: list[Any] = [
            z3.Distinct(*self.reqs) if n > 1 else z3.BoolVal(True),
            z3.Distinct(*self.pages) if m > 1 else z3.BoolVal(True),
            z3.Distinct(*self.tenants.values()),
            z3.ForAll([x], z3.Or([x == r for r in self.reqs])),
            z3.ForAll([q], z3.Or([q == p for p in self.pages])),
        ]
        # The scenario's decode instances: where `next_gen` has an entry.
        self._domains = {
            REQ: range(n),
            PAGE: range(m),
            INT: range(config.decode_instances),
            PINST: range(config.prefill_instances),
            DINST: range(config.decode_instances),
        }
        k = max(config.prefill_instances, config.decode_instances)
        self.insts = [z3.Const(f"I{i}", Inst) for i in range(k)]
        u_i = z3.Const("u_i", Inst)
        self.axioms += [
            z3.Distinct(*self.insts) if k > 1 else z3.BoolVal(True),
            z3.ForAll([u_i], z3.Or([u_i == i for i in self.insts])),
            INST0 == self.insts[0],  # instance 0, the spec's, as the model names it
        ]
        self.with_claims = True
        """Ask that the state before lie inside every claim (off for a variant whose claims
        fail on reachable states: its steps are then checked alone)."""
        self._next = base_view("@1", self.model.fields)
        self._readings: dict[Any, dict[tuple[str, tuple[int, ...]], Any]] = {}
        self._pins: dict[Any, list[Any]] = {}
        self._apps: dict[tuple[int, tuple[str, tuple[int, ...]]], Any] = {}
        self._values: dict[tuple[Sort | None, Any], Any] = {}
        """Each value's term, by its sort (None: a state field's bool or int)."""
        self._steps: dict[str, tuple[Any, View, list[Any], set[str]]] = {}
        self._claims: list[Any] | None = None
        self._rigid_facts: list[Any] | None = None
        self._init: Any = None

    def _value(self, name: str, args: tuple[int, ...], state: Any) -> Any:
        """The symbol's concrete value at `args` (a rank argument is rank 0)."""
        symbol = _SYMBOLS[name]
        full = []
        rest = iter(args)
        for sort in symbol.args:
            full.append(0 if sort == RANK else next(rest))  # rank 0
        code = _READING_CODE.get((name, *full))
        if code is None:
            source = V.CONCRETE.symbols[name].format(*map(str, full))
            code = _READING_CODE[(name, *full)] = compile(source, f"<{name}>", "eval")
        scope = {
            "S": state,
            "C": self.config,
            "DRAIN": self.drain,
            "_shard": V._shard,
            "_read_pages": V._read_pages,
            "_read_shard": V._read_shard,
        }
        try:
            return eval(code, scope)  # the vocabulary's own reading
        except (TypeError, IndexError):
            return None  # meaningless here (the owner of a free page)

    def _term(self, value: Any, sort: Sort) -> Any:
        if value is None:
            return None
        if sort == REQ:
            return self.reqs[value] if 0 <= value < len(self.reqs) else None
        if sort == PAGE:
            return self.pages[value]
        if sort == TENANT:
            return self.tenants.get(value)
        if sort in _CODES:
            return z3.IntVal(_CODES[sort][value])
        return _z(value)

    def _zargs(self, name: str, entry: tuple[int, ...], args: tuple[Sort, ...]) -> list[Any]:
        """The terms of an entry's arguments (`next_gen`'s is an instance)."""
        if name in _INSTANCE_INDEXED:
            return [self.insts[i] for i in entry]
        return [self._term(i, a) for i, a in zip(entry, args, strict=True)]

    def _entries(self, args: tuple[Sort, ...]) -> list[tuple[int, ...]]:
        return list(itertools.product(*(self._domains[a] for a in args)))

    def _meaningless(self, value: Any, sort: Sort) -> bool:
        """A value `_term` has no term for (no request, an unknown tenant)."""
        if value is None:
            return True
        if sort == REQ:
            return not 0 <= value < len(self.reqs)
        return sort == TENANT and value not in self.tenants

    def _reading(self, state: Any) -> dict[tuple[str, tuple[int, ...]], Any]:
        """α(state): each mutable symbol's value at each entry where the spec gives it one (an
        entry `_MEANINGFUL` leaves free is absent), and each state field's value (entry ())."""
        if state in self._readings:
            return self._readings[state]
        out: dict[tuple[str, tuple[int, ...]], Any] = {}
        concrete = {"ans_set": "answered", "ans_ok": "answered_ok"}
        for name, (args, _result) in _BASE.items():
            for entry in self._entries(args):
                if not all(self._value(g, entry, state) for g in _MEANINGFUL.get(name, ())):
                    continue  # what the spec reads only where another symbol holds
                if name == "ans_timeout":
                    value = self._value("timed_out_waiting", entry, state)
                else:
                    value = self._value(concrete.get(name, name), entry, state)
                if self._meaningless(value, _result):
                    continue
                out[(name, entry)] = value
        fields = dict(getattr(state, "variant_fields", ()))
        for name, initial in self.model.fields.items():
            out[(f"field:{name}", ())] = fields.get(name, initial)
        self._readings[state] = out
        return out

    def _pin(self, view: View, key: tuple[str, tuple[int, ...]], value: Any) -> Any:
        """`view`'s symbol at the entry equals the concrete value (None: no such value). The
        applications and values are made once: the witness check pins thousands."""
        app = self._apps.get((id(view), key))
        if app is None:
            name, entry = key
            if name.startswith("field:"):
                app = _z(view[name]())
            else:
                args = _BASE[name][0]
                zargs = self._zargs(name, entry, args)
                app = _z(view[name](*zargs))
            self._apps[(id(view), key)] = app
        if key[0] in _INSTANCE_VALUED:
            return app == self.insts[value]
        field = key[0].startswith("field:")
        sort = None if field else _BASE[key[0]][1]
        term = self._values.get((sort, value))
        if term is None:
            term = _z(value) if sort is None else self._term(value, sort)
            if term is None:
                return None
            self._values[(sort, value)] = term
        return app == term

    def _pinned(self, state: Any) -> list[Any]:
        """α(state) over the state before the step, with its messages and writes."""
        if state in self._pins:
            return self._pins[state]
        s = self._before
        pins = (self._pin(s, key, value) for key, value in self._reading(state).items())
        out = [p for p in pins if p is not None]  # a Z3 term's truth value is costly to ask
        msgs = [z3.Const(f"M{k}", Msg) for k in range(len(state.network) + len(state.lost))]
        for x, msg in zip(msgs, (*state.network, *state.lost), strict=True):
            out += [s["sent"](x), self._message(x, msg)]
        y = z3.Const("u_m", Msg)
        out.append(z3.ForAll([y], z3.Implies(s["sent"](y), z3.Or([y == x for x in msgs]))))
        wrs = [z3.Const(f"W{k}", Wr) for k in range(len(state.writes))]
        for x, w in zip(wrs, state.writes, strict=True):
            out += [s["inflight"](x), self._write(x, w)]
        if len(wrs) > 1:
            out.append(z3.Distinct(*wrs))
        v = z3.Const("u_w", Wr)
        out.append(z3.ForAll([v], z3.Implies(s["inflight"](v), z3.Or([v == x for x in wrs]))))
        self._pins[state] = out
        return out

    def _rigid(self, state: Any) -> list[Any]:
        out = []
        for name, (args, result) in _RIGID.items():
            f = RIGID.f[name]
            for entry in self._entries(args):
                value = self._value(name, entry, state)
                term = self.insts[value] if name in _INSTANCE_TERMS else self._term(value, result)
                if term is not None:
                    zargs = self._zargs(name, entry, args)
                    out.append((f(*zargs) if zargs else f) == term)
        for sort, items in ((Req, self.reqs), (Page, self.pages)):
            for i, a in enumerate(items):
                for j, b in enumerate(items):
                    out.append(RIGID.lt[sort](a, b) == (i < j))
        return out

    def _message(self, x: Any, m: Any) -> Any:
        f, fp = RIGID.msg, RIGID.msg_page
        facts = [
            f["kind"](x) == _KINDS.index(m.kind),
            f["req"](x) == self.reqs[m.request],
            f["gen"](x) == m.generation,
            f["epoch"](x) == m.epoch,
            f["count"](x) == m.count,
            f["has_digest"](x) == (m.digest is not None),
            f["attempt"](x) == m.attempt,
            f["dinst"](x) == self.insts[m.dinst],
        ]
        if m.reason:
            facts.append(f["reason"](x) == FAILURE_REASONS.index(m.reason))
        for j, q in enumerate(self.pages):
            facts.append(fp["has_page"](x, q) == (j in m.pages))
            covered = (j, m.request, m.generation) in (m.digest or ())
            facts.append(fp["digest_page"](x, q) == covered)
        return z3.And(facts)

    def _write(self, x: Any, w: Any) -> Any:
        f = RIGID.wr
        right_tenant = w.data.tenant == self.config.requests[w.data.request].tenant
        return z3.And(
            f["req"](x) == self.reqs[w.data.request],
            f["page"](x) == self.pages[w.page],
            f["gen"](x) == w.generation,
            f["data_gen"](x) == w.data.generation,
            f["epoch"](x) == w.epoch,
            f["room"](x) == w.room,
            f["right_tenant"](x) == right_tenant,
        )

    def _step(self, name: str) -> tuple[Any, View, list[Any], set[str]]:
        """Action `name` over the state before (translated once): guard, next state,
        constraints (the effect's, the count facts and the next state named `@1`: each symbol
        the step changes equal to its new value), and the symbols it changes."""
        if name not in self._steps:
            model, s, s1 = self.model, self._before, self._next
            guard, s2, constraints = translated_step(model, name, s, "")
            changed = set(model.changed)
            # Ground, over the config's requests and pages: a quantified equation here sends
            # the solver into model-based instantiation (seconds on a completion's step).
            named = []
            for key in sorted(changed - {"sent", "inflight"}):
                if key.startswith("field:"):
                    named.append(_z(s1[key]()) == _z(s2[key]()))
                    continue
                args = _BASE[key][0]
                for entry in self._entries(args):
                    zargs = self._zargs(key, entry, args)
                    named.append(_z(s1[key](*zargs)) == _z(s2[key](*zargs)))
            counts = model.count_axioms([(s, ""), (s2, "'")])
            self._steps[name] = (_z(guard), s2, [*constraints, *named, *counts], changed)
        return self._steps[name]

    def check_step(
        self,
        before: Any,
        action: Any,
        after: Any,
        *,
        initial: bool = False,
        holds_after: Sequence[Any] = (),
    ) -> str | None:
        """None when the model's step covers the edge, else why not. With `initial`, α(before)
        must also be the model's initial state; `holds_after`: formulas (over the next state,
        `self.after(...)`) that must hold there too (the witness check's witnesses)."""
        from kvhandoff.spec.actions import action_name

        name = action_name(action)
        model = self.model
        s = self._before
        guard, s2, constraints, changed = self._step(name)
        before_reading, after_reading = self._reading(before), self._reading(after)
        after_pins: list[Any] = []
        for key, value in after_reading.items():
            symbol = key[0]
            if symbol not in changed and key in before_reading:
                # The step leaves this symbol as it was: the spec must too.
                if before_reading[key] != value:
                    return (
                        f"{name}: the spec changes {symbol}{list(key[1])} from "
                        f"{before_reading[key]!r} to {value!r}, the model's step leaves it"
                    )
                continue
            pin = self._pin(self._next if symbol in changed else s, key, value)
            if pin is not None:
                after_pins.append(pin)
        sv = z3.Solver()
        sv.set("timeout", 60_000)
        if self._rigid_facts is None:
            self._rigid_facts = self._rigid(before)
        sv.add(*self.axioms, *self._rigid_facts, *self._pinned(before))
        if initial:
            if self._init is None:
                self._init = init(s, model.fields)
            sv.add(self._init)
        if self.with_claims:
            if self._claims is None:
                self._claims = list(claims(model, s, "").values())
            sv.add(*self._claims)
        sv.add(guard, *constraints, *after_pins, *holds_after)
        for k, m in enumerate((*after.network, *after.lost)):
            x = z3.Const(f"M'{k}", Msg)
            sv.add(s2["sent"](x), self._message(x, m))
        after_w = [z3.Const(f"W'{k}", Wr) for k in range(len(after.writes))]
        for x, w in zip(after_w, after.writes, strict=True):
            sv.add(s2["inflight"](x), self._write(x, w))
        if len(after_w) > 1:
            sv.add(z3.Distinct(*after_w))
        v2 = z3.Const("u_w2", Wr)
        sv.add(
            z3.ForAll(
                [v2],
                z3.Implies(s2["inflight"](v2), z3.Or([self._write(v2, w) for w in after.writes])),
            )
        )
        answer = sv.check()
        if answer == z3.sat:
            return None
        if answer == z3.unknown:
            return f"{name}: solver answered unknown ({sv.reason_unknown()})"
        what = f"{action!r}" + (" as the first step" if initial else "")
        if holds_after:
            what += " to a state where the witness holds"
        where = " from a state inside its claims" if self.with_claims else ""
        return f"{name}: the derived model cannot take {what}{where}"

    def after(self, action: Any, formula: Any) -> Any:
        """A formula of `spec/properties.py` read over the state after the model's step
        `action` (for `check_step(..., holds_after=...)`)."""
        from kvhandoff.spec.actions import action_name

        _guard, s2, _constraints, changed = self._step(action_name(action))
        self.model.changed = changed  # a count the step leaves alone is the one before
        return _z(self.model.tr(formula, s2, "'", {}))


__all__ = ["Model", "Simulator", "actions", "claims", "init", "prove_derived", "step", "supports"]
