"""`kvhandoff check` and `kvhandoff variants`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvhandoff.cli.main import EXIT_INCONCLUSIVE, EXIT_OK, UsageError
from kvhandoff.model_checker.engines import (
    ENGINES,
    PROVE_TIMEOUT,
    Combined,
    EngineOptions,
    EngineRun,
    combine,
    run_engine,
)
from kvhandoff.model_checker.explore import placement_text
from kvhandoff.model_checker.reduction import merged
from kvhandoff.model_checker.render import group_counterexamples, steps, trace_lines
from kvhandoff.model_checker.result import CheckResult, config_summary
from kvhandoff.model_checker.variant_loader import (
    VariantLoadError,
    load_variant,
    trace_variant_header,
)
from kvhandoff.spec.config import (
    DEFAULT_SCENARIO,
    SCENARIOS,
    Config,
    ConfigError,
    parse_set,
    scenario_config,
)
from kvhandoff.spec.trace import with_header
from kvhandoff.spec.variants import VARIANTS, Variant


def register(sub: Any) -> None:
    p = sub.add_parser(
        "check",
        help="check the handoff protocol (or a variant) against every property",
        description=(
            "Check every property of a protocol variant on a configuration. Exit 0 when every "
            "property is proved for the scope printed (this configuration, or any size), 1 when "
            "one is violated (the shortest counterexample is shown), 2 on bad usage or input, "
            "3 when inconclusive (unknown, cannot encode the variant, or a bounded search "
            "without a completeness argument), 4 when engines disagree (--engine all: one "
            "proves what another violates, a bug in kvhandoff)."
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
        help="override a config field, e.g. --set decode_pages=4 --set requests=a:2:1,b:3:2 "
        "(TENANT:PAGES:ROOM; with placement=fixed and several instances TENANT:PAGES:ROOM:P/D "
        "places a request on prefill instance P and decode instance D; rooms=any checks every "
        "choice of rooms a client could make instead of the rooms given)",
    )
    add_scenario_argument(p)
    p.add_argument("--depth", type=int, help="depth for bounded engines")
    add_timeout_argument(p)
    p.add_argument("--max-states", type=int, help="explicit search: stop after N states")
    p.add_argument(
        "--first",
        action="store_true",
        help="BMC: stop at the first (shortest) counterexample of any property; the others are "
        "then reported as holding up to the depth before it",
    )
    p.add_argument(
        "--invariants",
        action="store_true",
        help="explicit search: also evaluate the proof's invariants (spec/invariants.py, the "
        "formulas kind and prove use) on every reachable state, and name any that fails with "
        "its shortest run (they are the reference design's, or room-keyed matching's own for a "
        "design that matches by room: a variant may break them); and "
        "evaluate each safety property's and witness's formula (what the Z3 engines check) "
        "beside its Python function, naming any that disagree. Roughly doubles the search time",
    )
    p.add_argument(
        "--no-reduce",
        action="store_true",
        help="explicit search: store every state. By default states that differ only in what no "
        "step or property reads are one state: ghost flags that only witnesses read (a freed "
        "page was reused, a cancel came mid-transfer, ...), and prefill's fields of a request "
        "prefill has finished with (its grant's generation and pages, ...), where the variant "
        "reads them of no such request. The same verdicts, counterexamples and witnesses, fewer "
        "states (model_checker/reduction.py; --json lists what was cleared; turned off by itself "
        "for a variant with Python guards or effects, and with --invariants)",
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
        description="List the reference protocol, the incident and the catalogue of bug variants, "
        "each with the scenario `kvhandoff check --variant NAME` checks it on (its `--scenario` "
        "and its own `--set`s).",
    )
    v.add_argument("--json", action="store_true", help="print a JSON list")
    v.set_defaults(func=run_variants)


def _solver_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not seconds >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(
            f"a solver timeout is 0 (no limit) or more seconds, got {text!r}"
        )
    return seconds


def add_timeout_argument(p: argparse.ArgumentParser) -> None:
    """`--timeout S`: seconds per solver call of the Z3 engines (`engines.solver_timeout`)."""
    p.add_argument(
        "--timeout",
        type=_solver_seconds,
        metavar="S",
        help=f"seconds per solver call (Z3 engines). Default: {PROVE_TIMEOUT:g} for prove (an "
        "obligation Z3 cannot decide in that time is reported unknown), no limit for bmc, kind "
        "and spacer; 0: no limit for any",
    )


def add_scenario_argument(p: argparse.ArgumentParser) -> None:
    """`--scenario NAME`: the configuration `--set` starts from (spec/config.py, `SCENARIOS`)."""
    names = "; ".join(f"{name}: {text}" for name, (text, _) in SCENARIOS.items())
    p.add_argument(
        "--scenario",
        default=None,
        choices=list(SCENARIOS),
        metavar="NAME",
        help=f"the scenario --set starts from (default: the variant's own, shown by `kvhandoff "
        f"variants`, else {DEFAULT_SCENARIO}). {names}",
    )


def scenario_name(named: str | None, variant: Variant | None) -> str:
    """The scenario a run starts from: the one named on the command line, else the variant's own
    (`Variant.scenario_name`), else the CLI's default."""
    if named is not None:
        return named
    if variant is not None and variant.scenario_name is not None:
        return variant.scenario_name
    return DEFAULT_SCENARIO


