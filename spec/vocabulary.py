"""The vocabulary of the handoff's state: every symbol a claim may read, declared once.

Each symbol has its sorts and its meaning, and here its concrete reading on a `State` (the
explorer's). `model_checker/logic_z3.py` gives the same symbols their Z3 readings: over the
fixed-configuration encoding's variables, and over the any-size model's uninterpreted functions.
A claim written with these symbols (`spec/invariants.py`) is therefore one object that every
checker evaluates; a symbol a reading lacks is named when it refuses a claim.

Sorts: requests `r`, decode pages `q`, prefill ranks `k` (a page is one shard per rank: with one
rank, the page itself), tenants (only compared). The names follow the state's fields (`spec/state.py`); where a symbol
summarises a field (a set of pages as a relation, a count), its meaning says how.
"""

from __future__ import annotations

from collections.abc import Callable

from kvhandoff.spec.logic import (
    BOOL,
    D_PHASE,
    DINST,
    INT,
    P_PHASE,
    PAGE,
    PINST,
    RANK,
    REQ,
    TENANT,
    PythonReading,
    Sort,
    Symbol,
    Term,
    Var,
    compile_python,
)
from kvhandoff.spec.state import PageState, ReqState, Tag


def _sym(name: str, args: tuple[Sort, ...], result: Sort, meaning: str) -> Symbol:
    return Symbol(name, args, result, meaning)


# --- the symbols ---------------------------------------------------------------------------------

submitted = _sym("submitted", (REQ,), BOOL, "the router has submitted request r")
answered = _sym("answered", (REQ,), BOOL, "the client got an answer for r (output or error)")
answered_ok = _sym("answered_ok", (REQ,), BOOL, "... and it is output, not an error")
not_as_is = _sym("not_as_is", (REQ,), BOOL, "some side did not admit r's prompt as sent")

p = _sym("p", (REQ,), P_PHASE, "prefill's phase for r")
p_gen = _sym("p_gen", (REQ,), INT, "the generation of the grant prefill holds for r (0: none)")
p_wrote = _sym("p_wrote", (REQ,), INT, "how many pages of its grant prefill has written")
p_grant_dinst = _sym(
    "p_grant_dinst",
    (REQ,),
    INT,
    "the decode instance that sent the grant prefill holds for r (its sender: 0 before any)",
)
p_epoch = _sym("p_epoch", (REQ,), INT, "decode's boot epoch r was sent to prefill with")
p_granted = _sym("p_granted", (REQ, PAGE), BOOL, "page q is in the grant prefill holds for r")
p_granted_count = _sym("p_granted_count", (REQ,), INT, "how many pages prefill's grant has")
p_written = _sym(
    "p_written", (REQ, PAGE), BOOL, "page q is among the first p_wrote pages of prefill's grant"
)
issued = _sym(
    "issued",
    (REQ, PAGE),
    BOOL,
    "prefill has issued the write of page q under its grant for r: counted as written, or in "
    "flight",
)
p_rank_done = _sym("p_rank_done", (REQ, RANK), BOOL, "rank k has sent r's completion")

d = _sym("d", (REQ,), D_PHASE, "decode's phase for r")
d_gen = _sym("d_gen", (REQ,), INT, "the generation decode granted r (0: none)")
d_holds = _sym("d_holds", (REQ, PAGE), BOOL, "decode holds page q for r")
d_awaiting_ack = _sym(
    "d_awaiting_ack", (REQ,), BOOL, "decode sent an abort and keeps r's pages until the drain ack"
)
d_rank = _sym("d_rank", (REQ, RANK), BOOL, "decode holds rank k's validated completion for r")
d_ack = _sym("d_ack", (REQ, RANK), BOOL, "decode holds rank k's drain ack for r (fenced release)")
read_done = _sym("read_done", (REQ,), BOOL, "decode has read r's pages and generated")
accepted_set = _sym("accepted_set", (REQ,), BOOL, "decode has accepted a completion for r")

