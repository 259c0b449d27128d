"""What must always hold, what must be possible, and what the deployment must satisfy.

Each `always` property is a claim about every reachable state; its name says the claim. Each has a
`sometimes` partner (a witness): a state that must be reachable, so that a property that holds only
because nothing ever happens (a vacuous spec) is caught. `every_request_terminates` is a
bounded-response property over the state graph, checked by the explorer (see
`model_checker/explore.py`): once faults stop, every request ends in an answer or an error, and its
pages return to the pool, within a bound of steps.

Most `always` properties are claims about each request on its own: they are written as the claim
about one request (`each_request`; `each_page` for a claim about each page), and every property
says which parts of the state it reads (`reads`). These only let checkers skip work: a state that
differs from one where a property held only in parts it does not read (or, for a per-request or
per-page claim, only in other requests or pages) satisfies it too (`check_always_after`). A test
checks these declarations on every reachable state of small scenarios.

**Written once, read by every checker.** Each `always` property is also a formula of
`spec/logic.py` over the symbols of `spec/vocabulary.py` (`Property.formula`), the claim itself:
the Z3 engines read that very object (`model_checker/logic_z3.py`: bmc, kind, spacer and the
fixed-configuration `prove` over the encoding's variables; the any-size `prove` where its model
keeps what the formula reads), and `kvhandoff check --invariants` evaluates it on every reachable
state next to the Python function, which stays: it is the explorer's fast path (per request,
per page, and skipped where the state did not change), and a test keeps the two in agreement.
So is each `sometimes` witness (`Witness.formula`): the Z3 engines search for that formula to
show their model can move (`model_checker/z3_witnesses.py`).

Deployment-level properties are plain functions of the `Config`: they are what `check-config`
checks before rollout. The reference protocol is meant to be safe *even when they fail* (the
named scenarios break both on purpose), which is why they are reported apart from the verdict.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from kvhandoff.spec.config import Config
from kvhandoff.spec.logic import PAGE, RANK, REQ, And, Implies, Not, Or, Term, exists, forall
from kvhandoff.spec.state import PageState, ReqState, State, Tag, changed_positions
from kvhandoff.spec.vocabulary import (
    accepted_full,
    accepted_set,
    answered,
    answered_ok,
    cancelled_mid_transfer,
    compile_claim,
    cross_tenant_reuse,
    d_gen,
    d_holds,
    drain_acked,
    late_landing,
    not_as_is,
    ok_after_crash,
    ok_after_loss,
    over_prefill_limit,
    owned,
    owner,
    owner_gen,
    p_wrote,
    page_reuse,
    read_gen,
    read_has,
    read_page,
    read_req,
    read_tenant,
    refused_write,
    scrubbed_written_page,
    shard_has,
    tenant,
    timed_out_waiting,
    timeouts_spent,
)


@dataclass(frozen=True)
class Property:
    name: str
    claim: str
    holds: Callable[[Config, State], bool]
    witness: str = ""
    """The name of the `sometimes` property that shows this one is not vacuous."""
    reads: tuple[str, ...] = ()
    """What `holds` reads: `State` fields, `requests.FIELD` (`pages.FIELD`) for one field of
    every request (page), or `ghost.FIELD` (`faults.FIELD`) for one field of that record
    (empty: it may read anything). The explorer relies on it: the ghost flags no property
    reads are merged away (`model_checker/reduction.py`)."""
    each_request: Callable[[Config, int, ReqState], bool] | None = None
    """For a claim about each request on its own: the claim about request r, which reads only
    r's `ReqState` and the config. `holds` is then this claim for every request."""
    each_page: Callable[[Config, PageState], bool] | None = None
    """For a claim about each page on its own: the claim about one page, which reads only that
    `PageState` and the config. `holds` is then this claim for every page."""
    formula: Term | None = dataclasses.field(default=None, compare=False)
    """The claim as a formula over the vocabulary: what the Z3 engines check. `holds` computes
    the same truth value on every state (a test checks it on every reachable state of several
    variants); None for a graph property (`every_request_terminates`)."""
    _compiled: list[Callable[[State, Config, bool], bool]] = dataclasses.field(
        default_factory=list, repr=False, compare=False
    )

    def formula_holds(self, config: Config, state: State) -> bool:
        """The formula on one concrete state (compiled once to a Python function)."""
        if self.formula is None:
            raise ValueError(f"{self.name} has no formula: it is a graph property")
        if not self._compiled:
            self._compiled.append(compile_claim(self.formula, self.name))
        return self._compiled[0](state, config, True)  # no property reads a design flag


