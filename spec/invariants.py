"""Why the reference protocol is safe: the inductive invariants behind its safety properties.

A property such as "decode reads only validated pages" is true of every reachable state, but it is
not *inductive* on its own: a state that satisfies it can step to one that does not (e.g. a state
where a validated request's page holds someone else's data; no reachable state looks like that,
but the property alone does not rule it out). The invariants below are the extra facts that close
the argument, in the style of Ivy and mypyvy: together with the `ALWAYS` properties they hold
initially, every action preserves them, and they imply the properties.

Read them as the protocol's proof sketch:

1. `generations_are_unique`: decode takes each generation from a counter that never goes back
   (it survives restarts), so no two requests hold the same generation.
2. `prefill_holds_decodes_generation`, `messages_carry_their_generation`,
   `writes_carry_their_grant`: whatever prefill holds, sends or writes for a request names the
   generation decode granted that request. Together with 1, (room, generation) names one request.
3. `owned_pages_hold_owner_data_or_nothing`: decode's ownership check admits a write only into a
   page owned by the write's own (room, generation), which by 1-2 is the write's own request; and a
   page is zeroed before it is granted again. So an owned page holds its owner's data or nothing.
4. `validated_pages_hold_own_data`: decode validates only a completion whose digest matches the
   data in every granted page; by 2 the digest names the request itself; by 3 nothing else lands
   in those pages before they are read. So what decode reads is the request's own data.
5. `rejected_requests_are_never_completed`: a request some side did not admit as sent is never
   granted to prefill's writer and never validated, so nothing is written or generated for it;
   `decode_validates_only_completed_prefill` and `unsubmitted_requests_are_untouched` are the
   bookkeeping that argument needs (decode's progress follows prefill's, nothing precedes submit).

**Written once, read by every checker.** Each invariant is a formula of `spec/logic.py` over the
symbols of `spec/vocabulary.py`, not a Python function. The explorer evaluates it on states
(`Invariant.holds`, a closure compiled once); `kvhandoff check --engine kind` and the
fixed-configuration `prove` translate the very same object to Z3 over the encoding's variables
(`model_checker/logic_z3.py`). A wrong invariant therefore fails fast and concretely, on the
first reachable state that breaks it, before any solver is asked to prove it.

They are invariants of the *reference* design (and of designs that keep its defences); a variant
that breaks a property breaks at least one of them, which is how the proof fails for it.

**Room-keyed matching** changes the argument's step 2: prefill gives a grant to the first request
waiting on its room, so what prefill holds, writes and completes for r may be a grant decode made
for another request r' of the room, and (room, generation) names r', not r. Step 3 then rests on
decode's binding instead: it admits a write only into a page owned by the request the write names
(`owner(q) == w.req`), and accepts a completion only for the request it names (`m.req == t`).
`invariants_for` gives such designs `ROOM_KEYED_INVARIANTS` in place of the three claims that
say whose grant prefill holds, and `ROOM_KEYED_EXTRA_INVARIANTS`: decode's own progress, which
request-keyed matching derives from prefill's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvhandoff.spec.config import Config
from kvhandoff.spec.logic import (
    PAGE,
    RANK,
    REQ,
    And,
    Bound,
    Implies,
    Not,
    Or,
    Term,
    each_message,
    each_pending_ack,
    each_write,
    forall,
)
from kvhandoff.spec.state import State
from kvhandoff.spec.variants import Design
from kvhandoff.spec.vocabulary import (
    accepted_set,
    answered,
    answered_ok,
    attempt,
    compile_claim,
    d,
    d_ack,
    d_awaiting_ack,
    d_gen,
    d_holds,
    d_inst,
    d_rank,
    decode_epoch,
    drain_fence,
    next_gen,
    not_as_is,
    over_decode_limit,
    over_prefill_limit,
    owned,
    owner,
    owner_gen,
    p,
    p_dinst,
    p_epoch,
    p_gen,
    p_granted,
    p_granted_count,
    p_len,
    p_rank_done,
    p_written,
    p_wrote,
    page_inst,
    prefill_ranks,
    read_done,
    room,
    shard_gen,
    shard_has,
    shard_outside,
    shard_req,
    submitted,
)

# Phases, grouped as the claims use them.
EARLY = ("none", "received", "admitted", "rejected")  # before decode reserves (or refused)
HOLDING = ("reserved", "validated", "generated", "answered", "failed")  # may hold pages
RESERVED = ("reserved", "validated", "generated", "answered")  # hold a live grant
LATER = ("validated", "generated", "answered")  # after decode accepted the completion
P_IDLE = ("none", "received", "admitted", "rejected")  # prefill has no grant to write


# --- What a client's retry leaves behind ----------------------------------------------------------
#
# A retry (`router_retry_request`) starts the request afresh under the same id, but whatever its
# first attempt put on the wire stays there: a duplicated grant, a completion, an abort, a page
# write. Those items are *stale*: they describe a grant the request no longer holds, so the
# claims below that tie an item to its request's current grant ("a completion names the grant
# prefill holds") are false of them. What is true of them instead, and what keeps them harmless,
# is that they name a *retired* generation: one decode issued (it is below the counter) and no
# request holds any more, on decode's side or prefill's. Decode matches completions, writes and
# drain acks by generation, so a retired one finds nothing; prefill fences grants and aborts by
# the attempt a message carries (`Design.attempt_fence`).
#
# A message says which attempt sent it (`m.attempt`); a write does not (the real one carries the
# generation it was granted under), so a write is stale when its generation is not the one
# prefill now holds for its request, which can only happen after a retry. Without retries every
# attempt is 0, nothing is stale, and each claim is the one it was before retries existed.


def _retired(gen: Term, inst: Term) -> Term:
    """`gen` was issued by decode instance `inst` and no request placed there holds it any more,
    on either side. (Each decode instance counts generations of its own: another instance's
    request may hold the same number for a grant of its own.)"""
    return And(
        gen != 0,
        gen < next_gen(inst),
        forall(REQ, lambda t: Implies(d_inst(t) == inst, And(d_gen(t) != gen, p_gen(t) != gen))),
    )


def _stale_message(m: Bound) -> Term:
    """A message sent by an earlier attempt of its request than the current one."""
    stale: Term = m.attempt != attempt(m.req)
    return stale


def _stale_message_claim(m: Bound, retired: bool) -> Term:
    """What is true of a stale message: its attempt is an earlier one, and, for the kinds decode
    matches by generation (`retired`: completions, drain acks), it names a retired generation.
    Prefill fences grants and aborts, and decode failure notices, by the attempt itself; saying
    no more of them keeps the claims light for the any-size model's solver."""
    earlier = m.attempt < attempt(m.req)
    return And(earlier, _retired(m.gen, m.dinst)) if retired else earlier


