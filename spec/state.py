"""What the system remembers.

A `State` is everything at one instant: each request's progress on the router, prefill and decode;
each decode page's owner and content; the page writes in flight; the control messages in the
network; and the fault budget spent so far.

Two kinds of fields live here, and the difference matters:

* **Protocol state** is what some component really knows: decode knows which pages it granted to
  which (request, generation) and which writes it accepted; prefill knows which grant it holds and
  how many pages it wrote. Actions may read protocol state only of the component taking them.
* **Ghost state** exists only so that properties can speak about data: which request, generation and
  tenant last wrote a page (`PageState.content`), what decode actually read when it generated
  (`ReqState.read`), whether a request was not admitted as it was sent (`ReqState.not_as_is`).
  Guards never read ghost state. (Page *content* is data, and a digest computed over it is a
  legitimate check; the tag just names whose data it is.)

Every collection is a tuple so that states are hashable; multisets (messages, writes) are kept
sorted so that two states with the same contents compare equal.

A state, and each of its parts (a request, a page, a message, a write, a data tag, an answer, the
fault budget, the ghost flags), is a *record*: a named tuple, immutable, whose fields are read by
name. Records rather than frozen dataclasses because the explorer makes, hashes and compares a
state for every transition and keeps every state it stores: a tuple is hashed and compared in C,
field by field, and carries no dictionary of its own (benchmarks/results/explore.txt has what
that saved). A changed copy is `evolve(record, field=value)`; `dataclasses.replace` and
`dataclasses.fields` accept records too.

Prefill ranks
-------------
A prefill instance may run on several *ranks* (`Config.prefill_ranks`, tensor-parallel workers,
each holding a slice of every layer's KV heads). The ranks compute in lockstep (their collectives
force it), so prefill's admission, grant and progress are one state per request; but each rank
moves its own *shard* of every page on its own transfer thread. So, per rank:

* a page write carries a `rank`, and lands in that rank's shard of the page (`PageState.shards`);
* a rank sends its own completion (`Message.rank`) once its own writes have returned;
* after an abort, a rank acknowledges the drain of its own writes.

Decode must hear from *every* rank (SGLang's `prefill_response_tracker` against
`required_prefill_response_num`): a page is only whole when every rank's shard landed.

These per-rank steps are kept as **rank sets**, the ranks that have done the step *so far*:
prefill's sent completions (`ReqState.p_ranks_done`), the completions decode accepted
(`ReqState.d_ranks`), the drain acks prefill sent (`State.acked_ranks`) and decode received
(`ReqState.d_acks`). The step that would make a set full moves on instead (prefill to
`completed`, decode to `validated`, the abort's obligation or fence lifted) and empties the set.
With one rank every set is therefore always empty, and the states are exactly those of the
one-rank model.

Instances
---------
Real deployments run several prefill instances and several decode instances, and the router picks
one of each per request: SGLang's router and vLLM's and Dynamo's disaggregated routers choose a
prefill worker and a decode worker for every request; each decode worker has its own KV pool and
its own allocator, and the two meet on a bootstrap room (Mooncake's and SGLang's
`bootstrap_room`). That brings hazards one instance of each cannot show: two decode instances
hand out generations from their own counters, so the same (room, generation) can name two
different grants, and a restart of one instance must not touch the requests placed on another.

`Config.prefill_instances` and `Config.decode_instances` (1 to 3) name how many there are, and
`Config.page_instance` splits decode's `decode_pages` among the decode instances in contiguous
blocks (page numbers stay global: a page's number says whose pool it is in). How it is modelled:

* **Placement is the scenario's.** Each request is on one prefill and one decode instance
  (`RequestSpec.prefill_instance`, `decode_instance`), chosen by the router when it submits and
  never changed, so it is rigid, like the request's room. A router that places as it likes is
  checked as every fixed placement (`spec.config.placements`): each of its runs is a run of one.
* **Decode instance state.** Each decode instance grants pages of its own pool only, under
  generations from its own counter (`State.next_generation` for instance 0, `next_generations`
  for the others), so two instances can issue the same (room, generation).
* **Addressing.** A message names the decode instance at its decode end (`Message.dinst`):
  decode's grants and aborts carry their sender, and prefill sends its completion, failure
  notices and drain acks to the decode instance that sent the grant it holds
  (`ReqState.p_grant_dinst`; `p_dinst` in the vocabulary): the address the grant came from, as
  SGLang's prefill keeps the decode endpoint the registration named. Under room-keyed matching
  that may be another decode instance than the request's own. Decode looks for the request a message is about only among its own; prefill only
  among the requests of its own instance, which is the one the request a grant or abort names
  was placed on. A page write goes to a page, so to that page's instance.
* **Ranks.** Every prefill instance has `prefill_ranks` ranks; a rank's completion, shard
  writes and drain ack belong to its instance's request, and a drain ack names the decode
  instance its abort came from, so acks of two instances never stand in for each other.
* **Restarts and partitions are of one instance.** Each instance has its own boot epoch
  (`prefill_epoch(i)`, `decode_epoch(j)` in the vocabulary). A restart (`prefill_restart` of
  instance `pinst`, `decode_restart` of `dinst`) loses what that instance held and nothing of
  another's: the requests placed on it, the drain acks it owed, its pages. Every worker watches
  every peer's health check on its own: decode instance j keeps the epoch it last saw of each
  prefill instance i (`decode_seen_prefill_epoch(j, i)`), notices i's restart when it next
  looks (`decode_detect_prefill_restart(dinst=j, pinst=i)`) and fails only its own requests
  placed on i, while another decode instance may not have looked yet; prefill likewise. A
  partition cuts one pair: decode instance j takes prefill instance i for dead
  (`decode_suspect_prefill_dead(dinst=j, pinst=i)`) and fails only the requests it waits on
  from i; i keeps running and writing. A request carries the epochs of its own two instances.
  The in-process and gRPC conformance targets play several (`kvhandoff conform --instances`),
  the other targets refuse more than one, naming why. Every checker takes several (the any-size model of `prove` any number of them, any placement, any
  split of the pool).

With one instance of each, every instance is 0, `next_generations` and the per-instance epoch
tuples are empty, every action's instance is 0 (and left out of traces) and every message's
`dinst` is 0: the states are exactly those of the one-instance model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import MISSING, field, fields
from itertools import compress, count
from operator import is_not
from typing import Any, Literal, NamedTuple, TypeVar, get_args

from kvhandoff.spec.config import Config

_T = TypeVar("_T")


def evolve(obj: _T, **changes: Any) -> _T:
    """A copy of a state value (a `State` or one of its parts) with some fields changed: what
    `obj._replace(**changes)` does, in a third of the time (`evolved`)."""
    return evolved(obj, changes)


def evolved(obj: _T, changes: dict[str, Any]) -> _T:
    """`evolve(obj, **changes)` with the changes given as a dict: what the compiled effects
    call (they gather their changes in a dict, and unpacking it into keywords only to pack them
    again cost a third of the call)."""
    cls = obj.__class__
    values = list(obj)  # type: ignore[call-overload]
    positions = _POSITIONS[cls]
    for name, value in changes.items():
        values[positions[name]] = value
    result: _T = _new_tuple(cls, values)
    return result


_new_tuple: Callable[..., Any] = tuple.__new__
_POSITIONS: dict[type, dict[str, int]] = {}
"""Each state record's field positions by name (filled in below, once the classes exist)."""


