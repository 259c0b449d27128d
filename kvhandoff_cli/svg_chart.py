"""A counterexample's sequence chart as one SVG file: `kvhandoff explain TRACE --format svg`.

The Mermaid chart (model_checker/explain.py `to_mermaid`) renders on any Git host but needs a
browser and the mermaid package to become a picture. This draws the same chart, from the same
Mermaid text, as plain SVG in pure Python, for slides, reviews and CI artefacts: one lane per
worker and per decode page, messages as arrows, notes as boxes, page activations as bars, the
key steps shaded amber and the violating step red, as in the Mermaid chart.

Only the subset of Mermaid's sequenceDiagram that `to_mermaid` writes is understood; any other
line is an error naming it, so a change to the chart's vocabulary fails the tests here instead of
being dropped from the picture.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

LANE_W = 260  # a lane's width: fits a 40-character line (explain.py wraps notes at 40) at 11 px
MARGIN = 20
HEAD_H = 30
LINE_H = 14
NOTE_W = LANE_W - 12
FONT = "font-family:Helvetica,Arial,sans-serif;font-size:11px"

_PARTICIPANT = re.compile(r"participant (\w+)(?: as (.+))?")
_MESSAGE = re.compile(r"(\w+)(-->>|->>|-\)|-x)(\w+): (.*)")
_NOTE = re.compile(r"Note over (\w+)(?:,(\w+))?: (.*)")
_RECT = re.compile(r"rect rgb\((\d+), ?(\d+), ?(\d+)\)")
_ACTIVATION = re.compile(r"(activate|deactivate) (\w+)")
_LOOP = re.compile(r"loop (.*)")


@dataclass
class _Block:
    kind: str  # "rect" or "loop"
    top: float
    fill: str = ""
    label: str = ""


@dataclass
class _Chart:
    lanes: dict[str, int] = field(default_factory=dict)  # participant -> lane index
    labels: list[str] = field(default_factory=list)
    background: list[str] = field(default_factory=list)  # shaded steps, loops, activation bars
    foreground: list[str] = field(default_factory=list)  # arrows, notes, text
    y: float = MARGIN + HEAD_H + 20

    def x(self, lane: str) -> float:
        return MARGIN + LANE_W * self.lanes[lane] + LANE_W / 2


def _lines(text: str) -> list[str]:
    return text.split("<br/>")


def _text(x: float, y: float, lines: list[str], anchor: str = "middle", bold: bool = False) -> str:
    weight = ";font-weight:bold" if bold else ""
    spans = "".join(
        f'<tspan x="{x:.0f}" dy="{0 if i == 0 else LINE_H}">{escape(line)}</tspan>'
        for i, line in enumerate(lines)
    )
    return f'<text x="{x:.0f}" y="{y:.0f}" text-anchor="{anchor}" style="{FONT}{weight}">{spans}</text>'


def _message(chart: _Chart, src: str, op: str, dst: str, text: str) -> None:
    lines = _lines(text)
    x1, x2 = chart.x(src), chart.x(dst)
    label_y = chart.y + LINE_H - 3
    arrow_y = chart.y + LINE_H * len(lines) + 4
    chart.foreground.append(_text((x1 + x2) / 2, label_y, lines))
    dash = ' stroke-dasharray="5,3"' if op == "-->>" else ""
    marker = {"->>": "arrow", "-->>": "arrow", "-)": "open", "-x": "cross"}[op]
    chart.foreground.append(
        f'<line class="message" x1="{x1:.0f}" y1="{arrow_y:.0f}" x2="{x2:.0f}" '
        f'y2="{arrow_y:.0f}" stroke="#333"{dash} marker-end="url(#{marker})"/>'
    )
    chart.y = arrow_y + 12


def _note(chart: _Chart, first: str, last: str | None, text: str) -> None:
    lines = _lines(text)
    if last is None or last == first:
        left = chart.x(first) - NOTE_W / 2
        width = float(NOTE_W)
    else:
        a, b = sorted((chart.x(first), chart.x(last)))
        left, width = a - NOTE_W / 2, b - a + NOTE_W
    height = LINE_H * len(lines) + 8
    chart.foreground.append(
        f'<rect class="note" x="{left:.0f}" y="{chart.y:.0f}" width="{width:.0f}" '
        f'height="{height:.0f}" fill="#fff8c4" stroke="#b8a800"/>'
    )
    chart.foreground.append(_text(left + width / 2, chart.y + LINE_H, lines))
    chart.y += height + 8


def mermaid_to_svg(mermaid: str, title: str = "") -> str:
    """The SVG picture of a `to_mermaid` sequence chart. Raises ValueError on a line outside the
    subset `to_mermaid` writes, naming the line."""
    lines = mermaid.rstrip("\n").split("\n")
    if not lines or lines[0].strip() != "sequenceDiagram":
        raise ValueError("not a Mermaid sequence diagram (first line is not 'sequenceDiagram')")
    chart = _Chart()
    blocks: list[_Block] = []
    active: dict[str, float] = {}
    for number, raw in enumerate(lines[1:], start=2):
        line = raw.strip()
        if not line:
            continue
        if m := _PARTICIPANT.fullmatch(line):
            chart.lanes[m.group(1)] = len(chart.lanes)
            chart.labels.append(m.group(2) or m.group(1))
        elif m := _MESSAGE.fullmatch(line):
            _message(chart, m.group(1), m.group(2), m.group(3), m.group(4))
        elif m := _NOTE.fullmatch(line):
            _note(chart, m.group(1), m.group(2), m.group(3))
        elif m := _ACTIVATION.fullmatch(line):
            lane = m.group(2)
            if m.group(1) == "activate":
                active[lane] = chart.y
            elif lane in active:
                top = active.pop(lane)
                chart.background.append(
                    f'<rect class="activation" x="{chart.x(lane) - 5:.0f}" y="{top:.0f}" '
                    f'width="10" height="{max(chart.y - top, 4):.0f}" fill="#dde8f8" '
                    'stroke="#5577aa"/>'
                )
        elif m := _RECT.fullmatch(line):
            blocks.append(_Block("rect", chart.y - 4, fill=f"rgb({','.join(m.groups())})"))
        elif m := _LOOP.fullmatch(line):
            blocks.append(_Block("loop", chart.y, label=m.group(1)))
            chart.y += LINE_H + 8
        elif line == "end" and blocks:
            block = blocks.pop()
            width = LANE_W * len(chart.lanes) - 8
            height = chart.y - block.top
            if block.kind == "rect":
                chart.background.append(
                    f'<rect class="step" x="{MARGIN + 4}" y="{block.top:.0f}" width="{width}" '
                    f'height="{height:.0f}" fill="{block.fill}"/>'
                )
            else:
                chart.background.append(
                    f'<rect class="loop" x="{MARGIN + 4}" y="{block.top:.0f}" width="{width}" '
                    f'height="{height:.0f}" fill="none" stroke="#666" stroke-dasharray="6,3"/>'
                )
                chart.foreground.append(
                    _text(MARGIN + 10, block.top + LINE_H, [f"loop: {block.label}"], "start")
                )
            chart.y += 4
        else:
            raise ValueError(f"line {number}: not in the chart subset drawn as SVG: {line!r}")
    if not chart.lanes:
        raise ValueError("the chart has no participants")
    bottom = chart.y + 10
    width = 2 * MARGIN + LANE_W * len(chart.lanes)
    height = bottom + MARGIN
    heads: list[str] = []
    for name, index in chart.lanes.items():
        x = chart.x(name)
        heads.append(
            f'<line class="lifeline" x1="{x:.0f}" y1="{MARGIN + HEAD_H}" x2="{x:.0f}" '
            f'y2="{bottom:.0f}" stroke="#999" stroke-dasharray="3,3"/>'
        )
        heads.append(
            f'<rect class="participant" x="{x - 60:.0f}" y="{MARGIN}" width="120" '
            f'height="{HEAD_H}" fill="#eef" stroke="#446"/>'
        )
        heads.append(_text(x, MARGIN + 19, [chart.labels[index]], bold=True))
    defs = (
        "<defs>"
        '<marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" '
        'markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#333"/>'
        "</marker>"
        '<marker id="open" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" '
        'markerHeight="8" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10" fill="none" '
        'stroke="#333"/></marker>'
        '<marker id="cross" viewBox="0 0 10 10" refX="5" refY="5" markerWidth="9" '
        'markerHeight="9"><path d="M0,0 L10,10 M10,0 L0,10" stroke="#c00" stroke-width="2"/>'
        "</marker>"
        "</defs>"
    )
    parts = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0f}" '
        f'viewBox="0 0 {width} {height:.0f}">',
        f"<title>{escape(title)}</title>" if title else "",
        defs,
        f'<rect width="{width}" height="{height:.0f}" fill="white"/>',
        *chart.background,
        *heads,
        *chart.foreground,
        "</svg>",
    ]
    return "\n".join(p for p in parts if p) + "\n"
