"""`kvhandoff conform`, `kvhandoff replay` and `kvhandoff validate-log`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvhandoff.cli import output
from kvhandoff.cli.main import EXIT_INCONCLUSIVE, EXIT_OK, EXIT_VIOLATED, UsageError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "conform",
        help="run a conformance campaign against an implementation (spec as oracle)",
        description=(
            "Generate lockstep programs (Hypothesis) and run them against a target with the "
            "reference spec as oracle. Exit 0 when the target conforms, 1 when it diverges (the "
            "shrunk program is written as a trace file), 2 on bad usage, 3 when the target "
            "failed (a harness service that cannot be reached or broke a call)."
        ),
    )
    p.add_argument(
        "--target",
        default="inproc",
        help="inproc (default), grpc, or HOST:PORT of a harness service (kvhandoff harness-serve)",
    )
    p.add_argument("--mode", default="reference", help="implementation mode (impl.modes)")
    p.add_argument(
        "--transport",
        choices=("grpc", "mooncake"),
        default="grpc",
        help="page data path of --target grpc's servers (default grpc; mooncake: one-sided "
        "writes with Mooncake's transfer engine)",
    )
    p.add_argument(
        "--traces",
        type=int,
        default=None,
        help="programs to run (default 1000 on a fine-grained target: in-process, where a "
        "program costs about 13 ms, or an engine behind the harness service that controls "
        "single messages; 100 on a coarse one: the real servers, SGLang, vLLM); Hypothesis may "
        "run a few more than asked (those it discards are run too), and the report says how "
        "many ran",
    )
    p.add_argument("--steps", type=int, default=20, help="spec steps per program (default 20)")
    p.add_argument(
        "--max-retries",
        type=int,
        default=0,
        metavar="N",
        help="client retries under the same request id per program (the spec's "
        "router_retry_request; default 0). The in-process target plays them, and an engine "
        "behind the harness service (--target HOST:PORT) whose Info says retries",
    )
    p.add_argument(
        "--instances",
        action="store_true",
        help="play the scenario on two prefill and two decode instances of three pages each, "
        "each program placing the requests its own way (the router's choice); a crash restarts "
        "one instance, a partition cuts one decode instance off one prefill instance. The "
        "in-process target plays them all; the gRPC target (--target grpc) runs two prefill and "
        "two decode servers, each request pinned where its placement puts it, with crashes of "
        "one prefill instance between requests (with --faults, of one instance of either role "
        "at any time); an engine behind the harness service plays them if its Info says "
        "instances",
    )
    p.add_argument(
        "--rooms-any",
        action="store_true",
        help="let the clients choose the requests' rooms (the spec's rooms=any: a client's "
        "bootstrap_room is taken as sent): each program plays one way of sharing rooms among "
        "the three requests (five, from all apart to all on one room) instead of the scenario's "
        "rooms; with every target, and with --instances and --faults",
    )
    p.add_argument(
        "--no-write-errors",
        dest="write_errors",
        action="store_false",
        help="leave out the failed page write (the spec's prefill_write_error: a write fails on "
        "prefill's side mid-transfer, prefill fails the request and tells decode while other "
        "writes of the grant are still on the wire, where they may still land). By default a "
        "program may take one, where its faults include prefill's own abort and the target "
        "controls single writes",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--junit", metavar="FILE", help="write a JUnit XML report")
    p.add_argument(
        "--out",
        metavar="DIR",
        default="kvhandoff-conform",
        help="where shrunk failures go (default ./kvhandoff-conform/, apart from the demo's "
        "./kvhandoff-report/)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--faults",
        metavar="LIST",
        help="with --target grpc: a fault campaign over the real servers, with these faults "
        "(comma-separated, or all): crash, restart, cancel, timeout, late, dup, drop, oversize "
        "(see conformance/fault_campaign.py)",
    )
    p.set_defaults(func=run_conform)

    r = sub.add_parser(
        "replay",
        help="replay a trace file against an implementation",
        description=(
            "Drive a target with a trace (a model-checker counterexample, a saved conformance "
            "failure, a hand-written scenario) and report where it agrees with the reference "
            "spec and where it diverges. Exit 0 when it conforms, 1 when not, 2 on bad usage, "
            "3 when the target failed."
        ),
    )
    r.add_argument("trace", help="trace file (JSON Lines)")
    r.add_argument(
        "--target",
        default="inproc",
        help="inproc (default), grpc, or HOST:PORT of a harness service (kvhandoff harness-serve)",
    )
    r.add_argument("--mode", help="implementation mode (default: from the trace, else reference)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=run_replay)

    v = sub.add_parser(
        "validate-log",
        help="validate implementation event logs against the spec",
        description=(
            "Merge the event logs of prefill, decode and router by causality and search for a "
            "spec behaviour that explains them. Exit 0 when explained, 1 when not (the longest "
            "explained prefix, the first unexplained event and the spec actions enabled there "
            "are reported), 2 on bad usage or unreadable logs."
        ),
    )
    v.add_argument("logs", nargs="+", help="event-log files (router.jsonl prefill.jsonl ...)")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=run_validate)


def _check_mode(mode: str) -> None:
    from kvhandoff.impl.modes import MODES

    if mode not in MODES:
        raise UsageError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")


def _make_target(name: str, mode: str | None) -> Any:
    """The target named by --target; a remote one is reached now (Info) so that an address
    where nothing answers fails before the run, and its modes checked. Raises UsageError, or
    TargetError (see `_target_errors`)."""
    from kvhandoff.conformance import campaign
    from kvhandoff.conformance.remote_target import RemoteTarget

    try:
        target = campaign.make_target(name)
    except campaign.UnknownTarget as exc:
        raise UsageError(str(exc)) from exc
    if isinstance(target, RemoteTarget):
        modes = target.modes()
        if mode is not None and modes and mode not in modes:
            raise UsageError(
                f"the engine at {name} has no mode {mode!r}; its modes: {', '.join(modes)}"
            )
    elif mode is not None:
        _check_mode(mode)  # a remote engine has its own modes (above)
    return target


def _target_errors(command: str, body: Any, junit: Callable[[str], None] | None = None) -> int:
    """Run `body()`; a target that failed (rather than diverged) gives no verdict: exit 3, or 2
    when the engine refused a value we sent (a mode or scenario it does not accept). `junit`
    gets the error of a failed target, so CI still finds a report."""
    from kvhandoff.conformance.remote_target import HarnessRefused
    from kvhandoff.conformance.target import TargetError, UnsupportedScenario

    try:
        code: int = body()
    except (HarnessRefused, UnsupportedScenario) as exc:
        raise UsageError(str(exc)) from exc
    except TargetError as exc:
        print(f"kvhandoff {command}: error: {exc}", file=sys.stderr)
        if junit is not None:
            junit(str(exc))
        return EXIT_INCONCLUSIVE
    return code


def _release(command: str, target: Any) -> None:
    """Release the target after the run; a failure here is a warning, not the run's verdict."""
    from kvhandoff.conformance.target import TargetError

    try:
        target.shutdown()
    except TargetError as exc:
        print(
            f"kvhandoff {command}: warning: could not shut the target down: {exc}", file=sys.stderr
        )


