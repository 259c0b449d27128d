"""What no step and no property reads, the explorer does not keep apart: two reductions.

**Ghost flags only witnesses read.** The spec keeps a few whole-system ghost flags
(`spec.state.Ghost`): "a freed page was granted again", "a cancel came in mid-transfer", "an
answer was ok after a crash". Each is set, once and for good, by the step that makes it true, and
read by a `sometimes` witness ("this design can reuse a freed page": not vacuous). No guard reads
them and no effect computes anything from them, and the `always` properties (but
`no_late_write_lands_in_reallocated_page`, which reads `late_landing`) do not read them either.
Yet each is part of the state, so two states that differ in such a flag alone are two states to
the search, with the same future: after the first page reuse, every state of the rest of the run
is there twice, with the flag set and without.

**Prefill's side of a request prefill has finished with.** Once prefill has rejected, completed,
aborted or lost a request, the grant it held (generation, pages, decode epoch and address), the
prompt length it admitted, the ranks that reported and the lease of its source blocks are history:
on the reference no guard, no effect, no property reads them of such a request again, and a
client's retry sets every one of them afresh. Yet two runs that finished a request under another
generation, or after writing under another grant, are two states for the rest of the search. (The
count of pages written, `p_wrote`, is cleared only of a request admitted as sent and past decode's
admission: the fail-closed property reads it of a request some side did not admit as sent, and
decode's rejection, which marks a request so, comes before decode admits it: `AS_IS_ONLY`.)

The explorer therefore stores each state with those flags cleared, and those fields of every
finished request (`cleared_fields_of`: submitted, prefill phase in `FINISHED`) set back to their
initial values (`Eraser`), and looks at the flags only where they matter: on the step that sets
one, before clearing it, it asks the witnesses that read it. That search is exact for everything
it reports:

* **The same behaviours.** Guards and effects read none of the cleared flags, nor any cleared
  field of a finished request (checked on the variant's formulas: `erasable_ghost_flags`,
  `erasable_prefill_fields`), and a step that takes a finished request back to work sets every
  cleared field afresh; so a state and its cleared copy enable the same actions, and each action
  leads to states that are equal once cleared. The cleared states are the classes of a
  bisimulation: every path of the full graph is a path of classes, and back.
* **The same verdicts, and the same counterexamples.** An `always` property reads no cleared
  flag and no cleared field (each declares what it reads, `Property.reads`, and its formula is
  checked too), so it has one value on a whole class; breadth-first, a class is found at the
  least depth of its members, from the first of them, so the first violation, and the shortest
  path to it, are those of the full search. Termination reads neither, and the protocol steps
  between classes are those between their members: the same verdict, the same bound. (Where
  termination fails, its run is the first stuck state or protocol cycle a depth-first walk meets,
  not a shortest one, so on the smaller graph it may be another run, replayed like every other.)
  Counterexamples are replayed from their actions, so the states they print are whole.
* **The same witnesses.** A cleared flag starts false and only a step sets it; a witness that
  reads only such flags, true or false (an `Or` of flags), becomes true on a path exactly where
  a step sets one of its flags. The search asks it on every step that changes the ghost record,
  before the flags are cleared, whether the state stepped to is new or not. A witness that reads
  a flag together with anything else keeps that flag (it is not cleared). No witness reads a
  cleared field.

"Reads" is meant as the concrete reading runs, not only as the formulas say: a write carries its
grant's generation and epoch, and with several decode instances a message's decode address is
read off the grant's pages, so those count as reads of the request that issues them (`_Reads`).
A read a formula makes moot for a finished request does not count: `p(r) == "granted" and
p_gen(r) == m.gen` reads `p_gen` only of a request prefill still works on. Where a design reads a
field of finished requests (room-keyed matching takes an abort for a completed grant by its
generation; the pull path's lease expires under writes still in flight), that field is kept for
that design. A test runs the search with every cleared field poisoned, refusing to be looked at
by any guard, effect, property or witness (tests/model_checker/test_reduction.py).

What is not the same is the count: `states` is the number of classes (with `reduce=False`, of
states). On the default scenario (`wide`), the reference has 257,024 states and 102,744 classes
(180,154 with the flags alone cleared).

Anything the analysis cannot see through turns the reduction off: a variant's Python guard or
effect (only formulas can be read), state fields of its own, a property with no declared reads,
a witness with no formula."""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable
from typing import Any

