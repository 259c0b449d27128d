"""Effects written as formulas: what a step changes, in the language of `spec/logic.py`.

A guard says *when* a step may happen; an effect says *what changes*. Written as a Python function
over a `State`, an effect can only be run. Written here, as a list of updates over the symbols of
`spec/vocabulary.py`, it can be run (the concrete reading below, a new `State`) and translated
(`model_checker/logic_z3.py`: new values for the fixed encoding's variables), the way mypyvy and
Ivy state a transition as `new(f)(x) = ...`.

The updates:

* `assign(d(r), "reserved")`: one entry of a state symbol gets a new value. With `each(PAGE,
  lambda q: assign(d_holds(r, q), ...))` every page's entry does; with `when=` only where the
  condition holds.
* `send("grant", r, gen=..., epoch=..., pages=lambda q: ...)`: a message goes out. Messages are not
  a symbol: the network is a multiset, and each reading keeps it its own way (a sorted tuple of
  `Message`s; a slot per request and kind with a count).
* `answer_error(r, reason)` / `answer_ok(r)`: the client's answer, if it has none yet (an answer is
  given once; the first one stands).
* `issue_writes(r, lambda q: ...)`: prefill puts the writes of r's data into those pages on the
  wire (one per rank), under the grant it holds.

Every value is read in the state *before* the step (simultaneous assignment, as in TLA+ and
mypyvy): an effect is a function of the old state, and the order of its updates matters only where
two write the same entry (the later one wins where its condition holds).
"""

from __future__ import annotations

import bisect
import inspect
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Union

from kvhandoff.spec.config import Config
from kvhandoff.spec.logic import (
    PAGE,
    RANK,
    REQ,
    TRUE,
    App,
    FieldSymbol,
    Lit,
    Sort,
    Term,
    Var,
    lift,
    python_source,
)
from kvhandoff.spec.state import (
    OTHER_TENANT,
    Answer,
    Ghost,
    Message,
    MessageKind,
    PageState,
    ReqState,
    State,
    Tag,
    Write,
    evolve,
)

# --- the updates ---------------------------------------------------------------------------------


@dataclass(eq=False)
class Assign:
    """`target := value` where `when` holds, for every value of the bound variables `over`."""

    target: App
    value: Term
    when: Term = TRUE
    over: tuple[Var, ...] = ()


@dataclass(eq=False)
class Send:
    """A message of `kind` from request `req`'s worker, where `when` holds. `gen` is the
    generation it names; a grant also names decode's `epoch` and its `pages`; a failure notice
    its `reason` ("rejected" or "aborted")."""

    kind: MessageKind
    req: Term
    gen: Term
    when: Term = TRUE
    epoch: Term | None = None
    page: Var | None = None
    has_page: Term | None = None
    reason: str = ""
    over: tuple[Var, ...] = ()
    count: Term | None = None
    """A completion: the page count it reports."""
    digest: bool = False
    """A completion: it carries a digest of the pages `digest_page` names (each page with the
    sender's request and the message's generation)."""
    digest_page: Term | None = None
    rank: Term | None = None
    """The prefill rank that sends it (completions)."""


@dataclass(eq=False)
class Reply:
    """The client's answer for `req`, where `when` holds and it has none yet: an error with
    `reason`, or (ok) the output generated from what decode read."""

    req: Term
    ok: bool
    reason: str = ""
    when: Term = TRUE
    over: tuple[Var, ...] = ()


@dataclass(eq=False)
class IssueWrites:
    """Prefill issues the writes of `req`'s data into every page where `cond(page)` holds, under
    the grant it holds (its generation and epoch), one per prefill rank."""

    req: Term
    page: Var
    cond: Term
    when: Term = TRUE
    over: tuple[Var, ...] = ()


@dataclass(eq=False)
class Forget:
    """The transfer state prefill instance `inst` kept for grants of rooms it no longer served
    (the orphan-grant design, M18) is lost (a crash). Like the orphans, this is prefill's
    bookkeeping, not a symbol (the drain acks it owed are the symbols `pending_ack` and
    `p_acked`, cleared by assignment)."""

    inst: Term
    when: Term = TRUE
    over: tuple[Var, ...] = ()


def forget_orphans(inst: Term) -> list[Update]:
    return [Forget(inst)]


@dataclass(eq=False)
class Adopt:
    """Prefill keeps transfer state for a grant of a room it no longer knows (the orphan-grant
    design, M18): the grant's room (that of request `req`), its generation `gen`, at the prefill
    instance `req` is placed on. Orphans are prefill's bookkeeping, not a symbol: nothing reads
    them but the bound on what prefill keeps."""

    req: Term
    gen: Term
    when: Term = TRUE
    over: tuple[Var, ...] = ()