def _stale_write(w: Bound) -> Term:
    """A write issued by an earlier attempt of its request (see above: told by its generation)."""
    return And(attempt(w.req) > 0, w.gen != p_gen(w.req))


@dataclass(frozen=True, eq=False)
class Invariant:
    name: str
    claim: str
    formula: Term
    _compiled: list[Callable[[State, Config, bool], bool]] = field(default_factory=list, repr=False)

    def holds(self, config: Config, state: State, design: Design | None = None) -> bool:
        """The invariant on one concrete state. Without a design, design-dependent clauses are
        read at their weakest (a drain fence is assumed present)."""
        drain = design is None or design.drain_fenced
        return self.compiled()(state, config, drain)

    def compiled(self) -> Callable[[State, Config, bool], bool]:
        """The formula as a Python function `(state, config, drain_fence) -> bool`, compiled
        once (the explorer calls it on every state it visits)."""
        if not self._compiled:
            self._compiled.append(compile_claim(self.formula, self.name))
        return self._compiled[0]


def generations_are_unique() -> Term:
    """No two requests hold the same decode generation, and the counter is past all of them:
    of one decode instance (each counts its own; with one instance, of every request)."""
    return forall(
        REQ,
        lambda r: And(
            d_gen(r) >= 0,
            d_gen(r) < next_gen(d_inst(r)),
            forall(
                REQ,
                lambda r2: Implies(
                    And(r != r2, d_gen(r) != 0, d_inst(r) == d_inst(r2)), d_gen(r) != d_gen(r2)
                ),
            ),
        ),
    )


def unreserved_requests_hold_nothing() -> Term:
    """Before decode reserves for a request (or once it refused it), the request holds no
    generation and no pages; only the phases between reservation and release hold pages, and
    those that hold a live grant hold a generation. A release fenced on the drain ack is an
    abort decode sent for a grant it made. Ranks that reported are kept only while reserved."""
    return And(
        forall(
            REQ,
            lambda r: And(
                Implies(
                    d(r).is_in(*EARLY),
                    And(d_gen(r) == 0, forall(PAGE, lambda q: Not(d_holds(r, q)))),
                ),
                forall(PAGE, lambda q: Implies(d_holds(r, q), d(r).is_in(*HOLDING))),
                Implies(d(r).is_in(*RESERVED), d_gen(r) != 0),
                Implies(d_awaiting_ack(r), And(d(r) == "failed", d_gen(r) != 0)),
                # With several ranks: decode keeps the ranks that reported only while it waits
                # for the rest (validation, a failure and a restart clear them).
                forall(RANK, lambda k: Implies(d_rank(r, k), d(r) == "reserved")),
            ),
        ),
        each_message(["grant"], lambda m: d(m.req) != "none"),
    )


def grants_stay_on_their_instance() -> Term:
    """A grant is one decode instance's: the pages decode holds for a request are all in the pool
    of the instance the request was placed on, a grant on the wire names pages of the instance
    that sent it and was sent by the request's own, and the pages prefill holds for a request
    are all of one instance, the one its transfer goes to (`p_dinst`, read off the grant's first
    page), so every write prefill issues under a grant lands in that grant's pool. What several
    decode instances need of the proof: two instances may hold grants of the same (room,
    generation), and a write or a completion is matched to its grant by the instance it reaches.
    With one decode instance every clause reads 0 == 0."""
    return And(
        forall(
            REQ,
            lambda r: forall(
                PAGE,
                lambda q: And(
                    Implies(d_holds(r, q), page_inst(q) == d_inst(r)),
                    Implies(p_granted(r, q), page_inst(q) == p_dinst(r)),
                ),
            ),
        ),
        each_message(
            ["grant"],
            lambda m: And(
                m.dinst == d_inst(m.req),
                forall(PAGE, lambda q: Implies(m.has_page(q), page_inst(q) == m.dinst)),
            ),
        ),
        each_message(["abort"], lambda m: m.dinst == d_inst(m.req)),
    )


def prefill_holds_decodes_generation(recompute: bool = False) -> Term:
    """The grant prefill holds for a request is the one decode issued for it, and prefill writes
    only pages of that grant, and only while it holds one. A rank that has reported (several
    ranks) did so while prefill held the grant with every page it had data for written: the
    ranks write in lockstep, so no page is written after the first rank reports.

    With `recompute` (`load_failure="recompute"`): or decode has recomputed the request under a
    fresh generation (`_recomputed`), and prefill still holds the grant it replaced.

    Whatever pages prefill holds for a request are of the decode instance the request was placed
    on (`p_dinst`: also after prefill stopped, while it keeps the pages it was granted), since
    the only grant it takes for a request is that request's own."""
    decodes: Callable[[Term], Term] = lambda r: p_gen(r) == d_gen(r)  # noqa: E731
    if recompute:
        decodes = lambda r: Or(p_gen(r) == d_gen(r), _recomputed(r))  # noqa: E731
    return And(
        _prefill_writes_only_its_grant(decodes),
        forall(REQ, lambda r: p_dinst(r) == d_inst(r)),
    )


