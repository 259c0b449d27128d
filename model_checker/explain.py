"""A trace as a story: a step-by-step narrative and a Mermaid sequence chart.

The trace is replayed through the spec (`spec.trace.replay`, guards checked) with the variant its
header names, so each step is explained by what it *changed*: the state before and after are
compared and only the differences are told. Unchanged state is never shown.

The chart has one lane per worker (router, prefill, decode) and one lifetime lane per decode page:
a page's lane shows when it is granted (an activation bar starts), which write lands in it and
from whom, when it is released (zeroed or not) and when decode reads it. The step where the
trace's property first fails is drawn in a red box; each step's first element names the spec
action, numbered like the trace's lines.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from kvhandoff.spec.actions import (
    Action,
    DecodeAnswer,
    DecodeGenerate,
    DecodeReceiveWrite,
    NetworkDropMessage,
    NetworkDuplicateMessage,
    PrefillWritePage,
    RetransmitMessage,
    RouterSubmitRequest,
    action_name,
    is_fault,
)
from kvhandoff.spec.config import Config
from kvhandoff.spec.properties import ALWAYS, TERMINATION, Property
from kvhandoff.spec.state import (
    Faults,
    Ghost,
    Message,
    PageState,
    ReqState,
    State,
    Tag,
    Write,
    field_names,
)
from kvhandoff.spec.trace import Trace, replay
from kvhandoff.spec.variants import Variant

# --- The replayed trace -------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    index: int  # 1-based, as in the trace's "step" field
    action: Action
    before: State
    after: State
    changes: tuple[str, ...]
    newly_violated: tuple[Property, ...]


@dataclass(frozen=True)
class Story:
    variant: Variant
    config: Config
    steps: tuple[Step, ...]
    property_name: str | None  # the header's property, if any
    loop_start: int | None  # 0-based index of the first repeating step (lasso), if any
    kind: str

    @property
    def violation_step(self) -> Step | None:
        """The step where the header's property (else any `always` property) first fails."""
        for s in self.steps:
            names = {p.name for p in s.newly_violated}
            if self.property_name is None and names:
                return s
            if self.property_name in names:
                return s
        return None

    @property
    def final(self) -> State:
        return self.steps[-1].after if self.steps else _initial(self.config)


def _initial(config: Config) -> State:
    from kvhandoff.spec.machine import init

    return init(config)


def build_story(variant: Variant, trace: Trace) -> Story:
    """Replay `trace` under `variant` (raises `spec.trace.TraceError` naming the step)."""
    config = trace.config
    states = replay(variant, config, trace.actions)
    steps = []
    failing: set[str] = {p.name for p in ALWAYS if not p.holds(config, states[0])}
    for i, action in enumerate(trace.actions):
        before, after = states[i], states[i + 1]
        now = [p for p in ALWAYS if not p.holds(config, after)]
        new = tuple(p for p in now if p.name not in failing)
        failing |= {p.name for p in now}
        steps.append(
            Step(i + 1, action, before, after, tuple(state_changes(config, before, after)), new)
        )
    loop = trace.header.get("loop_start")
    return Story(
        variant=variant,
        config=config,
        steps=tuple(steps),
        property_name=trace.header.get("property"),
        loop_start=loop if isinstance(loop, int) else None,
        kind=str(trace.header.get("kind", "counterexample")),
    )