def variant_json(v: Variant) -> dict[str, Any]:
    return {
        "name": v.name,
        "m_numbers": list(v.m_numbers),
        "summary": v.summary,
        "explanation": v.explanation,
        "breaks": list(v.breaks),
        "expected": "violated" if v.breaks else "safe",
        "config": dict(v.config),
        "scenario": scenario_name(None, v),
    }


def run_variants(args: argparse.Namespace) -> int:
    if args.json:
        from kvhandoff.cli import output

        output.print_json("variants", {"variants": [variant_json(v) for v in VARIANTS]}, indent=2)
        return EXIT_OK
    for v in VARIANTS:
        ms = ",".join(v.m_numbers) or "-"
        breaks = ", ".join(v.breaks) or "(expected safe)"
        print(f"{v.name:34s} {ms:18s} {v.summary}")
        print(f"{'':34s} {'':18s} breaks: {breaks}")
        print(f"{'':34s} {'':18s} checked on: --scenario {scenario_name(None, v)}{_own_sets(v)}")
    return EXIT_OK


def _own_sets(variant: Variant) -> str:
    """The variant's own config fields, as the `--set`s that would give them."""
    return "".join(f" --set {k}={value}" for k, value in variant.config.items())


def scenario_line(named: str | None, variant: Variant, assignments: list[str]) -> str:
    """What a run checks, in the words of the command line: the scenario and every `--set`."""
    name = scenario_name(named, variant)
    own = _own_sets(variant)
    yours = "".join(f" --set {a}" for a in assignments)
    whose = (
        "named" if named is not None else "the variant's" if variant.scenario_name else "default"
    )
    return f"scenario: {name} ({whose}: {SCENARIOS[name][0]}){own}{yours}"


def load_config(
    assignments: list[str], variant: Variant | None = None, scenario: str | None = None
) -> Config:
    """The scenario (`scenario_name`), with the variant's own config fields, then the `--set`
    overrides."""
    try:
        start = scenario_config(scenario_name(scenario, variant))
        base = start if variant is None else variant.scenario(start)
        return parse_set(base, assignments)
    except (ConfigError, TypeError) as exc:
        raise UsageError(str(exc)) from exc


def _load_variant(name: str) -> Variant:
    try:
        return load_variant(name)
    except VariantLoadError as exc:
        raise UsageError(str(exc)) from exc


