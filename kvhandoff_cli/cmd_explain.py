"""`kvhandoff explain TRACE`: a trace as a narrative, a Mermaid sequence chart (or its SVG
picture), Markdown, or an offline HTML page."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from kvhandoff.cli.main import EXIT_OK, UsageError
from kvhandoff.model_checker.explain import FORMATS, Story, build_story, render, same_requests_under
from kvhandoff.model_checker.variant_loader import VariantLoadError, load_variant, variant_of_trace
from kvhandoff.spec.trace import Trace, TraceError, load_header, load_trace


def register(sub: Any) -> None:
    p = sub.add_parser(
        "explain",
        help="explain a trace step by step, or draw it as a Mermaid sequence chart",
        description=(
            "Replay a trace (a counterexample from `kvhandoff check --trace-out`, or any trace in "
            "the kvhandoff format) through the spec with the variant its header names, and tell "
            "what each step changed. Exit 0 when the trace replays, 2 on a bad trace (the "
            "message names the line)."
        ),
    )
    p.add_argument("trace", metavar="TRACE", help="a JSON Lines trace file")
    p.add_argument(
        "--format",
        choices=(*FORMATS, "svg", "html"),
        default="text",
        help="text (narrative, default), mermaid (sequence chart), svg (the same chart as one "
        "SVG picture, drawn without a browser), markdown (narrative and chart) or html (an "
        "offline page to step through in a browser, with the reference on the same requests)",
    )
    p.add_argument(
        "--variant",
        help="replay under this variant (catalogue name or .py file) instead of the one the "
        "trace's header names (a catalogue name, or a variant file and its sha256)",
    )
    p.add_argument(
        "--against",
        metavar="VARIANT",
        help=(
            "instead, explain the shortest fault-free run of VARIANT that sends the trace's "
            "requests in the same order and ends them all (e.g. --against reference: the fix)"
        ),
    )
    p.set_defaults(func=run_explain)


def _step_line(text: str, message: str) -> str:
    """Turn replay's `step N: ...` into `line L (step N): ...` (blank lines are skipped)."""
    match = re.match(r"step (\d+): (.*)", message, re.DOTALL)
    if not match:
        return message
    wanted = int(match.group(1))
    seen = 0
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        seen += 1
        if seen == wanted + 1:  # the header is the first non-blank line
            return f"line {lineno} (step {wanted}): {match.group(2)}"
    return message


def load_story(path: str, variant_name: str | None = None) -> Story:
    """Read and replay a trace file; every problem is a `UsageError` naming the line.

    The variant is `variant_name` (a `--variant`), else the one the trace's header names: a
    catalogue name, or a variant file (found again by its path; a changed file is replayed as it
    is now, with a note on stderr, since the trace may then no longer replay)."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"{path}: no such trace file")
    text = file.read_text(encoding="utf-8")
    try:
        header = load_header(text)
    except TraceError as exc:
        raise UsageError(f"{path}: {exc}") from exc
    try:
        found = variant_of_trace(header, variant_name)
    except VariantLoadError as exc:
        where = "--variant" if variant_name else "line 1"
        raise UsageError(f"{path}: {where}: {exc}") from exc
    if found.note:
        print(f"kvhandoff explain: note: {found.note}", file=sys.stderr)
    variant = found.variant
    try:
        trace = load_trace(text, variant.extra_action_types)
    except TraceError as exc:
        raise UsageError(f"{path}: {exc}") from exc
    try:
        return build_story(variant, trace)
    except TraceError as exc:
        changed = f" ({found.note})" if found.note else ""
        raise UsageError(f"{path}: {_step_line(text, str(exc))}{changed}") from exc


def run_explain(args: argparse.Namespace) -> int:
    story = load_story(args.trace, args.variant)
    if args.against:
        try:
            other = load_variant(args.against)
        except VariantLoadError as exc:
            raise UsageError(f"--against: {exc}") from exc
        trace = Trace(story.config, tuple(s.action for s in story.steps))
        try:
            story = build_story(other, same_requests_under(other, trace))
        except ValueError as exc:
            raise UsageError(f"--against {args.against}: {exc}") from exc
    if args.format == "html":
        print(_html(story), end="")
        return EXIT_OK
    if args.format == "svg":
        from kvhandoff.cli.svg_chart import mermaid_to_svg

        title = f"{story.variant.name}: {story.property_name or 'trace'}"
        print(mermaid_to_svg(render(story, "mermaid"), title), end="")
        return EXIT_OK
    print(render(story, args.format), end="")
    return EXIT_OK


def _html(story: Story) -> str:
    """The explorer page; beside a broken variant, the reference on the same requests (when the
    reference can end them all; otherwise the page shows the trace alone)."""
    from kvhandoff.model_checker.html_explorer import to_html

    against = None
    if story.variant.name != "reference":
        reference = load_variant("reference")
        trace = Trace(story.config, tuple(s.action for s in story.steps))
        try:
            against = build_story(reference, same_requests_under(reference, trace))
        except ValueError:
            against = None
    return to_html(story, against, "reference on the same requests")