AFTER_VALIDATION = ("validated", "generated", "answered", "failed", "released", "lost")
"""Decode's phases once it has validated a request (or recomputed it): nothing takes it back."""


def _recomputed(r: Term) -> Term:
    """Decode recomputed r's pages after a failed read, under a fresh generation: decode holds a
    newer generation than the grant prefill holds, no request holds that grant at decode any
    more, and decode went on as after a validation (`spec/machine.py`, `_recompute_effect`)."""
    old = p_gen(r)
    return And(
        old != 0,
        old < d_gen(r),
        # Nobody else holds that grant, at decode or at prefill: it was r's, and is retired.
        forall(
            REQ,
            lambda t: Implies(
                d_inst(t) == d_inst(r), And(d_gen(t) != old, Or(t == r, p_gen(t) != old))
            ),
        ),
        d(r).is_in(*AFTER_VALIDATION),
        # A read failed, so prefill had taken the grant: it admitted the request as sent.
        p(r).is_in("granted", "completed", "aborted", "lost"),
        Not(not_as_is(r)),
    )


def prefill_holds_a_generation_of_its_room() -> Term:
    """Room-keyed matching (`matching="room"`): prefill gives a grant to the first request it
    waits on for the grant's room, whichever request decode made it for. So the grant prefill
    holds for r names a generation decode issued for *some* request of r's room, not necessarily
    for r: `prefill_holds_decodes_generation` is false on reachable states (a cancelled request
    takes the grant of the next request on its room). The rest is unchanged: prefill writes only
    pages of the grant it holds, and only while it holds one.

    The claim is weaker, and the proof must do without the stronger one: (room, generation) no
    longer names prefill's request, so a write or a completion made under that grant can reach
    pages decode holds for another request. What keeps them out is decode's binding
    (`binds_request`): it admits a write only into a page its owner holds for the request the
    write names (`owner(q) == w.req`) and accepts a completion only for the request it names
    (`m.req == t`); the writes and completions themselves still carry their writer's grant
    (`writes_carry_their_grant`, `messages_carry_a_generation_of_their_room`). Without the
    binding (`room_keyed_matching`) these invariants still hold, but what they are for does
    not: a write lands in another request's page (`owned_pages_hold_owner_data_or_nothing`
    fails at depth 11), decode validates another request's completion
    (`validated_pages_hold_own_data`, `decode_validates_only_completed_prefill`: depth 15), and
    `no_cross_tenant_read` breaks at depth 16.

    "Some request of r's room" is said without an existential: the generation is one decode has
    issued (below its counter), and whichever request holds it is of r's room. Generations are
    never reissued (`generations_are_unique`), so that is the same claim on reachable states, and
    a universal one is what the any-size model's solver handles well (∀∃ is not)."""
    held = _prefill_writes_only_its_grant(
        lambda r: And(
            p_gen(r) < next_gen(p_dinst(r)),
            forall(
                REQ,
                lambda o: Implies(
                    And(d_gen(o) == p_gen(r), d_inst(o) == p_dinst(r)), room(o) == room(r)
                ),
            ),
        ),
        _stale_write_of_room,
    )
    return held


def _prefill_writes_only_its_grant(
    decode_issued: Callable[[Term], Term], stale_write: Callable[[Bound], Term] | None = None
) -> Term:
    """Prefill's side of the grant, with `decode_issued(r)`: whose grant prefill's grant for r is
    (the matching's: r's own, or one of r's room), and `stale_write` what tells a retried
    request's earlier write (the matching's: `_stale_write` or `_stale_write_of_room`)."""
    stale = stale_write or _stale_write
    requests = forall(
        REQ,
        lambda r: And(
            Implies(p_gen(r) != 0, decode_issued(r)),
            p_wrote(r) <= p_granted_count(r),
            Implies(p_wrote(r) > 0, p_gen(r) != 0),
            Implies(p(r).is_in("granted", "completed"), p_gen(r) != 0),
            Implies(p(r).is_in(*P_IDLE), p_wrote(r) == 0),
            forall(
                RANK,
                lambda k: Implies(
                    p_rank_done(r, k),
                    And(
                        p(r) == "granted",
                        Or(p_wrote(r) == p_len(r), p_wrote(r) == p_granted_count(r)),
                    ),
                ),
            ),
            forall(
                PAGE,
                lambda q: Implies(p_written(r, q), And(p_gen(r) != 0, p_granted(r, q))),
            ),
        ),
    )
    writes = each_write(
        # A write in flight was issued under the grant prefill holds, into one of its pages, and
        # prefill holds a grant; unless it is a retry's earlier attempt's (see above). Said of
        # each write rather than of `issued(r, q)` (written or some write in flight), so that
        # the exception is a disjunct here and not an existential under every (r, q).
        lambda w: Or(
            stale(w),
            And(
                p_gen(w.req) != 0,
                p_granted(w.req, w.page),
                Not(p(w.req).is_in(*P_IDLE)),
            ),
        )
    )
    return And(requests, writes)