from kvhandoff.spec.config import Config
from kvhandoff.spec.effects import (
    DECODE_SENDS,
    Adopt,
    Assign,
    EffectFormula,
    Forget,
    IssueWrites,
    Move,
    Reply,
    Send,
    terms_of,
)
from kvhandoff.spec.logic import (
    App,
    Count,
    Field,
    GuardFormula,
    InFlight,
    Lit,
    Not,
    Op,
    Quant,
    Term,
    Var,
    symbols_of,
)
from kvhandoff.spec.machine import RULE_EFFECTS, RULE_GUARDS, rule_effect, rule_guard
from kvhandoff.spec.properties import ALWAYS, SOMETIMES, Witness
from kvhandoff.spec.state import (
    DECODE_PHASES,
    PREFILL_PHASES,
    Ghost,
    ReqState,
    State,
    evolved,
)
from kvhandoff.spec.variants import FormulaEffect, FormulaGuard, Variant
from kvhandoff.spec.vocabulary import CONCRETE

GHOST_FLAGS: tuple[str, ...] = Ghost._fields
"""The ghost flags, by the names the vocabulary and the `Ghost` record share."""


def _rule_pairs(variant: Variant) -> list[tuple[GuardFormula | None, EffectFormula | None]] | None:
    """Each step's guard and effect as formulas (None: some guard or effect is Python code)."""
    if variant.extra_actions is not None or variant.state_fields:
        return None
    design = variant.design
    names = list(RULE_GUARDS)
    names += [n for n in RULE_EFFECTS if n not in names]
    names += [n for n in (*variant.guard_overrides, *variant.step_overrides) if n not in names]
    out: list[tuple[GuardFormula | None, EffectFormula | None]] = []
    for name in names:
        hook = variant.guard_overrides.get(name)
        g: GuardFormula | None
        if hook is None:
            g = rule_guard(design, name) if name in RULE_GUARDS else None
        elif isinstance(hook, FormulaGuard):
            g = hook.formula
        elif isinstance(hook, GuardFormula):
            g = hook
        else:
            return None
        step = variant.step_overrides.get(name)
        e: EffectFormula | None
        if step is None:
            e = rule_effect(design, name) if name in RULE_EFFECTS else None
        elif isinstance(step, FormulaEffect):
            e = step.formula
        else:
            return None
        out.append((g, e))
    return out


def _rule_formulas(variant: Variant) -> list[Term] | None:
    """Every term the variant's guards and effects read (None: some guard or effect is Python
    code, which cannot be read)."""
    pairs = _rule_pairs(variant)
    if pairs is None:
        return None
    terms: list[Term] = []
    for g, e in pairs:
        if g is not None:
            terms.append(g.formula)
        for u in e.updates if e is not None else ():
            terms.extend(terms_of(u))
    return terms


def _pure_flags(t: Term) -> set[str] | None:
    """The flags of a witness that is a flag or an `Or` of flags (None: it is something else)."""
    if isinstance(t, App) and t.symbol.name in GHOST_FLAGS and not t.args:
        return {t.symbol.name}
    if isinstance(t, Op) and t.op == "or":
        out: set[str] = set()
        for a in t.args:
            got = _pure_flags(a)
            if got is None:
                return None
            out |= got
        return out
    return None


def erasable_ghost_flags(variant: Variant, invariants: Iterable[Term] = ()) -> tuple[str, ...]:
    """The ghost flags the explorer may clear for `variant` (see the module docstring): read by
    no guard, no effect, no `always` property, none of `invariants` (the formulas the search
    evaluates besides), and, by witnesses, only by witnesses that are flags or `Or`s of flags.
    Empty when some part of the variant cannot be read."""
    terms = _rule_formulas(variant)
    if terms is None:
        return ()
    kept: set[str] = set()
    for t in terms:
        kept |= symbols_of(t)
    for prop in ALWAYS:
        if not prop.reads:
            return ()
        for part in prop.reads:
            name, _, field = part.partition(".")
            if name == "ghost":
                if not field:
                    return ()
                kept.add(field)
        if prop.formula is not None:
            kept |= symbols_of(prop.formula)
    for inv in invariants:
        kept |= symbols_of(inv)
    for w in SOMETIMES:
        if w.formula is None:
            return ()
        flags = _pure_flags(w.formula)
        if flags is None:
            kept |= symbols_of(w.formula)
    return tuple(f for f in GHOST_FLAGS if f not in kept)


