"""`kvhandoff check-config`: is a prefill/decode deployment's configuration safe to roll out?

Exit codes: 0 safe (proved by Z3), 1 unsafe (findings name the rule, the failing prompt lengths
and the flag to change), 2 bad input (the message names the flag and the value), 3 inconclusive
(Z3 answered unknown).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvhandoff.cli.main import EXIT_INCONCLUSIVE, UsageError
from kvhandoff.model_checker.deployment import (
    CheckerOptions,
    ConfigInputError,
    InconclusiveError,
    decide,
    from_commands,
    from_toml,
)
from kvhandoff.model_checker.deployment.bridge import (
    check_command,
    protocol_variant,
    to_protocol_config,
)
from kvhandoff.model_checker.deployment.decision import DEFAULT_TIMEOUT_MS, Decision
from kvhandoff.model_checker.deployment.model import SGLANG_VERSIONS
from kvhandoff.model_checker.deployment.report import exit_code, render_json, render_text

EPILOG = """\
examples:
  kvhandoff check-config \\
    --prefill 'python -m sglang.launch_server --model-path M --disaggregation-mode prefill
               --context-length 1048576 --max-total-tokens 681280' \\
    --decode  'python -m sglang.launch_server --model-path M --disaggregation-mode decode
               --context-length 1048576 --max-total-tokens 2097152' --sglang-version 0.5.11
  kvhandoff check-config --config deployment.toml --json

exit codes: 0 safe, 1 unsafe, 2 bad input, 3 inconclusive. See docs/check-config.md.
"""


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected seconds ≥ 0, got {text!r}")
    return value


def register(subparsers: Any) -> None:
    p: argparse.ArgumentParser = subparsers.add_parser(
        "check-config",
        help="check a prefill/decode deployment's capacity and handoff settings before rollout",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_argument_group("the deployment (two command lines, or --config)")
    src.add_argument("--prefill", metavar="CMD", help="prefill server's launch command line")
    src.add_argument("--decode", metavar="CMD", help="decode server's launch command line")
    src.add_argument("--config", metavar="FILE", type=Path, help="neutral TOML description")
    opt = p.add_argument_group("what the command lines leave open")
    opt.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment of both servers, or of one with prefill:KEY=VALUE or decode:KEY=VALUE "
        "(repeatable)",
    )
    opt.add_argument("--prefill-env", action="append", default=[], metavar="KEY=VALUE")
    opt.add_argument("--decode-env", action="append", default=[], metavar="KEY=VALUE")
    opt.add_argument(
        "--prefill-pool-tokens",
        type=_positive_int,
        metavar="N",
        help="prefill's KV pool as the server reports it (profiled from GPU memory)",
    )
    opt.add_argument("--decode-pool-tokens", type=_positive_int, metavar="N")
    opt.add_argument(
        "--context-window",
        type=_positive_int,
        metavar="N",
        help="the window the router advertises (default: the larger role window)",
    )
    opt.add_argument(
        "--model-context-length",
        type=_positive_int,
        metavar="N",
        help="the model's own window, for roles without --context-length",
    )
    opt.add_argument(
        "--sglang-version",
        choices=SGLANG_VERSIONS,
        help="SGLang release whose admission rules apply (default 0.5.23)",
    )
    opt.add_argument(
        "--max-decode-queueing",
        type=_seconds,
        metavar="SECONDS",
        help="longest wait in decode's queues before pages are allocated (C6)",
    )
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="machine-readable report")
    out.add_argument(
        "--run-protocol-check",
        action="store_true",
        help="after the report, run the printed `kvhandoff check` on the scaled protocol model",
    )
    out.add_argument(
        "--timeout-ms",
        type=_positive_int,
        default=DEFAULT_TIMEOUT_MS,
        help="Z3 timeout per query; a timeout is inconclusive (exit 3)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.run_protocol_check and args.json:
        raise UsageError("--run-protocol-check: prints text, so it cannot be combined with --json")
    try:
        if args.config is not None:
            clashing = [
                flag
                for flag, value in (
                    ("--prefill", args.prefill),
                    ("--decode", args.decode),
                    ("--env", args.env),
                    ("--prefill-env", args.prefill_env),
                    ("--decode-env", args.decode_env),
                    ("--prefill-pool-tokens", args.prefill_pool_tokens),
                    ("--decode-pool-tokens", args.decode_pool_tokens),
                    ("--context-window", args.context_window),
                    ("--model-context-length", args.model_context_length),
                    ("--sglang-version", args.sglang_version),
                    ("--max-decode-queueing", args.max_decode_queueing),
                )
                if value
            ]
            if clashing:
                raise UsageError(
                    f"{clashing[0]}: not allowed with --config; put the setting in the file"
                )
            deployment = from_toml(args.config)
        else:
            missing = [f for f in ("--prefill", "--decode") if not getattr(args, f[2:])]
            if missing:
                raise UsageError(
                    f"{missing[0]}: missing; give both --prefill and --decode command lines, "
                    "or --config FILE"
                )
            deployment = from_commands(
                args.prefill,
                args.decode,
                CheckerOptions(
                    env=args.env,
                    prefill_env=args.prefill_env,
                    decode_env=args.decode_env,
                    prefill_pool_tokens=args.prefill_pool_tokens,
                    decode_pool_tokens=args.decode_pool_tokens,
                    router_window=args.context_window,
                    model_context_length=args.model_context_length,
                    sglang_version=args.sglang_version,
                    max_decode_queueing_s=args.max_decode_queueing,
                ),
            )
        decision = decide(deployment, timeout_ms=args.timeout_ms)
    except ConfigInputError as exc:
        raise UsageError(str(exc)) from exc
    except InconclusiveError as exc:
        print(f"kvhandoff check-config: INCONCLUSIVE (exit 3): {exc}", file=sys.stderr)
        return EXIT_INCONCLUSIVE
    if args.json:
        import json

        from kvhandoff.cli import output

        # The report's fields come from the deployment model; the schema id is the CLI's.
        output.print_json("check-config", json.loads(render_json(decision)), indent=2)
    else:
        sys.stdout.write(render_text(decision))
    if args.run_protocol_check:
        run_protocol_check(decision)
    return exit_code(decision)


PROTOCOL_CHECK_MODULE = "kvhandoff.cli.cmd_check"


def run_protocol_check(decision: Decision) -> int | None:
    """Run `kvhandoff check` on the scaled deployment, in-process. Its verdict is printed, not
    returned as ours: the deployment's verdict is check-config's exit code. Returns the protocol
    check's exit code, or None when this checkout has no `kvhandoff check` yet."""
    from kvhandoff.cli.main import main

    pairs = to_protocol_config(decision.deployment, decision.findings)
    variant = "reference" if decision.safe else protocol_variant(decision.findings)
    argv = ["check", "--variant", variant]
    for key, value in pairs.items():
        argv += ["--set", f"{key}={value}"]
    print(f"\n$ {check_command(variant, pairs)}", flush=True)
    try:
        code = main(argv, modules=[PROTOCOL_CHECK_MODULE])
    except ModuleNotFoundError as exc:
        if exc.name != PROTOCOL_CHECK_MODULE:
            raise
        print("kvhandoff check is not available in this checkout; run the command above later")
        return None
    print(f"(kvhandoff check exited {code})")
    return code