def messages_carry_their_generation(recompute: bool = False) -> Term:
    """Every grant, completion, abort, failure notice and drain ack in the network (or waiting to
    be sent again) names its own request's generation; completions are only sent by a prefill
    that holds it; a drain ack prefill still owes names decode's grant. Without a drain fence,
    nobody asks for or owes a drain ack.

    With `recompute`: a grant or a failure notice may also name the grant decode replaced when
    it recomputed the request (`_recomputed`): a copy of the grant, or prefill's notice that the
    lease on that grant's blocks expired, still on its way."""

    def decodes(m: Bound) -> Term:
        """m names decode's generation for its request (or, recomputed, the one it replaced)."""
        current: Term = m.gen == d_gen(m.req)
        if not recompute:
            return current
        return Or(current, And(_recomputed(m.req), m.gen == p_gen(m.req)))

    return And(
        each_message(["grant"], _current(lambda m: And(m.gen != 0, decodes(m)))),
        each_message(
            ["completion"],
            _current(lambda m: And(m.gen != 0, m.gen == p_gen(m.req)), retired=True),
        ),
        each_message(["abort", "failure"], _current(lambda m: Or(m.gen == 0, decodes(m)))),
        # A drain ack is sent under the attempt current when prefill sends it, so one a first
        # attempt owed may go out during the second: it names a retired generation then.
        each_message(
            ["abort_ack"],
            lambda m: And(
                drain_fence(),
                _current(
                    lambda n: Or(
                        And(n.gen != 0, n.gen == d_gen(n.req)),
                        And(attempt(n.req) > 0, _retired(n.gen, n.dinst)),
                    ),
                    retired=True,
                )(m),
            ),
        ),
        # An owed drain ack names no attempt: one of an earlier attempt's is told by its
        # generation, which decode no longer holds for the request.
        each_pending_ack(
            lambda a: And(
                drain_fence(),
                Or(
                    And(a.gen != 0, a.gen == d_gen(a.req)),
                    And(
                        attempt(a.req) > 0,
                        a.gen != d_gen(a.req),
                        _retired(a.gen, d_inst(a.req)),
                    ),
                ),
            )
        ),
        forall(REQ, lambda r: Implies(d_awaiting_ack(r), drain_fence())),
        # Every message is between its request's own decode instance and prefill: decode sends
        # from it, and prefill's grant, whose pages name where to reply, is decode's for r.
        each_message(
            ["grant", "completion", "abort", "failure", "abort_ack"],
            lambda m: m.dinst == d_inst(m.req),
        ),
    )


def _current(claim: Callable[[Bound], Term], retired: bool = False) -> Callable[[Bound], Term]:
    """`claim` for a message of its request's current attempt; `_stale_message_claim` for one
    of an earlier attempt."""

    def body(m: Bound) -> Term:
        stale = _stale_message(m)
        return And(Implies(stale, _stale_message_claim(m, retired)), Implies(Not(stale), claim(m)))

    return body


def messages_carry_a_generation_of_their_room() -> Term:
    """Room-keyed matching: what decode sends (grants, aborts) still names the generation decode
    granted the request the message is for, and a completion names the grant prefill holds for
    its sender, as under request-keyed matching. But a failure notice, an owed drain ack and a
    drain ack are prefill's, about the grant its request took, which decode may have made for
    another request on the room: they name the generation *prefill* holds for their request
    (with `prefill_holds_a_generation_of_its_room`, one decode issued on that room). Decode
    matches them by room and generation, so one may stop a request other than the one that sent
    it; that costs liveness, never safety."""
    return And(
        each_message(
            ["grant"],
            _current_of_room(lambda m: And(m.gen != 0, m.gen == d_gen(m.req)), issued=True),
        ),
        each_message(
            ["completion"],
            _current_of_room(lambda m: And(m.gen != 0, m.gen == p_gen(m.req)), issued=True),
        ),
        each_message(["abort"], _current_of_room(lambda m: Or(m.gen == 0, m.gen == d_gen(m.req)))),
        each_message(
            ["failure"], _current_of_room(lambda m: Or(m.gen == 0, m.gen == p_gen(m.req)))
        ),
        each_message(
            ["abort_ack"], lambda m: And(drain_fence(), m.gen != 0, m.gen == p_gen(m.req))
        ),
        each_pending_ack(lambda a: And(drain_fence(), a.gen != 0, a.gen == p_gen(a.req))),
        forall(REQ, lambda r: Implies(d_awaiting_ack(r), drain_fence())),
    )


def _issued_on_room(gen: Term, of_room: Term, inst: Term) -> Term:
    """`gen` is a generation decode instance `inst` issued, and whichever of its requests holds
    it at decode is of room `of_room` (said without an existential, as
    `prefill_holds_a_generation_of_its_room` does)."""
    return And(
        gen != 0,
        gen < next_gen(inst),
        forall(REQ, lambda o: Implies(And(d_gen(o) == gen, d_inst(o) == inst), room(o) == of_room)),
    )


def _current_of_room(
    claim: Callable[[Bound], Term], issued: bool = False
) -> Callable[[Bound], Term]:
    """Room-keyed matching's `_current`: `claim` for a message of its request's current attempt;
    one of an earlier attempt is of an earlier attempt, and (`issued`: grants, completions) names
    a generation decode issued on its request's room before the retry (prefill may still take
    such a grant). Not a retired one: under room-keyed matching a retried request's first attempt
    may have written and completed under a grant another request on the room still holds
    (decode's binding refuses what it sent)."""

    def body(m: Bound) -> Term:
        stale = _stale_message(m)
        earlier: Term = m.attempt < attempt(m.req)
        # Issued before the retry, so not the grant decode made for the current attempt.
        # (A generation is one decode instance's: another instance's may be the same number.)
        issued_before = And(
            _issued_on_room(m.gen, room(m.req), m.dinst),
            Or(m.gen != d_gen(m.req), m.dinst != d_inst(m.req)),
        )
        old = And(earlier, issued_before) if issued else earlier
        return And(Implies(stale, old), Implies(Not(stale), claim(m)))

    return body


def _stale_write_of_room(w: Bound) -> Term:
    """Room-keyed matching's stale write: its request was retried, and the write is not of the
    grant decode holds for the request's current attempt. Its generation no longer tells it from
    a current write: the current attempt may take the very grant the earlier one wrote under
    (prefill matches grants by room, so the attempt does not fence them)."""
    return And(attempt(w.req) > 0, Or(w.gen != d_gen(w.req), page_inst(w.page) != d_inst(w.req)))


