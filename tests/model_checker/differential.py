"""The differential test's variants and its one check (see `test_differential.py`).

No engine may say a property holds where the explorer, on the same variant and configuration,
finds it violated; nor say "no violation up to depth k" where the explorer's shortest
counterexample is k steps or fewer. The variants are the catalogue, every file in `examples/`,
and the override variants below, written for this test: engines that only read a variant's design
options are the ones these catch.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import kvhandoff.spec.variants as spec_variants
from kvhandoff.model_checker.engines import EngineOptions, EngineRun, run_engine
from kvhandoff.model_checker.result import CheckResult
from kvhandoff.model_checker.variant_loader import load_variant
from kvhandoff.spec.actions import DecodeGenerate
from kvhandoff.spec.config import Config, default_config, parse_set
from kvhandoff.spec.machine import step
from kvhandoff.spec.state import State
from kvhandoff.spec.variants import REFERENCE, VARIANTS, Design, Variant, get_variant

ROOT = Path(__file__).resolve().parents[2]

INCIDENT = get_variant("incident")


def _as_incident(config: Config, state: State, action: Any) -> State:
    """The spec's own rule for `action`, under the incident's design."""
    return step(INCIDENT, config, state, action)


INCIDENT_AS_OVERRIDES = replace(
    REFERENCE.derive(
        "incident_as_overrides",
        "The incident's four changes written as step overrides calling the spec's own rules.",
        breaks=INCIDENT.breaks,
    ),
    # Placeholder rejection (M1), local completion count (M2), decode trusting the signal (M3),
    # unscrubbed pages (M20): the design options stay the reference's, so an engine that reads
    # only the design sees the reference protocol.
    step_overrides={
        "prefill_reject_request": _as_incident,
        "prefill_send_completion": _as_incident,
        "decode_receive_completion": _as_incident,
        "decode_release_pages": _as_incident,
    },
)


def _generate_before_validation(config: Config, state: State) -> list[Any]:
    """An added action: decode generates as soon as its pages are reserved (the spec's own
    `decode_generate` rule, with no completion or validation first)."""
    return [DecodeGenerate(r) for r, req in enumerate(state.requests) if req.d == "reserved"]


GENERATE_EARLY = REFERENCE.derive(
    "generate_before_validation",
    "An added action: decode generates from its reserved pages before any completion.",
    breaks=("decode_reads_only_validated_pages",),
    extra_actions=_generate_before_validation,
)

OVERRIDES: tuple[Variant, ...] = (INCIDENT_AS_OVERRIDES, GENERATE_EARLY)


def design_flips() -> list[Variant]:
    """The reference with one design option changed, for every option and value (and each with
    the placeholder rejection too, which several options only matter after): a user's variant
    is any mix of options, and the any-size model reads only some of them."""
    hints = typing.get_type_hints(Design, globalns=vars(spec_variants))
    flips: list[dict[str, Any]] = []
    for f in fields(Design):
        kind = hints[f.name]
        values = [True, False] if kind is bool else list(typing.get_args(kind))
        flips += [{f.name: v} for v in values if v != f.default]
    placeholder = [{"oversize": "placeholder", **c} for c in flips if "oversize" not in c]
    out = []
    for changes in flips + placeholder:
        name = "flip:" + ",".join(f"{k}={v}" for k, v in changes.items())
        out.append(REFERENCE.derive(name, "one design option changed", **changes))
    return out


def example_variants() -> list[Variant]:
    """The files of examples/, and the Python-function forms of two of their changes
    (tests/data/python_variants: explorer-only, which the Z3 engines must refuse, not misjudge)."""
    folders = (ROOT / "examples", ROOT / "tests/data/python_variants")
    return [load_variant(str(p)) for f in folders for p in sorted(f.glob("*.py"))]


def every_variant() -> list[Variant]:
    """Catalogue, examples, overrides: the differential test's rows."""
    return [*VARIANTS, *example_variants(), *OVERRIDES]


def variant_named(name: str) -> Variant:
    for v in every_variant():
        if v.name == name:
            return v
    raise KeyError(name)


def config_for(variant: Variant, sets: list[str]) -> Config:
    """The variant's scenario fields over the default config, then `sets`."""
    return parse_set(variant.scenario(default_config()), sets)


@dataclass
class Mismatch:
    engine: str
    property: str
    says: str
    explorer: str

    def __str__(self) -> str:
        return f"{self.engine}: {self.property} {self.says}, but the explorer {self.explorer}"


def mismatches(explored: CheckResult, run: EngineRun) -> list[Mismatch]:
    """Where `run` claims more than the explorer's exhaustive search allows."""
    assert explored.extra["complete"], "the reference search must be complete"
    if run.result is None:
        return []  # "cannot encode" claims nothing (exit 3)
    out = []
    for r in run.result.results:
        theirs = explored.result_for(r.property)
        found = f"finds a violation in {theirs.depth} steps"
        if theirs.verdict == "violated" and r.verdict == "holds":
            out.append(Mismatch(run.engine, r.property, f"holds ({run.result.scope})", found))
        elif theirs.verdict == "violated" and r.verdict == "bounded":
            if (r.depth or 0) >= (theirs.depth or 0):
                says = f"has no violation up to depth {r.depth}"
                out.append(Mismatch(run.engine, r.property, says, found))
        elif theirs.verdict == "holds" and r.verdict == "violated":
            out.append(Mismatch(run.engine, r.property, "is violated", "proves it holds"))
    return out


def differential(
    variant: Variant, config: Config, options: dict[str, EngineOptions]
) -> tuple[CheckResult, list[EngineRun], list[Mismatch]]:
    """The explorer's result, each engine's run (`options` names the engines, in order), and
    every mismatch. The explorer's own run is the reference the others are compared with."""
    reference = run_engine("explore", variant, config, options.get("explore", EngineOptions()))
    assert reference.result is not None
    runs = [reference]
    runs += [run_engine(e, variant, config, o) for e, o in options.items() if e != "explore"]
    return reference.result, runs, [m for run in runs for m in mismatches(reference.result, run)]
