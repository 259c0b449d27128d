"""A catalogue of realistic single-bug mutants of `impl/`: the conformance suite's mutation score.

Each mutant is one bug an engine team could plausibly write, given as exact text replacements in
files of the implementation. `apply_to(root)` rewrites a *copy* of the tree (never the tree
itself, see `benchmarks/conformance_mutation.py`); a replacement whose old text does not occur
exactly once fails loudly (`PatchMismatch`), so the catalogue cannot silently go stale when
`impl/` changes: `tests/conformance/test_mutation_catalogue.py` applies every mutant to a copy of
the current tree.

`where` says which code the bug lives in: `core` (the sans-I/O protocol cores, run by both the
in-process and the gRPC target) or `edge` (the gRPC servers, the torch pool: only the gRPC target
runs that code, so the in-process target cannot kill such a mutant by construction).

`conform_args` are what the campaign needs to reach the mutant's code at all, passed to
`kvhandoff conform` before any arguments of the run (`--max-retries 1` for a bug in the handling
of a client's retry, which the default campaign, without retries, never plays).

`equivalent` argues, for a mutant that no conformance run can kill because it does not change any
behaviour the spec constrains, why that is so. Such mutants stay in the table (the score counts
them as surviving); they are argued here rather than dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


class PatchMismatch(ValueError):
    """A mutant's old text does not occur exactly once in its file (the tree moved on)."""


@dataclass(frozen=True)
class Edit:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    edits: tuple[Edit, ...]
    where: str = "core"
    equivalent: str = ""
    tags: tuple[str, ...] = field(default=())
    conform_args: tuple[str, ...] = field(default=())

    def apply_to(self, root: Path) -> None:
        """Rewrite the files under `root` (a copy of the repository)."""
        for edit in self.edits:
            path = root / edit.path
            text = path.read_text()
            count = text.count(edit.old)
            if count != 1:
                raise PatchMismatch(
                    f"mutant {self.name}: the text to replace occurs {count} times in "
                    f"{edit.path} (expected exactly 1): {edit.old[:80]!r}"
                )
            path.write_text(text.replace(edit.old, edit.new))


def _m(
    name: str,
    bug: str,
    path: str,
    old: str,
    new: str,
    *,
    where: str = "core",
    equivalent: str = "",
    conform_args: tuple[str, ...] = (),
) -> Mutant:
    return Mutant(name, bug, (Edit(path, old, new),), where, equivalent, conform_args=conform_args)


DECODE = "impl/core/decode.py"
PREFILL = "impl/core/prefill.py"
ROUTER = "impl/core/router.py"
COMMON = "impl/core/common.py"

