"""What each step does: `init`, `enabled` and `step`.

Read this file as the protocol's rulebook, top to bottom. Each rule (an action of the protocol, or a
fault) has a section of its own under its name, with two formulas over the vocabulary of
`spec/vocabulary.py`: its guard (when the step may happen, reading only what the acting component
knows) and its effect (what changes). Each rule is written once, here: the Z3 engines translate
these formulas (`rule_guard`, `rule_effect`), and `enabled` and `step`, which the explorer, the
conformance oracle and the log validator call, run them compiled to Python (`spec/compiled.py`).
The rules, in the order a successful handoff takes them:

1. `router_submit_request`  The router refuses prompts over the context window; otherwise it hands
   the request to prefill and decode at once.
2. `prefill_admit_request` / `prefill_reject_request`  Prefill admits what fits its limit. What it
   does with a prompt that does not fit is a design option (reject / placeholder / truncate).
3. `decode_admit_request` / `decode_reject_request`  Decode checks its own limit.
4. `decode_reserve_pages`  Decode takes free pages under a fresh generation and sends the grant.
5. `prefill_receive_grant`, `prefill_write_page`, `decode_receive_write`  Prefill writes each
   granted page; decode accepts a write only into a page it owns for that room, generation and
   request (receiver-checked path) or the write lands wherever it points (one-sided path).
6. `prefill_send_completion`  Once its writes have returned, prefill sends its completion: the page
   count it wrote and a digest of the data.
7. `decode_receive_completion`  Decode validates the completion before anything is read.
8. `decode_generate`, `decode_answer`, `decode_release_pages`  Decode reads the pages, answers, and
   returns the pages to the pool (zeroed, and fenced against late writes).

Failure paths: rejection notices, aborts and their drain acks, timeouts, cancels, crash detection
through health checks, and retransmission of messages whose RPC failed. Faults are at the bottom.
A client's cancel is answered by the router at once and reaches decode and prefill later, each by
a call of its own (`decode_receive_cancel`, `prefill_receive_cancel`): decode may validate a
completion already on its way in between.

The incident (the variant `incident`, docs/incident-walkthrough.md) is four design options of these
rules taken together, each marked where its rule reads it: prefill keeps an oversized prompt as a
one-page placeholder instead of rejecting it (M1, `prefill_reject_request`), writes that one page
(`prefill_write_page`) and claims every granted page written (M2, `prefill_send_completion`);
decode checks nothing (M3, `decode_receive_completion`) and reads pages prefill never wrote,
which, where the pool did not zero them on release (M20, `decode_release_pages`), still hold an
earlier request's data, possibly another tenant's.

How a message finds its request is the design's, stated in each receiving rule. Decode takes a
completion or a drain ack for the first request it holds on the message's room and generation
(generations are decode's own, one per grant). Prefill takes a grant, and either side an abort or
a failure notice, by the request id the message carries (`matching="request"`, as our
implementation keys transfer state) or by room alone (`matching="room"`, SGLang's
`bootstrap_room`, which clients can choose and fan-outs share: then the first request on the room
takes it, whichever request it was made for). With `binds_request` a page write and a completion
name their request, and decode takes them only for that request: the defence that keeps a
grant taken by the wrong request from filling another tenant's pages.

With several prefill ranks (`Config.prefill_ranks`; see `state.py`, "Prefill ranks"), steps 5-7
happen per rank: `prefill_write_page` queues one write per rank (each rank's shard of the page),
each rank sends its own completion once its own writes returned, and decode accepts the transfer
only when every rank's completion arrived and validated. A completion speaks only for its own
rank's shards: one rank's Success says nothing about the others', which is why decode waits for
all of them. After an abort each rank acknowledges the drain of its own writes.

Several prefill and decode instances (`Config.prefill_instances`, `Config.decode_instances`; see
`state.py`, "Instances"): each request is placed on one of each (`p_inst(r)`, `d_inst(r)`, rigid);
decode grants it pages of its own instance's pool under that instance's generation counter
(`next_gen(d_inst(r))`), and every message names the decode instance at its decode end (`m.dinst`):
prefill finds a grant or an abort only among its own instance's requests, and decode a completion,
a failure notice or a drain ack only among its own. With one instance of each every such term is
0 and the rules are those of one worker of each.

(Until commit 6dda962 each rule was also written as a Python function, the explorer's former path;
those copies were retired in d40c5de, once tests/spec/test_compiled_rules.py had shown, on main,
that the compiled formulas list the same actions in the same order and give the same next states.
See docs/one-semantics.md.)
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from kvhandoff.spec.actions import (
    Action,
    ClientCancelRequest,
    DecodeAdmitRequest,
    DecodeAnswer,
    DecodeDetectPrefillRestart,
    DecodeGenerate,
    DecodeReceiveAbortAck,
    DecodeReceiveCancel,
    DecodeReceiveCompletion,
    DecodeReceiveFailure,
    DecodeReceiveWrite,
    DecodeRejectRequest,
    DecodeReleasePages,
    DecodeReleaseTimeout,
    DecodeReservePages,
    DecodeRestart,
    DecodeSuspectPrefillDead,
    DecodeWaitingTimeout,
    NetworkDropMessage,
    NetworkDuplicateMessage,
    NetworkFailTransfer,
    PrefillAbortRequest,
    PrefillAdmitRequest,
    PrefillDetectDecodeRestart,
    PrefillLeaseExpire,
    PrefillReceiveAbort,
    PrefillReceiveCancel,
    PrefillReceiveGrant,
    PrefillRejectRequest,
    PrefillRestart,
    PrefillSendAbortAck,
    PrefillSendCompletion,
    PrefillWriteError,
    PrefillWritePage,
    RetransmitMessage,
    RouterRetryRequest,
    RouterSubmitRequest,
    action_name,
    snake_case,
)
from kvhandoff.spec.compiled import rules
from kvhandoff.spec.config import Config
from kvhandoff.spec.effects import (
    EffectFormula,
    Updates,
    adopt_orphan,
    answer_error,
    answer_ok,
    assign,
    consume,
    copy,
    each,
    effect,
    forget_orphans,
    instance_effect,
    issue_writes,
    lose,
    message_effect,
    resend,
    send,
    write_effect,
)
from kvhandoff.spec.logic import (
    DINST,
    FAILURE_REASONS,
    FALSE,
    PAGE,
    PINST,
    RANK,
    REQ,
    TRUE,
    And,
    Bound,
    GuardFormula,
    If,
    Implies,
    Not,
    Or,
    Term,
    Var,
    count,
    each_write,
    exists,
    forall,
    guard,
    instance_guard,
    message_guard,
    rank_guard,
    write_guard,
)
from kvhandoff.spec.state import PREFILL_LIVE, PREFILL_TERMINAL, State, initial_state
from kvhandoff.spec.variants import REFERENCE, Design, FormulaGuard, Variant
from kvhandoff.spec.vocabulary import (
    accepted_full,
    accepted_set,
    answered,
    answered_ok,
    attempt,
    cancelled_mid_transfer,
    cancels_spent,
    crashes_spent,
    cross_tenant_reuse,
    d,
    d_ack,
    d_awaiting_ack,
    d_cancel,
    d_epoch,
    d_gen,
    d_holds,
    d_inst,
    d_rank,
    decode_epoch,
    decode_seen_prefill_epoch,
    drain_acked,
    drops_spent,
    duplicates_spent,
    faults_spent,
    last_tenant,
    late_landing,
    max_active,
    max_cancels,
    max_crashes,
    max_drops,
    max_duplicates,
    max_faults,
    max_partitions,
    max_prefill_aborts,
    max_retries,
    max_timeouts,
    max_write_errors,
    next_gen,
    not_as_is,
    ok_after_crash,
    ok_after_loss,
    over_context_window,
    over_decode_limit,
    over_prefill_limit,
    owned,
    owner,
    owner_gen,
    p,
    p_acked,
    p_cancel,
    p_dinst,
    p_epoch,
    p_gen,
    p_grant_dinst,
    p_granted,
    p_granted_count,
    p_inst,
    p_lease_expired,
    p_len,
    p_rank_done,
    p_written,
    p_wrote,
    page_inst,
    page_reuse,
    page_used,
    partitions_spent,
    pending_ack,
    pending_ack_gen,
    prefill_aborts_spent,
    prefill_epoch,
    prefill_seen_decode_epoch,
    prompt_pages,
    read_done,
    read_gen,
    read_has,
    read_page,
    read_req,
    refused_write,
    retries_spent,
    room,
    scrubbed_written_page,
    shard_gen,
    shard_has,
    shard_req,
    submitted,
    tenant,
    timeouts_spent,
    truncated_len,
    waits_for,
    write_errors_spent,
)


class ActionNotEnabled(ValueError):
    """`step` was asked to take an action whose guard is false in this state."""


def init(config: Config) -> State:
    return initial_state(config)


# --- How a rule is written -----------------------------------------------------------------------
#
# A guard is a formula over the vocabulary with the action's arguments free: `guard(lambda r:
# ...)` for a step of one request (enabled for each request where it holds), `guard(lambda: ...)`
# for a step of none, `rank_guard(lambda r, k: ...)` for a step each prefill rank takes for a
# request, `message_guard(...)` and `write_guard(...)` for a step that takes a message or a page
# write in flight (enabled for each distinct one for which the body holds), and
# `instance_guard((DINST, PINST), lambda jd, ip: ...)` for a step of one instance or one pair of
# instances (a restart, a health check, a partition: enabled for each of them).
#
# An effect is a list of updates over the same vocabulary (`spec/effects.py`): `assign(d(r),
# "reserved")`, `send("grant", r, ...)`, `answer_error(r, reason)`, ..., each value read in the
# state before the step (simultaneous assignment, as mypyvy and TLA+ state a transition); an
# update with `when=` happens only where its condition holds.
#
# Design options are Python `if`s evaluated when a formula is built: a design's rule is a
# different formula, not a run-time branch. The pieces several effects share come first.


def _of_transfer(w: Bound, r: Var, gen: Term) -> Term:
    """Write w is of prefill's transfer for r under generation `gen`, as prefill tells its own
    transfers: r's room, that generation, to the decode instance of r's grant (each decode
    instance counts its own generations)."""
    return And(w.room == room(r), w.gen == gen, page_inst(w.page) == p_dinst(r))


def _first(t: Var, holds: Callable[[Var], Term]) -> Term:
    """t is the first request (in request order) for which `holds`: how a worker that keys
    transfer state by room picks one request among those sharing the room."""
    return And(holds(t), forall(REQ, lambda u: Implies(u < t, Not(holds(u)))))


def _decode_fail_effect(
    design: Design, r: Var, reason: str, when: Term, abort: Term, fence: bool = True
) -> Updates:
    """Decode gives up on request r, where `when` holds: the client gets an error, decode forgets
    the ranks that reported, and (where `abort` also holds) prefill is told to stop.

    When prefill may still be writing (the request holds a grant), decode sends an abort for the
    generation (generation 0 before any grant); on the one-sided path with a drain fence, release
    then waits for prefill's ack (`d_awaiting_ack`), unless `fence` is False: the caller's design
    releases without it (`fence_survives_suspicion`)."""
    reserved = d(r) == "reserved"
    fenced = fence and design.drain_fenced
    return [
        send("abort", r, gen=If(reserved, d_gen(r), 0), when=And(when, abort)),
        answer_error(r, reason, when=when),
        assign(d(r), "failed", when=when),
        assign(d_awaiting_ack(r), And(abort, reserved) if fenced else FALSE, when=when),
        each(RANK, lambda k: assign(d_rank(r, k), False, when=when)),
    ]


def _stop_prefill_effect(r: Var, when: Term) -> Updates:
    """Prefill stops working on request r (`aborted`), where `when` holds: its ranks send nothing
    more."""
    return [
        assign(p(r), "aborted", when=when),
        each(RANK, lambda k: assign(p_rank_done(r, k), False, when=when)),
    ]


# --- router_submit_request -----------------------------------------------------------------------
#
# The router is the client's only door, and the advertised context window its only limit: a prompt
# over it is refused at once and never reaches a worker. Any other prompt goes to prefill and
# decode together (SGLang's early policy); each worker then admits it or not by its own limit.
# The router learned both workers' boot epochs from their health checks; the request carries
# them, so a worker can later tell which requests a peer's restart affected.


def _router_submit_guard(design: Design) -> GuardFormula:
    # The router submits each request once, and bounds its own load: fewer than `max_active`
    # requests in progress (submitted, not yet answered). Where the scenario submits in list
    # order (`waits_for`), a request goes in only after the one before it: small scenarios stay
    # small without losing any interleaving of the steps that follow.
    in_progress = count(REQ, lambda q: And(submitted(q), Not(answered(q))))
    return guard(
        lambda r: And(
            Not(submitted(r)),
            in_progress < max_active(),
            forall(REQ, lambda q: Implies(waits_for(r, q), submitted(q))),
        )
    )


def _router_submit_effect(design: Design) -> EffectFormula:
    # Over the window: the client's error, at once. Otherwise both workers get the request, with
    # the epochs the router last saw in their health checks.
    def body(r: Var) -> Updates:
        over = over_context_window(r)
        fits = Not(over)
        return [
            assign(submitted(r), True),
            answer_error(r, "prompt over the context window", when=over),
            assign(not_as_is(r), True, when=over),
            assign(p(r), "received", when=fits),
            assign(d(r), "received", when=fits),
            assign(p_epoch(r), decode_epoch(d_inst(r)), when=fits),
            assign(d_epoch(r), prefill_epoch(p_inst(r)), when=fits),
        ]

    return effect(body)


# --- prefill_admit_request -----------------------------------------------------------------------
#
# Admission is one decision with two outcomes: which one a prompt gets is fixed by its length
# against the worker's own limit (a rigid fact of the scenario). What prefill's rejection *does*
# (reject, placeholder, truncate) is a design option of the effect, not of the guard. Prefill
# admits what fits its limit; the design decides what it does with the rest.


def _prefill_admit_guard(design: Design) -> GuardFormula:
    return guard(lambda r: And(p(r) == "received", Not(over_prefill_limit(r))))


def _prefill_admit_effect(design: Design) -> EffectFormula:
    # A grant that overtook the hand-over is already held: prefill goes straight to writing.
    return effect(
        lambda r: [
            assign(p(r), "admitted"),
            assign(p(r), "granted", when=p_gen(r) != 0),
            assign(p_len(r), prompt_pages(r)),
        ]
    )


# --- prefill_reject_request ----------------------------------------------------------------------
#
# The design's three answers to a prompt over prefill's limit:
# - `reject` fails closed: write nothing, tell decode (so it frees its reservation) and the client;
# - `placeholder` (M1, where the incident begins): the request keeps its room and bootstraps
#   normally, now one page long, while decode reserves (and will read) pages for the whole prompt;
#   only a design that reports the error, to a router that honours it, tells the client;
# - `truncate`: prefill keeps only as much of the prompt as fits.


def _prefill_reject_guard(design: Design) -> GuardFormula:
    return guard(lambda r: And(p(r) == "received", over_prefill_limit(r)))


def _prefill_reject_effect(design: Design) -> EffectFormula:
    # The design's choice is a Python `if` here: each option is a different effect.
    honours = design.router_honours_prefill_error

    def body(r: Var) -> Updates:
        out: list[Any] = [assign(not_as_is(r), True)]
        if design.oversize == "reject":
            out += [assign(p(r), "rejected"), send("failure", r, gen=0, reason="rejected")]
            if honours:
                out += [answer_error(r, "rejected by prefill: prompt over its limit")]
            return out
        out += [assign(p(r), "admitted"), assign(p(r), "granted", when=p_gen(r) != 0)]
        if design.oversize == "placeholder":
            out += [assign(p_len(r), 1)]
            if design.placeholder_reports_error and honours:
                out += [answer_error(r, "aborted by prefill: prompt over its limit")]
            return out
        return [*out, assign(p_len(r), truncated_len())]

    return effect(body)


# --- decode_admit_request ------------------------------------------------------------------------
#
# Decode checks the prompt against its own limit, independently of prefill's (M6: the two limits
# differ, and a prompt can fit one and not the other).


def _decode_admit_guard(design: Design) -> GuardFormula:
    return guard(lambda r: And(d(r) == "received", Not(over_decode_limit(r))))


def _decode_admit_effect(design: Design) -> EffectFormula:
    return effect(lambda r: [assign(d(r), "admitted")])


# --- decode_reject_request -----------------------------------------------------------------------
#
# Decode refuses the prompt: the client gets an error, and prefill, which may have admitted it and
# be waiting for a grant that will never come, gets an abort (generation 0: no grant yet).


def _decode_reject_guard(design: Design) -> GuardFormula:
    return guard(lambda r: And(d(r) == "received", over_decode_limit(r)))


def _decode_reject_effect(design: Design) -> EffectFormula:
    return effect(
        lambda r: [
            answer_error(r, "rejected by decode: prompt over its limit"),
            assign(d(r), "rejected"),
            assign(not_as_is(r), True),
            send("abort", r, gen=0),
        ]
    )


# --- decode_reserve_pages ------------------------------------------------------------------------
#
# Decode grants every page the prompt needs, under one fresh generation: the generation is what
# later tells a write, a completion or an abort of this grant from one of an earlier grant of the
# same room. In the incident decode, whose limit the prompt fits, reserves all three pages of a
# prompt prefill keeps one page of.


def _decode_reserve_guard(design: Design) -> GuardFormula:
    # Decode grants every page the prompt needs at once, under one fresh generation, or waits
    # (stays `admitted`) until enough are free: a partial grant would leave prefill nowhere to
    # put the rest of the prompt. Free means granted to no request; decode grants pages of the
    # pool of its own instance, the one the request is on.
    def free(r: Var) -> Term:
        return count(PAGE, lambda q: And(Not(owned(q)), page_inst(q) == d_inst(r)))

    return guard(lambda r: And(d(r) == "admitted", free(r) >= prompt_pages(r)))


def _decode_reserve_effect(design: Design) -> EffectFormula:
    # The first free pages of the request's decode instance, in page order, as many as the
    # prompt needs: page q is chosen when it is free and fewer than that many free pages come
    # before it. The generation comes from that instance's counter.
    def body(r: Var) -> Updates:
        def mine(q: Var) -> Term:
            return And(Not(owned(q)), page_inst(q) == d_inst(r))

        def chosen(q: Var) -> Term:
            before = count(PAGE, lambda o: And(o < q, mine(o)))
            return And(mine(q), before < prompt_pages(r))

        gen = next_gen(d_inst(r))
        return [
            each(
                PAGE,
                lambda q: [
                    assign(owned(q), True, when=chosen(q)),
                    assign(owner(q), r, when=chosen(q)),
                    assign(owner_gen(q), gen, when=chosen(q)),
                    assign(page_used(q), True, when=chosen(q)),
                    assign(last_tenant(q), tenant(r), when=chosen(q)),
                    assign(d_holds(r, q), chosen(q)),
                ],
            ),
            # Ghost history for the witnesses: a page granted again, and to another tenant.
            assign(page_reuse(), True, when=exists(PAGE, lambda q: And(chosen(q), page_used(q)))),
            assign(
                cross_tenant_reuse(),
                True,
                when=exists(
                    PAGE, lambda q: And(chosen(q), page_used(q), last_tenant(q) != tenant(r))
                ),
            ),
            assign(d(r), "reserved"),
            assign(d_gen(r), gen),
            send("grant", r, gen=gen, epoch=decode_epoch(d_inst(r)), pages=chosen),
            assign(next_gen(d_inst(r)), gen + 1),
        ]

    return effect(body)


# --- prefill_receive_grant -----------------------------------------------------------------------
#
# A step that takes a message is enabled for each distinct message of its kind in the network
# (`message_guard`): receiving asks nothing more of the receiver; what the message does depends
# on the receiver's state, in the effect. The grant can overtake the router's hand-over to
# prefill's scheduler: prefill keeps it, and starts writing as soon as the request is admitted.


def _prefill_receive_grant_guard(design: Design) -> GuardFormula:
    return message_guard("network", ("grant",), lambda m: TRUE)


def _prefill_receive_grant_effect(design: Design) -> EffectFormula:
    # A grant for a request prefill still waits on is taken; any other is stale or a duplicate,
    # and dropped, except where prefill keeps transfer state for a grant of a room it no longer
    # serves (M18): that state is never freed.
    def body(m: Bound) -> Updates:
        def waiting(t: Var) -> Term:
            return And(p(t).is_in("received", "admitted"), p_gen(t) == 0)

        def take(t: Var, when: Term) -> Updates:
            return [
                assign(p(t), "granted", when=And(when, p(t) == "admitted")),
                assign(p_gen(t), m.gen, when=when),
                # Prefill answers where the grant came from (its sender, which under room-keyed
                # matching need not be the decode instance of t's own placement).
                assign(p_grant_dinst(t), m.dinst, when=when),
                assign(p_epoch(t), m.epoch, when=when),
                each(PAGE, lambda q: assign(p_granted(t, q), m.has_page(q), when=when)),
            ]

        if design.matching == "room":
            # Keyed by room alone (SGLang's `bootstrap_room`): the first request waiting on the
            # grant's room takes it, whichever request decode made it for, among the requests
            # of the prefill instance the grant was sent to (the one decode's request is on).
            def on_room(t: Var) -> Term:
                return And(waiting(t), room(t) == m.room, p_inst(t) == p_inst(m.req))

            return [consume(m), each(REQ, lambda t: take(t, _first(t, on_room)))]
        # Keyed by the request id the grant carries (and its room: our implementation), and,
        # with `attempt_fence`, the attempt it was made for: a grant of a retried request's first
        # attempt is stale for the second (see `router_retry_request`).
        r = m.req
        if design.attempt_fence:
            mine = And(waiting(r), m.attempt == attempt(r))
        else:
            mine = waiting(r)
        out: list[Any] = [consume(m), take(r, mine)]
        if design.prefill_adopts_unknown_grant:
            unknown = And(Not(waiting(r)), Not(p(r).is_in(*PREFILL_LIVE)))
            out.append(adopt_orphan(r, m.gen, when=unknown))
        return out

    return message_effect(body)


# --- prefill_write_page --------------------------------------------------------------------------
#
# Prefill can only write pages it has data for (`p_len`, its own view of the prompt), and never
# more than were granted. The ranks compute each page together; each then sends its own shard of
# it (one write per rank). In the incident the placeholder is one page long: prefill writes one
# page of a grant of three.


def _prefill_write_guard(design: Design) -> GuardFormula:
    # Prefill writes its granted pages one at a time, in grant order, while it has data for the
    # next one (its own view of the prompt, `p_len`, which a placeholder or a truncation
    # shortens) and a granted page to put it in: `p_wrote < min(p_len, granted)`. Where the two
    # views differ, the pages past the shorter one are never written: what the completion then
    # claims is the design's (`prefill_send_completion`).
    return guard(
        lambda r: And(p(r) == "granted", p_wrote(r) < p_len(r), p_wrote(r) < p_granted_count(r))
    )


def _prefill_write_effect(design: Design) -> EffectFormula:
    # The next page in grant order: the granted page with p_wrote granted pages before it.
    def nth(r: Var, q: Var) -> Term:
        before = count(PAGE, lambda o: And(o < q, p_granted(r, o)))
        return And(p_granted(r, q), before == p_wrote(r))

    return effect(
        lambda r: [
            issue_writes(r, lambda q: nth(r, q)),
            assign(p_wrote(r), p_wrote(r) + 1),
        ]
    )


# --- decode_receive_write ------------------------------------------------------------------------
#
# The two write paths: on the receiver-checked path (our gRPC path) decode itself accepts or
# refuses each write; on the one-sided path (RDMA) the write lands wherever it points, and only a
# fence (`decode_release_pages`, `decode_receive_abort_ack`) or a revoked key keeps a late write
# out of a page granted again. A restarted decode registered its pool again: the remote key a
# write was issued with before the restart is revoked, so the NIC refuses it; fencing designs rely
# on this after a crash.


def _decode_receive_write_guard(design: Design) -> GuardFormula:
    # A write arrives whenever it is on the wire: whether it lands is the design's, in the effect.
    return write_guard(lambda w: TRUE)


def _decode_receive_write_effect(design: Design) -> EffectFormula:
    # Where a write lands is the design's: the receiver-checked path refuses a write into a page
    # decode does not own for the write's room and generation (and, with `binds_request`, for
    # the request the write names: a write made under a grant some other request took is
    # refused); the one-sided path lets it land (a fencing design's restarted decode has revoked
    # the old key: writes issued against the old epoch are refused by the NIC).
    def body(w: Bound) -> Updates:
        q, k = w.page, w.rank
        owns = And(owned(q), room(owner(q)) == w.room, owner_gen(q) == w.gen)
        if design.binds_request:
            owns = And(owns, owner(q) == w.req)
        if design.write_path == "receiver_checked":
            refused: Term = Not(owns)
        elif design.release_fence != "none":
            # (The key of the decode instance whose pool the page is in.)
            refused = w.epoch != decode_epoch(page_inst(q))
        else:
            refused = FALSE
        lands = Not(refused)
        data_req: Term = w.req
        data_gen: Term = w.data_gen
        if design.transfer == "pull":
            # The read fetches what the source block holds when it lands: after the lease
            # expired, another tenant's data (request -1).
            expired = p_lease_expired(w.req)
            data_req, data_gen = If(expired, -1, w.req), If(expired, 0, w.data_gen)
        # Ghost: the transfer landed in a page not owned by its own (request, generation).
        own = And(owned(q), owner(q) == w.req, owner_gen(q) == w.data_gen)
        return [
            consume(w),
            assign(refused_write(), True, when=refused),
            assign(shard_has(q, k), True, when=lands),
            assign(shard_req(q, k), data_req, when=lands),
            assign(shard_gen(q, k), data_gen, when=lands),
            assign(late_landing(), True, when=And(lands, Not(own))),
        ]

    return write_effect(body)


# --- prefill_send_completion ---------------------------------------------------------------------
#
# Each rank reports its own shards: how many pages it wrote, and a digest of them. Under the
# `local` completion rule (M2, the incident's) prefill claims the grant's page count, whatever it
# wrote: after a placeholder, "three pages" for one written.


def _prefill_send_completion_guard(design: Design) -> GuardFormula:
    # Each rank reports once prefill wrote every page it will write (`min(p_len, granted)`, as
    # in `prefill_write_page`: the shorter of its view of the prompt and its grant) and that
    # rank's own writes returned.
    def ready(r: Var, k: Var) -> Term:
        target = If(p_len(r) < p_granted_count(r), p_len(r), p_granted_count(r))
        mine = each_write(lambda w: Not(And(_of_transfer(w, r, p_gen(r)), w.rank == k)))
        return And(p(r) == "granted", p_wrote(r) == target, Not(p_rank_done(r, k)), mine)

    return rank_guard(ready)


def _prefill_send_completion_effect(design: Design) -> EffectFormula:
    # What the completion claims is the design's: the grant's page count (`local`, M2) or the
    # pages written; with a digest, of the pages written (each with its request and generation).
    def body(r: Var, k: Var) -> Updates:
        claimed = p_granted_count(r) if design.completion == "local" else p_wrote(r)
        every_rank = forall(RANK, lambda o: Or(o == k, p_rank_done(r, o)))
        return [
            send(
                "completion",
                r,
                gen=p_gen(r),
                count=claimed,
                digest=design.prefill_sends_digest,
                digest_pages=lambda q: p_written(r, q),
                rank=k,
            ),
            assign(p(r), "completed", when=every_rank),
            each(RANK, lambda o: assign(p_rank_done(r, o), False, when=every_rank)),
            assign(p_rank_done(r, k), True, when=Not(every_rank)),
        ]

    return effect(body)


# --- decode_receive_completion -------------------------------------------------------------------
#
# The check that stands between the network and what decode reads. The reference checks the page
# count and recomputes the digest over the completing rank's shard of every page it holds (a real
# digest hashes the bytes; two shards hash alike exactly when they hold the same request's data
# for the same generation, which is what the tag records). Under `validation="none"` (M3, the
# incident's) decode checks nothing, and accepts a transfer of one page out of three. A rank sends
# its completion only after its writes returned, so nothing of the ranks that reported is in
# flight; one rank's Success is not the transfer's: decode waits for every rank (`first_rank`:
# it does not).


def _decode_receive_completion_guard(design: Design) -> GuardFormula:
    return message_guard("network", ("completion",), lambda m: TRUE)


def _decode_receive_completion_effect(design: Design) -> EffectFormula:
    # The completion is for the first request decode holds reserved on its room (and, with
    # `check_generation`, its generation): decode matches as real workers do, not by request id.
    # It validates what the design says before anything is read.
    def body(m: Bound) -> Updates:
        def waiting(t: Var) -> Term:
            # Among the requests of the decode instance the completion was sent to.
            same = And(d(t) == "reserved", room(t) == m.room, d_inst(t) == m.dinst)
            return And(same, d_gen(t) == m.gen) if design.check_generation else same

        def request(t: Var) -> Updates:
            first = _first(t, waiting)
            hit = And(first, Not(d_rank(t, m.rank)))  # a rank that reported already: a duplicate
            count_ok = m.count == count(PAGE, lambda q: d_holds(t, q))
            digest_ok = And(
                m.has_digest,
                forall(
                    PAGE,
                    lambda q: And(
                        m.digest_page(q) == d_holds(t, q),
                        Implies(
                            d_holds(t, q),
                            And(
                                shard_has(q, m.rank),
                                shard_req(q, m.rank) == m.req,
                                shard_gen(q, m.rank) == m.gen,
                            ),
                        ),
                    ),
                ),
            )
            if design.validation == "none":
                valid: Term = TRUE
            elif design.validation == "count_only":
                valid = count_ok
            elif design.validation == "digest_optional":
                valid = And(count_ok, Or(digest_ok, Not(m.has_digest)))
            else:
                valid = And(count_ok, digest_ok)
            if design.binds_request:
                # The completion names the request it was made for: it must be this one.
                valid = And(valid, m.req == t)
            every_rank = forall(RANK, lambda o: Or(o == m.rank, d_rank(t, o)))
            enough = every_rank if design.completion_quorum == "every_rank" else TRUE
            accept = And(hit, valid, enough)
            own = forall(
                PAGE,
                lambda q: Implies(
                    d_holds(t, q),
                    forall(
                        RANK,
                        lambda o: And(
                            shard_has(q, o), shard_req(q, o) == t, shard_gen(q, o) == d_gen(t)
                        ),
                    ),
                ),
            )
            why = "completion failed validation"
            return [
                # Ranks yet to report may still be writing: abort (and fence) them.
                _decode_fail_effect(design, t, why, And(hit, Not(valid)), Not(every_rank)),
                assign(d_rank(t, m.rank), True, when=And(hit, valid, Not(enough))),
                assign(d(t), "validated", when=accept),
                assign(accepted_set(t), True, when=accept),
                assign(accepted_full(t), own, when=accept),
                each(RANK, lambda o: assign(d_rank(t, o), False, when=accept)),
            ]

        return [consume(m), each(REQ, request)]

    return message_effect(body)


# --- decode_receive_failure ----------------------------------------------------------------------
#
# Prefill's failure notices (a rejection, an abort, an expired lease, a failed write) fail the
# request at decode. Prefill has stopped, but a notice of a grant (generation not 0) may overtake
# writes of that grant still on the wire (`prefill_write_error`): on a drain-fenced design decode
# therefore sends an abort and holds the pages until the drain ack, as after an abort of its own
# (`Design.fence_on_prefill_failure`). A notice sent before any grant has no write behind it.


def _decode_receive_failure_guard(design: Design) -> GuardFormula:
    return message_guard("network", ("failure",), lambda m: TRUE)


def _decode_receive_failure_effect(design: Design) -> EffectFormula:
    # A failure notice for a request decode is still waiting on (for its grant's generation, or
    # sent before any grant) fails it; any other is stale. The language has no strings: each
    # reason a notice can give is a predicate of the message (`m.reason_is(...)`).
    def body(m: Bound) -> Updates:
        def applies(t: Var) -> Term:
            return And(
                d(t).is_in("received", "admitted", "reserved"),
                Or(m.gen == 0, d_gen(t) == m.gen),
                d_inst(t) == m.dinst,  # a request of the decode instance it was sent to
            )

        # Where decode fences (see above), the abort that asks prefill for the drain ack.
        drain = design.drain_fenced
        fence = drain and design.fence_on_prefill_failure

        def fail(t: Var, hit: Term) -> Updates:
            out: list[Any] = []
            abort = And(d(t) == "reserved", m.gen != 0) if fence else FALSE
            for reason in FAILURE_REASONS:
                why = f"prefill reported failure: {reason}"
                when = And(hit, applies(t), m.reason_is(reason))
                out += [_decode_fail_effect(design, t, why, when, abort)]
            return out

        if design.matching == "room":
            # Keyed by room (and generation, where the notice names one): the first request
            # decode is still waiting on for that room.
            def on_room(t: Var) -> Term:
                return And(room(t) == m.room, applies(t))

            return [consume(m), each(REQ, lambda t: fail(t, _first(t, on_room)))]
        # By request id, and with `attempt_fence` the attempt: a rejection notice of a retried
        # request's first attempt (generation 0, so no generation tells it apart) is stale.
        fresh = m.attempt == attempt(m.req) if design.attempt_fence else TRUE
        return [consume(m), fail(m.req, fresh)]

    return message_effect(body)


# --- decode_receive_cancel -----------------------------------------------------------------------
#
# A cancel reaches each worker by a call of its own, whenever the router's word is on its way
# (the router answered the client at once). The guard asks nothing else: a worker that has
# already finished with the request receives the cancel too, and its effect does nothing. Decode
# gives up on a request it still works on; where prefill may hold a grant and be writing, decode
# aborts it (and fences the pages).


def _decode_receive_cancel_guard(design: Design) -> GuardFormula:
    return guard(lambda r: d_cancel(r))


def _decode_receive_cancel_effect(design: Design) -> EffectFormula:
    def body(r: Var) -> Updates:
        early = d(r).is_in("received", "admitted", "reserved")
        late = d(r).is_in("validated", "generated")
        return [
            assign(d_cancel(r), False),
            _decode_fail_effect(design, r, "cancelled by the client", Or(early, late), early),
        ]

    return effect(body)


# --- prefill_receive_cancel ----------------------------------------------------------------------
#
# Prefill stops a request it holds no grant for yet; one it is writing under a grant is stopped
# by decode's abort instead (decode holds the grant, and fences the pages).


def _prefill_receive_cancel_guard(design: Design) -> GuardFormula:
    return guard(lambda r: p_cancel(r))


def _prefill_receive_cancel_effect(design: Design) -> EffectFormula:
    def body(r: Var) -> Updates:
        stop = p(r).is_in("received", "admitted")
        return [assign(p_cancel(r), False), _stop_prefill_effect(r, stop)]

    return effect(body)


# --- decode_generate -----------------------------------------------------------------------------


def _decode_generate_guard(design: Design) -> GuardFormula:
    # Decode reads the pages only once it has validated the completion: the guard that
    # `decode_reads_only_validated_pages` checks is never bypassed. (What validation checks is
    # the design's, in `decode_receive_completion`.)
    return guard(lambda r: d(r) == "validated")


def _decode_generate_effect(design: Design) -> EffectFormula:
    # Decode reads every shard of every page it holds (the ghost `read` records what it saw).
    return effect(
        lambda r: [
            assign(d(r), "generated"),
            assign(read_done(r), True),
            each(
                PAGE,
                lambda q: [
                    assign(read_page(r, q), d_holds(r, q)),
                    each(
                        RANK,
                        lambda k: [
                            assign(read_has(r, q, k), shard_has(q, k)),
                            assign(read_req(r, q, k), shard_req(q, k)),
                            assign(read_gen(r, q, k), shard_gen(q, k)),
                        ],
                    ),
                ],
            ),
        ]
    )


# --- decode_answer -------------------------------------------------------------------------------
#
# The client keeps the first answer it got: an error already sent (a cancel, a timeout) stands.


def _decode_answer_guard(design: Design) -> GuardFormula:
    return guard(lambda r: d(r) == "generated")


def _decode_answer_effect(design: Design) -> EffectFormula:
    def body(r: Var) -> Updates:
        fresh = Not(answered(r))
        return [
            answer_ok(r),
            assign(ok_after_crash(), True, when=And(fresh, crashes_spent() > 0)),
            assign(ok_after_loss(), True, when=And(fresh, drops_spent() > 0)),
            assign(d(r), "answered"),
        ]

    return effect(body)


# --- decode_release_pages ------------------------------------------------------------------------
#
# Pages go back to the pool, zeroed where the design scrubs. Without scrubbing (M20, the
# incident's) a page granted again still holds its last writer's data, and a page the new owner
# never writes is read as the old tenant's.


def _decode_release_guard(design: Design) -> GuardFormula:
    # Decode returns a request's pages once it is done with them (answered, or given up), and
    # not while it waits for prefill's drain ack after an abort: on the one-sided path that wait
    # is the only fence against a late write landing in a page granted again (M7, sglang
    # #24527). Dropping the last clause is examples/variant_replace_guard.py.
    return guard(
        lambda r: And(
            d(r).is_in("answered", "failed"),
            exists(PAGE, lambda q: d_holds(r, q)),
            Not(d_awaiting_ack(r)),
        )
    )


def _decode_release_effect(design: Design) -> EffectFormula:
    # Scrubbing zeroes every shard of the pages returned (a design option: M2 is its absence).
    def body(r: Var) -> Updates:
        def page(q: Var) -> Updates:
            out: list[Any] = [assign(owned(q), False, when=d_holds(r, q))]
            if design.scrub:
                out += [each(RANK, lambda k: assign(shard_has(q, k), False, when=d_holds(r, q)))]
            return [*out, assign(d_holds(r, q), False)]

        out: list[Any] = [each(PAGE, page)]
        if design.scrub:
            written = exists(
                PAGE, lambda q: And(d_holds(r, q), exists(RANK, lambda k: shard_has(q, k)))
            )
            out += [assign(scrubbed_written_page(), True, when=written)]
        return [
            *out,
            assign(d(r), "released"),
            assign(d_awaiting_ack(r), False),
            each(RANK, lambda k: assign(d_ack(r, k), False)),
        ]

    return effect(body)


# --- prefill_receive_abort -----------------------------------------------------------------------


def _prefill_receive_abort_guard(design: Design) -> GuardFormula:
    return message_guard("network", ("abort",), lambda m: TRUE)


def _prefill_receive_abort_effect(design: Design) -> EffectFormula:
    # Prefill stops a request still waiting, or writing under the aborted grant. Where release is
    # fenced on its drain ack, it owes decode that ack once its writes of the grant drained.
    def body(m: Bound) -> Updates:
        def stops(t: Var) -> Term:
            return Or(p(t).is_in("received", "admitted"), And(p(t) == "granted", p_gen(t) == m.gen))

        def abort(t: Var, hit: Term) -> Updates:
            out: list[Any] = [_stop_prefill_effect(t, And(hit, stops(t)))]
            if design.drain_fenced:
                owes = And(hit, m.gen != 0)
                out += [
                    assign(pending_ack(t), True, when=owes),
                    assign(pending_ack_gen(t), m.gen, when=owes),
                ]
            return out

        if design.matching == "room":
            # Keyed by room: the request on the abort's room that took the aborted grant (it owes
            # the drain ack even if it has finished writing), or, for an abort sent before any
            # grant, the first one still waiting on that room.
            # Among the requests of the prefill instance it was sent to. A grant taken is told by
            # its generation and the decode instance that made it (SGLang's ABORT names
            # decode's address; each decode instance counts its own generations), so the drain
            # ack, sent where the grant came from, goes back to the abort's sender.
            def on_room(t: Var) -> Term:
                waiting = And(m.gen == 0, p(t).is_in("received", "admitted"))
                took = And(m.gen != 0, p_gen(t) == m.gen, p_dinst(t) == m.dinst)
                return And(room(t) == m.room, p_inst(t) == p_inst(m.req), Or(waiting, took))

            return [consume(m), each(REQ, lambda t: abort(t, _first(t, on_room)))]
        # By request id, and with `attempt_fence` the attempt: prefill stops a request still
        # waiting for its grant on an abort of *any* generation (decode may abort a grant prefill
        # has not received yet), so only the attempt tells a first attempt's abort from one for
        # the second.
        fresh = m.attempt == attempt(m.req) if design.attempt_fence else TRUE
        return [consume(m), abort(m.req, fresh)]

    return message_effect(body)


# --- prefill_send_abort_ack ----------------------------------------------------------------------
#
# Each rank acknowledges once its own writes of the aborted generation have drained: on the
# one-sided path the ack is what tells decode no write of the old grant can still land.


def _prefill_send_abort_ack_guard(design: Design) -> GuardFormula:
    # The argument is the owed ack, named by the request that owes it (`r`) and the rank (`k`):
    # rank k acknowledges once none of its writes under the aborted grant is still on the wire.
    def drained(r: Var, k: Var) -> Term:
        gen = pending_ack_gen(r)
        mine = each_write(lambda w: Not(And(_of_transfer(w, r, gen), w.rank == k)))
        return And(pending_ack(r), Not(p_acked(r, k)), mine)

    return rank_guard(drained)


def _prefill_send_abort_ack_effect(design: Design) -> EffectFormula:
    # Every request owing an ack for the same room and generation gets one from rank k; once
    # every rank has sent its own, prefill owes nothing more for that abort.
    def body(r: Var, k: Var) -> Updates:
        def same(q: Var) -> Term:
            # The same abort: its room and generation, at this prefill instance, from the same
            # decode instance.
            return And(
                pending_ack(q),
                room(q) == room(r),
                pending_ack_gen(q) == pending_ack_gen(r),
                p_inst(q) == p_inst(r),
                p_dinst(q) == p_dinst(r),
            )

        every_rank = forall(RANK, lambda o: Or(o == k, p_acked(r, o)))
        return each(
            REQ,
            lambda q: [
                send("abort_ack", q, gen=pending_ack_gen(q), rank=k, when=same(q)),
                assign(pending_ack(q), False, when=And(same(q), every_rank)),
                each(RANK, lambda o: assign(p_acked(q, o), False, when=And(same(q), every_rank))),
                assign(p_acked(q, k), True, when=And(same(q), Not(every_rank))),
            ],
        )

    return effect(body)


# --- decode_receive_abort_ack --------------------------------------------------------------------


def _decode_receive_abort_ack_guard(design: Design) -> GuardFormula:
    return message_guard("network", ("abort_ack",), lambda m: TRUE)


def _decode_receive_abort_ack_effect(design: Design) -> EffectFormula:
    # The ack is for the first request decode keeps fenced on the ack's room and generation; the
    # fence lifts once every rank has acknowledged the drain of its own writes.
    def body(m: Bound) -> Updates:
        def fenced(t: Var) -> Term:
            return And(
                d_awaiting_ack(t), room(t) == m.room, d_gen(t) == m.gen, d_inst(t) == m.dinst
            )

        def request(t: Var) -> Updates:
            first = _first(t, fenced)
            hit = And(first, Not(d_ack(t, m.rank)))  # a rank that acknowledged: a duplicate
            every_rank = forall(RANK, lambda o: Or(o == m.rank, d_ack(t, o)))
            done = And(hit, every_rank)
            return [
                assign(d_ack(t, m.rank), True, when=And(hit, Not(every_rank))),
                assign(drain_acked(), True, when=done),
                assign(d_awaiting_ack(t), False, when=done),
                each(RANK, lambda o: assign(d_ack(t, o), False, when=done)),
            ]

        return [consume(m), each(REQ, request)]

    return message_effect(body)


# --- decode_release_timeout ----------------------------------------------------------------------


def _decode_release_timeout_guard(design: Design) -> GuardFormula:
    # Only a design that lets a timeout stand in for the drain ack has this step (M8: a timeout
    # cannot prove a one-sided write stopped). Elsewhere it is never enabled.
    if design.release_fence != "ack_or_timeout":
        return guard(lambda r: FALSE)
    return guard(lambda r: d_awaiting_ack(r))


def _decode_release_timeout_effect(design: Design) -> EffectFormula:
    return effect(
        lambda r: [
            assign(d_awaiting_ack(r), False),
            each(RANK, lambda k: assign(d_ack(r, k), False)),
        ]
    )


# --- decode_detect_prefill_restart ---------------------------------------------------------------
#
# A worker learns of its peer's restart from the health check: the epoch it reports differs from
# the one last seen. (The restart itself is a fault; noticing it is a protocol step.) Each decode
# instance watches each prefill instance on its own (`decode_seen_prefill_epoch(jd, ip)`): it
# fails its requests placed on that prefill that it still waits on from the old incarnation,
# which will never finish them; requests on another prefill instance, and another decode
# instance's, are not its business.


def _decode_detect_prefill_restart_guard(design: Design) -> GuardFormula:
    return instance_guard(
        (DINST, PINST), lambda jd, ip: decode_seen_prefill_epoch(jd, ip) != prefill_epoch(ip)
    )


def _decode_detect_prefill_restart_effect(design: Design) -> EffectFormula:
    def body(jd: Var, ip: Var) -> Updates:
        def request(r: Var) -> Updates:
            mine = And(d_inst(r) == jd, p_inst(r) == ip)
            waiting = d(r).is_in("received", "admitted", "reserved")
            stale = And(mine, waiting, d_epoch(r) != prefill_epoch(ip))
            return [
                _decode_fail_effect(design, r, "prefill restarted", stale, TRUE),
                # The restarted prefill forgot the abort; ask again so it acks once drained.
                send("abort", r, gen=d_gen(r), when=And(mine, Not(stale), d_awaiting_ack(r))),
            ]

        return [
            assign(decode_seen_prefill_epoch(jd, ip), prefill_epoch(ip)),
            each(REQ, request),
        ]

    return instance_effect((DINST, PINST), body)


# --- prefill_detect_decode_restart ---------------------------------------------------------------
#
# Prefill instance ip stops the requests it was serving for the old incarnation of decode
# instance jd: their grants (and the pages they point into) are gone. The decode instance a
# request's transfer goes to is that of the grant prefill holds (`p_dinst`).


def _prefill_detect_decode_restart_guard(design: Design) -> GuardFormula:
    return instance_guard(
        (PINST, DINST), lambda ip, jd: prefill_seen_decode_epoch(ip, jd) != decode_epoch(jd)
    )


def _prefill_detect_decode_restart_effect(design: Design) -> EffectFormula:
    def body(ip: Var, jd: Var) -> Updates:
        def request(r: Var) -> Updates:
            live = p(r).is_in("received", "admitted", "granted")
            mine = And(p_inst(r) == ip, p_dinst(r) == jd)
            return _stop_prefill_effect(r, And(mine, live, p_epoch(r) != decode_epoch(jd)))

        return [
            assign(prefill_seen_decode_epoch(ip, jd), decode_epoch(jd)),
            each(REQ, request),
        ]

    return instance_effect((PINST, DINST), body)


# --- retransmit_message --------------------------------------------------------------------------


def _retransmit_guard(design: Design) -> GuardFormula:
    # The sender knows the RPC failed (see `network_drop_message`) and sends it again.
    return message_guard("lost", (), lambda m: TRUE)


def _retransmit_effect(design: Design) -> EffectFormula:
    return message_effect(lambda m: [resend(m)])


# --- router_retry_request ------------------------------------------------------------------------
#
# A client that got an error may submit the same request again, under the same request id and
# the same room: clients retry, and proxies retry for them (an OpenAI-style client resends a
# request whose stream broke; a fan-out resends a failed branch under its id). The question the
# rule asks is what the *first* attempt has left behind when the second one starts.
#
# When. Only after the client got an error (output is final: nothing to retry), and only once
# both workers have finished with the first attempt: prefill in a terminal phase, decode done
# and holding no page. A worker that still holds the request id refuses a submission under it
# (our prefill and decode answer ALREADY_EXISTS; the router itself keeps the id until both
# sides reported), and the client would just get another error for the same work still going
# on: that refused resubmission is a stutter, not modelled. The router's own word of a cancel
# still on its way to a worker (`d_cancel`, `p_cancel`) is the router's knowledge too, and it
# waits for that call to return first; prompts over the context window are refused at the
# router's door whatever the attempt, so retrying one is not modelled either. The router's
# load bound (`max_active`) counts the retried request as in progress again.
#
# What is *not* waited for, because nobody can see it: the first attempt's messages still in
# the network or among the lost ones (a duplicated grant, a retransmission, a rejection notice
# or an abort sent before any grant, with generation 0), its page writes still in flight, and
# the drain acks prefill may still owe. They stay, and meet the second attempt: that is what
# this rule is for. The fences they meet are the receivers' own: decode's generations (fresh
# for every grant, so a completion, a write or a drain ack of the first attempt names a
# generation no reservation of the second holds), the boot epochs, and prefill's matching of
# grants and aborts by request id, which a retry under the same id does *not* tell apart.
#
# Effect. The router hands the request to both workers again, as `router_submit_request` does,
# and every per-attempt fact of the request starts afresh, so that the second attempt is held
# to the same properties as the first: the client's answer is withdrawn (`answered` may only be
# assigned false), the ghost record of what decode read and accepted is cleared, `not_as_is`
# too; prefill's and decode's phases, grants, counts and rank sets return to those of a request
# just handed over. Decode's generation counter is not touched: the second grant gets a fresh
# generation. A retry is not a fault: it spends its own budget (`max_retries`), never
# `max_faults`, and is a protocol step (so termination is checked across it).


def _router_retry_guard(design: Design) -> GuardFormula:
    in_progress = count(REQ, lambda q: And(submitted(q), Not(answered(q))))
    return guard(
        lambda r: And(
            retries_spent() < max_retries(),
            submitted(r),
            answered(r),
            Not(answered_ok(r)),
            Not(over_context_window(r)),
            Not(d_cancel(r)),
            Not(p_cancel(r)),
            p(r).is_in(*sorted(PREFILL_TERMINAL)),
            d(r).is_in("rejected", "failed", "released", "lost"),
            Not(exists(PAGE, lambda q: d_holds(r, q))),
            in_progress < max_active(),
        )
    )


def _router_retry_effect(design: Design) -> EffectFormula:
    def body(r: Var) -> Updates:
        return [
            assign(retries_spent(), retries_spent() + 1),
            assign(attempt(r), attempt(r) + 1),
            # The client's side: the first attempt's error is set aside.
            assign(answered(r), False),
            assign(not_as_is(r), False),
            # Handed over again, with the epochs the router now sees.
            assign(p(r), "received"),
            assign(p_len(r), 0),
            assign(p_gen(r), 0),
            assign(p_grant_dinst(r), 0),
            assign(p_wrote(r), 0),
            assign(p_epoch(r), decode_epoch(d_inst(r))),
            assign(p_lease_expired(r), False),
            each(PAGE, lambda q: assign(p_granted(r, q), False)),
            each(RANK, lambda k: assign(p_rank_done(r, k), False)),
            assign(d(r), "received"),
            assign(d_gen(r), 0),
            assign(d_epoch(r), prefill_epoch(p_inst(r))),
            assign(d_awaiting_ack(r), False),
            each(
                RANK,
                lambda k: [assign(d_rank(r, k), False), assign(d_ack(r, k), False)],
            ),
            # Ghost: what decode read and accepted belongs to the attempt.
            assign(read_done(r), False),
            each(
                PAGE,
                lambda q: [
                    assign(read_page(r, q), False),
                    each(RANK, lambda k: assign(read_has(r, q, k), False)),
                ],
            ),
            assign(accepted_set(r), False),
            assign(accepted_full(r), False),
        ]

    return effect(body)


# --- Faults --------------------------------------------------------------------------------------
#
# Faults are ordinary actions, listed after the protocol's steps. Each is within its own budget and
# the run's total one (`_within_budget`; `enabled` also lists no fault once the total is spent).


def _within_budget(spent: Term, limit: Term) -> Term:
    return And(faults_spent() < max_faults(), spent < limit)


def _writes_in_flight_for(r: Var) -> Term:
    """Some write of r's transfer under prefill's generation is in flight (whoever issued it)."""
    return Not(each_write(lambda w: Not(_of_transfer(w, r, p_gen(r)))))


# --- client_cancel_request -----------------------------------------------------------------------
#
# The router answers the client at once; decode and prefill hear of it later, each by a call of
# its own (`decode_receive_cancel`, `prefill_receive_cancel`).


def _client_cancel_guard(design: Design) -> GuardFormula:
    # A client may cancel any request the router has taken and not yet answered.
    return guard(
        lambda r: And(
            _within_budget(cancels_spent(), max_cancels()), submitted(r), Not(answered(r))
        )
    )


def _client_cancel_effect(design: Design) -> EffectFormula:
    def body(r: Var) -> Updates:
        decode_busy = d(r).is_in("received", "admitted", "reserved", "validated", "generated")
        return [
            assign(cancels_spent(), cancels_spent() + 1),
            assign(cancelled_mid_transfer(), True, when=And(p(r) == "granted", p_wrote(r) > 0)),
            answer_error(r, "cancelled by the client"),
            assign(d_cancel(r), True, when=decode_busy),
            assign(p_cancel(r), True, when=p(r).is_in("received", "admitted")),
        ]

    return effect(body)


# --- decode_waiting_timeout ----------------------------------------------------------------------
#
# Decode gives up waiting for prefill's transfer: it fails the request and aborts the grant.


def _decode_waiting_timeout_guard(design: Design) -> GuardFormula:
    return guard(
        lambda r: And(_within_budget(timeouts_spent(), max_timeouts()), d(r) == "reserved")
    )


def _decode_waiting_timeout_effect(design: Design) -> EffectFormula:
    return effect(
        lambda r: [
            assign(timeouts_spent(), timeouts_spent() + 1),
            _decode_fail_effect(design, r, "timed out waiting for prefill", TRUE, TRUE),
        ]
    )


# --- prefill_abort_request -----------------------------------------------------------------------


def _prefill_abort_guard(design: Design) -> GuardFormula:
    # Prefill gives up on its own (out of memory, a failed forward pass) between writes.
    return guard(
        lambda r: And(
            _within_budget(prefill_aborts_spent(), max_prefill_aborts()),
            p(r).is_in("admitted", "granted"),
            Not(_writes_in_flight_for(r)),
        )
    )


def _prefill_abort_effect(design: Design) -> EffectFormula:
    def body(r: Var) -> Updates:
        out: list[Any] = [
            assign(prefill_aborts_spent(), prefill_aborts_spent() + 1),
            _stop_prefill_effect(r, TRUE),
        ]
        if design.router_honours_prefill_error:
            out += [answer_error(r, "aborted by prefill")]
        if design.prefill_abort_notifies_decode:
            out += [send("failure", r, gen=p_gen(r), reason="aborted")]
        return out

    return effect(body)


# --- prefill_write_error -------------------------------------------------------------------------
#
# Push path: a page write fails on prefill's side (an RDMA error, a broken session) while others of
# the same grant are still on the wire, on another queue or another rank's engine. Prefill fails
# the transfer at once and tells decode (SGLang's `transfer_worker`: `record_failure`, then the
# Failed status to every destination of the room, whatever its abort policy); the other writes
# are not recalled and may still land. Unlike `prefill_abort_request`, which gives up between
# writes, the notice can now overtake writes of the grant it names: "prefill stopped" no longer
# means "nothing of prefill's is still coming".


def _prefill_write_error_guard(design: Design) -> GuardFormula:
    if design.transfer != "push":
        return guard(lambda r: FALSE)  # the pull path's failed reads are `network_fail_transfer`
    return guard(
        lambda r: And(
            _within_budget(write_errors_spent(), max_write_errors()),
            p(r) == "granted",
            _writes_in_flight_for(r),
        )
    )


def _prefill_write_error_effect(design: Design) -> EffectFormula:
    def body(r: Var) -> Updates:
        out: list[Any] = [
            assign(write_errors_spent(), write_errors_spent() + 1),
            _stop_prefill_effect(r, TRUE),
            send("failure", r, gen=p_gen(r), reason="aborted"),
        ]
        if design.router_honours_prefill_error:
            out += [answer_error(r, "aborted by prefill")]
        return out

    return effect(body)


# --- prefill_restart -----------------------------------------------------------------------------


def _prefill_restart_guard(design: Design) -> GuardFormula:
    return instance_guard((PINST,), lambda ip: _within_budget(crashes_spent(), max_crashes()))


def _prefill_restart_effect(design: Design) -> EffectFormula:
    # All ranks of the instance go down together: every request the instance was working on is
    # lost, and with it what it owed (drain acks) or held (adopted grants). Other instances'
    # requests are untouched.
    def body(ip: Var) -> Updates:
        def request(r: Var) -> Updates:
            here = p_inst(r) == ip
            working = And(here, Not(p(r).is_in("none", "rejected", "completed", "aborted", "lost")))
            return [
                assign(p(r), "lost", when=working),
                each(RANK, lambda k: assign(p_rank_done(r, k), False, when=working)),
                assign(pending_ack(r), False, when=here),
                each(RANK, lambda k: assign(p_acked(r, k), False, when=here)),
            ]

        return [
            assign(crashes_spent(), crashes_spent() + 1),
            each(REQ, request),
            forget_orphans(ip),
            assign(prefill_epoch(ip), prefill_epoch(ip) + 1),
        ]

    return instance_effect((PINST,), body)


# --- decode_restart ------------------------------------------------------------------------------
#
# The router sees decode's stream break: an unanswered client gets an error.


def _decode_restart_guard(design: Design) -> GuardFormula:
    return instance_guard((DINST,), lambda jd: _within_budget(crashes_spent(), max_crashes()))


def _decode_restart_effect(design: Design) -> EffectFormula:
    # The instance loses everything but its generation counter (unless the design resets it):
    # every request it still held is lost (its client gets an error), every page of its pool is
    # free again, zeroed where the design scrubs. Other instances' requests and pages are
    # untouched.
    def body(jd: Var) -> Updates:
        def request(r: Var) -> Updates:
            idle = d(r).is_in("none", "rejected", "released", "lost")
            held = Not(And(idle, Not(exists(PAGE, lambda q: d_holds(r, q)))))
            lost = And(d_inst(r) == jd, held)
            return [
                answer_error(r, "decode restarted", when=lost),
                assign(d(r), "lost", when=lost),
                each(PAGE, lambda q: assign(d_holds(r, q), False, when=lost)),
                assign(d_awaiting_ack(r), False, when=lost),
                each(
                    RANK,
                    lambda k: [
                        assign(d_rank(r, k), False, when=lost),
                        assign(d_ack(r, k), False, when=lost),
                    ],
                ),
            ]

        def page(q: Var) -> Updates:
            here = page_inst(q) == jd
            out: list[Any] = [assign(owned(q), False, when=here)]
            if design.scrub:
                out += [each(RANK, lambda k: assign(shard_has(q, k), False, when=here))]
            return out

        out: list[Any] = [
            assign(crashes_spent(), crashes_spent() + 1),
            each(REQ, request),
            each(PAGE, page),
            assign(decode_epoch(jd), decode_epoch(jd) + 1),
        ]
        if not design.generations_persist:
            out += [assign(next_gen(jd), 1)]
        return out

    return instance_effect((DINST,), body)


# --- decode_suspect_prefill_dead -----------------------------------------------------------------
#
# A network partition, seen from decode: its health check of prefill misses often enough
# (SGLang: `HEARTBEAT_MAX_FAILURE` misses of `/health` -> `_handle_node_failure`; our
# implementation: `prefill_dead_after_misses`) and decode takes prefill for dead. Prefill is
# alive: nothing of it is lost, it keeps the grants it holds, keeps writing, and may send its
# completions and drain acks once the partition heals (the model's network delivers late, so
# "heals" needs no state of its own). Unlike `decode_detect_prefill_restart` no new epoch shows
# that the writer is gone, and that is the point: decode cannot tell a dead prefill from one it
# cannot hear, so what it does on suspicion must be safe for a writer that is still writing.
#
# Decode fails the requests it waits on prefill's transfer for (`reserved`), as a real restart
# would: the client gets an error, prefill is sent an abort for the grant. A request not yet
# granted has nothing at stake at prefill (our decode ties a request to prefill when its grant
# is delivered) and waits on as before.
#
# What becomes of the fence is each design's, and each must stay safe against the live writer:
# - the reference (`release_fence="generation"`, receiver-checked writes) releases the pages at
#   once, as on every failure: a late write is refused by decode's ownership check, and the late
#   completion finds the request failed. Safe, and the request ends.
# - a drain-fenced design (`one_sided_fenced`) keeps its fence: the pages stay held until
#   prefill's drain ack, which comes once the abort gets through and its writes drained. Safe,
#   and the request ends once the partition heals.
# - releasing without the ack ("the writer is gone") is the catalogue variant
#   `release_on_suspected_death` (`fence_survives_suspicion=False`): on the one-sided path a
#   write prefill had in flight, or issues before the abort reaches it, lands in a page granted
#   again to another request.


def _decode_suspect_prefill_dead_guard(design: Design) -> GuardFormula:
    # Decode instance jd takes prefill instance ip for dead, only while one of its requests
    # waits on that prefill: a suspicion with nothing to fail changes nothing but the budget
    # (leaving it out keeps the state space small).
    return instance_guard(
        (DINST, PINST),
        lambda jd, ip: And(
            _within_budget(partitions_spent(), max_partitions()),
            exists(REQ, lambda r: _waits_on(r, jd, ip)),
        ),
    )


def _waits_on(r: Var, jd: Var, ip: Var) -> Term:
    """Decode instance jd waits on prefill instance ip's transfer for request r."""
    return And(d(r) == "reserved", d_inst(r) == jd, p_inst(r) == ip)