def print_result(result: CheckResult, variant: Variant, final: bool = True) -> None:
    """One engine's result; `final`: end with its verdict and scope (`--engine all` prints the
    engines' combined verdict instead)."""
    rate = result.extra.get("states_per_second")
    states = f", {result.states:,} states" if result.states is not None else ""
    speed = f" ({rate:,} states/s)" if rate else ""
    print(
        f"variant {result.variant}, engine {result.engine}{states} in {result.seconds:.2f} s{speed}"
    )
    what = merged(result.extra.get("cleared_flags", ()), result.extra.get("cleared_fields", ()))
    if what:
        print(
            f"  (states that differ only in {what}, which no step or property reads, counted "
            "once: --no-reduce counts each)"
        )
    for r in result.results:
        label = {
            "holds": "holds   ",
            "violated": "VIOLATED",
            "bounded": "bounded ",
            "unknown": "UNKNOWN ",
        }[r.verdict]
        extra = ""
        if r.verdict == "violated" and r.trace is not None:
            extra = f"  (counterexample: {steps(len(r.trace))})"
        elif r.detail:
            extra = f"  ({r.detail})"
        print(f"  {label}  {r.property}{extra}")
    for name, why in result.extra.get("not_checked", {}).items():
        print(f"  not checked  {name}  ({why})")
    if "obligations_total" in result.extra:
        print(
            f"  {result.extra['obligations_proved']}/{result.extra['obligations_total']} proof "
            f"obligations discharged (scope: "
            f"{result.extra.get('obligations_scope', result.extra.get('scope'))})"
        )
        why_not = result.extra.get("any_size_unavailable")
        if why_not:
            print(f"  not proved for any size: {why_not}")
        for o in result.extra.get("failed_obligations", [])[:5]:
            where = f" under {o['action']}" if o["action"] else ""
            print(f"  FAILED obligation: {o['kind']} of {o['invariant']}{where}")
        fixed = result.extra.get("fixed_config_proof")
        if fixed is not None:
            # prove's second proof, on the configuration, of what the any-size one left.
            print(
                f"  {fixed['obligations_proved']}/{fixed['obligations_total']} proof "
                "obligations discharged on this configuration, for the properties not proved "
                "for any size (scope: fixed-config)"
            )
    elif result.extra.get("scope"):
        print(f"  scope: {result.extra['scope']}")
    if result.extra.get("cti"):
        cti = result.extra["cti"]
        if "action" in cti:
            print(
                f"  counterexample to induction: {cti['action']} {' '.join(cti['args'])} "
                f"breaks {', '.join(cti['fails'])}"
            )
    placed = result.extra.get("placements")
    if placed:
        # A router that places as it likes, or clients that choose rooms: every choice was
        # searched (spec.config.placements).
        rooms = bool(result.extra.get("rooms_chosen"))
        several = result.config.prefill_instances > 1 or result.config.decode_instances > 1
        label = ("placements and room choices" if several else "room choices") if rooms else ""
        what = "request:tenant" + (":room" if rooms else "")
        if several:
            what += ":prefill/decode instance"
        print(f"  {label or 'placements'} searched: {len(placed)} ({what})")
        for item in placed:
            states = "" if item["states"] is None else f", {item['states']:,} states"
            print(f"    {item['placement']}: {item['verdict']}{states}")
        if result.verdict == "violated":
            print(f"  counterexample on {placement_text(result.config, rooms=rooms)}")
    if result.witnesses:
        missing = [k for k, ok in result.witnesses.items() if not ok]
        reached = len(result.witnesses) - len(missing)
        line = f"  witnesses reached: {reached}/{len(result.witnesses)}"
        if missing:
            line += f" (not reached: {', '.join(missing)})"
        print(line)
    invariants = result.extra.get("invariants")
    # The explorer's `--invariants` report (a dict); k-induction's `invariants` is the list of
    # the invariants it was strengthened with, printed with its verdicts above.
    if isinstance(invariants, dict):
        failing = invariants["failing"]
        if not failing:
            print(
                f"  invariants: all {len(invariants['checked'])} hold on every reachable state "
                "(the formulas kind and prove use)"
            )
        for name, where in failing.items():
            print(f"  invariant fails: {name} (first at depth {where['depth']})")
        formulas = invariants.get("properties")
        if formulas is not None:
            if not formulas["disagreeing"]:
                print(
                    f"  property formulas: all {len(formulas['checked'])} agree with the Python "
                    "functions on every reachable state (the formulas the Z3 engines check)"
                )
            for name, where in formulas["disagreeing"].items():
                print(
                    f"  property formula disagrees with its Python function: {name} (first at "
                    f"depth {where['depth']}): a bug in spec/properties.py"
                )
        witness_formulas = invariants.get("witnesses")
        if witness_formulas is not None:
            if not witness_formulas["disagreeing"]:
                print(
                    f"  witness formulas: all {len(witness_formulas['checked'])} agree with the "
                    "Python functions on every reachable state (what the Z3 engines search for)"
                )
            for name, where in witness_formulas["disagreeing"].items():
                print(
                    f"  witness formula disagrees with its Python function: {name} (first at "
                    f"depth {where['depth']}): a bug in spec/properties.py"
                )
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
    for line in breaks_lines(breaks_json(result, variant)):
        print(line)
    completeness = result.extra.get("completeness")
    if completeness:
        print(f"  {completeness['reason']}")
    if final:
        print_verdict(result)
    print_counterexamples(result)


def print_counterexamples(result: CheckResult) -> None:
    """One listing per distinct counterexample. A property whose counterexample is the first steps
    of another's (BFS finds runs that share their beginning) is named, not listed again, and the
    listing marks the step where it breaks."""
    violated = [r for r in result.violated() if r.trace is not None]
    listings, same_as = group_counterexamples(
        [(r.property, r.trace, r.loop_start) for r in violated if r.trace is not None]
    )
    listed = {x.property: x for x in listings}
    for r in violated:
        assert r.trace is not None
        n = len(r.trace)
        if r.property in same_as:
            host, _ = same_as[r.property]
            whole = n == len(listed[host].trace)
            where = "" if whole else f", first {steps(n)}"
            print(f"\ncounterexample for {r.property} ({steps(n)}): same run as {host}{where}")
        else:
            marks: dict[int, list[str]] = {}
            for name, length in listed[r.property].prefixes:
                marks.setdefault(length, []).append(name)
            print(f"\ncounterexample for {r.property} ({steps(n)}):")
            lines = trace_lines(
                r.trace,
                result.config,
                r.loop_start,
                {i: f"breaks {', '.join(names)}" for i, names in marks.items()},
            )
            for line in lines:
                print(line)
        if r.detail:
            print(f"      then: {r.detail}")


