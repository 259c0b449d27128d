"""One registry: every spec action and what it is on an implementation.

For each action of `spec.actions.ALL_ACTIONS` (by its snake_case name) one `Counterpart` says
- how the lockstep runner and `replay` perform it on a `Target` (`perform`), and which target
  operation that is (`operation`: `deliver:<step kind>`, a `Target` method, `with:<action>` when
  the implementation does it inside another step, or `none`);
- which implementation log events it explains (`events`; their matchers live in
  `conformance.validate`, their rows in `conformance.mapping.MAPPING`);
- why, where it has no counterpart or is never logged (`note`).

What is derived from it: the `Target.deliver` step kinds (`conformance.target.STEP_KINDS`), the
lockstep driver (`conformance.lockstep.drive`), and the list of spec steps the implementation
never logs (`conformance.mapping.UNLOGGED_SPEC_STEPS`). The Hypothesis rules are the spec's own
`enabled` list; this registry is what makes every one of them drive something or say why not.
`tests/conformance/test_registry.py` fails when an action has no entry, when an entry names an
event no matcher explains, or when an entry's operation is not what `perform` does.

Adding an action: write its rule in `spec/` (its class in `spec/actions.py`, its guard and effect
in `spec/machine.py`), then add its row here, and, if the implementation logs it, its event row in
`conformance/mapping.py` and its matcher in `conformance/validate.py` (see docs/spec.md, "Adding
an action").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvhandoff.spec.actions import ALL_ACTIONS, action_name, snake_case

if TYPE_CHECKING:
    from kvhandoff.conformance.target import Target

Perform = Callable[["Target", Any], bool]


@dataclass(frozen=True)
class Counterpart:
    action: str
    """The spec action's snake_case name."""
    operation: str
    """`deliver:<kind>`, a `Target` method name, `with:<action>` or `none`."""
    perform: Perform
    events: tuple[str, ...] = ()
    """Implementation (or harness) log events that this action explains."""
    note: str = ""
    """What else a reader of the mapping should know."""
    silent: str = ""
    """When and why the implementation takes this step without a log line of its own (always,
    when `events` is empty); the validator then takes the spec step silently or as a stutter."""
    logs_at_once: bool = False
    """The target takes the step within the call that performs it, and logs one of `events`
    there: a fine-grained target that says it performed the step and logged none of them
    diverges (`lockstep.Session.do`). Without it, a worker that skipped the step could pass,
    its log explained by a run in which the fault never happened (the spec allows that run)."""


def _attempt(action: Any) -> int | None:
    """The attempt of the message an action names (None: it names none)."""
    message = getattr(action, "message", None)
    return None if message is None else int(message.attempt)


def _deliver(
    kind: str, request: Callable[[Any], int], page: Callable[[Any], int | None] | None = None
) -> tuple[str, Perform]:
    def perform(target: Target, action: Any) -> bool:
        p = None if page is None else page(action)
        if getattr(target, "retries", False) is True:
            # A target that plays retries picks the message of the spec message's attempt.
            return target.deliver(kind, request(action), p, attempt=_attempt(action))  # type: ignore[call-arg]
        if page is None:
            return target.deliver(kind, request(action))
        return target.deliver(kind, request(action), p)

    return f"deliver:{kind}", perform


def _call(
    method: str, *args: Callable[[Any], Any], returns: bool | None = None
) -> tuple[str, Perform]:
    """A `Target` method; `returns` for the methods that return nothing (crashes, submit)."""

    def perform(target: Target, action: Any) -> bool:
        result = getattr(target, method)(*(get(action) for get in args))
        return bool(result) if returns is None else returns

    return method, perform


def _instance_call(method: str, *fields: str, returns: bool | None = None) -> tuple[str, Perform]:
    """A `Target` fault method on instances (`pinst`, `dinst` of the action): passed as keywords
    where one is not 0, so a target of one instance of each is called as before, with none."""

    def perform(target: Target, action: Any) -> bool:
        where = {f: getattr(action, f) for f in fields if getattr(action, f)}
        result = getattr(target, method)(**where)
        return bool(result) if returns is None else returns

    return method, perform


def _message_call(method: str) -> tuple[str, Perform]:
    """A `Target` method on one message (`drop`, `duplicate`, `retransmit`): its kind and
    request, and, for a target with `retries`, its attempt."""

    def perform(target: Target, action: Any) -> bool:
        kind, r = _message_kind(action), _message_request(action)
        if getattr(target, "retries", False) is True:
            return bool(getattr(target, method)(kind, r, attempt=_attempt(action)))
        return bool(getattr(target, method)(kind, r))

    return method, perform


