"""The mapping between implementation events and spec actions, as one table of data.

Each row says: an event kind the implementation logs (or the harness logs for a fault it injected),
the spec action(s) that explain it, how their fields correspond, and when the event is a *stutter*
(a step of the implementation with no spec counterpart, accepted only when the spec state already
shows its effect). Spec steps the implementation never logs are listed in `UNLOGGED_SPEC_STEPS`.
`conformance.validate` has exactly one matcher per row (a test checks it), in the style of TLA+
trace validation (ewd998, CCF's Traceccfraft): a trace is accepted only if every line matches.

Ids are mapped, never compared raw: `request_id` -> spec request index (order of the router's
submissions), impl `generation` (`boot << 32 | counter`) -> spec generation (bound when decode
reserves), impl `room` -> the room of that request in the config; page ids are equal on both sides
(both allocate the lowest free pages first); token lengths -> pages through `page_size`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvhandoff.conformance.registry import unlogged


@dataclass(frozen=True)
class Row:
    event: str
    server: str
    spec: str
    fields: str
    note: str = ""


MAPPING: tuple[Row, ...] = (
    Row(
        "router_submit_request",
        "router",
        "router_submit_request",
        "request_id->request, prompt_tokens/page_size->pages, tenant, room",
    ),
    Row(
        "router_retry_request",
        "router",
        "router_retry_request",
        "request_id->request (the same id, tenant and room as the failed attempt), attempt->the "
        "spec request's attempt",
        "a client's retry after an error answer (`GenerateRequest.retry`); every later line "
        "about the request names its attempt (logged only when nonzero), and a message of the "
        "first attempt that a worker drops is logged with outcome stale_attempt",
    ),
    Row(
        "router_reject_request",
        "router",
        "router_submit_request (prompt over the window: answered with an error)",
        "request_id->request; the spec answer must be an error",
    ),
    Row(
        "router_receive_prefill_result",
        "router",
        "stutter",
        "-",
        "router bookkeeping; no spec counterpart",
    ),
    Row(
        "router_receive_decode_result",
        "router",
        "stutter",
        "-",
        "router bookkeeping; no spec counterpart",
    ),
    Row(
        "client_cancel_request",
        "router",
        "client_cancel_request | stutter",
        "request_id->request",
        "the router answers the client at once; its word reaches decode later "
        "(decode_receive_cancel). A stutter once decode has answered (the router was still "
        "waiting for prefill's result)",
    ),
    Row(
        "router_answer_client",
        "router",
        "stutter (checks the answer)",
        "status ok/error == spec answer.ok",
        "accepted only once the spec has answered the request the same way: no answer where the "
        "spec says error, and no answer before the spec's decode_answer. Two granularity "
        "allowances: a CANCELLED answer after a client cancel that came once decode had answered "
        "(the router still waited for prefill; fail closed), and an error from a broken call to "
        "a crashed prefill = decode_detect_prefill_restart observed by the router first",
    ),
    Row("prefill_restart", "prefill", "prefill_restart", "boot_epoch -> prefill_epoch"),
    Row(
        "prefill_admit_request",
        "prefill",
        "prefill_admit_request | prefill_reject_request",
        "request_id; pages_for(prompt_tokens) == the request's pages; truncated_to -> "
        "prefill_reject_request whose p_len == pages_for(truncated_to)",
        "a truncated admission (m6) is the spec's answer to an over-limit prompt, explained only "
        "where the protocol truncates (never by the reference); a stutter when the spec's prefill "
        "lost the request in a crash (the router's hand-over was in flight across the restart)",
    ),
    Row(
        "prefill_reject_request",
        "prefill",
        "prefill_reject_request",
        "request_id; placeholder",
        "the placeholder path (m1) is matched to the reference rejection, so a later write for "
        "the request is the first unexplained event",
    ),
    Row(
        "prefill_receive_grant",
        "prefill",
        "prefill_receive_grant | stutter",
        "request_id, generation, pages == grant message; outcome parked/refused/dropped/matched",
        "`matched` after `parked` is a stutter (the spec paired them at the first receipt)",
    ),
    Row(
        "prefill_write_page",
        "prefill",
        "prefill_write_page",
        "request_id, generation, page == p_pages[p_wrote]",
    ),
    Row(
        "prefill_send_completion",
        "prefill",
        "prefill_send_completion",
        "request_id, generation, pages_written == pages written; page_count and the digest's "
        "presence == the spec's completion message",
        "page_count is what the completion claims: the whole grant under M2; an empty digest is "
        "no digest (M5)",
    ),
    Row(
        "prefill_receive_abort",
        "prefill",
        "prefill_receive_abort | stutter",
        "request_id, generation",
        "stutter when prefill's part of the request already ended",
    ),
    Row(
        "prefill_cancel_request",
        "prefill",
        "prefill_receive_cancel | prefill_receive_abort | stutter",
        "request_id",
        "the client's cancel reaching prefill; the router's withdrawal on a decode failure is "
        "decode's abort by another path (decode_receive_cancel taken silently first when a "
        "writing prefill stops on the client's cancel before decode's log shows it)",
    ),
    Row(
        "prefill_drop_orphan_grant",
        "prefill",
        "stutter",
        "request_id",
        "accepted only when prefill's part of the request already ended",
    ),
    Row(
        "prefill_finish_request",
        "prefill",
        "stutter | prefill_abort_request | prefill_write_error",
        "request_id, status",
        "an error finish is a prefill-side abort (a failed write stream, or giving up before the "
        "grant) or the end of an abort; never a stutter while the spec's prefill waits for the "
        "grant",
    ),
    Row("prefill_notice_failed", "prefill", "stutter", "-"),
    Row("decode_restart", "decode", "decode_restart", "boot_epoch -> decode_epoch"),
    Row("decode_admit_request", "decode", "decode_admit_request", "request_id"),
    Row(
        "decode_reject_request",
        "decode",
        "decode_reject_request | stutter",
        "request_id; code OUT_OF_RANGE = over decode's limit",
        "a refusal because prefill already rejected the request is a stutter (decode failed it on "
        "the early notice); a pool-full refusal matches nothing (the spec waits for pages)",
    ),
    Row(
        "decode_reserve_pages",
        "decode",
        "decode_reserve_pages",
        "request_id; pages == the lowest free pages; binds impl generation -> spec generation",
    ),
    Row(
        "decode_receive_write",
        "decode",
        "decode_receive_write",
        "request_id, generation, page -> the write in flight; outcome accepted/refused == the "
        "spec's ownership check",
        "`late: true` (a write stored into a released page) matches nothing",
    ),
    Row(
        "decode_receive_completion",
        "decode",
        "decode_receive_completion",
        "request_id, generation -> the completion message; verdict validated/failed, ignored",
    ),
    Row(
        "decode_receive_rejection",
        "decode",
        "decode_receive_failure | stutter",
        "request_id -> the failure message",
        "stutter when decode already failed the request",
    ),
    Row(
        "decode_abort_request",
        "decode",
        "decode_receive_cancel | stutter | decode_receive_failure | retransmit_message + "
        "decode_receive_failure",
        "request_id",
        "the client's cancel reaching decode (while the spec's cancel is on its way; `early: "
        "true` when it overtook the submit), or the router relaying prefill's failure notice (a "
        "stutter when decode already failed it)",
    ),
    Row("decode_waiting_timeout", "decode", "decode_waiting_timeout", "request_id"),
    Row(
        "decode_receive_abort_ack",
        "decode",
        "decode_receive_abort_ack | stutter",
        "request_id, generation",
        "the reference spec fences release by generation and needs no ack: a stutter",
    ),
    Row(
        "decode_detect_prefill_restart",
        "decode",
        "decode_detect_prefill_restart | decode_suspect_prefill_dead | stutter",
        "new_epoch; failed: the requests it failed (none the spec's step keeps, and every one "
        "whose grant the lost prefill held)",
        "new_epoch null: missed health checks, with no new epoch to show prefill restarted "
        "(decode_suspect_prefill_dead: it fails exactly the requests the spec's decode waits "
        "on; a stutter when it waits on none)",
    ),
    Row("decode_generate", "decode", "decode_generate", "request_id, pages == granted pages"),
    Row(
        "decode_answer",
        "decode",
        "decode_answer | stutter | decode_waiting_timeout",
        "request_id; status ok = decode_answer, error = stutter (the failing step answered); "
        "cause grant_failed = decode_waiting_timeout",
        "an ok answer after the client cancelled goes to a router that already answered "
        "CANCELLED: decode_answer, the client's answer stays the cancel. An error answer with "
        "cause grant_failed is decode giving up on the one request whose grant it could not "
        "deliver (its abort and fence follow): the spec's decode_waiting_timeout, never a "
        "restart's detection, which fails every request handed over for the lost prefill",
    ),
    Row("decode_release_pages", "decode", "decode_release_pages", "request_id, pages"),
    Row(
        "invariant_alarm",
        "decode",
        "none (unexplained against a safe protocol; a stutter against a variant that breaks properties on purpose)",
        "alarm",
        "decode noticed a broken invariant",
    ),
    Row(
        "network_drop_message",
        "harness",
        "network_drop_message",
        "kind, request_id, generation -> the message",
        "logged by the conformance harness for a fault it injected",
    ),
    Row(
        "network_duplicate_message",
        "harness",
        "network_duplicate_message",
        "kind, request_id, generation -> the message",
        "logged by the conformance harness",
    ),
    Row(
        "retransmit_message",
        "harness",
        "retransmit_message",
        "kind, request_id, generation -> the message",
        "logged by the conformance harness",
    ),
)

UNLOGGED_SPEC_STEPS: tuple[tuple[str, str], ...] = unlogged()
"""Spec steps the implementation takes without a log line of its own (from the registry)."""

MESSAGE_KINDS: dict[str, str] = {
    "grant": "grant",
    "completion": "completion",
    "failure": "rejection",
    "abort": "abort",
    "abort_ack": "abort_ack",
}
"""Spec message kind -> the implementation's message (the in-process target's pending kinds)."""


def render_markdown() -> str:
    lines = [
        "| impl event | server | spec action | fields | note |",
        "|---|---|---|---|---|",
    ]
    for row in MAPPING:
        lines.append(f"| `{row.event}` | {row.server} | {row.spec} | {row.fields} | {row.note} |")
    lines += ["", "Unlogged spec steps (explicit stutters of the implementation):", ""]
    for name, why in UNLOGGED_SPEC_STEPS:
        lines.append(f"- `{name}`: {why}")
    return "\n".join(lines) + "\n"


__all__ = ["MAPPING", "MESSAGE_KINDS", "UNLOGGED_SPEC_STEPS", "Row", "render_markdown"]
