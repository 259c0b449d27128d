"""Render a `Decision` as text (for people) or as JSON (for CI)."""

from __future__ import annotations

import json
import textwrap
from typing import Any

from kvhandoff.model_checker.deployment.bridge import (
    build_spec_config,
    check_command,
    protocol_variant,
    to_protocol_config,
)
from kvhandoff.model_checker.deployment.decision import Decision
from kvhandoff.model_checker.deployment.engines import RoleLimits
from kvhandoff.model_checker.deployment.findings import Finding, Severity
from kvhandoff.model_checker.deployment.model import Engine, Role

WIDTH = 100
EXIT_SAFE = 0
EXIT_UNSAFE = 1


def exit_code(decision: Decision) -> int:
    return EXIT_SAFE if decision.safe else EXIT_UNSAFE


def _wrap(text: str, indent: str = "  ", hang: str | None = None) -> list[str]:
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=indent,
        subsequent_indent=indent if hang is None else hang,
        break_on_hyphens=False,
        break_long_words=False,
    )


def _serves(lim: RoleLimits) -> str:
    return f"1 to {lim.largest_full_prompt:,}" if lim.largest_full_prompt else "none"


def _counts(findings: tuple[Finding, ...]) -> str:
    parts = []
    for sev in Severity:
        n = sum(1 for f in findings if f.severity is sev)
        if n:
            parts.append(f"{n} {sev.value}{'s' if n > 1 else ''}")
    return ", ".join(parts) if parts else "no findings"


def render_text(decision: Decision) -> str:
    d = decision.deployment
    verdict = "SAFE" if decision.safe else "UNSAFE"
    out = [
        f"kvhandoff check-config: {verdict} (exit {exit_code(decision)}): "
        f"{_counts(decision.findings)}",
        f"deployment: {d.engine.label} {d.version}, router window {d.router_window.value:,} "
        f"tokens (prompts of 1 to {d.router_window.value - 1:,})",
        "",
    ]
    limit_name = "max_req_input_len" if d.engine is Engine.SGLANG else "max_model_len"
    rows = [("role", "context", "pool", limit_name, "serves whole")]
    for role in (Role.PREFILL, Role.DECODE):
        lim = decision.limits[role]
        limit = lim.scheduler_limit if lim.scheduler_limit is not None else lim.tokenizer_limit
        rows.append(
            (
                role.value,
                f"{lim.context_length:,}",
                f"{lim.pool_tokens:,}",
                f"{limit:,}",
                _serves(lim),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    out.append("limits derived from the flags (tokens):")
    for r in rows:
        out.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    for f in decision.findings:
        out.append("")
        out.extend(_wrap(f"{f.severity.value} {f.rule}: {f.title}", ""))
        out.extend(_wrap(f.detail))
        out.extend(_wrap(f"fix: {f.fix}"))
        if f.flags:
            out.extend(_wrap("change: " + ", ".join(f.flags)))
    if decision.proved:
        out.append("")
        out.append("proved by Z3 (no counterexample exists):")
        for claim in decision.proved:
            out.extend(_wrap("- " + claim, "  ", "    "))
    notes = [n for role in (Role.PREFILL, Role.DECODE) for n in d.role(role).notes]
    if notes:
        out.append("")
        out.append("assumptions and rounding:")
        for n in notes:
            out.extend(_wrap("- " + n, "  ", "    "))
    out.append("")
    out.extend(_protocol_lines(decision))
    return "\n".join(out) + "\n"


def _protocol_lines(decision: Decision) -> list[str]:
    has_length_error = any(
        f.severity is Severity.ERROR and f.lengths is not None for f in decision.findings
    )
    if not decision.safe and not has_length_error:
        return [
            "protocol model: the errors above are not a prompt-length boundary; no protocol "
            "check reproduces them"
        ]
    pairs = to_protocol_config(decision.deployment, decision.findings)
    band = int(pairs["page_size"])
    lines = [f"protocol model (one model page = {band:,} tokens):"]
    if decision.safe:
        lines.extend(
            _wrap(
                "the admission limits agree, so the handoff is the reference protocol's, proved "
                "safe for any pool size; on this deployment's shape:",
            )
        )
        lines.append("  " + check_command("reference", pairs))
        return lines
    variant = protocol_variant(decision.findings)
    if variant == "incident":
        lines.extend(_wrap("the boundary above, as a handoff counterexample:"))
        lines.append("  " + check_command("incident", pairs))
        lines.extend(_wrap("the same shape under the reference protocol (expected: safe):"))
    else:
        lines.extend(_wrap("the same shape under the reference protocol:"))
    lines.append("  " + check_command("reference", pairs))
    return lines


def _limits_json(lim: RoleLimits, decision: Decision) -> dict[str, Any]:
    cfg = decision.deployment.role(lim.role)
    return {
        "context_length": lim.context_length,
        "pool_tokens": lim.pool_tokens,
        "page_size": cfg.page_size.value,
        "tokenizer_limit": lim.tokenizer_limit,
        "scheduler_limit": lim.scheduler_limit,
        "largest_full_prompt": lim.largest_full_prompt,
        "sources": {
            "context_length": cfg.context_length.source,
            "pool_tokens": cfg.pool_tokens.source,
            "page_size": cfg.page_size.source,
        },
        "notes": list(cfg.notes),
    }


def _finding_json(f: Finding) -> dict[str, Any]:
    return {
        "rule": f.rule,
        "code": f.code,
        "severity": f.severity.value,
        "title": f.title,
        "detail": f.detail,
        "fix": f.fix,
        "flags": list(f.flags),
        "roles": [r.value for r in f.roles],
        "lengths": None
        if f.lengths is None
        else {
            "lo": f.lengths.lo,
            "hi": f.lengths.hi,
            "contiguous": f.lengths.contiguous,
            "count": f.lengths.count,
        },
        "leak": f.leak,
    }


def render_json(decision: Decision) -> str:
    d = decision.deployment
    pairs = to_protocol_config(decision.deployment, decision.findings)
    variant = "reference" if decision.safe else protocol_variant(decision.findings)
    reproducible = decision.safe or any(
        f.severity is Severity.ERROR and f.lengths is not None for f in decision.findings
    )
    doc = {
        "verdict": "safe" if decision.safe else "unsafe",
        "exit_code": exit_code(decision),
        "engine": d.engine.value,
        "version": d.version,
        "router_window": d.router_window.value,
        "roles": {r.value: _limits_json(decision.limits[r], decision) for r in Role},
        "findings": [_finding_json(f) for f in decision.findings],
        "proved": list(decision.proved),
        # None when the errors are not a prompt-length boundary the protocol model can replay.
        "protocol": {
            "variant": variant,
            "set": pairs,
            "command": check_command(variant, pairs),
            "spec_config_built": build_spec_config(pairs) is not None,
        }
        if reproducible
        else None,
        "z3_queries": decision.queries,
    }
    return json.dumps(doc, indent=2) + "\n"
