"""`kvhandoff matrix`: the mutation kill matrix, every variant x every engine.

Each cell says whether the engine caught the variant (a property violated, which one, at which
counterexample length, in how long), found it safe, or was inconclusive. Variants with no
expected breaks (the reference, `one_sided_fenced`) must be safe under every engine; every other
variant must be caught by at least one engine. Variants whose only expected break is
`every_request_terminates` (a liveness property only the explorer checks) are caught by explore
only; the Z3 engines report them safe on the safety properties, which is expected.

Each variant runs on its own scenario: the one `--scenario` names, else the variant's own
(`Variant.scenario_name`: `sequential` for a variant whose search on `wide` takes minutes), else
`wide`; then the variant's `config` fields (a bug only several prefill ranks can show is checked
with `prefill_ranks=2`), then `--set`.

A BMC cell that finds nothing is `bounded` (no violation up to its depth: not a proof) unless its
depth reaches the state space's depth. An expected-safe row needs a proof from at least one engine
and no violation from any; as in `check --engine all`, an inconclusive engine (unknown, bounded,
cannot encode) downgrades nothing.

Two engines that reach opposite conclusive verdicts on one row (one proves a property, another
violates it) is a bug in kvhandoff: the row says so and the matrix exits 4, whatever else happened.

Exit 0 when every expectation holds, 1 otherwise (a variant not caught, or an expected-safe variant
not proved safe), 2 on bad usage, 4 when engines disagree.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvhandoff.cli.cmd_check import add_scenario_argument, add_timeout_argument, scenario_name
from kvhandoff.cli.main import EXIT_DISAGREE, EXIT_OK, EXIT_VIOLATED, UsageError
from kvhandoff.model_checker.engines import ENGINES, EngineOptions, EngineRun, combine, run_engine
from kvhandoff.model_checker.variant_loader import VariantLoadError, load_variant
from kvhandoff.spec.config import Config, ConfigError, parse_set, scenario_config
from kvhandoff.spec.properties import TERMINATION
from kvhandoff.spec.variants import VARIANTS, Variant

LIVENESS_ONLY = frozenset({TERMINATION.name})


def register(sub: Any) -> None:
    p = sub.add_parser(
        "matrix",
        help="run every variant under every engine: the mutation kill matrix",
        description=(
            "Run every catalogued variant under every engine. Exit 0 when every expected-safe "
            "variant is proved safe by some engine and violated by none, and every other "
            "variant is caught by at least one engine; 1 otherwise, 2 on bad usage, 4 when two "
            "engines disagree (one proves a property another violates: a bug in kvhandoff)."
        ),
    )
    p.add_argument(
        "--engines",
        default=",".join(e for e in ENGINES if e != "spacer"),
        help=(
            f"comma-separated engines from {','.join(ENGINES)} (default: all but spacer, which "
            "times out on the sequential scenario: --spacer-timeout per variant for unknown)"
        ),
    )
    p.add_argument(
        "--variants",
        help="comma-separated variant names or variant files (.py) (default: the catalogue)",
    )
    p.add_argument(
        "--examples",
        action="store_true",
        help=(
            "also run the example variant files (`kvhandoff examples`: a design option, a "
            "replaced guard, a replaced effect, an added action with a state field of its own, "
            "a fault's replaced effect, a per-rank step's replaced guard), so that the matrix "
            "shows every engine checking a reviewer's own kind of change"
        ),
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    add_scenario_argument(p)
    p.add_argument("--depth", type=int, help="depth for bounded engines")
    add_timeout_argument(p)
    p.add_argument(
        "--spacer-timeout",
        type=float,
        default=30.0,
        help="seconds Spacer may take per variant (default 30; it then reports unknown)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--markdown", metavar="FILE", help="also write the matrix as a Markdown table")
    p.set_defaults(func=run_matrix)


@dataclass
class Cell:
    variant: str
    engine: str
    verdict: str  # safe, violated, bounded, unknown, cannot_encode
    caught_by: str | None
    depth: int | None
    seconds: float
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant,
            "engine": self.engine,
            "verdict": self.verdict,
            "caught": self.verdict == "violated",
            "property": self.caught_by,
            "depth": self.depth,
            "seconds": round(self.seconds, 3),
            "detail": self.detail,
        }

    def text(self) -> str:
        if self.verdict == "violated":
            return f"caught: {self.caught_by} @{self.depth} ({self.seconds:.1f} s)"
        if self.verdict == "safe":
            return f"safe ({self.seconds:.1f} s)"
        if self.verdict == "cannot_encode":
            return "cannot encode"
        if self.verdict == "bounded":
            return f"bounded @{self.depth} ({self.seconds:.1f} s)"
        return f"unknown ({self.seconds:.1f} s)"


def cell_of(variant: Variant, run: EngineRun) -> Cell:
    result = run.result
    if result is None:
        return Cell(variant.name, run.engine, "cannot_encode", None, None, 0.0, run.cannot_encode)
    violated = result.violated()
    if violated:
        preferred = [r for r in violated if r.property in variant.breaks] or violated
        first = min(preferred, key=lambda r: r.depth if r.depth is not None else 10**9)
        return Cell(variant.name, run.engine, "violated", first.property, first.depth, run.seconds)
    depth = None
    if result.verdict == "bounded":
        depth = min(r.depth or 0 for r in result.results if r.verdict == "bounded")
    return Cell(variant.name, run.engine, result.verdict, None, depth, run.seconds)


def run_cell(variant: Variant, engine: str, config: Config, options: EngineOptions) -> Cell:
    return cell_of(variant, _run(variant, engine, config, options))


def _run(variant: Variant, engine: str, config: Config, options: EngineOptions) -> EngineRun:
    from kvhandoff.model_checker import progress

    progress.report("matrix", cell=f"{variant.name} / {engine}")
    return run_engine(engine, variant, config, options)


def expectation(variant: Variant, cells: list[Cell]) -> tuple[bool, str]:
    """Does the row meet its expectation? And what was expected."""
    if not variant.breaks:
        # As in `check --engine all`: some engine must prove it and none may find a violation;
        # an engine that is inconclusive (unknown, bounded, cannot encode) downgrades nothing.
        ok = any(c.verdict == "safe" for c in cells) and not any(
            c.verdict == "violated" for c in cells
        )
        return ok, "proved safe by some engine, violated by none"
    if set(variant.breaks) <= LIVENESS_ONLY:
        ok = any(c.verdict == "violated" for c in cells if c.engine == "explore")
        return ok, "caught by explore (liveness only)"
    return any(c.verdict == "violated" for c in cells), "caught by at least one engine"


def _scenario(variant: Variant, named: str | None = None) -> str:
    """` (with prefill_ranks=2, max_faults=0)` for a variant checked on its own config fields,
    ` (on sequential, ...)` for one checked on a scenario of its own."""
    parts = []
    if named is None and variant.scenario_name is not None:
        parts.append(f"on {variant.scenario_name}")
    if variant.config:
        parts.append("with " + ", ".join(f"{k}={v}" for k, v in variant.config.items()))
    return f" ({', '.join(parts)})" if parts else ""


def markdown(
    rows: list[tuple[Variant, list[Cell], bool, str]], engines: list[str], named: str | None = None
) -> str:
    head = "| variant | expected | " + " | ".join(engines) + " | ok |"
    sep = "|---" * (len(engines) + 3) + "|"
    lines = [head, sep]
    for variant, cells, ok, expected in rows:
        by = {c.engine: c.text() for c in cells}
        lines.append(
            f"| {variant.name}{_scenario(variant, named)} | {expected} | "
            + " | ".join(by[e] for e in engines)
            + f" | {'yes' if ok else '**NO**'} |"
        )
    return "\n".join(lines) + "\n"


def run_matrix(args: argparse.Namespace) -> int:
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        raise UsageError(f"--engines: unknown {unknown}; known: {', '.join(ENGINES)}")
    try:
        config = parse_set(scenario_config(scenario_name(args.scenario, None)), args.set)
    except (ConfigError, TypeError) as exc:
        raise UsageError(str(exc)) from exc
    variants = list(VARIANTS)
    # Each variant runs on its own scenario (a few need e.g. several prefill ranks to show their
    # bug), with --set applied over it.
    configs: dict[str, Config] = {}
    if args.variants:
        names = [v.strip() for v in args.variants.split(",")]
        known = {v.name: v for v in VARIANTS}
        missing = [n for n in names if n not in known and not n.endswith(".py")]
        if missing:
            raise UsageError(f"--variants: unknown {missing}")
        variants = []
        for n in names:
            if n in known:
                variants.append(known[n])
                continue
            try:  # a reviewer's variant file: every engine checks it too (or says why not)
                variants.append(load_variant(n))
            except VariantLoadError as exc:
                raise UsageError(f"--variants: {exc}") from exc
    if args.examples:
        from kvhandoff.cli.cmd_examples import example_files

        for f in example_files():
            try:
                variants.append(load_variant(str(f)))
            except VariantLoadError as exc:
                raise UsageError(f"--examples: {exc}") from exc
    names_seen = [v.name for v in variants]
    twice = sorted({n for n in names_seen if names_seen.count(n) > 1})
    if twice:
        raise UsageError(f"variants named twice: {twice} (each row is one variant)")
    options = EngineOptions(depth=args.depth, timeout=args.timeout)
    spacer = EngineOptions(depth=args.depth, timeout=args.spacer_timeout)
    for variant in variants:
        try:
            configs[variant.name] = parse_set(
                variant.scenario(scenario_config(scenario_name(args.scenario, variant))), args.set
            )
        except (ConfigError, TypeError) as exc:
            raise UsageError(f"variant {variant.name}: {exc}") from exc
    rows = []
    disagreements: dict[str, list[str]] = {}
    for variant in variants:
        own = configs[variant.name]
        runs = [_run(variant, e, own, spacer if e == "spacer" else options) for e in engines]
        cells = [cell_of(variant, run) for run in runs]
        combined = combine(runs)
        if combined.disagreements:
            disagreements[variant.name] = [d.text() for d in combined.disagreements]
        ok, expected = expectation(variant, cells)
        ok = ok and not combined.disagreements
        rows.append((variant, cells, ok, expected))
        if not args.json:
            status = "ok" if ok else "NOT AS EXPECTED"
            label = f"{expected}{_scenario(variant, args.scenario)}"
            print(f"{variant.name:34s} {status}: {label}", flush=True)
            for c in cells:
                print(f"    {c.engine:8s} {c.text()}", flush=True)
            for text in disagreements.get(variant.name, []):
                print(f"    ENGINES DISAGREE (a bug in kvhandoff): {text}", flush=True)
    all_ok = all(ok for _, _, ok, _ in rows)
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows, engines, args.scenario))
    if args.json:
        out = {
            "scenario": scenario_name(args.scenario, None),
            "config": config.to_json(),
            "engines": engines,
            "ok": all_ok,
            "rows": [
                {
                    "variant": v.name,
                    "scenario": scenario_name(args.scenario, v),
                    "config": dict(v.config),
                    "breaks": list(v.breaks),
                    "expected": expected,
                    "ok": ok,
                    "cells": [c.to_json() for c in cells],
                    "disagreements": disagreements.get(v.name, []),
                }
                for v, cells, ok, expected in rows
            ],
            "engines_disagree": bool(disagreements),
        }
        from kvhandoff.cli import output

        output.print_json("matrix", out, indent=2)
    else:
        print(f"matrix: {'every expectation met' if all_ok else 'SOME EXPECTATIONS NOT MET'}")
        if disagreements:
            print(f"matrix: ENGINES DISAGREE on {', '.join(disagreements)} (exit {EXIT_DISAGREE})")
    if disagreements:
        return EXIT_DISAGREE
    return EXIT_OK if all_ok else EXIT_VIOLATED