def adopt_orphan(r: Term, gen: object, when: Term = TRUE) -> list[Update]:
    return [Adopt(r, lift(gen), when)]


@dataclass(eq=False)
class Move:
    """What happens to the step's own message `m`: `consume` (received: one copy leaves the
    network), `lose` (its RPC failed: from the network to the messages to send again), `resend`
    (sent again: back to the network) or `copy` (delivered twice: one more copy)."""

    m: Var
    op: str
    when: Term = TRUE
    over: tuple[Var, ...] = ()


Update = Union[Assign, Send, Reply, IssueWrites, Move, Forget, Adopt]  # noqa: UP007 (a runtime alias)
Updates = Iterable[Any]
"""Updates, possibly in nested lists: each helper below returns a list, and a rule lists them."""


def _flatten(groups: Updates) -> list[Update]:
    out: list[Update] = []
    for g in groups:
        if isinstance(g, (Assign, Send, Reply, IssueWrites, Move, Forget, Adopt)):
            out.append(g)
        else:
            out += _flatten(g)
    return out


@dataclass(eq=False)
class EffectFormula:
    """An effect of an action's arguments (`params`: its request, or nothing)."""

    params: tuple[Var, ...]
    updates: tuple[Update, ...]
    written: frozenset[str] = field(default_factory=frozenset)
    """The names of the symbols some update assigns."""

    def __repr__(self) -> str:
        return f"effect({', '.join(map(repr, self.params))}: {len(self.updates)} updates)"


def assign(target: Term, value: object, when: Term = TRUE) -> list[Update]:
    """`target := value` (where `when` holds). The target is a state symbol applied to the
    action's request or to variables bound by `each`."""
    if not isinstance(target, App):
        raise TypeError(f"assign: the target must be a symbol applied to arguments, got {target!r}")
    if target.symbol.name not in WRITABLE and not isinstance(target.symbol, FieldSymbol):
        raise ValueError(
            f"assign: {target.symbol.name!r} is not part of the state (it is rigid, a fact of the "
            "scenario, or read off other symbols): assign the state symbols it is made of; "
            f"state symbols: {', '.join(sorted(WRITABLE))}"
        )
    if isinstance(value, str):  # a phase name
        if value not in target.sort.values:
            raise ValueError(f"{value!r} is not a {target.sort.name}: one of {target.sort.values}")
        v: Term = Lit(value, target.sort)
    else:
        v = lift(value)
    if v.sort != target.sort and not (v.sort.name == "Int" and target.sort in (REQ, PAGE)):
        raise TypeError(f"assign {target!r}: value of sort {v.sort.name}, want {target.sort.name}")
    return [Assign(target, v, when)]


def each(sort: Sort, body: Callable[[Var], Updates]) -> list[Update]:
    """The updates of `body`, for every element of `sort`."""
    v = Var(sort, sort.name[0].lower())
    out = _flatten(body(v))
    for u in out:
        u.over = (v, *u.over)
    return out


def send(
    kind: MessageKind,
    r: Term,
    *,
    gen: object,
    when: Term = TRUE,
    epoch: object = None,
    pages: Callable[[Var], Term] | None = None,
    reason: str = "",
    count: object = None,
    digest: bool = False,
    digest_pages: Callable[[Var], Term] | None = None,
    rank: object = None,
) -> list[Update]:
    page = Var(PAGE, "q")
    return [
        Send(
            kind,
            r,
            lift(gen),
            when,
            None if epoch is None else lift(epoch),
            page,
            None if pages is None else pages(page),
            reason,
            count=None if count is None else lift(count),
            digest=digest,
            digest_page=None if digest_pages is None else digest_pages(page),
            rank=None if rank is None else lift(rank),
        )
    ]


def answer_error(r: Term, reason: str, when: Term = TRUE) -> list[Update]:
    return [Reply(r, False, reason, when)]


def answer_ok(r: Term) -> list[Update]:
    return [Reply(r, True)]


def issue_writes(r: Term, pages: Callable[[Var], Term]) -> list[Update]:
    q = Var(PAGE, "q")
    return [IssueWrites(r, q, pages(q))]


def consume(m: Var) -> list[Update]:
    return [Move(m, "consume")]


def lose(m: Var) -> list[Update]:
    return [Move(m, "lose")]


def resend(m: Var) -> list[Update]:
    return [Move(m, "resend")]


def copy(m: Var) -> list[Update]:
    return [Move(m, "copy")]


