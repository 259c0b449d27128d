"""The rulebook's guards compiled to one Python function per variant.

`spec/machine.py` states each guard as a formula over the vocabulary (`rule_guard`); the Z3
engines translate those formulas, and this module turns them into the explorer's `enabled`: one
generated Python function per variant that lists every enabled action in the rulebook's order.
Why one function and not one call per guard: the explorer asks for every state it visits, and a
state has about thirty guards; one function reads the state's sizes and sorts its messages once,
evaluates the conditions a guard states about no request (the router's load, a fault budget) once
per guard instead of once per request, and binds everything it calls as a local name. It is how
the formulas run at least as fast as the Python guards they replaced did (retired after 6dda962;
`benchmarks/against.py`).

The order is the rulebook's, group by group (`machine.PROTOCOL_GROUPS`, then `FAULT_GROUPS`
while the fault budget lasts): within a group, request by request, each of the group's kinds in
turn (so an admission lists, per request, the admit or the reject its prompt gets). Breadth-first
search, and so which shortest counterexample is found first, depends on that order.

A variant's overrides keep the places the Python guards gave them: a kind whose guard a variant
replaced is listed after the kinds of its group it kept, by the variant's formula (compiled in
place) or by its Python function (called, and its actions checked for their kind); the variant's
added actions come after the protocol's steps, before the faults.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections.abc import Callable
from typing import Any

from kvhandoff.spec.logic import (
    FALSE,
    TRUE,
    And,
    App,
    Count,
    Field,
    GuardFormula,
    InFlight,
    Lit,
    Op,
    Or,
    Quant,
    Term,
    Var,
    python_source,
)
from kvhandoff.spec.state import State

Enabled = Callable[[Any, State], list[Any]]


def _mentions(t: Term, names: set[int]) -> bool:
    """Whether `t` reads one of the variables whose ids are in `names`."""
    if isinstance(t, Var):
        return id(t) in names
    if isinstance(t, (Op, App)):
        return any(_mentions(a, names) for a in t.args)
    if isinstance(t, (Quant, Count, InFlight)):
        return _mentions(t.body, names)
    if isinstance(t, Field):
        return id(t.var) in names or (t.arg is not None and _mentions(t.arg, names))
    return False


def _conjuncts(t: Term) -> list[Term]:
    if isinstance(t, Op) and t.op == "and":
        return [c for a in t.args for c in _conjuncts(a)]
    return [t]


def _split_terms(formula: GuardFormula) -> tuple[Term, Term]:
    """The guard as (what it states about no argument, what it states about its arguments)."""
    params = {id(v) for v in formula.params}
    fixed: list[Term] = []
    varying: list[Term] = []
    for c in _conjuncts(formula.formula):
        (varying if _mentions(c, params) else fixed).append(c)
    return And(*fixed), And(*varying)


def _split(formula: GuardFormula, config: Any = None, drain: bool = False) -> tuple[str, str]:
    """`_split_terms` as Python source (with what `config` fixes folded, if given). The first
    is evaluated once, before the loop over the arguments."""
    from kvhandoff.spec.vocabulary import CONCRETE

    parts = _split_terms(formula)
    if config is not None:
        parts = (fold(parts[0], config, drain), fold(parts[1], config, drain))
    return python_source(parts[0], CONCRETE), python_source(parts[1], CONCRETE)


# --- partial evaluation: what the scenario fixes, folded before the code is made ----------------
#
# The rigid symbols (the scenario's: a prompt's length against a limit, a request's room and
# tenant, the fault budgets, the order requests go in) are constants for one configuration, and so
# is every request, page and rank index when a loop over them is unrolled. A term whose parts are
# all constants is computed once, when the code is made; a quantifier over a few elements becomes
# the conjunction (disjunction, sum) of its instances, most of which then fold away. What is left
# reads the state.

_UNROLL = 8
"""Sorts with at most this many elements are unrolled; a larger scenario (the log validator's
dozens of requests) keeps its loops."""

_WARM = 64
"""How many times an effect is taken, read from its formula, before it is compiled."""

_PY_OP: dict[str, Callable[..., Any]] = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "in": lambda a, b: a in b,
    "not": lambda a: not a,
    "implies": lambda a, b: (not a) or b,
    "ite": lambda c, a, b: a if c else b,
}


def _rigid(name: str) -> str | None:
    """The concrete reading of symbol `name` if it reads only the configuration (and the design
    flag): a constant, once its arguments are."""
    from kvhandoff.spec.vocabulary import CONCRETE

    fmt = CONCRETE.symbols.get(name)
    if fmt is None or "S." in fmt or "S[" in fmt or "_shard" in fmt or "_read" in fmt:
        return None
    return fmt


def _sizes(config: Any) -> dict[str, int]:
    return {
        "Req": len(config.requests),
        "Page": config.decode_pages,
        "Rank": config.prefill_ranks,
    }


def _one_instance(config: Any) -> frozenset[str]:
    """The instance-valued symbols (and the message field `dinst`) that are 0 everywhere in
    `config`, because it has one instance of their kind: folded away, so that a one-instance
    scenario runs the code it ran before instances were modelled."""
    out: set[str] = set()
    if config.decode_instances == 1:
        out |= {"d_inst", "page_inst", "p_dinst", "dinst"}
    if config.prefill_instances == 1:
        out.add("p_inst")
    return frozenset(out)


def fold(t: Term, config: Any, drain: bool, env: dict[int, int] | None = None) -> Term:
    """`t` with what `config` fixes computed (`env` gives some variables a value: the elements
    of unrolled loops)."""
    env = env or {}
    sizes = _sizes(config)
    one_instance = _one_instance(config)

    def go(t: Term) -> Term:
        if isinstance(t, Lit):
            return t
        if isinstance(t, Var):
            return Lit(env[id(t)], t.sort) if id(t) in env else t
        if isinstance(t, App):
            from kvhandoff.spec.logic import FieldSymbol

            if t.symbol.name in one_instance:
                return Lit(0, t.sort)  # the only instance (see `_one_instance`)
            args = tuple(go(a) for a in t.args)
            fmt = None if isinstance(t.symbol, FieldSymbol) else _rigid(t.symbol.name)
            if fmt is not None and all(isinstance(a, Lit) for a in args):
                source = fmt.format(*(repr(a.value) for a in args))  # type: ignore[attr-defined]
                return Lit(eval(source, {"C": config, "DRAIN": drain}), t.sort)
            if all(a is b for a, b in zip(args, t.args, strict=True)):
                return t
            return App(t.symbol, args)
        if isinstance(t, Op):
            args = tuple(go(a) for a in t.args)
            if all(isinstance(a, Lit) for a in args) and t.op in _PY_OP:
                values = [a.value for a in args]  # type: ignore[attr-defined]
                return Lit(_PY_OP[t.op](*values), t.sort)
            if t.op == "and" and all(isinstance(a, Lit) for a in args):
                return TRUE if all(a.value for a in args) else FALSE  # type: ignore[attr-defined]
            if t.op == "or" and all(isinstance(a, Lit) for a in args):
                return TRUE if any(a.value for a in args) else FALSE  # type: ignore[attr-defined]
            same = all(a is b for a, b in zip(args, t.args, strict=True))
            return _simplified(t if same else Op(t.op, args, t.sort))
        if isinstance(t, (Quant, Count)) and sizes.get(t.var.sort.name, _UNROLL + 1) <= _UNROLL:
            parts = []
            for i in range(sizes[t.var.sort.name]):
                env[id(t.var)] = i
                parts.append(go(t.body))
            env.pop(id(t.var), None)
            if isinstance(t, Count):
                total = Lit(sum(1 for x in parts if isinstance(x, Lit) and x.value), t.sort)
                rest = [x for x in parts if not isinstance(x, Lit)]
                out: Term = total
                for x in rest:
                    out = Op(
                        "add", (out, Op("ite", (x, Lit(1, t.sort), Lit(0, t.sort)), t.sort)), t.sort
                    )
                return out
            return _simplified(And(*parts) if t.every else Or(*parts))
        if isinstance(t, Quant):
            body = go(t.body)
            return t if body is t.body else _simplified(Quant(t.every, t.var, body))
        if isinstance(t, Count):
            body = go(t.body)
            return t if body is t.body else Count(t.var, body)
        if isinstance(t, InFlight):
            body = go(t.body)
            return t if body is t.body else InFlight(t.what, t.kinds, t.var, body)
        if isinstance(t, Field) and t.name == "dinst" and "dinst" in one_instance:
            return Lit(0, t.sort)
        if isinstance(t, Field) and t.arg is not None:
            arg = go(t.arg)
            return t if arg is t.arg else Field(t.var, t.name, t.sort, arg)
        return t

    return go(t)


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {}
        self.count = 0

    def bind(self, value: Any, hint: str) -> str:
        """A local name for `value` in the generated function (a default argument: a fast
        local, not a global lookup)."""
        name = f"{hint}{len(self.names)}"
        self.names[name] = value
        return name

    def local(self, hint: str) -> str:
        self.count += 1
        return f"_{hint}{self.count}"

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)


def _shape(formula: GuardFormula, kind: type) -> str:
    """How the guard's arguments range: over nothing, instances (one, or a pair), requests,
    (request, rank) pairs, drain acks owed, writes in flight, or messages."""
    from kvhandoff.spec.variants import is_instance_step

    fields = [f.name for f in dataclasses.fields(kind)]
    if not formula.params:
        return "none"
    if is_instance_step(formula):
        return "instances"
    if formula.source == "writes":
        return "writes"
    if formula.source:
        return "messages"
    if len(formula.params) == 2 and "generation" in fields:
        return "drain_acks"
    if len(formula.params) == 2:
        return "ranks"
    return "requests"


def _pool(formula: GuardFormula) -> str:
    if formula.source == "writes":
        return "_writes"
    return "_network" if formula.source == "network" else "_lost"


def _emit_unrolled(
    out: _Writer,
    depth: int,
    entries: list[tuple[GuardFormula, type]],
    shape: str,
    config: Any,
    drain: bool,
) -> None:
    """`_emit_loop` for one configuration, its loop over requests (and ranks) unrolled: each
    request's instance of each guard with what the scenario fixes folded, and its action made
    once, when the code is."""
    from kvhandoff.spec.vocabulary import CONCRETE

    cases = []
    for f, kind in entries:
        fixed, varying = _split_terms(f)
        fixed = fold(fixed, config, drain)
        if fixed is FALSE or (isinstance(fixed, Lit) and fixed.value is False):
            continue
        guard = ""
        if not (isinstance(fixed, Lit) and fixed.value is True):
            guard = out.local("ok")
            out.emit(depth, f"{guard} = {python_source(fixed, CONCRETE)}")
        cases.append((guard, varying, kind, f))
    ranks = range(config.prefill_ranks) if shape == "ranks" else [None]
    for r in range(len(config.requests)):
        for k in ranks:
            for guard, varying, kind, f in cases:
                env = {id(f.params[0]): r}
                if k is not None:
                    env[id(f.params[1])] = k
                test = fold(varying, config, drain, env)
                if isinstance(test, Lit) and not test.value:
                    continue
                action = out.bind(kind(r) if k is None else kind(r, k), "A")
                parts = [x for x in (guard, python_source(test, CONCRETE)) if x and x != "True"]
                if parts:
                    out.emit(depth, f"if {' and '.join(parts)}:")
                    out.emit(depth + 1, f"add({action})")
                else:
                    out.emit(depth, f"add({action})")


def _emit_instances(
    out: _Writer,
    depth: int,
    entries: list[tuple[GuardFormula, type]],
    config: Any,
    drain: bool,
) -> None:
    """The actions of steps of one instance (or pair): for one configuration, each instance's
    guard with the instance folded in (one instance of each: the one-instance model's guard);
    otherwise a loop over the instances the configuration has."""
    from kvhandoff.spec.logic import PINST
    from kvhandoff.spec.variants import instance_arguments
    from kvhandoff.spec.vocabulary import CONCRETE

    for f, kind in entries:
        if config is not None:
            for values in instance_arguments(f, config):
                env = {id(p): v for p, v in zip(f.params, values, strict=True)}
                folded = fold(f.formula, config, drain, env)
                if isinstance(folded, Lit) and not folded.value:
                    continue
                action = out.bind(kind(*values), "A")
                source = python_source(folded, CONCRETE)
                if source == "True":
                    out.emit(depth, f"add({action})")
                else:
                    out.emit(depth, f"if {source}:")
                    out.emit(depth + 1, f"add({action})")
            continue
        k = out.bind(kind, "K")
        test = python_source(f.formula, CONCRETE)
        d = depth
        names = []
        for p in f.params:
            name = out.local("i")
            count = "C.prefill_instances" if p.sort == PINST else "C.decode_instances"
            out.emit(d, f"for {name} in range({count}):")
            test = re.sub(rf"\b{p.name}\b", name, test)
            names.append(name)
            d += 1
        out.emit(d, f"if {test}:")
        out.emit(d + 1, f"add({k}({', '.join(names)}))")


def _emit_loop(
    out: _Writer,
    depth: int,
    entries: list[tuple[GuardFormula, type]],
    shape: str,
    config: Any = None,
    drain: bool = False,
) -> None:
    """The actions of `entries` (formulas of the same shape), argument by argument, each kind in
    turn."""
    if shape == "instances":
        _emit_instances(out, depth, entries, config, drain)
        return
    if (
        config is not None
        and shape in ("requests", "ranks")
        and len(config.requests) * config.prefill_ranks <= _UNROLL
    ):
        _emit_unrolled(out, depth, entries, shape, config, drain)
        return
    split = [(_split(f, config, drain), f, k) for f, k in entries]
    conds = [(*sp, out.bind(k, "K"), f) for sp, f, k in split if sp[0] != "False"]
    if not conds:
        return  # no state enables them (a step the design does not have)
    if shape == "none":
        for fx, vary, k, _ in conds:
            test = " and ".join(x for x in (fx, vary) if x != "True") or "True"
            out.emit(depth, f"if {test}:")
            out.emit(depth + 1, f"add({k}())")
        return
    # What a guard states about no argument is evaluated once: where every guard of the loop
    # fails it, the loop is skipped.
    guards = []
    for fx, _, _, _ in conds:
        if fx == "True":
            guards.append("")
            continue
        g = out.local("ok")
        out.emit(depth, f"{g} = {fx}")
        guards.append(g)
    if all(guards):
        out.emit(depth, f"if {' or '.join(guards)}:")
        depth += 1
    a, b, row = out.local("a"), out.local("b"), out.local("R")
    if shape == "requests":
        out.emit(depth, f"for {a}, {row} in enumerate(S.requests):")
        made = f"({a})"
    elif shape == "ranks":
        out.emit(depth, f"for {a}, {row} in enumerate(S.requests):")
        depth += 1
        out.emit(depth, f"for {b} in _ranks:")
        made = f"({a}, {b})"
    elif shape == "drain_acks":
        out.emit(depth, f"for _room, _gen, {a} in S.pending_acks:")
        depth += 1
        out.emit(depth, f"for {b} in _ranks:")
        made = f"(_room, _gen, {b})"
        if config is None or config.decode_instances > 1:
            # Which decode instance the abort came from (`PrefillSendAbortAck.dinst`).
            made = f"(_room, _gen, {b}, _ack_dinst(C, S, {a}))"
    else:
        first = entries[0][0]
        kinds = first.kinds
        out.emit(depth, f"for {a} in {_pool(first)}:")
        if kinds:
            depth += 1
            test = f"{a}.kind == {kinds[0]!r}" if len(kinds) == 1 else f"{a}.kind in {kinds!r}"
            out.emit(depth, f"if {test}:")
        made = f"({a})"
    depth += 1
    for g, (_, vary, k, f) in zip(guards, conds, strict=True):
        # Each formula names its own arguments: they are the loop's (and a request's row of the
        # state is read once per request, not once per symbol).
        if shape in ("requests", "ranks"):
            vary = vary.replace(f"S.requests[{f.params[0].name}]", row)
        for param, value in zip(f.params, (a, b), strict=False):
            vary = re.sub(rf"\b{param.name}\b", value, vary)
        test = " and ".join(x for x in (g, vary) if x and x != "True") or "True"
        if test == "True":
            out.emit(depth, f"add({k}{made})")
        else:
            out.emit(depth, f"if {test}:")
            out.emit(depth + 1, f"add({k}{made})")


def _effects() -> Any:
    """`spec.effects` (which imports this module: imported when first needed)."""
    from kvhandoff.spec import effects

    return effects


def _checked(hook: Callable[..., Any], kind: type, name: str, variant: str) -> Callable[..., Any]:
    def listed(config: Any, state: State) -> list[Any]:
        actions = list(hook(config, state))
        for action in actions:
            if type(action) is not kind:
                raise TypeError(
                    f"variant {variant!r}: guard_overrides[{name!r}] listed {action!r}, which is "
                    f"not a {kind.__name__}"
                )
        return actions

    return listed


def compile_enabled(variant: Any, config: Any = None) -> Enabled:
    """`enabled(config, state)` for `variant`: every action whose guard holds, protocol steps
    first, faults last, in the rulebook's order (see the module's docstring). Given a `config`,
    the function is made for that configuration alone (`fold`): it must be called with it."""
    from kvhandoff.spec.actions import snake_case
    from kvhandoff.spec.machine import FAULT_GROUPS, PROTOCOL_GROUPS, rule_guard
    from kvhandoff.spec.variants import FormulaGuard
    from kvhandoff.spec.vocabulary import _read_pages, _read_shard, _shard

    design = variant.design
    drain = design.drain_fenced
    out = _Writer()
    out.emit(1, "_reqs = range(len(S.requests))")
    out.emit(1, "_pages = range(len(S.pages))")
    out.emit(1, "_ranks = range(C.prefill_ranks)")
    # Each distinct message (write) once, in order; a pool of one is that already.
    out.emit(1, "_network = S.network if len(S.network) < 2 else sorted(set(S.network))")
    out.emit(1, "_lost = S.lost if len(S.lost) < 2 else sorted(set(S.lost))")
    out.emit(1, "_writes = S.writes if len(S.writes) < 2 else sorted(set(S.writes))")
    out.emit(1, "out = []")
    out.emit(1, "add = out.append")

    def group(kinds: tuple[type, ...], depth: int) -> None:
        kept: list[tuple[GuardFormula, type]] = []
        replaced: list[tuple[type, str, Any]] = []
        for kind in kinds:
            name = snake_case(kind.__name__)
            hook = variant.guard_overrides.get(name)
            if hook is None:
                kept.append((rule_guard(design, name), kind))
            else:
                replaced.append((kind, name, hook))
        if kept:
            shapes = {_shape(f, k) for f, k in kept}
            if len(shapes) > 1:
                raise ValueError(f"{kinds}: a group's guards must range over the same arguments")
            _emit_loop(out, depth, kept, shapes.pop(), config, drain)
        for kind, name, hook in replaced:
            if isinstance(hook, FormulaGuard):
                shape = _shape(hook.formula, kind)
                _emit_loop(out, depth, [(hook.formula, kind)], shape, config, drain)
            else:
                fn = out.bind(_checked(hook, kind, name, variant.name), "H")
                out.emit(depth, f"out += {fn}(C, S)")

    for kinds in PROTOCOL_GROUPS:
        group(kinds, 1)
    if variant.extra_actions is not None:
        out.emit(1, f"out += {out.bind(variant.extra_actions, 'X')}(C, S)")
    for added in variant.added_guards:
        out.emit(1, f"out += {out.bind(added, 'A')}(C, S)")
    out.emit(1, "if S.faults.total < C.max_faults:")
    for kinds in FAULT_GROUPS:
        group(kinds, 2)
    out.emit(1, "return out")
    # The state's requests and pages, by index: one attribute lookup for the whole function.
    out.lines = [
        line.replace("S.requests[", "_rq[").replace("S.pages[", "_pg[") for line in out.lines
    ]
    out.lines[:0] = ["    _rq = S.requests", "    _pg = S.pages"]
    # Each request's and page's row, read once (an unrolled guard names it by its index, and a
    # request's row is read by some fifteen guards).
    rows = sorted(
        {m.group(0) for line in out.lines for m in re.finditer(r"_(?:rq|pg)\[\d+\]", line)},
        key=lambda row: (row[:3], int(row[4:-1])),
    )
    for row in rows:
        local = row.replace("[", "").replace("]", "")
        out.lines = [line.replace(row, local) for line in out.lines]
    out.lines[2:2] = [f"    {row.replace('[', '').replace(']', '')} = {row}" for row in rows]
    # The fault budget spent, summed once (a property that adds the counts up: about ten guards
    # and the budget test read it).
    out.lines = [line.replace("S.faults.total", "_spent") for line in out.lines]
    out.lines[:0] = ["    _spent = S.faults.total"]

    defaults = "".join(f", {n}={n}" for n in out.names)
    source = f"def enabled(C, S, DRAIN={drain!r}{defaults}):\n" + "\n".join(out.lines) + "\n"
    namespace: dict[str, Any] = {
        **out.names,
        "_shard": _shard,
        "_read_pages": _read_pages,
        "_read_shard": _read_shard,
        "_ack_dinst": _effects().ack_dinst,
    }
    exec(compile(source, f"<enabled {variant.name}>", "exec"), namespace)
    fn: Enabled = namespace["enabled"]
    fn.__doc__ = source
    return fn


# --- effects -------------------------------------------------------------------------------------
#
# An effect compiles to one function that computes, in the old state, what each update says (the
# values assigned, the messages sent, ...) and hands them to `spec.effects.finish`, which builds
# the next state: the same builder `run_effect` (the effect read update by update) uses, so the
# two readings differ only in how fast they get there. Updates that range over the same elements
# (`each(PAGE, lambda q: [...])`) share one loop, and a condition several of them state is
# evaluated once per element.

Step = Callable[..., State]


_CONTEXT: dict[str, dict[int, Any]] = {"simplified": {}, "tables": {}}
"""While one effect compiles: its terms simplified (by identity, so that a subterm shared by
several updates stays one object) and the subterms it reads from a table."""


def _simplify(t: Term) -> Term:
    """`t` with the truth values a design fixed folded away (`x and False` is False): a design
    option is a Python `if` when a rule is built, and often leaves a literal in a condition."""
    memo = _CONTEXT["simplified"]
    got = memo.get(id(t))
    if got is None or got[0] is not t:
        got = memo[id(t)] = (t, _simplified(t))
    simplified: Term = got[1]
    return simplified


def _simplified(t: Term) -> Term:
    if isinstance(t, Quant):
        body = _simplify(t.body)
        return t if body is t.body else Quant(t.every, t.var, body)
    if not isinstance(t, Op) or t.op not in ("and", "or", "not", "implies", "ite"):
        return t
    args = [_simplify(a) for a in t.args]
    known = [a.value if isinstance(a, Lit) and isinstance(a.value, bool) else None for a in args]
    same = all(a is b for a, b in zip(args, t.args, strict=True))
    if t.op == "and":
        if False in known:
            return FALSE
        rest = [a for a, k in zip(args, known, strict=True) if k is None]
        return t if same and len(rest) == len(args) else And(*rest)
    if t.op == "or":
        if True in known:
            return TRUE
        rest = [a for a, k in zip(args, known, strict=True) if k is None]
        return t if same and len(rest) == len(args) else Or(*rest)
    if t.op == "not":
        return t if known[0] is None else (FALSE if known[0] else TRUE)
    if t.op == "implies":
        if known[0] is False or known[1] is True:
            return TRUE
        if known[0] is True:
            return args[1]
        return t if same else Op("implies", tuple(args), t.sort)
    if known[0] is not None:  # ite with a fixed condition
        return args[1] if known[0] else args[2]
    return t if same else Op("ite", tuple(args), t.sort)


def _source(t: Term) -> str:
    from kvhandoff.spec.vocabulary import CONCRETE

    return python_source(_simplify(t), CONCRETE, canonical=True, replace=_CONTEXT["tables"])


def _terms_of(u: Any) -> list[tuple[Term, bool]]:
    """Every term an update reads (its condition, values, arguments, pages), each with whether
    it is evaluated for every element of a domain (the pages a message names or writes go to,
    a relation of a request rebuilt whole)."""
    from kvhandoff.spec.effects import Assign, IssueWrites, Send, terms_of

    wide: set[int] = set()
    if isinstance(u, Send):
        wide = {id(x) for x in (u.has_page, u.digest_page) if x is not None}
    elif isinstance(u, IssueWrites):
        wide = {id(u.cond)}
    elif isinstance(u, Assign) and _category(u.target.symbol.name) == "req_set":
        wide = {id(u.value)}
    return [(t, id(t) in wide) for t in terms_of(u)]


def _children(t: Term) -> list[Term]:
    if isinstance(t, (Op, App)):
        return list(t.args)
    if isinstance(t, (Quant, Count, InFlight)):
        return [t.body]
    if isinstance(t, Field):
        return [t.arg] if t.arg is not None else []
    return []


def _tables(terms: list[tuple[Term, bool]], params: tuple[Var, ...]) -> list[tuple[str, str, Term]]:
    """The subterms worth a table: each reads one element (a request, page or rank) and
    quantifies or counts (so evaluating it costs a loop), and it is stated at two places or more
    (alike but for the element's name: `chosen(q)` in a page's update, in the grant's pages,
    and in the ghost flag's `exists`). Its value for every element is computed once, first;
    each place reads the table. Returns (table name, its source, the subterm) and records the
    replacements in `_CONTEXT`."""
    from kvhandoff.spec.vocabulary import CONCRETE

    fixed = {id(v) for v in params}
    free: dict[int, frozenset[Var]] = {}
    costly: dict[int, bool] = {}

    def visit(t: Term) -> frozenset[Var]:
        got = free.get(id(t))
        if got is not None:
            return got
        if isinstance(t, Var):
            out = frozenset() if id(t) in fixed else frozenset([t])
        else:
            out = frozenset().union(*(visit(c) for c in _children(t)))
            if isinstance(t, Field) and id(t.var) not in fixed:
                out |= {t.var}
            if isinstance(t, (Quant, Count, InFlight)):
                out = frozenset(v for v in out if v is not t.var)
        costly[id(t)] = isinstance(t, (Quant, Count, InFlight)) or any(
            costly.get(id(c), False) for c in _children(t)
        )
        free[id(t)] = out
        return out

    for t, _ in terms:
        visit(t)
    places: dict[str, list[tuple[Term, Var, bool, tuple[int, ...]]]] = {}

    def find(t: Term, wide: bool, above: tuple[int, ...]) -> None:
        vs = free[id(t)]
        if len(vs) == 1 and costly[id(t)] and t.sort.name in ("Bool", "Int"):
            (v,) = vs
            if v.sort.name in _DOMAINS:
                src = python_source(t, CONCRETE, canonical=True)
                key = re.sub(rf"\b{re.escape(v.name)}\b", "_X", src)
                places.setdefault(key, []).append((t, v, wide, above))
                above = (*above, id(t))
        inner = wide or isinstance(t, (Quant, Count, InFlight))
        for c in _children(t):
            find(c, inner, above)

    for t, wide in terms:
        find(t, wide, ())
    out: list[tuple[str, str, Term]] = []
    tabled: set[int] = set()
    for key, found in places.items():
        # Worth it where some place evaluates it for every element anyway (inside a quantifier,
        # a count, the pages a message names, a relation rebuilt whole) and it is stated twice;
        # not where every place is inside a subterm already read from a table.
        if len(found) < 2 or not any(wide for _, _, wide, _ in found):
            continue
        if all(tabled.intersection(above) for _, _, _, above in found):
            continue
        name = f"_T{len(out)}"
        v = found[0][1]
        out.append((name, f"[{key} for _X in {_DOMAINS[v.sort.name]}]", found[0][0]))
        for t, var, _, _ in found:
            _CONTEXT["tables"][id(t)] = (name + "[{}]", var)
            tabled.add(id(t))
    return out


_DOMAINS = {"Req": "_reqs", "Page": "_pages", "Rank": "_ranks"}


def _joins(u: Any, group: list[Any]) -> bool:
    """Whether update `u` can share the loop of `group` (updates over the same elements): the
    loop then runs them element by element, not one after the other. That is the same unless
    two assign the same symbol (the later must win where both hold) or two answer a request
    (the first answer stands) other than the element itself; messages and writes are multisets,
    kept sorted, so the order they are sent in does not matter."""
    from kvhandoff.spec.effects import Assign, IssueWrites, Reply, Send

    outer = {id(u.over[0])}
    if isinstance(u, Assign):
        # Two assignments of one symbol may share the loop when both name the loop's element in
        # their arguments: then they write other entries at other elements, and at the same
        # element the later still comes later.
        def own(x: Any) -> bool:
            return any(_mentions(a, outer) for a in x.target.args)

        return all(
            not isinstance(x, Assign)
            or x.target.symbol.name != u.target.symbol.name
            or (own(x) and own(u))
            for x in group
        )
    if isinstance(u, Reply):
        own_reply = u.req is u.over[0]
        return own_reply and all(not isinstance(x, Reply) or x.req is u.req for x in group)
    return isinstance(u, (Send, IssueWrites))


def _same(a: tuple[Var, ...], b: tuple[Var, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _loops(over: tuple[Var, ...]) -> list[str]:
    return [f"for {v.name} in {_DOMAINS[v.sort.name]}:" for v in over]


def _category(name: str) -> str:
    """Where the state keeps symbol `name` (see spec/effects.py, the concrete reading)."""
    from kvhandoff.spec import effects as e

    for category, names in (
        ("req", e._REQ_FIELDS),
        ("req_set", e._REQ_SETS),
        ("accepted", e._ACCEPTED),
        ("read", e._READ),
        ("page", (*e._PAGE, *e._SHARD)),
        ("global", e._GLOBALS),
        ("ghost", e._GHOSTS),
        ("fault", e._FAULTS),
    ):
        if name in names:
            return category
    return "other"  # what decode read, the drain acks owed and sent: built by `finish`


def _bind_arguments(kind: type | None, params: tuple[Var, ...]) -> list[str]:
    """Source that binds the formula's parameters from the action `A` (see
    `spec.variants.arguments`, which this spells out per kind)."""
    names = [v.name for v in params]
    if kind is None:
        return []
    fields = [f.name for f in dataclasses.fields(kind)]
    if fields in (["message"], ["write"]):
        return [f"{names[0]} = A.{fields[0]}"] if names else []
    if fields == ["room", "generation", "rank", "dinst"]:
        # A drain ack names the abort it answers: its formula takes the first request owing it.
        return [
            f"{names[0]} = next((_o[2] for _o in S.pending_acks"
            " if _o[0] == A.room and _o[1] == A.generation"
            " and _ack_dinst(C, S, _o[2]) == A.dinst), None)",
            f"if {names[0]} is None:",
            "    raise ValueError(f'{A!r}: no request owes a drain ack for room and generation "
            "{(A.room, A.generation)}')",
            f"{names[1]} = A.rank",
        ]
    if fields == ["request", "rank"]:
        return [f"{names[0]} = A.request", f"{names[1]} = A.rank"]
    if fields == ["request"]:
        return [f"{names[0]} = A.request"] if names else []
    if set(fields) <= {"pinst", "dinst"}:  # a step of one instance or pair: its fields in order
        return [f"{n} = A.{f}" for n, f in zip(names, fields, strict=True)]
    if not fields:
        return []
    return [f"{', '.join(names)}{',' if len(names) == 1 else ''} = _arguments(A, S)"]


def _folded_updates(eff: Any, config: Any, drain: bool, env: dict[int, int]) -> tuple[Any, ...]:
    """The effect's updates with what `config` fixes folded (`env`: the step's request, when the
    function is made for one request)."""
    import dataclasses as dc

    from kvhandoff.spec.effects import Assign

    def f(t: Any) -> Any:
        return None if t is None else fold(t, config, drain, env)

    out = []
    for u in eff.updates:
        changes: dict[str, Any] = {}
        for field in dc.fields(u):
            value = getattr(u, field.name)
            if isinstance(value, Term) and not isinstance(value, Var):
                changes[field.name] = f(value)
            elif isinstance(value, Var) and field.name in ("req",) and id(value) in env:
                changes[field.name] = f(value)
        if isinstance(u, Assign):
            target = u.target
            changes["target"] = App(target.symbol, tuple(f(a) for a in target.args))
        out.append(dc.replace(u, **changes))
    return tuple(out)


def compile_effect(
    eff: Any,
    design: Any,
    name: str = "step",
    kind: type | None = None,
    config: Any = None,
    request: int | None = None,
) -> Step:
    """`step(C, S, *args) -> State` for the effect `eff` (an `EffectFormula`) under `design`: the
    state after the step taken with `args` (its request, its message or write, its request and
    rank) in `S`.

    Where every update is of a kind the compiler builds itself (a request's fields and page
    sets, what decode accepted, pages, counters, ghost flags, messages, answers, writes) the
    function builds the next state directly; otherwise it hands what it computed to
    `spec.effects.finish`, the builder `run_effect` uses."""
    from kvhandoff.spec import effects as e
    from kvhandoff.spec.effects import (
        Adopt,
        Assign,
        Forget,
        IssueWrites,
        Move,
        Reply,
        Send,
        finish,
    )
    from kvhandoff.spec.logic import FieldSymbol
    from kvhandoff.spec.state import Answer, Message, Tag, Write, evolve, evolved
    from kvhandoff.spec.variants import arguments
    from kvhandoff.spec.vocabulary import _read_pages, _read_shard, _shard

    def generic(u: Any) -> bool:
        if isinstance(u, (Forget, Adopt)):
            return True
        if isinstance(u, Assign):
            return isinstance(u.target.symbol, FieldSymbol) or (
                _category(u.target.symbol.name) == "other"
            )
        return False

    drain = design.drain_fenced
    updates_in = eff.updates
    if config is not None:
        # Made for one configuration (and maybe one request): what they fix is folded first.
        env = {id(eff.params[0]): request} if request is not None else {}
        updates_in = _folded_updates(eff, config, drain, env)
    fast = not any(generic(u) for u in updates_in)
    used: set[str] = set()
    page_symbols: set[str] = set()

    out = _Writer()
    out.emit(1, "_reqs = range(len(S.requests))")
    out.emit(1, "_pages = range(len(S.pages))")
    out.emit(1, "_ranks = range(C.prefill_ranks)")
    body_start = len(out.lines)
    _CONTEXT["simplified"], _CONTEXT["tables"] = {}, {}
    terms = [(_simplify(t), wide) for u in updates_in for t, wide in _terms_of(u)]
    for table, source, _ in _tables(terms, eff.params):
        out.emit(1, f"{table} = {source}")

    # Every update's condition is evaluated in the old state (as `run_effect` does, update by
    # update): one that reads no element the update ranges over is evaluated once, first, and
    # conditions stated alike by several updates are one evaluation. An update whose condition
    # the design made false is left out.
    hoisted: dict[str, str] = {}
    top: dict[tuple[str, ...], str] = {}

    def chain(t: Term, cache: dict[tuple[str, ...], str], depth: int) -> str:
        """A local holding condition `t`, built conjunct by conjunct: `a and b and c` is `x = a`,
        `y = x and b`, `z = y and c`, each prefix kept in `cache`, so that conditions that begin
        alike share the evaluation of what they share (and still stop at the first false one)."""
        whole = _simplify(t)
        if id(whole) in _CONTEXT["tables"]:
            return _source(whole)
        conjuncts = [_source(c) for c in _conjuncts(whole)]
        name = ""
        for i in range(len(conjuncts)):
            key = tuple(conjuncts[: i + 1])
            if key not in cache:
                cache[key] = out.local("c")
                value = f"{name} and {conjuncts[i]}" if name else conjuncts[i]
                out.emit(depth, f"{cache[key]} = {value}")
            name = cache[key]
        return name

    updates = []
    for u in updates_in:
        src = _source(u.when)
        if src == "False":
            continue
        updates.append(u)
        if src != "True" and not _mentions(u.when, {id(v) for v in u.over}):
            if src not in hoisted:
                hoisted[src] = chain(u.when, top, 1)

    # A relation of a request and a page (or rank) that one update assigns for every element,
    # under a condition that reads no element, is rebuilt whole: the elements where the value
    # holds (with one rank, clearing a rank set is then `()`).
    def whole(u: Any) -> bool:
        return shape(u) and all(
            shape(x)
            for x in updates
            if isinstance(x, Assign) and x.target.symbol is u.target.symbol
        )

    def shape(u: Any) -> bool:
        # Every assignment of that relation has this form: each writes all of it, and the last
        # that fires stands, as element by element.
        return (
            fast
            and isinstance(u, Assign)
            and _category(u.target.symbol.name) == "req_set"
            and len(u.over) == 1
            and u.target.args[1] is u.over[0]
            and not _mentions(u.target.args[0], {id(u.over[0])})
            and not _mentions(u.when, {id(u.over[0])})
        )

    # Consecutive updates that range over the same elements (the same first variable: each
    # request, say, and maybe each rank of it) share one loop over them (see `_joins`).
    groups: list[list[Any]] = []
    for u in updates:
        last = groups[-1] if groups else None
        if whole(u):
            groups.append([u])
            continue
        if (
            last is not None
            and not whole(last[0])
            and u.over
            and last[0].over
            and u.over[0] is last[0].over[0]
            and _joins(u, last)
        ):
            last.append(u)
        else:
            groups.append([u])

    # Where every update of a request's state names the same request, and not one an update
    # ranges over (the step's own request, or its message's), the request's changes are one
    # dict of fields, built into one new row.
    keys: set[str] = set()
    ranging = False
    for u in updates:
        if isinstance(u, Assign) and _category(u.target.symbol.name) in (
            "req",
            "req_set",
            "accepted",
            "read",
        ):
            arg = u.target.args[0]
        elif isinstance(u, Reply):
            arg = u.req
        else:
            continue
        keys.add(_source(arg))
        ranging = ranging or _mentions(arg, {id(v) for v in u.over})
    single = next(iter(keys)) if fast and len(keys) == 1 and not ranging else None

    def holder_of(src: str, store: str) -> str:
        """The dict of one request's changes in `store` (RQ: fields, AC, RD)."""
        return store if single is not None else f"{store}.setdefault({src}, {{}})"

    def assignment(u: Any, d: int) -> None:
        value = _source(u.value)
        symbol = u.target.symbol
        args = [_source(a) for a in u.target.args]
        if not fast:
            if isinstance(symbol, FieldSymbol):
                initial = out.bind(symbol.initial, "I")
                out.emit(d, f"FV[{symbol.name!r}] = ({value}, {initial})")
            else:
                key = "".join(f"{a}, " for a in args)
                out.emit(d, f"A[({symbol.name!r}, ({key}))] = {value}")
            used.add("A")
            return
        category = _category(symbol.name)
        used.add(category)
        if category == "req":
            field = e._REQ_FIELDS[symbol.name]
            out.emit(d, f"{holder_of(args[0], 'RQ')}[{field!r}] = {value}")
        elif category == "req_set":
            field = e._REQ_SETS[symbol.name]
            at = repr(field) if single is not None else f"({args[0]}, {field!r})"
            out.emit(d, f"RS.setdefault({at}, {{}})[{args[1]}] = {value}")
        elif category == "accepted":
            out.emit(d, f"{holder_of(args[0], 'AC')}[{symbol.name!r}] = {value}")
        elif category == "read":
            rest = "".join(f"{a}, " for a in args[1:])
            out.emit(d, f"{holder_of(args[0], 'RD')}[({symbol.name!r}, ({rest}))] = {value}")
        elif category == "page":
            # A page's own symbols by name, a shard's by name and rank.
            page_symbols.add(symbol.name)
            key = f"({symbol.name!r}, {args[1]})" if len(args) > 1 else repr(symbol.name)
            out.emit(d, f"PG.setdefault({args[0]}, {{}})[{key}] = {value}")
        elif category == "global" and symbol.name in e.INDEXED:
            key = "".join(f"{a}, " for a in args)
            out.emit(d, f"_set_indexed(C, S, GL, {symbol.name!r}, ({key}), {value})")
        elif category == "global":
            out.emit(d, f"GL[{e._GLOBALS[symbol.name]!r}] = {value}")
        elif category == "ghost":
            out.emit(d, f"GH[{symbol.name!r}] = {value}")
        else:
            out.emit(d, f"FT[{e._FAULTS[symbol.name]!r}] = {value}")

    for group in groups:
        first = group[0]
        depth = 1
        if whole(first):
            src = _source(first.when)
            if src != "True":
                out.emit(depth, f"if {hoisted[src]}:")
                depth += 1
            v = first.over[0]
            field = e._REQ_SETS[first.target.symbol.name]
            value = _source(first.value)
            elements = (
                "()"
                if value == "False"
                else f"tuple({_DOMAINS[v.sort.name]})"
                if value == "True"
                else f"tuple({v.name} for {v.name} in {_DOMAINS[v.sort.name]} if {value})"
            )
            holder = _source(first.target.args[0])
            out.emit(depth, f"{holder_of(holder, 'RQ')}[{field!r}] = {elements}")
            used.add("req")
            continue
        outside = _source(first.when) if len(group) == 1 else ""
        if outside not in hoisted:
            outside = ""
        else:
            # One update whose condition reads no element it ranges over: test it once.
            out.emit(depth, f"if {hoisted[outside]}:")
            depth += 1
        if len(group) == 1 and outside:
            for line in _loops(first.over):
                out.emit(depth, line)
                depth += 1
        elif first.over:
            out.emit(depth, _loops(first.over[:1])[0])
            depth += 1
        conditions: dict[tuple[str, ...], str] = {}

        def when(
            u: Any,
            depth: int = depth,
            conditions: dict[tuple[str, ...], str] = conditions,
            outside: str = outside,
            group: list[Any] = group,
        ) -> int:
            """Emits the loops over `u`'s own further elements and its condition's test; where
            the condition reads none of those elements it is tested before their loops."""
            inner = () if outside else u.over[1:]
            src = _source(u.when)
            if src == "True" or src == outside:
                test = ""
            elif src in hoisted:
                test = hoisted[src]
            elif _mentions(u.when, {id(v) for v in inner}):
                for line in _loops(inner):
                    out.emit(depth, line)
                    depth += 1
                inner = ()
                test = chain(u.when, {}, depth) if len(group) > 1 else src
            else:
                test = chain(u.when, conditions, depth) if len(group) > 1 else src
            if test:
                out.emit(depth, f"if {test}:")
                depth += 1
            for line in _loops(inner):
                out.emit(depth, line)
                depth += 1
            return depth

        for u in group:
            d = when(u)
            if isinstance(u, Assign):
                assignment(u, d)
            elif isinstance(u, Send):
                used.add("M")
                r = out.local("r")
                out.emit(d, f"{r} = {_source(u.req)}")
                parts = [repr(u.kind), f"C.requests[{r}].room", _source(u.gen), r]
                if u.page is not None and u.has_page is not None:
                    q = u.page.name
                    parts.append(f"pages=tuple({q} for {q} in _pages if {_source(u.has_page)})")
                if u.reason:
                    parts.append(f"reason={u.reason!r}")
                if u.epoch is not None:
                    parts.append(f"epoch={_source(u.epoch)}")
                for field_name in ("count", "rank"):
                    term = getattr(u, field_name)
                    if term is not None:
                        parts.append(f"{field_name}={_source(term)}")
                # Every message about r carries the attempt it was sent for, and the decode
                # instance at its decode end (`run_effect`).
                parts.append(f"attempt=S.requests[{r}].attempt")
                if config is None or config.decode_instances > 1:
                    parts.append(f"dinst=_dinst(C, S, {u.kind!r}, {r})")
                if u.digest:
                    q = u.page.name if u.page is not None else "_q"
                    covered = _source(u.digest_page) if u.digest_page is not None else "False"
                    gen = out.local("g")
                    out.emit(d, f"{gen} = {_source(u.gen)}")
                    parts.append(f"digest=tuple(({q}, {r}, {gen}) for {q} in _pages if {covered})")
                message = f"Message({', '.join(parts)})"
                if fast:
                    used.add("net")
                    out.emit(d, f"insort(_net, {message})")
                else:
                    out.emit(d, f"M.append({message})")
            elif isinstance(u, Reply):
                used.add("RP")
                out.emit(d, f"RP.setdefault({_source(u.req)}, {out.bind(u, 'U')})")
            elif isinstance(u, Forget):
                out.emit(d, f"FG.append({_source(u.inst)})")
            elif isinstance(u, Adopt):
                used.add("AD")
                req = f"C.requests[{_source(u.req)}]"
                out.emit(d, f"AD.append(({req}.room, {_source(u.gen)}, {req}.prefill_instance))")
            elif isinstance(u, Move) and fast:
                m = u.m.name
                if getattr(u.m, "what_of", "") == "write":  # a write arrives: it leaves the wire
                    used.add("wr")
                    out.emit(d, f"_wr.remove({m})")
                elif u.op in ("consume", "lose"):
                    used.add("net")
                    out.emit(d, f"_net.remove({m})")
                    if u.op == "lose":
                        used.add("lost")
                        out.emit(d, f"insort(_lost, {m})")
                elif u.op == "resend":
                    used.update(("net", "lost"))
                    out.emit(d, f"_lost.remove({m})")
                    out.emit(d, f"insort(_net, {m})")
                else:
                    used.add("net")
                    out.emit(d, f"insort(_net, {m})")
            elif isinstance(u, Move):
                out.emit(d, f"MV.append(({u.op!r}, {u.m.name}))")
            elif isinstance(u, IssueWrites):
                r, row, tag = out.local("r"), out.local("R"), out.local("t")
                out.emit(d, f"{r} = {_source(u.req)}")
                out.emit(d, f"{row} = S.requests[{r}]")
                out.emit(d, f"{tag} = _tag({r}, {row}.p_gen, C.requests[{r}].tenant)")
                q = u.page.name
                out.emit(d, f"for {q} in _pages:")
                out.emit(d + 1, f"if {_source(u.cond)}:")
                out.emit(d + 2, "for _k in _ranks:")
                write = f"Write(C.requests[{r}].room, {row}.p_gen, {q}, {tag}, {row}.p_epoch, _k)"
                if fast:
                    used.add("wr")
                    out.emit(d + 3, f"insort(_wr, {write})")
                else:
                    out.emit(d + 3, f"W.append({write})")
            else:
                raise TypeError(f"cannot compile the update {u!r}")

    if not fast:
        out.lines.insert(
            body_start, "    A = {}; M = []; RP = {}; W = []; MV = []; AD = []; FV = {}; FG = []"
        )
        out.emit(1, "return finish(C, S, A, M, RP, W, MV, FG, AD, FV)")
    else:
        names = {
            "req": "RQ = {}", "req_set": "RS = {}", "accepted": "AC = {}", "read": "RD = {}", "page": "PG = {}",
            "global": "GL = {}", "ghost": "GH = {}", "fault": "FT = {}", "RP": "RP = {}",
            "net": "_net = list(S.network)", "lost": "_lost = list(S.lost)",
            "wr": "_wr = list(S.writes)",
        }  # fmt: skip
        made = sorted({names[u] for u in used if u in names})
        if made:
            out.lines.insert(body_start, f"    {'; '.join(made)}")
        _emit_build(
            out, used, page_symbols, single, None if config is None else config.prefill_ranks
        )

    # What the step's own arguments name in the old state (its request's row, a message's
    # request, a write's page) is read once, not once per symbol that reads it.
    rows = []
    if request is not None:
        for pattern in (f"S.requests[{request}]", f"C.requests[{request}]"):
            if sum(line.count(pattern) for line in out.lines) >= 2:
                local = out.local("row")
                out.lines = [line.replace(pattern, local) for line in out.lines]
                rows.append(f"    {local} = {pattern}")
    for v in eff.params:
        for pattern in (
            f"S.requests[{v.name}]",
            f"C.requests[{v.name}]",
            f"S.requests[({v.name}.request)]",
            f"C.requests[({v.name}.request)]",
            f"S.pages[({v.name}.page)]",
            f"({v.name}.request)",
            f"({v.name}.page)",
            f"({v.name}.generation)",
        ):
            if sum(line.count(pattern) for line in out.lines) >= 2:
                local = out.local("row")
                out.lines = [line.replace(pattern, local) for line in out.lines]
                rows.append(f"    {local} = {pattern}")
    out.lines[3:3] = rows
    body = "\n".join(out.lines[3:])
    prelude = [line for line in out.lines[:3] if line.split()[0] in body]
    out.lines[:3] = prelude  # the sizes only the updates that range over them need
    drain = design.drain_fenced
    if kind is not None:
        # Called with the action: its arguments are read off it first.
        params = ", A"
        out.lines[:0] = [f"    {line}" for line in _bind_arguments(kind, eff.params)]
    else:
        params = "".join(f", {v.name}" for v in eff.params)
    defaults = "".join(f", {n}={n}" for n in out.names)
    source = f"def {name}(C, S{params}, DRAIN={drain!r}{defaults}):\n" + "\n".join(out.lines) + "\n"
    namespace: dict[str, Any] = {
        **out.names,
        "finish": finish,
        "evolve": evolve,
        "evolved": evolved,
        "Answer": Answer,
        "Message": Message,
        "Tag": Tag,
        "Write": Write,
        "insort": bisect.insort,
        "_moved": e._moved,
        "_U": e._UNSET,
        "_new_read": e._new_read,
        "_tenant_of": e._tenant_of,
        "_accepted": _accepted,
        "_tag": _tag,
        "_rebuilt": _rebuilt,
        "_dinst": e.message_dinst,
        "_ack_dinst": e.ack_dinst,
        "_set_indexed": e.set_indexed,
        "_arguments": arguments,
        "_shard": _shard,
        "_read_pages": _read_pages,
        "_read_shard": _read_shard,
    }
    _CONTEXT["simplified"], _CONTEXT["tables"] = {}, {}
    exec(compile(source, f"<effect {name}>", "exec"), namespace)
    fn: Step = namespace[name]
    fn.__doc__ = source
    return fn