@dataclass(frozen=True)
class Witness:
    name: str
    claim: str
    reached: Callable[[Config, State], bool]
    formula: Term | None = dataclasses.field(default=None, compare=False)
    """The state the witness names, as a formula over the vocabulary: what the Z3 engines look
    for (`logic_z3.fixed_witnesses`). `reached` computes the same truth value on every state (a
    test checks it on every reachable state of several variants)."""
    _compiled: list[Callable[[State, Config, bool], bool]] = dataclasses.field(
        default_factory=list, repr=False, compare=False
    )

    def formula_holds(self, config: Config, state: State) -> bool:
        """The formula on one concrete state (compiled once to a Python function)."""
        if self.formula is None:
            raise ValueError(f"{self.name} has no formula")
        if not self._compiled:
            self._compiled.append(compile_claim(self.formula, self.name))
        return self._compiled[0](state, config, True)  # no witness reads a design flag


class PropertyViolation(AssertionError):
    def __init__(self, prop: Property, state: State) -> None:
        super().__init__(f"{prop.name} violated: {prop.claim}")
        self.property = prop
        self.state = state


# --- always -------------------------------------------------------------------------------------


def request_reads_only_validated_pages(config: Config, r: int, req: ReqState) -> bool:
    """Ack implies data validated: when decode generates for r, every page it reads holds data
    written by r's own prefill for r's current generation (with several prefill ranks, in every
    rank's shard: a shard still zeroed or holding older data is not r's)."""
    if req.read is None:
        return True
    own = Tag(r, req.d_gen, config.requests[r].tenant)
    return all(t == own for t in req.read)


def request_reads_no_other_tenant(config: Config, r: int, req: ReqState) -> bool:
    """Nothing r's answer is generated from was written for another tenant."""
    if req.read is None:
        return True
    tenant = config.requests[r].tenant
    return all(t is None or t.tenant == tenant for t in req.read)


def request_accepted_only_full_coverage(config: Config, r: int, req: ReqState) -> bool:
    """A completion that decode accepted for r covers every granted page with r's own data
    (with several prefill ranks: every page x every rank's shard)."""
    return req.accepted_full is not False


def request_not_as_is_gets_error(config: Config, r: int, req: ReqState) -> bool:
    """Fail closed: if some side did not admit r as sent (rejected, swapped for a placeholder,
    truncated), r gets an error, never output, and prefill writes nothing for it."""
    if not req.not_as_is:
        return True
    return req.p_wrote == 0 and (req.answer is None or not req.answer.ok)


def decode_reads_only_validated_pages(config: Config, state: State) -> bool:
    """`request_reads_only_validated_pages`, for every request."""
    return _every_request(config, state, request_reads_only_validated_pages)


def no_cross_tenant_read(config: Config, state: State) -> bool:
    """`request_reads_no_other_tenant`, for every request."""
    return _every_request(config, state, request_reads_no_other_tenant)


def accepted_completion_implies_full_coverage(config: Config, state: State) -> bool:
    """`request_accepted_only_full_coverage`, for every request."""
    return _every_request(config, state, request_accepted_only_full_coverage)


def rejected_request_gets_error_not_output(config: Config, state: State) -> bool:
    """`request_not_as_is_gets_error`, for every request."""
    return _every_request(config, state, request_not_as_is_gets_error)


def _every_request(
    config: Config, state: State, claim: Callable[[Config, int, ReqState], bool]
) -> bool:
    for r, req in enumerate(state.requests):
        if not claim(config, r, req):
            return False
    return True


def page_has_single_owner(config: Config, state: State) -> bool:
    """Decode's page table and its requests agree, and no page is granted to two requests."""
    holders: dict[int, int] = {}
    for r, req in enumerate(state.requests):
        for p in req.d_pages:
            if p in holders:
                return False
            holders[p] = r
            if state.pages[p].owner != (r, req.d_gen):
                return False
    return all(page.owner is None or i in holders for i, page in enumerate(state.pages))


