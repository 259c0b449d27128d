"""What each step does: `init`, `enabled` and `step`.

Read this file as the protocol's rulebook. Each rule has a guard (when the step may happen, reading
only what the acting component knows) and an effect (what changes). The rules, in the order a
successful handoff takes them:

1. `router_submit_request`  The router refuses prompts over the context window; otherwise it hands
   the request to prefill and decode at once.
2. `prefill_admit_request` / `prefill_reject_request`  Prefill admits what fits its limit. What it
   does with a prompt that does not fit is a design option (reject / placeholder / truncate).
3. `decode_admit_request` / `decode_reject_request`  Decode checks its own limit.
4. `decode_reserve_pages`  Decode takes free pages under a fresh generation and sends the grant.
5. `prefill_receive_grant`, `prefill_write_page`, `decode_receive_write`  Prefill writes each
   granted page; decode accepts a write only into a page it owns for that room and generation
   (receiver-checked path) or the write lands wherever it points (one-sided path).
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

Messages are matched the way real workers match them: by room and generation (generation 0 for
messages sent before any grant, which are matched by the request id every message carries).

With several prefill ranks (`Config.prefill_ranks`; see `state.py`, "Prefill ranks"), steps 5-7
happen per rank: `prefill_write_page` queues one write per rank (each rank's shard of the page),
each rank sends its own completion once its own writes returned, and decode accepts the transfer
only when every rank's completion arrived and validated. A completion speaks only for its own
rank's shards: one rank's Success says nothing about the others', which is why decode waits for
all of them. After an abort each rank acknowledges the drain of its own writes.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from functools import cache
from typing import Any, TypeVar

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
    PrefillWritePage,
    RetransmitMessage,
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
    forget_prefill_transfers,
    issue_writes,
    lose,
    message_effect,
    resend,
    send,
    write_effect,
)
from kvhandoff.spec.logic import (
    FAILURE_REASONS,
    FALSE,
    PAGE,
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
    message_guard,
    rank_guard,
    write_guard,
)
from kvhandoff.spec.state import (
    OTHER_TENANT,
    PREFILL_LIVE,
    PREFILL_TERMINAL,
    Answer,
    Message,
    PageState,
    PrefillPhase,
    ReqState,
    State,
    Tag,
    Write,
    evolve,
    initial_state,
)
from kvhandoff.spec.variants import REFERENCE, Design, Variant
from kvhandoff.spec.vocabulary import (
    accepted_full,
    accepted_set,
    answered,
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
    max_prefill_aborts,
    max_timeouts,
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
    p_epoch,
    p_gen,
    p_granted,
    p_granted_count,
    p_lease_expired,
    p_len,
    p_rank_done,
    p_written,
    p_wrote,
    page_reuse,
    page_used,
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
)

T = TypeVar("T")


class ActionNotEnabled(ValueError):
    """`step` was asked to take an action whose guard is false in this state."""


def init(config: Config) -> State:
    return initial_state(config)


# --- Small helpers ------------------------------------------------------------------------------


def _set_req(state: State, r: int, req: ReqState) -> State:
    reqs = state.requests
    return evolve(state, requests=(*reqs[:r], req, *reqs[r + 1 :]))


def _send(network: tuple[Message, ...], message: Message) -> tuple[Message, ...]:
    """Add a message to the sorted multiset."""
    items = list(network)
    bisect.insort(items, message)
    return tuple(items)


def _remove_one(items: tuple[T, ...], item: T) -> tuple[T, ...]:
    index = items.index(item)
    return items[:index] + items[index + 1 :]


def _add_write(writes: tuple[Write, ...], write: Write) -> tuple[Write, ...]:
    items = list(writes)
    bisect.insort(items, write)
    return tuple(items)


def _writes_in_flight(state: State, room: int, generation: int, rank: int | None = None) -> bool:
    """Is a write of (room, generation) in flight (of prefill rank `rank`, or of any rank)?"""
    return any(
        w.room == room and w.generation == generation and (rank is None or w.rank == rank)
        for w in state.writes
    )


def _stop_prefill(req: ReqState, phase: PrefillPhase) -> ReqState:
    """Prefill stops working on a request (`aborted` or `lost`): its ranks send nothing more."""
    return evolve(req, p=phase, p_ranks_done=())


def _add_rank(ranks: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """A rank set with one more rank (kept sorted, so equal sets compare equal)."""
    return tuple(sorted((*ranks, rank)))


def _tag(config: Config, r: int, generation: int) -> Tag:
    return Tag(r, generation, config.requests[r].tenant)


def _prefill_target_pages(design: Design, req: ReqState) -> int:
    """How many pages prefill will write for its grant.

    It can only write pages it has data for (`p_len`, its own view of the prompt), and never more
    than were granted. Under the `local` completion rule this same number is what makes it claim
    the transfer complete.
    """
    return min(req.p_len, len(req.p_pages))


def _answer_error(req: ReqState, reason: str) -> ReqState:
    if req.answer is not None:
        return req
    return evolve(req, answer=Answer(ok=False, reason=reason))


def _decode_fail(
    design: Design, config: Config, state: State, r: int, reason: str, abort: bool
) -> State:
    """Decode gives up on request r: the client gets an error, prefill is told to stop.

    When prefill may still be writing (the request holds a grant), decode sends an abort for the
    generation; on the one-sided path with a drain fence, release then waits for prefill's ack.
    """
    req = state.requests[r]
    network = state.network
    awaiting = False
    if abort:
        room = config.requests[r].room
        generation = req.d_gen if req.d == "reserved" else 0
        network = _send(network, Message("abort", room, generation, r))
        awaiting = req.d == "reserved" and design.release_fence in ("drain_ack", "ack_or_timeout")
    req = evolve(_answer_error(req, reason), d="failed", d_awaiting_ack=awaiting, d_ranks=())
    return evolve(_set_req(state, r, req), network=network)


def _decode_fail_effect(design: Design, r: Var, reason: str, when: Term, abort: Term) -> Updates:
    """`_decode_fail` as updates, where `when` holds (`abort`: where it also sends the abort)."""
    reserved = d(r) == "reserved"
    fenced = design.release_fence in ("drain_ack", "ack_or_timeout")
    return [
        send("abort", r, gen=If(reserved, d_gen(r), 0), when=And(when, abort)),
        answer_error(r, reason, when=when),
        assign(d(r), "failed", when=when),
        assign(d_awaiting_ack(r), And(abort, reserved) if fenced else FALSE, when=when),
        each(RANK, lambda k: assign(d_rank(r, k), False, when=when)),
    ]


def _stop_prefill_effect(r: Var, when: Term) -> Updates:
    """`_stop_prefill(req, "aborted")` as updates, where `when` holds."""
    return [
        assign(p(r), "aborted", when=when),
        each(RANK, lambda k: assign(p_rank_done(r, k), False, when=when)),
    ]


def _decode_target(design: Design, config: Config, state: State, message: Message) -> int | None:
    """The request at decode that a completion matches, or None (stale: dropped)."""
    for r, req in enumerate(state.requests):
        if req.d != "reserved" or config.requests[r].room != message.room:
            continue
        if design.check_generation and req.d_gen != message.generation:
            continue
        return r
    return None


def _digest_of_shards(
    state: State, pages: tuple[int, ...], rank: int
) -> tuple[tuple[int, int, int], ...]:
    """Decode's recomputation of a digest over the data now in rank `rank`'s shard of `pages`.

    A real digest hashes the bytes; two shards hash alike exactly when they hold the same
    request's data for the same generation, which is what the tag records.
    """
    out = []
    for q in pages:
        content = state.pages[q].shards[rank]
        out.append((q, -1, -1) if content is None else (q, content.request, content.generation))
    return tuple(out)


# --- enabled ------------------------------------------------------------------------------------
#
# One guard per rule: each function below lists the actions of its kind that are enabled in a
# state (admission's admit-or-reject is one decision, so one guard lists both). `enabled` is their
# concatenation in the rulebook's order; `is_enabled` asks only the guard of the action's kind.
#
# Beside the Python guard of each protocol step stands the same guard as a formula over the
# vocabulary (`spec/vocabulary.py`), `_..._guard(design)`: that formula is the rule's statement,
# the one every engine reads. The Z3 encodings translate it (`rule_guard`, at the end of this
# section); `enabled` runs it compiled to Python (`spec/compiled.py`: one function per variant and
# configuration). The Python guards are the explorer's former path, kept as `python_enabled` until
# tests/spec/test_compiled_rules.py (same actions, same order, on every reachable state of every
# catalogue variant) has run on main. Design options are Python `if`s evaluated when the formula
# is built: a design's guard is a different formula, not a run-time branch.


def _messages(state: State) -> list[Message]:
    """The distinct messages in the network, in a stable order."""
    return sorted(set(state.network))


def _active(state: State) -> int:
    """Requests the router has submitted and not yet answered."""
    return sum(1 for q in state.requests if q.submitted and q.answer is None)


def _router_submits(d: Design, c: Config, s: State) -> list[Action]:
    out: list[Action] = []
    reqs = s.requests
    if _active(s) >= c.max_active:
        return out
    for r, req in enumerate(reqs):
        if not req.submitted and (not c.submit_in_order or r == 0 or reqs[r - 1].submitted):
            out.append(RouterSubmitRequest(r))
    return out


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


def _prefill_admits_or_rejects(d: Design, c: Config, s: State) -> list[Action]:
    # Prefill admits what fits its limit; the design decides what it does with the rest.
    out: list[Action] = []
    for r, req in enumerate(s.requests):
        if req.p == "received":
            if c.requests[r].pages <= c.prefill_max_prompt:
                out.append(PrefillAdmitRequest(r))
            else:
                out.append(PrefillRejectRequest(r))
    return out


# Admission is one decision with two outcomes: which one a prompt gets is fixed by its length
# against the worker's own limit (a rigid fact of the scenario). What prefill's rejection *does*
# (reject, placeholder, truncate) is a design option of the effect, not of the guard.


def _prefill_admit_guard(design: Design) -> GuardFormula:
    return guard(lambda r: And(p(r) == "received", Not(over_prefill_limit(r))))


def _prefill_reject_guard(design: Design) -> GuardFormula:
    return guard(lambda r: And(p(r) == "received", over_prefill_limit(r)))


def _decode_admits_or_rejects(d: Design, c: Config, s: State) -> list[Action]:
    out: list[Action] = []
    for r, req in enumerate(s.requests):
        if req.d == "received":
            if c.requests[r].pages <= c.decode_max_prompt:
                out.append(DecodeAdmitRequest(r))
            else:
                out.append(DecodeRejectRequest(r))
    return out


def _decode_admit_guard(design: Design) -> GuardFormula:
    return guard(lambda r: And(d(r) == "received", Not(over_decode_limit(r))))


def _decode_reject_guard(design: Design) -> GuardFormula:
    return guard(lambda r: And(d(r) == "received", over_decode_limit(r)))


def _decode_reserves(d: Design, c: Config, s: State) -> list[Action]:
    out: list[Action] = []
    free = -1  # counted when first needed
    for r, req in enumerate(s.requests):
        if req.d == "admitted":
            if free < 0:
                free = sum(1 for p in s.pages if p.owner is None)
            if free >= c.requests[r].pages:
                out.append(DecodeReservePages(r))
    return out


def _decode_reserve_guard(design: Design) -> GuardFormula:
    # Decode grants every page the prompt needs at once, under one fresh generation, or waits
    # (stays `admitted`) until enough are free: a partial grant would leave prefill nowhere to
    # put the rest of the prompt. Free means granted to no request.
    free = count(PAGE, lambda q: Not(owned(q)))
    return guard(lambda r: And(d(r) == "admitted", free >= prompt_pages(r)))


def _prefill_receives_grants(d: Design, c: Config, s: State) -> list[Action]:
    if not s.network:
        return []
    return [PrefillReceiveGrant(m) for m in sorted({m for m in s.network if m.kind == "grant"})]


# A step that takes a message is enabled for each distinct message of its kind in the network
# (`message_guard`): receiving asks nothing more of the receiver; what the message does depends
# on the receiver's state, in the effect.


def _prefill_receive_grant_guard(design: Design) -> GuardFormula:
    return message_guard("network", ("grant",), lambda m: TRUE)


def _prefill_writes(d: Design, c: Config, s: State) -> list[Action]:
    out: list[Action] = []
    for r, req in enumerate(s.requests):
        if req.p == "granted" and req.p_wrote < _prefill_target_pages(d, req):
            out.append(PrefillWritePage(r))
    return out


def _prefill_write_guard(design: Design) -> GuardFormula:
    # Prefill writes its granted pages one at a time, in grant order, while it has data for the
    # next one (its own view of the prompt, `p_len`, which a placeholder or a truncation
    # shortens) and a granted page to put it in: `p_wrote < min(p_len, granted)`, the
    # `_prefill_target_pages` of the Python guard. Where the two views differ, the pages past
    # the shorter one are never written: what the completion then claims is the design's.
    return guard(
        lambda r: And(p(r) == "granted", p_wrote(r) < p_len(r), p_wrote(r) < p_granted_count(r))
    )


def _decode_receives_writes(d: Design, c: Config, s: State) -> list[Action]:
    return [DecodeReceiveWrite(w) for w in sorted(set(s.writes))] if s.writes else []


def _decode_receive_write_guard(design: Design) -> GuardFormula:
    # A write arrives whenever it is on the wire: whether it lands is the design's, in the effect.
    return write_guard(lambda w: TRUE)


def _prefill_sends_completions(d: Design, c: Config, s: State) -> list[Action]:
    out: list[Action] = []
    for r, req in enumerate(s.requests):
        if req.p == "granted" and req.p_wrote == _prefill_target_pages(d, req):
            # Each rank reports once its own writes have returned.
            for rank in range(c.prefill_ranks):
                if rank not in req.p_ranks_done and not _writes_in_flight(
                    s, c.requests[r].room, req.p_gen, rank
                ):
                    out.append(PrefillSendCompletion(r, rank))
    return out


def _prefill_send_completion_guard(design: Design) -> GuardFormula:
    # Each rank reports once prefill wrote every page it will write (`_prefill_target_pages`:
    # the shorter of its view of the prompt and its grant) and that rank's own writes returned.
    def ready(r: Var, k: Var) -> Term:
        target = If(p_len(r) < p_granted_count(r), p_len(r), p_granted_count(r))
        mine = each_write(lambda w: Not(And(w.room == room(r), w.gen == p_gen(r), w.rank == k)))
        return And(p(r) == "granted", p_wrote(r) == target, Not(p_rank_done(r, k)), mine)

    return rank_guard(ready)


def _decode_receives_completions(d: Design, c: Config, s: State) -> list[Action]:
    if not s.network:
        return []
    return [
        DecodeReceiveCompletion(m) for m in sorted({m for m in s.network if m.kind == "completion"})
    ]


def _decode_receive_completion_guard(design: Design) -> GuardFormula:
    return message_guard("network", ("completion",), lambda m: TRUE)


def _decode_receives_failures(d: Design, c: Config, s: State) -> list[Action]:
    if not s.network:
        return []
    return [DecodeReceiveFailure(m) for m in sorted({m for m in s.network if m.kind == "failure"})]


def _decode_receive_failure_guard(design: Design) -> GuardFormula:
    return message_guard("network", ("failure",), lambda m: TRUE)


def _decode_receives_cancels(d: Design, c: Config, s: State) -> list[Action]:
    return [DecodeReceiveCancel(r) for r, req in enumerate(s.requests) if req.d_cancel]


def _prefill_receives_cancels(d: Design, c: Config, s: State) -> list[Action]:
    return [PrefillReceiveCancel(r) for r, req in enumerate(s.requests) if req.p_cancel]


# A cancel reaches each worker by a call of its own, whenever the router's word is on its way
# (the router answered the client at once). The guard asks nothing else: a worker that has
# already finished with the request receives the cancel too, and its effect does nothing.


def _decode_receive_cancel_guard(design: Design) -> GuardFormula:
    return guard(lambda r: d_cancel(r))


def _prefill_receive_cancel_guard(design: Design) -> GuardFormula:
    return guard(lambda r: p_cancel(r))


def _decode_generates(d: Design, c: Config, s: State) -> list[Action]:
    out: list[Action] = []
    for r, req in enumerate(s.requests):
        if req.d == "validated":
            out.append(DecodeGenerate(r))
    return out


def _decode_generate_guard(design: Design) -> GuardFormula:
    # Decode reads the pages only once it has validated the completion: the guard that
    # `decode_reads_only_validated_pages` checks is never bypassed. (What validation checks is
    # the design's, in `decode_receive_completion`.)
    return guard(lambda r: d(r) == "validated")


def _decode_answers(d: Design, c: Config, s: State) -> list[Action]:
    out: list[Action] = []
    for r, req in enumerate(s.requests):
        if req.d == "generated":
            out.append(DecodeAnswer(r))
    return out


def _decode_answer_guard(design: Design) -> GuardFormula:
    return guard(lambda r: d(r) == "generated")


def _decode_releases(d: Design, c: Config, s: State) -> list[Action]:
    out: list[Action] = []
    for r, req in enumerate(s.requests):
        if req.d in ("answered", "failed") and req.d_pages and not req.d_awaiting_ack:
            out.append(DecodeReleasePages(r))
    return out


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


def _prefill_receives_aborts(d: Design, c: Config, s: State) -> list[Action]:
    if not s.network:
        return []
    return [PrefillReceiveAbort(m) for m in sorted({m for m in s.network if m.kind == "abort"})]


def _prefill_receive_abort_guard(design: Design) -> GuardFormula:
    return message_guard("network", ("abort",), lambda m: TRUE)


def _prefill_sends_abort_acks(d: Design, c: Config, s: State) -> list[Action]:
    # Each rank acknowledges once its own writes of the aborted generation have drained.
    return [
        PrefillSendAbortAck(room, generation, rank)
        for room, generation, _r in s.pending_acks
        for rank in range(c.prefill_ranks)
        if (room, generation, rank) not in s.acked_ranks
        and not _writes_in_flight(s, room, generation, rank)
    ]


def _prefill_send_abort_ack_guard(design: Design) -> GuardFormula:
    # The argument is the owed ack, named by the request that owes it (`r`) and the rank (`k`):
    # rank k acknowledges once none of its writes under the aborted grant is still on the wire.
    def drained(r: Var, k: Var) -> Term:
        gen = pending_ack_gen(r)
        mine = each_write(lambda w: Not(And(w.room == room(r), w.gen == gen, w.rank == k)))
        return And(pending_ack(r), Not(p_acked(r, k)), mine)

    return rank_guard(drained)


def _decode_receives_abort_acks(d: Design, c: Config, s: State) -> list[Action]:
    if not s.network:
        return []
    return [
        DecodeReceiveAbortAck(m) for m in sorted({m for m in s.network if m.kind == "abort_ack"})
    ]


def _decode_receive_abort_ack_guard(design: Design) -> GuardFormula:
    return message_guard("network", ("abort_ack",), lambda m: TRUE)


def _decode_release_timeouts(d: Design, c: Config, s: State) -> list[Action]:
    out: list[Action] = []
    if d.release_fence == "ack_or_timeout":
        for r, req in enumerate(s.requests):
            if req.d_awaiting_ack:
                out.append(DecodeReleaseTimeout(r))
    return out


def _decode_release_timeout_guard(design: Design) -> GuardFormula:
    # Only a design that lets a timeout stand in for the drain ack has this step (M8: a timeout
    # cannot prove a one-sided write stopped). Elsewhere it is never enabled.
    if design.release_fence != "ack_or_timeout":
        return guard(lambda r: FALSE)
    return guard(lambda r: d_awaiting_ack(r))


def _decode_detects_prefill_restart(d: Design, c: Config, s: State) -> list[Action]:
    return [DecodeDetectPrefillRestart()] if s.decode_sees_prefill_epoch != s.prefill_epoch else []


def _prefill_detects_decode_restart(d: Design, c: Config, s: State) -> list[Action]:
    return [PrefillDetectDecodeRestart()] if s.prefill_sees_decode_epoch != s.decode_epoch else []


# A worker learns of its peer's restart from the health check: the epoch it reports differs from
# the one last seen. (The restart itself is a fault; noticing it is a protocol step.)


def _decode_detect_prefill_restart_guard(design: Design) -> GuardFormula:
    return guard(lambda: decode_seen_prefill_epoch() != prefill_epoch())


def _prefill_detect_decode_restart_guard(design: Design) -> GuardFormula:
    return guard(lambda: prefill_seen_decode_epoch() != decode_epoch())


def _retransmits(d: Design, c: Config, s: State) -> list[Action]:
    return [RetransmitMessage(m) for m in sorted(set(s.lost))] if s.lost else []


# Faults: each within its own budget (and, checked by `enabled`, the total one).


def _retransmit_guard(design: Design) -> GuardFormula:
    # The sender knows the RPC failed (see `network_drop_message`) and sends it again.
    return message_guard("lost", (), lambda m: TRUE)


def _client_cancels(d: Design, c: Config, s: State) -> list[Action]:
    if s.faults.cancels >= c.max_cancels:
        return []
    return [
        ClientCancelRequest(r)
        for r, req in enumerate(s.requests)
        if req.submitted and req.answer is None
    ]


def _decode_waiting_timeouts(d: Design, c: Config, s: State) -> list[Action]:
    if s.faults.timeouts >= c.max_timeouts:
        return []
    return [DecodeWaitingTimeout(r) for r, req in enumerate(s.requests) if req.d == "reserved"]


def _prefill_aborts(d: Design, c: Config, s: State) -> list[Action]:
    if s.faults.prefill_aborts >= c.max_prefill_aborts:
        return []
    return [
        PrefillAbortRequest(r)
        for r, req in enumerate(s.requests)
        if req.p in PREFILL_LIVE and not _writes_in_flight(s, c.requests[r].room, req.p_gen)
    ]


def _prefill_restarts(d: Design, c: Config, s: State) -> list[Action]:
    return [PrefillRestart()] if s.faults.crashes < c.max_crashes else []


def _prefill_restart_guard(design: Design) -> GuardFormula:
    return guard(lambda: _within_budget(crashes_spent(), max_crashes()))


def _decode_restarts(d: Design, c: Config, s: State) -> list[Action]:
    return [DecodeRestart()] if s.faults.crashes < c.max_crashes else []


def _lease_expiries(d: Design, c: Config, s: State) -> list[Action]:
    if d.transfer != "pull" or s.faults.timeouts >= c.max_timeouts:
        return []
    return [
        PrefillLeaseExpire(r)
        for r, req in enumerate(s.requests)
        if not req.p_lease_expired and _writes_in_flight(s, c.requests[r].room, req.p_gen)
    ]


# The faults' guards as formulas (those of one request or of none; the network's faults, which
# take a message or a write, and the prefill restart, which forgets prefill's transfer state, keep
# only their Python guard for now). Each fault is within its own budget and the run's total one.


def _within_budget(spent: Term, limit: Term) -> Term:
    return And(faults_spent() < max_faults(), spent < limit)


def _writes_in_flight_for(r: Var) -> Term:
    """Some write of r's room and prefill's generation is in flight (whoever issued it)."""
    return Not(each_write(lambda w: Not(And(w.room == room(r), w.gen == p_gen(r)))))


def _client_cancel_guard(design: Design) -> GuardFormula:
    # A client may cancel any request the router has taken and not yet answered.
    return guard(
        lambda r: And(
            _within_budget(cancels_spent(), max_cancels()), submitted(r), Not(answered(r))
        )
    )


def _decode_waiting_timeout_guard(design: Design) -> GuardFormula:
    return guard(
        lambda r: And(_within_budget(timeouts_spent(), max_timeouts()), d(r) == "reserved")
    )


def _prefill_abort_guard(design: Design) -> GuardFormula:
    # Prefill gives up on its own (out of memory, a failed forward pass) between writes.
    return guard(
        lambda r: And(
            _within_budget(prefill_aborts_spent(), max_prefill_aborts()),
            p(r).is_in("admitted", "granted"),
            Not(_writes_in_flight_for(r)),
        )
    )


def _decode_restart_guard(design: Design) -> GuardFormula:
    return guard(lambda: _within_budget(crashes_spent(), max_crashes()))


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


def _transfer_failures(d: Design, c: Config, s: State) -> list[Action]:
    if d.transfer != "pull" or s.faults.drops >= c.max_drops:
        return []
    return [NetworkFailTransfer(w) for w in sorted(set(s.writes))]


def _fail_transfer_guard(design: Design) -> GuardFormula:
    # Pull path only: decode's read of a page fails (a loss, within the drops budget).
    if design.transfer != "pull":
        return write_guard(lambda w: FALSE)
    return write_guard(lambda w: _within_budget(drops_spent(), max_drops()))


def _drops(d: Design, c: Config, s: State) -> list[Action]:
    if s.faults.drops >= c.max_drops:
        return []
    return [NetworkDropMessage(m) for m in _messages(s)]


def _drop_guard(design: Design) -> GuardFormula:
    return message_guard("network", (), lambda m: _within_budget(drops_spent(), max_drops()))


def _duplicates(d: Design, c: Config, s: State) -> list[Action]:
    if s.faults.duplicates >= c.max_duplicates:
        return []
    return [NetworkDuplicateMessage(m) for m in _messages(s)]


def _duplicate_guard(design: Design) -> GuardFormula:
    return message_guard(
        "network", (), lambda m: _within_budget(duplicates_spent(), max_duplicates())
    )


Guard = Callable[[Design, Config, State], list[Action]]

# The guards in the rulebook's order, and which guard decides each kind of action.
PROTOCOL_GUARDS: dict[Guard, tuple[type, ...]] = {
    _router_submits: (RouterSubmitRequest,),
    _prefill_admits_or_rejects: (PrefillAdmitRequest, PrefillRejectRequest),
    _decode_admits_or_rejects: (DecodeAdmitRequest, DecodeRejectRequest),
    _decode_reserves: (DecodeReservePages,),
    _prefill_receives_grants: (PrefillReceiveGrant,),
    _prefill_writes: (PrefillWritePage,),
    _decode_receives_writes: (DecodeReceiveWrite,),
    _prefill_sends_completions: (PrefillSendCompletion,),
    _decode_receives_completions: (DecodeReceiveCompletion,),
    _decode_receives_failures: (DecodeReceiveFailure,),
    _decode_receives_cancels: (DecodeReceiveCancel,),
    _prefill_receives_cancels: (PrefillReceiveCancel,),
    _decode_generates: (DecodeGenerate,),
    _decode_answers: (DecodeAnswer,),
    _decode_releases: (DecodeReleasePages,),
    _prefill_receives_aborts: (PrefillReceiveAbort,),
    _prefill_sends_abort_acks: (PrefillSendAbortAck,),
    _decode_receives_abort_acks: (DecodeReceiveAbortAck,),
    _decode_release_timeouts: (DecodeReleaseTimeout,),
    _decode_detects_prefill_restart: (DecodeDetectPrefillRestart,),
    _prefill_detects_decode_restart: (PrefillDetectDecodeRestart,),
    _retransmits: (RetransmitMessage,),
}
FAULT_GUARDS: dict[Guard, tuple[type, ...]] = {
    _client_cancels: (ClientCancelRequest,),
    _decode_waiting_timeouts: (DecodeWaitingTimeout,),
    _prefill_aborts: (PrefillAbortRequest,),
    _prefill_restarts: (PrefillRestart,),
    _decode_restarts: (DecodeRestart,),
    _lease_expiries: (PrefillLeaseExpire,),
    _transfer_failures: (NetworkFailTransfer,),
    _drops: (NetworkDropMessage,),
    _duplicates: (NetworkDuplicateMessage,),
}
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
    "decode_restart": _decode_restart_guard,
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
}
"""The guards written as formulas: every step of the protocol and every fault. The Z3 encodings
translate these (`Encoding.rule`); `enabled` runs them compiled (`spec/compiled.py`)."""


@cache
def rule_guard(design: Design, name: str) -> GuardFormula:
    """The guard of protocol step `name` (snake_case) under `design`, as a formula: what the Z3
    encodings translate (`Encoding.rule`) and `enabled` runs compiled. Built once per design."""
    return RULE_GUARDS[name](design)


_GUARD_OF: dict[type, Guard] = {
    kind: guard
    for guards in (PROTOCOL_GUARDS, FAULT_GUARDS)
    for guard, kinds in guards.items()
    for kind in kinds
}


def enabled(variant: Variant, config: Config, state: State) -> list[Action]:
    """Every action whose guard holds, protocol steps first, faults last, in a stable order: the
    guard formulas compiled to one Python function per variant (`spec/compiled.py`)."""
    return rules(variant).enabled_for(config)(config, state)


def python_enabled(variant: Variant, config: Config, state: State) -> list[Action]:
    """`enabled` by the Python guards (kept until the differential test against the compiled
    formulas has run on main: tests/spec/test_compiled_rules.py)."""
    d = variant.design
    out: list[Action] = []
    replaced = variant.guard_overrides
    for lists, kinds in PROTOCOL_GUARDS.items():
        if replaced:
            out += _guard_with_overrides(variant, config, state, lists, kinds)
        else:
            out += lists(d, config, state)
    if variant.extra_actions is not None:
        out += variant.extra_actions(config, state)
    for added in variant.added_guards:
        out += added(config, state)
    if state.faults.total < config.max_faults:
        for lists, kinds in FAULT_GUARDS.items():
            if replaced:
                out += _guard_with_overrides(variant, config, state, lists, kinds)
            else:
                out += lists(d, config, state)
    return out


_Plan = tuple[tuple[type, ...], list[tuple[type, str, Any]]]
_PLANS: dict[tuple[int, Guard], tuple[Variant, _Plan | None]] = {}
"""Per variant and rulebook guard: which of its kinds keep the rulebook's guard and which the
variant replaced (worked out once, not per state: the explorer asks for every state)."""


def _override_plan(variant: Variant, guard: Guard, kinds: tuple[type, ...]) -> _Plan | None:
    key = (id(variant), guard)
    got = _PLANS.get(key)
    if got is None or got[0] is not variant:  # the variant is kept, so its id is not reused
        names = [snake_case(k.__name__) for k in kinds]
        hooks = [variant.guard_overrides.get(n) for n in names]
        plan: _Plan | None = None
        if any(hooks):
            kept = tuple(k for k, h in zip(kinds, hooks, strict=True) if h is None)
            replaced = [(k, n, h) for k, n, h in zip(kinds, names, hooks, strict=True) if h]
            plan = (kept, replaced)
        got = _PLANS[key] = (variant, plan)
    return got[1]


def _guard_with_overrides(
    variant: Variant, config: Config, state: State, guard: Guard, kinds: tuple[type, ...]
) -> list[Action]:
    """A guard's actions, with the kinds a variant replaced listed by the variant's own guard
    (at the same place in the rulebook's order, so shrinking and BFS order are unchanged)."""
    plan = _override_plan(variant, guard, kinds)
    if plan is None:
        return guard(variant.design, config, state)
    kept, replaced = plan
    out = [a for a in guard(variant.design, config, state) if isinstance(a, kept)] if kept else []
    for kind, name, hook in replaced:
        listed: list[Action] = list(hook(config, state))
        for action in listed:
            if type(action) is not kind:
                raise TypeError(
                    f"variant {variant.name!r}: guard_overrides[{name!r}] listed "
                    f"{action!r}, which is not a {kind.__name__}"
                )
        out += listed
    return out


def is_enabled(variant: Variant, config: Config, state: State, action: Action) -> bool:
    """`action in enabled(variant, config, state)`, asking only the guard of the action's kind."""
    if variant.extra_actions is not None and action in variant.extra_actions(config, state):
        return True
    for added in variant.added_guards:
        if type(action) is added.kind:
            return action in added(config, state)
    guard = _GUARD_OF.get(type(action))
    if guard is None:
        return False
    if guard in FAULT_GUARDS and state.faults.total >= config.max_faults:
        return False
    hook = variant.guard_overrides.get(action_name(action)) if variant.guard_overrides else None
    if hook is not None:
        return action in list(hook(config, state))
    return action in guard(variant.design, config, state)


# --- step ---------------------------------------------------------------------------------------
#
# One effect per rule. Beside the Python effect of each protocol step stands the same effect as
# updates over the vocabulary (`spec/effects.py`), `_..._effect(design)`: `assign(d(r),
# "reserved")`, `send("grant", r, ...)`, `answer_error(r, reason)`, each value read in the state
# before the step. That formula is the rule: the Z3 encodings translate it (`rule_effect`,
# `RULE_EFFECTS`) and `step` runs it compiled to Python (`spec/compiled.py`). The Python effects
# are the explorer's former path, kept as `python_step` until tests/spec/test_compiled_rules.py
# (same next state from every reachable state of every catalogue variant) has run on main.


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


def python_step(variant: Variant, config: Config, state: State, action: Action) -> State:
    """`step` by the Python effects (kept until the differential test against the compiled
    formulas has run on main: tests/spec/test_compiled_rules.py)."""
    override = variant.step_overrides.get(action_name(action)) if variant.step_overrides else None
    if override is not None:
        return override(config, state, action)
    rule: Any = _STEP[type(action)]
    result: State = rule(variant.design, config, state, action)
    return result


def checked_step(variant: Variant, config: Config, state: State, action: Action) -> State:
    """`step`, after checking that `action` is enabled (used when replaying traces)."""
    if not is_enabled(variant, config, state, action):
        raise ActionNotEnabled(f"{action_name(action)} {action!r} is not enabled in this state")
    return step(variant, config, state, action)


def _router_submit(d: Design, c: Config, s: State, a: RouterSubmitRequest) -> State:
    r = a.request
    req = evolve(s.requests[r], submitted=True)
    if c.requests[r].pages > c.context_window:
        # The advertised window is the router's only limit; prompts over it never reach a worker.
        req = evolve(req, answer=Answer(False, reason="prompt over the context window"))
        req = evolve(req, not_as_is=True)
    else:
        # The router learned both workers' boot epochs from their health checks; the request
        # carries them, so a worker can later tell which requests a peer's restart affected.
        req = evolve(
            req, p="received", d="received", p_epoch=s.decode_epoch, d_epoch=s.prefill_epoch
        )
    return _set_req(s, r, req)


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
            assign(p_epoch(r), decode_epoch(), when=fits),
            assign(d_epoch(r), prefill_epoch(), when=fits),
        ]

    return effect(body)


