"""Z3 engines on the fixed-configuration encoding: BMC, k-induction and Spacer.

Every engine returns a `CheckResult`. Every counterexample is decoded into spec actions, replayed
through `spec.trace.replay` (guards checked) and compared state by state with the Z3 path; a trace
that fails to replay, disagrees, or does not end in the violation raises `EncodingError` (a bug in
the encoder, never a verdict). A solver `unknown` is reported as `unknown`, never as safe.

`every_request_terminates` is a graph (liveness) property that only the explorer checks: these
engines leave it out of their results and say so in `extra["not_checked"]`.
"""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Sequence
from typing import Any

import z3

from kvhandoff.model_checker.result import CheckResult, PropertyResult
from kvhandoff.model_checker.z3_encoding import Encoding, EncodingError, SymState
from kvhandoff.model_checker.z3_invariants import fixed_invariants
from kvhandoff.model_checker.z3_witnesses import with_movement
from kvhandoff.spec.actions import Action
from kvhandoff.spec.config import Config
from kvhandoff.spec.properties import ALWAYS, TERMINATION
from kvhandoff.spec.state import State
from kvhandoff.spec.trace import TraceError, replay
from kvhandoff.spec.variants import Variant

NOT_CHECKED = {
    TERMINATION.name: "a liveness (graph) property: only the explicit explorer checks it",
}
DEFAULT_BMC_DEPTH = 20
DEFAULT_KIND_DEPTH = 2


def _solver(timeout: float | None, logic: str | None = "QF_BV") -> Any:
    s = z3.SolverFor(logic) if logic else z3.Solver()
    if timeout is not None:
        s.set("timeout", max(1, int(timeout * 1000)))
    return s


def decode_path(
    enc: Encoding, model: Any, k: int, prefix: str = ""
) -> tuple[list[dict[str, Any]], list[Action], list[State]]:
    """Values, spec actions and spec states of the model's path s_0 .. s_k."""
    vals = enc.path_values(model, k, prefix)
    actions = []
    for t in range(k):
        i = model.eval(enc.action_at(t, prefix), model_completion=True).as_long()
        actions.append(enc.action(vals[t], i))
    states = [enc.concretize(v) for v in vals]
    return vals, actions, states


def replay_counterexample(
    enc: Encoding, model: Any, k: int, prop_names: Sequence[str]
) -> tuple[Action, ...]:
    """Decode a k-step counterexample and check it against the spec; return its actions."""
    prop_name = ", ".join(prop_names)
    _vals, actions, states = decode_path(enc, model, k)
    try:
        replayed = replay(enc.variant, enc.config, actions)
    except TraceError as exc:
        raise EncodingError(f"Z3 counterexample for {prop_name} does not replay: {exc}") from exc
    for t, (mine, theirs) in enumerate(zip(states, replayed, strict=True)):
        if mine != theirs:
            raise EncodingError(
                f"Z3 counterexample for {prop_name}: state {t} differs from the spec's\n"
                f"  z3:   {mine}\n  spec: {theirs}"
            )
    for prop in ALWAYS:
        if prop.name in prop_names and prop.holds(enc.config, replayed[-1]):
            raise EncodingError(f"Z3 counterexample for {prop.name} does not end in a violation")
    return tuple(actions)


def _result(
    variant: Variant,
    engine: str,
    config: Config,
    results: list[PropertyResult],
    started: float,
    **extra: Any,
) -> CheckResult:
    return CheckResult(
        variant=variant.name,
        engine=engine,
        config=config,
        results=results,
        seconds=time.perf_counter() - started,
        extra={
            "not_checked": dict(NOT_CHECKED),
            "expected_breaks": list(variant.breaks),
            **extra,
        },
    )


_BMC_CACHE: dict[tuple[Any, ...], CheckResult] = {}


