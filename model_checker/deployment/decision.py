"""Z3 decides the length-dependent rules (C1, C2, C3's length effects) over a symbolic prompt length.

Let L be the prompt length in tokens, `W` the router's window, and (kind_P, eff_P), (kind_D, eff_D)
what prefill and decode do with L (`engines.py`). The deployment is safe for L when

    S(L) :=  neither role proceeds                                   (both refuse: a clean error)
          or both proceed, eff_P = eff_D, and either both or neither   (same pages on both sides)
             swapped in a placeholder

The proof is one query, `1 <= L <= W-1 and not S(L)`: unsat means every prompt the router admits is
handled identically by prefill and decode. When it is sat, every satisfiable (kind_P, kind_D)
combination becomes a finding, with the smallest and largest L from `z3.Optimize` and a check that
no L in between escapes the rule (else the range is reported as not contiguous).

C1 ("the context window fits the pools") is a second query per role: a length the router and the
role's tokenizer admit but the role's scheduler refuses, with the pool smaller than the context
window (so the pool, not SGLang's 5-token output reserve, sets the limit).

`unknown` from Z3 raises `InconclusiveError`; it is never read as unsat.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from kvhandoff.model_checker.deployment.engines import KIND_WORDS, Kind, RoleLimits, role_limits
from kvhandoff.model_checker.deployment.errors import InconclusiveError
from kvhandoff.model_checker.deployment.findings import Finding, LengthRange, Severity
from kvhandoff.model_checker.deployment.model import Deployment, Engine, Role, RoleConfig
from kvhandoff.model_checker.deployment.rules import name, static_rules

DEFAULT_TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class Decision:
    deployment: Deployment
    limits: dict[Role, RoleLimits]
    findings: tuple[Finding, ...]
    # Statements Z3 proved (its answer was unsat), for the report.
    proved: tuple[str, ...]
    queries: int

    @property
    def safe(self) -> bool:
        return not any(f.severity is Severity.ERROR for f in self.findings)


def _check(solver: z3.Solver | z3.Optimize) -> z3.CheckSatResult:
    """Every solver call goes through here (tests replace it to simulate `unknown`)."""
    return solver.check()


class _Z3:
    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        self.queries = 0

    def _run(self, solver: z3.Solver | z3.Optimize, what: str) -> z3.CheckSatResult:
        solver.set("timeout", self.timeout_ms)
        self.queries += 1
        result = _check(solver)
        if result == z3.unknown:
            raise InconclusiveError(
                f"Z3 answered unknown while deciding {what} "
                f"(reason: {solver.reason_unknown()}, timeout {self.timeout_ms} ms)"
            )
        return result

    def satisfiable(self, formula: z3.BoolRef, what: str) -> bool:
        s = z3.Solver()
        s.add(formula)
        return bool(self._run(s, what) == z3.sat)

    def extreme(self, formula: z3.BoolRef, n: z3.ArithRef, *, least: bool, what: str) -> int:
        opt = z3.Optimize()
        opt.add(formula)
        if least:
            opt.minimize(n)
        else:
            opt.maximize(n)
        if self._run(opt, what) != z3.sat:
            raise InconclusiveError(f"Z3 lost a model it had found while deciding {what}")
        value = opt.model().eval(n, model_completion=True)
        assert isinstance(value, z3.IntNumRef)
        return int(value.as_long())

    def length_range(self, formula: z3.BoolRef, n: z3.ArithRef, what: str) -> LengthRange | None:
        if not self.satisfiable(formula, what):
            return None
        lo = self.extreme(formula, n, least=True, what=what)
        hi = self.extreme(formula, n, least=False, what=what)
        gap = z3.And(n >= lo, n <= hi, z3.Not(formula))
        return LengthRange(lo, hi, contiguous=not self.satisfiable(gap, what + " (gaps)"))


def _proceeds(kind: z3.ArithRef) -> z3.BoolRef:
    return kind >= int(Kind.PLACEHOLDER)


def _generates(kind: z3.ArithRef) -> z3.BoolRef:
    return kind >= int(Kind.TRUNCATED)


def handled_alike(kp: z3.ArithRef, ep: z3.ArithRef, kd: z3.ArithRef, ed: z3.ArithRef) -> z3.BoolRef:
    """S(L) of the module docstring."""
    ph = int(Kind.PLACEHOLDER)
    return z3.Or(
        z3.And(z3.Not(_proceeds(kp)), z3.Not(_proceeds(kd))),
        z3.And(_proceeds(kp), _proceeds(kd), ep == ed, (kp == ph) == (kd == ph)),
    )


def _tok(n: int) -> str:
    return f"{n:,}"


def _span(r: LengthRange) -> str:
    if r.lo == r.hi:
        return f"prompts of {_tok(r.lo)} tokens"
    extent = f"all {_tok(r.hi - r.lo + 1)} lengths" if r.contiguous else "not every length between"
    return f"prompts of {_tok(r.lo)} to {_tok(r.hi)} tokens ({extent})"


def _align_up(n: int, page: int) -> int:
    return -(-n // page) * page


def _widen_fix(d: Deployment, weak: RoleConfig, strong: RoleLimits) -> tuple[str, tuple[str, ...]]:
    """How to make `weak` serve whole every prompt `strong` serves whole (or the reverse)."""
    lim = role_limits(weak, d.version)
    target = strong.largest_full_prompt
    ctx_flag = weak.engine.context_flag
    pool_flag = name(weak.pool_tokens, "--max-total-tokens")
    # SGLang serves L whole iff L <= min(context, pool) - 7; vLLM iff L <= max_model_len - 1.
    need = target + 7 if weak.engine is Engine.SGLANG else target + 1
    parts: list[str] = []
    flags: list[str] = []
    if lim.pool_tokens < need:
        parts.append(
            f"raise {weak.role}'s pool from {_tok(lim.pool_tokens)} to at least "
            f"{_tok(_align_up(need, weak.page_size.value))} tokens ({pool_flag})"
        )
        flags.append(pool_flag)
    if lim.context_length < need:
        parts.append(f"raise {weak.role}'s {ctx_flag} to at least {_tok(need)}")
        flags.append(name(weak.context_length, ctx_flag))
    other = d.decode if weak.role is Role.PREFILL else d.prefill
    cap = min(lim.context_length, lim.pool_tokens)
    alt = (
        f"lower {ctx_flag} to at most {_tok(cap)} on {other.role} (and the router's window), "
        f"so that it admits no more than {weak.role}"
    )
    flags.append(name(other.context_length, ctx_flag))
    fix = (" and ".join(parts) + ", or " + alt) if parts else alt
    return fix, tuple(dict.fromkeys(flags))


def _consequence(d: Deployment, cls: str, kp: Kind, kd: Kind, lim: dict[Role, RoleLimits]) -> str:
    p, q = d.prefill, d.decode
    sg = d.engine is Engine.SGLANG
    if cls == "placeholder":
        return (
            "prefill writes one page for the placeholder and signals success; decode takes that "
            "as proof its reserved pages were written and generates from the others, which still "
            "hold earlier requests' data (the incident: a cross-tenant leak)"
        )
    if cls == "short":
        return (
            f"prefill writes pages for {_tok(lim[Role.PREFILL].scheduler_limit or 0)} tokens and "
            "signals success; decode generates from the rest of its reservation, which no one "
            "wrote (stale data: a cross-tenant leak)"
        )
    if cls == "decode-waits":
        if sg:
            return (
                "decode reserves the prompt's pages and holds them until "
                f"SGLANG_DISAGGREGATION_WAITING_TIMEOUT ({q.waiting_timeout_s.value:g} s), "
                "and the client waits as long unless the router cancels decode on a prefill "
                "error (mutant M15, sglang #29017)"
            )
        return (
            "the proxy fails the request at prefill (HTTP 400), although decode and the "
            "advertised window accept it"
        )
    if cls == "prefill-waits":
        if sg:
            return (
                "prefill bootstraps the prompt and waits for decode's page list until "
                f"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT ({p.bootstrap_timeout_s.value:g} s), "
                "holding its KV"
            )
        return (
            "prefill computes the KV and pins its blocks for the KV lease "
            f"({p.kv_lease_duration_s.value:g} s); decode then rejects the request (HTTP 400)"
        )
    # decode reserves less than prefill sends
    if kd is Kind.PLACEHOLDER:
        return (
            "decode reserves one page for its placeholder; prefill's write is silently cut to "
            "that page by the transfer worker, and decode then aborts: an error after a full "
            "prefill"
        )
    return (
        "decode answers a prompt it truncated, while prefill computed (and sampled the first "
        "token from) the whole prompt; the transfer is silently cut to decode's pages"
    )


_TITLES = {
    "placeholder": "prefill hands off a placeholder for prompts decode admits",
    "short": "prefill hands off fewer pages than decode reserved",
    "decode-waits": "decode admits prompts prefill refuses",
    "prefill-waits": "prefill admits prompts decode refuses",
    "decode-less": "decode reserves fewer pages than prefill sends",
}


def _classify(kp: Kind, kd: Kind) -> str:
    if kp.proceeds and not kd.proceeds:
        return "prefill-waits"
    if kd.proceeds and not kp.proceeds:
        return "decode-waits"
    if kp is Kind.PLACEHOLDER and kd >= Kind.TRUNCATED:
        return "placeholder"
    if kp is Kind.TRUNCATED and kd >= Kind.TRUNCATED:
        # Both proceed, not handled alike: with prefill truncated and decode not swapping,
        # the sizes differ; decide which way round from the limits in _pair_finding.
        return "short"
    return "decode-less"


def _pair_finding(
    d: Deployment,
    lim: dict[Role, RoleLimits],
    kp: Kind,
    kd: Kind,
    r: LengthRange,
    cls: str,
) -> Finding:
    p, q = d.prefill, d.decode
    truncate_differs = p.allow_auto_truncate.value != q.allow_auto_truncate.value
    involves_truncation = Kind.TRUNCATED in (kp, kd)
    rule = "C3" if truncate_differs and involves_truncation else "C2"
    if rule == "C3":
        fix = "set --allow-auto-truncate on both roles or on neither (safest: neither)"
        flags: tuple[str, ...] = (
            name(p.allow_auto_truncate, "--allow-auto-truncate")
            if p.allow_auto_truncate.value
            else name(q.allow_auto_truncate, "--allow-auto-truncate"),
        )
    elif cls in ("placeholder", "decode-waits", "short"):
        fix, flags = _widen_fix(d, p, lim[Role.DECODE])
    else:
        fix, flags = _widen_fix(d, q, lim[Role.PREFILL])
    detail = (
        f"{_span(r)} pass the router; prefill {KIND_WORDS[kp]}, decode {KIND_WORDS[kd]}: "
        + _consequence(d, cls, kp, kd, lim)
    )
    return Finding(
        rule=rule,
        code=f"{cls}:{kp.name.lower()}/{kd.name.lower()}",
        severity=Severity.ERROR,
        title=_TITLES[cls],
        detail=detail,
        fix=fix,
        flags=flags,
        roles=(Role.PREFILL, Role.DECODE),
        lengths=r,
        leak=cls in ("placeholder", "short"),
    )


def decide(deployment: Deployment, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> Decision:
    d = deployment
    lim = {r: role_limits(d.role(r), d.version) for r in (Role.PREFILL, Role.DECODE)}
    z = _Z3(timeout_ms)
    n = z3.Int("prompt_tokens")
    window = d.router_window.value
    admitted = z3.And(n >= 1, n <= window - 1)
    kp, ep = lim[Role.PREFILL].handling(n)
    kd, ed = lim[Role.DECODE].handling(n)
    alike = handled_alike(kp, ep, kd, ed)

    findings: list[Finding] = []
    proved: list[str] = []

    # C2/C3 over lengths: one proof query, then one finding per (kind_P, kind_D) combination.
    if z.satisfiable(z3.And(admitted, z3.Not(alike)), "C2 (prefill and decode agree)"):
        for a in Kind:
            for b in Kind:
                combo = z3.And(admitted, z3.Not(alike), kp == int(a), kd == int(b))
                r = z.length_range(combo, n, f"C2 for prefill {a.name}, decode {b.name}")
                if r is not None:
                    cls = _classify(a, b)
                    if cls == "short" and b is Kind.TRUNCATED:
                        # Both truncate: whoever truncates shorter is the short side.
                        p_lim = lim[Role.PREFILL].scheduler_limit or 0
                        d_lim = lim[Role.DECODE].scheduler_limit or 0
                        cls = "short" if p_lim < d_lim else "decode-less"
                    findings.append(_pair_finding(d, lim, a, b, r, cls))
    else:
        proved.append(
            f"C2/C3: for every prompt of 1 to {_tok(window - 1)} tokens the router admits, "
            "prefill and decode make the same decision (both serve it whole with the same pages, "
            "or both refuse it the same way)"
        )

    # C1: the pool, not the context window, sets a role's limit (SGLang). vLLM refuses to start
    # instead; that is a static rule.
    if d.engine is Engine.SGLANG:
        c1_clean = True
        for role in (Role.PREFILL, Role.DECODE):
            rl, cfg = lim[role], d.role(role)
            kind, _ = rl.handling(n)
            pool_binds = z3.BoolVal(rl.pool_tokens < rl.context_length)
            formula = z3.And(
                admitted, pool_binds, n < rl.context_length, n >= (rl.scheduler_limit or 0)
            )
            r = z.length_range(formula, n, f"C1 for {role}")
            if r is None:
                continue
            c1_clean = False
            at = Kind(z3.simplify(z3.substitute(kind, (n, z3.IntVal(r.lo)))).as_long())
            pool_flag = name(cfg.pool_tokens, "--max-total-tokens")
            findings.append(
                Finding(
                    rule="C1",
                    code=f"{role}-pool-below-context",
                    severity=Severity.ERROR,
                    title=(
                        f"{role}'s pool ({_tok(rl.pool_tokens)} tokens) is smaller than its "
                        f"context window ({_tok(rl.context_length)})"
                    ),
                    detail=(
                        f"{_span(r)} pass the router and {role}'s tokenizer, but its scheduler "
                        f"limit max_req_input_len = min({_tok(rl.context_length)} - 1, "
                        f"{_tok(rl.pool_tokens)} - 1) - 5 = {_tok(rl.scheduler_limit or 0)} is "
                        f"set by the pool: {role} {KIND_WORDS[at]}"
                    ),
                    fix=(
                        f"raise {pool_flag} to at least "
                        f"{_tok(_align_up(rl.context_length, cfg.page_size.value))}, or lower "
                        f"--context-length to at most {_tok(rl.pool_tokens)} on both roles"
                    ),
                    flags=(pool_flag, name(cfg.context_length, "--context-length")),
                    roles=(role,),
                    lengths=r,
                )
            )
        if c1_clean:
            proved.append(
                "C1: on both roles the context window, not the KV pool, sets the admission limit "
                "(pool ≥ context length)"
            )

    # Lengths the router admits that both roles refuse alike: safe, but worth knowing.
    refused = z3.And(admitted, alike, z3.Or(kp != int(Kind.FULL), kd != int(Kind.FULL)))
    if z.satisfiable(refused, "lengths both roles refuse"):
        for a in Kind:
            for b in Kind:
                combo = z3.And(refused, kp == int(a), kd == int(b))
                r = z.length_range(combo, n, f"lengths refused as {a.name}/{b.name}")
                if r is None:
                    continue
                reserve = d.engine is Engine.SGLANG and a is not Kind.TOKENIZER_REJECT
                findings.append(
                    Finding(
                        rule="C2",
                        code=f"refused-alike:{a.name.lower()}/{b.name.lower()}",
                        severity=Severity.NOTE,
                        title="prompts both roles refuse the same way",
                        detail=(
                            f"{_span(r)} pass the router, but prefill {KIND_WORDS[a]} and "
                            f"decode {KIND_WORDS[b]}: no page goes uncovered, the client gets "
                            "an error"
                            + (
                                " (SGLang keeps 5 tokens of the window for output)"
                                if reserve
                                else ""
                            )
                        ),
                        fix="none needed; advertise a window clients can use",
                        flags=(),
                        roles=(Role.PREFILL, Role.DECODE),
                        lengths=r,
                    )
                )

    findings.extend(static_rules(d, lim))
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.NOTE: 2}
    findings.sort(
        key=lambda f: (
            order[f.severity],
            not f.leak,
            f.rule,
            f.lengths is None,
            f.lengths.lo if f.lengths else 0,
        )
    )
    return Decision(
        deployment=d,
        limits=lim,
        findings=tuple(findings),
        proved=tuple(proved),
        queries=z.queries,
    )