def field_names(cls: type) -> tuple[str, ...]:
    """The names of the fields of a state record or of a dataclass, in order."""
    names: tuple[str, ...] | None = getattr(cls, "_fields", None)
    if names is not None:
        return names
    return tuple(f.name for f in fields(cls))


_tuple_hash = tuple.__hash__
_FEW_ITEMS = 8
_ITEM_HASHES: dict[int, tuple[Any, int]] = {}


def _remember_hash(obj: Any, value: int) -> None:
    if len(_ITEM_HASHES) >= 1 << 16:
        _ITEM_HASHES.clear()
    _ITEM_HASHES[id(obj)] = (obj, value)


def _items_hash(items: tuple[Any, ...]) -> int:
    """The hash of a state's many requests or pages, each item's own hash looked up by its
    identity where it was hashed before.

    A step changes one request or a few pages and hands the others on as the very same objects,
    so the next state's items are nearly all known; a record's hash is not kept by the record (a
    tuple has nowhere to keep it), so it is kept here, with the item, for as long as the table
    is not full."""
    hashes = []
    table = _ITEM_HASHES
    for item in items:
        known = table.get(id(item))
        if known is None or known[0] is not item:
            value = hash(item)
            _remember_hash(item, value)
        else:
            value = known[1]
        hashes.append(value)
    return hash(tuple(hashes))


