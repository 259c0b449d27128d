"""Counterexamples as text a person can read: one line per step, naming the spec action."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from spec.actions import Action, action_name
from spec.config import Config
from spec.state import Message, Write


def _short(value: Any, ranks: int = 1) -> str:
    """A message or write in a few words; prefill ranks are named only when there are several."""
    if isinstance(value, Message):
        parts = [f"{value.kind}(room={value.room}, gen={value.generation}, req={value.request}"]
        if ranks > 1 and value.kind in ("completion", "abort_ack"):
            parts.append(f", rank={value.rank}")
        if value.pages:
            parts.append(f", pages={list(value.pages)}")
        if value.kind == "completion":
            digest = "none" if value.digest is None else f"{len(value.digest)} pages"
            parts.append(f", count={value.count}, digest={digest}")
        if value.reason:
            parts.append(f", {value.reason}")
        return "".join(parts) + ")"
    if isinstance(value, Write):
        d = value.data
        shard = f", rank={value.rank}" if ranks > 1 else ""
        return (
            f"write(page={value.page}{shard}, room={value.room}, gen={value.generation}, "
            f"data of req {d.request}/tenant {d.tenant})"
        )
    return str(value)


def describe(action: Action, config: Config) -> str:
    """`decode_reserve_pages request=1 (tenant b, 3 pages)`-style one-liner."""
    args = []
    for f in fields(action):
        value = getattr(action, f.name)
        if f.name == "rank" and config.prefill_ranks == 1:
            continue
        text = _short(value, config.prefill_ranks)
        if f.name == "request" and isinstance(value, int) and value < len(config.requests):
            spec = config.requests[value]
            text += f" (tenant {spec.tenant}, {spec.pages} pages, room {spec.room})"
        args.append(f"{f.name}={text}")
    return " ".join([action_name(action), *args])


def trace_lines(
    trace: tuple[Action, ...], config: Config, loop_start: int | None = None
) -> list[str]:
    out = []
    for i, action in enumerate(trace):
        marker = "  <- loop starts" if loop_start is not None and i == loop_start else ""
        out.append(f"{i + 1:4d}. {describe(action, config)}{marker}")
    return out