def write_effect(body: Callable[[Any], Updates]) -> EffectFormula:
    """The effect of a step that takes a page write `w` (see `spec.logic.write_guard`):
    `consume(w)` says it arrived (it leaves the wire)."""
    from kvhandoff.spec.logic import WRITE_FIELDS, Bound

    w = Bound("w", WRITE_FIELDS, "write")
    updates = tuple(_flatten(body(w)))
    written = frozenset(u.target.symbol.name for u in updates if isinstance(u, Assign))
    return EffectFormula((w,), updates, written)


def message_effect(body: Callable[[Any], Updates]) -> EffectFormula:
    """The effect of a step that takes a message `m` (see `spec.logic.message_guard`): its
    fields are terms (`m.req`, `m.gen`, ...), and `consume(m)`, `lose(m)`, `resend(m)`,
    `copy(m)` say what happens to it."""
    from kvhandoff.spec.logic import MESSAGE_FIELDS, Bound

    m = Bound("m", MESSAGE_FIELDS, "message")
    updates = tuple(_flatten(body(m)))
    written = frozenset(u.target.symbol.name for u in updates if isinstance(u, Assign))
    return EffectFormula((m,), updates, written)


def effect(body: Callable[..., Updates]) -> EffectFormula:
    """`effect(lambda r: [assign(...), send(...), ...])`: the effect of a step of one request
    (`lambda r, k: ...` of one request and prefill rank; `lambda: ...` of none), its updates
    listed in groups (each helper returns a list)."""
    arity = len(inspect.signature(body).parameters)
    if arity > 2:
        raise TypeError(
            f"effect(...) takes a function of one request (and a prefill rank) or of nothing, "
            f"not of {arity} arguments"
        )
    # One argument: the request; two: the request and the prefill rank (a step of each rank).
    params = tuple(Var(sort, sort.name[0].lower()) for sort in (REQ, RANK)[:arity])
    updates = tuple(_flatten(body(*params)))
    written = frozenset(u.target.symbol.name for u in updates if isinstance(u, Assign))
    return EffectFormula(params, updates, written)


def instance_effect(sorts: Any, body: Callable[..., Updates]) -> EffectFormula:
    """The effect of a step of one instance (or pair), whose guard is `spec.logic.instance_guard`
    over the same `sorts`: `instance_effect((PINST,), lambda ip: [...])`."""
    from kvhandoff.spec.logic import INSTANCE_PARAM_NAMES

    params = tuple(Var(sort, INSTANCE_PARAM_NAMES[sort]) for sort in sorts)
    updates = tuple(_flatten(body(*params)))
    written = frozenset(u.target.symbol.name for u in updates if isinstance(u, Assign))
    return EffectFormula(params, updates, written)


def terms_of(u: Update) -> list[Term]:
    """The terms an update reads (for the symbols a reading must know)."""
    if isinstance(u, Assign):
        return [*u.target.args, u.value, u.when]
    if isinstance(u, Send):
        parts = (u.req, u.gen, u.when, u.epoch, u.has_page, u.count, u.digest_page, u.rank)
        return [x for x in parts if x is not None]
    if isinstance(u, Reply):
        return [u.req, u.when]
    if isinstance(u, Move):
        return [u.when]
    if isinstance(u, Forget):
        return [u.inst, u.when]
    if isinstance(u, Adopt):
        return [u.req, u.gen, u.when]
    return [u.req, u.cond]


# --- the concrete reading: an effect run on a `State` --------------------------------------------
#
# Each state symbol an effect may assign is a field (or part of one) of the spec's state. The
# values are computed first, all in the old state; then the new state is built from them, field
# by field, the parts of a field no update touched read from the old state.