def breaks_json(result: CheckResult, variant: Variant) -> dict[str, Any]:
    """What the variant declares it breaks (`breaks=`) against what this engine found.

    `not_caught`: declared, but this engine reports no violation of it (with its verdict there:
    holds, unknown, or not checked); `not_declared`: violated, but not declared. Neither changes
    the exit code: the verdict is about the protocol as written, and a declaration is the
    author's expectation of it. A declared break that a complete search does not catch means the
    change is safer than its author thought (or `breaks=` is wrong), which the report says.
    """
    verdicts: dict[str, str] = {r.property: r.verdict for r in result.results}
    for name in result.extra.get("not_checked", {}):
        verdicts.setdefault(name, "not checked")
    violated = [r.property for r in result.results if r.verdict == "violated"]
    return {
        "expected": list(variant.breaks),
        "caught": [b for b in variant.breaks if verdicts.get(b) == "violated"],
        "not_caught": {
            b: verdicts.get(b, "not checked")
            for b in variant.breaks
            if verdicts.get(b) != "violated"
        },
        "not_declared": [p for p in violated if p not in variant.breaks],
    }


def breaks_lines(breaks: dict[str, Any]) -> list[str]:
    lines = []
    if breaks["expected"]:
        lines.append(
            f"  expected to break: {', '.join(breaks['expected'])}; caught: "
            f"{', '.join(breaks['caught']) or 'none'}"
        )
    if breaks["not_caught"]:
        missed = ", ".join(f"{b} ({why})" for b, why in breaks["not_caught"].items())
        lines.append(f"  declared in breaks= but NOT caught: {missed}")
    if breaks["not_declared"] and breaks["expected"]:
        lines.append(f"  caught but not declared in breaks=: {', '.join(breaks['not_declared'])}")
    return lines


def _first_violated(result: CheckResult, variant: Variant) -> Any:
    violated = [r for r in result.violated() if r.trace is not None]
    for name in variant.breaks:
        for r in violated:
            if r.property == name:
                return r
    return violated[0] if violated else None


def _cannot_encode_text(run: EngineRun, where: str) -> str:
    return f"engine {run.engine}: cannot encode: {run.cannot_encode} ({where})"


def verdict_line(verdict: str, result: CheckResult | None = None) -> str:
    """The verdict line of `kvhandoff check` (BOUNDED says its depth; the scope line follows)."""
    if result is None or verdict not in ("safe", "bounded"):
        return f"verdict: {verdict.upper()}"
    if verdict == "bounded":
        depth = min(r.depth or 0 for r in result.results if r.verdict == "bounded")
        return f"verdict: BOUNDED: no violation up to depth {depth} (not a proof)"
    return "verdict: SAFE"


def print_verdict(result: CheckResult) -> None:
    print(verdict_line(result.verdict, result))
    if result.verdict in ("safe", "bounded"):
        print(f"scope: {result.scope_text()}")


def print_table(combined: Combined, config: Config) -> None:
    """`--engine all`: one line per engine (verdict, scope, time, why), for one configuration."""
    print(f"configuration: {config_summary(config)}")
    rows = [("engine", "verdict", "scope", "time", "")]
    for run in combined.runs:
        verdict = run.verdict.upper().replace("_", " ")
        rows.append((run.engine, verdict, run.scope, f"{run.seconds:.2f} s", run.note))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        cells = [row[i].ljust(widths[i]) for i in range(4)]
        print(("  ".join(cells) + "  " + row[4]).rstrip())


def _single_json(run: EngineRun, variant: Variant, config: Config) -> dict[str, Any]:
    if run.result is not None:
        return {**run.result.to_json(), "breaks": breaks_json(run.result, variant)}
    return {
        "variant": variant.name,
        "engine": run.engine,
        "config": config.to_json(),
        "verdict": "cannot_encode",
        "exit_code": EXIT_INCONCLUSIVE,
        "cannot_encode": [{"engine": run.engine, "reason": run.cannot_encode}],
    }