def no_late_write_lands_in_reallocated_page(config: Config, state: State) -> bool:
    """A write lands only in a page owned by its own request and generation: no write of an
    aborted or released generation lands after the page was freed or granted again."""
    return not state.ghost.late_landing


def page_free_holds_nothing(config: Config, page: PageState) -> bool:
    """A free page holds nothing readable: whatever was there (every rank's shard) was zeroed
    when it was freed."""
    return page.owner is not None or (page.content is None and not any(page.rank_shards))


def freed_pages_hold_no_readable_data(config: Config, state: State) -> bool:
    """`page_free_holds_nothing`, for every page."""
    return all(page_free_holds_nothing(config, page) for page in state.pages)


# --- the same claims, as formulas ---------------------------------------------------------------
# One function per property, over the vocabulary. Each says what the Python function above says,
# in the form every engine reads; the comments say how the two correspond where it is not plain.


def reads_only_own_data() -> Term:
    """`decode_reads_only_validated_pages`: every shard of every page decode read for r held
    data, written by r itself, for r's current generation (and labelled r's tenant: the spec
    compares whole tags). A shard still zeroed is not r's data, hence `read_has`."""
    return forall(
        REQ,
        lambda r: forall(
            PAGE,
            lambda q: Implies(
                read_page(r, q),
                forall(
                    RANK,
                    lambda k: And(
                        read_has(r, q, k),
                        read_req(r, q, k) == r,
                        read_gen(r, q, k) == d_gen(r),
                        read_tenant(r, q, k) == tenant(r),
                    ),
                ),
            ),
        ),
    )


def reads_no_other_tenant() -> Term:
    """`no_cross_tenant_read`: a shard decode read for r is empty or was written for r's tenant
    (pull path: data from outside the scenario is labelled with a tenant of its own)."""
    return forall(
        REQ,
        lambda r: forall(
            PAGE,
            lambda q: Implies(
                read_page(r, q),
                forall(
                    RANK,
                    lambda k: Implies(read_has(r, q, k), read_tenant(r, q, k) == tenant(r)),
                ),
            ),
        ),
    )


def accepted_only_full_coverage() -> Term:
    """`accepted_completion_implies_full_coverage`: the ghost `accepted_full` is None until decode
    accepts a completion, then whether it covered every page; it must never be False."""
    return forall(REQ, lambda r: Implies(accepted_set(r), accepted_full(r)))


def not_as_is_gets_error() -> Term:
    """`rejected_request_gets_error_not_output`: fail closed. Nothing written (prefill's count
    of written pages stays 0) and no output for a request not admitted as sent; an error, or no
    answer yet, is fine."""
    return forall(
        REQ,
        lambda r: Implies(not_as_is(r), And(p_wrote(r) == 0, Not(answered_ok(r)))),
    )


def single_owner() -> Term:
    """`page_has_single_owner`: decode's page table (`owner`, `owner_gen`) and the pages its
    requests hold (`d_holds`) tell the same story. A held page is owned by its holder under the
    holder's generation, by one holder only; an owned page is held. The Python function says "is
    held by some request"; "is held by its owner" says the same given the first clause, and needs
    no existential (which the any-size proof would have to instantiate)."""
    return forall(
        PAGE,
        lambda q: And(
            forall(
                REQ,
                lambda r: Implies(
                    d_holds(r, q), And(owned(q), owner(q) == r, owner_gen(q) == d_gen(r))
                ),
            ),
            forall(
                REQ,
                lambda r: forall(
                    REQ, lambda r2: Implies(And(d_holds(r, q), d_holds(r2, q)), r == r2)
                ),
            ),
            Implies(owned(q), d_holds(owner(q), q)),
        ),
    )


def no_late_landing() -> Term:
    """`no_late_write_lands_in_reallocated_page`: a ghost flag the spec sets when a write lands
    in a page not owned by its (room, generation); the claim is that it never gets set."""
    return Not(late_landing())


