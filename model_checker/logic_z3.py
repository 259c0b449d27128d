"""The Z3 readings of `spec/logic.py` formulas: the same claim objects the explorer evaluates.

`spec/invariants.py` writes each invariant once, and `spec/properties.py` each safety property,
over the symbols of `spec/vocabulary.py`. This module translates such a formula to Z3:

* `FixedReading`: over the fixed-configuration encoding (`z3_encoding.Encoding`): the sorts are
  the config's requests, pages and the one prefill rank it encodes, so quantifiers expand into
  finite conjunctions, and each symbol is one of the encoding's variables (or a small term over
  them, e.g. "page j is among the first p_wrote granted pages" is a count below j). Messages and
  writes in flight are the encoding's per-request slots.

The any-size model (`z3_derived`) reads the same formulas over uninterpreted sorts with its own
translation (`z3_derived.Model.tr`): its quantifiers stay quantifiers.

`fixed_properties` reads the `ALWAYS` properties; the engines check those. `fixed_witnesses`
reads the `SOMETIMES` witnesses, which `z3_witnesses` searches for to show the encoding can
move.

A reading that has no meaning for a symbol raises `Untranslatable`, naming it, so an engine
refuses a claim it cannot read instead of checking a different one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import z3

from kvhandoff.model_checker.z3_encoding import (
    FAULT_FIELDS,
    REASON,
    D,
    Encoding,
    P,
    SymState,
    att,
    epoch_var,
    read_shard,
    shard,
    slot,
    slot_args,
    slot_kind,
    slot_rank,
    write_args,
    write_var,
)
from kvhandoff.spec.logic import (
    D_PHASE,
    DINST,
    P_PHASE,
    PAGE,
    PINST,
    RANK,
    REQ,
    App,
    Bound,
    Count,
    Field,
    FieldSymbol,
    InFlight,
    Lit,
    Op,
    Quant,
    Sort,
    Term,
    Var,
)
from kvhandoff.spec.properties import ALWAYS, SOMETIMES
from kvhandoff.spec.state import OTHER_TENANT


class Untranslatable(Exception):
    """A formula reads a symbol (or kind of message) this reading has no meaning for."""


_CODES: dict[Sort, dict[str, int]] = {P_PHASE: P, D_PHASE: D}


def _is_z3(x: Any) -> bool:
    return isinstance(x, z3.ExprRef)


def _bool(x: Any) -> Any:
    return z3.BoolVal(x) if isinstance(x, bool) else x


class Reading:
    """How one Z3 model reads the vocabulary; `translate` does the rest."""

    def apply(self, name: str, args: tuple[Any, ...]) -> Any:
        raise NotImplementedError

    def domain(self, sort: Sort) -> Sequence[Any]:
        raise NotImplementedError

    def bound(self, sort: Sort) -> Any:
        """A fresh Z3 constant to quantify over `sort`, if it is uninterpreted (else None: the
        quantifier expands over `domain`)."""
        return None

    def in_flight(
        self, what: str, kinds: tuple[str, ...]
    ) -> list[tuple[list[Any], Any, dict[str, Any]]]:
        """(variables to quantify, presence condition, fields) of each slot that may hold such
        an item."""
        raise NotImplementedError

    def count(self, parts: Sequence[Any]) -> Any:
        """The number of true formulas among `parts` (the expansion of a `count`)."""
        raise Untranslatable("this reading has no counts")

    def integer(self, x: Any) -> Any:
        """`x`, a Python int where the reading fixed it, as a term of the reading's integers."""
        return z3.IntVal(x) if isinstance(x, int) and not isinstance(x, bool) else _bool(x)

    def field(self, name: str) -> Any:
        """A variant's own state field (`spec.logic.state_field`)."""
        raise Untranslatable(f"a variant's state field ({name!r}) is not in this model")


def translate(t: Term, reading: Reading, env: dict[int, Any] | None = None) -> Any:
    """The Z3 term (or Python value, where everything it reads is fixed) of `t`."""
    env = {} if env is None else env

    def go(t: Term) -> Any:
        if isinstance(t, Lit):
            if isinstance(t.value, tuple):
                return t.value
            codes = _CODES.get(t.sort)
            return codes[t.value] if codes is not None else t.value
        if isinstance(t, Field):
            value = env[id(t.var)][t.name]
            return value(go(t.arg)) if t.arg is not None else value
        if isinstance(t, Var):
            return env[id(t)]
        if isinstance(t, App) and isinstance(t.symbol, FieldSymbol):
            return reading.field(t.symbol.name)
        if isinstance(t, App):
            return reading.apply(t.symbol.name, tuple(go(a) for a in t.args))
        if isinstance(t, Quant):
            bound = reading.bound(t.var.sort)
            if bound is not None:  # an uninterpreted sort: a real quantifier
                env[id(t.var)] = bound
                body = _bool(go(t.body))
                return z3.ForAll([bound], body) if t.every else z3.Exists([bound], body)
            parts = []
            for x in reading.domain(t.var.sort):
                env[id(t.var)] = x
                parts.append(go(t.body))
            return _and(parts) if t.every else _or(parts)
        if isinstance(t, Count):
            if reading.bound(t.var.sort) is not None:
                raise Untranslatable(f"cannot count the elements of sort {t.var.sort.name}")
            parts = []
            for x in reading.domain(t.var.sort):
                env[id(t.var)] = x
                parts.append(_bool(go(t.body)))
            return reading.count(parts)
        if isinstance(t, InFlight):
            parts = []
            for bound_vars, present, fields in reading.in_flight(t.what, t.kinds):
                env[id(t.var)] = fields
                body = go(t.body)
                if body is True or present is False:
                    continue  # settled by the reading (e.g. a clause of several ranks, with one)
                part = z3.Implies(_bool(present), _bool(body))
                parts.append(z3.ForAll(bound_vars, part) if bound_vars else part)
            return _and(parts)
        if isinstance(t, Op) and t.op == "ite":
            c, a, b = (go(x) for x in t.args)
            if isinstance(c, bool):
                return a if c else b
            # Two fixed integers under a condition: terms of the reading's integer sort.
            return z3.If(c, reading.integer(a), reading.integer(b))
        if isinstance(t, Op):
            return _op(t, [go(a) for a in t.args])
        raise TypeError(f"cannot translate {t!r}")

    return _bool(go(t))