def _decode_suspect_prefill_dead_effect(design: Design) -> EffectFormula:
    def body(jd: Var, ip: Var) -> Updates:
        def request(r: Var) -> Updates:
            return _decode_fail_effect(
                design,
                r,
                "prefill stopped answering health checks",
                _waits_on(r, jd, ip),
                TRUE,
                fence=design.fence_survives_suspicion,
            )

        return [assign(partitions_spent(), partitions_spent() + 1), each(REQ, request)]

    return instance_effect((DINST, PINST), body)


# --- prefill_lease_expire ------------------------------------------------------------------------
#
# Pull path only: decode reads the source blocks, which prefill holds under a lease; once it runs
# out, a read still in flight fetches whatever the block holds by then.


def _prefill_lease_expire_guard(design: Design) -> GuardFormula:
    # Pull path only: the lease on the source blocks runs out while decode still reads them.
    if design.transfer != "pull":
        return guard(lambda r: FALSE)
    return guard(
        lambda r: And(
            _within_budget(timeouts_spent(), max_timeouts()),
            Not(p_lease_expired(r)),
            _writes_in_flight_for(r),
        )
    )


def _prefill_lease_expire_effect(design: Design) -> EffectFormula:
    def body(r: Var) -> Updates:
        out: list[Any] = [
            assign(timeouts_spent(), timeouts_spent() + 1),
            assign(p_lease_expired(r), True),
        ]
        if design.lease_expiry_notifies_decode:
            out += [send("failure", r, gen=p_gen(r), reason="lease expired")]
        return out

    return effect(body)