_CHANGED: dict[int, tuple[tuple[Any, ...], tuple[Any, ...], tuple[int, ...]]] = {}


def changed_positions(old: tuple[Any, ...], new: tuple[Any, ...]) -> tuple[int, ...]:
    """The positions where `new` holds another object than `old` (tuples of the same length):
    `tuple(i for i, x in enumerate(new) if x is not old[i])`, without a Python-level loop.

    The last answers are kept (by the identity of `new`; the entry keeps both alive): hashing a
    stepped state and checking its properties (`check_always_after`) ask the same question."""
    got = _CHANGED.get(id(new))
    if got is not None and got[0] is old and got[1] is new:
        return got[2]
    found = tuple(compress(count(), map(is_not, new, old)))
    if len(_CHANGED) >= 16:
        _CHANGED.clear()
    _CHANGED[id(new)] = (old, new, found)
    return found


# --- The vocabulary of phases -------------------------------------------------------------------

PrefillPhase = Literal[
    "none",  # never heard of the request
    "received",  # the router handed it over; not yet admitted
    "admitted",  # admitted; waiting for decode's grant
    "rejected",  # refused; nothing will be written (terminal)
    "granted",  # holds decode's grant and writes pages
    "completed",  # sent its completion message (terminal)
    "aborted",  # stopped on an abort, a decode restart or its own failure (terminal)
    "lost",  # its state was lost in a prefill crash (terminal)
]
DecodePhase = Literal[
    "none",
    "received",
    "admitted",  # admitted; waiting for free pages
    "rejected",  # refused at admission (terminal)
    "reserved",  # pages granted with a fresh generation; waiting for prefill's completion
    "validated",  # completion accepted: decode may generate
    "generated",  # generated from the pages
    "answered",  # answer sent; pages still held until released
    "failed",  # gave up (timeout, cancel, failed validation, prefill failure)
    "released",  # pages returned to the pool (terminal)
    "lost",  # state lost in a decode crash (terminal)
]
MessageKind = Literal["grant", "completion", "failure", "abort", "abort_ack"]
PREFILL_PHASES: tuple[str, ...] = get_args(PrefillPhase)
DECODE_PHASES: tuple[str, ...] = get_args(DecodePhase)

OTHER_TENANT = "other"

PREFILL_TERMINAL: frozenset[str] = frozenset({"none", "rejected", "completed", "aborted", "lost"})
PREFILL_LIVE: frozenset[str] = frozenset({"admitted", "granted"})
DECODE_LIVE: frozenset[str] = frozenset(
    {"received", "admitted", "reserved", "validated", "generated", "answered"}
)


class Tag(NamedTuple):
    """Ghost label of a page's data: written by `request`'s prefill for `generation`, for `tenant`.

    Generation 0 marks data that was not written for any decode generation. Request -1 stands
    for traffic outside the scenario (another tenant's request that reused a freed source block on
    the pull path), with tenant `OTHER_TENANT`.
    """

    request: int
    generation: int
    tenant: str