def _and(xs: Sequence[Any]) -> Any:
    """`z3.And`, with what a reading settled as a Python bool folded away (a rigid fact of the
    scenario, a request the expansion rules out): the formula Z3 gets is the one a person would
    have written for this configuration."""
    if any(x is False for x in xs):
        return False
    rest = [x for x in xs if x is not True]
    return True if not rest else rest[0] if len(rest) == 1 else z3.And(rest)


def _or(xs: Sequence[Any]) -> Any:
    """`z3.Or`, folded like `_and`."""
    if any(x is True for x in xs):
        return True
    rest = [x for x in xs if x is not False]
    return False if not rest else rest[0] if len(rest) == 1 else z3.Or(rest)


def _op(t: Op, a: list[Any]) -> Any:
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
        return z3.Implies(_bool(a[0]), _bool(a[1]))
    if op == "ite":
        return z3.If(_bool(a[0]), a[1], a[2])
    if op == "in":
        codes = _CODES[t.args[0].sort]
        return z3.Or([a[0] == codes[n] for n in a[1]])
    x, y = a
    # Python values where both sides are fixed (e.g. two requests of the expansion), Z3 terms
    # otherwise: the operators are the same.
    return _ARITH[op](x, y)


_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "eq": lambda x, y: x == y,
    "ne": lambda x, y: x != y,
    "lt": lambda x, y: x < y,
    "le": lambda x, y: x <= y,
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
}


