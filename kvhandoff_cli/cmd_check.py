"""`kvhandoff check` and `kvhandoff variants`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kvhandoff_cli.main import EXIT_INCONCLUSIVE, EXIT_OK, EXIT_VIOLATED, UsageError
from model_checker.engines import ENGINES, EngineCannotEncode, EngineOptions
from model_checker.render import trace_lines
from model_checker.result import CheckResult
from model_checker.variant_loader import VariantLoadError, load_variant
from spec.config import Config, ConfigError, default_config, parse_set
from spec.variants import VARIANTS, Variant


def register(sub: Any) -> None:
    p = sub.add_parser(
        "check",
        help="check the handoff protocol (or a variant) against every property",
        description=(
            "Check every property of a protocol variant on a configuration. Exit 0 when every "
            "property holds, 1 when one is violated (the shortest counterexample is shown), "
            "2 on bad usage or input, 3 when inconclusive."
        ),
    )
    p.add_argument(
        "--variant",
        default="reference",
        help="catalogue name (see `kvhandoff variants`) or a path to a .py file defining VARIANT",
    )
    p.add_argument(
        "--engine",
        default="explore",
        help=f"one of: {', '.join([*ENGINES, 'all'])} (default: explore)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set decode_pages=4 --set requests=a:2:1,b:3:2",
    )
    p.add_argument("--depth", type=int, help="depth for bounded engines")
    p.add_argument("--timeout", type=float, help="seconds per solver call (Z3 engines)")
    p.add_argument("--max-states", type=int, help="explicit search: stop after N states")
    p.add_argument(
        "--first",
        action="store_true",
        help="BMC: stop at the first (shortest) counterexample of any property; the others are "
        "then reported as holding up to the depth before it",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--junit",
        metavar="FILE",
        help="write a JUnit XML report: one testcase per property and engine",
    )
    p.add_argument(
        "--trace-out",
        metavar="FILE",
        help="write the counterexample (JSON Lines trace) of the first violated property",
    )
    p.add_argument("--dot", metavar="FILE", help="explicit search: write the state graph as DOT")
    p.set_defaults(func=run_check)

    v = sub.add_parser(
        "variants",
        help="list the protocol variants",
        description="List the reference protocol, the incident and the catalogue of bug variants.",
    )
    v.add_argument("--json", action="store_true", help="print a JSON list")
    v.set_defaults(func=run_variants)


def variant_json(v: Variant) -> dict[str, Any]:
    return {
        "name": v.name,
        "m_numbers": list(v.m_numbers),
        "summary": v.summary,
        "explanation": v.explanation,
        "breaks": list(v.breaks),
        "expected": "violated" if v.breaks else "safe",
        "config": dict(v.config),
    }


def run_variants(args: argparse.Namespace) -> int:
    if args.json:
        print(json.dumps([variant_json(v) for v in VARIANTS], indent=2))
        return EXIT_OK
    for v in VARIANTS:
        ms = ",".join(v.m_numbers) or "-"
        breaks = ", ".join(v.breaks) or "(expected safe)"
        print(f"{v.name:34s} {ms:18s} {v.summary}")
        print(f"{'':34s} {'':18s} breaks: {breaks}")
        if v.config:
            sets = " ".join(f"--set {k}={value}" for k, value in v.config.items())
            print(f"{'':34s} {'':18s} checked with: {sets}")
    return EXIT_OK


def load_config(assignments: list[str], variant: Variant | None = None) -> Config:
    """The default scenario, with the variant's own config fields, then the `--set` overrides."""
    try:
        base = default_config() if variant is None else variant.scenario(default_config())
        return parse_set(base, assignments)
    except (ConfigError, TypeError) as exc:
        raise UsageError(str(exc)) from exc


def _load_variant(name: str) -> Variant:
    try:
        return load_variant(name)
    except VariantLoadError as exc:
        raise UsageError(str(exc)) from exc


