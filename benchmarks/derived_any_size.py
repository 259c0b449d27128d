"""The any-size proof, hand-written model against the model derived from the rules, same run.

    PYTHONPATH=. python benchmarks/derived_any_size.py [--variant reference] [--repeat 3]

`z3_prove.prove_any_size` (the hand-written model) and `z3_derived.prove_derived` (the spec's
guard and effect formulas read over uninterpreted sorts) discharge their obligations on the same
design, alternating, `--repeat` times; each line gives the best (least) wall time of each side,
the ratio derived/hand-written, how many obligations each discharged and its verdict. Building
the model is included (the derived one translates the formulas on every run). Output for the
record: benchmarks/results/derived_any_size.txt.
"""

from __future__ import annotations

import argparse
import os
import platform
import time


def main() -> None:
    from kvhandoff.model_checker import z3_derived, z3_prove
    from kvhandoff.spec.variants import get_variant

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    names = args.variant or ["reference", "incident"]
    print(f"# {platform.python_version()}, {os.cpu_count()} CPUs, best of {args.repeat}")
    print(f"{'variant':12s} {'hand-written':>14s} {'derived':>14s} {'ratio':>6s}  verdicts")
    for name in names:
        design = get_variant(name).design
        best = {"hand": float("inf"), "derived": float("inf")}
        verdict = {}
        count = {}
        for _ in range(args.repeat):
            for side in ("hand", "derived"):
                started = time.perf_counter()
                if side == "hand":
                    obligations = z3_prove.prove_any_size(design, timeout=60)
                else:
                    obligations = z3_derived.prove_derived(design, timeout=60)
                best[side] = min(best[side], time.perf_counter() - started)
                verdicts = {o.verdict for o in obligations}
                verdict[side] = "SAFE" if verdicts == {"proved"} else "/".join(sorted(verdicts))
                count[side] = len(obligations)
        ratio = best["derived"] / best["hand"]
        print(
            f"{name:12s} {best['hand']:6.2f} s ({count['hand']:3d}) "
            f"{best['derived']:6.2f} s ({count['derived']:3d}) {ratio:5.2f}x  "
            f"hand {verdict['hand']}, derived {verdict['derived']}"
        )


if __name__ == "__main__":
    main()
