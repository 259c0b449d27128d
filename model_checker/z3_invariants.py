"""The invariants of `spec/invariants.py`, over the fixed-configuration Z3 encoding.

Each entry is an invariant's formula, read over the encoding, plus `well_formed`: facts about the
encoding itself (phases in range, counters non-negative, ids naming real requests), which a spec
state satisfies by construction.
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
    P_PHASES,
    REASONS,
    Encoding,
    SymState,
    att,
    epoch_var,
    shard,
    write_var,
)
from kvhandoff.spec.invariants import ONE_SIDED_INVARIANTS, invariants_for
from kvhandoff.spec.logic import Term

InvariantFormula = Callable[[SymState], Any]


def _in(x: Any, names: tuple[str, ...], table: dict[str, int]) -> Any:
    return z3.Or([x == table[n] for n in names])


def fixed_invariants(enc: Encoding) -> dict[str, InvariantFormula]:
    """The invariants kind and the fixed-configuration prove use: the formulas of
    `spec/invariants.py` themselves, the design's (`invariants_for`: room-keyed matching's
    versions, the one-sided designs' extra one), read over the encoding
    (`logic_z3.FixedReading`), plus `well_formed` (facts about the encoding itself)."""
    invs = invariants_for(enc.design)
    out: dict[str, InvariantFormula] = {}
    for inv in invs:
        if inv in ONE_SIDED_INVARIANTS:
            out[inv.name] = _derived(enc, inv.formula)
    out["well_formed"] = well_formed(enc)
    for inv in invs:
        if inv not in ONE_SIDED_INVARIANTS:
            out[inv.name] = _derived(enc, inv.formula)
    return out


def _derived(enc: Encoding, formula: Term) -> InvariantFormula:
    return lambda s: translate(formula, FixedReading(enc, s))


def well_formed(enc: Encoding) -> InvariantFormula:
    """Facts about the encoding itself, which a spec state satisfies by construction: integers
    in range, phases and reasons naming real codes, ids naming real requests, epochs never ahead
    of the peer they were read from (they come from its health checks), a write in flight only
    into a page its request was granted (a write slot is indexed by page)."""
    n, pages = enc.n, range(enc.np)

    def holds(s: SymState) -> Any:
        out = [enc.in_range(s), s["next_gen"] >= 1]
        decode_epochs = [s[epoch_var("decode_epoch", j)] for j in range(enc.decode_instances)]

        def some_decode_epoch(x: Any) -> Any:
            # Read from a grant, of the request's decode instance or (room-keyed matching)
            # another's: never ahead of that instance.
            return z3.Or([x <= e for e in decode_epochs])

        for r in range(n):
            placed = enc.config.requests[r]
            out += [s[f"r{r}.p"] < len(P_PHASES), s[f"r{r}.d"] < len(D_PHASES)]
            out.append(s[f"r{r}.ans_reason"] < len(REASONS))
            # Epochs come from the peers' health checks: never ahead of the peer.
            own_decode = s[epoch_var("decode_epoch", placed.decode_instance)]
            out.append(some_decode_epoch(s[f"r{r}.p_epoch"]))
            out.append(s[f"r{r}.g_epoch"] <= own_decode)
            out.append(s[f"r{r}.d_epoch"] <= s[epoch_var("prefill_epoch", placed.prefill_instance)])
            for a in range(enc.attempts):
                # With retries, only the current attempt's writes: a retry resets prefill's
                # grant while the attempt before may still have writes in flight.
                now = s[f"r{r}.attempt"] == a if enc.retries else True
                for j in pages:
                    for k in range(enc.ranks):
                        w = s[write_var(r, j, k, a)]
                        w = z3.And(w, now) if enc.retries else w
                        out.append(z3.Implies(w, s[f"r{r}.p_pages{j}"]))
                        if enc.retries:
                            # The current attempt's writes were issued under the grant prefill
                            # holds now (`wgen` records it at issue). The spec cannot say this
                            # (a write names no attempt: it tells an earlier attempt's write by
                            # its retired generation), the encoding, which keeps a write in its
                            # attempt's slot, can; the proof checks it like any invariant.
                            out.append(
                                z3.Implies(
                                    z3.And(now, s[write_var(r, j, k, a)]),
                                    s[f"{att(r, a)}wgen"] == s[f"r{r}.p_gen"],
                                )
                            )
                        if a:
                            # A later attempt than the request's has written nothing yet (its
                            # slots are only meaningful once the retry happened).
                            out.append(
                                z3.Implies(s[f"r{r}.attempt"] < a, z3.Not(s[write_var(r, j, k, a)]))
                            )
                if a:
                    out.append(s[f"{att(r, a)}g_epoch"] <= own_decode)
                if enc.retries:
                    # The epoch a write was issued under came from a grant: never ahead.
                    out.append(some_decode_epoch(s[f"{att(r, a)}wepoch"]))
            if enc.retries:
                out.append(s[f"r{r}.attempt"] <= s["f.retries"])
        if enc.retries:
            out.append(s["f.retries"] <= enc.config.max_retries)
        for j in pages:
            out.append(z3.Implies(s[f"pg{j}.own"], s[f"pg{j}.own_req"] < n))
            for k in range(enc.ranks):
                sh = shard(j, k)
                out.append(z3.Implies(s[f"{sh}has"], s[f"{sh}c_req"] < n))
        return z3.And(out)

    return holds
