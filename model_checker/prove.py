"""The `prove` engine: inductive-invariant proofs, for any size when the design allows it.

0. A variant with Python functions (overrides, added actions, state fields written in Python)
   is refused (`CannotEncode`, exit 3): no model below contains them.
1. If the any-size model (`z3_derived`: the spec's guard and effect formulas and the variant's
   own, its added actions and state fields, over uninterpreted sorts) covers the variant (push
   path, receiver-checked writes, one prefill rank), discharge its obligations: scope
   `"any-size"` (every pool size, every number of requests and tenants).
2. Otherwise discharge the same obligations on the fixed-configuration encoding, per spec action
   and invariant (`z3_invariants`): scope `"fixed-config"`, and the result says why not any size
   (`extra["any_size_unavailable"]`).
3. A property the any-size proof leaves unproved, and for which BMC finds no counterexample at
   the configuration, is proved on the fixed-configuration encoding (step 2's obligations, made
   once): it `holds` with scope `fixed-config` (`PropertyResult.scope`), the others keep
   `any-size`, and the result as a whole covers the narrower scope (`extra["scope"]`,
   `extra["any_size_properties"]`). Room-keyed matching's `rejected_request_gets_error_not_output`
   is such a property (docs/z3.md).

Every obligation is listed in `extra["obligations"]`. Each property is reported on its own: when
obligations fail, the claims (invariants and properties) that failed are dropped and the rest
re-checked assuming only what is left, until the set is inductive relative to itself
(`_inductive_subset`, Houdini-style). A property in that set holds; for the others BMC looks for a
real counterexample at the fixed configuration: a property it violates is `violated` (with the
replayed trace), the rest `unknown`, naming the obligation that failed (or came back unknown).

Before a `holds` counts, the model shows it can move (`z3_witnesses`): for the any-size model, the
spec's own paths to every action it takes and every witness it reaches are replayed through the
model (`derived_movement`); for the fixed encoding, every action fires and every witness is
reached within the BMC depth. A model that cannot is vacuous: its properties are `unknown`
(exit 3) with the finding in `extra["vacuity"]`, never "holds".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import z3

from kvhandoff.model_checker.result import CheckResult, PropertyResult, Scope
from kvhandoff.model_checker.z3_derived import Obligation, report_obligation
from kvhandoff.model_checker.z3_encoding import CannotEncode, Encoding
from kvhandoff.model_checker.z3_engines import (
    DEFAULT_BMC_DEPTH,
    NOT_CHECKED,
    _safe_concretize,
    bmc_cached,
)
from kvhandoff.model_checker.z3_invariants import fixed_invariants
from kvhandoff.model_checker.z3_witnesses import derived_movement_cached, fixed_movement_cached
from kvhandoff.spec.config import Config
from kvhandoff.spec.properties import ALWAYS
from kvhandoff.spec.variants import Variant


def prove_fixed(
    variant: Variant,
    config: Config,
    timeout: float | None = None,
    only: set[str] | None = None,
    earlier: list[Obligation] | None = None,
    enc: Encoding | None = None,
) -> list[Obligation]:
    """Initiation, consecution per (spec action, claim) and safety on the fixed-config encoding.
    `only`: the claims (invariants and properties) to assume and prove, the others dropped.
    `earlier`: the obligations of an earlier round of the same proof (a larger `only`); one it
    proved from claims all still kept is carried over rather than asked again."""
    enc = enc or Encoding(variant, config, width=None)
    s, s2, act = enc.state_at(0, "p_"), enc.state_at(1, "p_"), enc.action_at(0, "p_")
    invs = fixed_invariants(enc)
    claims = {**{n: f(s) for n, f in invs.items()}, **enc.properties(s)}
    if only is not None:
        claims = {n: f for n, f in claims.items() if n in only}
    after = {**{n: f(s2) for n, f in invs.items()}, **enc.properties(s2)}
    # Each claim is assumed through a literal of its own, so that an unsat core names the claims
    # a proof used: Houdini's next round drops claims, and an obligation proved without any of
    # them stays proved (fewer assumptions than its core cannot be needed, more are not asked).
    literal = {n: z3.Bool(f"assume.{n}") for n in claims}
    assuming = [z3.Implies(literal[n], f) for n, f in claims.items()]
    by_literal = {str(lit): n for n, lit in literal.items()}
    trans = enc.trans(s, act, s2)
    out: list[Obligation] = []
    kept = set(claims)
    carried = {
        (o.kind, o.invariant, o.action): o
        for o in earlier or ()
        if o.verdict == "proved" and o.assumed is not None and o.assumed <= kept
    }

    def check(kind: str, name: str, action: str | None, *assertions: Any, cti: bool) -> None:
        known = carried.get((kind, name, action))
        if known is not None:
            out.append(replace(known, reused=True))
            return
        report_obligation("fixed-config", len(out), kind, name, action)
        started = time.perf_counter()
        solver = z3.Solver()
        if timeout is not None:
            solver.set("timeout", max(1, int(timeout * 1000)))
        solver.add(*assuming, *assertions)
        answer = solver.check(*literal.values())
        seconds = time.perf_counter() - started
        if answer == z3.unsat:
            used = frozenset(by_literal[str(c)] for c in solver.unsat_core())
            out.append(Obligation(kind, name, action, "proved", seconds, assumed=used))
        elif answer == z3.sat:
            m = solver.model()
            cex: dict[str, Any] = {"before": _safe_concretize(enc, enc.values(m, s))}
            if cti:
                cex["after"] = _safe_concretize(enc, enc.values(m, s2))
            out.append(Obligation(kind, name, action, "failed", seconds, cex))
        else:
            out.append(Obligation(kind, name, action, "unknown", seconds))

    for name, claim in claims.items():
        # Initiation assumes no claim: the literals are free, and no core names one.
        check("initiation", name, None, enc.init(s), z3.Not(claim), cti=False)
    names = sorted({i.name for i in enc.instances})
    for action in names:
        ids = [i for i, inst in enumerate(enc.instances) if inst.name == action]
        which = z3.Or([act == i for i in ids])
        for name in claims:
            check("consecution", name, action, trans, which, z3.Not(after[name]), cti=True)
    for name in enc.properties(s):
        if name in claims:
            check("safety", name, None, z3.Not(claims[name]), cti=False)
    return out


Run = Callable[[set[str] | None], list[Obligation]]


def prove(
    variant: Variant,
    config: Config,
    timeout: float | None = None,
    depth: int | None = None,
) -> CheckResult:
    """Prove; `depth` bounds the BMC search for a real counterexample when the proof fails."""
    from kvhandoff.model_checker.logic_z3 import Untranslatable

    started = time.perf_counter()
    # The any-size model is the spec's own rules translated under the variant's design options
    # and its own formulas. A Python override or added action reaches no model, so proving the
    # rest would prove some other protocol and call it this one. The fixed-config encoding
    # refuses all of these (CannotEncode, naming the action or field), so ask it first. Asked
    # without client retries: the one thing it refuses with them (several prefill ranks) is
    # its own layout's limit, not the variant's, and the any-size model may still read them.
    Encoding(variant, replace(config, max_retries=0))
    obligations: list[Obligation] | None = None
    run: Run
    why_not = _derived_why_not(variant, config)
    if why_not is None:
        run = partial(_run_derived, variant, timeout, config.max_retries > 0)
        try:
            # Translating every guard, effect and claim is the proof's first part: a construct
            # outside the model (a guard over the messages in flight) is refused.
            obligations = run(None)
        except Untranslatable as exc:
            why_not = f"outside the derived any-size model: {exc}"
    scope: Scope
    if why_not is None:
        scope = "any-size"
    else:
        run = _FixedRounds(variant, config, timeout)
        scope = "fixed-config"
    if obligations is None:
        obligations = run(None)
    proved, rounds, first_failure = _inductive_subset(run, obligations)
    failed = [o for o in obligations if o.verdict != "proved"]
    extra: dict[str, Any] = {
        "scope": scope,
        # The scope of these obligations' proof; `scope` narrows if a property is then proved
        # on the configuration only (`_FixedProof`).
        "obligations_scope": scope,
        "obligations": [o.to_json() for o in obligations],
        "obligations_proved": len(obligations) - len(failed),
        "obligations_total": len(obligations),
        "not_checked": dict(NOT_CHECKED),
        "expected_breaks": list(variant.breaks),
    }
    if why_not is not None:
        extra["any_size_unavailable"] = why_not
    if failed:
        extra["failed_obligations"] = [o.to_json() for o in failed]
        extra["inductive_subset"] = sorted(proved)
        extra["inductive_subset_rounds"] = rounds
    # Every Z3 model shows it can move before a `holds` counts (z3_witnesses).
    if any(p.name in proved for p in ALWAYS):
        several = config.prefill_instances > 1 or config.decode_instances > 1
        if several:
            # The any-size model's replay of the spec's paths (`Simulator`) pins states of
            # several instances slowly (on `--scenario instances` its steps time out): the
            # witnesses are checked on the fixed encoding of the configuration instead, as
            # before the any-size model took instances. (The any-size model moves on every
            # one-instance configuration's paths: the same model, whatever the config.)
            movement = fixed_movement_cached(variant, config, DEFAULT_BMC_DEPTH, timeout=timeout)
            extra["movement_on"] = "fixed-config (several instances)"
        elif why_not is None:
            movement = derived_movement_cached(
                variant, config, timeout=timeout, proved=frozenset(proved)
            )
        else:
            movement = fixed_movement_cached(variant, config, DEFAULT_BMC_DEPTH, timeout=timeout)
        extra["movement"] = movement.to_json()
        witnesses = movement.reached()
        vacuity = movement.problems
    else:
        witnesses, vacuity = {}, []
    if vacuity:
        extra["vacuity"] = list(vacuity)
    search = None
    no_search: str | None = None
    results = []
    fixed: _FixedProof | None = None
    for p in ALWAYS:
        if p.name in proved and not vacuity:
            detail = f"inductive invariant, {len(obligations)} obligations ({scope})"
            if failed:
                detail = (
                    f"inductive with the {len(proved)} claims that survive the failed "
                    f"obligations ({scope})"
                )
            results.append(PropertyResult(p.name, "holds", detail=detail, scope=scope))
            continue
        if p.name in proved:
            results.append(
                PropertyResult(p.name, "unknown", detail="proved, but vacuous: " + vacuity[0])
            )
            continue
        # Not proved: is there a real counterexample? (Not searched where BMC's encoding cannot
        # hold the configuration: client retries with several prefill ranks.)
        if search is None and no_search is None:
            try:
                Encoding(variant, config)
            except CannotEncode as exc:
                no_search = str(exc)
            else:
                search = bmc_cached(variant, config, depth=depth, timeout=timeout)
                extra["bmc_depth"] = search.extra.get("max_depth")
        if search is not None:
            found = search.result_for(p.name)
            if found.verdict == "violated":
                results.append(found)
                continue
        first = first_failure[p.name]
        what = f"{first.kind} of {first.invariant}" + (
            f" under {first.action}" if first.action else ""
        )
        if scope == "any-size" and p.name not in proved:
            # Not inductive for every size, and no counterexample here: it may still hold for
            # this configuration (room-keyed matching's `rejected_request_gets_error_not_output`
            # does, docs/z3.md), which the fixed-configuration proof settles. Said per property:
            # the others keep the any-size proof they have.
            if fixed is None:
                fixed = _FixedProof(variant, config, timeout)
            held = fixed.holds(p.name)
            if held is not None:
                results.append(
                    PropertyResult(
                        p.name,
                        "holds",
                        detail=f"{held}; not for every size: {what} fails any-size",
                        scope="fixed-config",
                    )
                )
                continue
        why = "unknown" if first.verdict == "unknown" else "fails"
        leans = "" if first in failed else " once the claims that failed are no longer assumed"
        detail = f"proof {why}: {what}{leans}; " + (
            f"no counterexample within {search.extra.get('max_depth')} steps"
            if search is not None
            else f"no BMC search ({no_search}: use the explorer)"
        )
        results.append(PropertyResult(p.name, "unknown", detail=detail))
    if fixed is not None:
        extra["fixed_config_proof"] = fixed.to_json()
        if any(r.scope == "fixed-config" for r in results if r.verdict == "holds"):
            # What the whole result covers is what its narrowest `holds` covers; each property
            # keeps its own scope (`PropertyResult.scope`).
            extra["scope"] = "fixed-config"
            extra["any_size_properties"] = [
                r.property for r in results if r.verdict == "holds" and r.scope == "any-size"
            ]
    return CheckResult(
        variant.name,
        "prove",
        config,
        results,
        witnesses=witnesses,
        seconds=time.perf_counter() - started,
        extra=extra,
    )


class _FixedProof:
    """The fixed-configuration proof of the claims the any-size proof left, made once when the
    first of them needs it: its obligations (Houdini rounds, `_inductive_subset`) and the
    movement check of its encoding, as `prove` makes them for a variant outside the any-size
    model."""

    def __init__(self, variant: Variant, config: Config, timeout: float | None) -> None:
        self.obligations: list[Obligation] = []
        self.proved: set[str] = set()
        self.rounds = 0
        self.failed: list[Obligation] = []
        self.vacuity: list[str] = []
        self.cannot_encode: str | None = None
        run = _FixedRounds(variant, config, timeout)
        try:
            self.obligations = run(None)
        except CannotEncode as exc:
            # Client retries with several prefill ranks: outside the fixed encoding's layout.
            self.cannot_encode = str(exc)
            return
        self.proved, self.rounds, _ = _inductive_subset(run, self.obligations)
        self.failed = [o for o in self.obligations if o.verdict != "proved"]
        if any(p.name in self.proved for p in ALWAYS):
            movement = fixed_movement_cached(variant, config, DEFAULT_BMC_DEPTH, timeout=timeout)
            self.vacuity = list(movement.problems)

    def holds(self, name: str) -> str | None:
        """How `name` was proved on the configuration (None: it was not, or the model is
        vacuous)."""
        if name not in self.proved or self.vacuity:
            return None
        n = len(self.obligations)
        if self.failed:
            return (
                f"inductive with the {len(self.proved)} claims that survive the failed "
                f"obligations ({n} obligations, fixed-config)"
            )
        return f"inductive invariant, {n} obligations (fixed-config)"

    def to_json(self) -> dict[str, Any]:
        return {
            "obligations_proved": len(self.obligations) - len(self.failed),
            "obligations_total": len(self.obligations),
            "proved": sorted(self.proved),
            "rounds": self.rounds,
            **({"vacuity": self.vacuity} if self.vacuity else {}),
            **({"cannot_encode": self.cannot_encode} if self.cannot_encode else {}),
        }


def _run_derived(
    variant: Variant, timeout: float | None, retries: bool, only: set[str] | None
) -> list[Obligation]:
    from kvhandoff.model_checker.z3_derived import prove_derived

    # The any-size model leaves the scenario's numbers free, `max_retries` too. A configuration
    # without retries (the default) fixes that one: with `max_retries` 0 the retry's guard never
    # holds, so its action is left out, and the proof covers every size without client retries.
    return prove_derived(
        variant.design, timeout=timeout, only=only, variant=variant, retries=retries
    )


class _FixedRounds:
    """The fixed-config proof's rounds (`Run`): one encoding for all of them, and each round
    given the obligations of the one before, so that Houdini re-asks only what leaned on a claim
    it dropped (measured: m7_release_before_drain on the sequential scenario, three rounds of
    558, 411 and 351 obligations, 70 s, each asked afresh before)."""

    def __init__(self, variant: Variant, config: Config, timeout: float | None) -> None:
        self.variant, self.config, self.timeout = variant, config, timeout
        self.enc: Encoding | None = None
        self.last: list[Obligation] | None = None

    def __call__(self, only: set[str] | None) -> list[Obligation]:
        if self.enc is None:
            self.enc = Encoding(self.variant, self.config, width=None)
        self.last = prove_fixed(
            self.variant, self.config, self.timeout, only, earlier=self.last, enc=self.enc
        )
        return self.last


def _derived_why_not(variant: Variant, config: Config) -> str | None:
    """Why the derived any-size model cannot prove this variant (None when it can). It reads the
    variant's own formulas (replaced guards and effects, added actions, state fields); what it
    lacks is a design outside its fragment and more than one prefill rank (and a construct it
    refuses when translating, which `prove` reports the same way). Room-keyed matching it reads,
    with any number of instances (with the invariants of `spec.invariants.invariants_for`); there
    `rejected_request_gets_error_not_output` can hold for the configuration and not for every
    size (docs/z3.md, "The invariants"), and `prove` proves it on the configuration instead,
    saying so for that property alone (`_FixedProof`)."""
    from kvhandoff.model_checker.z3_derived import supports as derived_supports

    why_not = derived_supports(variant.design)
    if why_not is None and config.prefill_ranks > 1:
        why_not = (
            f"prefill_ranks={config.prefill_ranks}: the derived any-size model has one prefill "
            "rank (per-rank shards, completions and drain acks are in the fixed-config encoding "
            "only)"
        )
    return why_not


def _inductive_subset(
    run: Callable[[set[str] | None], list[Obligation]], obligations: list[Obligation]
) -> tuple[set[str], int, dict[str, Obligation]]:
    """The largest set of claims (invariants and properties) that is inductive relative to
    itself, Houdini-style: drop every claim with an obligation not proved, re-check the rest
    assuming only what is left, until nothing fails. A property in the set is proved on its
    own: one failing property does not take the others with it, but nothing that leaned on a
    failed claim survives. Returns the set, the number of re-checks, and for each claim left
    out the first obligation of it that was not proved."""
    kept = {o.invariant for o in obligations}
    rounds = 0
    first: dict[str, Obligation] = {}
    while True:
        for o in obligations:
            if o.verdict != "proved":
                first.setdefault(o.invariant, o)
        bad = {o.invariant for o in obligations if o.verdict != "proved"}
        if not bad & kept:
            return kept, rounds, first
        kept -= bad
        if not kept:
            return kept, rounds, first
        obligations = run(set(kept))
        rounds += 1