class Eraser:
    """Clears `flags` of states' ghost records and, of each request whose prefill has finished
    with it (`FINISHED`), the prefill fields `fields`: one cleared record per distinct record."""

    def __init__(self, flags: tuple[str, ...], fields: tuple[str, ...] = ()) -> None:
        self.flags, self.fields = flags, fields
        self._blank = {f: False for f in flags}
        self._cleared: dict[Ghost, Ghost] = {}
        defaults = ReqState()
        # The fields cleared of every finished request, and those cleared only of one admitted
        # as sent (`cleared_fields_of`).
        self._fresh = {f: getattr(defaults, f) for f in fields if f not in AS_IS_ONLY}
        self._fresh_as_is = {f: getattr(defaults, f) for f in fields}
        self._requests: dict[ReqState, ReqState] = {}

    def ghost(self, g: Ghost) -> Ghost:
        got = self._cleared.get(g)
        if got is None:
            cleared = evolved(g, self._blank)
            got = self._cleared.setdefault(cleared, cleared)  # one object per cleared record
            self._cleared[g] = got
        return got

    def request(self, req: ReqState) -> ReqState:
        """`req`, with its prefill fields cleared if prefill has finished with it
        (`cleared_fields_of`)."""
        if not cleared_request(req):
            return req
        got = self._requests.get(req)
        if got is None:
            fresh = self._fresh_as_is if as_is_cleared(req) else self._fresh
            cleared = evolved(req, fresh)
            if cleared == req:
                cleared = req
            got = self._requests.setdefault(cleared, cleared)  # one object per cleared record
            self._requests[req] = got
        return got

    def requests(self, s: State, parent: State | None = None) -> State:
        """`s` with every finished request's prefill fields cleared; with `parent`, the state
        `s` was stepped from and is already cleared, only the requests the step changed are
        looked at."""
        requests = s.requests
        old = parent.requests if parent is not None else ()
        out: list[ReqState] | None = None
        for r, req in enumerate(requests):
            # (Asked of every step that changes a request: the cheap tests first.)
            if req.p not in FINISHED or (old and req is old[r]):
                continue
            got = self.request(req)
            if got is not req:
                if out is None:
                    out = list(requests)
                out[r] = got
        return s if out is None else evolved(s, {"requests": tuple(out)})

    def without_flags(self, s: State) -> State:
        """`s` with its cleared flags cleared."""
        g = self.ghost(s.ghost)
        return s if g is s.ghost else evolved(s, {"ghost": g})

    def state(self, s: State) -> State:
        """`s` as the search stores it."""
        if self.flags:
            s = self.without_flags(s)
        return self.requests(s) if self.fields else s


def flag_witnesses(flags: tuple[str, ...]) -> tuple[Witness, ...]:
    """The witnesses that read a cleared flag (each reads only flags: `erasable_ghost_flags`)."""
    out = []
    for w in SOMETIMES:
        assert w.formula is not None
        if symbols_of(w.formula) & set(flags):
            out.append(w)
    return tuple(out)


# --- Prefill's side of a finished request ------------------------------------------------------

FINISHED: frozenset[str] = frozenset({"rejected", "completed", "aborted", "lost"})
"""The prefill phases in which prefill has finished with a request (`none`, not yet handed over,
is not one: nothing of such a request is set, so there is nothing to clear)."""

PREFILL_FIELDS: dict[str, str] = {
    "p_len": "p_len",
    "p_gen": "p_gen",
    "p_pages": "p_granted",
    "p_wrote": "p_wrote",
    "p_epoch": "p_epoch",
    "p_grant_dinst": "p_grant_dinst",
    "p_lease_expired": "p_lease_expired",
    "p_ranks_done": "p_rank_done",
}
"""The prefill fields of `ReqState` the explorer may clear once prefill has finished with the
request, each with the state symbol an effect assigns it by (`p_granted`, `p_rank_done`: one
page, one rank of the set at a time)."""