def bmc_cached(
    variant: Variant,
    config: Config,
    depth: int | None = None,
    timeout: float | None = None,
    first: bool = False,
) -> CheckResult:
    """`bmc`, remembered per (design, config, depth, timeout): kind, prove and spacer fall back
    on BMC to look for a real counterexample, and the matrix runs all of them on one variant.
    Only pure-design variants are encodable, so the design determines the result; any other
    variant must be refused before the lookup, or it would get the result of its design alone."""
    if not variant.is_pure_design:
        Encoding(variant, config)  # raises CannotEncode, naming the overrides and added actions
    key = (variant.rules_key(), config, depth, timeout, first)
    if key not in _BMC_CACHE:
        _BMC_CACHE[key] = bmc(variant, config, depth, timeout, first)
    result = copy.deepcopy(_BMC_CACHE[key])
    # Two catalogue variants may share a design: the result is this one's.
    result.variant = variant.name
    result.extra["expected_breaks"] = list(variant.breaks)
    return result


class _WidthTooSmall(Exception):
    pass


WIDTHS = (5, 7, 10, 16)
"""The bit-vector widths BMC tries, narrowest first."""


def bmc(
    variant: Variant,
    config: Config,
    depth: int | None = None,
    timeout: float | None = None,
    first: bool = False,
) -> CheckResult:
    """Bounded model checking with the narrowest bit-vector width at which the interval analysis
    bounds every integer within the depth, each step's integers narrowed further to the bits
    their intervals need there (`Encoding.narrow`). Where no width's intervals suffice, every
    integer gets one width, 5 bits, widened and rerun whenever the solver finds that some value
    could leave the range within the bound. `first`: stop at the first depth where some property
    fails (the shortest counterexample of all)."""
    started = time.perf_counter()
    bound = DEFAULT_BMC_DEPTH if depth is None else depth
    result = _bmc_widths(variant, config, bound, timeout, first, started)
    # Every action fires and every witness holds within the bound, where the spec's do.
    result = with_movement(result, variant, config, bound, timeout)
    result.seconds = time.perf_counter() - started
    return result


def _bmc_widths(
    variant: Variant,
    config: Config,
    bound: int,
    timeout: float | None,
    first: bool,
    started: float,
) -> CheckResult:
    for width in WIDTHS:
        enc = Encoding(variant, config, width=width)
        if enc.narrow(bound):
            return _bmc(enc, bound, timeout, first, started, narrowed=True)
    for width in WIDTHS:
        try:
            enc = Encoding(variant, config, width=width)
            return _bmc(enc, bound, timeout, first, started, narrowed=False)
        except _WidthTooSmall:
            continue
    raise EncodingError("no bit-vector width up to 16 bits fits this configuration")


