"""The `kvhandoff` command line: one subcommand module per feature.

Exit codes, shared by every subcommand that reports a verdict:
0 = safe / conforms: proved, for the scope the command prints;
1 = violated / diverges: a counterexample (replayed through the spec);
2 = bad usage or bad input (an exception in a variant file's code included);
3 = inconclusive: unknown, timeout, a state limit, an engine that cannot encode the variant, or a
    bounded search with no completeness argument (`bounded`);
4 = engines disagree: one engine proves a property that another violates on the same variant and
    configuration (`check --engine all`, `matrix`). A bug in kvhandoff, not a verdict.
130 = interrupted (Ctrl-C; what was covered so far is printed on stderr), 141 = stdout was closed
by its reader (`| head`), quietly.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Sequence

from kvhandoff.model_checker.variant_loader import VariantCodeError

EXIT_OK = 0
EXIT_VIOLATED = 1
EXIT_USAGE = 2
EXIT_INCONCLUSIVE = 3
EXIT_DISAGREE = 4
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader left

# Each module defines `register(subparsers)`, which adds its subcommands and sets `func` on them.
# `func(args) -> int` returns the exit code.
COMMAND_MODULES = [
    "kvhandoff.cli.cmd_check",
    "kvhandoff.cli.cmd_matrix",
    "kvhandoff.cli.cmd_check_config",
    "kvhandoff.cli.cmd_serve",
    "kvhandoff.cli.cmd_explain",
    "kvhandoff.cli.cmd_demo",
    "kvhandoff.cli.cmd_conform",
    "kvhandoff.cli.cmd_harness",
    "kvhandoff.cli.cmd_review",
    "kvhandoff.cli.cmd_examples",
]


class UsageError(Exception):
    """Bad usage or bad input: printed as one line and mapped to exit code 2."""


def _version() -> str:
    # The installed distribution's metadata: one source of truth, pyproject.toml's version.
    try:
        return importlib.metadata.version("kvhandoff")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed; run from a source tree)"


def build_parser(modules: Sequence[str] = COMMAND_MODULES) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvhandoff",
        description=(
            "Prove, test and teach the prefill->decode KV-cache handoff of disaggregated LLM "
            "inference. Exit codes: 0 safe/conforms (proved, for the scope printed), 1 "
            "violated/diverges, 2 bad usage or input, 3 inconclusive (unknown, cannot encode, "
            "bounded), 4 engines disagree (a bug in kvhandoff)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in modules:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None, modules: Sequence[str] = COMMAND_MODULES) -> int:
    """`modules` lets a test run one subcommand without importing the others."""
    parser = build_parser(modules)
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    from kvhandoff.cli.output import error_json
    from kvhandoff.cli.progress import EXIT_INTERRUPTED, interrupted_lines, shown

    try:
        with shown(args.command):
            code: int = func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below
    except UsageError as exc:
        print(f"kvhandoff {args.command}: error: {exc}", file=sys.stderr)
        if getattr(args, "json", False):
            # A program reading --json gets an object it can parse, not an empty stdout.
            print(json.dumps(error_json(args.command, str(exc), EXIT_USAGE)))
        return EXIT_USAGE
    except KeyboardInterrupt:
        # No traceback: say what was covered, and exit as a shell expects of Ctrl-C.
        for line in interrupted_lines(args.command):
            print(line, file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `kvhandoff ... | head`: the reader has what it wanted. Point stdout at /dev/null so the
        # interpreter's final flush does not raise again, and exit as a process killed by SIGPIPE.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except VariantCodeError as exc:
        # The user's variant file raised while an engine or a replay ran it: bad input, exit 2,
        # never a traceback and exit 1 (which CI would read as "the change breaks a property").
        print(f"kvhandoff {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return code


if __name__ == "__main__":
    # Under `python -m kvhandoff.cli.main` this file runs as `__main__`, a second copy of the
    # module: the commands raise `kvhandoff_cli.main.UsageError`, which this copy's `except` would
    # not catch. Run the copy the commands import.
    from kvhandoff.cli.main import main as _main

    sys.exit(_main())