def same_requests_under(variant: Variant, trace: Trace) -> Trace:
    """The shortest fault-free run of `variant` in which the requests `trace` submits are sent,
    in the same order, and each ends (answered or refused, its pages returned).

    This is how the same clients fare under another protocol, e.g. the incident's requests
    under the reference protocol.
    """
    from dataclasses import replace

    from kvhandoff.model_checker.explore import build_graph
    from kvhandoff.spec.state import request_done

    submitted = [a.request for a in trace.actions if isinstance(a, RouterSubmitRequest)]
    config = replace(trace.config, max_faults=0)
    graph, _, _ = build_graph(variant, config)
    for i, state in enumerate(graph.states):
        sent = [r for r, q in enumerate(state.requests) if q.submitted]
        if sorted(sent) == sorted(submitted) and all(
            request_done(config, state, r) for r in submitted
        ):
            actions = graph.path_to(i)
            order = [a.request for a in actions if isinstance(a, RouterSubmitRequest)]
            if order == submitted:
                header = {
                    "kvhandoff_trace": 1,
                    "kind": "scenario",
                    "variant": variant.name,
                    "engine": "explore",
                }
                return Trace(config, actions, header)
    raise ValueError(f"variant {variant.name} has no fault-free run that ends requests {submitted}")


# --- Words --------------------------------------------------------------------------------------


def request_label(config: Config, r: int) -> str:
    if 0 <= r < len(config.requests):
        spec = config.requests[r]
        where = ""
        if config.prefill_instances > 1 or config.decode_instances > 1:
            where = f", prefill {spec.prefill_instance}/decode {spec.decode_instance}"
        return f"req {r} (tenant {spec.tenant}, {spec.pages} pages, room {spec.room}{where})"
    return f"req {r}"


def tag_text(tag: Tag | None) -> str:
    if tag is None:
        return "nothing (zeroed or never written)"
    if tag.request < 0:
        return f"data of another tenant's traffic ({tag.tenant})"
    return f"data of req {tag.request} / tenant {tag.tenant} (gen {tag.generation})"


def message_text(m: Message, ranks: int = 1) -> str:
    parts = [f"{m.kind} room {m.room} gen {m.generation}"]
    if m.dinst:
        # Only a message of decode instance 1, 2, ... says which: with one, every one is 0.
        toward = "from" if m.kind in ("grant", "abort") else "to"
        parts[0] += f" {toward} decode instance {m.dinst}"
    if ranks > 1 and m.kind in ("completion", "abort_ack"):
        parts[0] += f" from prefill rank {m.rank}"
    if m.pages:
        parts.append(f"pages {_pages(m.pages)}")
    if m.kind == "completion":
        digest = "no digest" if m.digest is None else f"digest of {len(m.digest)} pages"
        parts.append(f"count {m.count}, {digest}")
    if m.reason:
        parts.append(m.reason)
    return ", ".join(parts)


def write_text(w: Write, ranks: int = 1) -> str:
    shard = f" shard {w.rank}" if ranks > 1 else ""
    return f"write to page {w.page}{shard} (room {w.room}, gen {w.generation}): {tag_text(w.data)}"


def _page_reads(
    pages: Sequence[int], read: Sequence[Tag | None], ranks: int
) -> list[tuple[str, Tag | None]]:
    """Decode's read, labelled: one entry per page (per page shard when there are several
    prefill ranks: `read` lists every shard of every page, page by page)."""
    out = []
    for i, page in enumerate(pages):
        for k, tag in enumerate(read[i * ranks : (i + 1) * ranks]):
            out.append((f"page {page}" + (f" shard {k}" if ranks > 1 else ""), tag))
    return out


def _pages(pages: Sequence[int]) -> str:
    return "[" + ", ".join(str(p) for p in pages) + "]"


def action_text(action: Action, config: Config) -> str:
    """`decode_reserve_pages req 1 (tenant b, 3 pages, room 2)`."""
    name = action_name(action)
    args = []
    for f in fields(action):
        value = getattr(action, f.name)
        if f.name == "rank" and config.prefill_ranks == 1:
            continue
        if f.name == "dinst" and config.decode_instances == 1:
            continue  # a decode instance: said only where there are several
        if f.name == "pinst" and config.prefill_instances == 1:
            continue
        if f.name == "request" and isinstance(value, int):
            args.append(request_label(config, value))
        elif isinstance(value, Message):
            args.append(message_text(value, config.prefill_ranks))
        elif isinstance(value, Write):
            args.append(write_text(value, config.prefill_ranks))
        else:
            args.append(f"{f.name} {value}")
    fault = " [fault]" if is_fault(action) else ""
    return " ".join([name, *args]) + fault