def _prefill_admit(d: Design, c: Config, s: State, a: PrefillAdmitRequest) -> State:
    r = a.request
    req = s.requests[r]
    phase: PrefillPhase = "granted" if req.p_gen else "admitted"
    return _set_req(s, r, evolve(req, p=phase, p_len=c.requests[r].pages))


def _prefill_admit_effect(design: Design) -> EffectFormula:
    # A grant that overtook the hand-over is already held: prefill goes straight to writing.
    return effect(
        lambda r: [
            assign(p(r), "admitted"),
            assign(p(r), "granted", when=p_gen(r) != 0),
            assign(p_len(r), prompt_pages(r)),
        ]
    )


def _prefill_reject(d: Design, c: Config, s: State, a: PrefillRejectRequest) -> State:
    r = a.request
    req = evolve(s.requests[r], not_as_is=True)
    if d.oversize == "reject":
        # Fail closed: write nothing, tell decode (so it frees its reservation) and the client.
        req = evolve(req, p="rejected")
        if d.router_honours_prefill_error:
            req = _answer_error(req, "rejected by prefill: prompt over its limit")
        network = _send(s.network, Message("failure", c.requests[r].room, 0, r, reason="rejected"))
        return evolve(_set_req(s, r, req), network=network)
    if d.oversize == "placeholder":
        # The request keeps its room and bootstraps normally, now one page long.
        req = evolve(req, p="granted" if req.p_gen else "admitted", p_len=1)
        if d.placeholder_reports_error and d.router_honours_prefill_error:
            req = _answer_error(req, "aborted by prefill: prompt over its limit")
        return _set_req(s, r, req)
    # Truncate: prefill keeps only as much of the prompt as fits.
    phase: PrefillPhase = "granted" if req.p_gen else "admitted"
    return _set_req(s, r, evolve(req, p=phase, p_len=max(1, c.prefill_max_prompt)))


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