class Message(NamedTuple):
    """A control message between prefill and decode.

    `room` and `generation` are what every receiver matches on. `request` is the request id the
    message carries: under the design option `matching="request"` (our implementation) prefill
    and decode also match grants, aborts and failure notices by it, and under `binds_request`
    decode checks that a completion names the request it holds the pages for; under
    `matching="room"` (SGLang's `bootstrap_room`) it is only the model's bookkeeping of whom the
    message was made for.
    """

    kind: MessageKind
    room: int
    generation: int
    request: int
    pages: tuple[int, ...] = ()
    count: int = 0  # type: ignore[assignment]  # (a field, over `tuple.count`)
    digest: tuple[tuple[int, int, int], ...] | None = None
    reason: str = ""
    epoch: int = 0  # on a grant: decode's boot epoch, i.e. which registration of its pool
    rank: int = 0  # on a completion or an abort ack: the prefill rank that sent it
    # The sender's attempt number for the request (`ReqState.attempt`): what tells a message of
    # a retried request's first attempt from one of its second (`Design.attempt_fence`).
    attempt: int = 0
    # The decode instance at the message's decode end: the one that sent a grant or an abort,
    # the one a completion, a failure notice or a drain ack is sent to (see "Instances").
    dinst: int = 0


class Write(NamedTuple):
    """A page write in flight from prefill to decode: destination page, and the data it carries."""

    room: int
    generation: int
    page: int
    data: Tag
    epoch: int = 0  # the decode boot epoch of the grant it writes against
    rank: int = 0  # the prefill rank writing its shard of the page


class PageState(NamedTuple):
    """One decode page. `owner` is protocol state (decode's page table); `content` is the data.

    With several prefill ranks the page is made of one shard per rank: `content` is rank 0's
    shard (the whole page when there is one rank) and `rank_shards` holds ranks 1, 2, ...
    (always `prefill_ranks - 1` entries). Read them together as `shards`.
    """

    owner: tuple[int, int] | None = None  # (request, generation)
    content: Tag | None = None  # None: zeroed; nothing readable
    last_tenant: str | None = None  # ghost: tenant of the last request granted this page
    rank_shards: tuple[Tag | None, ...] = ()  # the shards of ranks 1.. (see above)

    @property
    def shards(self) -> tuple[Tag | None, ...]:
        """The data of every rank's shard, rank 0 first."""
        return (self.content, *self.rank_shards)

    def with_shard(self, rank: int, data: Tag | None) -> PageState:
        """This page with rank `rank`'s shard replaced by `data`."""
        if rank == 0:
            return evolve(self, content=data)
        rest = self.rank_shards
        return evolve(self, rank_shards=(*rest[: rank - 1], data, *rest[rank:]))

    def zeroed(self) -> PageState:
        """This page, freed and scrubbed: no owner, every shard zeroed."""
        return evolve(self, owner=None, content=None, rank_shards=(None,) * len(self.rank_shards))


class Answer(NamedTuple):
    """What the client got: output generated from pages (their data tags), or an error."""

    ok: bool
    tags: tuple[Tag | None, ...] = ()
    reason: str = ""


class ReqState(NamedTuple):
    """One request, as the router, prefill and decode each see it (plus ghost fields)."""

    submitted: bool = False
    answer: Answer | None = None
    # Prefill's side.
    p: PrefillPhase = "none"
    p_len: int = 0  # prefill's view of the prompt length (a placeholder or truncation changes it)
    p_gen: int = 0  # generation of the grant prefill holds
    p_pages: tuple[int, ...] = ()  # the granted destination pages
    p_wrote: int = 0  # pages written so far, in grant order
    p_epoch: int = 0  # decode's boot epoch this request was sent with (and its grant names)
    # The decode instance that sent the grant prefill holds (0 before any): where prefill's
    # completion, failure notices and drain acks go. Kept, not read off the grant's pages: a
    # proof over any number of instances cannot count pages, and engines keep an address too.
    p_grant_dinst: int = 0
    p_lease_expired: bool = False  # pull path: prefill's pinned source blocks were freed
    p_ranks_done: tuple[int, ...] = ()  # rank set: ranks that sent their completion (see above)
    # Decode's side.
    d: DecodePhase = "none"
    d_gen: int = 0
    d_pages: tuple[int, ...] = ()
    d_awaiting_ack: bool = False  # abort sent; release fenced until prefill's drain ack
    d_epoch: int = 0  # prefill's boot epoch this request was sent with
    d_ranks: tuple[int, ...] = ()  # rank set: ranks whose completion arrived and validated
    d_acks: tuple[int, ...] = ()  # rank set: ranks whose drain ack arrived (release fenced)
    d_cancel: bool = False  # the client cancelled; the router's word is on its way to decode
    p_cancel: bool = False  # ... and on its way to prefill
    # Ghost.
    not_as_is: bool = False  # some side did not admit the prompt as sent (reject/placeholder/trunc)
    # What decode read when it generated: every shard of every page, page by page (with one
    # rank, one tag per page).
    read: tuple[Tag | None, ...] | None = None
    accepted_full: bool | None = (
        None  # at completion acceptance: did every granted page hold r's data?
    )
    # The router's attempt number for the request id (0, then 1 after a client's retry: see
    # `router_retry_request`). The router hands it to both workers with the request, and every
    # control message about the request carries it (`Message.attempt`).
    attempt: int = 0


