"""A small first-order language for writing the protocol's claims once, for every checker.

The explorer evaluates a claim on concrete states; the Z3 engines need the same claim as a
formula: over the fixed configuration's variables (bmc, kind, spacer), and over uninterpreted
sorts of requests and pages (the any-size proof). Written as a Python function, a claim can only
be *run*; written here, as a term of this language, it can be run and translated. Each reading
("interpretation") lives next to the checker that needs it:

* `compile_formula` below: a Python closure over a `spec.state.State` (the explorer, tests);
* `model_checker/logic_z3.py`: the fixed-configuration encoding and the any-size model.

The language is the one of mypyvy and Ivy, cut to what the handoff needs:

* **Sorts**: requests (`REQ`), decode's pages (`PAGE`), prefill ranks (`RANK`), tenants
  (`TENANT`, compared only), phases (`P_PHASE`, `D_PHASE`: a finite set of names), integers and
  booleans.
* **Symbols**: the state's functions and relations, each declared once in `spec/vocabulary.py`
  with its sorts and what it means (`d_gen(r)`: the generation decode holds for request r).
* **Formulas**: `And`, `Or`, `Not`, `Implies`, comparisons, `forall`/`exists` over a sort, and
  two quantifiers over what is in flight: `each_message(kinds, ...)` (the network, and the
  messages waiting to be sent again) and `each_write(...)` (page writes in flight), whose
  fields (`m.req`, `m.gen`, `w.page`, ...) are terms.

Quantifiers are written with Python lambdas, `forall(REQ, lambda r: d_gen(r) < next_gen(0))`:
the lambda is called once, with a fresh variable, to build the term (higher-order abstract
syntax). So a claim reads almost as the mathematics it states, and nothing here runs per state.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvhandoff.spec.state import DECODE_PHASES, PREFILL_PHASES

# --- sorts ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sort:
    name: str
    values: tuple[str, ...] = ()
    """For a finite sort of names (a phase): its elements, in order."""


REQ = Sort("Req")
PAGE = Sort("Page")
RANK = Sort("Rank")
"""A prefill rank: with several, each writes one shard of every page (with one, the page)."""
TENANT = Sort("Tenant")
"""A tenant: claims only compare tenants (whose data is this? whose request?), never count or
quantify over them, so no reading needs to list the tenants."""
INT = Sort("Int")
BOOL = Sort("Bool")
PINST = Sort("PrefillInstance")
DINST = Sort("DecodeInstance")
"""A prefill (decode) instance, as the argument of a step of one instance (a restart) or of
one pair (decode instance j's view of prefill instance i): a number 0, 1, 2 like the rigid
`p_inst(r)` and `d_inst(r)` it is compared with, read by the any-size model as an element of its
sort of instances. The two sorts say only over which instances a step ranges."""
P_PHASE = Sort("PrefillPhase", PREFILL_PHASES)
D_PHASE = Sort("DecodePhase", DECODE_PHASES)


# --- terms ---------------------------------------------------------------------------------------


class Term:
    """A term or formula. Comparisons and `+`/`-` build terms (as in Z3's Python API); the
    connectives are the functions `And`, `Or`, `Not`, `Implies`, since Python's `and`, `or`
    and `not` cannot be overloaded."""

    sort: Sort

    def _op(self, op: str, other: object, sort: Sort) -> Op:
        if isinstance(other, str):  # a phase name, compared with a phase-valued term
            if other not in self.sort.values:
                raise ValueError(f"{other!r} is not a {self.sort.name}: one of {self.sort.values}")
            return Op(op, (self, Lit(other, self.sort)), sort)
        return Op(op, (self, lift(other)), sort)

    def __eq__(self, other: object) -> Op:  # type: ignore[override]
        return self._op("eq", other, BOOL)

    def __ne__(self, other: object) -> Op:  # type: ignore[override]
        return self._op("ne", other, BOOL)

    def __lt__(self, other: object) -> Op:
        return self._op("lt", other, BOOL)

    def __le__(self, other: object) -> Op:
        return self._op("le", other, BOOL)

    def __gt__(self, other: object) -> Op:
        return Op("lt", (lift(other), self), BOOL)

    def __ge__(self, other: object) -> Op:
        return Op("le", (lift(other), self), BOOL)

    def __add__(self, other: object) -> Op:
        return self._op("add", other, INT)

    def __sub__(self, other: object) -> Op:
        return self._op("sub", other, INT)

    def __bool__(self) -> bool:
        raise TypeError(
            "a logic term has no truth value in Python: use And/Or/Not/Implies, not and/or/not"
        )

    __hash__ = object.__hash__

    def is_in(self, *names: str) -> Op:
        """This phase-valued term is one of `names` (each checked against the sort)."""
        for name in names:
            if name not in self.sort.values:
                raise ValueError(f"{name!r} is not a {self.sort.name}: one of {self.sort.values}")
        return Op("in", (self, Lit(names, self.sort)), BOOL)


class Lit(Term):
    def __init__(self, value: Any, sort: Sort) -> None:
        self.value, self.sort = value, sort

    def __repr__(self) -> str:
        return repr(self.value)


class Var(Term):
    _ids = itertools.count()

    def __init__(self, sort: Sort, hint: str) -> None:
        self.sort = sort
        self.name = f"{hint}{next(Var._ids)}"

    def __repr__(self) -> str:
        return self.name


class Op(Term):
    """An operator applied to terms: eq ne lt le add sub and or not implies ite in."""

    def __init__(self, op: str, args: tuple[Term, ...], sort: Sort) -> None:
        self.op, self.args, self.sort = op, args, sort

    def __repr__(self) -> str:
        return f"{self.op}({', '.join(map(repr, self.args))})"


@dataclass(frozen=True, eq=False)
class Symbol:
    """A function or relation of the state, declared once in `spec/vocabulary.py`."""

    name: str
    args: tuple[Sort, ...]
    result: Sort
    meaning: str

    def __call__(self, *given: Term | int) -> App:
        if len(given) != len(self.args):
            raise TypeError(f"{self.name} takes {len(self.args)} arguments, got {len(given)}")
        # A number stands for itself (`next_gen(0)`, decode instance 0's counter).
        args = tuple(lift(a) for a in given)
        for want, got in zip(self.args, args, strict=True):
            # An instance is a number: `decode_epoch(d_inst(r))` names r's decode instance.
            if got.sort != want and not (want in (PINST, DINST) and got.sort == INT):
                raise TypeError(f"{self.name}: argument of sort {got.sort.name}, want {want.name}")
        return App(self, args)


class FieldSymbol(Symbol):
    """A variant's own state field (`Variant.state_fields`) as a symbol of no arguments: a
    variant's formulas read and assign it like the vocabulary's own. Built by `state_field`."""

    initial: Any = None

    def __init__(self, name: str, result: Sort, initial: Any, meaning: str) -> None:
        super().__init__(name, (), result, meaning)
        object.__setattr__(self, "initial", initial)


def state_field(name: str, initial: bool | int, meaning: str = "") -> FieldSymbol:
    """The symbol of a variant's state field `name` (declare the same name and initial value in
    the variant's `state_fields`): `preemptions = state_field("preemptions", 0)`, then
    `preemptions() < 1` in a guard and `assign(preemptions(), preemptions() + 1)` in an effect.
    A bool or a non-negative int: what every engine can keep."""
    if isinstance(initial, bool):
        return FieldSymbol(name, BOOL, initial, meaning or f"the variant's state field {name}")
    if isinstance(initial, int) and initial >= 0:
        return FieldSymbol(name, INT, initial, meaning or f"the variant's state field {name}")
    raise TypeError(
        f"state_field({name!r}, {initial!r}): a formula's state field starts as a bool or a "
        "non-negative int"
    )


class App(Term):
    def __init__(self, symbol: Symbol, args: tuple[Term, ...]) -> None:
        self.symbol, self.args, self.sort = symbol, args, symbol.result

    def __repr__(self) -> str:
        return f"{self.symbol.name}({', '.join(map(repr, self.args))})"


class Quant(Term):
    """`forall`/`exists` over a sort."""

    def __init__(self, every: bool, var: Var, body: Term) -> None:
        self.every, self.var, self.body, self.sort = every, var, body, BOOL

    def __repr__(self) -> str:
        return f"{'forall' if self.every else 'exists'}({self.var!r}: {self.body!r})"


class Count(Term):
    """`count(sort, body)`: how many elements of a finite sort satisfy the body (an integer).
    Only readings that list the sort's elements can count (the explorer, the fixed
    configuration); over an uninterpreted sort there is no number to give."""

    def __init__(self, var: Var, body: Term) -> None:
        self.var, self.body, self.sort = var, body, INT

    def __repr__(self) -> str:
        return f"count({self.var!r}: {self.body!r})"


# What a message or write in flight exposes to a claim (the fields of spec.state.Message/Write
# that the claims need), with each field's sort.
MESSAGE_FIELDS: dict[str, Sort] = {
    "req": REQ,
    "gen": INT,
    "epoch": INT,
    "rank": RANK,  # the prefill rank that sent it (completions, drain acks)
    "rank_done": BOOL,  # that rank has already reported this request (several ranks only)
    "room": INT,  # the room it names
    "count": INT,  # a completion: how many pages it says were written
    "has_digest": BOOL,  # a completion: it carries a digest
    "attempt": INT,  # the sender's attempt number for the request (a client's retry: 1)
    "dinst": INT,  # the decode instance at its decode end: sender or receiver (instances)
}
MESSAGE_PAGE_FIELDS: dict[str, Sort] = {"has_page": PAGE, "digest_page": PAGE}
"""Fields that take a page: `m.has_page(q)`, page q is among the pages a grant names;
`m.digest_page(q)`, a completion's digest covers page q."""
FAILURE_REASONS: tuple[str, ...] = ("rejected", "aborted", "lease expired")
REASON = Sort("FailureReason", FAILURE_REASONS)
"""Why prefill reports a failure: `m.reason_is("aborted")` (the language has no strings)."""
WRITE_FIELDS: dict[str, Sort] = {
    "req": REQ,  # the request whose data the write carries (the ghost tag)
    "page": PAGE,
    "gen": INT,
    "data_gen": INT,  # the generation of the data it carries
    "epoch": INT,
    "right_room": BOOL,  # it carries its own request's room
    "right_tenant": BOOL,  # its data is labelled with its own request's tenant
    "rank": RANK,  # the prefill rank writing its shard
    "rank_acked": BOOL,  # that rank has acknowledged an abort of this grant (several ranks)
    "room": INT,  # the room it writes for
}


PENDING_ACK_FIELDS: dict[str, Sort] = {"req": REQ, "gen": INT}


class Field(Term):
    def __init__(self, var: Var, name: str, sort: Sort, arg: Term | None = None) -> None:
        self.var, self.name, self.sort, self.arg = var, name, sort, arg

    def __repr__(self) -> str:
        return f"{self.var}.{self.name}" + (f"({self.arg!r})" if self.arg is not None else "")


class Bound(Var):
    """A message or write in flight, bound by `each_message` / `each_write`."""

    def __init__(self, hint: str, fields: dict[str, Sort], what: str) -> None:
        super().__init__(BOOL, hint)
        self._fields = fields
        self.what_of = what

    def __getattr__(self, name: str) -> Any:
        fields = self.__dict__.get("_fields", {})
        if self.__dict__.get("what_of") == "message" and name in MESSAGE_PAGE_FIELDS:
            return lambda q: Field(self, name, BOOL, q)
        if self.__dict__.get("what_of") == "message" and name == "reason_is":
            return lambda why: Field(self, name, BOOL, _reason(why))
        if name not in fields:
            raise AttributeError(f"no field {name!r}: one of {sorted(fields)}")
        return Field(self, name, fields[name])


def _reason(why: str) -> Lit:
    if why not in FAILURE_REASONS:
        raise ValueError(f"{why!r} is not a failure reason: one of {FAILURE_REASONS}")
    return Lit(why, REASON)


class InFlight(Term):
    """`each_message` / `each_write`: the body holds of every item in flight (of these kinds)."""

    def __init__(self, what: str, kinds: tuple[str, ...], var: Bound, body: Term) -> None:
        self.what, self.kinds, self.var, self.body, self.sort = what, kinds, var, body, BOOL


# --- building formulas ---------------------------------------------------------------------------


def lift(x: object) -> Term:
    if isinstance(x, Term):
        return x
    if isinstance(x, bool):
        return Lit(x, BOOL)
    if isinstance(x, int):
        return Lit(x, INT)
    raise TypeError(f"cannot use {x!r} ({type(x).__name__}) in a logic term")


TRUE = Lit(True, BOOL)
FALSE = Lit(False, BOOL)


def And(*xs: Term) -> Term:
    return xs[0] if len(xs) == 1 else Op("and", xs, BOOL) if xs else TRUE


def Or(*xs: Term) -> Term:
    return xs[0] if len(xs) == 1 else Op("or", xs, BOOL) if xs else Lit(False, BOOL)


def Not(x: Term) -> Term:
    return Op("not", (x,), BOOL)


def Implies(a: Term, b: Term) -> Term:
    return Op("implies", (a, b), BOOL)


def If(c: Term, a: object, b: object) -> Term:
    ta, tb = lift(a), lift(b)
    return Op("ite", (c, ta, tb), ta.sort)


def forall(sort: Sort, body: Callable[[Var], Term]) -> Term:
    v = Var(sort, sort.name[0].lower())
    return Quant(True, v, body(v))


def exists(sort: Sort, body: Callable[[Var], Term]) -> Term:
    v = Var(sort, sort.name[0].lower())
    return Quant(False, v, body(v))


def count(sort: Sort, body: Callable[[Var], Term]) -> Term:
    """How many elements of `sort` satisfy the body: `count(PAGE, lambda q: Not(owned(q)))` is
    the number of free pages."""
    v = Var(sort, sort.name[0].lower())
    return Count(v, body(v))


def each_message(kinds: Sequence[str], body: Callable[[Bound], Term]) -> Term:
    """The body holds of every message of these kinds in the network or waiting to be resent."""
    m = Bound("m", MESSAGE_FIELDS, "message")
    return InFlight("message", tuple(kinds), m, body(m))


def each_write(body: Callable[[Bound], Term]) -> Term:
    """The body holds of every page write in flight."""
    w = Bound("w", WRITE_FIELDS, "write")
    return InFlight("write", (), w, body(w))


def each_pending_ack(body: Callable[[Bound], Term]) -> Term:
    """The body holds of every drain ack prefill still owes decode (an abort it must answer once
    its writes drained)."""
    a = Bound("a", PENDING_ACK_FIELDS, "pending_ack")
    return InFlight("pending_ack", (), a, body(a))


class GuardFormula:
    """A guard written as a formula of the action's arguments (see `guard`, `message_guard`)."""

    def __init__(
        self,
        params: tuple[Var, ...],
        formula: Term,
        source: str = "",
        kinds: tuple[str, ...] = (),
    ) -> None:
        self.params, self.formula = params, formula
        self.source, self.kinds = source, kinds
        """For a step that takes a message: where the message is (`network`, or `lost`: waiting
        to be sent again) and its kinds (empty: any). The step is enabled for each such message
        for which the formula holds."""

    def __repr__(self) -> str:
        return f"guard({', '.join(map(repr, self.params))}: {self.formula!r})"


def rank_guard(body: Callable[[Var, Var], Term]) -> GuardFormula:
    """The guard of a step each prefill rank takes for a request: `rank_guard(lambda r, k: ...)`
    (`r` a request, `k` a rank); enabled for each (request, rank) for which the body holds."""
    r, k = Var(REQ, "r"), Var(RANK, "k")
    return GuardFormula((r, k), body(r, k))


INSTANCE_PARAM_NAMES = {PINST: "ip", DINST: "jd"}
"""The variable of a step's prefill (decode) instance argument in its formulas."""


def instance_guard(sorts: Sequence[Sort], body: Callable[..., Term]) -> GuardFormula:
    """The guard of a step of one instance, or of one pair of instances:
    `instance_guard((PINST,), lambda ip: ...)` (a prefill instance), `instance_guard((DINST,
    PINST), lambda jd, ip: ...)` (decode instance jd's view of prefill instance ip); enabled for
    each instance (pair) for which the body holds. The arguments are the action's instance
    fields, in order."""
    if len(set(sorts)) != len(sorts) or not set(sorts) <= set(INSTANCE_PARAM_NAMES):
        raise ValueError(f"instance_guard: at most one PINST and one DINST argument, got {sorts}")
    params = tuple(Var(s, INSTANCE_PARAM_NAMES[s]) for s in sorts)
    return GuardFormula(params, body(*params))


def guard(body: Callable[..., Term]) -> GuardFormula:
    """A replacement guard for a variant's `guard_overrides`, as a formula: `guard(lambda r:
    ...)` for an action on one request (`r`, a request), `guard(lambda: ...)` for an action with
    no arguments. Unlike a Python function, every engine can read it: the explorer compiles it,
    and the Z3 encodings translate it in place of the rulebook's guard."""
    import inspect

    arity = len(inspect.signature(body).parameters)
    if arity > 1:
        raise TypeError(
            f"guard(...) takes a function of the action's request (one argument) or of nothing; "
            f"this one takes {arity}"
        )
    params = tuple(Var(REQ, "r") for _ in range(arity))
    return GuardFormula(params, body(*params))


def message_guard(source: str, kinds: Sequence[str], body: Callable[[Bound], Term]) -> GuardFormula:
    """The guard of a step that takes a message: `message_guard("network", ("grant",), lambda m:
    ...)` holds for a grant in the network when the body does; `m.req`, `m.gen`, `m.epoch` and
    `m.has_page(q)` are its fields (`MESSAGE_FIELDS`). `source` is "network" or "lost" (the
    messages whose RPC failed, waiting to be sent again); `kinds` empty means any kind."""
    if source not in ("network", "lost"):
        raise ValueError(f"message_guard: source is 'network' or 'lost', not {source!r}")
    m = Bound("m", MESSAGE_FIELDS, "message")
    return GuardFormula((m,), body(m), source, tuple(kinds))


def write_guard(body: Callable[[Bound], Term]) -> GuardFormula:
    """The guard of a step that takes a page write in flight: enabled for each distinct write
    for which the body holds (`w.page`, `w.gen`, `w.room`, ... are its fields, `WRITE_FIELDS`)."""
    w = Bound("w", WRITE_FIELDS, "write")
    return GuardFormula((w,), body(w), "writes")


def clauses(t: Term) -> list[Term]:
    """`t` cut into the conjuncts it states: `and` splits, and so do `forall`, `each_...` and the
    consequent of `implies` when their body is a conjunction (`forall x. A and B` is
    `forall x. A` and `forall x. B`; `(A or B) -> C` is `A -> C` and `B -> C`). A checker that cannot read every symbol of a claim can
    still use, and say it uses, the clauses it can read."""
    if isinstance(t, Op) and t.op == "and":
        return [c for a in t.args for c in clauses(a)]
    if isinstance(t, Op) and t.op == "implies":
        a, b = t.args
        # (A or B) -> C is (A -> C) and (B -> C).
        cases = list(a.args) if isinstance(a, Op) and a.op == "or" else [a]
        return [Implies(x, c) for x in cases for c in clauses(b)]
    if isinstance(t, Quant) and t.every:
        return [Quant(True, t.var, c) for c in clauses(t.body)]
    if isinstance(t, InFlight):
        kinds = [(k,) for k in t.kinds] if len(t.kinds) > 1 else [t.kinds]
        return [InFlight(t.what, ks, t.var, c) for ks in kinds for c in clauses(t.body)]
    return [t]


def symbols_of(t: Term) -> set[str]:
    """The names of the symbols a formula reads (and `message:KIND` / `write` for what is in
    flight): an interpretation that lacks one cannot translate the formula."""
    if isinstance(t, App):
        return {t.symbol.name}.union(*(symbols_of(a) for a in t.args))
    if isinstance(t, Op):
        return set().union(*(symbols_of(a) for a in t.args))
    if isinstance(t, (Quant, Count)):
        return symbols_of(t.body)
    if isinstance(t, InFlight):
        names = {f"message:{k}" for k in t.kinds} if t.what == "message" else {t.what}
        return names | symbols_of(t.body)
    return set()


# --- the concrete interpretation: compiled to Python source --------------------------------------


@dataclass(frozen=True)
class PythonReading:
    """How the concrete state spells each symbol, as Python source over names the compiled
    function binds (`S`, the state; `C`, the config; `DRAIN`, a design flag): a format string
    per symbol (`{0}`, `{1}` are its arguments), per field of what is in flight (`{0}` is the
    item), per sort (its elements) and per kind of item in flight (an iterable; `{kinds}` is the
    tuple of message kinds asked for)."""

    symbols: dict[str, str]
    fields: dict[str, dict[str, str]]
    domains: dict[Sort, str]
    in_flight: dict[str, str]
    prelude: str = ""
    """Statements run once per call, before the claim (e.g. the sizes of the domains)."""


_PY_OPS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "add": "+", "sub": "-"}


