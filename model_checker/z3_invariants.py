"""The invariants of `spec/invariants.py`, over the fixed-configuration Z3 encoding.

Each entry has the name of its Python twin (a test checks the two agree on every state the explorer
reaches), plus `well_formed`: facts about the encoding itself (phases in range, counters
non-negative, ids naming real requests), which a spec state satisfies by construction.
Together with the safety properties they are 1-inductive for the reference protocol at the default
configuration, which is what `kvhandoff check --engine kind` proves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import z3

from kvhandoff.model_checker.logic_z3 import FixedReading, translate
from kvhandoff.model_checker.z3_encoding import (
    D_PHASES,
    KINDS,
    P_PHASES,
    REASONS,
    SLOT,
    D,
    Encoding,
    P,
    SymState,
)
from kvhandoff.spec.invariants import INVARIANTS, ONE_SIDED_INVARIANTS
from kvhandoff.spec.logic import Term

InvariantFormula = Callable[[SymState], Any]


def _in(x: Any, names: tuple[str, ...], table: dict[str, int]) -> Any:
    return z3.Or([x == table[n] for n in names])


def fixed_invariants(enc: Encoding) -> dict[str, InvariantFormula]:
    """The invariants kind and the fixed-configuration prove use: the formulas of
    `spec/invariants.py` themselves, read over the encoding (`logic_z3.FixedReading`), with the
    one-sided designs' extra one, plus `well_formed` (facts about the encoding itself)."""
    out: dict[str, InvariantFormula] = {}
    if enc.design.write_path == "one_sided":
        for inv in ONE_SIDED_INVARIANTS:
            out[inv.name] = _derived(enc, inv.formula)
    out["well_formed"] = legacy_fixed_invariants(enc)["well_formed"]
    for inv in INVARIANTS:
        out[inv.name] = _derived(enc, inv.formula)
    return out


def _derived(enc: Encoding, formula: Term) -> InvariantFormula:
    return lambda s: translate(formula, FixedReading(enc, s))