def _rebuilt(items: tuple[int, ...], changes: dict[int, Any]) -> tuple[int, ...]:
    """A request's set of pages (ranks), as the ascending tuple the state keeps, with the
    elements an effect set (true) or cleared (false). (An update of every element, as a retry
    makes, is compiled to the new set itself: the old one is not read.)"""
    out = set(items)
    for element, member in changes.items():
        if member:
            out.add(element)
        else:
            out.discard(element)
    return tuple(sorted(out))


_TAGS: dict[tuple[int, int, str], Any] = {}


def _tag(request: int, generation: int, tenant: str) -> Any:
    """The data tag (request, generation, tenant), one object for each: a shard that is written
    the tag a write carries is then that very object, and states that hold it compare and hash
    at once, as the Python effects' states did (they stored the write's own tag)."""
    key = (request, generation, tenant)
    got = _TAGS.get(key)
    if got is None:
        from kvhandoff.spec.state import Tag

        got = _TAGS[key] = Tag(request, generation, tenant)
    return got


def _accepted(req: Any, changes: dict[str, bool]) -> bool | None:
    """`ReqState.accepted_full` after an effect assigned `accepted_set` / `accepted_full` (as
    `spec.effects._new_request` builds it)."""
    was = req.accepted_full
    if changes.get("accepted_set", was is not None):
        return bool(changes.get("accepted_full", was is True))
    return None