class FixedReading(Reading):
    """The vocabulary over one time step `s` of the fixed-configuration encoding."""

    def __init__(self, enc: Encoding, s: SymState) -> None:
        self.enc, self.s = enc, s
        self.drain = enc.design.drain_fenced
        self._domains: dict[Sort, Sequence[int]] = {
            REQ: range(enc.n),
            PAGE: range(enc.np),
            RANK: range(enc.ranks),
            PINST: range(enc.config.prefill_instances),
            DINST: range(enc.config.decode_instances),
        }

    def domain(self, sort: Sort) -> Sequence[Any]:
        if sort not in self._domains:
            raise Untranslatable(f"no elements of sort {sort.name} in the fixed encoding")
        return self._domains[sort]

    def count(self, parts: Sequence[Any]) -> Any:
        return self.enc._count(parts)

    def integer(self, x: Any) -> Any:
        return self.enc.K(x) if isinstance(x, int) and not isinstance(x, bool) else _bool(x)

    def field(self, name: str) -> Any:
        if name not in self.enc.state_fields:
            raise Untranslatable(
                f"a formula reads state field {name!r}, which the variant does not declare in "
                "state_fields"
            )
        return self.s[f"v.{name}"]

    def tenant_id(self, name: str) -> Any:
        """A tenant as the encoding's integer: its index among the config's tenants (-1: a tenant
        of no request of the scenario)."""
        names = self.enc.tenant_names
        return self.enc.K(names.index(name) if name in names else -1)

    def tenant_of_data(self, req: Any) -> Any:
        """The tenant data of request `req` (a content tag's request) was written for: the
        encoding derives a tag's tenant from its request (`Encoding._tag`); on the pull path,
        request -1 is data from outside the scenario, labelled `OTHER_TENANT`. Any other value
        names no request: no tenant (-1)."""
        enc = self.enc
        out = self.enc.K(-1)
        if enc.pull:
            out = z3.If(req == -1, self.tenant_id(OTHER_TENANT), out)
        for r in reversed(range(enc.n)):
            out = z3.If(req == r, self.tenant_id(enc.config.requests[r].tenant), out)
        return out

    def apply(self, name: str, args: tuple[Any, ...]) -> Any:
        # A symbol applied to a symbolic request or page (e.g. d_gen(owner(q))): a case split
        # over the finite domain.
        for i, x in enumerate(args):
            if _is_z3(x):
                sort = self._arg_sorts(name)[i]
                # A decode instance's counter at a symbolic instance (`next_gen(m.dinst)` in
                # an invariant): a case split over the decode instances.
                instances = range(self.enc.decode_instances)
                values = list(instances if name == "next_gen" else self.domain(sort))

                def at(v: Any, i: int = i) -> Any:
                    # A rigid value (a room) as a term of the encoding's integer sort.
                    got = self.apply(name, (*args[:i], v, *args[i + 1 :]))
                    is_int = isinstance(got, int) and not isinstance(got, bool)
                    return self.enc.K(got) if is_int else _bool(got)

                out = at(values[-1])
                for v in reversed(values[:-1]):
                    out = z3.If(x == v, at(v), out)
                return out
        reader = _FIXED.get(name)
        if reader is None:
            raise Untranslatable(f"symbol {name!r} has no reading in the fixed encoding")
        return reader(self, *args)

    @staticmethod
    def _arg_sorts(name: str) -> tuple[Sort, ...]:
        from kvhandoff.spec import vocabulary

        symbol = getattr(vocabulary, name)
        return tuple(symbol.args)

    def in_flight(
        self, what: str, kinds: tuple[str, ...]
    ) -> list[tuple[list[Any], Any, dict[str, Any]]]:
        s, enc = self.s, self.enc
        out: list[tuple[list[Any], Any, dict[str, Any]]] = []
        if what == "write":
            for r in range(enc.n):
                for a in range(enc.attempts):
                    for j in range(enc.np):
                        for rank in range(enc.ranks):
                            w = write_var(r, j, rank, a)
                            out.append(([], s[w], self.write_fields(r, j, rank, a)))
            return out
        if what == "pending_ack":
            for r in range(enc.n):
                out.append(([], s[f"r{r}.pa"], {"req": r, "gen": s[f"r{r}.pa_gen"]}))
            return out
        slots = [k for k in enc.slot_kinds if k.split(".")[0] in kinds]
        if "failure" in kinds and "lease_failure" in enc.slot_kinds:
            slots.append("lease_failure")
        for kind in slots:
            k = slot(kind)
            for r in range(enc.n):
                for a in range(enc.attempts):
                    pre = att(r, a)
                    present = s[f"{pre}{k}_net"] + s[f"{pre}{k}_lost"] > 0
                    out.append(([], present, self.slot_fields(kind, r, a)))
        return out

    def write_fields(self, r: int, j: int, k: int = 0, a: int = 0) -> dict[str, Any]:
        """The fields of request r's write of rank k's shard of page j (`w{j}`, `w{j}s{k}`),
        issued by attempt a: the encoding keeps a write with its writer, so it carries the
        writer's grant, room, data and epoch by construction (with retries, the grant's
        generation and epoch the attempt recorded when it issued it: `wgen`, `wepoch`)."""
        s = self.s
        gen, epoch = s[f"r{r}.p_gen"], s[f"r{r}.p_epoch"]
        if self.enc.retries:
            gen, epoch = s[f"{att(r, a)}wgen"], s[f"{att(r, a)}wepoch"]
        return {
            "req": r,
            "page": j,
            "gen": gen,
            "data_gen": gen,
            "epoch": epoch,
            "right_room": True,
            "right_tenant": True,
            "rank": k,
            "rank_acked": self._rank_acked(r, k),
            "room": self.enc.rooms[r],
        }

    def _rank_acked(self, r: int, k: int) -> Any:
        """Rank k has acknowledged the abort of request r's grant (room and generation): the
        spec keeps `acked_ranks` by (room, generation, rank), the encoding by the request that
        owes the ack (`pak`), so any request of the same room owing it for that generation.
        One rank keeps none: its ack completes the drain."""
        enc, s = self.enc, self.s
        if enc.ranks == 1:
            return False
        owed = [
            z3.And(
                s[f"r{q}.pak{k}"],
                z3.If(s[f"r{q}.pa"], s[f"r{q}.pa_gen"], enc.K(0)) == s[f"r{r}.p_gen"],
            )
            for q in range(enc.n)
            if enc.rooms[q] == enc.rooms[r]
        ]
        return z3.Or(owed)

    def slot_fields(self, kind: str, r: int, a: int = 0) -> dict[str, Any]:
        """The fields of the message in request r's slot of `kind` for attempt a (the encoding
        keeps one distinct message per request, attempt, kind and, for completions and drain
        acks, rank; "lease_failure" is the pull path's notice)."""
        s = self.s
        k = slot(kind)
        rank = slot_rank(kind)
        completion = kind.split(".")[0] == "completion"
        pre = att(r, a)
        return {
            "req": r,
            "gen": s[f"{pre}{k}_gen"],
            "epoch": s[f"{pre}g_epoch"] if kind == "grant" else 0,
            "rank": rank,
            # That rank has already reported this request (kept with several ranks only: with
            # one, reporting completes the request).
            "rank_done": s[f"r{r}.prd{rank}"] if self.enc.ranks > 1 else False,
            "has_page": _grant_page(s, kind, pre),
            "reason_is": _failure_reason(s, kind, pre),
            "room": self.enc.rooms[r],
            "count": s[f"{pre}{k}_count"] if completion else 0,
            "has_digest": s[f"{pre}{k}_digest"] if completion else False,
            "attempt": a,
            # The decode instance at its decode end: decode's own for what decode sends, the
            # one of prefill's grant for what prefill sends (`spec.effects.message_dinst`).
            "dinst": self.enc.config.requests[r].decode_instance
            if kind.split(".")[0] in ("grant", "abort")
            else _p_dinst(self, r),
            "digest_page": (lambda j: s[f"{pre}{k}_dpages{j}"])
            if completion
            else (lambda j: False),
        }