def _not_covered_lines(not_covered: dict[str, str]) -> list[str]:
    if not not_covered:
        return []
    return [
        "  not covered (the target cannot perform these; their steps were skipped and their "
        f"checks not made, --json says why): "
        f"{', '.join(sorted(not_covered))}"
    ]


def run_conform(args: argparse.Namespace) -> int:
    faults = getattr(args, "faults", None) is not None
    if args.traces is None and (args.target == "inproc" or faults):
        # In-process is fine-grained, the fault campaign's real servers coarse; any other
        # target is asked once it exists (`_conform`).
        args.traces = _default_traces(fine_grained=not faults)
    if (args.traces is not None and args.traces < 1) or args.steps < 1:
        raise UsageError("--traces and --steps must be at least 1")
    if getattr(args, "faults", None) is not None:
        return _fault_campaign(args)

    if args.transport != "grpc":
        if args.target != "grpc":
            raise UsageError(f"--transport {args.transport} needs --target grpc")
        from kvhandoff.impl.errors import ConfigError
        from kvhandoff.impl.transport import loopback

        try:
            loopback.reexec_with_preload()
        except ConfigError as exc:
            raise UsageError(str(exc)) from exc

    def body() -> int:
        target = _make_target(args.target, args.mode)
        if args.transport != "grpc":
            target.transport = args.transport
        try:
            return _conform(args, target)
        finally:
            _release("conform", target)

    def junit(error: str) -> None:
        if args.junit:
            suite = output.target_error_suite("conform", args.target, args.mode, error)
            output.write_junit(Path(args.junit), [suite])

    return _target_errors("conform", body, junit)