_REQ_FIELDS = {
    "submitted": "submitted",
    "not_as_is": "not_as_is",
    "p": "p",
    "p_len": "p_len",
    "p_gen": "p_gen",
    "p_wrote": "p_wrote",
    "p_epoch": "p_epoch",
    "p_grant_dinst": "p_grant_dinst",
    "d": "d",
    "d_gen": "d_gen",
    "d_epoch": "d_epoch",
    "d_awaiting_ack": "d_awaiting_ack",
    "d_cancel": "d_cancel",
    "p_cancel": "p_cancel",
    "p_lease_expired": "p_lease_expired",
    "attempt": "attempt",
}
"""Symbols of one request that are a field of `ReqState` as they are."""
_REQ_SETS = {
    "d_holds": "d_pages",
    "p_granted": "p_pages",
    "p_rank_done": "p_ranks_done",
    "d_rank": "d_ranks",
    "d_ack": "d_acks",
}
"""Relations of a request and a page (or rank): the field is the ascending tuple of the pages
(ranks) the relation holds for."""
_PENDING = ("pending_ack", "pending_ack_gen")
"""Prefill's drain acks owed, by request: `State.pending_acks` holds (room, generation,
request)."""
_ACKED = ("p_acked",)
"""The prefill ranks that have sent their drain ack for an abort: `State.acked_ranks` holds
(room, generation, rank), the generation the request's owed ack names."""
_ACCEPTED = ("accepted_set", "accepted_full")
"""What decode accepted: `ReqState.accepted_full` (None: nothing yet)."""
_READ = ("read_done", "read_page", "read_has", "read_req", "read_gen")
_PAGE = ("owned", "owner", "owner_gen", "page_used", "last_tenant")
_SHARD = ("shard_has", "shard_req", "shard_gen")
_GLOBALS = {
    "next_gen": "next_generation",
    "prefill_epoch": "prefill_epoch",
    "decode_epoch": "decode_epoch",
    "decode_seen_prefill_epoch": "decode_sees_prefill_epoch",
    "prefill_seen_decode_epoch": "prefill_sees_decode_epoch",
}
_FAULTS = {
    "crashes_spent": "crashes",
    "drops_spent": "drops",
    "duplicates_spent": "duplicates",
    "timeouts_spent": "timeouts",
    "cancels_spent": "cancels",
    "prefill_aborts_spent": "prefill_aborts",
    "retries_spent": "retries",  # kept in `Faults`, but not a fault (see `Faults.retries`)
    "partitions_spent": "partitions",
    "write_errors_spent": "write_errors",
}
_WITHDRAW = ("answered",)
"""The client's answer, which an effect may only withdraw (`assign(answered(r), False)`: a retry
sets the first attempt's error aside). Giving an answer is `answer_error` / `answer_ok`, which
keep the first one given."""
_GHOSTS = frozenset(Ghost._fields)

WRITABLE: frozenset[str] = frozenset(
    [
        *_REQ_FIELDS,
        *_REQ_SETS,
        *_READ,
        *_ACCEPTED,
        *_PAGE,
        *_SHARD,
        *_GLOBALS,
        *_GHOSTS,
        *_FAULTS,
        *_PENDING,
        *_ACKED,
        *_WITHDRAW,
    ]
)
"""The symbols an effect may assign: the state's own. The others are rigid (the scenario's) or
read off the state (`issued`, `answered_ok`, ...): an update of one would have no meaning."""

_Compiled = Callable[..., Any]


def _compile(t: Term, params: tuple[Var, ...]) -> _Compiled:
    from kvhandoff.spec.vocabulary import CONCRETE, _read_pages, _read_shard, _shard

    extra = "".join(f", {v.name}" for v in params)
    source = f"def value(S, C, DRAIN{extra}):\n"
    for line in CONCRETE.prelude.splitlines():
        source += f"    {line}\n"
    source += f"    return {python_source(t, CONCRETE)}\n"
    namespace: dict[str, Any] = {
        "_shard": _shard,
        "_read_pages": _read_pages,
        "_read_shard": _read_shard,
    }
    exec(compile(source, "<effect>", "exec"), namespace)
    fn: _Compiled = namespace["value"]
    return fn


@dataclass
class _CompiledUpdate:
    update: Update
    params: tuple[Var, ...]
    when: _Compiled
    parts: dict[str, _Compiled]


_COMPILED: dict[int, tuple[EffectFormula, list[_CompiledUpdate]]] = {}


def _compiled(eff: EffectFormula) -> list[_CompiledUpdate]:
    got = _COMPILED.get(id(eff))
    if got is not None and got[0] is eff:
        return got[1]
    out = []
    for u in eff.updates:
        params = (*eff.params, *u.over)
        parts: dict[str, _Compiled] = {}
        if isinstance(u, Assign):
            for i, a in enumerate(u.target.args):
                parts[f"arg{i}"] = _compile(a, params)
            parts["value"] = _compile(u.value, params)
            when = u.when
        elif isinstance(u, Send):
            parts["req"] = _compile(u.req, params)
            parts["gen"] = _compile(u.gen, params)
            if u.epoch is not None:
                parts["epoch"] = _compile(u.epoch, params)
            if u.page is not None and u.has_page is not None:
                parts["has_page"] = _compile(u.has_page, (*params, u.page))
            if u.page is not None and u.digest_page is not None:
                parts["digest_page"] = _compile(u.digest_page, (*params, u.page))
            for name in ("count", "rank"):
                term = getattr(u, name)
                if term is not None:
                    parts[name] = _compile(term, params)
            when = u.when
        elif isinstance(u, Adopt):
            parts["req"] = _compile(u.req, params)
            parts["gen"] = _compile(u.gen, params)
            when = u.when
        elif isinstance(u, (Reply, Move, Forget)):
            if isinstance(u, Reply):
                parts["req"] = _compile(u.req, params)
            if isinstance(u, Forget):
                parts["inst"] = _compile(u.inst, params)
            when = u.when
        else:
            parts["req"] = _compile(u.req, params)
            parts["cond"] = _compile(u.cond, (*params, u.page))
            when = u.when
        out.append(_CompiledUpdate(u, params, _compile(when, params), parts))
    _COMPILED[id(eff)] = (eff, out)
    return out