def _with(other: str) -> tuple[str, Perform]:
    """Done by the implementation inside another step: nothing to do on the target."""
    return f"with:{other}", lambda target, action: True


def _none() -> tuple[str, Perform]:
    """No counterpart on the implementation: the target is not asked, the spec moves on events."""
    return "none", lambda target, action: False


def _request(a: Any) -> int:
    return int(a.request)


def _message_request(a: Any) -> int:
    return int(a.message.request)


def _message_kind(a: Any) -> str:
    return str(a.message.kind)


def _row(
    name: str,
    op: tuple[str, Perform],
    events: tuple[str, ...] = (),
    note: str = "",
    silent: str = "",
    logs_at_once: bool = False,
) -> Counterpart:
    return Counterpart(name, op[0], op[1], events, note, silent, logs_at_once)


REGISTRY: tuple[Counterpart, ...] = (
    _row(
        "router_submit_request",
        _call("submit", _request, returns=True),
        ("router_submit_request", "router_reject_request"),
    ),
    _row("prefill_admit_request", _deliver("prefill_submit", _request), ("prefill_admit_request",)),
    _row(
        "prefill_reject_request",
        _deliver("prefill_submit", _request),
        ("prefill_reject_request", "prefill_admit_request"),
        "a truncated admission (M6) is logged as prefill_admit_request with truncated_to",
    ),
    _row("decode_admit_request", _deliver("decode_submit", _request), ("decode_admit_request",)),
    _row("decode_reject_request", _deliver("decode_submit", _request), ("decode_reject_request",)),
    _row(
        "decode_reserve_pages",
        _deliver("decode_submit", _request),
        ("decode_reserve_pages",),
        "the implementation's decode admits and reserves in one call",
    ),
    _row("prefill_receive_grant", _deliver("grant", _message_request), ("prefill_receive_grant",)),
    _row("prefill_write_page", _deliver("write_send", _request), ("prefill_write_page",)),
    _row(
        "decode_receive_write",
        _deliver("write", lambda a: a.write.data.request, lambda a: a.write.page),
        ("decode_receive_write",),
    ),
    _row(
        "prefill_send_completion",
        _deliver("stream_close", _request),
        ("prefill_send_completion",),
    ),
    _row(
        "decode_receive_completion",
        _deliver("completion", _message_request),
        ("decode_receive_completion",),
    ),
    _row(
        "decode_receive_failure",
        _deliver("failure", _message_request),
        ("decode_receive_rejection", "decode_abort_request"),
        "prefill's rejection notice, or the router relaying prefill's error",
    ),
    _row(
        "decode_receive_cancel",
        _deliver("decode_cancel", _request),
        ("decode_abort_request",),
        silent="a decode that already finished the request logs nothing for the cancel",
    ),
    _row(
        "prefill_receive_cancel",
        _deliver("prefill_cancel", _request),
        ("prefill_cancel_request",),
        silent="a prefill that already finished the request logs nothing for the cancel",
    ),
    _row("decode_generate", _deliver("generate", _request), ("decode_generate",)),
    _row(
        "decode_answer",
        _with("decode_generate"),
        ("decode_answer",),
        silent="an error answer: the spec answers errors inside the failing step, and the "
        "impl's error decode_answer is a stutter",
    ),
    _row("decode_release_pages", _with("decode_generate"), ("decode_release_pages",)),
    _row(
        "prefill_receive_abort",
        _deliver("abort", _message_request),
        ("prefill_receive_abort", "prefill_cancel_request"),
    ),
    _row(
        "prefill_send_abort_ack",
        _with("prefill_receive_abort"),
        (),
        silent="the implementation's prefill sends its drain ack while it handles the abort, "
        "once its writes of that generation have returned; the ack's arrival is "
        "decode_receive_abort_ack",
    ),
    _row(
        "decode_receive_abort_ack",
        _deliver("abort_ack", _message_request),
        ("decode_receive_abort_ack",),
    ),
    _row(
        "decode_release_timeout",
        _none(),
        (),
        silent="no counterpart: the implementation fences release by decode's generation check "
        "(receiver-checked writes) and has no drain-ack-or-timeout release (M8's design)",
    ),
    _row(
        "decode_detect_prefill_restart",
        # Decode instance dinst's probe of prefill instance pinst (None: instance 0).
        _deliver("heartbeat", lambda a: a.dinst, lambda a: a.pinst or None),
        ("decode_detect_prefill_restart",),
    ),
    _row(
        "prefill_detect_decode_restart",
        _none(),
        (),
        silent="no counterpart: the implementation's prefill has no such step; its writes are "
        "refused instead",
    ),
    _row(
        "retransmit_message",
        _message_call("retransmit"),
        ("retransmit_message", "decode_abort_request"),
        "decode_abort_request: the router relaying prefill's failure notice again",
        silent="in live logs a retried RPC is not logged (the harness logs its own)",
    ),
    _row(
        "router_retry_request",
        _call("retry", _request),
        ("router_retry_request",),
        note="the client resubmits the request under the same id with `retry` set (the API's "
        "`GenerateRequest.retry`); the router hands it to both workers as the next attempt, "
        "which every message about it carries, and prefill and decode drop a message of another "
        "attempt (the reference's `attempt_fence`). Played by targets with `Target.retries` "
        "(the in-process one); the others refuse scenarios with max_retries > 0 "
        "(`require_one_prefill_rank`)",
    ),
    _row(
        "client_cancel_request",
        _call("cancel", _request),
        ("client_cancel_request",),
    ),
    _row(
        "decode_waiting_timeout",
        _call("fire_timeout", _request),
        ("decode_waiting_timeout", "decode_answer"),
        note="decode_answer: decode giving up on a request whose grant it could not deliver "
        "(cause grant_failed)",
    ),
    _row(
        "prefill_abort_request",
        _call("prefill_abort", _request),
        ("prefill_finish_request",),
    ),
    _row(
        "prefill_write_error",
        _call("prefill_abort", _request),
        ("prefill_finish_request",),
        note="the same call as prefill_abort_request, asked while writes of the request are in "
        "flight: they stay there and may still land",
    ),
    _row(
        "prefill_restart",
        _instance_call("restart_prefill", "pinst", returns=True),
        ("prefill_restart",),
    ),
    _row(
        "decode_restart",
        _instance_call("restart_decode", "dinst", returns=True),
        ("decode_restart",),
    ),
    _row(
        "decode_suspect_prefill_dead",
        _instance_call("suspect_prefill_dead", "dinst", "pinst"),
        ("decode_detect_prefill_restart",),
        "the implementation logs it as decode_detect_prefill_restart with new_epoch null "
        "(reason 'prefill stopped answering health checks'). Its decode fails only the requests "
        "whose grant prefill acknowledged; the in-process target therefore refuses the step "
        "while a grant decode waits on is undelivered (in flight or lost), where the spec's "
        "decode, which does not track delivery, fails that request too",
        logs_at_once=True,
    ),
    _row(
        "prefill_lease_expire",
        _none(),
        (),
        silent="no counterpart: the pull path (vLLM's NIXL leases) is not implemented; the "
        "implementation pushes",
    ),
    _row(
        "network_fail_transfer",
        _none(),
        (),
        silent="no counterpart: the pull path (a failed one-sided read) is not implemented; the "
        "implementation pushes",
    ),
    _row(
        "network_drop_message",
        _message_call("drop"),
        ("network_drop_message",),
    ),
    _row(
        "network_duplicate_message",
        _message_call("duplicate"),
        ("network_duplicate_message",),
    ),
)

BY_ACTION: dict[str, Counterpart] = {c.action: c for c in REGISTRY}


def counterpart(action: object) -> Counterpart | None:
    return BY_ACTION.get(action_name(action))


def deliver_kinds() -> tuple[str, ...]:
    """The `Target.deliver` step kinds, in the registry's (the rulebook's) order."""
    kinds: list[str] = []
    for c in REGISTRY:
        if c.operation.startswith("deliver:"):
            kind = c.operation.removeprefix("deliver:")
            if kind not in kinds:
                kinds.append(kind)
    return tuple(kinds)


def unlogged() -> tuple[tuple[str, str], ...]:
    """Spec steps the implementation takes (sometimes or always) without a log line of their
    own, with when and why."""
    return tuple((c.action, c.silent) for c in REGISTRY if c.silent)


def missing() -> list[str]:
    """Spec actions with no registry entry (a completeness test asks that this be empty)."""
    return [
        snake_case(cls.__name__) for cls in ALL_ACTIONS if snake_case(cls.__name__) not in BY_ACTION
    ]


__all__ = [
    "BY_ACTION",
    "REGISTRY",
    "Counterpart",
    "counterpart",
    "deliver_kinds",
    "missing",
    "unlogged",
]
