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


def _is_conformance_program(path: str) -> bool:
    try:
        header = load_header(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, TraceError):
        return False  # load_story reports it
    return header.get("kind") == "failure" and "mode" in header


def conformance_story(path: str) -> tuple[Story, str]:
    """A shrunk conformance program (`conform` writes it with header kind "failure"): a list of
    the operations the campaign drove, not a spec trace (one operation can take several spec
    steps on the target, say decode admitting and reserving). So it is driven again on the
    in-process implementation in the recorded mode, and the story is the spec steps that explain
    what the implementation did, up to the first thing nothing explains; that divergence is
    returned with it. A remote or gRPC target's program is told as the in-process target runs it:
    `kvhandoff replay` reproduces it on the target itself."""
    from kvhandoff.conformance.campaign import make_target
    from kvhandoff.conformance.lockstep import Divergence, Session, report_of
    from kvhandoff.spec.actions import action_from_json
    from kvhandoff.spec.variants import REFERENCE

    text = Path(path).read_text(encoding="utf-8")
    try:
        trace = load_trace(text)
    except TraceError as exc:
        raise UsageError(f"{path}: {exc}") from exc
    mode = str(trace.header["mode"])
    target = make_target("inproc")
    target.shortfall = {int(r): int(n) for r, n in dict(trace.header.get("shortfall", {})).items()}
    divergence: Divergence | None = None
    session: Session | None = None
    try:
        try:
            session = Session(target, trace.config, mode)
            for action in trace.actions:
                session.do(action)
            session.finish()
        except Divergence as exc:
            divergence = exc
        except ValueError as exc:  # an unknown mode, a config the target refuses
            raise UsageError(f"{path}: cannot drive the program in mode {mode!r}: {exc}") from exc
        report = report_of(divergence) if divergence is not None else None
        if report is not None:
            explained = tuple(action_from_json(a) for a in report.spec_actions)
        else:
            explained = session.explained_actions() if session is not None else ()
    finally:
        target.shutdown()
    # "the implementation's run" rather than "counterexample": the program itself broke nothing
    # in the spec; the implementation's next step is what the spec cannot explain.
    story = build_story(REFERENCE, Trace(trace.config, explained, {"kind": f"{mode} run"}))
    if divergence is None:
        return story, (
            f"the in-process implementation in mode {mode} now conforms on this program "
            f"(recorded: {trace.header.get('message', 'a divergence')})"
        )
    return story, f"then {divergence.kind} ({divergence.property}): {divergence.message}"


def run_explain(args: argparse.Namespace) -> int:
    if args.variant is None and args.against is None and _is_conformance_program(args.trace):
        story, ending = conformance_story(args.trace)
        if args.format in ("text", "markdown"):
            print(
                f"conformance program {args.trace}: what the implementation did, as the "
                "reference spec explains it, up to where nothing explains it"
            )
            print(render(story, args.format), end="")
            print(ending)
        else:
            # A chart or page stays valid on stdout; the divergence goes to stderr.
            print(_html(story) if args.format == "html" else _chart(story, args.format), end="")
            print(f"kvhandoff explain: {ending}", file=sys.stderr)
        return EXIT_OK
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
    print(_chart(story, args.format), end="")
    return EXIT_OK


def _chart(story: Story, fmt: str) -> str:
    if fmt == "svg":
        from kvhandoff.cli.svg_chart import mermaid_to_svg

        title = f"{story.variant.name}: {story.property_name or 'trace'}"
        return mermaid_to_svg(render(story, "mermaid"), title)
    return render(story, fmt)


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