class Faults(NamedTuple):
    """Fault budget spent so far (each bounded by the config)."""

    crashes: int = 0
    drops: int = 0
    duplicates: int = 0
    timeouts: int = 0
    cancels: int = 0
    prefill_aborts: int = 0
    # Client retries (`router_retry_request`): kept with the faults so that one budget record
    # bounds every source of repetition, but not a fault and so not part of `total` (a retry is
    # what a client does after an error, not something that goes wrong; `max_faults` must not
    # ration it, or a scenario with one fault could never retry the request that fault failed).
    retries: int = 0
    partitions: int = 0  # decode took a live prefill for dead (`decode_suspect_prefill_dead`)
    write_errors: int = 0  # a page write of prefill's failed mid-transfer (`prefill_write_error`)

    @property
    def total(self) -> int:
        return (
            self.crashes
            + self.drops
            + self.duplicates
            + self.timeouts
            + self.cancels
            + self.prefill_aborts
            + self.partitions
            + self.write_errors
        )


class Ghost(NamedTuple):
    """Whole-system ghost facts, used by properties and witnesses only. All monotone flags."""

    late_landing: bool = False  # a write landed on a page not owned by its (room, generation)
    refused_write: bool = False  # decode's ownership check (or a revoked key) refused a write
    drain_acked: bool = False  # an abort's drain ack released a fenced reservation
    cross_tenant_reuse: bool = False  # a page granted to one tenant was later granted to another
    page_reuse: bool = False  # a freed page was granted again
    scrubbed_written_page: bool = False
    cancelled_mid_transfer: bool = False
    ok_after_crash: bool = False
    ok_after_loss: bool = False


class State(NamedTuple):
    requests: tuple[ReqState, ...]
    pages: tuple[PageState, ...]
    network: tuple[Message, ...] = ()  # sorted multiset
    lost: tuple[Message, ...] = ()  # messages whose RPC failed; the sender will retransmit
    writes: tuple[Write, ...] = ()  # sorted multiset of page writes in flight
    next_generation: int = 1  # decode's generation counter (persisted across restarts)
    # With several decode instances, the counters of instances 1, 2, ... (instance 0's is
    # `next_generation`): empty with one, so its states are the one-instance model's.
    next_generations: tuple[int, ...] = ()
    prefill_epoch: int = 0  # incremented by each prefill restart (its health check reports it)
    decode_epoch: int = 0
    decode_sees_prefill_epoch: int = 0  # the epoch decode last saw in prefill's health check
    prefill_sees_decode_epoch: int = 0
    # With several instances, the boot epochs of instances 1, 2, ... (instance 0's are the
    # fields above), and each worker's view of each peer's: `decode_sees_prefill_epochs` holds
    # decode instance j's view of prefill instance i at `j * prefill_instances + i - 1` (entry
    # (0, 0) is `decode_sees_prefill_epoch`), `prefill_sees_decode_epochs` prefill i's view of
    # decode j at `i * decode_instances + j - 1`. Empty with one instance of each, so its states
    # are the one-instance model's (see "Instances" above).
    prefill_epochs: tuple[int, ...] = ()
    decode_epochs: tuple[int, ...] = ()
    decode_sees_prefill_epochs: tuple[int, ...] = ()
    prefill_sees_decode_epochs: tuple[int, ...] = ()
    # (room, generation, request) of aborts prefill must acknowledge once their writes drained.
    pending_acks: tuple[tuple[int, int, int], ...] = ()
    # Transfer state prefill holds for grants of rooms it no longer serves (M18): (room,
    # generation, the prefill instance that holds it).
    orphans: tuple[tuple[int, int, int], ...] = ()
    # Rank set of `pending_acks`: (room, generation, rank) of ranks that already acknowledged.
    acked_ranks: tuple[tuple[int, int, int], ...] = ()
    faults: Faults = Faults()
    ghost: Ghost = Ghost()
    # A variant's own state fields (`Variant.state_fields`) that differ from their initial
    # values, as sorted (name, value) pairs: empty for the rulebook's protocols.
    variant_fields: tuple[tuple[str, Any], ...] = ()

    def __hash__(self) -> int:
        """The tuple's own hash (in C), except for a state of many requests or pages (the log
        validator's: dozens of each), whose parts are hashed once each (`_items_hash`), and
        whose own hash is kept the same way: the validator looks its states up again and
        again."""
        requests, pages = self.requests, self.pages
        if len(requests) <= _FEW_ITEMS and len(pages) <= _FEW_ITEMS:
            return _tuple_hash(self)
        known = _ITEM_HASHES.get(id(self))
        if known is not None and known[0] is self:
            return known[1]
        value = hash((_items_hash(requests), _items_hash(pages), self[2:]))
        _remember_hash(self, value)
        return value