def _bmc(
    enc: Encoding, depth: int, timeout: float | None, first: bool, started: float, narrowed: bool
) -> CheckResult:
    """Bounded model checking, incremental: one solver, one unrolling step added per depth.

    At depth k the query is  I(s_0) /\\ T(s_0, s_1) /\\ ... /\\ T(s_{k-1}, s_k) /\\ OR_p not p(s_k)
    over the properties p not yet violated; when it is satisfiable, each of them is asked alone.
    The first depth at which a property fails gives its shortest counterexample. `narrowed`:
    `enc.narrow(depth)` holds (and the intervals show that no integer leaves its range).
    """
    variant, config, width = enc.variant, enc.config, enc.width
    solver = _solver(timeout)
    solver.add(enc.init(enc.state_at(0)))
    pending = [p.name for p in ALWAYS]
    found: dict[str, PropertyResult] = {}
    found_after: dict[str, float] = {}
    unknown: dict[str, str] = {}
    reached = 0
    stopped = False
    for k in range(depth + 1):
        if k > 0:
            solver.add(enc.trans_at(k - 1))
        props = enc.properties_at(k)
        live = [name for name in pending if name not in unknown]
        if not live:
            break
        # Ask for any live property to fail at depth k; every property false in the model is
        # violated at k (shortest, since none failed at a smaller depth); ask again for the rest.
        while live:
            goal = z3.Or([z3.Not(props[name]) for name in live])
            answer = solver.check(goal)
            if answer == z3.unknown:
                for name in live:
                    unknown[name] = (
                        f"solver returned unknown at depth {k}: {solver.reason_unknown()}"
                    )
                break
            if answer == z3.unsat:
                break
            model = solver.model()
            hit = [n for n in live if z3.is_false(model.eval(props[n], model_completion=True))]
            traces = replay_counterexample(enc, model, k, hit)
            for name in hit:
                found[name] = PropertyResult(name, "violated", depth=k, trace=traces)
                found_after[name] = round(time.perf_counter() - started, 3)
                pending.remove(name)
            live = [n for n in live if n not in hit]
            if first:
                stopped = True
                break
        if not unknown:
            reached = k
        if not pending or stopped:
            break
    # The bit-vector width must fit every value reachable within the bound: then no path wraps
    # around and every answer above is the unbounded-integer answer. (Counterexamples are also
    # replayed through the spec, which would catch a wrapped one.) Else a model could be vacuous.
    # A cheap interval analysis usually shows it; where it cannot, the solver is asked.
    range_check = "intervals"
    if not narrowed and not enc.ranges_fit(reached):
        range_check = "solver"
        ranges = z3.Or([z3.Not(enc.in_range(enc.state_at(t))) for t in range(reached + 1)])
        answer = solver.check(ranges)
        if answer == z3.sat:
            raise _WidthTooSmall()
        if answer == z3.unknown:
            raise EncodingError(f"cannot show that {width}-bit integers fit within {reached} steps")
    results = []
    # Stopped at the first counterexample (depth `reached`): the other properties were only
    # checked up to the depth before it.
    clean = reached - 1 if stopped else reached
    for p in ALWAYS:
        if p.name in found:
            results.append(found[p.name])
        elif p.name in unknown:
            results.append(PropertyResult(p.name, "unknown", depth=reached, detail=unknown[p.name]))
        else:
            # Not a proof: a violation may need more steps (see `bmc_complete` for when it is).
            results.append(
                PropertyResult(
                    p.name,
                    "bounded",
                    depth=clean,
                    detail=f"no violation up to depth {clean}"
                    + (" (stopped at the first counterexample)" if stopped else ""),
                )
            )
    return _result(
        variant,
        "bmc",
        config,
        results,
        started,
        max_depth=reached,
        found_after_seconds=found_after,
        bitvector_width=width,
        range_check=range_check,
    )


# --- k-induction ---------------------------------------------------------------------------------


def _distinct(enc: Encoding, a: SymState, b: SymState) -> Any:
    return z3.Or([a[name] != b[name] for name, _ in enc.fields])