def _decode_admit(d: Design, c: Config, s: State, a: DecodeAdmitRequest) -> State:
    return _set_req(s, a.request, evolve(s.requests[a.request], d="admitted"))


def _decode_admit_effect(design: Design) -> EffectFormula:
    return effect(lambda r: [assign(d(r), "admitted")])


def _decode_reject(d: Design, c: Config, s: State, a: DecodeRejectRequest) -> State:
    r = a.request
    req = _answer_error(s.requests[r], "rejected by decode: prompt over its limit")
    req = evolve(req, d="rejected", not_as_is=True)
    # Prefill may have admitted it and be waiting for a grant that will never come.
    network = _send(s.network, Message("abort", c.requests[r].room, 0, r))
    return evolve(_set_req(s, r, req), network=network)


def _decode_reject_effect(design: Design) -> EffectFormula:
    return effect(
        lambda r: [
            answer_error(r, "rejected by decode: prompt over its limit"),
            assign(d(r), "rejected"),
            assign(not_as_is(r), True),
            send("abort", r, gen=0),
        ]
    )


def _decode_reserve(d: Design, c: Config, s: State, a: DecodeReservePages) -> State:
    r = a.request
    tenant = c.requests[r].tenant
    generation = s.next_generation
    chosen = tuple(i for i, p in enumerate(s.pages) if p.owner is None)[: c.requests[r].pages]
    pages = list(s.pages)
    ghost = s.ghost
    for i in chosen:
        old = pages[i]
        if old.last_tenant is not None:
            ghost = evolve(ghost, page_reuse=True)
            if old.last_tenant != tenant:
                ghost = evolve(ghost, cross_tenant_reuse=True)
        pages[i] = evolve(old, owner=(r, generation), last_tenant=tenant)
    req = evolve(s.requests[r], d="reserved", d_gen=generation, d_pages=chosen)
    grant = Message("grant", c.requests[r].room, generation, r, pages=chosen, epoch=s.decode_epoch)
    return evolve(
        _set_req(s, r, req),
        pages=tuple(pages),
        next_generation=generation + 1,
        network=_send(s.network, grant),
        ghost=ghost,
    )


