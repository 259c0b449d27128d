"""The one trace format: versioned JSON Lines.

Counterexamples, Hypothesis failures, replay inputs and implementation event logs share it.
Line 1 is a header object with the schema version and the config; each further line is one step:
a spec action (`{"step": i, "action": "decode_reserve_pages", "args": {...}}`) or an implementation
event (`{"seq": n, "server": "decode", "event": "...", "args": {...}}`). A trace never contains
prompt text: ids, tenants, lengths, page ids, generations and digests only.

Header fields: `kvhandoff_trace` (the schema version, 1), `kind` ("counterexample", "scenario",
"failure" or "event_log"), `config` (a `Config` as JSON), and optionally `variant`, `property`,
`engine`, `loop_start` (for a lasso: the step index where the repeating part begins).

A trace names the variant it was made with, so that it can be explained and replayed without being
told: `variant` is the variant's name, which is enough for a catalogue variant; a variant written in
a file of its own adds `variant_file` (its path, as given to the checker) and `variant_sha256`
(`"sha256:<hex>"` of the file's bytes), so a reader can find the file again and tell whether it has
changed since. A variant that adds actions lists their classes (`Variant.extra_action_types`);
`load_trace` reads their steps when given those classes.

This module only converts between text and values; reading and writing files is the caller's job.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvhandoff.spec.actions import Action, action_from_json, action_to_json
from kvhandoff.spec.config import Config
from kvhandoff.spec.machine import checked_step, init
from kvhandoff.spec.state import State
from kvhandoff.spec.variants import Variant

SCHEMA_VERSION = 1


class TraceError(ValueError):
    """A trace is malformed, or does not replay; the message names the line."""


@dataclass(frozen=True)
class Trace:
    config: Config
    actions: tuple[Action, ...]
    header: dict[str, Any] = field(default_factory=dict)


def dump_trace(
    config: Config, actions: Sequence[Action], kind: str = "counterexample", **header: Any
) -> str:
    head = {"kvhandoff_trace": SCHEMA_VERSION, "kind": kind, **header, "config": config.to_json()}
    lines = [json.dumps(head, sort_keys=True)]
    for i, action in enumerate(actions):
        lines.append(json.dumps({"step": i + 1, **action_to_json(action)}, sort_keys=True))
    return "\n".join(lines) + "\n"


def with_header(text: str, **fields: Any) -> str:
    """`text` (a trace) with `fields` added to its header line; the steps are left as they are."""
    first, _, rest = text.partition("\n")
    head = {**json.loads(first), **fields}
    return json.dumps(head, sort_keys=True) + "\n" + rest


def load_header(text: str) -> dict[str, Any]:
    first = text.lstrip().split("\n", 1)[0]
    try:
        head = json.loads(first)
    except json.JSONDecodeError as exc:
        raise TraceError(f"line 1: not JSON: {exc}") from exc
    if not isinstance(head, dict) or "kvhandoff_trace" not in head:
        raise TraceError("line 1: expected a header object with a 'kvhandoff_trace' version")
    if head["kvhandoff_trace"] != SCHEMA_VERSION:
        raise TraceError(
            f"line 1: trace schema version {head['kvhandoff_trace']!r}; this version reads "
            f"{SCHEMA_VERSION}"
        )
    return head


def load_trace(text: str, added: Iterable[type] = ()) -> Trace:
    """Parse a spec-action trace (any kind but event_log). `added`: the classes of the actions the
    trace's variant adds (`Variant.extra_action_types`), whose steps are otherwise unknown."""
    added = tuple(added)
    head = load_header(text)
    if head.get("kind") == "event_log":
        raise TraceError("this is an implementation event log: use validate-log, not replay")
    try:
        config = Config.from_json(head.get("config", {}))
    except ValueError as exc:
        raise TraceError(f"line 1: bad config: {exc}") from exc
    actions = []
    for lineno, line in enumerate(text.strip().split("\n")[1:], start=2):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            actions.append(action_from_json(data, added))
        except (json.JSONDecodeError, ValueError) as exc:
            raise TraceError(f"line {lineno}: {exc}") from exc
    return Trace(config, tuple(actions), head)


def replay(variant: Variant, config: Config, actions: Sequence[Action]) -> list[State]:
    """The states a trace passes through, checking every step is enabled where it is taken."""
    states = [init(config)]
    for i, action in enumerate(actions):
        try:
            states.append(checked_step(variant, config, states[-1], action))
        except ValueError as exc:
            raise TraceError(f"step {i + 1}: {exc}") from exc
    return states