def writes_carry_their_grant(room_keyed: bool = False) -> Term:
    """A write in flight carries its request's room, generation and data, for a page prefill has
    already counted as written, and its prefill has not completed, nor has the rank writing it
    reported (a rank reports, and prefill completes, only once the rank's writes returned)."""
    return each_write(
        lambda w: Or(
            And(
                p_gen(w.req) != 0,
                w.gen == p_gen(w.req),
                w.data_gen == p_gen(w.req),
                p_written(w.req, w.page),
                p(w.req) != "completed",
                Not(p_rank_done(w.req, w.rank)),
                w.right_room,
                w.right_tenant,
            ),
            # A retry's first attempt's write: under a retired generation, its own data. Under
            # room-keyed matching the grant it was written under may be another request's on the
            # room, which that request may still hold.
            And(
                _stale_write_of_room(w) if room_keyed else _stale_write(w),
                (
                    _issued_on_room(w.gen, w.room, page_inst(w.page))
                    if room_keyed
                    # Retired at its request's own decode instance, the one it writes to.
                    else And(page_inst(w.page) == d_inst(w.req), _retired(w.gen, d_inst(w.req)))
                ),
                w.data_gen == w.gen,
                w.right_room,
                w.right_tenant,
            ),
        )
    )


def owned_pages_hold_owner_data_or_nothing() -> Term:
    """A page decode owns for (r, g) holds r's data for g, or nothing, in every rank's shard. On
    the pull path a shard may also hold data from outside the scenario: a read whose source
    lease expired fetched a reused block. Validation rejects such a page; it never holds
    *another request's* data, which is what the argument needs."""
    return forall(
        PAGE,
        lambda q: Implies(
            owned(q),
            forall(
                RANK,
                lambda k: Implies(
                    shard_has(q, k),
                    Or(
                        And(shard_req(q, k) == owner(q), shard_gen(q, k) == owner_gen(q)),
                        shard_outside(q, k),
                    ),
                ),
            ),
        ),
    )


def validated_pages_hold_own_data() -> Term:
    """Once decode validated a request's completion, every page it holds for the request holds
    the request's own data for its generation, in every rank's shard (so `decode_generate`
    reads exactly that). With several ranks, decode validates each rank's completion as it
    arrives: the shards of a rank it holds a validated completion of already hold that data."""
    return forall(
        REQ,
        lambda r: forall(
            PAGE,
            lambda q: forall(
                RANK,
                lambda k: Implies(
                    And(
                        Or(d(r) == "validated", And(d(r) == "reserved", d_rank(r, k))),
                        d_holds(r, q),
                    ),
                    And(
                        shard_has(q, k),
                        Not(shard_outside(q, k)),
                        shard_req(q, k) == r,
                        shard_gen(q, k) == d_gen(r),
                    ),
                ),
            ),
        ),
    )


def unsubmitted_requests_are_untouched() -> Term:
    """Nothing happens to a request before the router submits it: no phase, answer, grant or
    write, and nothing in flight for it; its attempt number starts at 0 (and a retry only adds
    to it, so it is never negative: what tells an earlier attempt's message from the current
    one's)."""
    everything = ["grant", "completion", "failure", "abort", "abort_ack"]
    return And(
        forall(REQ, lambda r: attempt(r) >= 0),
        forall(
            REQ,
            lambda r: Implies(
                Not(submitted(r)),
                And(
                    attempt(r) == 0,
                    p(r) == "none",
                    d(r) == "none",
                    Not(answered(r)),
                    Not(not_as_is(r)),
                    p_gen(r) == 0,
                    d_gen(r) == 0,
                    p_wrote(r) == 0,
                    Not(d_awaiting_ack(r)),
                ),
            ),
        ),
        each_message(everything, lambda m: submitted(m.req)),
        each_write(lambda w: submitted(w.req)),
        each_pending_ack(lambda a: submitted(a.req)),
    )


def decode_validates_only_completed_prefill(recompute: bool = False) -> Term:
    """Decode validates, reads and answers a request only after that request's own prefill
    completed (every rank reported); an answer with output comes from a read. A completion in
    the network, or one decode holds in its rank set, was sent by a rank that reported: with one
    rank, prefill completed (which is final); with several, prefill completed, or lists the rank
    as done, or stopped since (aborted or lost).

    With `recompute`: decode validates, reads and answers after prefill completed, or after it
    recomputed the request itself (`_recomputed`); it accepts a completion only from a prefill
    that completed, as before."""
    stopped_or_done = ("completed", "aborted", "lost")

    def done(r: Term) -> Term:
        completed = p(r) == "completed"
        return Or(completed, _recomputed(r)) if recompute else completed

    def validated(r: Term) -> Term:
        if not recompute:
            return Implies(
                Or(d(r).is_in(*LATER), read_done(r), accepted_set(r)), p(r) == "completed"
            )
        return And(
            Implies(Or(d(r).is_in(*LATER), read_done(r)), done(r)),
            Implies(accepted_set(r), p(r) == "completed"),
        )

    return And(
        forall(
            REQ,
            lambda r: And(
                validated(r),
                Implies(d(r).is_in("generated", "answered"), read_done(r)),
                Implies(answered_ok(r), And(done(r), read_done(r))),
                forall(
                    RANK,
                    lambda k: Implies(
                        d_rank(r, k), Or(p(r).is_in(*stopped_or_done), p_rank_done(r, k))
                    ),
                ),
            ),
        ),
        # (A completion of a retry's earlier attempt says nothing of the current one.)
        each_message(
            ["completion"],
            lambda m: Or(
                _stale_message(m),
                p(m.req) == "completed",
                And(prefill_ranks() > 1, Or(m.rank_done, p(m.req).is_in(*stopped_or_done))),
            ),
        ),
        # Several ranks: once every rank has shown that it reported (a completion on the wire,
        # held by decode, or counted by prefill), prefill completed: the last rank to report
        # completes it, and nothing takes a completed request back.
        each_message(
            ["completion"],
            lambda m: Implies(
                And(
                    prefill_ranks() > 1,
                    Not(_stale_message(m)),
                    forall(RANK, lambda o: Or(o == m.rank, reported(m.req, o))),
                ),
                p(m.req) == "completed",
            ),
        ),
        each_message(
            ["completion"],
            lambda m: each_message(
                ["completion"],
                lambda n: Implies(
                    And(
                        prefill_ranks() > 1,
                        Not(_stale_message(m)),
                        Not(_stale_message(n)),
                        n.req == m.req,
                        forall(RANK, lambda o: Or(o == m.rank, o == n.rank, reported(m.req, o))),
                    ),
                    p(m.req) == "completed",
                ),
            ),
        ),
    )