# --- network_fail_transfer -----------------------------------------------------------------------


def _fail_transfer_guard(design: Design) -> GuardFormula:
    # Pull path only: decode's read of a page fails (a loss, within the drops budget).
    if design.transfer != "pull":
        return write_guard(lambda w: FALSE)
    return write_guard(lambda w: _within_budget(drops_spent(), max_drops()))


def _fail_transfer_effect(design: Design) -> EffectFormula:
    # Whether the reader notices is the design's (M14: it does not, and counts the page as
    # received). If it does, it fails the request reserved on the write's room and generation,
    # or, under the recompute policy, computes that request's pages itself.
    def body(w: Bound) -> Updates:
        out: list[Any] = [consume(w), assign(drops_spent(), drops_spent() + 1)]
        if not design.transfer_failure_reported:
            return out

        def reading(t: Var) -> Term:
            # The reader is the decode instance whose page the read was for.
            return And(
                d(t) == "reserved",
                room(t) == w.room,
                d_gen(t) == w.gen,
                d_inst(t) == page_inst(w.page),
            )

        if design.load_failure == "recompute":
            return [*out, *_recompute_effect(design, reading, page_inst(w.page))]

        def request(t: Var) -> Updates:
            first = _first(t, reading)
            return _decode_fail_effect(design, t, "page transfer failed", first, TRUE)

        return [*out, each(REQ, request)]

    return write_effect(body)