def kinduction(
    variant: Variant,
    config: Config,
    depth: int | None = None,
    timeout: float | None = None,
    invariants: dict[str, Any] | None = None,
    fallback_depth: int | None = None,
) -> CheckResult:
    """k-induction with simple-path constraints, strengthened by the fixed-config invariants.

    Let Q = (every safety property) /\\ (every invariant of `z3_invariants.fixed_invariants`).
    Base case (BMC): no path of length < k from I reaches not Q.
    Step case: Q(s_0) /\\ T(s_0,s_1) /\\ Q(s_1) /\\ ... /\\ T(s_{k-1},s_k) /\\ not Q(s_k), with the
    s_i pairwise distinct, is unsat. If the step case fails at the largest k, the verdict is
    `unknown` and the counterexample to induction (its last state and action) is reported.
    """
    started = time.perf_counter()
    max_k = DEFAULT_KIND_DEPTH if depth is None else depth
    # Unbounded Ints: counters that no invariant bounds cannot wrap around in a CTI.
    enc = Encoding(variant, config, width=None)
    invs = fixed_invariants(enc) if invariants is None else invariants

    def q(s: SymState) -> dict[str, Any]:
        out = dict(enc.properties(s))
        out.update({f"invariant {name}": f(s) for name, f in invs.items()})
        return out

    base = _solver(timeout, logic=None)
    base.add(enc.init(enc.state_at(0)))
    step = _solver(timeout, logic=None)
    cti: dict[str, Any] = {}
    for k in range(1, max_k + 1):
        # Base case at depth k-1: can Q fail within k-1 steps? Then report the BMC answer.
        if k > 1:
            base.add(enc.trans_at(k - 2))
        qs = q(enc.state_at(k - 1))
        if base.check(z3.Not(z3.And(list(qs.values())))) == z3.sat:
            # Some invariant or property fails on a reachable state: BMC finds the shortest.
            result = bmc_cached(variant, config, depth=k - 1, timeout=timeout)
            if result.verdict == "violated":
                result.engine = "kind"
                return result
            failing = [n for n, f in qs.items() if z3.is_false(base.model().eval(f))]
            return _result(
                variant,
                "kind",
                config,
                [
                    PropertyResult(p.name, "unknown", detail=f"invariant fails at depth {k - 1}")
                    for p in ALWAYS
                ],
                started,
                failing_invariants=failing,
            )
        # Step case with k transitions.
        step.push()
        states = [enc.state_at(t, "i_") for t in range(k + 1)]
        for t in range(k):
            step.add(z3.And(list(q(states[t]).values())))
            step.add(enc.trans(states[t], enc.action_at(t, "i_"), states[t + 1]))
        for a, b in itertools.combinations(states, 2):
            step.add(_distinct(enc, a, b))
        last = q(states[k])
        answer = step.check(z3.Not(z3.And(list(last.values()))))
        if answer == z3.unsat:
            step.pop()
            results = [
                PropertyResult(p.name, "holds", depth=k, detail=f"{k}-inductive") for p in ALWAYS
            ]
            proved = _result(
                variant,
                "kind",
                config,
                results,
                started,
                scope="fixed-config",
                k=k,
                invariants=sorted(invs),
            )
            # The proof counts once the encoding shows it can move (within BMC's depth).
            proved = with_movement(proved, variant, config, DEFAULT_BMC_DEPTH, timeout)
            proved.seconds = time.perf_counter() - started
            return proved
        if answer == z3.sat:
            m = step.model()
            vals = [enc.values(m, s) for s in states]
            i = m.eval(enc.action_at(k - 1, "i_"), model_completion=True).as_long()
            failing = [n for n, f in last.items() if z3.is_false(m.eval(f, model_completion=True))]
            cti = {
                "k": k,
                "action": enc.instances[i].name,
                "args": [str(a) for a in enc.instances[i].args],
                "fails": failing,
                "before": _safe_concretize(enc, vals[k - 1]),
                "after": _safe_concretize(enc, vals[k]),
            }
        else:
            cti = {"k": k, "reason": f"solver unknown: {step.reason_unknown()}"}
        step.pop()
    # Not inductive: look for a real counterexample before calling it inconclusive.
    search = bmc_cached(variant, config, depth=fallback_depth, timeout=timeout)
    results = []
    for r in search.results:
        if r.verdict == "violated":
            results.append(r)
        else:
            detail = f"not {max_k}-inductive (see extra.cti); no counterexample within "
            detail += f"{search.extra.get('max_depth')} steps"
            results.append(PropertyResult(r.property, "unknown", depth=max_k, detail=detail))
    return _result(
        variant,
        "kind",
        config,
        results,
        started,
        cti=cti,
        invariants=sorted(invs),
        bmc_depth=search.extra.get("max_depth"),
    )


def _safe_concretize(enc: Encoding, v: dict[str, Any], limit: int = 6000) -> str:
    """The spec state a CTI's values stand for (CTIs need not be reachable, or even spec states)."""
    try:
        text = repr(enc.concretize(v))
    except (EncodingError, IndexError, ValueError, TypeError) as exc:
        text = f"(not a spec state: {exc}) {v}"
    return text if len(text) <= limit else text[:limit] + " ..."


# --- Spacer ---------------------------------------------------------------------------------------


