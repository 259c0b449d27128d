"""What writing the safety properties once costs: the derived formulas against the hand-written
Z3 twins.

Same run, same machine, CPU seconds (`time.process_time`, steadier than wall time on a shared
machine), best of `--repeat`:

* BMC (default depth) on the incident variant, default scenario, checking the formulas of
  `spec/properties.py` (`Encoding.properties`) and the hand-written twins
  (`Encoding.legacy_properties`): time, and each property's verdict and counterexample length;
* the explorer on the default scenario of the reference, plain and with `--invariants` (which now
  also evaluates each property's formula beside its Python function on every state).

    python benchmarks/properties_once.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from kvhandoff.model_checker.explore import build_graph
from kvhandoff.model_checker.result import CheckResult
from kvhandoff.model_checker.z3_engines import bmc
from kvhandoff.spec.config import Config
from kvhandoff.spec.properties import ALWAYS
from kvhandoff.spec.variants import REFERENCE, get_variant


def _best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        started = time.process_time()
        out = fn()
        best = min(best, time.process_time() - started)
    return best, out


def _lengths(result: CheckResult) -> list[str]:
    return [f"{r.property} {r.verdict} {r.depth}" for r in result.results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (best is kept)")
    args = parser.parse_args()
    config = Config()
    incident = get_variant("incident")

    derived, d_result = _best(lambda: bmc(incident, config), args.repeat)
    legacy, l_result = _best(lambda: bmc(incident, config, legacy_properties=True), args.repeat)
    same = _lengths(d_result) == _lengths(l_result)
    print(f"bmc, incident, default scenario (depth {d_result.extra['max_depth']}):")
    print(f"  derived properties      {derived:6.2f} s  {d_result.verdict}")
    print(f"  hand-written properties {legacy:6.2f} s  {l_result.verdict}")
    print(f"  ratio derived/hand-written {derived / legacy:6.2f}")
    print(f"  verdicts and counterexample lengths identical: {same}")
    for line in _lengths(d_result):
        print(f"    {line}")

    plain, (graph, _, _) = _best(lambda: build_graph(REFERENCE, config), args.repeat)
    checked, (g2, _, _) = _best(
        lambda: build_graph(REFERENCE, config, invariants=True), args.repeat
    )
    states = graph.states

    def formulas_alone() -> None:
        for s in states:
            for p in ALWAYS:
                p.formula_holds(config, s)

    def functions_alone() -> None:
        for s in states:
            for p in ALWAYS:
                p.holds(config, s)

    formulas, _ = _best(formulas_alone, args.repeat)
    functions, _ = _best(functions_alone, args.repeat)
    n = len(states)
    print(f"explorer, reference, default scenario: {n:,} states")
    print(f"  without --invariants        {plain:6.2f} s  {n / plain:9,.0f} states/s")
    print(f"  with --invariants           {checked:6.2f} s  {n / checked:9,.0f} states/s")
    print(f"  property formulas disagreeing with the functions: {g2.property_disagreements}")
    print(f"  the 7 property formulas alone, on the same states: {formulas:.2f} s")
    print(f"  the 7 Python functions alone, on the same states:  {functions:.2f} s")


if __name__ == "__main__":
    main()