def _decode_reserve_effect(design: Design) -> EffectFormula:
    # The first free pages, in page order, as many as the prompt needs: page q is chosen when it
    # is free and fewer than that many free pages come before it.
    def body(r: Var) -> Updates:
        def chosen(q: Var) -> Term:
            before = count(PAGE, lambda o: And(o < q, Not(owned(o))))
            return And(Not(owned(q)), before < prompt_pages(r))

        gen = next_gen()
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
            send("grant", r, gen=gen, epoch=decode_epoch(), pages=chosen),
            assign(next_gen(), gen + 1),
        ]

    return effect(body)


def _prefill_receive_grant(d: Design, c: Config, s: State, a: PrefillReceiveGrant) -> State:
    m = a.message
    s = evolve(s, network=_remove_one(s.network, m))
    req = s.requests[m.request]
    if req.p in ("received", "admitted") and req.p_gen == 0:
        # The grant can overtake the router's hand-over to prefill's scheduler: keep it, and
        # start writing as soon as the request is admitted.
        granted = req.p == "admitted"
        req = evolve(
            req,
            p="granted" if granted else req.p,
            p_gen=m.generation,
            p_pages=m.pages,
            p_epoch=m.epoch,
        )
        return _set_req(s, m.request, req)
    if d.prefill_adopts_unknown_grant and req.p not in PREFILL_LIVE:
        key = (m.room, m.generation)
        if key not in s.orphans:
            return evolve(s, orphans=tuple(sorted((*s.orphans, key))))
    return s  # stale or duplicate: dropped