def spacer(variant: Variant, config: Config, timeout: float | None = None) -> CheckResult:
    """Constrained Horn clauses solved by Z3's Spacer.

        Init(s)                          -> Inv(s)
        Inv(s) /\\ T(s, a, s')           -> Inv(s')
        Inv(s) /\\ not (AND_p p(s))      -> false

    `unsat` of the query means safe, with an inductive invariant that Spacer found; it counts only
    after a plain induction query re-checks it (Init -> Inv, Inv /\\ T -> Inv', Inv -> P). `sat`
    means reachable; the shortest counterexample is then found with BMC. Timeouts are `unknown`.
    """
    started = time.perf_counter()
    timeout = 60.0 if timeout is None else timeout
    enc = Encoding(variant, config, width=None)
    s, s2 = enc.state_at(0, "h_"), enc.state_at(1, "h_")
    act = enc.action_at(0, "h_")
    names = [name for name, _ in enc.fields]
    sorts = [z3.BoolSort() if kind == "B" else z3.IntSort() for _, kind in enc.fields]
    inv = z3.Function("Inv", *sorts, z3.BoolSort())
    bad = z3.Function("Bad", z3.BoolSort())
    fp = z3.Fixedpoint()
    fp.set(engine="spacer")
    fp.set("timeout", max(1, int(timeout * 1000)))
    fp.register_relation(inv, bad)
    cur = [s[n] for n in names]
    nxt = [s2[n] for n in names]
    fp.declare_var(*cur, *nxt, act)
    fp.rule(inv(*cur), enc.init(s))
    fp.rule(inv(*nxt), [inv(*cur), enc.trans(s, act, s2)])
    fp.rule(bad(), [inv(*cur), z3.Not(z3.And(list(enc.properties(s).values())))])
    try:
        answer = fp.query(bad())
    except z3.Z3Exception as exc:  # Spacer reports its timeout as a cancellation
        answer = z3.unknown
        cancelled = str(exc)
    else:
        cancelled = ""
    if answer == z3.sat:
        result = bmc_cached(variant, config, timeout=timeout)
        result.engine = "spacer"
        result.seconds = time.perf_counter() - started
        if result.verdict != "violated":
            for r in result.results:
                if r.verdict in ("holds", "bounded"):
                    r.verdict = "unknown"
                    r.detail = "Spacer found a violation deeper than BMC's bound"
        return result
    if answer == z3.unknown:
        reason = f"timed out after {timeout:g} s" if cancelled else fp.reason_unknown()
        results = [PropertyResult(p.name, "unknown", detail=f"Spacer: {reason}") for p in ALWAYS]
        return _result(variant, "spacer", config, results, started, reason=reason)
    # Safe: re-check Spacer's invariant with plain induction queries before it counts.
    body = fp.get_answer()
    found = _instantiate(body, inv, cur)
    found_next = _instantiate(body, inv, nxt)
    checks = {
        "initiation": z3.And(enc.init(s), z3.Not(found)),
        "consecution": z3.And(found, enc.trans(s, act, s2), z3.Not(found_next)),
        "safety": z3.And(found, z3.Not(z3.And(list(enc.properties(s).values())))),
    }
    failed = []
    for name, query in checks.items():
        solver = _solver(timeout, logic=None)
        solver.add(query)
        if solver.check() != z3.unsat:
            failed.append(name)
    if failed:
        raise EncodingError(f"Spacer's invariant fails the re-check: {', '.join(failed)}")
    results = [
        PropertyResult(p.name, "holds", detail="Spacer invariant, re-checked by induction")
        for p in ALWAYS
    ]
    proved = _result(
        variant,
        "spacer",
        config,
        results,
        started,
        scope="fixed-config",
        invariant_size=len(str(found)),
    )
    # The proof counts once the encoding shows it can move (within BMC's depth).
    proved = with_movement(proved, variant, config, DEFAULT_BMC_DEPTH, timeout)
    proved.seconds = time.perf_counter() - started
    return proved


def _instantiate(answer: Any, relation: Any, args: Sequence[Any]) -> Any:
    """Spacer's definition of `relation` (from `get_answer()`), applied to `args`.

    The answer is a conjunction holding `ForAll(vs, relation(vs) == body)`; the bound variables
    appear in `body` as de Bruijn indices, mapped here to the actual arguments.
    """
    parts = answer.children() if z3.is_and(answer) else [answer]
    for part in parts:
        body = part.body() if z3.is_quantifier(part) else part
        if not (z3.is_eq(body) and z3.is_app(body.arg(0))):
            continue
        lhs, rhs = body.arg(0), body.arg(1)
        if not lhs.decl().eq(relation):
            continue
        n = part.num_vars() if z3.is_quantifier(part) else 0
        values: list[Any] = [None] * n
        for i in range(lhs.num_args()):
            values[z3.get_var_index(lhs.arg(i))] = args[i]
        return z3.substitute_vars(rhs, *values) if n else rhs
    raise EncodingError(f"Spacer's answer has no definition of {relation}: {answer}")