def _dataclass_compatible(cls: type) -> None:
    """Let `dataclasses.fields` and `dataclasses.replace` take the record `cls` as they take a
    dataclass. The state values were frozen dataclasses until they became records, and a
    variant's Python effect (`tests/data/python_variants/override_reject.py`) may build its next
    state with `replace(req, p="rejected")`: such files keep working."""
    table = {}
    defaults: dict[str, Any] = cls._field_defaults  # type: ignore[attr-defined]
    for name in field_names(cls):
        f: Any = field(default=defaults.get(name, MISSING))
        f.name, f.type = name, cls.__annotations__[name]
        f._field_type = _DATACLASS_FIELD
        table[name] = f
    setattr(cls, "__dataclass_fields__", table)  # noqa: B010 (mypy: not a field of `type`)


_DATACLASS_FIELD = getattr(dataclasses, "_FIELD")  # noqa: B009 (private to dataclasses); what marks a Field as a field proper

for _record in (Tag, Message, Write, PageState, Answer, ReqState, Faults, Ghost, State):
    _POSITIONS[_record] = {name: i for i, name in enumerate(field_names(_record))}
    _dataclass_compatible(_record)


def initial_state(config: Config) -> State:
    return State(
        requests=tuple(ReqState() for _ in config.requests),
        pages=tuple(
            PageState(rank_shards=(None,) * (config.prefill_ranks - 1))
            for _ in range(config.decode_pages)
        ),
        next_generations=(1,) * (config.decode_instances - 1),
        prefill_epochs=(0,) * (config.prefill_instances - 1),
        decode_epochs=(0,) * (config.decode_instances - 1),
        decode_sees_prefill_epochs=(0,) * (config.prefill_instances * config.decode_instances - 1),
        prefill_sees_decode_epochs=(0,) * (config.prefill_instances * config.decode_instances - 1),
    )


def request_done(config: Config, state: State, r: int) -> bool:
    """Has request r ended everywhere: answered (or never sent), and no side still holds anything?"""
    req = state.requests[r]
    if not req.submitted:
        return True
    if req.answer is None:
        return False
    if req.p not in PREFILL_TERMINAL:
        return False
    if req.d_pages:
        return False
    return req.d in ("none", "rejected", "released", "lost", "failed")


def all_done(config: Config, state: State) -> bool:
    """Quiescence: every request ended, every page free, prefill holds no orphan transfer state."""
    if state.orphans:
        return False
    for page in state.pages:  # loops, not any()/all() of generators: asked of every state
        if page.owner is not None:
            return False
    for r in range(len(state.requests)):
        if not request_done(config, state, r):
            return False
    return True