def _recompute_effect(design: Design, reading: Callable[[Var], Term], instance: Term) -> Updates:
    """Decode computes the prompt's KV itself into every page it holds for the request whose
    read failed (the first one `reading` picks), and goes on as if the transfer had validated.

    The model recomputes every page, not only those from the first failed one on as vLLM does:
    what matters here is which data the pages hold when decode reads them. The reads of the
    failed transfer are not stopped by the failure. With `recompute_fence` decode recomputes
    under a fresh generation (from its counter, as a grant would be): the pages are owned for
    the new one, and a read of the old one that lands later is refused by the ownership check.
    Without it the pages keep the grant's generation, and such a read lands on a recomputed
    page. `instance`: the decode instance that recomputes (whose counter gives the generation)."""
    hit = exists(REQ, lambda t: _first(t, reading))
    fresh = next_gen(instance)

    def request(t: Var) -> Updates:
        first = _first(t, reading)
        gen = fresh if design.recompute_fence else d_gen(t)

        def page(q: Var) -> Updates:
            held = And(first, d_holds(t, q))
            return [
                assign(owner_gen(q), gen, when=held),
                each(
                    RANK,
                    lambda k: [
                        assign(shard_has(q, k), True, when=held),
                        assign(shard_req(q, k), t, when=held),
                        assign(shard_gen(q, k), gen, when=held),
                    ],
                ),
            ]

        return [
            assign(d(t), "validated", when=first),
            assign(d_gen(t), gen, when=first),
            each(PAGE, page),
            each(RANK, lambda k: assign(d_rank(t, k), False, when=first)),
        ]

    out: list[Any] = [each(REQ, request)]
    if design.recompute_fence:
        out += [assign(next_gen(instance), fresh + 1, when=hit)]
    return out