def _emit_page_build(
    emit: Callable[[int, str], None], symbols: set[str], ranks: int | None = None
) -> None:
    """The pages an effect changed (`PG`: page -> its changes), built as
    `spec.effects._new_page` builds them, for the page symbols this effect assigns only
    (`ranks`: the configuration's prefill ranks, when the code is made for one)."""
    emit(1, "if PG:")
    emit(2, "_ps = list(S.pages)")
    emit(2, "for _q, _c in PG.items():")
    emit(3, "_pg = _ps[_q]")
    emit(3, "_f = {}")
    if symbols & {"owned", "owner", "owner_gen"}:
        emit(3, "_ow = _pg.owner")
        emit(3, "if _c.get('owned', _ow is not None):")
        emit(4, "_f['owner'] = (")
        emit(5, "_c.get('owner', _ow[0] if _ow is not None else 0),")
        emit(5, "_c.get('owner_gen', _ow[1] if _ow is not None else 0),")
        emit(4, ")")
        emit(3, "else:")
        emit(4, "_f['owner'] = None")
    if symbols & {"page_used", "last_tenant"}:
        emit(3, "if _c.get('page_used', _pg.last_tenant is not None):")
        emit(4, "_f['last_tenant'] = _c.get('last_tenant', _pg.last_tenant)")
        emit(3, "else:")
        emit(4, "_f['last_tenant'] = None")
    if symbols & {"shard_has", "shard_req", "shard_gen"}:
        depth = 3
        if ranks is not None:
            # Made for one configuration: the loop over the page's shards unrolled, rank by
            # rank (the same steps; a page of another shape takes the loop below).
            emit(3, f"if len(_pg.rank_shards) == {ranks - 1}:")
            for k in range(ranks):
                _emit_shard(emit, symbols, k)
            emit(4, "_f['content'] = _n0")
            rest = "".join(f"_n{k}, " for k in range(1, ranks))
            emit(4, f"_f['rank_shards'] = ({rest})")
            emit(3, "else:")
            depth = 4
        emit(depth, "_sh = list(_pg.shards)")
        emit(depth, "for _k, _old in enumerate(_sh):")
        parts = [("shard_has", "_h"), ("shard_req", "_who"), ("shard_gen", "_gen")]
        for name, local in parts:
            got = f"_c.get(({name!r}, _k), _U)" if name in symbols else "_U"
            emit(depth + 1, f"{local} = {got}")
        emit(depth + 1, "if _h is _U and _who is _U and _gen is _U:")
        emit(depth + 2, "continue  # this rank's shard is as it was")
        emit(depth + 1, "if not (_old is not None if _h is _U else _h):")
        emit(depth + 2, "_sh[_k] = None")
        emit(depth + 2, "continue")
        emit(depth + 1, "_who = getattr(_old, 'request', 0) if _who is _U else _who")
        emit(depth + 1, "_gen = getattr(_old, 'generation', 0) if _gen is _U else _gen")
        emit(depth + 1, "_sh[_k] = _tag(_who, _gen, _tenant_of(C, _who))")
        emit(depth, "_f['content'] = _sh[0]")
        emit(depth, "_f['rank_shards'] = tuple(_sh[1:])")
    emit(3, "_ps[_q] = evolved(_pg, _f)")
    emit(2, "ch['pages'] = tuple(_ps)")