def _counter(i: Any) -> str:
    """The variable of decode instance i's generation counter; i is a constant of the encoding
    (an instance is read off the scenario's placement or a page's number)."""
    if _is_z3(i):
        raise Untranslatable("a generation counter of an instance the step does not name")
    return "next_gen" if i == 0 else f"next_gen{i}"


def _p_dinst(f: Any, r: int) -> Any:
    """`p_dinst(r)`: the decode instance that sent the grant prefill holds for r
    (`p_grant_dinst`), else the one r is placed on (as the concrete reading)."""
    config = f.enc.config
    placed: Any = config.requests[r].decode_instance
    if config.decode_instances == 1:
        return placed
    return z3.If(f.s[f"r{r}.p_gen"] != f.enc.K(0), f.s[f"r{r}.p_gdinst"], f.enc.K(placed))


def _failure_reason(s: SymState, kind: str, pre: str) -> Callable[[str], Any]:
    """`m.reason_is(why)` for the slot: a failure notice says rejected or aborted (`f_aborted`),
    the pull path's lease notice says the lease expired; other messages give no reason."""
    if kind == "lease_failure":
        return lambda why: why == "lease expired"
    if kind != "failure":
        return lambda why: False
    aborted = s[f"{pre}f_aborted"]
    return lambda why: {"rejected": z3.Not(aborted), "aborted": aborted}.get(why, False)


def _grant_page(s: SymState, kind: str, pre: str) -> Callable[[Any], Any]:
    if kind != "grant":
        return lambda j: False
    return lambda j: s[f"{pre}g_pages{j}"]


def _r(field: str) -> Callable[[FixedReading, int], Any]:
    return lambda f, r: f.s[f"r{r}.{field}"]


def _rj(field: str) -> Callable[[FixedReading, int, int], Any]:
    return lambda f, r, j: f.s[f"r{r}.{field}{j}"]


def _pg(field: str) -> Callable[[FixedReading, int], Any]:
    return lambda f, j: f.s[f"pg{j}.{field}"]


def _ranked(field: str) -> Callable[[FixedReading, int, int], Any]:
    """A rank set (`prd`, `drk`, `dak`, `pak`): a variable per request and rank with several
    ranks; with one it stays empty (the one-rank model keeps none)."""
    return lambda f, r, k: f.s[f"r{r}.{field}{k}"] if f.enc.ranks > 1 else False


def _written(f: FixedReading, r: int, j: int) -> Any:
    s = f.s
    return z3.And(s[f"r{r}.p_pages{j}"], f.enc._rank(s, f"r{r}.p_pages", j) < s[f"r{r}.p_wrote"])


_GHOST_FLAGS = (
    "page_reuse",
    "cross_tenant_reuse",
    "refused_write",
    "drain_acked",
    "scrubbed_written_page",
    "cancelled_mid_transfer",
    "ok_after_crash",
    "ok_after_loss",
)


def _ghost(flag: str) -> Callable[[FixedReading], Any]:
    return lambda f: f.s[f"gh.{flag}"]