# --- network_drop_message ------------------------------------------------------------------------
#
# The sender's RPC fails, so the sender knows and will retransmit (`retransmit_message`).


def _drop_guard(design: Design) -> GuardFormula:
    return message_guard("network", (), lambda m: _within_budget(drops_spent(), max_drops()))


def _drop_effect(design: Design) -> EffectFormula:
    return message_effect(lambda m: [assign(drops_spent(), drops_spent() + 1), lose(m)])


# --- network_duplicate_message -------------------------------------------------------------------
#
# A message may arrive twice; what the receiver does with the copy is its effect's (most drop it
# as stale or a duplicate).


def _duplicate_guard(design: Design) -> GuardFormula:
    return message_guard(
        "network", (), lambda m: _within_budget(duplicates_spent(), max_duplicates())
    )


def _duplicate_effect(design: Design) -> EffectFormula:
    return message_effect(lambda m: [assign(duplicates_spent(), duplicates_spent() + 1), copy(m)])


# --- The rulebook --------------------------------------------------------------------------------
#
# The rules by name, and the order `enabled` lists the actions in: group by group, protocol steps
# first, faults last (while the fault budget lasts). Within a group, request by request, each of
# the group's kinds in turn: admission is one decision, so its admit and its reject are one group.
# Breadth-first search, and so which shortest counterexample is found first, depends on this
# order.