AS_IS_ONLY: frozenset[str] = frozenset({"p_wrote"})
"""Fields cleared only of a request admitted as sent, and past decode's admission: the
fail-closed property reads the count of pages written of a request some side did not admit as
sent (`not_as_is`: nothing may have been written for it), and decode's rejection, which marks
a request so, comes before decode admits it."""
_BEFORE_DECODE_ADMISSION = frozenset({"none", "received"})


def cleared_request(req: ReqState) -> bool:
    """Are `req`'s prefill fields cleared in a stored state: has the router submitted it and
    prefill finished with it? (Before the router submits it, a request's fields are all
    initial: nothing to clear.) Those of `AS_IS_ONLY` only under `as_is_cleared` too."""
    return req.submitted and req.p in FINISHED


def as_is_cleared(req: ReqState) -> bool:
    """Are `req`'s `AS_IS_ONLY` fields cleared too: admitted as sent, and past decode's
    admission?"""
    return not req.not_as_is and req.d not in _BEFORE_DECODE_ADMISSION


def cleared_fields_of(req: ReqState, fields: Iterable[str]) -> frozenset[str]:
    """Which of `fields` a stored state clears of `req`."""
    if not cleared_request(req):
        return frozenset()
    return frozenset(f for f in fields if f not in AS_IS_ONLY or as_is_cleared(req))


_SET_SYMBOLS = frozenset({"p_granted", "p_rank_done"})
_PHASES = frozenset(PREFILL_PHASES)
_EVERY_FIELD = frozenset(PREFILL_FIELDS)

_ROW = re.compile(r"S\.requests\[(\{(\d)\}|\{0\}\.request)\](\.(\w+))?")
_HELPER_READS = {
    "_read_pages": frozenset({"read", "d_pages"}),
    "_read_shard": frozenset({"read", "d_pages"}),
}
"""What the vocabulary's helpers read of the request record a reading hands them."""

_Where = int | str
"""Whose fields a reading reads: the symbol's argument by position, or "req", the request of
the message a field reading is of."""


def _reading_reads(reading: str) -> list[tuple[_Where, frozenset[str]]] | None:
    """The request fields a concrete reading (`spec.vocabulary.CONCRETE`) reads, and of whom
    (None: it reads requests some other way, say every request, or a whole record)."""
    out: list[tuple[_Where, frozenset[str]]] = []
    for m in _ROW.finditer(reading):
        where: _Where = int(m.group(2)) if m.group(2) is not None else "req"
        if m.group(4) is not None:
            out.append((where, frozenset({m.group(4)})))
            continue
        helper = re.search(r"(\w+)\($", reading[: m.start()])
        if helper is None or helper.group(1) not in _HELPER_READS:
            return None
        out.append((where, _HELPER_READS[helper.group(1)]))
    if reading.count("S.requests") != len(out):
        return None
    return out


_SYMBOL_READS = {name: _reading_reads(r) for name, r in CONCRETE.symbols.items()}
_ONE_DECODE_INSTANCE = "(0 if C.decode_instances == 1 else "
_SYMBOL_READS_ONE_DECODE = {
    name: [] if r.startswith(_ONE_DECODE_INSTANCE) else _SYMBOL_READS[name]
    for name, r in CONCRETE.symbols.items()
}
"""The same with one decode instance: a reading that begins by answering for that case
(`p_dinst`) reads nothing of a request there."""
_FIELD_READS = {
    (what, name): _reading_reads(r)
    for what, table in CONCRETE.fields.items()
    for name, r in table.items()
}


def _key(t: Term, names: dict[int, str]) -> Hashable:
    """A term, as a value two spellings of the same term share: the action's arguments by
    position (`names`: a guard's and an effect's variables are different objects), every other
    variable by identity."""
    if isinstance(t, Var):
        return ("var", names.get(id(t), id(t)))
    if isinstance(t, Field):
        arg = None if t.arg is None else _key(t.arg, names)
        return ("field", _key(t.var, names), t.name, arg)
    if isinstance(t, App):
        return ("app", t.symbol.name, tuple(_key(a, names) for a in t.args))
    if isinstance(t, Lit):
        return ("lit", repr(t.value))
    if isinstance(t, Op):
        return ("op", t.op, tuple(_key(a, names) for a in t.args))
    return ("term", id(t))