def _emit_shard(emit: Callable[[int, str], None], symbols: set[str], k: int) -> None:
    """Rank `k`'s shard of the page `_pg` after the changes `_c`, into `_n{k}`: one turn of
    `_emit_page_build`'s loop over the shards, with what the effect does not assign left out
    when the code is made."""
    old = "_pg.content" if k == 0 else f"_pg.rank_shards[{k - 1}]"
    emit(4, f"_o = {old}")
    parts = [("shard_has", "_h"), ("shard_req", "_who"), ("shard_gen", "_gen")]
    assigned = [(name, local) for name, local in parts if name in symbols]
    for name, local in assigned:
        emit(4, f"{local} = _c.get(({name!r}, {k}), _U)")
    unset = " and ".join(f"{local} is _U" for _, local in assigned)
    emit(4, f"if {unset}:")
    emit(5, f"_n{k} = _o  # this rank's shard is as it was")
    has = "(_o is not None if _h is _U else _h)" if "shard_has" in symbols else "_o is not None"
    emit(4, f"elif not {has}:")
    emit(5, f"_n{k} = None")
    emit(4, "else:")
    who, gen = "getattr(_o, 'request', 0)", "getattr(_o, 'generation', 0)"
    if "shard_req" in symbols:
        who = f"{who} if _who is _U else _who"
    if "shard_gen" in symbols:
        gen = f"{gen} if _gen is _U else _gen"
    emit(5, f"_w = {who}")
    emit(5, f"_g = {gen}")
    emit(5, f"_n{k} = _tag(_w, _g, _tenant_of(C, _w))")