_FIXED: dict[str, Callable[..., Any]] = {
    "submitted": _r("submitted"),
    "answered": _r("ans_set"),
    # `ans_ok` means something only with `ans_set` (the spec's `ok` lives in the answer).
    "answered_ok": lambda f, r: z3.And(f.s[f"r{r}.ans_set"], f.s[f"r{r}.ans_ok"]),
    "not_as_is": _r("not_as_is"),
    "p": _r("p"),
    "p_gen": _r("p_gen"),
    "p_wrote": _r("p_wrote"),
    "p_epoch": _r("p_epoch"),
    "p_grant_dinst": _r("p_gdinst"),
    "p_granted": _rj("p_pages"),
    "p_granted_count": lambda f, r: f.enc._count(
        [f.s[f"r{r}.p_pages{j}"] for j in range(f.enc.np)]
    ),
    "p_written": _written,
    # Issued: counted as written, or some rank's write of it in flight.
    "issued": lambda f, r, j: z3.Or(
        *(f.s[write_var(r, j, k, a)] for a in range(f.enc.attempts) for k in range(f.enc.ranks)),
        _written(f, r, j),
    ),
    "p_rank_done": _ranked("prd"),
    "d": _r("d"),
    "d_gen": _r("d_gen"),
    "d_holds": _rj("d_pages"),
    "d_awaiting_ack": _r("d_awaiting"),
    "d_rank": _ranked("drk"),
    "d_ack": _ranked("dak"),
    "read_done": _r("read_set"),
    "accepted_set": _r("acc_set"),
    "owned": _pg("own"),
    "owner": _pg("own_req"),
    "owner_gen": _pg("own_gen"),
    "shard_has": lambda f, j, k: f.s[f"{shard(j, k)}has"],
    "shard_req": lambda f, j, k: f.s[f"{shard(j, k)}c_req"],
    "shard_gen": lambda f, j, k: f.s[f"{shard(j, k)}c_gen"],
    "shard_outside": lambda f, j, k: (f.s[f"{shard(j, k)}c_req"] == -1) if f.enc.pull else False,
    # What decode read: one slot per page (`read_pages{j}`, and the tag it read there,
    # `rc{j}_...`, per rank `rc{j}s{k}_...`), meaningful once `read_set`.
    "read_page": lambda f, r, j: z3.And(f.s[f"r{r}.read_set"], f.s[f"r{r}.read_pages{j}"]),
    "read_has": lambda f, r, j, k: f.s[f"{read_shard(r, j, k)}_has"],
    "read_req": lambda f, r, j, k: f.s[f"{read_shard(r, j, k)}_req"],
    "read_gen": lambda f, r, j, k: f.s[f"{read_shard(r, j, k)}_gen"],
    "read_tenant": lambda f, r, j, k: f.tenant_of_data(f.s[f"{read_shard(r, j, k)}_req"]),
    "accepted_full": _r("acc_full"),
    "tenant": lambda f, r: f.tenant_id(f.enc.config.requests[r].tenant),
    "late_landing": lambda f: f.s["gh.late_landing"],
    # The witnesses' ghost flags and fault count: the encoding keeps each as a variable of its own
    # (`gh.FLAG`, `f.timeouts`), set by the same steps as the spec's.
    **{flag: _ghost(flag) for flag in _GHOST_FLAGS},
    "timeouts_spent": lambda f: f.s["f.timeouts"],
    # An answer's reason is an index into `REASONS`, meaningful only with `ans_set`.
    "timed_out_waiting": lambda f, r: z3.And(
        f.s[f"r{r}.ans_set"], f.s[f"r{r}.ans_reason"] == REASON["timed out waiting for prefill"]
    ),
    # Rigid: a Python bool, fixed by the config (the expansion drops the requests it rules out).
    "over_prefill_limit": lambda f, r: f.enc.lens[r] > f.enc.config.prefill_max_prompt,
    # What the guards read: the encoding's own variables, and the scenario's limits as Python
    # values (rigid: the expansion settles them per request).
    "p_len": _r("p_len"),
    "d_cancel": _r("d_cancel"),
    "p_cancel": _r("p_cancel"),
    "prefill_epoch": lambda f, i: f.s[epoch_var("prefill_epoch", i)],
    "decode_seen_prefill_epoch": lambda f, j, i: f.s[epoch_var("dsp", j, i)],
    "prefill_seen_decode_epoch": lambda f, i, j: f.s[epoch_var("psd", i, j)],
    "prompt_pages": lambda f, r: f.enc.lens[r],
    "over_decode_limit": lambda f, r: f.enc.lens[r] > f.enc.config.decode_max_prompt,
    "max_active": lambda f: f.enc.config.max_active,
    "waits_for": lambda f, r, q: f.enc.config.submit_in_order and q == r - 1,
    "d_epoch": _r("d_epoch"),
    "page_used": _pg("lt_set"),
    "last_tenant": _pg("lt"),
    "crashes_spent": lambda f: f.s["f.crashes"],
    "drops_spent": lambda f: f.s["f.drops"],
    "over_context_window": lambda f, r: f.enc.lens[r] > f.enc.config.context_window,
    "truncated_len": lambda f: max(1, f.enc.config.prefill_max_prompt),
    "cancels_spent": lambda f: f.s["f.cancels"],
    "prefill_aborts_spent": lambda f: f.s["f.prefill_aborts"],
    "duplicates_spent": lambda f: f.s["f.duplicates"],
    "partitions_spent": lambda f: f.s["f.partitions"],
    "write_errors_spent": lambda f: f.s["f.write_errors"],
    "faults_spent": lambda f: z3.Sum([f.s[f"f.{k}"] for k in FAULT_FIELDS]),
    "max_faults": lambda f: f.enc.config.max_faults,
    "max_crashes": lambda f: f.enc.config.max_crashes,
    "max_drops": lambda f: f.enc.config.max_drops,
    "max_duplicates": lambda f: f.enc.config.max_duplicates,
    "max_timeouts": lambda f: f.enc.config.max_timeouts,
    "max_cancels": lambda f: f.enc.config.max_cancels,
    "max_prefill_aborts": lambda f: f.enc.config.max_prefill_aborts,
    "max_partitions": lambda f: f.enc.config.max_partitions,
    "max_write_errors": lambda f: f.enc.config.max_write_errors,
    "room": lambda f, r: f.enc.rooms[r],
    "pending_ack": _r("pa"),
    "pending_ack_gen": _r("pa_gen"),
    "p_acked": _ranked("pak"),
    "p_lease_expired": _r("lease_expired"),
    # Instances: where a request is placed and whose pool a page is in are the scenario's
    # (constants of the encoding); each decode instance has its own counter variable.
    "next_gen": lambda f, i: f.s[_counter(i)],
    "d_inst": lambda f, r: f.enc.config.requests[r].decode_instance,
    "p_inst": lambda f, r: f.enc.config.requests[r].prefill_instance,
    "page_inst": lambda f, j: f.enc.config.page_instance(j),
    "p_dinst": lambda f, r: _p_dinst(f, r),
    "decode_epoch": lambda f, j: f.s[epoch_var("decode_epoch", j)],
    "prefill_ranks": lambda f: f.enc.ranks,
    "drain_fence": lambda f: f.drain,
    # A client's retry: variables only where the scenario allows retries (without them no retry
    # happens, and every attempt number is 0).
    "retries_spent": lambda f: f.s["f.retries"] if f.enc.retries else 0,
    "max_retries": lambda f: f.enc.config.max_retries,
    "attempt": lambda f, r: f.s[f"r{r}.attempt"] if f.enc.retries else 0,
}