def print_result(result: CheckResult, variant: Variant) -> None:
    rate = result.extra.get("states_per_second")
    states = f", {result.states:,} states" if result.states is not None else ""
    speed = f" ({rate:,} states/s)" if rate else ""
    print(
        f"variant {result.variant}, engine {result.engine}{states} in {result.seconds:.2f} s{speed}"
    )
    for r in result.results:
        label = {"holds": "holds   ", "violated": "VIOLATED", "unknown": "UNKNOWN "}[r.verdict]
        extra = ""
        if r.verdict == "violated" and r.trace is not None:
            extra = f"  (counterexample: {len(r.trace)} steps)"
        elif r.detail:
            extra = f"  ({r.detail})"
        print(f"  {label}  {r.property}{extra}")
    for name, why in result.extra.get("not_checked", {}).items():
        print(f"  not checked  {name}  ({why})")
    if "obligations_total" in result.extra:
        print(
            f"  {result.extra['obligations_proved']}/{result.extra['obligations_total']} proof "
            f"obligations discharged (scope: {result.extra.get('scope')})"
        )
        for o in result.extra.get("failed_obligations", [])[:5]:
            where = f" under {o['action']}" if o["action"] else ""
            print(f"  FAILED obligation: {o['kind']} of {o['invariant']}{where}")
    elif result.extra.get("scope"):
        print(f"  scope: {result.extra['scope']}")
    if result.extra.get("cti"):
        cti = result.extra["cti"]
        if "action" in cti:
            print(
                f"  counterexample to induction: {cti['action']} {' '.join(cti['args'])} "
                f"breaks {', '.join(cti['fails'])}"
            )
    if result.witnesses:
        missing = [k for k, ok in result.witnesses.items() if not ok]
        reached = len(result.witnesses) - len(missing)
        line = f"  witnesses reached: {reached}/{len(result.witnesses)}"
        if missing:
            line += f" (not reached: {', '.join(missing)})"
        print(line)
    if result.extra.get("response_bound") is not None:
        print(
            f"  bounded response: every request ends within {result.extra['response_bound']} "
            "protocol steps once faults stop"
        )
    deployment = result.extra.get("deployment")
    if deployment:
        bad = [k for k, ok in deployment.items() if not ok]
        if bad:
            print(
                f"  deployment checks failing in this config: {', '.join(bad)} "
                "(the protocol must be safe regardless; see `kvhandoff check-config`)"
            )
    if variant.breaks:
        caught = [
            b
            for b in variant.breaks
            if any(r.property == b and r.verdict == "violated" for r in result.results)
        ]
        print(
            f"  expected to break: {', '.join(variant.breaks)}; caught: "
            f"{', '.join(caught) or 'none'}"
        )
    print(f"verdict: {result.verdict.upper()}")
    for r in result.violated():
        if r.trace is None:
            continue
        print(f"\ncounterexample for {r.property} ({len(r.trace)} steps):")
        for line in trace_lines(r.trace, result.config, r.loop_start):
            print(line)
        if r.detail:
            print(f"      then: {r.detail}")


def _first_violated(result: CheckResult, variant: Variant) -> Any:
    violated = [r for r in result.violated() if r.trace is not None]
    for name in variant.breaks:
        for r in violated:
            if r.property == name:
                return r
    return violated[0] if violated else None


def run_check(args: argparse.Namespace) -> int:
    variant = _load_variant(args.variant)
    config = load_config(args.set, variant)
    if args.engine != "all" and args.engine not in ENGINES:
        raise UsageError(
            f"--engine {args.engine!r}: unknown engine; known: {', '.join([*ENGINES, 'all'])}"
        )
    if args.depth is not None and args.depth < 1:
        raise UsageError(f"--depth {args.depth}: must be at least 1")
    if args.max_states is not None and args.max_states < 1:
        raise UsageError(f"--max-states {args.max_states}: must be at least 1")
    if args.first and args.engine != "bmc":
        raise UsageError(f"--first applies to --engine bmc only, not {args.engine!r}")
    options = EngineOptions(
        depth=args.depth, timeout=args.timeout, max_states=args.max_states, first=args.first
    )
    names = list(ENGINES) if args.engine == "all" else [args.engine]
    results: list[CheckResult] = []
    cannot: list[dict[str, str]] = []
    for name in names:
        try:
            results.append(ENGINES[name](variant, config, options))
        except EngineCannotEncode as exc:
            cannot.append({"engine": name, "reason": str(exc)})
    if args.dot:
        if args.engine != "explore":
            raise UsageError("--dot needs --engine explore")
        from model_checker.explore import build_graph, to_dot

        graph, _, _ = build_graph(variant, config, args.max_states, keep_edges=True)
        Path(args.dot).write_text(to_dot(graph, variant, config))
    if args.trace_out:
        for result in results:
            first = _first_violated(result, variant)
            if first is not None:
                Path(args.trace_out).write_text(result.trace_text(first))
                break
    if args.junit:
        from kvhandoff_cli import output

        output.write_junit(Path(args.junit), output.check_suites(results, cannot, variant.name))
    if any(r.verdict == "violated" for r in results):
        code = EXIT_VIOLATED
    elif cannot or any(r.verdict == "unknown" for r in results):
        code = EXIT_INCONCLUSIVE
    else:
        code = EXIT_OK
    if args.json:
        if len(names) == 1 and results:
            out: dict[str, Any] = results[0].to_json()
        else:
            verdict = {EXIT_OK: "safe", EXIT_VIOLATED: "violated"}.get(code, "unknown")
            out = {
                "variant": variant.name,
                "engine": args.engine,
                "config": config.to_json(),
                "verdict": verdict,
                "engines": [r.to_json() for r in results],
            }
        if cannot:
            out["cannot_encode"] = cannot
            out["verdict"] = out.get("verdict") if results and code == EXIT_VIOLATED else "unknown"
        from kvhandoff_cli import output

        output.print_json("check" if "engines" not in out else "check-all", out, indent=2)
        return code
    for result in results:
        print_result(result, variant)
    for c in cannot:
        print(f"engine {c['engine']}: INCONCLUSIVE, cannot encode this variant: {c['reason']}")
    return code