def reported(r: Term, k: Term) -> Term:
    """Rank k has reported request r's current grant, as the state shows it: decode holds its
    validated completion, or prefill counts it as done."""
    return Or(d_rank(r, k), p_rank_done(r, k))


def rejected_requests_are_never_completed() -> Term:
    """A request not admitted as sent: prefill never writes or completes it, decode never
    validates it, and the client never gets output for it; and whoever refused it stopped it:
    prefill, decode, or the router (before either)."""
    return And(
        forall(
            REQ,
            lambda r: Implies(
                not_as_is(r),
                And(
                    p_wrote(r) == 0,
                    Not(p(r).is_in("granted", "completed")),
                    Not(d(r).is_in(*LATER)),
                    Not(read_done(r)),
                    Not(answered_ok(r)),
                    Or(
                        p(r) == "rejected",
                        d(r) == "rejected",
                        And(p(r) == "none", d(r) == "none"),
                    ),
                ),
            ),
        ),
        # (A retry's earlier attempt's completion names a retired generation: harmless.)
        each_message(["completion"], lambda m: Or(_stale_message(m), Not(not_as_is(m.req)))),
    )


def rejected_requests_are_never_validated() -> Term:
    """Room-keyed matching: a request not admitted as sent is never validated, read or answered
    with output, and whoever refused it stopped it, as in `rejected_requests_are_never_completed`.
    But prefill may now write for it: where decode refused it (over decode's limit) and prefill
    admitted it (within prefill's), prefill can take the grant decode made for another request
    on its room, write under it and complete. The writes and the completion name the refused
    request, and decode's binding turns them away: decode holds no pages for it and never will
    (decode refuses only a request over its limit, and `d(r) == "rejected"` is final). So a
    request is still never written or completed unless decode refused it and it is within
    prefill's limit.

    That exception is real, not a gap in the proof: in a scenario where decode admits less than
    prefill (`decode_max_prompt < prefill_max_prompt`) and such a request shares a room with one
    decode granted, prefill writes for it, and `room_keyed_with_binding` breaks
    `rejected_request_gets_error_not_output` ("prefill writes nothing for it"; nothing lands).
    Where every prompt over decode's limit is over prefill's too (the sequential scenario: 3 and 2
    pages), the exception is empty and the property follows. For that the invariant says, of
    every request, that decode refuses only over its limit and prefill admits and writes only
    within its own: the scenario's limits are the any-size model's free facts, and without these
    clauses it cannot tell a refused request prefill may write from one it never admitted. (A
    design that keeps an oversized prompt as a placeholder or truncates it admits it over the
    limit; such a design breaks `rejected_request_gets_error_not_output` anyway.)"""
    return And(
        forall(
            REQ,
            lambda r: And(
                Implies(d(r) == "rejected", over_decode_limit(r)),
                Implies(
                    Or(p(r).is_in("admitted", "granted", "completed"), p_wrote(r) > 0),
                    Not(over_prefill_limit(r)),
                ),
            ),
        ),
        forall(
            REQ,
            lambda r: Implies(
                not_as_is(r),
                And(
                    Implies(
                        Or(d(r) != "rejected", over_prefill_limit(r)),
                        And(p_wrote(r) == 0, Not(p(r).is_in("granted", "completed"))),
                    ),
                    Not(d(r).is_in(*LATER)),
                    Not(read_done(r)),
                    Not(answered_ok(r)),
                    Or(
                        p(r) == "rejected",
                        d(r) == "rejected",
                        And(p(r) == "none", d(r) == "none"),
                    ),
                ),
            ),
        ),
        # (A retry's earlier attempt's completion names a grant decode holds for no current
        # attempt of its request: harmless, see `_current_of_room`.)
        each_message(
            ["completion"],
            lambda m: Or(_stale_message(m), Implies(not_as_is(m.req), d(m.req) == "rejected")),
        ),
    )


def decode_reads_only_what_it_validated() -> Term:
    """Room-keyed matching: decode accepts a completion only for a request it has reserved pages
    for, and reads only for one it has validated; neither is ever undone (what follows
    validation is generating, answering, failing, releasing or a crash's loss, and decode never
    reserves for a request again). Under request-keyed matching this follows from prefill's
    progress: prefill completes only under the grant decode made for that very request, so a
    request prefill completed has been reserved at decode. Under room-keyed matching prefill's
    request may complete under another request's grant while decode has not even reserved it,
    and decode's own progress has to be stated on its own."""
    after_validation = ("validated", "generated", "answered", "failed", "released", "lost")
    return forall(
        REQ,
        lambda r: And(
            Implies(accepted_set(r), d(r).is_in(*after_validation)),
            Implies(read_done(r), d(r).is_in(*after_validation[1:])),
        ),
    )


INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "generations_are_unique",
        "no two requests hold the same generation; the counter is past every one",
        generations_are_unique(),
    ),
    Invariant(
        "unreserved_requests_hold_nothing",
        "only a reserved (not yet released) request holds a generation's pages",
        unreserved_requests_hold_nothing(),
    ),
    Invariant(
        "grants_stay_on_their_instance",
        "a grant's pages, at decode, on the wire and at prefill, are one decode instance's",
        grants_stay_on_their_instance(),
    ),
    Invariant(
        "prefill_holds_decodes_generation",
        "the grant prefill holds for a request is decode's grant for it",
        prefill_holds_decodes_generation(),
    ),
    Invariant(
        "messages_carry_their_generation",
        "grants, completions, aborts and acks name their own request's generation",
        messages_carry_their_generation(),
    ),
    Invariant(
        "writes_carry_their_grant",
        "a write in flight carries its own request's room, generation and data",
        writes_carry_their_grant(),
    ),
    Invariant(
        "owned_pages_hold_owner_data_or_nothing",
        "a page owned by (r, g) holds r's data for g, or nothing",
        owned_pages_hold_owner_data_or_nothing(),
    ),
    Invariant(
        "validated_pages_hold_own_data",
        "a validated request's pages all hold its own data for its generation",
        validated_pages_hold_own_data(),
    ),
    Invariant(
        "unsubmitted_requests_are_untouched",
        "nothing happens to a request before the router submits it",
        unsubmitted_requests_are_untouched(),
    ),
    Invariant(
        "decode_validates_only_completed_prefill",
        "decode validates, reads and answers a request only after its own prefill completed",
        decode_validates_only_completed_prefill(),
    ),
    Invariant(
        "rejected_requests_are_never_completed",
        "a request not admitted as sent is never written, completed, validated or answered",
        rejected_requests_are_never_completed(),
    ),
)


def failing_invariants(
    config: Config, state: State, design: Design | None = None
) -> list[Invariant]:
    checked = INVARIANTS if design is None else invariants_for(design)
    return [inv for inv in checked if not inv.holds(config, state, design)]


def fenced_writes_land_in_held_pages() -> Term:
    """One-sided writes land wherever they point, so a drain-fenced design must keep every write
    of the current decode incarnation aimed at a page its own request still holds: a prefill that
    may still write holds the same grant as decode, decode keeps the pages (reserved, or failed
    and awaiting the drain ack) until the writes drained, and once the request is done (answered,
    failed without a fence, completed, told to stop) none of its writes is in flight; with
    several prefill ranks, neither is any write of a rank that reported or acknowledged. Writes of
    an earlier incarnation are refused by the revoked key, so they do not count."""
    live = ("received", "admitted", "granted")

    def current(r: Term) -> Term:
        # (Of the decode instance its transfer goes to: p_epoch is that instance's epoch.)
        return p_epoch(r) == decode_epoch(p_dinst(r))

    def current_write(w: Bound) -> Term:
        # A write carries the epoch of the grant it was issued under (the key it writes with),
        # which after a client's retry need not be its request's `p_epoch` any more.
        stale: Term = w.epoch == decode_epoch(page_inst(w.page))
        return stale

    def held(r: Term) -> Term:
        return Or(d(r) == "reserved", And(d(r) == "failed", d_awaiting_ack(r)))

    def done(r: Term) -> Term:
        return Or(
            d(r).is_in(*LATER),
            And(d(r) == "failed", Not(d_awaiting_ack(r))),
            p(r) == "completed",
        )

    def same_pages(r: Term, has: Callable[[Term], Term]) -> Term:
        return forall(PAGE, lambda q: Implies(has(q), d_holds(r, q)))

    return And(
        each_write(
            lambda w: Implies(
                current_write(w),
                And(
                    # Of the grant decode holds now: after a client's retry, a first attempt's
                    # write aimed at a page the second attempt was granted would land in it.
                    w.gen == d_gen(w.req),
                    d_holds(w.req, w.page),
                    Not(done(w.req)),
                    Not(w.rank_acked),
                    Not(p_rank_done(w.req, w.rank)),
                    Not(d_rank(w.req, w.rank)),
                    Not(d_ack(w.req, w.rank)),
                ),
            )
        ),
        forall(
            REQ,
            lambda r: Implies(
                And(current(r), p(r).is_in(*live), p_gen(r) != 0),
                And(held(r), forall(PAGE, lambda q: p_granted(r, q) == d_holds(r, q))),
            ),
        ),
        each_message(
            ["grant"],
            lambda m: Implies(
                And(
                    m.epoch == decode_epoch(m.dinst),
                    # (A retry's earlier attempt's grant is fenced by its attempt.)
                    Not(_stale_message(m)),
                    p(m.req).is_in("received", "admitted"),
                    p_gen(m.req) == 0,
                ),
                And(held(m.req), forall(PAGE, lambda q: m.has_page(q) == d_holds(m.req, q))),
            ),
        ),
        # A failure notice in flight: prefill stopped, but writes of the grant it names may be
        # on the wire behind it (a failed write does not recall the others); of no other grant
        # (none at all behind a notice sent before any grant, generation 0). Decode fences on
        # the notice of a grant it holds, so they still land in its pages.
        # (A retry's earlier attempt's messages speak for that attempt's writes only.)
        each_message(
            ["failure"],
            lambda m: Or(
                _stale_message(m),
                each_write(lambda w: Not(And(w.req == m.req, current_write(w), w.gen != m.gen))),
            ),
        ),
        # A completion or a drain ack in flight: the writes it speaks for are over (of the same
        # rank).
        # (A retry's earlier attempt's messages speak for that attempt's writes only.)
        # Decode takes a completion or a drain ack for the grant of its generation, so what
        # one claims is about that grant's writes: a drain ack owed by a retried request's
        # first attempt may be sent while the second attempt's writes are on the wire.
        each_message(
            ["completion", "abort_ack"],
            lambda m: Or(
                _stale_message(m),
                each_write(
                    lambda w: Not(
                        And(w.req == m.req, current_write(w), w.rank == m.rank, w.gen == m.gen)
                    )
                ),
            ),
        ),
        # Told to stop (an ack owed, a failure or a drain ack sent): prefill has stopped, unless
        # the ack is a retried request's first attempt's, for a generation no one holds.
        each_pending_ack(
            lambda a: Or(
                Not(p(a.req).is_in(*live)),
                And(attempt(a.req) > 0, _retired(a.gen, d_inst(a.req))),
            )
        ),
        each_message(["failure"], lambda m: Or(_stale_message(m), Not(p(m.req).is_in(*live)))),
        each_message(
            ["abort_ack"],
            lambda m: Or(
                _stale_message(m),
                Not(p(m.req).is_in(*live)),
                And(attempt(m.req) > 0, _retired(m.gen, m.dinst)),
            ),
        ),
    )