def _emit_one_request_build(out: _Writer, used: set[str], key: str) -> None:
    """`_emit_build`'s request part where one request (`key`, its source) is changed."""
    emit = out.emit
    if "req" not in used:
        out.lines.insert(3, "    RQ = {}")
    emit(1, f"_k = {key}")
    emit(1, "_old = S.requests[_k]")
    if "req_set" in used:
        emit(1, "for _f, _es in RS.items():")
        emit(2, "RQ[_f] = _rebuilt(getattr(_old, _f), _es)")
    if "read" in used:
        emit(1, "if RD:")
        emit(2, "RQ['read'] = _new_read(C, S, _k, RD)")
    if "accepted" in used:
        emit(1, "if AC:")
        emit(2, "RQ['accepted_full'] = _accepted(_old, AC)")
    if "RP" in used:
        # An answer is given once: the first one stands.
        emit(1, "if RP and _old.answer is None:")
        emit(2, "_u = next(iter(RP.values()))")
        emit(2, "RQ['answer'] = (")
        emit(
            3,
            "Answer(ok=True, tags=_old.read or ()) if _u.ok else Answer(ok=False, reason=_u.reason)",
        )
        emit(2, ")")
    emit(1, "if RQ:")
    emit(2, "_rs = list(S.requests)")
    emit(2, "_rs[_k] = evolved(_old, RQ)")
    emit(2, "ch['requests'] = tuple(_rs)")