PROTOCOL_GROUPS: tuple[tuple[type, ...], ...] = (
    (RouterSubmitRequest,),
    (PrefillAdmitRequest, PrefillRejectRequest),
    (DecodeAdmitRequest, DecodeRejectRequest),
    (DecodeReservePages,),
    (PrefillReceiveGrant,),
    (PrefillWritePage,),
    (DecodeReceiveWrite,),
    (PrefillSendCompletion,),
    (DecodeReceiveCompletion,),
    (DecodeReceiveFailure,),
    (DecodeReceiveCancel,),
    (PrefillReceiveCancel,),
    (DecodeGenerate,),
    (DecodeAnswer,),
    (DecodeReleasePages,),
    (PrefillReceiveAbort,),
    (PrefillSendAbortAck,),
    (DecodeReceiveAbortAck,),
    (DecodeReleaseTimeout,),
    (DecodeDetectPrefillRestart,),
    (PrefillDetectDecodeRestart,),
    (RetransmitMessage,),
    (RouterRetryRequest,),
)
"""The protocol's steps, in the order `enabled` lists them (`spec/compiled.py`)."""

FAULT_GROUPS: tuple[tuple[type, ...], ...] = (
    (ClientCancelRequest,),
    (DecodeWaitingTimeout,),
    (PrefillAbortRequest,),
    (PrefillWriteError,),
    (PrefillRestart,),
    (DecodeRestart,),
    (DecodeSuspectPrefillDead,),
    (PrefillLeaseExpire,),
    (NetworkFailTransfer,),
    (NetworkDropMessage,),
    (NetworkDuplicateMessage,),
)
"""The faults, in the order `enabled` lists them, after the protocol's steps."""

