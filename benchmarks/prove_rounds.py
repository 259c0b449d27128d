"""The fixed-configuration `prove`'s Houdini rounds: carried over by unsat core, or asked afresh.

    PYTHONPATH=. python benchmarks/prove_rounds.py [--variants m7_release_before_drain,...]
        [--scenario sequential] [--timeout 60]

For each variant (one whose proof fails some claims, so that there are rounds after the first),
the same proof runs twice in this process, in alternating order: with `_FixedRounds` (each round
given the one before, re-asking only the obligations whose unsat core names a dropped claim) and
with every round asked afresh (`prove_fixed` without `earlier`, as before 2026-12-04). It prints
both times, their ratio, the rounds, and how many obligations the later rounds carried over; the
two must keep the same claims after the same number of rounds, or it says so and exits 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial

from kvhandoff.model_checker.prove import _FixedRounds, _inductive_subset, prove_fixed
from kvhandoff.model_checker.z3_derived import Obligation
from kvhandoff.spec import Config, Variant, get_variant
from kvhandoff.spec.config import scenario_config

DEFAULT_VARIANTS = "m7_release_before_drain,m8_release_on_timeout"


def _afresh(
    variant: Variant, config: Config, timeout: float, only: set[str] | None
) -> list[Obligation]:
    return prove_fixed(variant, config, timeout=timeout, only=only)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--scenario", default="sequential")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per solver call")
    args = ap.parse_args()
    ok = True
    print(
        f"{'variant':28s} {'afresh s':>9s} {'carried s':>9s} {'ratio':>6s}  rounds  carried/asked"
    )
    for index, name in enumerate(args.variants.split(",")):
        variant = get_variant(name)
        config = variant.scenario(scenario_config(args.scenario))
        timings: dict[str, float] = {}
        outcome: dict[str, tuple[frozenset[str], int]] = {}
        carried = asked = 0
        # Alternate which goes first, so that neither always meets a warm (or loaded) machine.
        for mode in ("afresh", "carried") if index % 2 == 0 else ("carried", "afresh"):
            started = time.perf_counter()
            if mode == "carried":
                rounds = _FixedRounds(variant, config, args.timeout)
                kept, n, _ = _inductive_subset(rounds, rounds(None))
                last = rounds.last or []
                carried = sum(o.reused for o in last)
                asked = len(last) - carried
            else:
                afresh = partial(_afresh, variant, config, args.timeout)
                kept, n, _ = _inductive_subset(afresh, afresh(None))
            timings[mode] = time.perf_counter() - started
            outcome[mode] = (frozenset(kept), n)
        same = outcome["afresh"] == outcome["carried"]
        ok = ok and same
        ratio = timings["afresh"] / timings["carried"]
        print(
            f"{name:28s} {timings['afresh']:9.1f} {timings['carried']:9.1f} {ratio:6.2f}  "
            f"{outcome['carried'][1]:6d}  {carried}/{asked} (last round)"
            + ("" if same else "  DIFFERENT CLAIMS KEPT")
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