def _emit_build(
    out: _Writer,
    used: set[str],
    page_symbols: set[str],
    single: str | None = None,
    ranks: int | None = None,
) -> None:
    """The next state from what the updates computed: only the parts the effect can change.
    `single`: the one request whose state the effect changes (its changes kept as one dict);
    `ranks`: the configuration's prefill ranks, when the code is made for one."""
    emit = out.emit
    emit(1, "ch = {}")
    if single is not None and used & {"req", "req_set", "accepted", "read", "RP"}:
        _emit_one_request_build(out, used, single)
        used = used - {"req", "req_set", "accepted", "read", "RP"}
    if "req_set" in used:
        emit(1, "for (_r, _f), _es in RS.items():")
        emit(2, "RQ.setdefault(_r, {})[_f] = _rebuilt(getattr(S.requests[_r], _f), _es)")
    if "read" in used:
        emit(1, "for _r, _d in RD.items():")
        emit(2, "RQ.setdefault(_r, {})['read'] = _new_read(C, S, _r, _d)")
    if "accepted" in used:
        emit(1, "for _r, _a in AC.items():")
        emit(2, "RQ.setdefault(_r, {})['accepted_full'] = _accepted(S.requests[_r], _a)")
    if "RP" in used:
        # An answer is given once: the first one stands.
        emit(1, "for _r, _u in RP.items():")
        emit(2, "_old = S.requests[_r]")
        emit(2, "if _old.answer is None:")
        emit(3, "RQ.setdefault(_r, {})['answer'] = (")
        emit(
            4,
            "Answer(ok=True, tags=_old.read or ()) if _u.ok else Answer(ok=False, reason=_u.reason)",
        )
        emit(3, ")")
    if used & {"req", "req_set", "accepted", "read", "RP"}:
        if "req" not in used:
            out.lines.insert(3, "    RQ = {}")
        emit(1, "if RQ:")
        emit(2, "_rs = list(S.requests)")
        emit(2, "for _r, _f in RQ.items():")
        emit(3, "_rs[_r] = evolved(_rs[_r], _f)")
        emit(2, "ch['requests'] = tuple(_rs)")
    if "page" in used:
        _emit_page_build(emit, page_symbols, ranks)
    if "global" in used:
        emit(1, "ch.update(GL)")
    if "ghost" in used:
        emit(1, "if GH:")
        emit(2, "ch['ghost'] = evolved(S.ghost, GH)")
    if "fault" in used:
        emit(1, "if FT:")
        emit(2, "ch['faults'] = evolved(S.faults, FT)")
    for local, field in (("net", "network"), ("lost", "lost"), ("wr", "writes")):
        if local in used:
            emit(1, f"ch[{field!r}] = tuple(_{local})")
    emit(1, "return evolved(S, ch) if ch else S")