# --- effects over the fixed encoding -------------------------------------------------------------
#
# An effect (`spec/effects.py`) assigns entries of state symbols; over the fixed encoding each
# entry is one variable, so the effect becomes the new value of each variable it may change:
# `If(when, value, old)`, where `old` is what an earlier update of the same effect left (or the
# variable itself). Every value is translated over the state *before* the step.


def _request_var(field: str) -> Callable[[int], str]:
    return lambda r: f"r{r}.{field}"


_FIXED_VARS: dict[str, Callable[..., str]] = {
    **{
        name: _request_var(field)
        for name, field in {
            "submitted": "submitted",
            "answered": "ans_set",  # only ever withdrawn (a retry): see `spec.effects`
            "not_as_is": "not_as_is",
            "p": "p",
            "p_len": "p_len",
            "p_gen": "p_gen",
            "p_wrote": "p_wrote",
            "p_epoch": "p_epoch",
            "p_grant_dinst": "p_gdinst",
            "d": "d",
            "d_gen": "d_gen",
            "d_epoch": "d_epoch",
            "d_awaiting_ack": "d_awaiting",
            "d_cancel": "d_cancel",
            "p_cancel": "p_cancel",
            "read_done": "read_set",
            "accepted_set": "acc_set",
            "accepted_full": "acc_full",
            "p_lease_expired": "lease_expired",
            "pending_ack": "pa",
            "pending_ack_gen": "pa_gen",
        }.items()
    },
    "d_holds": lambda r, j: f"r{r}.d_pages{j}",
    "p_granted": lambda r, j: f"r{r}.p_pages{j}",
    "read_page": lambda r, j: f"r{r}.read_pages{j}",
    "read_has": lambda r, j, k: f"{read_shard(r, j, k)}_has",
    "read_req": lambda r, j, k: f"{read_shard(r, j, k)}_req",
    "read_gen": lambda r, j, k: f"{read_shard(r, j, k)}_gen",
    "owned": lambda j: f"pg{j}.own",
    "owner": lambda j: f"pg{j}.own_req",
    "owner_gen": lambda j: f"pg{j}.own_gen",
    "page_used": lambda j: f"pg{j}.lt_set",
    "last_tenant": lambda j: f"pg{j}.lt",
    "shard_has": lambda j, k: f"{shard(j, k)}has",
    "shard_req": lambda j, k: f"{shard(j, k)}c_req",
    "shard_gen": lambda j, k: f"{shard(j, k)}c_gen",
    "p_rank_done": lambda r, k: f"r{r}.prd{k}",
    "d_rank": lambda r, k: f"r{r}.drk{k}",
    "d_ack": lambda r, k: f"r{r}.dak{k}",
    "p_acked": lambda r, k: f"r{r}.pak{k}",
    "crashes_spent": lambda: "f.crashes",
    "drops_spent": lambda: "f.drops",
    "timeouts_spent": lambda: "f.timeouts",
    "cancels_spent": lambda: "f.cancels",
    "prefill_aborts_spent": lambda: "f.prefill_aborts",
    "duplicates_spent": lambda: "f.duplicates",
    "partitions_spent": lambda: "f.partitions",
    "write_errors_spent": lambda: "f.write_errors",
    "next_gen": lambda i: _counter(i),
    "prefill_epoch": lambda i: epoch_var("prefill_epoch", i),
    "decode_epoch": lambda j: epoch_var("decode_epoch", j),
    "retries_spent": lambda: "f.retries",
    "attempt": lambda r: f"r{r}.attempt",
    "decode_seen_prefill_epoch": lambda j, i: epoch_var("dsp", j, i),
    "prefill_seen_decode_epoch": lambda i, j: epoch_var("psd", i, j),
    "late_landing": lambda: "gh.late_landing",
    **{flag: (lambda f: lambda: f"gh.{f}")(flag) for flag in _GHOST_FLAGS},
}
"""The encoding's variable of each entry of a state symbol."""
_NOT_KEPT = frozenset({"p_rank_done", "d_rank", "d_ack", "p_acked"})
"""Rank sets the one-rank encoding does not keep (they stay empty): an effect may only clear them.
With several ranks each is a variable per request and rank."""