_Situation = tuple[str, bool, bool, str]
"""A request's prefill phase, whether the router has submitted it, whether some side did not
admit it as sent, and decode's phase: what decides which of its prefill fields are cleared
(`cleared_fields_of`)."""
_ANY: frozenset[_Situation] = frozenset(
    (ph, sb, na, dp)
    for ph in PREFILL_PHASES
    for sb in (True, False)
    for na in (True, False)
    for dp in DECODE_PHASES
)
_CLEARED: frozenset[_Situation] = frozenset(s for s in _ANY if s[0] in FINISHED and s[1])
_CLEARED_AS_IS: frozenset[_Situation] = frozenset(
    s for s in _CLEARED if not s[2] and s[3] not in _BEFORE_DECODE_ADMISSION
)


def _cleared_in(field: str) -> frozenset[_Situation]:
    """The situations in which `field` is cleared."""
    return _CLEARED_AS_IS if field in AS_IS_ONLY else _CLEARED


_FLAGS_OF_SITUATION = {"submitted": 1, "not_as_is": 2}
_PHASES_OF_SITUATION = {"p": (0, _PHASES), "d": (3, frozenset(DECODE_PHASES))}


def _situations(
    fact: Term, x: Hashable, names: dict[int, str], positive: bool = True
) -> frozenset[_Situation]:
    """The situations request `x` (a term's key) may be in where `fact` holds (where it does
    not, with `positive` false): read off comparisons of `p(x)` with phases and off
    `submitted(x)` and `not_as_is(x)`, and comparisons of `d(x)` with phases, through `not`,
    `and`, `or` and `implies`; anything else says nothing."""
    if (
        isinstance(fact, App)
        and fact.symbol.name in _FLAGS_OF_SITUATION
        and _key(fact.args[0], names) == x
    ):
        at = _FLAGS_OF_SITUATION[fact.symbol.name]
        return frozenset(s for s in _ANY if s[at] == positive)
    if isinstance(fact, Lit) and fact.value is (not positive):
        return frozenset()  # a step whose guard is false in this design is never taken
    if not isinstance(fact, Op):
        return _ANY
    op, args = fact.op, fact.args
    if op == "not":
        return _situations(args[0], x, names, not positive)
    if op in ("and", "or"):
        parts = [_situations(a, x, names, positive) for a in args]
        if (op == "and") == positive:
            return frozenset.intersection(*parts)
        return frozenset.union(*parts)
    if op == "implies":
        a, b = args
        if positive:
            return _situations(a, x, names, False) | _situations(b, x, names, True)
        return _situations(a, x, names, True) & _situations(b, x, names, False)
    if op in ("eq", "ne", "in") and len(args) == 2:
        lhs, rhs = args
        if (
            isinstance(lhs, App)
            and lhs.symbol.name in _PHASES_OF_SITUATION
            and isinstance(rhs, Lit)
            and _key(lhs.args[0], names) == x
        ):
            at, every = _PHASES_OF_SITUATION[lhs.symbol.name]
            values = frozenset(rhs.value) if op == "in" else frozenset({rhs.value})
            if op == "ne":
                values = every - values
            if not positive:
                values = every - values
            return frozenset(s for s in _ANY if s[at] in values)
    return _ANY


def _not_cleared(
    facts: tuple[Term, ...], x: Hashable, names: dict[int, str], field: str = ""
) -> bool:
    """Do `facts` say that request `x`'s `field` is not cleared (no field given: none of its
    fields)?"""
    cleared = _cleared_in(field)
    allowed = _ANY
    for fact in facts:
        allowed = allowed & _situations(fact, x, names)
        if not allowed & cleared:
            return True
    return False


