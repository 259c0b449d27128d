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
6. `fenced_writes_land_in_held_pages` (`ONE_SIDED_INVARIANTS`, for one-sided designs with a drain
   fence): with no receiver check, the fence must keep every live write aimed at a page its own
   request still holds.

Every invariant is a pure function `(config, state) -> bool`, like the properties. They are
checked three ways: on every state the explorer reaches (`tests/model_checker`), as k-induction
strengthening on the fixed-configuration Z3 encoding, and (their parametric versions, the same
names) over any number of pages, requests and tenants by `kvhandoff check --engine prove`.

They are invariants of the *reference* design (and of designs that keep its defences); a variant
that breaks a property breaks at least one of them, which is how the proof fails for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvhandoff.spec.config import Config
from kvhandoff.spec.state import State, Tag


@dataclass(frozen=True)
class Invariant:
    name: str
    claim: str
    holds: Callable[[Config, State], bool]


def generations_are_unique(config: Config, state: State) -> bool:
    """No two requests hold the same decode generation, and the counter is past all of them."""
    held = [req.d_gen for req in state.requests if req.d_gen != 0]
    return len(held) == len(set(held)) and all(g < state.next_generation for g in held)


def unreserved_requests_hold_nothing(config: Config, state: State) -> bool:
    """Before decode reserves for a request (or once it refused it), the request holds no
    generation and no pages; only the phases between reservation and release hold pages."""
    for req in state.requests:
        if req.d in ("none", "received", "admitted", "rejected") and (req.d_gen or req.d_pages):
            return False
        holding = ("reserved", "validated", "generated", "answered", "failed")
        if req.d_pages and req.d not in holding:
            return False
    return True


def prefill_holds_decodes_generation(config: Config, state: State) -> bool:
    """The grant prefill holds for a request is the one decode issued for it."""
    for req in state.requests:
        if req.p_gen != 0 and req.p_gen != req.d_gen:
            return False
        if req.p_wrote > len(req.p_pages):
            return False
        if req.p_wrote and req.p_gen == 0:
            return False
    return True


def messages_carry_their_generation(config: Config, state: State) -> bool:
    """Every grant, completion, abort and abort ack in the network (or waiting to be sent again)
    names its own request's generation; completions are only sent by a prefill that holds it."""
    for m in (*state.network, *state.lost):
        req = state.requests[m.request]
        if m.kind == "grant" and (m.generation == 0 or m.generation != req.d_gen):
            return False
        if m.kind == "completion" and (m.generation == 0 or m.generation != req.p_gen):
            return False
        if m.kind in ("abort", "abort_ack", "failure") and m.generation not in (0, req.d_gen):
            return False
    return True


def writes_carry_their_grant(config: Config, state: State) -> bool:
    """A write in flight carries its request's room, generation and data, for a granted page,
    and its prefill has not completed (it completes only once its writes returned)."""
    for w in state.writes:
        r = w.data.request
        req = state.requests[r]
        if req.p_gen == 0 or w.generation != req.p_gen or w.page not in req.p_pages:
            return False
        if req.p == "completed":
            return False
        if w.room != config.requests[r].room or w.data != Tag(r, req.p_gen, w.data.tenant):
            return False
        if w.data.tenant != config.requests[r].tenant:
            return False
    return True


def owned_pages_hold_owner_data_or_nothing(config: Config, state: State) -> bool:
    """A page decode owns for (r, g) holds r's data for g, or nothing, in every rank's shard. On
    the pull path a shard may also hold data from outside the scenario (request -1): a read whose
    source lease expired fetched a reused block. Validation rejects such a page; it never holds
    *another request's* data, which is what the argument needs."""
    for page in state.pages:
        if page.owner is None:
            continue
        r, g = page.owner
        own = Tag(r, g, config.requests[r].tenant)
        if any(shard is not None and shard != own and shard.request != -1 for shard in page.shards):
            return False
    return True


def validated_pages_hold_own_data(config: Config, state: State) -> bool:
    """Once decode validated a request's completion, every page it holds for the request holds
    the request's own data for its generation, in every rank's shard (so `decode_generate`
    reads exactly that)."""
    for r, req in enumerate(state.requests):
        if req.d != "validated":
            continue
        own = Tag(r, req.d_gen, config.requests[r].tenant)
        if any(shard != own for p in req.d_pages for shard in state.pages[p].shards):
            return False
    return True


def unsubmitted_requests_are_untouched(config: Config, state: State) -> bool:
    """Nothing happens to a request before the router submits it."""
    present = (*state.network, *state.lost)
    for r, req in enumerate(state.requests):
        if req.submitted:
            continue
        if (req.p, req.d) != ("none", "none") or req.answer is not None or req.not_as_is:
            return False
        if req.p_gen or req.d_gen or req.p_wrote or req.d_awaiting_ack:
            return False
        if any(m.request == r for m in present) or any(w.data.request == r for w in state.writes):
            return False
        if any(key[2] == r for key in state.pending_acks):
            return False
    return True


def decode_validates_only_completed_prefill(config: Config, state: State) -> bool:
    """Decode validates, reads and answers a request only after that request's own prefill
    completed (every rank reported); an answer with output comes from a read. A completion in
    the network, or one decode holds in its rank set, was sent by a rank that reported: prefill
    completed, or lists the rank as done, or stopped since (aborted or lost; with one rank a
    request that reported is `completed`, which is final)."""
    present = (*state.network, *state.lost)
    for r, req in enumerate(state.requests):
        validated = req.d in ("validated", "generated", "answered")
        if (validated or req.read is not None or req.accepted_full is not None) and (
            req.p != "completed"
        ):
            return False
        if req.d in ("generated", "answered") and req.read is None:
            return False
        if req.answer is not None and req.answer.ok and req.read is None:
            return False
        stopped = req.p in ("aborted", "lost")
        sent = {m.rank for m in present if m.kind == "completion" and m.request == r}
        for rank in sent | set(req.d_ranks):
            if req.p != "completed" and rank not in req.p_ranks_done and not stopped:
                return False
    return True