def _prefill_receive_grant_effect(design: Design) -> EffectFormula:
    # A grant for a request prefill still waits on is taken; any other is stale or a duplicate,
    # and dropped, except where prefill keeps transfer state for a grant of a room it no longer
    # serves (M18): that state is never freed.
    def body(m: Bound) -> Updates:
        r = m.req
        take = And(p(r).is_in("received", "admitted"), p_gen(r) == 0)
        out: list[Any] = [
            consume(m),
            assign(p(r), "granted", when=And(take, p(r) == "admitted")),
            assign(p_gen(r), m.gen, when=take),
            assign(p_epoch(r), m.epoch, when=take),
            each(PAGE, lambda q: assign(p_granted(r, q), m.has_page(q), when=take)),
        ]
        if design.prefill_adopts_unknown_grant:
            unknown = And(Not(take), Not(p(r).is_in(*PREFILL_LIVE)))
            out.append(adopt_orphan(r, m.gen, when=unknown))
        return out

    return message_effect(body)


def _prefill_write(d: Design, c: Config, s: State, a: PrefillWritePage) -> State:
    # The ranks compute the page together; each then sends its own shard of it.
    r = a.request
    req = s.requests[r]
    page = req.p_pages[req.p_wrote]
    writes = s.writes
    for rank in range(c.prefill_ranks):
        write = Write(c.requests[r].room, req.p_gen, page, _tag(c, r, req.p_gen), req.p_epoch, rank)
        writes = _add_write(writes, write)
    s = evolve(s, writes=writes)
    return _set_req(s, r, evolve(req, p_wrote=req.p_wrote + 1))


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


def _owner_matches(c: Config, page: PageState, write: Write) -> bool:
    if page.owner is None:
        return False
    owner_request, owner_generation = page.owner
    return c.requests[owner_request].room == write.room and owner_generation == write.generation


def _decode_receive_write(d: Design, c: Config, s: State, a: DecodeReceiveWrite) -> State:
    w = a.write
    s = evolve(s, writes=_remove_one(s.writes, w))
    writer = (w.data.request, w.data.generation)
    data = w.data
    if d.transfer == "pull" and s.requests[w.data.request].p_lease_expired:
        # The read fetches what the source block holds now: it was freed and reused.
        data = Tag(-1, 0, OTHER_TENANT)
    page = s.pages[w.page]
    matches = _owner_matches(c, page, w)
    if d.write_path == "receiver_checked":
        if not matches:
            return evolve(s, ghost=evolve(s.ghost, refused_write=True))
    elif d.release_fence != "none" and w.epoch != s.decode_epoch:
        # A restarted decode registered its pool again: the remote key this write was issued
        # with is revoked, so the NIC refuses it. Fencing designs rely on this after a crash.
        return evolve(s, ghost=evolve(s.ghost, refused_write=True))
    pages = list(s.pages)
    pages[w.page] = page.with_shard(w.rank, data)
    s = evolve(s, pages=tuple(pages))
    # Ghost: did the transfer land in a page owned by someone else (or by no one)?
    if page.owner != writer:
        s = evolve(s, ghost=evolve(s.ghost, late_landing=True))
    return s