ONE_SIDED_INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "fenced_writes_land_in_held_pages",
        "with one-sided writes, a current write only ever targets a page its request still holds",
        fenced_writes_land_in_held_pages(),
    ),
)
"""Extra invariants of designs with one-sided writes and a drain fence (`one_sided_fenced`);
with the ones above they make that design's safety properties inductive too."""


ROOM_KEYED_INVARIANTS: dict[str, Invariant] = {
    "prefill_holds_decodes_generation": Invariant(
        "prefill_holds_a_generation_of_its_room",
        "the grant prefill holds for a request is a grant decode issued on the request's room",
        prefill_holds_a_generation_of_its_room(),
    ),
    "messages_carry_their_generation": Invariant(
        "messages_carry_a_generation_of_their_room",
        "decode's messages name its grant for their request; prefill's name the grant it holds",
        messages_carry_a_generation_of_their_room(),
    ),
    "rejected_requests_are_never_completed": Invariant(
        "rejected_requests_are_never_validated",
        "a request not admitted as sent is never validated or answered, and written only where "
        "decode refused it within prefill's limit",
        rejected_requests_are_never_validated(),
    ),
    "writes_carry_their_grant": Invariant(
        "writes_carry_a_grant_of_their_room",
        "a write in flight carries its own request's room, generation and data; a retried "
        "request's earlier write, a generation decode issued on its room",
        writes_carry_their_grant(room_keyed=True),
    ),
}
"""Room-keyed matching's versions of the invariants that say *whose* grant prefill holds, keyed
by the invariant of `INVARIANTS` each replaces. Under `matching="room"` prefill's request can hold
a grant decode made for another request on its room, so the request-keyed claims are false on
reachable states and cannot be part of any proof; these say what is true instead, and the others
of `INVARIANTS` hold unchanged. With decode's binding (`room_keyed_with_binding`) they make the
safety properties inductive; without it (`room_keyed_matching`) they still hold but the design
breaks the three the binding keeps (`owned_pages_hold_owner_data_or_nothing`,
`validated_pages_hold_own_data`, `decode_validates_only_completed_prefill`) and the properties
that rest on them. With one-sided writes there is no receiver to check the binding: a room-keyed
`one_sided_fenced` lets a write land in another request's page (`fenced_writes_land_in_held_pages`
and `owned_pages_hold_owner_data_or_nothing` fail, and `no_late_write_lands_in_reallocated_page`
breaks); a room-keyed pull design (`reference_pull`'s) keeps them all on two requests sharing a
room."""


ROOM_KEYED_EXTRA_INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "decode_reads_only_what_it_validated",
        "decode accepts only for a request it reserved, and reads only one it validated",
        decode_reads_only_what_it_validated(),
    ),
)
"""What room-keyed matching's proof needs besides `ROOM_KEYED_INVARIANTS`: facts of decode's own
progress that request-keyed matching derives from prefill's."""


RECOMPUTE_INVARIANTS: dict[str, Invariant] = {
    "prefill_holds_decodes_generation": Invariant(
        "prefill_holds_decodes_generation_or_recomputed",
        "the grant prefill holds for a request is decode's grant for it, or the one decode "
        "replaced when it recomputed the request",
        prefill_holds_decodes_generation(recompute=True),
    ),
    "messages_carry_their_generation": Invariant(
        "messages_carry_their_generation_or_recomputed",
        "grants, completions, aborts and acks name their own request's generation, or the one "
        "decode replaced when it recomputed the request",
        messages_carry_their_generation(recompute=True),
    ),
    "decode_validates_only_completed_prefill": Invariant(
        "decode_validates_only_completed_or_recomputed",
        "decode validates, reads and answers a request only after its own prefill completed or "
        "after recomputing it; it accepts a completion only from a prefill that completed",
        decode_validates_only_completed_prefill(recompute=True),
    ),
}
"""Under the recompute policy (`load_failure="recompute"`, `spec/machine.py`'s
`_recompute_effect`) decode validates a request without prefill's completion, under a generation
prefill never held: the three claims that tie decode's validation to prefill's grant and
completion are false on reachable states, and these say what is true instead."""


def invariants_for(design: Design) -> tuple[Invariant, ...]:
    """The invariants of the proof of a design, as every checker reads them (the explorer's
    `--invariants`, kind, the fixed-configuration prove): `INVARIANTS`, with room-keyed
    matching's versions in place of the request-keyed ones (or, for a pull design that
    recomputes after a failed read, `RECOMPUTE_INVARIANTS`), and `ONE_SIDED_INVARIANTS` after
    them for designs with one-sided writes."""
    core = INVARIANTS
    if design.matching == "room":
        core = tuple(ROOM_KEYED_INVARIANTS.get(inv.name, inv) for inv in INVARIANTS)
        core += ROOM_KEYED_EXTRA_INVARIANTS
    elif design.transfer == "pull" and design.load_failure == "recompute":
        # The recompute versions are written for request-keyed matching; a room-keyed design
        # that recomputes gets room-keyed matching's, which say nothing of a recompute (its
        # proof may then stay UNKNOWN, never a wrong SAFE: every claim is checked).
        core = tuple(RECOMPUTE_INVARIANTS.get(inv.name, inv) for inv in INVARIANTS)
    extra = ONE_SIDED_INVARIANTS if design.write_path == "one_sided" else ()
    return core + extra