class _Reads:
    """The prefill fields some formula may read of a request prefill has finished with.

    A read counts unless the formula around it makes its value moot for a finished request:
    a read inside a conjunct counts only where the other conjuncts may hold (inside a disjunct,
    where the others may fail; in either branch of an `ite`, where its condition goes that
    way; in an update, where the step's guard and the update's `when` hold), and it is moot
    where those facts say the request's prefill phase is not a finished one. The phase is never
    cleared, so those facts hold of every state of a class or of none: two states that differ
    only in the cleared fields give every formula the same value."""

    def __init__(self, config: Config) -> None:
        self.read: set[str] = set()
        self.multi = config.decode_instances > 1
        self.symbols = _SYMBOL_READS if self.multi else _SYMBOL_READS_ONE_DECODE

    def of(
        self,
        x: Term | Hashable,
        fields: Iterable[str],
        facts: tuple[Term, ...],
        names: dict[int, str],
    ) -> None:
        todo = (_EVERY_FIELD & set(fields)) - self.read
        if not todo:
            return
        key = _key(x, names) if isinstance(x, Term) else x
        for field in todo:
            if not _not_cleared(facts, key, names, field):
                self.read.add(field)

    def reads(
        self,
        reads: list[tuple[_Where, frozenset[str]]] | None,
        args: tuple[Term, ...],
        message: Hashable,
        facts: tuple[Term, ...],
        names: dict[int, str],
    ) -> None:
        if reads is None:
            self.read |= _EVERY_FIELD
            return
        for where, fields in reads:
            self.of(message if where == "req" else args[where], fields, facts, names)  # type: ignore[index]

    def walk(self, t: Term, facts: tuple[Term, ...], names: dict[int, str]) -> None:
        if self.read >= _EVERY_FIELD:
            return
        if isinstance(t, App):
            self.reads(self.symbols.get(t.symbol.name), t.args, None, facts, names)
            for a in t.args:
                self.walk(a, facts, names)
        elif isinstance(t, Field):
            what = getattr(t.var, "what_of", "")
            request = ("field", _key(t.var, names), "req", None)
            self.reads(_FIELD_READS.get((what, t.name)), (), request, facts, names)
            if t.arg is not None:
                self.walk(t.arg, facts, names)
        elif isinstance(t, Op):
            args = t.args
            if t.op in ("and", "or"):
                for i, a in enumerate(args):
                    others = args[:i] + args[i + 1 :]
                    assumed = others if t.op == "and" else tuple(Not(o) for o in others)
                    self.walk(a, facts + assumed, names)
            elif t.op == "implies":
                a, b = args
                self.walk(a, (*facts, Not(b)), names)
                self.walk(b, (*facts, a), names)
            elif t.op == "ite":
                c, a, b = args
                self.walk(c, facts, names)
                self.walk(a, (*facts, c), names)
                self.walk(b, (*facts, Not(c)), names)
            else:
                for a in args:
                    self.walk(a, facts, names)
        elif isinstance(t, (Quant, Count, InFlight)):
            self.walk(t.body, facts, names)

    def update(
        self, u: Any, guard: tuple[Term, ...], names: dict[int, str], eff: EffectFormula
    ) -> None:
        self.walk(u.when, guard, names)
        inner = (*guard, u.when)
        if isinstance(u, Assign):
            for a in u.target.args:
                self.walk(a, inner, names)
            self.walk(u.value, inner, names)
            if u.target.symbol.name in (*_PHASES_OF_SITUATION, *_FLAGS_OF_SITUATION):
                self.revival(u, inner, names, eff)
        elif isinstance(u, Send):
            for part in (u.req, u.gen, u.epoch, u.has_page, u.count, u.digest_page, u.rank):
                if part is not None:
                    self.walk(part, inner, names)
            if self.multi and u.kind not in DECODE_SENDS:
                # Its decode address is read off the grant's pages (`message_dinst`).
                self.of(u.req, ("p_pages",), inner, names)
        elif isinstance(u, IssueWrites):
            self.walk(u.req, inner, names)
            self.walk(u.cond, inner, names)
            # Each write carries the grant's generation and decode epoch.
            self.of(u.req, ("p_gen", "p_epoch"), inner, names)
        elif isinstance(u, Reply):
            self.walk(u.req, inner, names)
        elif isinstance(u, Forget):
            self.walk(u.inst, inner, names)
        elif isinstance(u, Adopt):
            self.walk(u.req, inner, names)
            self.walk(u.gen, inner, names)
        elif not isinstance(u, Move):
            self.read |= _EVERY_FIELD

    def revival(
        self, u: Assign, inner: tuple[Term, ...], names: dict[int, str], eff: EffectFormula
    ) -> None:
        """`p(x)`, `d(x)`, `submitted(x)` or `not_as_is(x) := value`: where it may take a request out of
        a situation in which a field is cleared (a client's retry: back to `received`), that
        field must be set afresh by the same step, or its cleared value would be read as x's."""
        x = _key(u.target.args[0], names)
        for name, symbol in PREFILL_FIELDS.items():
            if (
                name not in self.read
                and _uncovers(u, name)
                and not _not_cleared(inner, x, names, name)
                and not any(_sets_afresh(v, symbol, x, u, names) for v in eff.updates)
            ):
                self.read.add(name)