MUTANTS: tuple[Mutant, ...] = (
    # ------------------------------------------------------------------ decode: writes
    _m(
        "late_write_of_released_generation_stored",
        "a write of a released generation is stored into the (possibly reallocated) page instead "
        "of being refused: the reference fence forgotten on one path",
        DECODE,
        "if tomb is not None and self._b.late_writes_land and ev.page_id in tomb.pages:",
        "if tomb is not None and ev.page_id in tomb.pages:",
    ),
    _m(
        "write_page_digest_not_checked",
        "decode compares the claimed per-page digest with itself, not with the digest of the "
        "bytes received: corrupted page data is accepted",
        DECODE,
        "if checks_digest and not hmac.compare_digest(ev.data_digest, ev.claimed_digest):",
        "if checks_digest and not hmac.compare_digest(ev.claimed_digest, ev.claimed_digest):",
    ),
    _m(
        "write_token_not_checked",
        "decode only checks that a write carries some capability token, not the grant's",
        DECODE,
        "        if not hmac.compare_digest(ev.token, req.token):\n            return refuse(",
        "        if not ev.token:\n            return refuse(",
    ),
    _m(
        "write_room_not_checked",
        "decode does not compare a write's room with the request's room",
        DECODE,
        "        if ev.room != req.room:\n            return refuse(",
        "        if ev.room != req.room and not ev.room:\n            return refuse(",
    ),
    _m(
        "write_page_ownership_not_checked",
        "decode checks that the written page is owned by someone, not by this request",
        DECODE,
        "if PageId(ev.page_id) not in req.pages:",
        "if PageId(ev.page_id) not in self._owner:",
    ),
    _m(
        "write_accepted_while_releasing",
        "decode stores writes of a request it is already releasing (waiting for the abort's ack)",
        DECODE,
        "releasing_but_lands = req.state is RequestState.RELEASING and self._b.late_writes_land",
        "releasing_but_lands = req.state is RequestState.RELEASING",
        equivalent=(
            "the spec lets a write land in a page that a failed request still owns (its receive "
            "step checks the page's owner, not the request's phase): nothing reads those pages, and "
            "release scrubs them; the implementation's RELEASING is the spec's failed-not-yet-"
            "released, so storing such a write is a behaviour of the reference protocol"
        ),
    ),
    # ------------------------------------------------------------------ decode: completion
    _m(
        "completion_digest_not_compared",
        "decode compares only the length of the completion digest with the expected one",
        DECODE,
        "if not hmac.compare_digest(expected, ev.digest):",
        "if len(expected) != len(ev.digest):",
    ),
    _m(
        "completion_page_count_not_checked",
        "decode refuses a completion that claims too many pages but not one that claims too few",
        DECODE,
        "if ev.page_count != len(req.pages):",
        "if ev.page_count > len(req.pages):",
    ),
    _m(
        "completion_token_not_checked",
        "decode does not check the completion's capability token",
        DECODE,
        "if identity_checked and not hmac.compare_digest(ev.token, req.token):",
        "if identity_checked and not ev.token:",
    ),
    _m(
        "completion_generation_not_checked",
        "decode does not check that a completion is for the request's current generation",
        DECODE,
        "if identity_checked and ev.generation != req.generation:",
        "if identity_checked and ev.generation < 0:",
    ),
    _m(
        "completion_room_not_checked",
        "decode does not compare a completion's room with the request's room",
        DECODE,
        "        if ev.room != req.room:\n            return ignore(",
        "        if ev.room != req.room and not ev.room:\n            return ignore(",
    ),
    # ------------------------------------------------------------------ decode: release
    _m(
        "pages_not_zeroed",
        "decode logs a scrubbed release but never zeroes the pages",
        DECODE,
        "            ReleasePages(req.pages, scrub),",
        "            ReleasePages(req.pages, False),",
    ),
    _m(
        "abort_acked_without_release",
        "decode takes the abort's ack but forgets to release the fenced pages",
        DECODE,
        '            cmds += self._release(req, "drained")',
        "            pass",
    ),
    _m(
        "double_release_on_stale_ack",
        "an abort ack for an already released generation frees its pages a second time, even "
        "though they may belong to another request by now",
        DECODE,
        "        req = self._requests.get(ev.request_id)\n"
        "        if (\n"
        "            req is None\n"
        "            or req.generation != ev.generation\n"
        "            or req.room != ev.room\n",
        "        req = self._requests.get(ev.request_id)\n"
        "        tomb = self._released.get((ev.request_id, ev.generation))\n"
        "        if req is None and tomb is not None:\n"
        "            self._free.update(tomb.pages)\n"
        "        if (\n"
        "            req is None\n"
        "            or req.generation != ev.generation\n"
        "            or req.room != ev.room\n",
    ),
    _m(
        "release_before_drain",
        "decode releases an aborted request's pages at once instead of waiting for prefill's "
        "writes to drain",
        DECODE,
        "        if self._b.release_before_drain:\n            return [abort, *self._release(",
        "        if True:\n            return [abort, *self._release(",
        equivalent=(
            "the reference protocol fences release by generation, not by prefill's ack (the spec's "
            "decode releases a failed request at once): a write of the released generation that "
            "arrives later is refused on receipt, because decode keeps the released (request, "
            "generation) and checks every write against the current owner; only the one-sided "
            "designs (m7, m8) need the drain"
        ),
    ),
    # ------------------------------------------------------------------ decode: admission
    _m(
        "decode_limit_off_by_one",
        "decode refuses a prompt of exactly its limit",
        DECODE,
        "elif ev.prompt_len > self.config.max_prompt_tokens:",
        "elif ev.prompt_len >= self.config.max_prompt_tokens:",
    ),
    _m(
        "page_count_rounded_down",
        "pages_for rounds down: a prompt that is not a whole number of pages gets one page too few",
        COMMON,
        "return math.ceil(tokens / page_size)",
        "return max(1, tokens // page_size)",
    ),
    # ------------------------------------------------------------------ decode: recovery
    _m(
        "restarted_prefill_writing_requests_not_failed",
        "when prefill restarts, decode fails only the requests that had no write yet: one with "
        "writes in flight keeps waiting for a completion that never comes",
        DECODE,
        "if req.prefill_epoch is None or req.prefill_epoch == new_epoch:",
        "if req.prefill_epoch is None or req.prefill_epoch == new_epoch or req.written:",
    ),
    _m(
        "grant_holder_epoch_not_recorded",
        "decode forgets which prefill epoch holds a grant, so a prefill restart fails none of "
        "its requests",
        DECODE,
        "            req.prefill_epoch = ev.prefill_epoch",
        "            pass",
    ),
    _m(
        "stale_attempt_notice_taken",
        "decode takes prefill's failure notice whatever attempt it names: a retried request's "
        "first-attempt notice, late, fails the retry (the spec's attempt fence on notices)",
        DECODE,
        "        if req is not None and req.attempt != ev.attempt:\n"
        "            # A notice of another attempt",
        "        if False and req is not None and req.attempt != ev.attempt:\n"
        "            # A notice of another attempt",
        conform_args=("--max-retries", "1"),
    ),
    _m(
        "partition_heal_not_noticed",
        "once decode has taken prefill for dead, a health check that answers again (a partition "
        "healed, the same boot epoch) does not bring it back: decode goes on releasing aborted "
        "requests' pages at once, as if no write of theirs could still arrive, and cannot take "
        "prefill for dead again when the next partition comes",
        DECODE,
        "        peer.misses = 0\n        peer.dead = False\n",
        "        peer.misses = 0\n",
    ),
    _m(
        "suspected_prefill_requests_not_failed",
        "decode takes prefill for dead after missed health checks but fails none of the requests "
        "waiting on it: they wait for a completion that may never come (M15's hang, by another "
        "path)",
        DECODE,
        "        peer.dead = True\n"
        "        return self._fail_after_prefill_loss(\n"
        '            ev.prefill, peer.epoch, None, "prefill stopped answering health checks"\n'
        "        )\n",
        "        peer.dead = True\n        return []\n",
    ),
    # ------------------------------------------------------------------ prefill
    _m(
        "oversized_prompt_truncated",
        "prefill silently truncates a prompt over its limit instead of rejecting it",
        PREFILL,
        "own_len, placeholder, truncated = ev.prompt_len, False, False",
        "own_len, placeholder, truncated = min(ev.prompt_len, limit), False, False\n"
        "        ev = SubmitRequest(ev.request_id, ev.tenant, ev.room, own_len, ev.now)",
    ),
    _m(
        "prefill_limit_off_by_one",
        "prefill rejects a prompt of exactly its limit",
        PREFILL,
        "        if ev.prompt_len > limit:",
        "        if ev.prompt_len >= limit:",
    ),
    _m(
        "completion_before_writes_landed",
        "prefill sends its completion as soon as the last page is put on the stream, before "
        "decode has accepted the writes",
        PREFILL,
        "        req.sent.append((ev.page_id, ev.digest))\n        return [",
        "        req.sent.append((ev.page_id, ev.digest))\n"
        "        assert req.grant is not None\n"
        "        if len(req.sent) == len(req.grant.pages) and not req.stop_reason:\n"
        "            return self._on_page_sent_last(ev)\n"
        "        return [",
    ),
    _m(
        "abort_acked_before_drain",
        "prefill acks decode's abort at once, while its writes are still in flight",
        PREFILL,
        '                    Log("prefill_receive_abort", {**args, "in_flight": True}),\n'
        "                    CancelWrites(req.request_id, ev.generation),",
        '                    Log("prefill_receive_abort", {**args, "in_flight": True}),\n'
        "                    ack,\n"
        "                    CancelWrites(req.request_id, ev.generation),",
        equivalent=(
            "decode's release is fenced by generation (see release_before_drain): an early ack lets "
            "decode release sooner, the writes still in flight are refused as writes of a released "
            "generation, and prefill's second ack (when its stream closes) matches nothing; the "
            "spec's reference decode needs no ack at all"
        ),
    ),
    _m(
        "grant_length_not_compared",
        "prefill does not compare the grant's length with its own view of the prompt",
        PREFILL,
        "if not (req.placeholder or req.truncated or self._b.local_completion_count):",
        "if False:",
        equivalent=(
            "an honest decode grants exactly pages_for(prompt) for the prompt the router gave both "
            "workers, so the grant always agrees with prefill's view in the reference; the spec's "
            "prefill takes any grant without comparing (a short or long grant is caught by decode's "
            "coverage and count checks), so only a forged grant could tell, and the spec requires "
            "no refusal of it"
        ),
    ),
    _m(
        "writes_in_reverse_order",
        "prefill writes the granted pages last to first",
        PREFILL,
        "targets = grant.pages[: min(own_pages, len(grant.pages))]",
        "targets = tuple(reversed(grant.pages[: min(own_pages, len(grant.pages))]))",
    ),
    _m(
        "completion_counts_granted_pages",
        "prefill's completion claims the granted page count rather than the pages it wrote",
        PREFILL,
        "count = len(grant.pages) if self._b.local_completion_count else len(pages)",
        "count = len(grant.pages)",
        equivalent=(
            "a completion is sent only after a write stream that closed OK, and a stream closes "
            "OK only when every granted page was written and accepted, so the written count "
            "always equals the granted one in the reference protocol; the two differ only in "
            "modes that write fewer pages than granted (M1, M6), which decode's coverage check "
            "then catches"
        ),
    ),
    _m(
        "prefill_failure_not_told_to_decode",
        "prefill answers the router with its failure but does not tell decode",
        PREFILL,
        "        if tell_decode and not self._b.silent_prefill_abort:",
        "        if tell_decode and not self._b.silent_prefill_abort and status is Status.OK:",
        equivalent=(
            "the router relays every error answer of prefill to decode while decode's result is "
            "pending (the reference's second path for prefill's notice), and when the router has "
            "already answered (a client cancel) it has already withdrawn the request from decode; "
            "decode therefore fails the request on every path, and the spec's mapping explains the "
            "router's relay as decode_receive_failure"
        ),
    ),
    _m(
        "abort_matched_by_request_id_only",
        "prefill takes an abort by request id alone, whatever attempt it names: a retried "
        "request's first-attempt abort, still in flight when the client retried, stops the retry "
        "while it waits for its grant (the spec's retry_reuses_request_id, attempt_fence off)",
        PREFILL,
        "        newer = self._stale(ev.request_id, ev.attempt)\n"
        "        if newer is not None:\n"
        "            # An abort of another attempt",
        "        newer = None  # the abort's attempt is not compared\n"
        "        if newer is not None:\n"
        "            # An abort of another attempt",
        conform_args=("--max-retries", "1"),
    ),
    # ------------------------------------------------------------------ router
    _m(
        "retry_keeps_the_attempt_number",
        "the router hands a client's retry to the workers under the failed attempt's number, so "
        "they cannot tell the retry's messages from the first attempt's",
        ROUTER,
        "            attempt, room = failed.attempt + 1, failed.room",
        "            attempt, room = failed.attempt, failed.room",
        conform_args=("--max-retries", "1"),
    ),
    _m(
        "router_window_off_by_one",
        "the router refuses a prompt of exactly the context window",
        ROUTER,
        "elif ev.prompt_len > self.config.context_window:",
        "elif ev.prompt_len >= self.config.context_window:",
    ),
    _m(
        "router_cancel_not_forwarded_to_decode",
        "a client cancel is answered but never forwarded to decode",
        ROUTER,
        "        if req.decode is None:\n"
        "            cmds.append(AbortAtDecode(req.request_id, ev.reason, req.attempt))",
        "        if req.decode is None:\n            pass",
    ),
    # ------------------------------------------------------------------ edge (gRPC servers only)
    _m(
        "edge_pages_not_zeroed",
        "the decode server skips zeroing the torch pages of a scrubbed release",
        "impl/servers/decode.py",
        "                    if cmd.scrub:\n                        self.pool.scrub(cmd.pages)",
        "                    if cmd.scrub:\n                        pass",
        where="edge",
    ),
    _m(
        "edge_write_digest_trusted",
        "the decode server takes a page's digest from the message instead of hashing the bytes",
        "impl/servers/decode.py",
        'page_digest(data[i * page_bytes : (i + 1) * page_bytes]) if not problem else b""',
        '(msg.digests[i] if i < len(msg.digests) else b"") if not problem else b""',
        where="edge",
    ),
)