owned = _sym("owned", (PAGE,), BOOL, "decode has granted page q to some request")
owner = _sym("owner", (PAGE,), REQ, "the request page q is granted to (when owned)")
owner_gen = _sym("owner_gen", (PAGE,), INT, "the generation page q is granted under")
shard_has = _sym("shard_has", (PAGE, RANK), BOOL, "rank k's shard of page q holds data")
shard_req = _sym("shard_req", (PAGE, RANK), REQ, "whose data it holds (ghost)")
shard_gen = _sym("shard_gen", (PAGE, RANK), INT, "... for which generation (ghost)")
shard_outside = _sym(
    "shard_outside",
    (PAGE, RANK),
    BOOL,
    "the shard holds data from outside the scenario (pull path: a reused source block)",
)

# What decode read when it generated, and what it accepted: ghost history the safety properties
# are about (`ReqState.read`, `ReqState.accepted_full`). The read is a sequence of shards, page by
# page; the vocabulary names it by page and rank, like the page it came from.
read_page = _sym("read_page", (REQ, PAGE), BOOL, "decode read page q for r when it generated")
read_has = _sym(
    "read_has", (REQ, PAGE, RANK), BOOL, "rank k's shard of page q held data when decode read it"
)
read_req = _sym("read_req", (REQ, PAGE, RANK), REQ, "... whose data it was (ghost)")
read_gen = _sym("read_gen", (REQ, PAGE, RANK), INT, "... for which generation (ghost)")
read_tenant = _sym(
    "read_tenant", (REQ, PAGE, RANK), TENANT, "... and the tenant it was written for (ghost)"
)
accepted_full = _sym(
    "accepted_full",
    (REQ,),
    BOOL,
    "when decode accepted r's completion, every granted page held r's own data (ghost; read "
    "only where accepted_set)",
)
tenant = _sym("tenant", (REQ,), TENANT, "the tenant request r belongs to (rigid: the config)")
late_landing = _sym(
    "late_landing",
    (),
    BOOL,
    "some write has landed in a page not owned by its own (room, generation) (ghost; once set, "
    "stays set)",
)

# What the witnesses read. A witness (`SOMETIMES` in spec/properties.py) names a state that must
# be reachable, so that a property holding only because nothing happens is caught. Most of what
# makes such a state interesting is *history*: a page granted again after being freed, an answer
# after a crash. A formula reads one state, so the spec keeps that history in monotone ghost flags
# (`spec.state.Ghost`), each set by the very step where the event happens and never cleared; the
# witness is then a one-state claim, "the flag is set", which every reading can check at one
# state of a path. (The any-size model keeps no such flags: its witness unrolling states the
# history over the path's earlier states instead; see model_checker/z3_witnesses.py.)
page_reuse = _sym("page_reuse", (), BOOL, "a freed page has been granted again (ghost; stays set)")
cross_tenant_reuse = _sym(
    "cross_tenant_reuse",
    (),
    BOOL,
    "a page granted to one tenant has later been granted to another (ghost; stays set)",
)
refused_write = _sym(
    "refused_write",
    (),
    BOOL,
    "decode's ownership check (or a revoked key) has refused a stale write (ghost; stays set)",
)
drain_acked = _sym(
    "drain_acked",
    (),
    BOOL,
    "an abort's drain ack has released a fenced reservation (ghost; stays set)",
)
scrubbed_written_page = _sym(
    "scrubbed_written_page",
    (),
    BOOL,
    "a page that held data has been zeroed on release (ghost; stays set)",
)
cancelled_mid_transfer = _sym(
    "cancelled_mid_transfer",
    (),
    BOOL,
    "a client has cancelled a request while its pages were being written (ghost; stays set)",
)
ok_after_crash = _sym(
    "ok_after_crash",
    (),
    BOOL,
    "some request got output after a crash had happened (ghost; stays set)",
)
ok_after_loss = _sym(
    "ok_after_loss",
    (),
    BOOL,
    "some request got output after a message had been lost (ghost; stays set)",
)
timeouts_spent = _sym(
    "timeouts_spent", (), INT, "how many timeouts the fault budget has spent so far"
)
# The language has no strings, so an answer's reason is not a term: the one reason a claim needs
# is a predicate of its own. (A finite sort of reasons, like the phases, would do too; one
# predicate keeps the vocabulary to what is read.)
timed_out_waiting = _sym(
    "timed_out_waiting",
    (REQ,),
    BOOL,
    "r's answer is the error 'timed out waiting for prefill' (decode gave up waiting)",
)
# Rigid, like `tenant`: a fact of the configuration, not of the state. It is a predicate rather
# than two numbers (the prompt's length and prefill's limit) because the any-size model has no
# lengths, only this comparison (its rigid `too_long_for_prefill`), and a claim written with the
# predicate is one it can read.
over_prefill_limit = _sym(
    "over_prefill_limit",
    (REQ,),
    BOOL,
    "r's prompt has more pages than prefill admits (rigid: the config)",
)