def _domain(sort: Sort, config: Config, state: State) -> range:
    if sort == REQ:
        return range(len(state.requests))
    if sort == PAGE:
        return range(len(state.pages))
    if sort == RANK:
        return range(config.prefill_ranks)
    raise TypeError(f"no elements of sort {sort.name} to range over")


def _tenant_of(config: Config, request: int) -> str:
    return OTHER_TENANT if request == -1 else config.requests[request].tenant


def run_effect(
    eff: EffectFormula, config: Config, state: State, drain: bool, args: tuple[Any, ...]
) -> State:
    """The state after the step whose effect is `eff`, taken with arguments `args` (its request,
    its message, or nothing) in `state`: the concrete reading of the effect."""
    S, C = state, config
    assigned: dict[tuple[str, tuple[int, ...]], Any] = {}
    messages: list[Message] = []
    replies: dict[int, Reply] = {}
    writes: list[Write] = []
    fields_of_variant: dict[str, tuple[Any, Any]] = {}
    moves: list[tuple[str, Any]] = []
    forget: list[int] = []
    adopted: list[tuple[int, int, int]] = []
    for cu in _compiled(eff):
        u = cu.update
        for binding in itertools.product(*(_domain(v.sort, C, S) for v in u.over)):
            a = (*args, *binding)
            if not cu.when(S, C, drain, *a):
                continue
            p = cu.parts
            if isinstance(u, Assign):
                key = tuple(p[f"arg{i}"](S, C, drain, *a) for i in range(len(u.target.args)))
                value = p["value"](S, C, drain, *a)
                if isinstance(u.target.symbol, FieldSymbol):
                    fields_of_variant[u.target.symbol.name] = (value, u.target.symbol.initial)
                    continue
                assigned[(u.target.symbol.name, key)] = value
            elif isinstance(u, Send):
                r = p["req"](S, C, drain, *a)
                pages: tuple[int, ...] = ()
                if "has_page" in p:
                    pages = tuple(
                        q for q in range(len(S.pages)) if p["has_page"](S, C, drain, *a, q)
                    )
                epoch = p["epoch"](S, C, drain, *a) if "epoch" in p else 0
                gen = p["gen"](S, C, drain, *a)
                room = C.requests[r].room
                extra: dict[str, Any] = {}
                for name in ("count", "rank"):
                    if name in p:
                        extra[name] = p[name](S, C, drain, *a)
                if u.digest:
                    covered = p.get("digest_page")
                    extra["digest"] = tuple(
                        (q, r, gen)
                        for q in range(len(S.pages))
                        if covered is not None and covered(S, C, drain, *a, q)
                    )
                # Every message about r carries the attempt it was sent for, and the decode
                # instance at its decode end (`message_dinst`).
                extra["attempt"] = S.requests[r].attempt
                extra["dinst"] = message_dinst(C, S, u.kind, r)
                messages.append(
                    Message(
                        u.kind, room, gen, r, pages=pages, reason=u.reason, epoch=epoch, **extra
                    )
                )
            elif isinstance(u, Reply):
                replies.setdefault(p["req"](S, C, drain, *a), u)
            elif isinstance(u, Forget):
                forget.append(p["inst"](S, C, drain, *a))
            elif isinstance(u, Adopt):
                placed = C.requests[p["req"](S, C, drain, *a)]
                adopted.append((placed.room, p["gen"](S, C, drain, *a), placed.prefill_instance))
            elif isinstance(u, Move):
                moves.append((u.op, a[next(i for i, v in enumerate(cu.params) if v is u.m)]))
            else:
                r = p["req"](S, C, drain, *a)
                req = S.requests[r]
                data = Tag(r, req.p_gen, C.requests[r].tenant)
                for q in range(len(S.pages)):
                    if p["cond"](S, C, drain, *a, q):
                        for rank in range(C.prefill_ranks):
                            room = C.requests[r].room
                            writes.append(Write(room, req.p_gen, q, data, req.p_epoch, rank))
    return finish(
        C, S, assigned, messages, replies, writes, moves, forget, adopted, fields_of_variant
    )