def run_check(args: argparse.Namespace) -> int:
    variant = _load_variant(args.variant)
    config = load_config(args.set, variant, args.scenario)
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
    if args.dot and args.engine != "explore":
        raise UsageError("--dot needs --engine explore")
    if args.invariants and args.engine not in ("explore", "all"):
        raise UsageError(f"--invariants applies to --engine explore (or all), not {args.engine!r}")
    if args.no_reduce and args.engine not in ("explore", "all"):
        raise UsageError(f"--no-reduce applies to --engine explore (or all), not {args.engine!r}")
    options = EngineOptions(
        depth=args.depth,
        timeout=args.timeout,
        max_states=args.max_states,
        first=args.first,
        invariants=args.invariants,
        reduce=not args.no_reduce,
    )
    names = list(ENGINES) if args.engine == "all" else [args.engine]
    runs = [run_engine(name, variant, config, options) for name in names]
    if not args.json:  # after the runs: an interrupted check prints no half of a report
        print(scenario_line(args.scenario, variant, args.set))
    results = [run.result for run in runs if run.result is not None]
    is_file = args.variant.endswith(".py")
    where = f"variant file {args.variant}" if is_file else f"variant {variant.name}"
    if args.dot:
        from kvhandoff.model_checker.explore import build_graph, to_dot

        graph, _, _ = build_graph(variant, config, args.max_states, keep_edges=True)
        Path(args.dot).write_text(to_dot(graph, variant, config))
    combined = combine(runs)
    if args.trace_out:
        for result in results:
            first = _first_violated(result, variant)
            if first is not None:
                text = with_header(result.trace_text(first), **trace_variant_header(args.variant))
                Path(args.trace_out).write_text(text)
                break
    if args.junit:
        from kvhandoff.cli import output

        cannot_junit = [
            {"engine": r.engine, "reason": r.cannot_encode or ""} for r in runs if r.result is None
        ]
        output.write_junit(
            Path(args.junit), output.check_suites(results, cannot_junit, variant.name)
        )
    if len(runs) == 1:
        return _report_one(runs[0], variant, config, where, args.json)
    code = combined.exit_code
    if args.json:
        engine_json = [{**r.to_json(), "breaks": breaks_json(r, variant)} for r in results]
        out: dict[str, Any] = {
            "variant": variant.name,
            "engine": args.engine,
            "config": config.to_json(),
            **combined.to_json(),
            "engines": engine_json,
        }
        cannot = [{"engine": r.engine, "reason": r.cannot_encode} for r in runs if r.result is None]
        if cannot:
            out["cannot_encode"] = cannot
        from kvhandoff.cli import output

        output.print_json("check-all", out, indent=2)
        return code
    by_engine = {r.engine: r for r in runs}
    if combined.verdict == "disagree":
        # Print every engine that takes a side, so the bug can be chased from either end.
        shown = sorted(
            {e.split(" ")[0] for d in combined.disagreements for e in d.proved_by + d.violated_by},
            key=names.index,
        )
    else:
        shown = combined.deciding[:1]
    for name in shown:
        shown_result = by_engine[name].result
        assert shown_result is not None
        print_result(shown_result, variant, final=False)
        print()
    print_table(combined, config)
    if combined.verdict == "disagree":
        print("ENGINES DISAGREE (a bug in kvhandoff, not a verdict on the protocol):")
        for d in combined.disagreements:
            print(f"  {d.text()}")
        print(f"verdict: ENGINES DISAGREE (exit {code})")
        return code
    deciding = by_engine[combined.deciding[0]].result if combined.deciding else None
    line = verdict_line(combined.verdict, deciding)
    if combined.verdict in ("violated", "safe"):
        line += f" (by {', '.join(combined.deciding)})"
    print(line)
    if combined.verdict in ("safe", "bounded"):
        # Each deciding engine's own scope: a proof for any size may leave out a property (the
        # liveness one) that a proof for this configuration covers.
        scopes: dict[str, list[str]] = {}
        for name in combined.deciding:
            scopes.setdefault(by_engine[name].scope, []).append(name)
        print("scope: " + "; ".join(f"{s} ({', '.join(e)})" for s, e in scopes.items()))
    return code


def _report_one(run: EngineRun, variant: Variant, config: Config, where: str, as_json: bool) -> int:
    code = EXIT_INCONCLUSIVE if run.result is None else run.result.exit_code
    if as_json:
        from kvhandoff.cli import output

        output.print_json("check", _single_json(run, variant, config), indent=2)
        return code
    if run.result is None:
        print(_cannot_encode_text(run, where))
        print("verdict: CANNOT ENCODE (inconclusive)")
        return code
    print_result(run.result, variant)
    return code