# What the guards of the protocol steps read (`spec/machine.py`, the `*_guard` formulas, one in
# each action's section). A guard reads only what the acting component knows: its own phase and
# counters, the messages it was handed, and the scenario's fixed limits.
p_len = _sym(
    "p_len", (REQ,), INT, "prefill's view of r's prompt length in pages (what it has data for)"
)
d_cancel = _sym("d_cancel", (REQ,), BOOL, "the router's word of r's cancel is on its way to decode")
p_cancel = _sym(
    "p_cancel", (REQ,), BOOL, "the router's word of r's cancel is on its way to prefill"
)
prefill_epoch = _sym("prefill_epoch", (PINST,), INT, "prefill instance i's boot epoch")
decode_seen_prefill_epoch = _sym(
    "decode_seen_prefill_epoch",
    (DINST, PINST),
    INT,
    "the epoch decode instance j last saw in prefill instance i's health check",
)
prefill_seen_decode_epoch = _sym(
    "prefill_seen_decode_epoch",
    (PINST, DINST),
    INT,
    "the epoch prefill instance i last saw in decode instance j's health check",
)
# Rigid facts of the scenario (`Config`), like `tenant` and `over_prefill_limit`: the guards of
# admission and submission compare the state with them.
prompt_pages = _sym("prompt_pages", (REQ,), INT, "how many pages r's prompt needs (rigid)")
over_decode_limit = _sym(
    "over_decode_limit",
    (REQ,),
    BOOL,
    "r's prompt has more pages than decode admits (rigid: the config)",
)
max_active = _sym(
    "max_active", (), INT, "how many requests the router lets be in progress at once (rigid)"
)
waits_for = _sym(
    "waits_for",
    (REQ, REQ),
    BOOL,
    "the router submits r only after q: the config submits in list order and q is just "
    "before r (rigid)",
)

# What the effects write (`spec/machine.py`, the `*_effect` formulas, one in each action's
# section) beyond what the claims read: the epoch a request reached decode with, the ghost record
# of which tenant last held a page (the witnesses' page reuse is about it), the fault counts an
# answer's ghost flags depend on, and the scenario's limits an effect applies.
d_epoch = _sym("d_epoch", (REQ,), INT, "prefill's boot epoch request r was sent to decode with")
page_used = _sym("page_used", (PAGE,), BOOL, "page q has been granted before (ghost)")
last_tenant = _sym(
    "last_tenant", (PAGE,), TENANT, "the tenant of the last request page q was granted to (ghost)"
)
crashes_spent = _sym("crashes_spent", (), INT, "how many crashes the fault budget has spent")
drops_spent = _sym("drops_spent", (), INT, "how many message losses the fault budget has spent")
over_context_window = _sym(
    "over_context_window",
    (REQ,),
    BOOL,
    "r's prompt has more pages than the router's context window (rigid: the config)",
)
truncated_len = _sym(
    "truncated_len",
    (),
    INT,
    "the prompt length prefill keeps when it truncates: its limit, at least one page (rigid)",
)