def free_pages_hold_nothing() -> Term:
    """`freed_pages_hold_no_readable_data`: a page no request owns is zeroed, every shard."""
    return forall(
        PAGE, lambda q: Implies(Not(owned(q)), forall(RANK, lambda k: Not(shard_has(q, k))))
    )


# --- sometimes ----------------------------------------------------------------------------------


def can_complete_handoff(config: Config, state: State) -> bool:
    return any(req.answer is not None and req.answer.ok for req in state.requests)


def can_reuse_page_across_tenants(config: Config, state: State) -> bool:
    return state.ghost.cross_tenant_reuse


def can_accept_completion(config: Config, state: State) -> bool:
    return any(req.accepted_full is not None for req in state.requests)


def can_reject_oversized_prompt(config: Config, state: State) -> bool:
    return any(
        req.not_as_is
        and req.answer is not None
        and not req.answer.ok
        and config.requests[r].pages > config.prefill_max_prompt
        for r, req in enumerate(state.requests)
    )


def can_reuse_freed_page(config: Config, state: State) -> bool:
    return state.ghost.page_reuse


def can_refuse_or_fence_late_write(config: Config, state: State) -> bool:
    """A stale write was refused, or an abort's drain ack arrived before release."""
    return state.ghost.refused_write or state.ghost.drain_acked


def can_scrub_written_page(config: Config, state: State) -> bool:
    return state.ghost.scrubbed_written_page


def can_cancel_mid_transfer(config: Config, state: State) -> bool:
    return state.ghost.cancelled_mid_transfer


def can_recover_from_crash(config: Config, state: State) -> bool:
    return state.ghost.ok_after_crash


def can_recover_from_message_loss(config: Config, state: State) -> bool:
    return state.ghost.ok_after_loss


def can_time_out_waiting(config: Config, state: State) -> bool:
    return state.faults.timeouts > 0 and any(
        req.answer is not None and req.answer.reason == "timed out waiting for prefill"
        for req in state.requests
    )


# --- the witnesses, as formulas -----------------------------------------------------------------
# One function per witness, over the vocabulary, saying what the Python function above says. A
# witness is an existential claim ("some request got output"), the dual of a property: the engines
# search for a state where it holds, where for a property they search for one where it fails.
# Most read a ghost flag: the history a witness is about (a page granted *again*, output *after* a
# crash) is kept in the state by the step where it happens (see `spec/vocabulary.py`), so each
# witness is a claim about one state.


def some_output() -> Term:
    """`can_complete_handoff`: some request got output (an answer that is not an error)."""
    return exists(REQ, lambda r: answered_ok(r))


def some_page_reused_across_tenants() -> Term:
    """`can_reuse_page_across_tenants`: the ghost flag set when decode grants a page whose last
    grant was to another tenant: the state `no_cross_tenant_read` is about."""
    return cross_tenant_reuse()


def some_completion_accepted() -> Term:
    """`can_accept_completion`: decode accepted some completion (the ghost `accepted_full` is set
    then, whether or not the completion covered every page: `accepted_set`)."""
    return exists(REQ, lambda r: accepted_set(r))


def some_oversized_prompt_refused() -> Term:
    """`can_reject_oversized_prompt`: a prompt over prefill's limit was not admitted as sent, and
    ended in an error. `over_prefill_limit` is rigid (the config): for a scenario with no such
    prompt the witness is false in every state, as the Python function is."""
    return exists(
        REQ,
        lambda r: And(not_as_is(r), answered(r), Not(answered_ok(r)), over_prefill_limit(r)),
    )


def some_freed_page_reused() -> Term:
    """`can_reuse_freed_page`: the ghost flag set when decode grants a page that was granted
    before and freed."""
    return page_reuse()


def some_late_write_refused_or_fenced() -> Term:
    """`can_refuse_or_fence_late_write`: a stale write was refused (ownership check, revoked key)
    or an abort's drain ack released a fenced reservation; which of the two a design shows depends
    on its fence, so the witness is either."""
    return Or(refused_write(), drain_acked())


def some_written_page_scrubbed() -> Term:
    """`can_scrub_written_page`: a page that held data was zeroed when it was released."""
    return scrubbed_written_page()


def some_cancel_mid_transfer() -> Term:
    """`can_cancel_mid_transfer`: a client cancelled while its pages were being written."""
    return cancelled_mid_transfer()