def legacy_fixed_invariants(enc: Encoding) -> dict[str, InvariantFormula]:
    """The hand-written Z3 twins of the invariants, kept until every engine has run on the
    derived ones for a while: `tests/model_checker/test_invariants_once.py` checks, by Z3, that
    each derived formula implies its twin (they are equivalent but for the facts the twins
    left out)."""
    n, pages = enc.n, range(enc.np)

    def present(s: SymState, kind: str, r: int) -> Any:
        k = SLOT[kind]
        return s[f"r{r}.{k}_net"] + s[f"r{r}.{k}_lost"] > 0

    def well_formed(s: SymState) -> Any:
        out = [enc.in_range(s), s["next_gen"] >= 1]
        for r in range(n):
            out += [s[f"r{r}.p"] < len(P_PHASES), s[f"r{r}.d"] < len(D_PHASES)]
            out.append(s[f"r{r}.ans_reason"] < len(REASONS))
            # Epochs come from the peers' health checks: never ahead of the peer.
            out.append(s[f"r{r}.p_epoch"] <= s["decode_epoch"])
            out.append(s[f"r{r}.g_epoch"] <= s["decode_epoch"])
            out.append(s[f"r{r}.d_epoch"] <= s["prefill_epoch"])
            for j in pages:
                out.append(z3.Implies(s[f"r{r}.w{j}"], s[f"r{r}.p_pages{j}"]))
        for j in pages:
            out.append(z3.Implies(s[f"pg{j}.own"], s[f"pg{j}.own_req"] < n))
            out.append(z3.Implies(s[f"pg{j}.has"], s[f"pg{j}.c_req"] < n))
        return z3.And(out)

    def unsubmitted_requests_are_untouched(s: SymState) -> Any:
        out = []
        for r in range(n):
            untouched = [
                s[f"r{r}.p"] == P["none"],
                s[f"r{r}.d"] == D["none"],
                z3.Not(s[f"r{r}.ans_set"]),
                z3.Not(s[f"r{r}.not_as_is"]),
                s[f"r{r}.p_gen"] == 0,
                s[f"r{r}.d_gen"] == 0,
            ]
            untouched += [z3.Not(present(s, kind, r)) for kind in enc.slot_kinds]
            untouched += [z3.Not(s[f"r{r}.w{j}"]) for j in pages]
            untouched += [z3.Not(s[f"r{r}.pa"]), s[f"r{r}.p_wrote"] == 0]
            out.append(z3.Implies(z3.Not(s[f"r{r}.submitted"]), z3.And(untouched)))
        return z3.And(out)

    def generations_are_unique(s: SymState) -> Any:
        out = []
        for r in range(n):
            out.append(s[f"r{r}.d_gen"] < s["next_gen"])
            for q in range(r + 1, n):
                out.append(z3.Implies(s[f"r{r}.d_gen"] != 0, s[f"r{r}.d_gen"] != s[f"r{q}.d_gen"]))
        return z3.And(out)

    def unreserved_requests_hold_nothing(s: SymState) -> Any:
        out = []
        for r in range(n):
            dp = z3.Or([s[f"r{r}.d_pages{j}"] for j in pages])
            early = _in(s[f"r{r}.d"], ("none", "received", "admitted", "rejected"), D)
            holding = ("reserved", "validated", "generated", "answered", "failed")
            out.append(z3.Implies(early, z3.And(s[f"r{r}.d_gen"] == 0, z3.Not(dp))))
            out.append(z3.Implies(dp, _in(s[f"r{r}.d"], holding, D)))
            reserved = ("reserved", "validated", "generated", "answered")
            out.append(z3.Implies(_in(s[f"r{r}.d"], reserved, D), s[f"r{r}.d_gen"] != 0))
            awaiting = z3.And(s[f"r{r}.d"] == D["failed"], s[f"r{r}.d_gen"] != 0)
            out.append(z3.Implies(s[f"r{r}.d_awaiting"], awaiting))
        return z3.And(out)

    def prefill_holds_decodes_generation(s: SymState) -> Any:
        out = []
        for r in range(n):
            pgen, wrote = s[f"r{r}.p_gen"], s[f"r{r}.p_wrote"]
            out.append(z3.Implies(pgen != 0, pgen == s[f"r{r}.d_gen"]))
            out.append(wrote <= enc._count([s[f"r{r}.p_pages{j}"] for j in pages]))
            out.append(z3.Implies(wrote > 0, pgen != 0))
            out.append(z3.Implies(_in(s[f"r{r}.p"], ("granted", "completed"), P), pgen != 0))
            idle = ("none", "received", "admitted", "rejected")
            out.append(z3.Implies(_in(s[f"r{r}.p"], idle, P), wrote == 0))
        return z3.And(out)

    def messages_carry_their_generation(s: SymState) -> Any:
        out = []
        for r in range(n):
            dgen, pgen = s[f"r{r}.d_gen"], s[f"r{r}.p_gen"]
            g, c = s[f"r{r}.g_gen"], s[f"r{r}.c_gen"]
            out.append(z3.Implies(present(s, "grant", r), z3.And(g != 0, g == dgen)))
            out.append(z3.Implies(present(s, "completion", r), z3.And(c != 0, c == pgen)))
            for kind in ("abort", "abort_ack", "failure", *enc.slot_kinds[len(KINDS) :]):
                gen = s[f"r{r}.{SLOT[kind]}_gen"]
                out.append(z3.Implies(present(s, kind, r), z3.Or(gen == 0, gen == dgen)))
            pgen_ok = z3.And(s[f"r{r}.pa_gen"] != 0, s[f"r{r}.pa_gen"] == dgen)
            out.append(z3.Implies(s[f"r{r}.pa"], pgen_ok))
            kgen = s[f"r{r}.k_gen"]
            out.append(z3.Implies(present(s, "abort_ack", r), z3.And(kgen != 0, kgen == dgen)))
            if enc.design.release_fence not in ("drain_ack", "ack_or_timeout"):
                # Without a drain fence nobody asks for acks: none is pending or in flight.
                out.append(z3.Not(s[f"r{r}.pa"]))
                out.append(z3.Not(present(s, "abort_ack", r)))
                out.append(z3.Not(s[f"r{r}.d_awaiting"]))
        return z3.And(out)

    def writes_carry_their_grant(s: SymState) -> Any:
        return z3.And(
            [
                z3.Implies(
                    s[f"r{r}.w{j}"],
                    z3.And(
                        s[f"r{r}.p_gen"] != 0,
                        s[f"r{r}.p_pages{j}"],
                        enc._rank(s, f"r{r}.p_pages", j) < s[f"r{r}.p_wrote"],
                        # Prefill completes only once its writes returned.
                        s[f"r{r}.p"] != P["completed"],
                    ),
                )
                for r in range(n)
                for j in pages
            ]
        )

    def owned_pages_hold_owner_data_or_nothing(s: SymState) -> Any:
        out = []
        for j in pages:
            own = z3.And(
                s[f"pg{j}.c_req"] == s[f"pg{j}.own_req"],
                s[f"pg{j}.c_gen"] == s[f"pg{j}.own_gen"],
            )
            if enc.pull:  # or outside data: a read that landed after its source lease expired
                own = z3.Or(own, s[f"pg{j}.c_req"] == -1)
            out.append(z3.Implies(z3.And(s[f"pg{j}.own"], s[f"pg{j}.has"]), own))
        return z3.And(out)

    def validated_pages_hold_own_data(s: SymState) -> Any:
        out = []
        for r in range(n):
            for j in pages:
                own = z3.And(
                    s[f"pg{j}.has"], s[f"pg{j}.c_req"] == r, s[f"pg{j}.c_gen"] == s[f"r{r}.d_gen"]
                )
                pre = z3.And(s[f"r{r}.d"] == D["validated"], s[f"r{r}.d_pages{j}"])
                out.append(z3.Implies(pre, own))
        return z3.And(out)

    def decode_validates_only_completed_prefill(s: SymState) -> Any:
        out = []
        for r in range(n):
            done = s[f"r{r}.p"] == P["completed"]
            later = _in(s[f"r{r}.d"], ("validated", "generated", "answered"), D)
            ok = z3.And(s[f"r{r}.ans_set"], s[f"r{r}.ans_ok"])
            out.append(z3.Implies(z3.Or(later, s[f"r{r}.read_set"], s[f"r{r}.acc_set"]), done))
            out.append(z3.Implies(ok, z3.And(done, s[f"r{r}.read_set"])))
            out.append(
                z3.Implies(_in(s[f"r{r}.d"], ("generated", "answered"), D), s[f"r{r}.read_set"])
            )
            out.append(z3.Implies(present(s, "completion", r), done))
        return z3.And(out)

    def rejected_requests_are_never_completed(s: SymState) -> Any:
        out = []
        for r in range(n):
            never = z3.And(
                s[f"r{r}.p_wrote"] == 0,
                z3.Not(_in(s[f"r{r}.p"], ("granted", "completed"), P)),
                z3.Not(_in(s[f"r{r}.d"], ("validated", "generated", "answered"), D)),
                z3.Not(s[f"r{r}.read_set"]),
                z3.Not(z3.And(s[f"r{r}.ans_set"], s[f"r{r}.ans_ok"])),
                z3.Not(present(s, "completion", r)),
                z3.Or(
                    s[f"r{r}.p"] == P["rejected"],
                    s[f"r{r}.d"] == D["rejected"],
                    z3.And(s[f"r{r}.p"] == P["none"], s[f"r{r}.d"] == D["none"]),
                ),
            )
            out.append(z3.Implies(s[f"r{r}.not_as_is"], never))
        return z3.And(out)

    def current_writes(s: SymState, r: int) -> Any:
        """A write of r issued against the current decode incarnation (others are refused)."""
        anyw = z3.Or([s[f"r{r}.w{j}"] for j in pages])
        return z3.And(anyw, s[f"r{r}.p_epoch"] == s["decode_epoch"])

    def fenced_writes_land_in_held_pages(s: SymState) -> Any:
        """One-sided writes land wherever they point; the drain fence keeps that a page its own
        request still holds: a current write targets a held page, a prefill that may still write
        holds the same grant as decode, and decode keeps the pages until writes drained."""
        out = []
        for r in range(n):
            cur = z3.And(s[f"r{r}.p_epoch"] == s["decode_epoch"])
            held = z3.Or(
                s[f"r{r}.d"] == D["reserved"],
                z3.And(s[f"r{r}.d"] == D["failed"], s[f"r{r}.d_awaiting"]),
            )
            for j in pages:
                out.append(z3.Implies(z3.And(s[f"r{r}.w{j}"], cur), s[f"r{r}.d_pages{j}"]))
            live = _in(s[f"r{r}.p"], ("received", "admitted", "granted"), P)
            writing = z3.And(live, s[f"r{r}.p_gen"] != 0, cur)
            out.append(z3.Implies(writing, held))
            out.append(
                z3.Implies(
                    writing,
                    z3.And([s[f"r{r}.p_pages{j}"] == s[f"r{r}.d_pages{j}"] for j in pages]),
                )
            )
            waiting = z3.And(
                present(s, "grant", r),
                s[f"r{r}.g_epoch"] == s["decode_epoch"],
                _in(s[f"r{r}.p"], ("received", "admitted"), P),
                s[f"r{r}.p_gen"] == 0,
            )
            out.append(z3.Implies(waiting, held))
            out.append(
                z3.Implies(
                    waiting,
                    z3.And([s[f"r{r}.g_pages{j}"] == s[f"r{r}.d_pages{j}"] for j in pages]),
                )
            )
            done = z3.Or(
                _in(s[f"r{r}.d"], ("validated", "generated", "answered"), D),
                z3.And(s[f"r{r}.d"] == D["failed"], z3.Not(s[f"r{r}.d_awaiting"])),
                s[f"r{r}.p"] == P["completed"],
                present(s, "completion", r),
                present(s, "failure", r),
                present(s, "abort_ack", r),
            )
            out.append(z3.Implies(done, z3.Not(current_writes(s, r))))
            stopped = z3.Not(_in(s[f"r{r}.p"], ("received", "admitted", "granted"), P))
            told = z3.Or(s[f"r{r}.pa"], present(s, "abort_ack", r), present(s, "failure", r))
            out.append(z3.Implies(told, stopped))
        return z3.And(out)

    extra: dict[str, InvariantFormula] = {}
    if enc.design.write_path == "one_sided":
        extra["fenced_writes_land_in_held_pages"] = fenced_writes_land_in_held_pages
    return {
        **extra,
        "well_formed": well_formed,
        "unsubmitted_requests_are_untouched": unsubmitted_requests_are_untouched,
        "generations_are_unique": generations_are_unique,
        "unreserved_requests_hold_nothing": unreserved_requests_hold_nothing,
        "prefill_holds_decodes_generation": prefill_holds_decodes_generation,
        "messages_carry_their_generation": messages_carry_their_generation,
        "writes_carry_their_grant": writes_carry_their_grant,
        "owned_pages_hold_owner_data_or_nothing": owned_pages_hold_owner_data_or_nothing,
        "validated_pages_hold_own_data": validated_pages_hold_own_data,
        "decode_validates_only_completed_prefill": decode_validates_only_completed_prefill,
        "rejected_requests_are_never_completed": rejected_requests_are_never_completed,
    }