DECODE_SENDS: frozenset[str] = frozenset({"grant", "abort"})
"""The kinds of message decode sends (prefill sends the others)."""


def message_dinst(C: Config, S: State, kind: str, r: int) -> int:
    """The decode instance at the decode end of a `kind` message about request r: decode's own
    for what decode sends (the instance r is placed on), and for what prefill sends the one whose
    pages its grant names, or before any grant the one r is placed on (`p_dinst`)."""
    if C.decode_instances == 1:
        return 0
    if kind in DECODE_SENDS:
        return C.requests[r].decode_instance
    pages = S.requests[r].p_pages
    return C.page_instance(pages[0]) if pages else C.requests[r].decode_instance


def ack_dinst(C: Config, S: State, r: int) -> int:
    """The decode instance of the drain ack request r owes: the one the abort came from, which
    is the one of the grant prefill holds for r (prefill takes an abort of a grant only from the
    decode instance that made it), or the one r is placed on."""
    return message_dinst(C, S, "abort_ack", r)


INDEXED: dict[str, tuple[str, str, str]] = {
    "next_gen": ("next_generation", "next_generations", ""),
    "prefill_epoch": ("prefill_epoch", "prefill_epochs", ""),
    "decode_epoch": ("decode_epoch", "decode_epochs", ""),
    "decode_seen_prefill_epoch": (
        "decode_sees_prefill_epoch",
        "decode_sees_prefill_epochs",
        "prefill_instances",
    ),
    "prefill_seen_decode_epoch": (
        "prefill_sees_decode_epoch",
        "prefill_sees_decode_epochs",
        "decode_instances",
    ),
}
"""The state symbols of an instance (or a pair of instances): the `State` field of entry 0 (of
(0, 0)), the tuple field of the others, and for a pair the `Config` field counting the second
argument's instances (entry (j, i) is at `j * width + i - 1` of the tuple)."""


def indexed_position(C: Config, name: str, key: tuple[int, ...]) -> int:
    """Where entry `key` of the instance symbol `name` is kept: 0 for the scalar field, else
    one more than its position in the tuple field."""
    width = INDEXED[name][2]
    return key[0] if not width else key[0] * getattr(C, width) + key[1]


def set_indexed(
    C: Config, S: State, changes: dict[str, Any], name: str, key: tuple[int, ...], value: int
) -> None:
    """Record in `changes` (a state's changed fields) entry `key` of the instance symbol `name`
    (`next_gen(i)`, `prefill_epoch(i)`, `decode_seen_prefill_epoch(j, i)`, ...) set to
    `value`."""
    scalar, rest, _ = INDEXED[name]
    at = indexed_position(C, name, key)
    if at == 0:
        changes[scalar] = value
        return
    entries = list(changes.get(rest, getattr(S, rest)))
    entries[at - 1] = value
    changes[rest] = tuple(entries)


def finish(
    C: Config,
    S: State,
    assigned: dict[tuple[str, tuple[int, ...]], Any],
    messages: list[Message],
    replies: dict[int, Reply],
    writes: list[Write],
    moves: list[tuple[str, Any]],
    forget: list[int],
    adopted: list[tuple[int, int, int]],
    fields_of_variant: dict[str, tuple[Any, Any]],
) -> State:
    """The next state from what an effect's updates computed in the old state `S`: the values
    assigned (by symbol and arguments), the messages sent, the answers given, the writes issued,
    what happened to the step's own message or write, the prefill instances that forgot the
    grants they had adopted, the grants adopted, and a variant's own fields. Shared by `run_effect` and the effects
    compiled to Python (`spec/compiled.py`), so both build states one way."""
    if moves:
        S = _moved(S, moves)
    if forget:
        S = evolve(S, orphans=tuple(o for o in S.orphans if o[2] not in forget))
    out = _build(C, S, assigned, messages, replies, writes)
    if adopted:
        out = evolve(out, orphans=tuple(sorted({*out.orphans, *adopted})))
    if fields_of_variant:
        # As `Variant.put` keeps them: a field at its initial value is not stored.
        kept = dict(out.variant_fields)
        for name, (value, initial) in fields_of_variant.items():
            kept.pop(name, None)
            if value != initial:
                kept[name] = value
        out = evolve(out, variant_fields=tuple(sorted(kept.items())))
    return out