def _event_log_suffix(path: str) -> str:
    """The suffix of a coarse campaign's saved event log (".log.jsonl", or ".round.jsonl" for an
    adversarial round's), "" for a program file."""
    return next((s for s in (".log.jsonl", ".round.jsonl") if path.endswith(s)), "")


def _default_traces(fine_grained: bool) -> int:
    """Programs to run when --traces is not given: 1000 on a fine-grained target, where a
    program costs about 13 ms in-process (300 missed three single-bug mutants that 1000 kill,
    and through the harness service 100 missed four that 1000 kill at the same programs as
    in-process: benchmarks/results/conformance_mutation.txt); 100 on a coarse one (real
    servers: seconds a program)."""
    return 1000 if fine_grained else 100


def _conform(args: argparse.Namespace, target: Any) -> int:
    from kvhandoff.conformance import campaign

    if args.traces is None:
        args.traces = _default_traces(bool(target.fine_grained))

    report = campaign.run(
        args.target,
        args.mode,
        traces=args.traces,
        steps=args.steps,
        seed=args.seed,
        out_dir=Path(args.out),
        target=target,
        max_retries=args.max_retries,
        instances=args.instances,
        rooms_any=args.rooms_any,
        write_errors=args.write_errors,
    )
    if args.junit:
        output.write_junit(Path(args.junit), [output.conform_suite(report, args.seed)])
    if args.json:
        output.print_json("conform", report.to_json(), sort_keys=True)
    else:
        print(
            f"target {report.target}, mode {report.mode}: {report.traces} traces of up to "
            f"{report.steps} steps in {report.seconds:.1f} s: {report.verdict}"
        )
        for f in report.failures:
            print(f"  {f.kind} ({f.property}): {f.message}")
            # The trace names its mode; a remote target must be named again to be replayed on.
            target = "" if report.target == "inproc" else f" --target {report.target}"
            log = _event_log_suffix(f.trace_file)
            if log:
                # A coarse target's failure is an event log (replay refuses one); the program
                # that produced it is saved beside it.
                program = f.trace_file[: -len(log)] + ".jsonl"
                print(f"  event log: {f.trace_file} (kvhandoff validate-log {f.trace_file})")
                print(f"  program: {program} (kvhandoff replay {program}{target})")
            else:
                print(f"  shrunk program: {f.trace_file} (kvhandoff replay {f.trace_file}{target})")
        for line in _not_covered_lines(report.not_covered):
            print(line)
        if report.coverage is not None and report.conforms:
            print(f"  {report.coverage.summary()}")
    return EXIT_OK if report.conforms else EXIT_VIOLATED