_FAULT_KINDS = frozenset(kind for kinds in FAULT_GROUPS for kind in kinds)

RULE_GUARDS: dict[str, Callable[[Design], GuardFormula]] = {
    "router_submit_request": _router_submit_guard,
    "prefill_admit_request": _prefill_admit_guard,
    "prefill_reject_request": _prefill_reject_guard,
    "decode_admit_request": _decode_admit_guard,
    "decode_reject_request": _decode_reject_guard,
    "decode_reserve_pages": _decode_reserve_guard,
    "prefill_write_page": _prefill_write_guard,
    "decode_receive_cancel": _decode_receive_cancel_guard,
    "prefill_receive_cancel": _prefill_receive_cancel_guard,
    "decode_generate": _decode_generate_guard,
    "decode_answer": _decode_answer_guard,
    "decode_release_pages": _decode_release_guard,
    "decode_release_timeout": _decode_release_timeout_guard,
    "decode_detect_prefill_restart": _decode_detect_prefill_restart_guard,
    "prefill_detect_decode_restart": _prefill_detect_decode_restart_guard,
    "client_cancel_request": _client_cancel_guard,
    "decode_waiting_timeout": _decode_waiting_timeout_guard,
    "prefill_abort_request": _prefill_abort_guard,
    "prefill_write_error": _prefill_write_error_guard,
    "decode_restart": _decode_restart_guard,
    "decode_suspect_prefill_dead": _decode_suspect_prefill_dead_guard,
    "prefill_lease_expire": _prefill_lease_expire_guard,
    "prefill_receive_grant": _prefill_receive_grant_guard,
    "decode_receive_failure": _decode_receive_failure_guard,
    "retransmit_message": _retransmit_guard,
    "network_drop_message": _drop_guard,
    "network_duplicate_message": _duplicate_guard,
    "decode_receive_write": _decode_receive_write_guard,
    "prefill_receive_abort": _prefill_receive_abort_guard,
    "prefill_restart": _prefill_restart_guard,
    "prefill_send_completion": _prefill_send_completion_guard,
    "decode_receive_completion": _decode_receive_completion_guard,
    "decode_receive_abort_ack": _decode_receive_abort_ack_guard,
    "network_fail_transfer": _fail_transfer_guard,
    "prefill_send_abort_ack": _prefill_send_abort_ack_guard,
    "router_retry_request": _router_retry_guard,
}
"""The guards, every step of the protocol and every fault. The Z3 encodings translate these
(`Encoding.rule`); `enabled` runs them compiled (`spec/compiled.py`)."""

