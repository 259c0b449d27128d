"""The `prove` engine: inductive-invariant proofs, for any size when the design allows it.

0. A variant with action overrides or added actions, or a configuration with several prefill
   ranks, is refused (`CannotEncode`, exit 3): neither model below contains them.
1. If the any-size model (`z3_prove`) covers the variant's design, discharge its obligations:
   scope `"any-size"` (every pool size, every number of requests and tenants).
2. Otherwise discharge the same obligations on the fixed-configuration encoding, per spec action
   and invariant (`z3_invariants`): scope `"fixed-config"`.

Every obligation is listed in `extra["obligations"]`. When one fails, the proof does not go through;
BMC then looks for a real counterexample at the fixed configuration: a property it violates is
`violated` (with the replayed trace); the others are `unknown`, with the failed obligations (action,
invariant and counterexample to induction) named in their detail. Never "holds" without a proof.
"""

from __future__ import annotations

import time
from typing import Any

import z3

from model_checker.result import CheckResult, PropertyResult
from model_checker.z3_encoding import Encoding
from model_checker.z3_engines import NOT_CHECKED, _safe_concretize, bmc_cached
from model_checker.z3_invariants import fixed_invariants
from model_checker.z3_prove import Obligation, prove_any_size, supports
from spec.config import Config
from spec.properties import ALWAYS
from spec.variants import Variant


def prove_fixed(variant: Variant, config: Config, timeout: float | None = None) -> list[Obligation]:
    """Initiation, consecution per (spec action, claim) and safety on the fixed-config encoding."""
    enc = Encoding(variant, config, width=None)
    s, s2, act = enc.state_at(0, "p_"), enc.state_at(1, "p_"), enc.action_at(0, "p_")
    invs = fixed_invariants(enc)
    claims = {**{n: f(s) for n, f in invs.items()}, **enc.properties(s)}
    after = {**{n: f(s2) for n, f in invs.items()}, **enc.properties(s2)}
    inv_all = z3.And(list(claims.values()))
    trans = enc.trans(s, act, s2)
    out: list[Obligation] = []

    def check(kind: str, name: str, action: str | None, *assertions: Any, cti: bool) -> None:
        started = time.perf_counter()
        solver = z3.Solver()
        if timeout is not None:
            solver.set("timeout", max(1, int(timeout * 1000)))
        solver.add(*assertions)
        answer = solver.check()
        seconds = time.perf_counter() - started
        if answer == z3.unsat:
            out.append(Obligation(kind, name, action, "proved", seconds))
        elif answer == z3.sat:
            m = solver.model()
            cex: dict[str, Any] = {"before": _safe_concretize(enc, enc.values(m, s))}
            if cti:
                cex["after"] = _safe_concretize(enc, enc.values(m, s2))
            out.append(Obligation(kind, name, action, "failed", seconds, cex))
        else:
            out.append(Obligation(kind, name, action, "unknown", seconds))

    for name, claim in claims.items():
        check("initiation", name, None, enc.init(s), z3.Not(claim), cti=False)
    names = sorted({i.name for i in enc.instances})
    for action in names:
        ids = [i for i, inst in enumerate(enc.instances) if inst.name == action]
        which = z3.Or([act == i for i in ids])
        for name in claims:
            check("consecution", name, action, inv_all, trans, which, z3.Not(after[name]), cti=True)
    for name in enc.properties(s):
        check("safety", name, None, inv_all, z3.Not(claims[name]), cti=False)
    return out


def prove(
    variant: Variant, config: Config, timeout: float | None = None, depth: int | None = None
) -> CheckResult:
    """Prove; `depth` bounds the BMC search for a real counterexample when the proof fails."""
    started = time.perf_counter()
    # Both models below are translations of the spec's own rules under the variant's design
    # options. A Python override or added action reaches neither, so proving the design alone
    # would prove some other protocol and call it this one; several prefill ranks are outside
    # both (the any-size model has one rank). The fixed-config encoding refuses all of these
    # (CannotEncode, naming the action or field), so ask it before either proof.
    Encoding(variant, config)
    why_not = supports(variant.design)
    if why_not is None:
        obligations = prove_any_size(variant.design, timeout=timeout)
        scope = "any-size"
    else:
        obligations = prove_fixed(variant, config, timeout=timeout)
        scope = "fixed-config"
    failed = [o for o in obligations if o.verdict != "proved"]
    extra: dict[str, Any] = {
        "scope": scope,
        "obligations": [o.to_json() for o in obligations],
        "obligations_proved": len(obligations) - len(failed),
        "obligations_total": len(obligations),
        "not_checked": dict(NOT_CHECKED),
        "expected_breaks": list(variant.breaks),
    }
    if why_not is not None:
        extra["any_size_unavailable"] = why_not
    if not failed:
        results = [
            PropertyResult(
                p.name,
                "holds",
                detail=f"inductive invariant, {len(obligations)} obligations ({scope})",
            )
            for p in ALWAYS
        ]
        return CheckResult(
            variant.name,
            "prove",
            config,
            results,
            seconds=time.perf_counter() - started,
            extra=extra,
        )
    # The proof fails: is there a real counterexample?
    search = bmc_cached(variant, config, depth=depth, timeout=timeout)
    first = failed[0]
    what = f"{first.kind} of {first.invariant}" + (f" under {first.action}" if first.action else "")
    results = []
    for r in search.results:
        if r.verdict == "violated":
            results.append(r)
        else:
            detail = f"proof fails: {len(failed)} obligations (first: {what}); " + (
                f"no counterexample within {search.extra.get('max_depth')} steps"
            )
            results.append(PropertyResult(r.property, "unknown", detail=detail))
    extra["failed_obligations"] = [o.to_json() for o in failed]
    extra["bmc_depth"] = search.extra.get("max_depth")
    return CheckResult(
        variant.name, "prove", config, results, seconds=time.perf_counter() - started, extra=extra
    )
