"""`kvhandoff review CHANGE.py`: one Markdown page for a pull request that changes the protocol.

The change (a variant file, as in docs/reviewing-a-change.md) is checked next to the reference
protocol on the change's own scenario, so the page answers the reviewer's questions in order:
which properties the change breaks that the reference keeps (and whether the author said so in
`breaks`), what the shortest run that breaks one looks like (chart and steps), and what each
engine said. Exit 0 when the change keeps every property the reference keeps, 1 when it breaks
one, 2 on bad usage or input, 3 when an engine could not decide.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvhandoff.cli.cmd_check import add_scenario_argument, add_timeout_argument
from kvhandoff.cli.main import EXIT_INCONCLUSIVE, EXIT_OK, EXIT_VIOLATED, UsageError

DEFAULT_ENGINES = "explore,prove"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "review",
        help="a Markdown review of a protocol change (a variant file) against the reference",
        description=(
            "Check a protocol change (a variant .py file or catalogue name) and the reference on "
            "the change's scenario, and write one Markdown page for the pull request: the "
            "properties it breaks or keeps against the reference, the shortest counterexample "
            "as a chart, and the engines' table. Exit 0 when it keeps every property the "
            "reference keeps, 1 when it breaks one, 2 on bad usage, 3 when inconclusive."
        ),
    )
    p.add_argument("change", metavar="CHANGE", help="variant file (.py defining VARIANT) or name")
    p.add_argument(
        "--engines",
        default=DEFAULT_ENGINES,
        help=f"comma-separated engines for the table (default {DEFAULT_ENGINES}; the "
        "explicit-state explorer always runs: its counterexamples are the shortest)",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    add_scenario_argument(p)
    add_timeout_argument(p)
    p.add_argument("--out", metavar="FILE", help="write the page here instead of stdout")
    p.set_defaults(func=run_review)


def run_review(args: argparse.Namespace) -> int:
    from kvhandoff.cli.cmd_check import _load_variant, load_config
    from kvhandoff.model_checker.engines import ENGINES, EngineCannotEncode, EngineOptions
    from kvhandoff.model_checker.result import CheckResult
    from kvhandoff.spec.variants import VARIANTS

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise UsageError(f"--engines: unknown {', '.join(unknown)}; known: {', '.join(ENGINES)}")
    if "explore" not in engines:
        engines.insert(0, "explore")
    change = _load_variant(args.change)
    config = load_config(args.set, change, args.scenario)
    reference = next(v for v in VARIANTS if v.name == "reference")
    options = EngineOptions(timeout=args.timeout)
    baseline = ENGINES["explore"](reference, config, options)
    results: dict[str, CheckResult] = {}
    cannot: dict[str, str] = {}
    for name in engines:
        try:
            results[name] = ENGINES[name](change, config, options)
        except EngineCannotEncode as exc:
            cannot[name] = str(exc)
    page, code = review_page(change, config, baseline, results, cannot)
    if args.out:
        Path(args.out).write_text(page, encoding="utf-8")
    else:
        print(page, end="")
    return code


def review_page(
    change: Any, config: Any, baseline: Any, results: dict[str, Any], cannot: dict[str, str]
) -> tuple[str, int]:
    """The Markdown page and the exit code."""
    from kvhandoff.model_checker.explain import build_story, config_lines, to_markdown
    from kvhandoff.spec.properties import ALWAYS, TERMINATION
    from kvhandoff.spec.trace import Trace

    explore = results["explore"]
    claims = {p.name: p.claim for p in (*ALWAYS, TERMINATION)}
    ref = {r.property: r.verdict for r in baseline.results}
    mine = {r.property: r for r in explore.results}
    for other in results.values():  # any engine's violation counts (they agree when all decide)
        for r in other.results:
            if r.verdict == "violated" and mine.get(r.property) is not None:
                if mine[r.property].verdict != "violated":
                    mine[r.property] = r
    breaks = [
        name for name, r in mine.items() if r.verdict == "violated" and ref.get(name) == "holds"
    ]
    undecided = [name for name, r in mine.items() if r.verdict == "unknown"]
    declared = set(change.breaks)
    lines = [f"# Protocol review: `{change.name}`", ""]
    lines += [f"> {change.summary}", ""]
    if change.explanation:
        lines += [change.explanation, ""]
    if breaks:
        verdict = (
            f"**Breaks {len(breaks)} propert{'y' if len(breaks) == 1 else 'ies'} the reference "
            f"keeps:** {', '.join(f'`{b}`' for b in breaks)}."
        )
        code = EXIT_VIOLATED
    elif undecided or cannot:
        verdict = "**Inconclusive:** " + ", ".join(
            [f"`{u}` undecided" for u in undecided] + [f"{e} cannot encode it" for e in cannot]
        )
        code = EXIT_INCONCLUSIVE
    else:
        verdict = "**Keeps every property the reference keeps** on this scenario."
        code = EXIT_OK
    lines += [verdict, ""]
    surprise = sorted(set(breaks) - declared)
    unmet = sorted(declared - set(breaks))
    if surprise:
        lines += [f"Not declared in `breaks`: {', '.join(f'`{s}`' for s in surprise)}.", ""]
    if unmet:
        lines += [f"Declared in `breaks` but not broken: {', '.join(f'`{u}`' for u in unmet)}.", ""]
    lines += ["Scenario:", ""] + [f"- {c}" for c in config_lines(config)] + [""]
    lines += ["## Properties against the reference", ""]
    lines += [
        "| property | claim | reference | this change | shortest counterexample |",
        "|---|---|---|---|---|",
    ]
    for name, r in mine.items():
        shown = {"violated": "**VIOLATED**", "holds": "holds", "unknown": "unknown"}[r.verdict]
        steps = f"{len(r.trace)} steps" if r.trace is not None else ""
        lines.append(
            f"| `{name}` | {claims.get(name, '')} | {ref.get(name, '?')} | {shown} | {steps} |"
        )
    lines.append("")
    with_trace = [mine[b] for b in breaks if mine[b].trace is not None]
    if with_trace:
        shortest = min(with_trace, key=lambda r: len(r.trace))
        header: dict[str, Any] = {"property": shortest.property, "kind": "counterexample"}
        if shortest.loop_start is not None:
            header["loop_start"] = shortest.loop_start
        story = build_story(change, Trace(config, tuple(shortest.trace), header))
        lines += [f"## The shortest counterexample: `{shortest.property}`", ""]
        lines += [
            "Replayed through the spec; each step shows only what it changed. To step through "
            "it in a browser: save it with `kvhandoff check --variant CHANGE.py --trace-out "
            "t.jsonl`, then `kvhandoff explain t.jsonl --variant CHANGE.py --format html`.",
            "",
        ]
        body = to_markdown(story, title="Counterexample", level=3)
        lines += [body.rstrip("\n"), ""]
    lines += ["## Engines", ""]
    lines += ["| engine | verdict | states | seconds | broken (depth) |", "|---|---|---|---|---|"]
    for name, result in results.items():
        broken = ", ".join(
            f"`{r.property}` ({r.depth})" if r.depth is not None else f"`{r.property}`"
            for r in result.violated()
        )
        states = f"{result.states:,}" if result.states is not None else ""
        lines.append(
            f"| {name} | {result.verdict} | {states} | {result.seconds:.1f} | {broken or '-'} |"
        )
    for name, why in cannot.items():
        lines.append(f"| {name} | cannot encode | | | {why} |")
    lines.append(
        f"| explore (reference) | {baseline.verdict} | {baseline.states or 0:,} | "
        f"{baseline.seconds:.1f} | - |"
    )
    lines.append("")
    return "\n".join(lines) + "\n", code
