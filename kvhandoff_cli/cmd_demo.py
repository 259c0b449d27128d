"""`kvhandoff demo`: the whole story in one run (what `make demo` runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvhandoff.cli.main import EXIT_OK, EXIT_VIOLATED, UsageError


def register(sub: Any) -> None:
    from kvhandoff.cli.demo import STAGES

    p = sub.add_parser(
        "demo",
        help="the incident from spec to proof to a real leak, with a report",
        description=(
            "Prove the reference protocol, find the incident's counterexample, replay it on the "
            "real servers in incident and reference modes, run a short conformance campaign, "
            "check every catalogue variant, and write a Markdown report. Exit 0 when every stage "
            "came out as the story says, 1 when one did not, 2 on bad usage."
        ),
    )
    p.add_argument(
        "--out",
        default="kvhandoff-report",
        metavar="DIR",
        help="where to write the report (default: ./kvhandoff-report/)",
    )
    p.add_argument(
        "--stages",
        default=",".join(STAGES),
        help=f"comma-separated subset of: {', '.join(STAGES)} (default: all)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the figures as one JSON object (progress goes to stderr)",
    )
    p.set_defaults(func=run_demo_command)


def run_demo_command(args: argparse.Namespace) -> int:
    from kvhandoff.cli.demo import STAGES, run_demo, summary_json

    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        raise UsageError(
            f"--stages {args.stages!r}: unknown stage {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(STAGES)}"
        )
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {args.out}: exists and is not a folder")
    stream = sys.stderr if args.json else sys.stdout
    run = run_demo(out, stages, stream)
    if args.json:
        from kvhandoff.cli import output

        output.print_json("demo", summary_json(run), indent=2)
    return EXIT_OK if run.ok else EXIT_VIOLATED