def _moved(S: State, moves: list[tuple[str, Any]]) -> State:
    network, lost, writes = list(S.network), list(S.lost), list(S.writes)
    for op, m in moves:
        if isinstance(m, Write):  # a write arrives: it leaves the wire
            writes.remove(m)
            continue
        if op in ("consume", "lose"):
            network.remove(m)
        if op == "lose":
            bisect.insort(lost, m)
        if op == "resend":
            lost.remove(m)
            bisect.insort(network, m)
        if op == "copy":
            bisect.insort(network, m)
    return evolve(S, network=tuple(network), lost=tuple(lost), writes=tuple(writes))


def _build(
    C: Config,
    S: State,
    assigned: dict[tuple[str, tuple[int, ...]], Any],
    messages: list[Message],
    replies: dict[int, Reply],
    writes: list[Write],
) -> State:
    by_req: dict[int, dict[str, Any]] = {}
    by_page: dict[int, dict[tuple[str, tuple[int, ...]], Any]] = {}
    glob: dict[str, Any] = {}
    ghost: dict[str, Any] = {}
    faults: dict[str, Any] = {}
    pending: dict[int, dict[str, Any]] = {}
    acked: dict[tuple[int, ...], bool] = {}
    for (name, key), value in assigned.items():
        if name in _WITHDRAW:
            if value is not False:
                raise ValueError(
                    f"an effect may only withdraw an answer, not set {name} to {value}"
                )
            by_req.setdefault(key[0], {})[name, key[1:]] = value  # type: ignore[index]
        elif name in _REQ_FIELDS or name in _REQ_SETS or name in _READ or name in _ACCEPTED:
            by_req.setdefault(key[0], {})[name, key[1:]] = value  # type: ignore[index]
        elif name in _PAGE or name in _SHARD:
            by_page.setdefault(key[0], {})[name, key[1:]] = value
        elif name in INDEXED:
            set_indexed(C, S, glob, name, key, value)
        elif name in _GLOBALS:
            glob[_GLOBALS[name]] = value
        elif name in _GHOSTS:
            ghost[name] = value
        elif name in _FAULTS:
            faults[_FAULTS[name]] = value
        elif name in _PENDING:
            pending.setdefault(key[0], {})[name] = value
        elif name in _ACKED:
            acked[key] = value
        else:
            raise KeyError(f"an effect assigns {name!r}, which is not a state symbol")
    requests = list(S.requests)
    for r in sorted(set(by_req) | set(replies)):
        requests[r] = _new_request(C, S, r, by_req.get(r, {}), replies.get(r))
    pages = list(S.pages)
    for q, page_changes in by_page.items():
        pages[q] = _new_page(C, S.pages[q], page_changes)
    changes: dict[str, Any] = dict(glob)
    if by_req or replies:
        changes["requests"] = tuple(requests)
    if by_page:
        changes["pages"] = tuple(pages)
    if ghost:
        changes["ghost"] = evolve(S.ghost, **ghost)
    if faults:
        changes["faults"] = evolve(S.faults, **faults)
    if pending:
        changes["pending_acks"] = _new_pending(C, S, pending)
    if acked:
        changes["acked_ranks"] = _new_acked(C, S, acked)
    if messages:
        network = list(S.network)
        for m in messages:
            bisect.insort(network, m)
        changes["network"] = tuple(network)
    if writes:
        in_flight = list(S.writes)
        for w in writes:
            bisect.insort(in_flight, w)
        changes["writes"] = tuple(in_flight)
    return evolve(S, **changes) if changes else S


def _new_pending(
    C: Config, S: State, pending: dict[int, dict[str, Any]]
) -> tuple[tuple[int, int, int], ...]:
    """`State.pending_acks` with the requests whose entry an effect assigned rewritten."""
    kept = [a for a in S.pending_acks if a[2] not in pending]
    for r, new in pending.items():
        old = [a for a in S.pending_acks if a[2] == r]
        owed = new.get("pending_ack", bool(old))
        if owed:
            gen = new.get("pending_ack_gen", old[0][1] if old else 0)
            kept.append((C.requests[r].room, gen, r))
    return tuple(sorted(kept))


def _new_acked(
    C: Config, S: State, acked: dict[tuple[int, ...], bool]
) -> tuple[tuple[int, int, int], ...]:
    """`State.acked_ranks` with the entries an effect assigned set or cleared. An entry names the
    room and generation of the ack the request owes (in the state before the step), and a rank."""
    keys = set(S.acked_ranks)
    for (r, k), value in acked.items():
        gen = next((a[1] for a in S.pending_acks if a[2] == r), 0)
        (keys.add if value else keys.discard)((C.requests[r].room, gen, k))
    return tuple(sorted(keys))


_PAGE_SETS = frozenset({"p_pages", "d_pages"})