def _uncovers(u: Assign, field: str) -> bool:
    """May `u` (an update of `p`, `d`, `submitted` or `not_as_is`) take a request in which
    `field` is cleared to a situation in which it is not? (The others stay as they were, unless
    the step updates them too: each update is asked on its own.)"""
    value = u.value.value if isinstance(u.value, Lit) else None
    symbol = u.target.symbol.name
    if symbol == "p":
        return value not in FINISHED
    if symbol == "submitted":
        return value is not True
    if field not in AS_IS_ONLY:
        return False
    if symbol == "d":
        return value is None or value in _BEFORE_DECODE_ADMISSION
    return value is not False  # not_as_is


def _sets_afresh(v: Any, symbol: str, x: Hashable, u: Assign, names: dict[int, str]) -> bool:
    """Does update `v` set `symbol` of request x (all of it, for a set) wherever `u` applies?"""
    if not isinstance(v, Assign) or v.target.symbol.name != symbol:
        return False
    if _key(v.target.args[0], names) != x:
        return False
    if v.when is not u.when and not (isinstance(v.when, Lit) and v.when.value is True):
        return False
    if symbol in _SET_SYMBOLS:
        element = v.target.args[1]
        return any(o is element for o in v.over)
    return True


def erasable_prefill_fields(variant: Variant, config: Config) -> tuple[str, ...]:
    """The prefill fields (`PREFILL_FIELDS`) the explorer may clear of every request prefill
    has finished with, for `variant` on `config`: no guard, effect, property or witness reads
    them of such a request (see `_Reads`), and a step that takes a finished request back to
    work sets every one of them afresh. Empty when some part of the variant cannot be read."""
    pairs = _rule_pairs(variant)
    if pairs is None:
        return ()
    reads = _Reads(config)
    if reads.multi:
        # With several decode instances, the address of what prefill sends and of the drain ack
        # it owes is read off the grant's pages (`message_dinst`, `ack_dinst`), finished or not.
        reads.read.add("p_pages")
    for g, e in pairs:
        names: dict[int, str] = {}
        guard: tuple[Term, ...] = ()
        if g is not None:
            names.update({id(v): f"arg{i}" for i, v in enumerate(g.params)})
            reads.walk(g.formula, (), names)
            guard = (g.formula,)
        if e is None:
            continue
        names.update({id(v): f"arg{i}" for i, v in enumerate(e.params)})
        for u in e.updates:
            reads.update(u, guard, names, e)
    for prop in ALWAYS:
        if not prop.reads:
            return ()
        if prop.formula is None:
            for part in prop.reads:
                name, _, field = part.partition(".")
                if name == "requests":
                    reads.read |= {field} & _EVERY_FIELD if field else _EVERY_FIELD
            continue
        # The formula, read like the rules': its Python function computes the same value on
        # every reachable state, and reads a field where the formula does (the fail-closed
        # property reads `p_wrote` of a request not admitted as sent, and only of such a one:
        # tests/model_checker/test_reduction.py runs the search with the cleared fields
        # poisoned, the Python functions included).
        reads.walk(prop.formula, (), {})
    for w in SOMETIMES:
        if w.formula is None:
            return ()
        reads.walk(w.formula, (), {})
    return tuple(f for f in PREFILL_FIELDS if f not in reads.read)


def merged(flags: Iterable[str], fields: Iterable[str]) -> str:
    """What a reduced search merged, in words ("ghost flags and finished requests' prefill
    fields"; empty: nothing)."""
    parts = []
    if list(flags):
        parts.append("ghost flags")
    if list(fields):
        parts.append("finished requests' prefill fields")
    return " and ".join(parts)


__all__: list[str] = [
    "FINISHED",
    "GHOST_FLAGS",
    "PREFILL_FIELDS",
    "Eraser",
    "erasable_ghost_flags",
    "erasable_prefill_fields",
    "flag_witnesses",
    "merged",
]