_REQ_FIELDS = {
    "submitted": "submitted",
    "p": "prefill",
    "p_len": "prefill's view of the prompt (pages)",
    "p_gen": "prefill's grant generation",
    "p_pages": "prefill's granted pages",
    "p_wrote": "pages prefill has written",
    "p_epoch": "decode epoch prefill's request carries",
    "p_grant_dinst": "decode instance that sent prefill's grant",
    "p_lease_expired": "prefill's lease expired",
    "p_ranks_done": "prefill ranks that sent their completion",
    "d": "decode",
    "d_gen": "decode's generation",
    "d_pages": "decode's pages",
    "d_awaiting_ack": "decode waits for the drain ack",
    "d_epoch": "prefill epoch decode's request carries",
    "d_ranks": "prefill ranks whose completion decode accepted",
    "d_acks": "prefill ranks whose drain ack decode has",
    "d_cancel": "the client's cancel is on its way to decode",
    "p_cancel": "the client's cancel is on its way to prefill",
    "not_as_is": "(ghost) not admitted as sent",
    "accepted_full": "(ghost) the accepted completion covered every granted page",
}


def _value(v: Any) -> str:
    if isinstance(v, tuple) and all(isinstance(x, int) for x in v):
        return _pages(v)
    return str(v)


def _req_changes(config: Config, r: int, a: ReqState, b: ReqState) -> list[str]:
    out = []
    who = f"req {r}"
    for name, label in _REQ_FIELDS.items():
        x, y = getattr(a, name), getattr(b, name)
        if x != y:
            out.append(f"{who}: {label} {_value(x)} -> {_value(y)}")
    if a.answer != b.answer and b.answer is not None:
        if b.answer.ok:
            out.append(
                f"{who}: the client gets an answer generated from {len(b.answer.tags)} pages"
            )
        else:
            out.append(f"{who}: the client gets an error: {b.answer.reason}")
    if a.read != b.read and b.read is not None:
        own = Tag(r, b.d_gen, config.requests[r].tenant)
        for where, tag in _page_reads(b.d_pages, b.read, config.prefill_ranks):
            mark = "" if tag == own else "  <-- not this request's data"
            out.append(f"{who}: decode reads {where}: {tag_text(tag)}{mark}")
    return out


def _page_changes(config: Config, i: int, a: PageState, b: PageState) -> list[str]:
    out = []
    if a.owner != b.owner:
        if b.owner is None:
            left = "zeroed" if b.content is None else f"still holds {tag_text(b.content)}"
            out.append(f"page {i}: freed ({left})")
        else:
            r, g = b.owner
            tenant = config.requests[r].tenant if 0 <= r < len(config.requests) else "?"
            out.append(f"page {i}: granted to req {r} (tenant {tenant}) under gen {g}")
    if a.shards != b.shards and not (b.owner is None and a.owner != b.owner):
        if not any(b.shards):
            out.append(f"page {i}: zeroed")
        else:
            several = len(b.shards) > 1
            for k, (x, y) in enumerate(zip(a.shards, b.shards, strict=True)):
                if x != y:
                    where = f"page {i} shard {k}" if several else f"page {i}"
                    out.append(f"{where}: now holds {tag_text(y)}")
    return out


def _multiset_changes(label: str, a: Sequence[Any], b: Sequence[Any], text: Any) -> list[str]:
    ca, cb = Counter(a), Counter(b)
    out = []
    for item in sorted((cb - ca).elements()):
        out.append(f"{label} +{text(item)}")
    for item in sorted((ca - cb).elements()):
        out.append(f"{label} -{text(item)}")
    return out


