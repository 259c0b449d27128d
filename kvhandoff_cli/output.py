"""Machine-readable outputs: `--json` objects with a schema version, and JUnit XML for CI.

Every `--json` object carries ``"schema": "kvhandoff.<kind>/<version>"``; the JSON Schemas are
docs/schemas/<kind>.schema.json (tests validate real outputs against them). The version moves
when a field is removed or changes meaning; added fields do not move it. An error under `--json`
is itself an object of kind ``error`` on stdout (the plain line still goes to stderr).

JUnit: one ``<testcase>`` per thing a CI reader wants to see fail on its own (a conformance
program, a property under one engine), with stable names (no ports, no times, no paths in a
name), ``<skipped>`` for what was not covered, ``<error>`` when no verdict could be had (an
unreachable target, an inconclusive solver). Elements and attributes follow the de-facto schema
that Jenkins, GitLab and GitHub reporters read (testsuites/testsuite/testcase/failure/error/
skipped/system-out, properties).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
KINDS = (
    "check",
    "check-all",
    "check-config",
    "variants",
    "matrix",
    "conform",
    "fault-campaign",
    "replay",
    "validate-log",
    "generate",
    "serve",
    "serve-all",
    "harness-serve",
    "demo",
    "error",
)


def schema_id(kind: str) -> str:
    return f"kvhandoff.{kind}/{SCHEMA_VERSION}"


def with_schema(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` with its schema id first (a reader checks it before anything else)."""
    assert kind in KINDS, kind
    return {"schema": schema_id(kind), **obj}


def print_json(kind: str, obj: dict[str, Any], **dumps: Any) -> None:
    print(json.dumps(with_schema(kind, obj), **dumps), flush=True)


def error_json(command: str, message: str, exit_code: int) -> dict[str, Any]:
    return with_schema("error", {"command": command, "error": message, "exit_code": exit_code})


# --- JUnit ------------------------------------------------------------------------------------


def _suite(name: str, properties: dict[str, str], seconds: float | None = None) -> ET.Element:
    suite = ET.Element("testsuite", name=name)
    if seconds is not None:
        suite.set("time", f"{seconds:.3f}")
    props = ET.SubElement(suite, "properties")
    for key, value in properties.items():
        ET.SubElement(props, "property", name=key, value=value)
    return suite


def _case(suite: ET.Element, classname: str, name: str, seconds: float | None = None) -> ET.Element:
    case = ET.SubElement(suite, "testcase", classname=classname, name=name)
    if seconds is not None:
        case.set("time", f"{seconds:.3f}")
    return case


def _count(suite: ET.Element) -> None:
    cases = suite.findall("testcase")
    suite.set("tests", str(len(cases)))
    for tag, attr in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
        suite.set(attr, str(sum(1 for c in cases if c.find(tag) is not None)))


def write_junit(path: Path, suites: Sequence[ET.Element]) -> None:
    root = ET.Element("testsuites", name="kvhandoff")
    for suite in suites:
        _count(suite)
        root.append(suite)
    for attr in ("tests", "failures", "errors", "skipped"):
        root.set(attr, str(sum(int(s.get(attr, "0")) for s in suites)))
    total = sum(float(s.get("time", "0")) for s in suites)
    root.set("time", f"{total:.3f}")
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def target_kind(target: str) -> str:
    """A stable name for a target: an address (ephemeral port) is `remote`."""
    return target if target in ("inproc", "grpc") else "remote"


def conform_suite(report: Any, seed: int) -> ET.Element:
    """One testcase per program the campaign ran before its first divergence, one for the
    divergence (its shrunk program), one skipped case per operation the target cannot perform."""
    kind = target_kind(report.target)
    suite = _suite(
        f"kvhandoff conform {kind} {report.mode}",
        {
            "target": report.target,
            "mode": report.mode,
            "seed": str(seed),
            "traces": str(report.traces),
            "steps": str(report.steps),
            "verdict": report.verdict,
        },
        report.seconds,
    )
    classname = f"kvhandoff.conform.{kind}.{report.mode}"
    programs = list(getattr(report, "programs", []))
    generated = [p for p in programs if p.phase in ("directed", "generate")]
    shrink_runs = sum(1 for p in programs if p.phase == "shrink")
    for p in generated:
        case = _case(suite, classname, f"program {p.index:04d}", p.seconds)
        out = ET.SubElement(case, "system-out")
        out.text = f"{p.steps} spec steps"
        if p.outcome == "diverged":
            for f in report.failures:
                fail = ET.SubElement(
                    case, "failure", type=f.kind, message=f"{f.property}: {f.message}"
                )
                fail.text = (
                    f"{f.kind} ({f.property}): {f.message}\n"
                    f"shrunk in {shrink_runs} further runs to {f.trace_file}\n"
                    f"replay: kvhandoff replay {f.trace_file}"
                    + ("" if report.target == "inproc" else f" --target {report.target}")
                )
    if not generated:
        # A target without per-program records (the coarse gRPC campaign): one case for it all.
        case = _case(suite, classname, "campaign", report.seconds)
        for f in report.failures:
            fail = ET.SubElement(case, "failure", type=f.kind, message=f"{f.property}: {f.message}")
            fail.text = f"shrunk program: {f.trace_file}"
    for op, why in sorted(report.not_covered.items()):
        case = _case(suite, f"{classname}.not_covered", f"operation {op}")
        ET.SubElement(case, "skipped", message=f"the target cannot perform {op}: {why}")
    return suite


def target_error_suite(command: str, target: str, mode: str | None, error: str) -> ET.Element:
    """The target gave no verdict (unreachable, broke a call): still a report CI can show."""
    kind = target_kind(target)
    suite = _suite(
        f"kvhandoff {command} {kind} {mode or ''}".rstrip(),
        {"target": target, "mode": mode or "", "verdict": "target_failed"},
        0.0,
    )
    case = _case(suite, f"kvhandoff.{command}.{kind}", "reach the target", 0.0)
    node = ET.SubElement(case, "error", type="TargetError", message=error)
    node.text = error
    return suite


def check_suites(
    results: Iterable[Any], cannot: Sequence[dict[str, str]], variant: str
) -> list[ET.Element]:
    """One suite per engine, one testcase per property: holds passes, violated fails (with the
    counterexample), unknown is an error (no verdict is not a pass)."""
    suites = []
    for result in results:
        suite = _suite(
            f"kvhandoff check {variant} {result.engine}",
            {"variant": variant, "engine": result.engine, "verdict": result.verdict},
            result.seconds,
        )
        classname = f"kvhandoff.check.{variant}.{result.engine}"
        for r in result.results:
            case = _case(suite, classname, r.property)
            if r.verdict == "violated":
                steps = f"counterexample of {len(r.trace)} steps" if r.trace else "violated"
                node = ET.SubElement(case, "failure", type="violated", message=steps)
                node.text = result.trace_text(r) if r.trace is not None else (r.detail or "")
            elif r.verdict == "unknown":
                ET.SubElement(case, "error", type="inconclusive", message=r.detail or "unknown")
        suites.append(suite)
    for c in cannot:
        suite = _suite(
            f"kvhandoff check {variant} {c['engine']}",
            {"variant": variant, "engine": c["engine"], "verdict": "unknown"},
            0.0,
        )
        case = _case(suite, f"kvhandoff.check.{variant}.{c['engine']}", "encode the variant")
        ET.SubElement(case, "error", type="cannot_encode", message=c["reason"])
        suites.append(suite)
    return suites