# --- the rulebook of a variant -------------------------------------------------------------------


class _Effects(dict[type, Callable[[Any, State, Any], State]]):
    """A variant's effects by action kind, each compiled when first asked for (a BMC replay
    takes a few kinds; compiling all 33 costs more than such a run)."""

    def __init__(self, variant: Any, config: Any = None, warm: int = 0) -> None:
        from kvhandoff.spec.actions import ALL_ACTIONS, snake_case

        super().__init__()
        self.variant, self.config, self.warm = variant, config, warm
        self.names = {
            k: snake_case(k.__name__) for k in (*ALL_ACTIONS, *variant.extra_action_types)
        }

    def __missing__(self, kind: type) -> Callable[[Any, State, Any], State]:
        from kvhandoff.spec.effects import run_effect
        from kvhandoff.spec.machine import RULE_EFFECTS, rule_effect
        from kvhandoff.spec.variants import FormulaEffect, arguments

        name = self.names.get(kind)
        if name is None:
            raise KeyError(kind)
        design = self.variant.design
        hook = self.variant.step_overrides.get(name)
        if hook is not None and not isinstance(hook, FormulaEffect):
            python: Callable[[Any, State, Any], State] = hook
            self[kind] = python  # a variant's Python effect: called as it is
            return python
        if isinstance(hook, FormulaEffect):
            formula = hook.formula
        elif name in RULE_EFFECTS:
            formula = rule_effect(design, name)
        else:
            raise KeyError(kind)
        compiled = self._compiler(kind, name, formula)
        if not self.warm:
            fast = self[kind] = compiled()
            return fast
        drain = design.drain_fenced
        calls = [0]

        def warming(C: Any, S: State, A: Any) -> State:
            # The first calls read the formula update by update (`run_effect`, the same
            # semantics: tests/spec/test_compiled_rules.py): a replay of a few steps never pays
            # for compiling; a long run compiles after `warm` calls.
            calls[0] += 1
            if calls[0] >= self.warm:
                fast = self[kind] = compiled()
                return fast(C, S, A)
            return run_effect(formula, C, S, drain, arguments(A, S))

        self[kind] = warming
        return warming

    def _compiler(
        self, kind: type, name: str, formula: Any
    ) -> Callable[[], Callable[[Any, State, Any], State]]:
        """What compiles the effect of `kind`: for one configuration and a step of one request,
        a function per request (each with that request's facts folded) chosen by the action's
        request, each made when first taken."""
        design, config = self.variant.design, self.config
        fields = [f.name for f in dataclasses.fields(kind)]
        if not (
            config is not None
            and fields[:1] == ["request"]
            and formula.params
            and len(config.requests) <= _UNROLL
        ):
            return lambda: compile_effect(formula, design, name, kind, config)

        def per_request() -> Callable[[Any, State, Any], State]:
            by_request: list[Step | None] = [None] * len(config.requests)

            def fn(C: Any, S: State, A: Any, _by: Any = by_request) -> State:
                one = _by[A.request]
                if one is None:
                    r = A.request
                    one = _by[r] = compile_effect(formula, design, f"{name}_{r}", kind, config, r)
                result: State = one(C, S, A)
                return result

            return fn

        return per_request

    def get(self, kind: type, default: Any = None) -> Any:
        try:
            return self[kind]
        except KeyError:
            return default