def state_changes(config: Config, a: State, b: State) -> list[str]:
    """What changed from `a` to `b`, one line per fact; unchanged state is not mentioned."""
    out: list[str] = []
    for r, (x, y) in enumerate(zip(a.requests, b.requests, strict=True)):
        if x != y:
            out.extend(_req_changes(config, r, x, y))
    for i, (pa, pb) in enumerate(zip(a.pages, b.pages, strict=True)):
        if pa != pb:
            out.extend(_page_changes(config, i, pa, pb))
    ranks = config.prefill_ranks

    def message(m: Message) -> str:
        return message_text(m, ranks)

    def write(w: Write) -> str:
        return write_text(w, ranks)

    out += _multiset_changes("network:", a.network, b.network, message)
    out += _multiset_changes("lost (sender will retransmit):", a.lost, b.lost, message)
    out += _multiset_changes("in flight:", a.writes, b.writes, write)
    before, after = dict(a.variant_fields), dict(b.variant_fields)
    for name in sorted(before.keys() | after.keys()):
        if before.get(name) != after.get(name):
            # A field at its initial value is not stored: "initial" rather than a guess.
            x, y = before.get(name, "(initial)"), after.get(name, "(initial)")
            out.append(f"variant state {name}: {_value(x)} -> {_value(y)}")
    skip = {"requests", "pages", "network", "lost", "writes", "faults", "ghost", "variant_fields"}
    for name in field_names(State):
        if name in skip:
            continue
        x, y = getattr(a, name), getattr(b, name)
        if x != y:
            out.append(f"{name}: {_value(x)} -> {_value(y)}")
    for name in Faults._fields:
        x, y = getattr(a.faults, name), getattr(b.faults, name)
        if x != y:
            out.append(f"fault budget spent: {name} {x} -> {y}")
    for name in Ghost._fields:
        x, y = getattr(a.ghost, name), getattr(b.ghost, name)
        if x != y:
            out.append(f"(ghost) {name}: {x} -> {y}")
    return out


def _claim(name: str | None) -> str:
    for p in (*ALWAYS, TERMINATION):
        if p.name == name:
            return p.claim
    return ""


def config_lines(config: Config) -> list[str]:
    reqs = "; ".join(request_label(config, r) for r in range(len(config.requests)))
    out = [
        f"decode pool {config.decode_pages} pages, prefill admits up to "
        f"{config.prefill_max_prompt} pages, decode up to {config.decode_max_prompt}, "
        f"context window {config.context_window}",
        f"requests: {reqs}",
    ]
    if config.prefill_instances > 1 or config.decode_instances > 1:
        blocks = ", ".join(
            f"decode {i}: pages "
            + _pages([q for q in range(config.decode_pages) if config.page_instance(q) == i])
            for i in range(config.decode_instances)
        )
        out.append(
            f"instances: {config.prefill_instances} prefill, {config.decode_instances} decode "
            f"({blocks})"
        )
    return out


def verdict_line(story: Story) -> str:
    bad = story.violation_step
    if story.property_name == TERMINATION.name:
        where = "" if story.loop_start is None else f" (loops from step {story.loop_start + 1})"
        return f"verdict: {TERMINATION.name} VIOLATED: the run never ends every request{where}"
    if bad is None:
        if story.property_name:
            return f"verdict: {story.property_name} does NOT fail in this replay ({len(story.steps)} steps)"
        return f"verdict: no property violated in {len(story.steps)} steps"
    name = story.property_name or bad.newly_violated[0].name
    return f"verdict: {name} VIOLATED at step {bad.index} ({action_name(bad.action)})"


# --- Text ---------------------------------------------------------------------------------------


def to_text(story: Story) -> str:
    lines = [f"trace: {story.kind} of variant {story.variant.name}, {len(story.steps)} steps"]
    if story.property_name:
        lines.append(f"property: {story.property_name}: {_claim(story.property_name)}")
    lines += [f"config: {c}" for c in config_lines(story.config)]
    lines.append("")
    for s in story.steps:
        loop = ""
        if story.loop_start is not None and s.index - 1 == story.loop_start:
            lines.append("   -- from here the run repeats forever --")
        lines.append(f"{s.index:3d}. {action_text(s.action, story.config)}{loop}")
        for c in s.changes or ("(nothing changes: a stale or duplicate message is dropped)",):
            lines.append(f"       {c}")
        for p in s.newly_violated:
            lines.append(f"       !! VIOLATED {p.name}: {p.claim}")
    lines.append("")
    lines.append(verdict_line(story))
    return "\n".join(lines) + "\n"