def _decode_receive_write_effect(design: Design) -> EffectFormula:
    # Where a write lands is the design's: the receiver-checked path refuses a write into a page
    # decode does not own for the write's room and generation; the one-sided path lets it land
    # (a fencing design's restarted decode has revoked the old key: writes issued against the
    # old epoch are refused by the NIC).
    def body(w: Bound) -> Updates:
        q, k = w.page, w.rank
        owns = And(owned(q), room(owner(q)) == w.room, owner_gen(q) == w.gen)
        if design.write_path == "receiver_checked":
            refused: Term = Not(owns)
        elif design.release_fence != "none":
            refused = w.epoch != decode_epoch()
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


def _prefill_send_completion(d: Design, c: Config, s: State, a: PrefillSendCompletion) -> State:
    # Rank a.rank reports its own shards: how many pages it wrote, and a digest of them.
    r = a.request
    req = s.requests[r]
    written = req.p_pages[: req.p_wrote]
    count = len(req.p_pages) if d.completion == "local" else req.p_wrote
    digest = tuple((p, r, req.p_gen) for p in written) if d.prefill_sends_digest else None
    room = c.requests[r].room
    msg = Message("completion", room, req.p_gen, r, count=count, digest=digest, rank=a.rank)
    done = _add_rank(req.p_ranks_done, a.rank)
    if len(done) == c.prefill_ranks:
        req = evolve(req, p="completed", p_ranks_done=())  # every rank has reported
    else:
        req = evolve(req, p_ranks_done=done)
    return evolve(_set_req(s, r, req), network=_send(s.network, msg))


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


def _decode_receive_completion(d: Design, c: Config, s: State, a: DecodeReceiveCompletion) -> State:
    m = a.message
    s = evolve(s, network=_remove_one(s.network, m))
    r = _decode_target(d, c, s, m)
    if r is None:
        return s
    req = s.requests[r]
    if m.rank in req.d_ranks:
        return s  # this rank already reported: a duplicate
    # The completion speaks for its own rank's shard of every page.
    count_ok = m.count == len(req.d_pages)
    if d.validation == "none":
        valid = True
    elif d.validation == "count_only":
        valid = count_ok
    else:
        digest_ok = m.digest == _digest_of_shards(s, req.d_pages, m.rank)
        if d.validation == "digest_optional" and m.digest is None:
            digest_ok = True
        valid = count_ok and digest_ok
    reported = _add_rank(req.d_ranks, m.rank)
    if not valid:
        # A rank sends its completion only after its writes returned: nothing of the ranks that
        # reported is in flight. Ranks yet to report may still be writing: abort (and fence) them.
        still_writing = len(reported) < c.prefill_ranks
        return _decode_fail(d, c, s, r, "completion failed validation", abort=still_writing)
    # One rank's Success is not the transfer's: wait for every rank (`first_rank`: don't).
    required = c.prefill_ranks if d.completion_quorum == "every_rank" else 1
    if len(reported) < required:
        return _set_req(s, r, evolve(req, d_ranks=reported))
    own = _tag(c, r, req.d_gen)
    full = all(shard == own for p in req.d_pages for shard in s.pages[p].shards)
    return _set_req(s, r, evolve(req, d="validated", accepted_full=full, d_ranks=()))


def _decode_receive_completion_effect(design: Design) -> EffectFormula:
    # The completion is for the first request decode holds reserved on its room (and, with
    # `check_generation`, its generation): decode matches as real workers do, not by request id.
    # It validates what the design says before anything is read.
    def body(m: Bound) -> Updates:
        def waiting(t: Var) -> Term:
            same = And(d(t) == "reserved", room(t) == m.room)
            return And(same, d_gen(t) == m.gen) if design.check_generation else same

        def request(t: Var) -> Updates:
            first = And(waiting(t), forall(REQ, lambda u: Implies(u < t, Not(waiting(u)))))
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


def _decode_receive_failure(d: Design, c: Config, s: State, a: DecodeReceiveFailure) -> State:
    m = a.message
    s = evolve(s, network=_remove_one(s.network, m))
    req = s.requests[m.request]
    if req.d not in ("received", "admitted", "reserved"):
        return s
    if m.generation != 0 and req.d_gen != m.generation:
        return s
    reason = f"prefill reported failure: {m.reason}"
    return _decode_fail(d, c, s, m.request, reason, abort=False)


def _decode_receive_failure_effect(design: Design) -> EffectFormula:
    # A failure notice for a request decode is still waiting on (for its grant's generation, or
    # sent before any grant) fails it; any other is stale. The language has no strings: each
    # reason a notice can give is a predicate of the message (`m.reason_is(...)`).
    def body(m: Bound) -> Updates:
        r = m.req
        applies = And(
            d(r).is_in("received", "admitted", "reserved"), Or(m.gen == 0, d_gen(r) == m.gen)
        )
        out: list[Any] = [consume(m)]
        for reason in FAILURE_REASONS:
            why = f"prefill reported failure: {reason}"
            out += [_decode_fail_effect(design, r, why, And(applies, m.reason_is(reason)), FALSE)]
        return out

    return message_effect(body)


def _decode_receive_cancel(d: Design, c: Config, s: State, a: DecodeReceiveCancel) -> State:
    r = a.request
    req = evolve(s.requests[r], d_cancel=False)
    s = _set_req(s, r, req)
    if req.d in ("received", "admitted", "reserved"):
        # Prefill may hold a grant and be writing: abort it (and fence the pages).
        return _decode_fail(d, c, s, r, "cancelled by the client", abort=True)
    if req.d in ("validated", "generated"):
        return _decode_fail(d, c, s, r, "cancelled by the client", abort=False)
    return s  # decode already finished with the request: nothing to stop


def _decode_receive_cancel_effect(design: Design) -> EffectFormula:
    def body(r: Var) -> Updates:
        early = d(r).is_in("received", "admitted", "reserved")
        late = d(r).is_in("validated", "generated")
        return [
            assign(d_cancel(r), False),
            _decode_fail_effect(design, r, "cancelled by the client", Or(early, late), early),
        ]

    return effect(body)


def _prefill_receive_cancel(d: Design, c: Config, s: State, a: PrefillReceiveCancel) -> State:
    r = a.request
    req = evolve(s.requests[r], p_cancel=False)
    if req.p in ("received", "admitted"):
        req = _stop_prefill(req, "aborted")
    return _set_req(s, r, req)


def _prefill_receive_cancel_effect(design: Design) -> EffectFormula:
    def body(r: Var) -> Updates:
        stop = p(r).is_in("received", "admitted")
        return [assign(p_cancel(r), False), _stop_prefill_effect(r, stop)]

    return effect(body)


def _decode_generate(d: Design, c: Config, s: State, a: DecodeGenerate) -> State:
    r = a.request
    req = s.requests[r]
    read = tuple(shard for p in req.d_pages for shard in s.pages[p].shards)
    return _set_req(s, r, evolve(req, d="generated", read=read))


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


def _decode_answer(d: Design, c: Config, s: State, a: DecodeAnswer) -> State:
    r = a.request
    req = s.requests[r]
    ghost = s.ghost
    if req.answer is None:
        req = evolve(req, answer=Answer(ok=True, tags=req.read or ()))
        if s.faults.crashes:
            ghost = evolve(ghost, ok_after_crash=True)
        if s.faults.drops:
            ghost = evolve(ghost, ok_after_loss=True)
    return evolve(_set_req(s, r, evolve(req, d="answered")), ghost=ghost)


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


def _decode_release(d: Design, c: Config, s: State, a: DecodeReleasePages) -> State:
    r = a.request
    req = s.requests[r]
    pages = list(s.pages)
    ghost = s.ghost
    for q in req.d_pages:
        page = pages[q]
        if d.scrub:
            if any(shard is not None for shard in page.shards):
                ghost = evolve(ghost, scrubbed_written_page=True)
            pages[q] = page.zeroed()
        else:
            pages[q] = evolve(page, owner=None)
    req = evolve(req, d="released", d_pages=(), d_awaiting_ack=False, d_acks=())
    return evolve(_set_req(s, r, req), pages=tuple(pages), ghost=ghost)


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


def _prefill_receive_abort(d: Design, c: Config, s: State, a: PrefillReceiveAbort) -> State:
    m = a.message
    s = evolve(s, network=_remove_one(s.network, m))
    req = s.requests[m.request]
    if req.p in ("received", "admitted") or (req.p == "granted" and req.p_gen == m.generation):
        s = _set_req(s, m.request, _stop_prefill(req, "aborted"))
    if m.generation and d.release_fence in ("drain_ack", "ack_or_timeout"):
        key = (m.room, m.generation, m.request)
        if key not in s.pending_acks:
            s = evolve(s, pending_acks=tuple(sorted((*s.pending_acks, key))))
    return s