RULE_EFFECTS: dict[str, Callable[[Design], EffectFormula]] = {
    "router_submit_request": _router_submit_effect,
    "prefill_admit_request": _prefill_admit_effect,
    "prefill_reject_request": _prefill_reject_effect,
    "decode_admit_request": _decode_admit_effect,
    "decode_reject_request": _decode_reject_effect,
    "decode_reserve_pages": _decode_reserve_effect,
    "prefill_write_page": _prefill_write_effect,
    "decode_receive_cancel": _decode_receive_cancel_effect,
    "prefill_receive_cancel": _prefill_receive_cancel_effect,
    "decode_generate": _decode_generate_effect,
    "decode_answer": _decode_answer_effect,
    "decode_release_pages": _decode_release_effect,
    "decode_release_timeout": _decode_release_timeout_effect,
    "decode_detect_prefill_restart": _decode_detect_prefill_restart_effect,
    "prefill_detect_decode_restart": _prefill_detect_decode_restart_effect,
    "client_cancel_request": _client_cancel_effect,
    "decode_waiting_timeout": _decode_waiting_timeout_effect,
    "prefill_abort_request": _prefill_abort_effect,
    "prefill_write_error": _prefill_write_error_effect,
    "decode_restart": _decode_restart_effect,
    "decode_suspect_prefill_dead": _decode_suspect_prefill_dead_effect,
    "prefill_lease_expire": _prefill_lease_expire_effect,
    "prefill_receive_grant": _prefill_receive_grant_effect,
    "decode_receive_failure": _decode_receive_failure_effect,
    "retransmit_message": _retransmit_effect,
    "network_drop_message": _drop_effect,
    "network_duplicate_message": _duplicate_effect,
    "decode_receive_write": _decode_receive_write_effect,
    "prefill_receive_abort": _prefill_receive_abort_effect,
    "prefill_restart": _prefill_restart_effect,
    "prefill_send_completion": _prefill_send_completion_effect,
    "decode_receive_completion": _decode_receive_completion_effect,
    "decode_receive_abort_ack": _decode_receive_abort_ack_effect,
    "network_fail_transfer": _fail_transfer_effect,
    "prefill_send_abort_ack": _prefill_send_abort_ack_effect,
    "router_retry_request": _router_retry_effect,
}
"""The effects, those of the steps of `RULE_GUARDS`. The Z3 encodings translate these
(`Encoding.rule`); `step` runs them compiled (`spec/compiled.py`)."""


@cache
def rule_guard(design: Design, name: str) -> GuardFormula:
    """The guard of protocol step `name` (snake_case) under `design`, as a formula: what the Z3
    encodings translate (`Encoding.rule`) and `enabled` runs compiled. Built once per design."""
    return RULE_GUARDS[name](design)


@cache
def rule_effect(design: Design, name: str) -> EffectFormula:
    """The effect of protocol step `name` (snake_case) under `design`, as a formula: what the Z3
    encodings translate (`Encoding.rule`) and `step` runs compiled. Built once per design."""
    return RULE_EFFECTS[name](design)


# --- enabled and step ----------------------------------------------------------------------------


def enabled(variant: Variant, config: Config, state: State) -> list[Action]:
    """Every action whose guard holds, protocol steps first, faults last, in a stable order: the
    guard formulas compiled to one Python function per variant (`spec/compiled.py`)."""
    return rules(variant).enabled_for(config)(config, state)


@cache
def _lister(design: Design, kind: type) -> FormulaGuard | None:
    """The actions of one kind whose guard holds: its formula compiled on its own (None: not a
    rule of the rulebook)."""
    name = snake_case(kind.__name__)
    if name not in RULE_GUARDS:
        return None
    return FormulaGuard(name, kind, rule_guard(design, name), design)


def is_enabled(variant: Variant, config: Config, state: State, action: Action) -> bool:
    """`action in enabled(variant, config, state)`, asking only the guard of the action's kind."""
    if variant.extra_actions is not None and action in variant.extra_actions(config, state):
        return True
    for added in variant.added_guards:
        if type(action) is added.kind:
            return action in added(config, state)
    kind: type = type(action)
    if kind in _FAULT_KINDS and state.faults.total >= config.max_faults:
        return False
    hook = variant.guard_overrides.get(action_name(action)) if variant.guard_overrides else None
    if hook is not None:
        return action in list(hook(config, state))
    lister = _lister(variant.design, kind)
    return lister is not None and action in lister(config, state)


def step(variant: Variant, config: Config, state: State, action: Action) -> State:
    """The state after `action`: its effect formula compiled to Python (`spec/compiled.py`), or
    the variant's own effect. The caller must pass an enabled action (see `checked_step`)."""
    effect: Callable[[Config, State, Action], State] | None = (
        rules(variant).steps_for(config).get(type(action))
    )
    if effect is None:
        raise ActionNotEnabled(
            f"{action!r}: no rule of variant {variant.name!r} takes a {type(action).__name__}"
        )
    return effect(config, state, action)


def checked_step(variant: Variant, config: Config, state: State, action: Action) -> State:
    """`step`, after checking that `action` is enabled (used when replaying traces)."""
    if not is_enabled(variant, config, state, action):
        raise ActionNotEnabled(f"{action_name(action)} {action!r} is not enabled in this state")
    return step(variant, config, state, action)


__all__ = [
    "FAULT_GROUPS",
    "PROTOCOL_GROUPS",
    "REFERENCE",
    "RULE_EFFECTS",
    "RULE_GUARDS",
    "ActionNotEnabled",
    "checked_step",
    "enabled",
    "init",
    "is_enabled",
    "rule_effect",
    "rule_guard",
    "step",
]