def some_output_after_crash() -> Term:
    """`can_recover_from_crash`: some request got output after a crash."""
    return ok_after_crash()


def some_output_after_loss() -> Term:
    """`can_recover_from_message_loss`: some request got output after a message was lost."""
    return ok_after_loss()


def some_wait_timed_out() -> Term:
    """`can_time_out_waiting`: a timeout was spent, and some request's answer is decode's
    "timed out waiting for prefill" error."""
    return And(timeouts_spent() > 0, exists(REQ, lambda r: timed_out_waiting(r)))


ALWAYS: tuple[Property, ...] = (
    Property(
        "decode_reads_only_validated_pages",
        "decode generates for r only from pages holding r's own data for r's current generation",
        decode_reads_only_validated_pages,
        "can_complete_handoff",
        reads=("requests.read", "requests.d_gen"),
        each_request=request_reads_only_validated_pages,
        formula=reads_only_own_data(),
    ),
    Property(
        "no_cross_tenant_read",
        "nothing a request's answer is generated from was written for another tenant",
        no_cross_tenant_read,
        "can_reuse_page_across_tenants",
        reads=("requests.read",),
        each_request=request_reads_no_other_tenant,
        formula=reads_no_other_tenant(),
    ),
    Property(
        "accepted_completion_implies_full_coverage",
        "a completion that decode accepts covers every granted page",
        accepted_completion_implies_full_coverage,
        "can_accept_completion",
        reads=("requests.accepted_full",),
        each_request=request_accepted_only_full_coverage,
        formula=accepted_only_full_coverage(),
    ),
    Property(
        "rejected_request_gets_error_not_output",
        "a request not admitted as sent gets an error, never output, and nothing is written for it",
        rejected_request_gets_error_not_output,
        "can_reject_oversized_prompt",
        reads=("requests.not_as_is", "requests.p_wrote", "requests.answer"),
        each_request=request_not_as_is_gets_error,
        formula=not_as_is_gets_error(),
    ),
    Property(
        "page_has_single_owner",
        "decode's page table and its requests agree; no page is granted twice at once",
        page_has_single_owner,
        "can_reuse_freed_page",
        reads=("requests.d_pages", "requests.d_gen", "pages.owner"),
        formula=single_owner(),
    ),
    Property(
        "no_late_write_lands_in_reallocated_page",
        "a write lands only in a page owned by its own request and generation",
        no_late_write_lands_in_reallocated_page,
        "can_refuse_or_fence_late_write",
        reads=("ghost.late_landing",),
        formula=no_late_landing(),
    ),
    Property(
        "freed_pages_hold_no_readable_data",
        "free pages hold nothing readable",
        freed_pages_hold_no_readable_data,
        "can_scrub_written_page",
        reads=("pages",),
        each_page=page_free_holds_nothing,
        formula=free_pages_hold_nothing(),
    ),
)

TERMINATION = Property(
    "every_request_terminates",
    "once faults stop, every request ends in an answer or an error and its pages are freed, "
    "within a bound of steps",
    lambda config, state: True,  # a graph property: see model_checker.explore
    "can_recover_from_crash",
)

SOMETIMES: tuple[Witness, ...] = (
    Witness(
        "can_complete_handoff",
        "some request gets an answer",
        can_complete_handoff,
        formula=some_output(),
    ),
    Witness(
        "can_reuse_page_across_tenants",
        "a page used for one tenant is granted to another",
        can_reuse_page_across_tenants,
        formula=some_page_reused_across_tenants(),
    ),
    Witness(
        "can_accept_completion",
        "decode accepts a completion",
        can_accept_completion,
        formula=some_completion_accepted(),
    ),
    Witness(
        "can_reject_oversized_prompt",
        "a prompt over prefill's limit ends in an error",
        can_reject_oversized_prompt,
        formula=some_oversized_prompt_refused(),
    ),
    Witness(
        "can_reuse_freed_page",
        "a freed page is granted again",
        can_reuse_freed_page,
        formula=some_freed_page_reused(),
    ),
    Witness(
        "can_refuse_or_fence_late_write",
        "a stale write is refused, or fenced by a drain ack",
        can_refuse_or_fence_late_write,
        formula=some_late_write_refused_or_fenced(),
    ),
    Witness(
        "can_scrub_written_page",
        "a written page is zeroed on release",
        can_scrub_written_page,
        formula=some_written_page_scrubbed(),
    ),
    Witness(
        "can_cancel_mid_transfer",
        "a client cancels while pages are being written",
        can_cancel_mid_transfer,
        formula=some_cancel_mid_transfer(),
    ),
    Witness(
        "can_recover_from_crash",
        "a request is answered after a crash",
        can_recover_from_crash,
        formula=some_output_after_crash(),
    ),
    Witness(
        "can_recover_from_message_loss",
        "a request is answered after a lost message",
        can_recover_from_message_loss,
        formula=some_output_after_loss(),
    ),
    Witness(
        "can_time_out_waiting",
        "decode times out waiting for prefill",
        can_time_out_waiting,
        formula=some_wait_timed_out(),
    ),
)