# What the faults read and write: their budgets (each fault is within its own budget and the total
# one; `spec/machine.py` spends it in the fault's effect), the room a request was given, and the
# pull path's lease.
cancels_spent = _sym("cancels_spent", (), INT, "how many client cancels the budget has spent")
prefill_aborts_spent = _sym(
    "prefill_aborts_spent", (), INT, "how many prefill aborts the budget has spent"
)
duplicates_spent = _sym("duplicates_spent", (), INT, "how many duplicates the budget has spent")
partitions_spent = _sym(
    "partitions_spent",
    (),
    INT,
    "how many partitions (decode taking a live prefill for dead) the budget has spent",
)
write_errors_spent = _sym(
    "write_errors_spent",
    (),
    INT,
    "how many failed page writes (prefill failing a transfer mid-flight) the budget has spent",
)
faults_spent = _sym("faults_spent", (), INT, "how many faults of any kind have happened")
max_faults = _sym("max_faults", (), INT, "how many faults a run may have in all (rigid)")
max_drops = _sym("max_drops", (), INT, "how many message losses a run may have (rigid)")
max_duplicates = _sym(
    "max_duplicates", (), INT, "how many duplicated messages a run may have (rigid)"
)
max_crashes = _sym("max_crashes", (), INT, "how many crashes a run may have (rigid)")
max_timeouts = _sym("max_timeouts", (), INT, "how many timeouts a run may have (rigid)")
max_cancels = _sym("max_cancels", (), INT, "how many client cancels a run may have (rigid)")
max_prefill_aborts = _sym(
    "max_prefill_aborts", (), INT, "how many prefill aborts a run may have (rigid)"
)
max_partitions = _sym(
    "max_partitions",
    (),
    INT,
    "how many partitions in which decode takes a live prefill for dead a run may have (rigid)",
)
max_write_errors = _sym(
    "max_write_errors",
    (),
    INT,
    "how many page writes may fail on prefill's side mid-transfer in a run (rigid)",
)
room = _sym("room", (REQ,), INT, "the room the router gave request r (rigid)")
pending_ack = _sym(
    "pending_ack",
    (REQ,),
    BOOL,
    "prefill owes decode a drain ack for an abort of r's grant (once its writes have drained)",
)
pending_ack_gen = _sym(
    "pending_ack_gen", (REQ,), INT, "... the generation of that grant (read where pending_ack)"
)
p_acked = _sym(
    "p_acked",
    (REQ, RANK),
    BOOL,
    "prefill rank k has sent its drain ack for the abort prefill owes r (several ranks only)",
)
p_lease_expired = _sym(
    "p_lease_expired",
    (REQ,),
    BOOL,
    "pull path: the lease on prefill's pinned source blocks for r ran out (they may be reused)",
)

# What a client's retry reads and writes (`router_retry_request`): its own budget, apart from the
# faults' (a retry is client behaviour, not a fault), and the answer it withdraws: `answered` is
# the one derived-looking symbol an effect may assign, and only to false (the client's error for
# the first attempt is set aside so that the second attempt's answer is checked afresh).
retries_spent = _sym("retries_spent", (), INT, "how many client retries the run has spent")
max_retries = _sym("max_retries", (), INT, "how many client retries a run may have (rigid)")
attempt = _sym(
    "attempt",
    (REQ,),
    INT,
    "the router's attempt number for request r (0; 1 after a retry), handed to both workers and "
    "carried by every message about r",
)

next_gen = _sym(
    "next_gen",
    (DINST,),
    INT,
    "decode instance i's generation counter (persists across restarts; with one instance, i is 0)",
)