# --- Mermaid ------------------------------------------------------------------------------------

_KIND_ROUTE = {
    "grant": ("decode", "prefill"),
    "completion": ("prefill", "decode"),
    "failure": ("prefill", "decode"),
    "abort": ("decode", "prefill"),
    "abort_ack": ("prefill", "decode"),
}


_WRAP = 40  # characters per line of a note or message; Mermaid does not wrap them itself


def _m(text: str) -> str:
    """Text safe inside a Mermaid message or note, broken into lines (`<br/>`) so that a long
    note stays inside its box."""
    for bad, good in ((";", ","), ("#", "no."), ("{", "("), ("}", ")"), ("<--", "<-")):
        text = text.replace(bad, good)
    lines: list[str] = []
    for word in text.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= _WRAP:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br/>".join(lines)


def _lane_of(action: Action) -> str:
    name = action_name(action)
    if name.startswith(("router_", "client_")):
        return "router"
    if name.startswith("prefill_"):
        return "prefill"
    if name.startswith("decode_"):
        return "decode"
    return "network"


def _runs(pages: Sequence[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for p in sorted(pages):
        if out and out[-1][1] == p - 1:
            out[-1] = (out[-1][0], p)
        else:
            out.append((p, p))
    return out


def _note_over_pages(pages: Sequence[int], text: str) -> list[str]:
    out = []
    for lo, hi in _runs(pages):
        span = f"page{lo}" if lo == hi else f"page{lo},page{hi}"
        out.append(f"    Note over {span}: {_m(text)}")
    return out


def _step_mermaid(story: Story, s: Step, active: set[int]) -> list[str]:
    c = story.config
    a = s.action
    label = f"{s.index}. {action_name(a)}"
    out: list[str] = []
    msg = getattr(a, "message", None)
    if isinstance(msg, Message):
        src, dst = _KIND_ROUTE.get(msg.kind, ("prefill", "decode"))
        arrow = "-x" if isinstance(a, NetworkDropMessage) else "-)"
        extra = ""
        if isinstance(a, NetworkDuplicateMessage):
            extra = " (delivered twice)"
        elif isinstance(a, RetransmitMessage):
            extra = " (sent again)"
        text = message_text(msg, c.prefill_ranks)
        out.append(f"    {src}{arrow}{dst}: {_m(f'{label}: {text}{extra}')}")
    elif isinstance(a, DecodeReceiveWrite):
        w = a.write
        page_after = s.after.pages[w.page]
        data = page_after.shards[w.rank]
        landed = page_after != s.before.pages[w.page] or data == w.data
        if landed:
            shard = f"shard {w.rank}: " if c.prefill_ranks > 1 else ""
            out.append(f"    prefill->>page{w.page}: {_m(f'{label}: {shard}{tag_text(data)}')}")
        else:
            out.append(f"    prefill-xpage{w.page}: {_m(f'{label}: refused: {tag_text(w.data)}')}")
    elif isinstance(a, DecodeGenerate):
        r = a.request
        req = s.after.requests[r]
        out.append(f"    Note over decode: {_m(f'{label}: {request_label(c, r)}')}")
        own = Tag(r, req.d_gen, c.requests[r].tenant)
        for where, tag in _page_reads(req.d_pages, req.read or (), c.prefill_ranks):
            page = where.split()[1]
            shard = where.split(" shard ")[1] if " shard " in where else ""
            bad = "" if tag == own else " NOT ITS OWN"
            text = f"read{f' shard {shard}' if shard else ''}: {tag_text(tag)}{bad}"
            out.append(f"    page{page}-->>decode: {_m(text)}")
    elif isinstance(a, RouterSubmitRequest) and s.after.requests[a.request].p == "received":
        text = f"{label}: {request_label(c, a.request)}"
        out.append(f"    router->>prefill: {_m(text)}")
        out.append(f"    router->>decode: {_m(f'req {a.request}')}")
    elif isinstance(a, DecodeAnswer):
        out.append(f"    decode->>router: {_m(f'{label}: {request_label(c, a.request)}')}")
    elif isinstance(a, PrefillWritePage):
        sent = sorted((Counter(s.after.writes) - Counter(s.before.writes)).elements())
        sent_pages = ", ".join(str(p) for p in sorted({w.page for w in sent}))
        if c.prefill_ranks > 1:
            sent_pages += f" (a shard from each of {c.prefill_ranks} ranks)"
        out.append(
            f"    Note over prefill: {_m(f'{label}: req {a.request} sends page {sent_pages}')}"
        )
    else:
        lane = _lane_of(a)
        text = action_text(a, c)
        head = text.split(" ", 1)[1] if " " in text else ""
        detail = f"{label}: {head}" if head else label
        if lane == "network":
            out.append(f"    Note over prefill,decode: {_m(detail)}")
        else:
            out.append(f"    Note over {lane}: {_m(detail)}")
    # Short facts about the workers, from the state diff (not pages: those go on page lanes).
    for r, (x, y) in enumerate(zip(s.before.requests, s.after.requests, strict=True)):
        if x.answer != y.answer and y.answer is not None:
            text = "answer" if y.answer.ok else f"error: {y.answer.reason}"
            out.append(f"    Note over router: {_m(f'req {r} -> client: {text}')}")
        if x.p_len != y.p_len and y.p_len < c.requests[r].pages and y.p_len:
            out.append(
                f"    Note over prefill: {_m(f'req {r} is now {y.p_len} page(s) long at prefill')}"
            )
        if x.accepted_full != y.accepted_full and y.accepted_full is not None:
            cover = "covers" if y.accepted_full else "does NOT cover"
            out.append(
                f"    Note over decode: {_m(f'accepts the completion: it {cover} every page')}"
            )
        if x.d != y.d and y.d == "failed" and x.answer is not None:
            out.append(f"    Note over decode: {_m(f'req {r} failed')}")
    # Page lifetime lanes.
    granted: dict[str, list[int]] = {}
    freed: dict[str, list[int]] = {}
    zeroed: list[int] = []
    for i, (x_page, y_page) in enumerate(zip(s.before.pages, s.after.pages, strict=True)):
        if x_page.owner != y_page.owner and x_page.owner is not None and i in active:
            if y_page.content is None:
                note = "released, zeroed" if x_page.content is not None else "released, empty"
            else:
                note = f"released, NOT zeroed: still {tag_text(y_page.content)}"
            freed.setdefault(note, []).append(i)
        if x_page.owner != y_page.owner and y_page.owner is not None:
            r, g = y_page.owner
            tenant = c.requests[r].tenant if 0 <= r < len(c.requests) else "?"
            granted.setdefault(f"granted to req {r} (tenant {tenant}), gen {g}", []).append(i)
        elif x_page.content is not None and y_page.content is None and x_page.owner == y_page.owner:
            zeroed.append(i)
    for note, pages in freed.items():
        out += _note_over_pages(pages, note)
        for p in pages:
            out.append(f"    deactivate page{p}")
            active.discard(p)
    for note, pages in granted.items():
        for p in pages:
            out.append(f"    activate page{p}")
            active.add(p)
        out += _note_over_pages(pages, note)
    if zeroed:
        out += _note_over_pages(zeroed, "zeroed")
    return out


def to_mermaid(story: Story) -> str:
    c = story.config
    lines = ["sequenceDiagram"]
    lines.append("    participant router")
    lines.append("    participant prefill")
    lines.append("    participant decode")
    for i in range(c.decode_pages):
        lines.append(f"    participant page{i} as page {i}")
    bad = story.violation_step
    last = f"page{c.decode_pages - 1}"
    active: set[int] = set()
    in_loop = False
    for s in story.steps:
        if story.loop_start is not None and s.index - 1 == story.loop_start:
            lines.append("    loop repeats forever, never ending every request")
            in_loop = True
        body = _step_mermaid(story, s, active)
        key = _key_step(body)
        if key and s is not bad:
            # The steps the incident turns on (a prompt shortened at prefill, pages released
            # still holding data, a completion that does not cover the grant) stand out.
            lines.append("    rect rgb(255, 236, 190)")
            lines += ["    " + b for b in body]
            lines.append(f"        Note over router,{last}: {_m(f'key step: {key}')}")
            for p in s.newly_violated:
                lines.append(f"        Note over router,{last}: {_m(f'also breaks {p.name}')}")
            lines.append("    end")
            continue
        if s is bad:
            lines.append("    rect rgb(255, 205, 205)")
            lines += ["    " + b for b in body]
            for p in s.newly_violated:
                lines.append(f"        Note over router,{last}: {_m(f'VIOLATED: {p.name}')}")
            lines.append("    end")
        else:
            lines += body
            for p in s.newly_violated:
                lines.append(f"    Note over router,{last}: {_m(f'also breaks {p.name}')}")
    if in_loop:
        lines.append("    end")
    # Mermaid draws an activation bar only once it is closed: end the bars of pages still held.
    for page in sorted(active):
        lines.append(f"    deactivate page{page}")
    return "\n".join(lines) + "\n"


_KEY_FACTS = (
    ("released, NOT zeroed", "pages released without zeroing"),
    ("page(s) long at prefill", "prefill's view of the prompt changed"),
    ("does NOT cover", "a completion that does not cover the grant is accepted"),
)


def _key_step(body: Sequence[str]) -> str:
    text = "\n".join(body).replace("<br/>", " ")
    return "; ".join(why for fact, why in _KEY_FACTS if fact in text)


# --- Markdown -----------------------------------------------------------------------------------


def to_markdown(story: Story, title: str | None = None, level: int = 1) -> str:
    h = "#" * level
    name = story.property_name or "trace"
    lines = [f"{h} {title or f'{name}: variant {story.variant.name}'}", ""]
    if story.property_name:
        lines.append(f"**Property** `{story.property_name}`: {_claim(story.property_name)}.")
        lines.append("")
    lines.append(f"**Variant** `{story.variant.name}`: {story.variant.summary}")
    lines.append("")
    lines += [f"- {c}" for c in config_lines(story.config)]
    lines += ["", f"**{verdict_line(story)}**", ""]
    lines += [f"{h}# Sequence chart", "", "```mermaid", to_mermaid(story).rstrip("\n"), "```", ""]
    lines += [f"{h}# Step by step", ""]
    for s in story.steps:
        if story.loop_start is not None and s.index - 1 == story.loop_start:
            lines.append("*From here the run repeats forever.*")
            lines.append("")
        rest = action_text(s.action, story.config).partition(" ")[2]
        marker = f"{s.index}. "
        lines.append(f"{marker}`{action_name(s.action)}` {_md(rest)}")
        # CommonMark nests a sub-list only when it is indented to the item's text: "10. " needs
        # four spaces, so a fixed indent would end the numbered list at step 10.
        pad = " " * len(marker)
        for ch in s.changes:
            lines.append(f"{pad}- {_md(ch)}")
        for p in s.newly_violated:
            lines.append(f"{pad}- **VIOLATED `{p.name}`**: {p.claim}")
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("<--", "&larr;").replace("->", "&rarr;")


FORMATS = ("text", "mermaid", "markdown")


def render(story: Story, fmt: str) -> str:
    if fmt == "text":
        return to_text(story)
    if fmt == "mermaid":
        return to_mermaid(story)
    if fmt == "markdown":
        return to_markdown(story)
    raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
