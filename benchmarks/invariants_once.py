"""What writing the invariants once costs: the derived formulas against the hand-written copies.

Same run, same machine, CPU seconds (`time.process_time`, steadier than wall time on a shared
machine), best of `--repeat`:

* the explorer on the default scenario without invariants, and with `--invariants` (every
  reachable state evaluated by the compiled formulas), and the old Python functions evaluated on
  the same states, for scale;
* `prove` any-size on the reference with the derived invariants and with the hand-written ones
  (`z3_prove.legacy_invariants`);
* `kind` on the reference with the derived fixed-configuration invariants and with the
  hand-written twins (`z3_invariants.legacy_fixed_invariants`).

    python benchmarks/invariants_once.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from kvhandoff.model_checker import z3_prove
from kvhandoff.model_checker.explore import build_graph
from kvhandoff.model_checker.z3_encoding import Encoding
from kvhandoff.model_checker.z3_engines import kinduction
from kvhandoff.model_checker.z3_invariants import legacy_fixed_invariants
from kvhandoff.spec import invariants_py
from kvhandoff.spec.config import Config
from kvhandoff.spec.variants import REFERENCE


def _best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        started = time.process_time()
        out = fn()
        best = min(best, time.process_time() - started)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (best is kept)")
    args = parser.parse_args()
    config = Config()

    plain, (graph, _, _) = _best(lambda: build_graph(REFERENCE, config), args.repeat)
    checked, _ = _best(lambda: build_graph(REFERENCE, config, invariants=True), args.repeat)
    states = graph.states

    def old_python() -> None:
        for s in states:
            for inv in invariants_py.INVARIANTS:
                inv.holds(config, s)

    old, _ = _best(old_python, args.repeat)
    n = len(states)
    print(f"explorer, default scenario: {n:,} states")
    print(f"  without invariants          {plain:6.2f} s  {n / plain:9,.0f} states/s")
    print(f"  with --invariants (derived) {checked:6.2f} s  {n / checked:9,.0f} states/s")
    print(f"  ratio with/without          {checked / plain:6.2f}")
    print(f"  old Python functions alone, on the same states: {old:.2f} s")

    def prove_with(legacy: bool) -> list[Any]:
        weaken = z3_prove.legacy_invariants if legacy else None
        if weaken is None:
            return z3_prove.prove_any_size(REFERENCE.design)
        names = z3_prove.legacy_invariants(z3_prove.state())

        def pick(name: str) -> Callable[[Any], Any]:
            return lambda s: z3_prove.legacy_invariants(s)[name]

        return z3_prove.prove_any_size(REFERENCE.design, weaken={n: pick(n) for n in names})

    derived_p, obligations = _best(lambda: prove_with(False), args.repeat)
    legacy_p, legacy_obligations = _best(lambda: prove_with(True), args.repeat)
    proved = sum(o.verdict == "proved" for o in obligations)
    legacy_proved = sum(o.verdict == "proved" for o in legacy_obligations)
    print("prove any-size, reference:")
    print(f"  derived invariants      {derived_p:6.2f} s  {proved}/{len(obligations)} proved")
    print(
        f"  hand-written invariants {legacy_p:6.2f} s  {legacy_proved}/{len(legacy_obligations)} "
        "proved"
    )
    print(f"  ratio derived/hand-written {derived_p / legacy_p:6.2f}")

    enc = Encoding(REFERENCE, config, width=None)
    legacy_fixed = legacy_fixed_invariants(enc)
    derived_k, result = _best(lambda: kinduction(REFERENCE, config, depth=1), args.repeat)
    legacy_k, legacy_result = _best(
        lambda: kinduction(REFERENCE, config, depth=1, invariants=legacy_fixed), args.repeat
    )
    print("kind (k=1), reference, default scenario:")
    print(f"  derived invariants      {derived_k:6.2f} s  {result.verdict}")
    print(f"  hand-written invariants {legacy_k:6.2f} s  {legacy_result.verdict}")
    print(f"  ratio derived/hand-written {derived_k / legacy_k:6.2f}")


if __name__ == "__main__":
    main()