class Rules:
    """A variant's rules compiled: `enabled(config, state)` and, per action kind, its effect
    `(config, state, action) -> state` (a variant's Python effect is called as it is)."""

    def __init__(self, variant: Any) -> None:
        self.variant = variant
        self._enabled: Enabled | None = None
        self._for: dict[Any, Enabled] = {}
        self._last: tuple[Any, Enabled] | None = None
        self.steps = _Effects(variant, warm=_WARM)
        self._steps_for: dict[tuple[Any, bool], _Effects] = {}

    @property
    def enabled(self) -> Enabled:
        """`enabled` for any configuration (its loops kept: the form a scenario too large to
        unroll gets)."""
        if self._enabled is None:
            self._enabled = compile_enabled(self.variant)
        return self._enabled

    def steps_for(self, config: Any, search: bool = False) -> _Effects:
        """The effects made for `config` alone (what it fixes folded; a step of one request
        made once per request): call them with that configuration only. Each is read from its
        formula for its first `_WARM` steps and compiled after, so a replay of a few steps never
        pays for compiling; with `search` (a run that takes most effects thousands of times),
        each is compiled when first taken."""
        got = self._steps_for.get((config, search))
        if got is None:
            warm = 0 if search else _WARM
            got = self._steps_for[config, search] = _Effects(self.variant, config, warm)
        return got

    def enabled_for(self, config: Any) -> Enabled:
        """`enabled` made for `config` alone (what it fixes folded, loops unrolled): call it
        with that configuration only."""
        last = self._last
        if last is not None and last[0] is config:
            return last[1]
        fn = self._for.get(config)
        if fn is None:
            fn = self._for[config] = compile_enabled(self.variant, config)
        self._last = (config, fn)
        return fn


_RULES: dict[int, Rules] = {}


def rules(variant: Any) -> Rules:
    """The compiled rules of `variant`, built once (the variant is kept, so its id is not
    reused while it is here)."""
    got = _RULES.get(id(variant))
    if got is None or got.variant is not variant:
        got = _RULES[id(variant)] = Rules(variant)
    return got