def python_source(
    t: Term,
    reading: PythonReading,
    canonical: bool = False,
    replace: dict[int, tuple[str, Var]] | None = None,
) -> str:
    """`t` as one Python expression. Quantifiers become `all(...)`/`any(...)` over generators, so
    the compiled claim costs about what the same claim written by hand in Python costs. With
    `canonical`, the variables `t` binds are named by the order they are bound in, so that two
    terms built alike are one source (and a compiler can evaluate them once). `replace` gives
    the source of some subterms (by identity) as a format of the one variable they read: a
    compiler's table of their values, element by element."""
    names: dict[int, str] = {}

    def bind(v: Var) -> str:
        names[id(v)] = f"_v{len(names)}" if canonical else v.name
        return names[id(v)]

    def go(t: Term) -> str:
        if replace and id(t) in replace:
            fmt, v = replace[id(t)]
            return fmt.format(names.get(id(v), v.name))
        if isinstance(t, Lit):
            return repr(tuple(t.value) if isinstance(t.value, tuple) else t.value)
        if isinstance(t, Field):
            what = t.var.what_of if isinstance(t.var, Bound) else ""
            arg = [go(t.arg)] if t.arg is not None else []
            var = names.get(id(t.var), t.var.name)  # bound here, or a parameter (a message)
            return "(" + reading.fields[what][t.name].format(var, *arg) + ")"
        if isinstance(t, Var):
            return names.get(id(t), t.name)  # a bound variable, or a parameter of the function
        if isinstance(t, App) and isinstance(t.symbol, FieldSymbol):
            # A variant's own field: stored only where it differs from its initial value.
            return f"dict(S.variant_fields).get({t.symbol.name!r}, {t.symbol.initial!r})"
        if isinstance(t, App):
            if t.symbol.name not in reading.symbols:
                raise KeyError(f"no concrete reading of symbol {t.symbol.name!r}")
            return "(" + reading.symbols[t.symbol.name].format(*(go(a) for a in t.args)) + ")"
        if isinstance(t, Quant):
            name = bind(t.var)
            body = go(t.body)
            fn = "all" if t.every else "any"
            return f"{fn}({body} for {name} in {reading.domains[t.var.sort]})"
        if isinstance(t, Count):
            name = bind(t.var)
            body = go(t.body)
            return f"sum(1 for {name} in {reading.domains[t.var.sort]} if {body})"
        if isinstance(t, InFlight):
            name = bind(t.var)
            source = reading.in_flight[t.what].format(kinds=repr(t.kinds))
            return f"all({go(t.body)} for {name} in {source})"
        if isinstance(t, Op):
            a = [go(x) for x in t.args]
            if t.op == "and":
                return "(" + " and ".join(a) + ")"
            if t.op == "or":
                return "(" + " or ".join(a) + ")"
            if t.op == "not":
                return f"(not {a[0]})"
            if t.op == "implies":
                return f"((not {a[0]}) or {a[1]})"
            if t.op == "ite":
                return f"({a[1]} if {a[0]} else {a[2]})"
            if t.op == "in":
                return f"({a[0]} in {a[1]})"
            return f"({a[0]} {_PY_OPS[t.op]} {a[1]})"
        raise TypeError(f"cannot compile {t!r}")

    return go(t)


def compile_python(
    t: Term, reading: PythonReading, name: str = "claim", params: tuple[Var, ...] = ()
) -> Callable[..., bool]:
    """A Python function `(S, C, DRAIN, *params) -> bool` computing `t`, built once from its
    source."""
    extra = "".join(f", {v.name}" for v in params)
    source = f"def {name}(S, C, DRAIN{extra}):\n"
    for line in reading.prelude.splitlines():
        source += f"    {line}\n"
    source += f"    return bool({python_source(t, reading)})\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<claim {name}>", "exec"), namespace)
    fn: Callable[..., bool] = namespace[name]
    fn.__doc__ = source
    return fn