ALL_PROPERTY_NAMES: tuple[str, ...] = (*tuple(p.name for p in ALWAYS), TERMINATION.name)


def check_always(config: Config, state: State) -> list[Property]:
    """The `always` properties that fail in `state`."""
    return [p for p in ALWAYS if not p.holds(config, state)]


def check_always_after(config: Config, before: State, after: State) -> list[Property]:
    """The `always` properties that fail in `after`, given that all of them hold in `before`:
    the same as `check_always(config, after)`, looking only at what differs.

    States share the parts a step leaves alone, so "differs" is an identity test: a property
    whose `reads` are the very same objects in both states still holds, and a claim about each
    request (each page) is checked only for the requests (pages) whose state changed.
    """
    if len(before.requests) != len(after.requests) or len(before.pages) != len(after.pages):
        return check_always(config, after)
    changed = changed_positions(before.requests, after.requests)
    failed = []
    for prop in ALWAYS:
        if prop.reads and _unchanged(prop.reads, before, after):
            continue
        if prop.each_request is not None:
            claim = prop.each_request
            holds = all(claim(config, r, after.requests[r]) for r in changed)
        elif prop.each_page is not None:
            page_claim = prop.each_page
            pages = changed_positions(before.pages, after.pages)
            holds = all(page_claim(config, after.pages[i]) for i in pages)
        else:
            holds = prop.holds(config, after)
        if not holds:
            failed.append(prop)
    return failed


_PARTS: dict[tuple[str, ...], tuple[tuple[str, str], ...]] = {}


def _unchanged(reads: tuple[str, ...], before: State, after: State) -> bool:
    """Is every part in `reads` the same in both states?"""
    parts = _PARTS.get(reads)
    if parts is None:  # `reads` split into (State field, field of its items or "") pairs, once
        parts = _PARTS[reads] = tuple(
            (part.partition(".")[0], part.partition(".")[2]) for part in reads
        )
    for name, field in parts:
        old, new = getattr(before, name), getattr(after, name)
        if old is new:
            continue
        if not field:
            return False
        if hasattr(old, "_fields"):  # `ghost.FIELD`, `faults.FIELD`: a field of one record
            if getattr(old, field) != getattr(new, field):
                return False
            continue
        # `requests.FIELD` or `pages.FIELD`: that field of each request (page) that changed.
        for i in changed_positions(old, new):
            if getattr(old[i], field) != getattr(new[i], field):
                return False
    return True


# --- deployment ---------------------------------------------------------------------------------


def context_window_fits_pools(config: Config) -> bool:
    """Every prompt the router admits fits both pools and both admission limits."""
    return config.context_window <= min(
        config.prefill_pool_pages,
        config.decode_pages,
        config.prefill_max_prompt,
        config.decode_max_prompt,
    )


def prefill_admits_everything_decode_admits(config: Config) -> bool:
    """Any prompt decode would admit (within the window) prefill admits too, without substitution."""
    return min(config.context_window, config.decode_max_prompt) <= config.prefill_max_prompt


DEPLOYMENT: tuple[tuple[str, Callable[[Config], bool]], ...] = (
    ("context_window_fits_pools", context_window_fits_pools),
    ("prefill_admits_everything_decode_admits", prefill_admits_everything_decode_admits),
)