def set_size(C: Config, S: State, field_name: str) -> int:
    """How many elements a request's set field (`_REQ_SETS`) ranges over: the pages, or the
    prefill ranks. An effect that sets every one of them makes the set afresh, reading nothing
    of the old one: the explorer clears finished requests' prefill fields, and a retry sets
    every page and rank of its request afresh (`model_checker.reduction`)."""
    return len(S.pages) if field_name in _PAGE_SETS else C.prefill_ranks


def _new_request(
    C: Config, S: State, r: int, changes: dict[Any, Any], reply: Reply | None
) -> ReqState:
    req = S.requests[r]
    fields: dict[str, Any] = {}
    sets: dict[str, dict[int, Any]] = {}
    read: dict[Any, Any] = {}
    accepted: dict[str, Any] = {}
    answer = req.answer
    for (name, rest), value in changes.items():
        if name in _WITHDRAW:
            answer = fields["answer"] = None
        elif name in _REQ_FIELDS:
            fields[_REQ_FIELDS[name]] = value
        elif name in _ACCEPTED:
            accepted[name] = value
        elif name in _REQ_SETS:
            sets.setdefault(_REQ_SETS[name], {})[rest[0]] = value
        else:
            read[name, rest] = value
    for field_name, members in sets.items():
        # Where every element is set, the old set is not read (see `set_size`).
        items = (
            set() if len(members) == set_size(C, S, field_name) else set(getattr(req, field_name))
        )
        for element, member in members.items():
            (items.add if member else items.discard)(element)
        fields[field_name] = tuple(sorted(items))
    if read:
        fields["read"] = _new_read(C, S, r, read)
    if accepted:
        was = req.accepted_full
        if accepted.get("accepted_set", was is not None):
            fields["accepted_full"] = bool(accepted.get("accepted_full", was is True))
        else:
            fields["accepted_full"] = None
    if reply is not None and answer is None:
        if reply.ok:
            fields["answer"] = Answer(ok=True, tags=req.read or ())
        else:
            fields["answer"] = Answer(ok=False, reason=reply.reason)
    return evolve(req, **fields)


def _new_read(C: Config, S: State, r: int, read: dict[Any, Any]) -> tuple[Tag | None, ...] | None:
    from kvhandoff.spec.vocabulary import _read_pages, _read_shard

    req = S.requests[r]
    ranks = C.prefill_ranks
    if not read.get(("read_done", ()), req.read is not None):
        return None
    old_pages = _read_pages(req, ranks)
    out: list[Tag | None] = []
    for q in range(len(S.pages)):
        if not read.get(("read_page", (q,)), q in old_pages):
            continue
        for k in range(ranks):
            old = _read_shard(req, q, k, ranks)
            if not read.get(("read_has", (q, k)), old is not None):
                out.append(None)
                continue
            who = read.get(("read_req", (q, k)), getattr(old, "request", 0))
            gen = read.get(("read_gen", (q, k)), getattr(old, "generation", 0))
            out.append(Tag(who, gen, _tenant_of(C, who)))
    return tuple(out)


_UNSET = object()
_OWNER = frozenset(_PAGE[:3])
_USED = frozenset(_PAGE[3:])
_SHARDS = frozenset(_SHARD)


def _new_page(C: Config, page: PageState, changes: dict[Any, Any]) -> PageState:
    names = {name for name, _ in changes}
    get = changes.get
    fields: dict[str, Any] = {}
    if names & _OWNER:
        owner = page.owner
        if get(("owned", ()), owner is not None):
            old_req, old_gen = owner if owner is not None else (0, 0)
            fields["owner"] = (get(("owner", ()), old_req), get(("owner_gen", ()), old_gen))
        else:
            fields["owner"] = None
    if names & _USED:
        used = get(("page_used", ()), page.last_tenant is not None)
        fields["last_tenant"] = get(("last_tenant", ()), page.last_tenant) if used else None
    if names & _SHARDS:
        shards = list(page.shards)
        for k, old in enumerate(shards):
            has = get(("shard_has", (k,)), _UNSET)
            who = get(("shard_req", (k,)), _UNSET)
            gen = get(("shard_gen", (k,)), _UNSET)
            if has is _UNSET and who is _UNSET and gen is _UNSET:
                continue  # this rank's shard is as it was
            if not (old is not None if has is _UNSET else has):
                shards[k] = None
                continue
            who = getattr(old, "request", 0) if who is _UNSET else who
            gen = getattr(old, "generation", 0) if gen is _UNSET else gen
            shards[k] = Tag(who, gen, _tenant_of(C, who))
        fields["content"] = shards[0]
        fields["rank_shards"] = tuple(shards[1:])
    return evolve(page, **fields)