def rejected_requests_are_never_completed(config: Config, state: State) -> bool:
    """A request not admitted as sent: prefill never writes or completes it, decode never
    validates it, and the client never gets output for it."""
    for r, req in enumerate(state.requests):
        if not req.not_as_is:
            continue
        if req.p_wrote or req.p in ("granted", "completed"):
            return False
        if req.d in ("validated", "generated", "answered") or req.read is not None:
            return False
        if req.answer is not None and req.answer.ok:
            return False
        if any(m.kind == "completion" and m.request == r for m in (*state.network, *state.lost)):
            return False
        # Who refused it, and so stopped it: prefill, decode, or the router (before either).
        if not (req.p == "rejected" or req.d == "rejected" or (req.p, req.d) == ("none", "none")):
            return False
    return True


INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "generations_are_unique",
        "no two requests hold the same generation; the counter is past every one",
        generations_are_unique,
    ),
    Invariant(
        "unreserved_requests_hold_nothing",
        "only a reserved (not yet released) request holds a generation's pages",
        unreserved_requests_hold_nothing,
    ),
    Invariant(
        "prefill_holds_decodes_generation",
        "the grant prefill holds for a request is decode's grant for it",
        prefill_holds_decodes_generation,
    ),
    Invariant(
        "messages_carry_their_generation",
        "grants, completions, aborts and acks name their own request's generation",
        messages_carry_their_generation,
    ),
    Invariant(
        "writes_carry_their_grant",
        "a write in flight carries its own request's room, generation and data",
        writes_carry_their_grant,
    ),
    Invariant(
        "owned_pages_hold_owner_data_or_nothing",
        "a page owned by (r, g) holds r's data for g, or nothing",
        owned_pages_hold_owner_data_or_nothing,
    ),
    Invariant(
        "validated_pages_hold_own_data",
        "a validated request's pages all hold its own data for its generation",
        validated_pages_hold_own_data,
    ),
    Invariant(
        "unsubmitted_requests_are_untouched",
        "nothing happens to a request before the router submits it",
        unsubmitted_requests_are_untouched,
    ),
    Invariant(
        "decode_validates_only_completed_prefill",
        "decode validates, reads and answers a request only after its own prefill completed",
        decode_validates_only_completed_prefill,
    ),
    Invariant(
        "rejected_requests_are_never_completed",
        "a request not admitted as sent is never written, completed, validated or answered",
        rejected_requests_are_never_completed,
    ),
)


def fenced_writes_land_in_held_pages(config: Config, state: State) -> bool:
    """One-sided writes land wherever they point, so a drain-fenced design must keep every write
    of the current decode incarnation aimed at a page its own request still holds: a prefill that
    may still write holds the same grant as decode, decode keeps the pages (reserved, or failed
    and awaiting the drain ack) until the writes drained, and once the request is done (answered,
    failed without a fence, completed, acknowledged) none of its writes is in flight; with several
    prefill ranks, neither is any write of a rank that reported or acknowledged. Writes of an
    earlier incarnation are refused by the revoked key, so they do not count."""
    present = (*state.network, *state.lost)
    pending = {r for _room, _gen, r in state.pending_acks}
    for r, req in enumerate(state.requests):
        current = req.p_epoch == state.decode_epoch
        held = req.d == "reserved" or (req.d == "failed" and req.d_awaiting_ack)
        writes = [w for w in state.writes if w.data.request == r]
        mine = [m for m in present if m.request == r]
        if current and any(w.page not in req.d_pages for w in writes):
            return False
        may_write = req.p in ("received", "admitted", "granted") and req.p_gen != 0
        if current and may_write and (not held or set(req.p_pages) != set(req.d_pages)):
            return False
        for m in mine:
            waiting = req.p in ("received", "admitted") and req.p_gen == 0
            if m.kind == "grant" and m.epoch == state.decode_epoch and waiting:
                if not held or set(m.pages) != set(req.d_pages):
                    return False
        done = (
            req.d in ("validated", "generated", "answered")
            or (req.d == "failed" and not req.d_awaiting_ack)
            or req.p == "completed"
            or any(m.kind == "failure" for m in mine)
        )
        for w in writes if current else ():
            rank_done = (
                (w.room, w.generation, w.rank) in state.acked_ranks
                or w.rank in req.p_ranks_done
                or w.rank in req.d_ranks
                or w.rank in req.d_acks
                or any(m.kind in ("completion", "abort_ack") and m.rank == w.rank for m in mine)
            )
            if done or rank_done:
                return False
        told = r in pending or any(m.kind in ("failure", "abort_ack") for m in mine)
        if told and req.p in ("received", "admitted", "granted"):
            return False
    return True


ONE_SIDED_INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "fenced_writes_land_in_held_pages",
        "with one-sided writes, a current write only ever targets a page its request still holds",
        fenced_writes_land_in_held_pages,
    ),
)
"""Extra invariants of designs with one-sided writes and a drain fence (`one_sided_fenced`);
with the ones above they make that design's safety properties inductive too."""


def failing_invariants(config: Config, state: State) -> list[Invariant]:
    return [inv for inv in INVARIANTS if not inv.holds(config, state)]
