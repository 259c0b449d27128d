"""Counterexamples as text a person can read: one line per step, naming the spec action."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from kvhandoff.spec.actions import Action, action_name
from kvhandoff.spec.config import Config
from kvhandoff.spec.state import Message, Write


def _short(value: Any, ranks: int = 1) -> str:
    """A message or write in a few words; prefill ranks are named only when there are several."""
    if isinstance(value, Message):
        parts = [f"{value.kind}(room={value.room}, gen={value.generation}, req={value.request}"]
        if value.dinst:  # decode instance 1, 2, ...: with one instance every message's is 0
            parts.append(f", decode={value.dinst}")
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
        if f.name == "dinst" and config.decode_instances == 1:
            continue  # a drain ack's decode instance: said only where there are several
        text = _short(value, config.prefill_ranks)
        if f.name == "request" and isinstance(value, int) and value < len(config.requests):
            spec = config.requests[value]
            where = ""
            if config.prefill_instances > 1 or config.decode_instances > 1:
                where = f", on p{spec.prefill_instance}/d{spec.decode_instance}"
            text += f" (tenant {spec.tenant}, {spec.pages} pages, room {spec.room}{where})"
        args.append(f"{f.name}={text}")
    return " ".join([action_name(action), *args])


def trace_lines(
    trace: tuple[Action, ...],
    config: Config,
    loop_start: int | None = None,
    marks: Mapping[int, str] | None = None,
) -> list[str]:
    """One numbered line per step; `marks[i]` is written after step i (1-based)."""
    out = []
    for i, action in enumerate(trace):
        marker = "  <- loop starts" if loop_start is not None and i == loop_start else ""
        if marks and i + 1 in marks:
            marker += f"  <- {marks[i + 1]}"
        out.append(f"{i + 1:4d}. {describe(action, config)}{marker}")
    return out


def steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


@dataclass(frozen=True)
class Listing:
    """One counterexample to print, and the properties whose counterexamples are its prefixes."""

    property: str
    trace: tuple[Action, ...]
    loop_start: int | None
    prefixes: tuple[tuple[str, int], ...]
    """(property, length) of each other counterexample that is this one's first steps."""


def group_counterexamples(
    found: Sequence[tuple[str, tuple[Action, ...], int | None]],
) -> tuple[list[Listing], dict[str, tuple[str, int]]]:
    """Counterexamples (property, trace, loop_start), in report order, as few listings as can
    show them all: a counterexample that is the first steps of another's (or equal to it) is not
    listed again; it is named as `same_as[property] = (listed property, its length)`.

    A lasso (a counterexample with a loop) is listed on its own: its meaning is the loop, which
    a prefix of another run does not have. Equal counterexamples are listed once, under the
    property reported first.
    """

    def contains(big: tuple[Action, ...], small: tuple[Action, ...]) -> bool:
        return len(small) <= len(big) and big[: len(small)] == small

    listed: list[int] = []
    for i, (_, trace, loop) in enumerate(found):
        covered = loop is None and any(
            j != i
            and found[j][2] is None
            and contains(found[j][1], trace)
            and (len(found[j][1]) > len(trace) or j < i)
            for j in range(len(found))
        )
        if not covered:
            listed.append(i)
    same_as: dict[str, tuple[str, int]] = {}
    prefixes: dict[int, list[tuple[str, int]]] = {i: [] for i in listed}
    for i, (name, trace, _) in enumerate(found):
        if i in prefixes:
            continue
        # The longest listed run that starts with this one (listed before it on a tie).
        host = max(
            (j for j in listed if found[j][2] is None and contains(found[j][1], trace)),
            key=lambda j: (len(found[j][1]), -j),
        )
        same_as[name] = (found[host][0], len(trace))
        prefixes[host].append((name, len(trace)))
    listings = [Listing(found[i][0], found[i][1], found[i][2], tuple(prefixes[i])) for i in listed]
    return listings, same_as
