"""The any-size proof, hand-written model against the model derived from the rules, same run.

    PYTHONPATH=. python benchmarks/derived_any_size.py [--variant reference] [--repeat 3] [--whole]

`z3_prove.prove_any_size` (the hand-written model) and `z3_derived.prove_derived` (the spec's
guard and effect formulas read over uninterpreted sorts) discharge their obligations on the same
design, alternating, `--repeat` times; each line gives the best (least) wall time of each side,
the ratio derived/hand-written, how many obligations each discharged and its verdict. Building
the model is included (the derived one translates the formulas on every run). With `--whole`,
each side is the whole `prove` engine (`prove(..., model="hand"|"derived")`: obligations, the
witness check on that model and the verdicts), its caches emptied before every run. Output for
the record: benchmarks/results/derived_any_size.txt.
"""

from __future__ import annotations

import argparse
import os
import platform
import time


def main() -> None:
    from kvhandoff.model_checker import z3_derived, z3_prove
    from kvhandoff.model_checker.prove import prove
    from kvhandoff.spec.config import Config
    from kvhandoff.spec.variants import get_variant

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--whole", action="store_true", help="time the whole prove engine")
    args = parser.parse_args()
    names = args.variant or ["reference", "incident"]
    print(f"# {platform.python_version()}, {os.cpu_count()} CPUs, best of {args.repeat}")
    print(f"{'variant':12s} {'hand-written':>14s} {'derived':>14s} {'ratio':>6s}  verdicts")
    for name in names:
        variant = get_variant(name)
        design = variant.design
        best = {"hand": float("inf"), "derived": float("inf")}
        verdict = {}
        count = {}
        for _ in range(args.repeat):
            for side in ("hand", "derived"):
                if args.whole:
                    _empty_caches()
                    started = time.perf_counter()
                    result = prove(variant, variant.scenario(Config()), timeout=60, model=side)
                    best[side] = min(best[side], time.perf_counter() - started)
                    verdict[side] = f"{result.verdict} ({result.extra['scope']})"
                    count[side] = result.extra["obligations_total"]
                    continue
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


def _empty_caches() -> None:
    """Each run of `prove` starts as a fresh process would: no witness check or spec search
    remembered from the one before."""
    from kvhandoff.model_checker import z3_engines, z3_witnesses

    for cache in (
        z3_witnesses._ANY_SIZE_CACHE,
        z3_witnesses._DERIVED_CACHE,
        z3_witnesses._SPEC_CACHE,
        z3_witnesses._FIXED_CACHE,
    ):
        cache.clear()
    z3_engines._BMC_CACHE.clear()


if __name__ == "__main__":
    main()