def _fault_campaign(args: argparse.Namespace) -> int:
    from kvhandoff.conformance.fault_campaign import parse_faults, run_fault_campaign
    from kvhandoff.impl.errors import ConfigError
    from kvhandoff.impl.modes import get_mode

    if args.target != "grpc":
        raise UsageError(
            f"--faults runs over the real gRPC servers: use --target grpc, not {args.target!r}"
        )

    try:
        faults = parse_faults(args.faults)
        get_mode(args.mode)
    except (ValueError, ConfigError) as exc:
        raise UsageError(str(exc)) from exc
    report = run_fault_campaign(
        args.mode,
        args.traces,
        args.seed,
        faults,
        Path(args.out),
        steps=args.steps,
        instances=args.instances,
        rooms_any=args.rooms_any,
    )
    if args.json:
        output.print_json("fault-campaign", report.to_json(), sort_keys=True)
    else:
        verdict = "conforms" if report.conforms else "diverges"
        print(
            f"target grpc, mode {report.mode}, faults {','.join(report.faults)}: "
            f"{report.traces} traces in {report.seconds:.1f} s: {verdict}; "
            f"{report.divergences} divergences, {report.cross_tenant_reads} cross-tenant reads, "
            f"{report.unanswered} unanswered, {report.pages_lost} with pages held at quiescence"
        )
        print("  injected: " + ", ".join(f"{k} {v}" for k, v in sorted(report.injected.items())))
        if report.failure is not None:
            f = report.failure
            print(f"  trace {f['trace']}: {f['kind']} ({f['property']}): {f['message']}")
            print(f"  program: {f['program']}")
            print(f"  merged log: {f['log']} (kvhandoff validate-log {f['log']})")
    return EXIT_OK if report.conforms else EXIT_VIOLATED


def run_replay(args: argparse.Namespace) -> int:
    from kvhandoff.model_checker.variant_loader import VariantLoadError, variant_of_trace
    from kvhandoff.spec.trace import TraceError, load_header, load_trace

    try:
        text = Path(args.trace).read_text()
        header = load_header(text)
    except OSError as exc:
        raise UsageError(f"cannot read {args.trace}: {exc}") from exc
    except TraceError as exc:
        raise UsageError(f"{args.trace}: {exc}") from exc
    variant = None
    if header.get("variant_file"):
        # A variant file the trace was made with predicts what the target should do; a catalogue
        # name is looked up by `replay_trace` itself.
        try:
            found = variant_of_trace(header)
        except VariantLoadError as exc:
            raise UsageError(f"{args.trace}: line 1: {exc}") from exc
        if found.note:
            print(f"kvhandoff replay: note: {found.note}", file=sys.stderr)
        variant = found.variant
    try:
        trace = load_trace(text, variant.extra_action_types if variant is not None else ())
    except TraceError as exc:
        raise UsageError(f"{args.trace}: {exc}") from exc

    def body() -> int:
        target = _make_target(args.target, args.mode)
        try:
            return _replay(args, trace, target, variant)
        finally:
            _release("replay", target)

    return _target_errors("replay", body)


def _replay(args: argparse.Namespace, trace: Any, target: Any, variant: Any = None) -> int:
    from kvhandoff.conformance.replay import replay_trace

    report = replay_trace(trace, target, args.mode, variant)
    if args.json:
        output.print_json("replay", report.to_json(), sort_keys=True, default=str)
    else:
        print(report.summary())
    return EXIT_OK if report.conforms else EXIT_VIOLATED


def run_validate(args: argparse.Namespace) -> int:
    from kvhandoff.conformance.validate import LogError, validate_logs

    try:
        report = validate_logs([Path(p) for p in args.logs])
    except LogError as exc:
        raise UsageError(str(exc)) from exc
    if args.json:
        output.print_json("validate-log", report.to_json(), sort_keys=True, default=str)
    else:
        print(report.message)
        if not report.ok:
            print(f"longest explained prefix: {report.explained} of {report.events} events")
            names = sorted({a["action"] for a in report.enabled_there})
            print(f"spec actions enabled there: {', '.join(names)}")
    return EXIT_OK if report.ok else EXIT_VIOLATED