# Instances (`Config.prefill_instances`, `Config.decode_instances`; see spec/state.py,
# "Instances"). Where the router placed a request, and which decode instance a page belongs to,
# are the scenario's (rigid). An instance is a number 0, 1, 2: only compared, and used to pick a
# decode instance's generation counter. With one instance of each, every one of these is 0.
d_inst = _sym("d_inst", (REQ,), INT, "the decode instance the router placed r on (rigid)")
p_inst = _sym("p_inst", (REQ,), INT, "the prefill instance the router placed r on (rigid)")
page_inst = _sym(
    "page_inst", (PAGE,), INT, "the decode instance whose pool page q is part of (rigid)"
)
p_dinst = _sym(
    "p_dinst",
    (REQ,),
    INT,
    "the decode instance prefill's transfer for r goes to: the one that sent the grant it "
    "holds (p_grant_dinst), or before any grant the one the router placed r on",
)
decode_epoch = _sym("decode_epoch", (DINST,), INT, "decode instance j's boot epoch")
prefill_ranks = _sym("prefill_ranks", (), INT, "how many prefill ranks write each page")
drain_fence = _sym(
    "drain_fence", (), BOOL, "the design fences release on prefill's drain ack (rigid)"
)

SYMBOLS: tuple[Symbol, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Symbol))


# --- the concrete reading ------------------------------------------------------------------------
# Each symbol as Python source over the state `S` and the config `C` (see `PythonReading`).

_REQ = "S.requests[{0}]"
_SHARD = "_shard(S.pages[{0}], {1})"
_READ = "_read_shard(S.requests[{0}], {1}, {2}, C.prefill_ranks)"


def _shard(page: PageState, k: int) -> Tag | None:
    if k == 0:
        return page.content  # `shards` begins with it (without building the tuple)
    shards = page.shards
    return shards[k] if k < len(shards) else None