def _select(when: Any, value: Any, old: Any) -> Any:
    if when is True or (_is_z3(when) and z3.is_true(when)):
        return value
    if when is False or (_is_z3(when) and z3.is_false(when)):
        return old
    return z3.If(when, value, old)


def _exclusive(earlier: list[Any], when: Any) -> bool:
    """No state satisfies `when` together with any of `earlier` (Z3 decides: a few atoms)."""
    for other in earlier:
        both = z3.simplify(z3.And(_bool(other), _bool(when)))
        if z3.is_false(both):
            continue  # settled without a solver (e.g. on a concrete state)
        solver = z3.Solver()
        solver.add(_bool(other), _bool(when))
        if solver.check() != z3.unsat:
            return False
    return True


def fixed_effect(enc: Encoding, s: SymState, eff: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    """The variables `eff` (a `spec.effects.EffectFormula`) may change when taken with `args` in
    state `s`, with their new values."""
    from kvhandoff.spec.effects import Adopt, Assign, Forget, Move, Reply, Send

    reading = FixedReading(enc, s)
    new: dict[str, Any] = {}
    sent: dict[str, list[Any]] = {}
    taken: tuple[str, int, int] | None = None
    write: tuple[int, int, int, int] | None = None
    if eff.params and isinstance(eff.params[0], Bound) and eff.params[0].what_of == "write":
        # A step that takes a write: the instance names it, `(r, j)`, with ranks `(r, j, k)`,
        # of a retry's attempt a `(r, j, k, a)`.
        write = write_args(args)
        args = (reading.write_fields(*write),)
    elif eff.params and isinstance(eff.params[0], Bound):
        # A step that takes a message: the instance names its slot, `(kind, r)` or `(kind, r, a)`.
        taken = slot_args(args)
        args = (reading.slot_fields(*taken),)
    elif len(eff.params) == 2 and len(args) == 1:
        args = (*args, 0)  # a step of each prefill rank, with one rank: `(r,)`

    def old(name: str) -> Any:
        return new.get(name, s[name])

    def value(x: Any) -> Any:
        if isinstance(x, bool):
            return z3.BoolVal(x)
        if isinstance(x, int):
            return enc.K(x)
        return x

    def put(name: str, when: Any, v: Any) -> None:
        new[name] = _select(when, value(v), old(name))

    for u in eff.updates:
        for binding in itertools.product(*(reading.domain(v.sort) for v in u.over)):
            env = {id(p): a for p, a in zip((*eff.params, *u.over), (*args, *binding), strict=True)}

            def tr(t: Term, env: dict[int, Any] = env) -> Any:
                return translate(t, reading, env)

            when = tr(u.when)
            if isinstance(u, Assign):
                name = u.target.symbol.name
                at = tuple(tr(a) for a in u.target.args)
                if any(_is_z3(a) for a in at):
                    raise Untranslatable(f"{name}: an update's target must name its entry")
                if isinstance(u.target.symbol, FieldSymbol):
                    reading.field(name)  # declared?
                    put(f"v.{name}", when, tr(u.value))
                    continue
                if name in _NOT_KEPT and enc.ranks == 1:
                    v = tr(u.value)
                    never = when is False or (_is_z3(when) and z3.is_false(when))
                    if not (never or v is False or (_is_z3(v) and z3.is_false(v))):
                        raise Untranslatable(f"{name} is not kept by the one-rank encoding")
                    continue
                if name == "p_lease_expired" and not enc.pull:
                    # The push path keeps no lease (a retry's reset clears it: nothing to do).
                    v = tr(u.value)
                    if not (v is False or (_is_z3(v) and z3.is_false(v))):
                        raise Untranslatable("p_lease_expired set on the push path")
                    continue
                if name not in _FIXED_VARS:
                    raise Untranslatable(f"symbol {name!r} is not a variable of the fixed encoding")
                put(_FIXED_VARS[name](*at), when, tr(u.value))
            elif isinstance(u, Send):
                r = tr(u.req)
                # On the pull path the lease expiry notice has a slot of its own; with several
                # ranks, each rank's completion and drain ack has its own.
                rank = 0 if u.rank is None else tr(u.rank)
                if _is_z3(rank):
                    raise Untranslatable(f"a {u.kind} sent by a rank the step does not name")
                kind: str = "lease_failure" if u.reason == "lease expired" else u.kind
                k = slot(slot_kind(kind, rank))
                sent_when = when
                # With retries, into the slot of the sender's attempt (`attempt(r)`, which the
                # message carries).
                for a in range(enc.attempts):
                    pre = att(r, a)
                    if enc.retries:
                        when = z3.And(_bool(sent_when), s[f"r{r}.attempt"] == a)
                    net = f"{pre}{k}_net"
                    # A second send into the same slot under a condition that excludes the
                    # first (decode aborting a request it gives up on, or asking again for a
                    # drain ack) adds to the count *before* the step: the same value, and a form
                    # in which the step-bounds analysis sees that the step adds at most one.
                    base = s[net] if _exclusive(sent.get(net, []), when) else old(net)
                    put(net, when, base + 1)
                    sent.setdefault(net, []).append(when)
                    put(f"{pre}{k}_gen", when, tr(u.gen))
                    if u.epoch is not None:
                        put(f"{pre}g_epoch", when, tr(u.epoch))
                    if u.count is not None:
                        put(f"{pre}{k}_count", when, tr(u.count))
                    if u.kind == "completion":
                        put(f"{pre}{k}_digest", when, u.digest)
                    if u.page is not None and u.digest_page is not None:
                        for j in range(enc.np):
                            env[id(u.page)] = j
                            dp = translate(u.digest_page, reading, env)
                            put(f"{pre}{k}_dpages{j}", when, dp)
                    if u.page is not None and u.has_page is not None:
                        for j in range(enc.np):
                            env[id(u.page)] = j
                            put(f"{pre}g_pages{j}", when, translate(u.has_page, reading, env))
                    if u.kind == "failure" and u.reason != "lease expired":
                        put(f"{pre}f_aborted", when, u.reason == "aborted")
            elif isinstance(u, Adopt):
                # The encoding keeps an orphan with the request whose grant it came from.
                r = tr(u.req)
                put(f"r{r}.orph", when, True)
                put(f"r{r}.orph_gen", when, tr(u.gen))
            elif isinstance(u, Forget):
                # The orphans of the instance's requests (an instance is a constant here).
                inst = tr(u.inst)
                for r in range(enc.n):
                    if enc.config.requests[r].prefill_instance == inst:
                        put(f"r{r}.orph", when, False)
            elif isinstance(u, Move) and write is not None:
                put(write_var(*write), when, False)  # it arrived: off the wire
            elif isinstance(u, Move):
                assert taken is not None
                kind, r, a = taken
                net, lost = (f"{att(r, a)}{slot(kind)}_{w}" for w in ("net", "lost"))
                if u.op in ("consume", "lose"):
                    put(net, when, old(net) - 1)
                if u.op == "lose":
                    put(lost, when, old(lost) + 1)
                if u.op == "resend":
                    put(lost, when, old(lost) - 1)
                    put(net, when, old(net) + 1)
                if u.op == "copy":
                    put(net, when, old(net) + 1)
            elif isinstance(u, Reply):
                r = tr(u.req)
                was = s[f"r{r}.ans_set"]
                if u.ok:
                    ok = z3.BoolVal(True)
                    reason = enc.K(0)
                else:
                    ok = z3.BoolVal(False)
                    reason = enc.K(enc.reason_code(u.reason))
                put(f"r{r}.ans_ok", when, z3.If(was, s[f"r{r}.ans_ok"], ok))
                put(f"r{r}.ans_reason", when, z3.If(was, s[f"r{r}.ans_reason"], reason))
                put(f"r{r}.ans_set", when, True)
            else:
                r = tr(u.req)
                for a in range(enc.attempts):
                    # With retries, into the slots of prefill's attempt, which record the grant
                    # the writes carry (`write_fields`).
                    now = s[f"r{r}.attempt"] == a if enc.retries else True
                    for j in range(enc.np):
                        env[id(u.page)] = j
                        issued = translate(u.cond, reading, env)
                        if enc.retries:
                            issued = z3.And(_bool(issued), now)
                            put(f"{att(r, a)}wgen", issued, s[f"r{r}.p_gen"])
                            put(f"{att(r, a)}wepoch", issued, s[f"r{r}.p_epoch"])
                        for rank in range(enc.ranks):  # every rank writes its shard of the page
                            w = write_var(r, j, rank, a)
                            put(w, True, z3.Or(old(w), issued))
    return new


# --- the safety properties -----------------------------------------------------------------------


def fixed_properties(enc: Encoding, s: SymState) -> dict[str, Any]:
    """The `ALWAYS` properties over one state of the fixed encoding: the formulas of
    `spec/properties.py` themselves (`Encoding.properties`, which bmc, kind, spacer and the
    fixed-configuration prove check)."""
    reading = FixedReading(enc, s)
    return {p.name: translate(_formula(p.name), reading) for p in ALWAYS}


def _formula(name: str) -> Term:
    prop = next(p for p in ALWAYS if p.name == name)
    if prop.formula is None:
        raise Untranslatable(f"{name} has no formula")
    return prop.formula


# --- the witnesses -------------------------------------------------------------------------------


def fixed_witnesses(enc: Encoding, s: SymState) -> dict[str, Any]:
    """The `SOMETIMES` witnesses over one state of the fixed encoding: the formulas of
    `spec/properties.py` themselves (what `z3_witnesses.fixed_movement` searches for)."""
    reading = FixedReading(enc, s)
    return {w.name: translate(_witness_formula(w.name), reading) for w in SOMETIMES}


def _witness_formula(name: str) -> Term:
    witness = next(w for w in SOMETIMES if w.name == name)
    if witness.formula is None:
        raise Untranslatable(f"{name} has no formula")
    return witness.formula