# The helper the completion-before-writes mutant calls: prefill's own completion path, entered
# from the last PageSent. Added with that mutant (a second edit at the end of the class).
_LAST_PAGE_HELPER = (
    "    def _on_page_sent_last(self, ev: PageSent) -> list[PrefillCommand]:\n"
    "        req = self._current(ev.request_id, ev.generation)\n"
    "        grant = req.grant\n"
    "        assert grant is not None\n"
    "        log: list[PrefillCommand] = [\n"
    "            Log(\n"
    '                "prefill_write_page",\n'
    "                {\n"
    '                    "request_id": ev.request_id,\n'
    '                    "room": req.room,\n'
    '                    "generation": ev.generation,\n'
    '                    "page": ev.page_id,\n'
    '                    "index": ev.index,\n'
    '                    "message_id": ev.message_id,\n'
    '                    "digest": ev.digest.hex(),\n'
    "                },\n"
    "            )\n"
    "        ]\n"
    "        done = self._on_writes_finished(WritesFinished(ev.request_id, ev.generation, Status.OK))\n"
    '        req.stop_reason = "completed_early"\n'
    "        return log + done\n"
    "\n"
    "    def _on_writes_finished(self, ev: WritesFinished) -> list[PrefillCommand]:\n"
    "        req = self._requests.get(ev.request_id)\n"
    '        if req is None or req.stop_reason == "completed_early":\n'
    "            return []\n"
    "        return self._on_writes_finished_orig(ev)\n"
    "\n"
    "    def _on_writes_finished_orig(self, ev: WritesFinished) -> list[PrefillCommand]:\n"
)


def _with_helper(mutants: tuple[Mutant, ...]) -> tuple[Mutant, ...]:
    out = []
    for m in mutants:
        if m.name == "completion_before_writes_landed":
            m = Mutant(
                m.name,
                m.bug,
                (
                    *m.edits,
                    Edit(
                        PREFILL,
                        "    def _on_writes_finished(self, ev: WritesFinished) -> "
                        "list[PrefillCommand]:\n",
                        _LAST_PAGE_HELPER,
                    ),
                ),
                m.where,
                m.equivalent,
                m.tags,
                m.conform_args,
            )
        out.append(m)
    return tuple(out)


MUTANTS = _with_helper(MUTANTS)
BY_NAME = {m.name: m for m in MUTANTS}

__all__ = ["BY_NAME", "MUTANTS", "Edit", "Mutant", "PatchMismatch"]