def _prefill_receive_abort_effect(design: Design) -> EffectFormula:
    # Prefill stops a request still waiting, or writing under the aborted grant. Where release is
    # fenced on its drain ack, it owes decode that ack once its writes of the grant drained.
    def body(m: Bound) -> Updates:
        r = m.req
        stop = Or(p(r).is_in("received", "admitted"), And(p(r) == "granted", p_gen(r) == m.gen))
        out: list[Any] = [consume(m), _stop_prefill_effect(r, stop)]
        if design.release_fence in ("drain_ack", "ack_or_timeout"):
            owes = m.gen != 0
            out += [
                assign(pending_ack(r), True, when=owes),
                assign(pending_ack_gen(r), m.gen, when=owes),
            ]
        return out

    return message_effect(body)


def _prefill_send_abort_ack(d: Design, c: Config, s: State, a: PrefillSendAbortAck) -> State:
    # Rank a.rank's writes of (room, generation) have drained: it says so.
    aborted = (a.room, a.generation)
    network = s.network
    for ack_room, generation, r in s.pending_acks:
        if (ack_room, generation) == aborted:
            ack = Message("abort_ack", ack_room, generation, r, rank=a.rank)
            network = _send(network, ack)
    acked = [key for key in s.acked_ranks if key[:2] == aborted]
    if len(acked) + 1 < c.prefill_ranks:
        key = (a.room, a.generation, a.rank)
        return evolve(s, acked_ranks=tuple(sorted((*s.acked_ranks, key))), network=network)
    # Every rank has acknowledged: prefill owes nothing more for this abort.
    return evolve(
        s,
        pending_acks=tuple(k for k in s.pending_acks if k[:2] != aborted),
        acked_ranks=tuple(k for k in s.acked_ranks if k[:2] != aborted),
        network=network,
    )


def _prefill_send_abort_ack_effect(design: Design) -> EffectFormula:
    # Every request owing an ack for the same room and generation gets one from rank k; once
    # every rank has sent its own, prefill owes nothing more for that abort.
    def body(r: Var, k: Var) -> Updates:
        def same(q: Var) -> Term:
            return And(pending_ack(q), room(q) == room(r), pending_ack_gen(q) == pending_ack_gen(r))

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


def _decode_receive_abort_ack(d: Design, c: Config, s: State, a: DecodeReceiveAbortAck) -> State:
    m = a.message
    s = evolve(s, network=_remove_one(s.network, m))
    for r, req in enumerate(s.requests):
        if req.d_awaiting_ack and c.requests[r].room == m.room and req.d_gen == m.generation:
            if m.rank in req.d_acks:
                return s  # this rank already acknowledged: a duplicate
            acks = _add_rank(req.d_acks, m.rank)
            if len(acks) < c.prefill_ranks:
                return _set_req(s, r, evolve(req, d_acks=acks))  # other ranks may still write
            s = evolve(s, ghost=evolve(s.ghost, drain_acked=True))
            return _set_req(s, r, evolve(req, d_awaiting_ack=False, d_acks=()))
    return s


def _decode_receive_abort_ack_effect(design: Design) -> EffectFormula:
    # The ack is for the first request decode keeps fenced on the ack's room and generation; the
    # fence lifts once every rank has acknowledged the drain of its own writes.
    def body(m: Bound) -> Updates:
        def fenced(t: Var) -> Term:
            return And(d_awaiting_ack(t), room(t) == m.room, d_gen(t) == m.gen)

        def request(t: Var) -> Updates:
            first = And(fenced(t), forall(REQ, lambda u: Implies(u < t, Not(fenced(u)))))
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


def _decode_detect_prefill_restart(
    d: Design, c: Config, s: State, a: DecodeDetectPrefillRestart
) -> State:
    s = evolve(s, decode_sees_prefill_epoch=s.prefill_epoch)
    for r, req in enumerate(s.requests):
        if req.d in ("received", "admitted", "reserved") and req.d_epoch != s.prefill_epoch:
            s = _decode_fail(d, c, s, r, "prefill restarted", abort=True)
        elif req.d_awaiting_ack:
            # The restarted prefill forgot the abort; ask again so it acks once drained.
            abort = Message("abort", c.requests[r].room, req.d_gen, r)
            s = evolve(s, network=_send(s.network, abort))
    return s


def _decode_detect_prefill_restart_effect(design: Design) -> EffectFormula:
    def request(r: Var) -> Updates:
        stale = And(d(r).is_in("received", "admitted", "reserved"), d_epoch(r) != prefill_epoch())
        return [
            _decode_fail_effect(design, r, "prefill restarted", stale, TRUE),
            # The restarted prefill forgot the abort; ask again so it acks once drained.
            send("abort", r, gen=d_gen(r), when=And(Not(stale), d_awaiting_ack(r))),
        ]

    return effect(
        lambda: [assign(decode_seen_prefill_epoch(), prefill_epoch()), each(REQ, request)]
    )


def _prefill_detect_decode_restart(
    d: Design, c: Config, s: State, a: PrefillDetectDecodeRestart
) -> State:
    s = evolve(s, prefill_sees_decode_epoch=s.decode_epoch)
    for r, req in enumerate(s.requests):
        if req.p in ("received", *PREFILL_LIVE) and req.p_epoch != s.decode_epoch:
            s = _set_req(s, r, _stop_prefill(req, "aborted"))
    return s


def _prefill_detect_decode_restart_effect(design: Design) -> EffectFormula:
    def request(r: Var) -> Updates:
        live = p(r).is_in("received", "admitted", "granted")
        return _stop_prefill_effect(r, And(live, p_epoch(r) != decode_epoch()))

    return effect(lambda: [assign(prefill_seen_decode_epoch(), decode_epoch()), each(REQ, request)])


def _retransmit(d: Design, c: Config, s: State, a: RetransmitMessage) -> State:
    return evolve(s, lost=_remove_one(s.lost, a.message), network=_send(s.network, a.message))


# Faults.


def _retransmit_effect(design: Design) -> EffectFormula:
    return message_effect(lambda m: [resend(m)])


def _client_cancel(d: Design, c: Config, s: State, a: ClientCancelRequest) -> State:
    # The router answers the client at once; decode and prefill hear of it later, each by a call
    # of its own (`decode_receive_cancel`, `prefill_receive_cancel`).
    r = a.request
    req = s.requests[r]
    s = evolve(s, faults=evolve(s.faults, cancels=s.faults.cancels + 1))
    if req.p == "granted" and req.p_wrote > 0:
        s = evolve(s, ghost=evolve(s.ghost, cancelled_mid_transfer=True))
    req = _answer_error(req, "cancelled by the client")
    if req.d in ("received", "admitted", "reserved", "validated", "generated"):
        req = evolve(req, d_cancel=True)
    if req.p in ("received", "admitted"):
        req = evolve(req, p_cancel=True)
    return _set_req(s, r, req)


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


def _decode_waiting_timeout(d: Design, c: Config, s: State, a: DecodeWaitingTimeout) -> State:
    s = evolve(s, faults=evolve(s.faults, timeouts=s.faults.timeouts + 1))
    return _decode_fail(d, c, s, a.request, "timed out waiting for prefill", abort=True)


def _decode_waiting_timeout_effect(design: Design) -> EffectFormula:
    return effect(
        lambda r: [
            assign(timeouts_spent(), timeouts_spent() + 1),
            _decode_fail_effect(design, r, "timed out waiting for prefill", TRUE, TRUE),
        ]
    )


def _prefill_abort(d: Design, c: Config, s: State, a: PrefillAbortRequest) -> State:
    r = a.request
    req = s.requests[r]
    s = evolve(s, faults=evolve(s.faults, prefill_aborts=s.faults.prefill_aborts + 1))
    new = _stop_prefill(req, "aborted")
    if d.router_honours_prefill_error:
        new = _answer_error(new, "aborted by prefill")
    s = _set_req(s, r, new)
    if d.prefill_abort_notifies_decode:
        notice = Message("failure", c.requests[r].room, req.p_gen, r, reason="aborted")
        s = evolve(s, network=_send(s.network, notice))
    return s


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


def _decode_release_timeout(d: Design, c: Config, s: State, a: DecodeReleaseTimeout) -> State:
    req = evolve(s.requests[a.request], d_awaiting_ack=False, d_acks=())
    return _set_req(s, a.request, req)


def _decode_release_timeout_effect(design: Design) -> EffectFormula:
    return effect(
        lambda r: [
            assign(d_awaiting_ack(r), False),
            each(RANK, lambda k: assign(d_ack(r, k), False)),
        ]
    )