def _read_pages(req: ReqState, ranks: int) -> tuple[int, ...] | range:
    """The pages decode read for a request, in order. The state keeps the read as a sequence of
    shards (`ReqState.read`, `ranks` per page); while decode holds the pages they are the pages
    it read (`decode_generate` reads `d_pages` in order, and they change only when released).
    Once released, only the sequence matters: it is placed on the first pages, as the Z3
    encoding does (`Encoding.abstract`)."""
    if req.read is None:
        return ()
    return req.d_pages or range(len(req.read) // ranks)


def _read_shard(req: ReqState, q: int, k: int, ranks: int) -> Tag | None:
    """Rank k's shard of page q as decode read it for `req` (None: empty, or not read)."""
    pages = _read_pages(req, ranks)
    if req.read is None or q not in pages:
        return None
    return req.read[pages.index(q) * ranks + k]


CONCRETE = PythonReading(
    symbols={
        "submitted": _REQ + ".submitted",
        "answered": _REQ + ".answer is not None",
        "answered_ok": f"{_REQ}.answer is not None and {_REQ}.answer.ok",
        "not_as_is": _REQ + ".not_as_is",
        "p": _REQ + ".p",
        "p_gen": _REQ + ".p_gen",
        "p_wrote": _REQ + ".p_wrote",
        "p_epoch": _REQ + ".p_epoch",
        "p_grant_dinst": _REQ + ".p_grant_dinst",
        "p_granted": "{1} in " + _REQ + ".p_pages",
        "p_granted_count": "len(" + _REQ + ".p_pages)",
        "p_written": "{1} in " + _REQ + ".p_pages[: " + _REQ + ".p_wrote]",
        "issued": "{1} in "
        + _REQ
        + ".p_pages[: "
        + _REQ
        + ".p_wrote] or any(w.data.request == {0} and w.page == {1} for w in S.writes)",
        "p_rank_done": "{1} in " + _REQ + ".p_ranks_done",
        "d": _REQ + ".d",
        "d_gen": _REQ + ".d_gen",
        "d_holds": "{1} in " + _REQ + ".d_pages",
        "d_awaiting_ack": _REQ + ".d_awaiting_ack",
        "d_rank": "{1} in " + _REQ + ".d_ranks",
        "d_ack": "{1} in " + _REQ + ".d_acks",
        "read_done": _REQ + ".read is not None",
        "accepted_set": _REQ + ".accepted_full is not None",
        "owned": "S.pages[{0}].owner is not None",
        "owner": "S.pages[{0}].owner[0]",
        "owner_gen": "S.pages[{0}].owner[1]",
        "shard_has": _SHARD + " is not None",
        "shard_req": "getattr(" + _SHARD + ", 'request', 0)",
        "shard_gen": "getattr(" + _SHARD + ", 'generation', 0)",
        "shard_outside": "getattr(" + _SHARD + ", 'request', 0) == -1",
        "read_page": "{1} in _read_pages(" + _REQ + ", C.prefill_ranks)",
        "read_has": _READ + " is not None",
        "read_req": "getattr(" + _READ + ", 'request', 0)",
        "read_gen": "getattr(" + _READ + ", 'generation', 0)",
        "read_tenant": "getattr(" + _READ + ", 'tenant', None)",
        "accepted_full": _REQ + ".accepted_full is True",
        "tenant": "C.requests[{0}].tenant",
        "late_landing": "S.ghost.late_landing",
        "page_reuse": "S.ghost.page_reuse",
        "cross_tenant_reuse": "S.ghost.cross_tenant_reuse",
        "refused_write": "S.ghost.refused_write",
        "drain_acked": "S.ghost.drain_acked",
        "scrubbed_written_page": "S.ghost.scrubbed_written_page",
        "cancelled_mid_transfer": "S.ghost.cancelled_mid_transfer",
        "ok_after_crash": "S.ghost.ok_after_crash",
        "ok_after_loss": "S.ghost.ok_after_loss",
        "timeouts_spent": "S.faults.timeouts",
        "timed_out_waiting": f"{_REQ}.answer is not None"
        f" and {_REQ}.answer.reason == 'timed out waiting for prefill'",
        "over_prefill_limit": "C.requests[{0}].pages > C.prefill_max_prompt",
        "p_len": _REQ + ".p_len",
        "d_cancel": _REQ + ".d_cancel",
        "p_cancel": _REQ + ".p_cancel",
        "prefill_epoch": "(S.prefill_epoch if ({0}) == 0 else S.prefill_epochs[({0}) - 1])",
        "decode_seen_prefill_epoch": "(S.decode_sees_prefill_epoch if ({0}) == 0 and ({1}) == 0"
        " else S.decode_sees_prefill_epochs[({0}) * C.prefill_instances + ({1}) - 1])",
        "prefill_seen_decode_epoch": "(S.prefill_sees_decode_epoch if ({0}) == 0 and ({1}) == 0"
        " else S.prefill_sees_decode_epochs[({0}) * C.decode_instances + ({1}) - 1])",
        "prompt_pages": "C.requests[{0}].pages",
        "over_decode_limit": "C.requests[{0}].pages > C.decode_max_prompt",
        "max_active": "C.max_active",
        "waits_for": "C.submit_in_order and {1} == {0} - 1",
        "d_epoch": _REQ + ".d_epoch",
        "page_used": "S.pages[{0}].last_tenant is not None",
        "last_tenant": "S.pages[{0}].last_tenant",
        "crashes_spent": "S.faults.crashes",
        "drops_spent": "S.faults.drops",
        "over_context_window": "C.requests[{0}].pages > C.context_window",
        "truncated_len": "max(1, C.prefill_max_prompt)",
        "cancels_spent": "S.faults.cancels",
        "prefill_aborts_spent": "S.faults.prefill_aborts",
        "duplicates_spent": "S.faults.duplicates",
        "partitions_spent": "S.faults.partitions",
        "write_errors_spent": "S.faults.write_errors",
        "faults_spent": "S.faults.total",
        "max_faults": "C.max_faults",
        "max_crashes": "C.max_crashes",
        "max_drops": "C.max_drops",
        "max_duplicates": "C.max_duplicates",
        "max_timeouts": "C.max_timeouts",
        "max_cancels": "C.max_cancels",
        "max_prefill_aborts": "C.max_prefill_aborts",
        "max_partitions": "C.max_partitions",
        "max_write_errors": "C.max_write_errors",
        "room": "C.requests[{0}].room",
        "pending_ack": "any(a[2] == {0} for a in S.pending_acks)",
        "pending_ack_gen": "next((a[1] for a in S.pending_acks if a[2] == {0}), 0)",
        "p_acked": "(C.requests[{0}].room, next((a[1] for a in S.pending_acks if a[2] == {0}), 0),"
        " {1}) in S.acked_ranks",
        "p_lease_expired": _REQ + ".p_lease_expired",
        "retries_spent": "S.faults.retries",
        "max_retries": "C.max_retries",
        "attempt": _REQ + ".attempt",
        "next_gen": "(S.next_generation if {0} == 0 else S.next_generations[{0} - 1])",
        "d_inst": "C.requests[{0}].decode_instance",
        "p_inst": "C.requests[{0}].prefill_instance",
        "page_inst": "({0} * C.decode_instances // C.decode_pages)",
        # With one decode instance there is one answer, whatever prefill holds: the reading
        # says so first, and reads nothing of the request (the explorer relies on it:
        # `model_checker.reduction.erasable_prefill_fields`).
        "p_dinst": "(0 if C.decode_instances == 1 else "
        + _REQ
        + ".p_grant_dinst if "
        + _REQ
        + ".p_gen else C.requests[{0}].decode_instance)",
        "decode_epoch": "(S.decode_epoch if ({0}) == 0 else S.decode_epochs[({0}) - 1])",
        "prefill_ranks": "C.prefill_ranks",
        "drain_fence": "DRAIN",
    },
    fields={
        "message": {
            "req": "{0}.request",
            "gen": "{0}.generation",
            "epoch": "{0}.epoch",
            "rank": "{0}.rank",
            "rank_done": "{0}.rank in S.requests[{0}.request].p_ranks_done",
            "has_page": "{1} in {0}.pages",
            # The digest covers page q with the sender's data (its request and generation): a
            # digest over other data (a forged one) covers no page.
            "digest_page": "({1}, {0}.request, {0}.generation) in ({0}.digest or ())",
            "room": "{0}.room",
            "count": "{0}.count",
            "has_digest": "{0}.digest is not None",
            "attempt": "{0}.attempt",
            "dinst": "{0}.dinst",
            "reason_is": "{0}.reason == {1}",
        },
        "write": {
            "req": "{0}.data.request",
            "page": "{0}.page",
            "gen": "{0}.generation",
            "data_gen": "{0}.data.generation",
            "epoch": "{0}.epoch",
            "right_room": "{0}.room == C.requests[{0}.data.request].room",
            "right_tenant": "{0}.data.tenant == C.requests[{0}.data.request].tenant",
            "rank": "{0}.rank",
            "rank_acked": "({0}.room, {0}.generation, {0}.rank) in S.acked_ranks",
            "room": "{0}.room",
        },
        "pending_ack": {"req": "{0}[2]", "gen": "{0}[1]"},
    },
    domains={REQ: "_reqs", PAGE: "_pages", RANK: "_ranks"},
    in_flight={
        "message": "[m for m in S.network + S.lost if m.kind in {kinds}]",
        "write": "S.writes",
        "pending_ack": "S.pending_acks",
    },
    prelude=(
        "_reqs = range(len(S.requests))\n"
        "_pages = range(len(S.pages))\n"
        "_ranks = range(C.prefill_ranks)"
    ),
)


def compile_claim(
    claim: Term, name: str = "claim", params: tuple[Var, ...] = ()
) -> Callable[..., bool]:
    """The claim as a Python function `(state, config, drain_fence, *params) -> bool`."""
    fn = compile_python(claim, CONCRETE, name, params)
    fn.__globals__.update(_shard=_shard, _read_pages=_read_pages, _read_shard=_read_shard)
    return fn