def _prefill_restart(d: Design, c: Config, s: State, a: PrefillRestart) -> State:
    # All ranks of the instance go down together (see `PrefillRestart`).
    reqs = tuple(q if q.p in PREFILL_TERMINAL else _stop_prefill(q, "lost") for q in s.requests)
    return evolve(
        s,
        requests=reqs,
        prefill_epoch=s.prefill_epoch + 1,
        pending_acks=(),
        acked_ranks=(),
        orphans=(),
        faults=evolve(s.faults, crashes=s.faults.crashes + 1),
    )


def _prefill_restart_effect(design: Design) -> EffectFormula:
    # All ranks of the instance go down together: every request prefill was working on is lost,
    # and with it what prefill owed (drain acks) or held (adopted grants).
    def request(r: Var) -> Updates:
        working = Not(p(r).is_in("none", "rejected", "completed", "aborted", "lost"))
        return [
            assign(p(r), "lost", when=working),
            each(RANK, lambda k: assign(p_rank_done(r, k), False, when=working)),
        ]

    return effect(
        lambda: [
            assign(crashes_spent(), crashes_spent() + 1),
            each(REQ, request),
            forget_prefill_transfers(),
            assign(prefill_epoch(), prefill_epoch() + 1),
        ]
    )


def _decode_restart(d: Design, c: Config, s: State, a: DecodeRestart) -> State:
    reqs = []
    for q in s.requests:
        if q.d in ("none", "rejected", "released", "lost") and not q.d_pages:
            reqs.append(q)
            continue
        # The router sees decode's stream break: an unanswered client gets an error.
        q = _answer_error(q, "decode restarted")
        reqs.append(evolve(q, d="lost", d_pages=(), d_awaiting_ack=False, d_ranks=(), d_acks=()))
    if d.scrub:
        pages = tuple(p.zeroed() for p in s.pages)
    else:
        pages = tuple(evolve(p, owner=None) for p in s.pages)
    return evolve(
        s,
        requests=tuple(reqs),
        pages=pages,
        decode_epoch=s.decode_epoch + 1,
        next_generation=s.next_generation if d.generations_persist else 1,
        faults=evolve(s.faults, crashes=s.faults.crashes + 1),
    )


def _decode_restart_effect(design: Design) -> EffectFormula:
    # Decode loses everything but its generation counter (unless the design resets it): every
    # request it still held is lost (its client gets an error), every page is free again, zeroed
    # where the design scrubs.
    def request(r: Var) -> Updates:
        idle = d(r).is_in("none", "rejected", "released", "lost")
        lost = Not(And(idle, Not(exists(PAGE, lambda q: d_holds(r, q)))))
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
        out: list[Any] = [assign(owned(q), False)]
        if design.scrub:
            out += [each(RANK, lambda k: assign(shard_has(q, k), False))]
        return out

    def body() -> Updates:
        out: list[Any] = [
            assign(crashes_spent(), crashes_spent() + 1),
            each(REQ, request),
            each(PAGE, page),
            assign(decode_epoch(), decode_epoch() + 1),
        ]
        if not design.generations_persist:
            out += [assign(next_gen(), 1)]
        return out

    return effect(body)


def _prefill_lease_expire(d: Design, c: Config, s: State, a: PrefillLeaseExpire) -> State:
    r = a.request
    req = s.requests[r]
    s = evolve(s, faults=evolve(s.faults, timeouts=s.faults.timeouts + 1))
    s = _set_req(s, r, evolve(req, p_lease_expired=True))
    if d.lease_expiry_notifies_decode:
        notice = Message("failure", c.requests[r].room, req.p_gen, r, reason="lease expired")
        s = evolve(s, network=_send(s.network, notice))
    return s


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


def _fail_transfer(d: Design, c: Config, s: State, a: NetworkFailTransfer) -> State:
    w = a.write
    s = evolve(
        s,
        writes=_remove_one(s.writes, w),
        faults=evolve(s.faults, drops=s.faults.drops + 1),
    )
    if not d.transfer_failure_reported:
        return s  # decode counts the page as received
    # The reader (decode, on the pull path) sees the failure and fails the request.
    for r, req in enumerate(s.requests):
        if req.d == "reserved" and c.requests[r].room == w.room and req.d_gen == w.generation:
            return _decode_fail(d, c, s, r, "page transfer failed", abort=True)
    return s


def _fail_transfer_effect(design: Design) -> EffectFormula:
    # Whether the reader notices is the design's (M14: it does not, and counts the page as
    # received). If it does, it fails the request reserved on the write's room and generation.
    def body(w: Bound) -> Updates:
        out: list[Any] = [consume(w), assign(drops_spent(), drops_spent() + 1)]
        if not design.transfer_failure_reported:
            return out

        def reading(t: Var) -> Term:
            return And(d(t) == "reserved", room(t) == w.room, d_gen(t) == w.gen)

        def request(t: Var) -> Updates:
            first = And(reading(t), forall(REQ, lambda u: Implies(u < t, Not(reading(u)))))
            return _decode_fail_effect(design, t, "page transfer failed", first, TRUE)

        return [*out, each(REQ, request)]

    return write_effect(body)


def _drop(d: Design, c: Config, s: State, a: NetworkDropMessage) -> State:
    # The sender's RPC fails, so the sender knows and will retransmit.
    return evolve(
        s,
        network=_remove_one(s.network, a.message),
        lost=_send(s.lost, a.message),
        faults=evolve(s.faults, drops=s.faults.drops + 1),
    )


def _drop_effect(design: Design) -> EffectFormula:
    return message_effect(lambda m: [assign(drops_spent(), drops_spent() + 1), lose(m)])


def _duplicate(d: Design, c: Config, s: State, a: NetworkDuplicateMessage) -> State:
    return evolve(
        s,
        network=_send(s.network, a.message),
        faults=evolve(s.faults, duplicates=s.faults.duplicates + 1),
    )


def _duplicate_effect(design: Design) -> EffectFormula:
    return message_effect(lambda m: [assign(duplicates_spent(), duplicates_spent() + 1), copy(m)])


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
    "decode_restart": _decode_restart_effect,
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
}
"""The effects written as formulas: those of the steps of `RULE_GUARDS`. The Z3 encodings translate
these (`Encoding.rule`); `step` runs them compiled (`spec/compiled.py`)."""


@cache
def rule_effect(design: Design, name: str) -> EffectFormula:
    """The effect of protocol step `name` (snake_case) under `design`, as a formula: what the Z3
    encodings translate (`Encoding.rule`) and `step` runs compiled. Built once per design."""
    return RULE_EFFECTS[name](design)


_STEP = {
    RouterSubmitRequest: _router_submit,
    PrefillAdmitRequest: _prefill_admit,
    PrefillRejectRequest: _prefill_reject,
    DecodeAdmitRequest: _decode_admit,
    DecodeRejectRequest: _decode_reject,
    DecodeReservePages: _decode_reserve,
    PrefillReceiveGrant: _prefill_receive_grant,
    PrefillWritePage: _prefill_write,
    DecodeReceiveWrite: _decode_receive_write,
    PrefillSendCompletion: _prefill_send_completion,
    DecodeReceiveCompletion: _decode_receive_completion,
    DecodeReceiveFailure: _decode_receive_failure,
    DecodeReceiveCancel: _decode_receive_cancel,
    PrefillReceiveCancel: _prefill_receive_cancel,
    DecodeGenerate: _decode_generate,
    DecodeAnswer: _decode_answer,
    DecodeReleasePages: _decode_release,
    PrefillReceiveAbort: _prefill_receive_abort,
    PrefillSendAbortAck: _prefill_send_abort_ack,
    DecodeReceiveAbortAck: _decode_receive_abort_ack,
    DecodeDetectPrefillRestart: _decode_detect_prefill_restart,
    PrefillDetectDecodeRestart: _prefill_detect_decode_restart,
    RetransmitMessage: _retransmit,
    ClientCancelRequest: _client_cancel,
    DecodeWaitingTimeout: _decode_waiting_timeout,
    PrefillAbortRequest: _prefill_abort,
    DecodeReleaseTimeout: _decode_release_timeout,
    PrefillRestart: _prefill_restart,
    DecodeRestart: _decode_restart,
    PrefillLeaseExpire: _prefill_lease_expire,
    NetworkFailTransfer: _fail_transfer,
    NetworkDropMessage: _drop,
    NetworkDuplicateMessage: _duplicate,
}

__all__ = [
    "REFERENCE",
    "RULE_GUARDS",
    "ActionNotEnabled",
    "checked_step",
    "enabled",
    "init",
    "is_enabled",
    "rule_guard",
    "step",
]
