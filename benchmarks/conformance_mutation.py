"""The conformance suite's mutation score: how many realistic implementation bugs it kills.

    python benchmarks/conformance_mutation.py [--target inproc|grpc|harness|both|all]
                                             [--only NAME,...]
                                             [--jobs N] [--timeout S] [--json] [-- CONFORM ARGS]

For every mutant of `benchmarks/mutants/catalogue.py` (a single bug in `impl/`), the repository's
packages are copied to a temporary folder, the mutant is applied to the copy (never to the tree
itself), and the default `kvhandoff conform --json` runs against it in a subprocess whose
PYTHONPATH points at the copy, once per target. A mutant is *killed* by a target when the
campaign diverges (exit 1). The `harness` target is the in-process implementation behind the
reference harness server (`kvhandoff harness-serve --backend inproc`, started in the same
subprocess, on loopback), driven through `--target HOST:PORT` as an engine team's would be: what
the suite catches through the service. A mutant is killed when the campaign diverges (exit 1); exit 3 (the target failed: a crash of the mutated implementation) is
counted as killed too and shown as `crash`; exit 0 is *survived*; a timeout is shown as
`timeout` and counts as survived (the default campaign must catch the bug in its default run
time). Anything after `--` is passed to `conform` (say `-- --traces 1000` for a deeper campaign).

Printed: the kill table (mutant, where the bug lives, verdict per target, traces run until the
kill, seconds), then the kill rate per target (over all mutants, and over the mutants the target
runs the code of, less the mutants argued equivalent: the in-process target does not run the
gRPC servers' `edge` code) and the total time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Appended: run as a script this folder is already first; imported (by a test) it must not put
# benchmarks/conformance.py ahead of the `conformance` package.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))

from mutants.catalogue import MUTANTS, Mutant  # noqa: E402

PACKAGES = ("impl", "spec", "conformance", "kvhandoff_cli", "model_checker")
TREE = ROOT  # the tree whose copy is mutated (--tree: another checkout, e.g. a baseline)


@dataclass
class Outcome:
    mutant: str
    target: str
    verdict: str  # killed | crash | survived | timeout | error
    traces: int | None
    seconds: float
    detail: str

    @property
    def killed(self) -> bool:
        return self.verdict in ("killed", "crash")


def copy_tree(dest: Path, tree: Path | None = None) -> None:
    for pkg in PACKAGES:
        shutil.copytree(
            (tree or TREE) / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    # The namespace package is links to the folders above: copied as links, they reach the copies
    # (a mutant applied to dest/impl is what kvhandoff.impl runs).
    if ((tree or TREE) / "kvhandoff").is_dir():
        shutil.copytree(
            (tree or TREE) / "kvhandoff",
            dest / "kvhandoff",
            symlinks=True,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )


def run_one(mutant: Mutant | None, target: str, timeout: float, extra: list[str]) -> Outcome:
    name = mutant.name if mutant is not None else "(none)"
    with tempfile.TemporaryDirectory(prefix="kvhandoff-mutant-") as tmp:
        root = Path(tmp)
        copy_tree(root)
        if mutant is not None:
            mutant.apply_to(root)
        env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
        # Fail loudly if the copy is not what runs (an installed tree would shadow it).
        check = (
            "import sys; import kvhandoff.impl as impl; "
            f"assert impl.__file__.startswith({str(root)!r}), impl.__file__; "
            "from kvhandoff.cli.main import main; "
        )
        if target == "harness":
            # The mutated implementation serves the harness service from this very process;
            # the suite reaches it over loopback gRPC only.
            program = (
                check + "from kvhandoff.conformance.harness_server import serve; "
                "server = serve('127.0.0.1:0', 'inproc'); "
                "sys.argv[sys.argv.index('HARNESS')] = server.address; "
                "code = main(sys.argv[1:]); server.stop(); sys.exit(code)"
            )
        else:
            program = check + "sys.exit(main())"
        cmd = [
            sys.executable,
            "-c",
            program,
            "conform",
            "--json",
            "--target",
            "HARNESS" if target == "harness" else target,
            "--out",
            str(root / "report"),
            *(mutant.conform_args if mutant is not None else ()),
            *extra,
        ]
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return Outcome(name, target, "timeout", None, time.perf_counter() - start, "")
        seconds = time.perf_counter() - start
    report: dict[str, Any] = {}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                report = json.loads(line)
            except json.JSONDecodeError:
                continue
            break
    # The program that first diverged (before Hypothesis shrank it), else the traces run.
    traces = report.get("traces_to_failure", report.get("traces"))
    failures = report.get("failures") or []
    detail = ""
    if failures:
        f = failures[0]
        detail = f"{f.get('kind', '')}: {f.get('property', '')}: {f.get('message', '')}"
    if proc.returncode == 1:
        verdict = "killed"
    elif proc.returncode == 0:
        verdict = "survived"
    elif proc.returncode == 3:
        verdict = "crash"
        detail = detail or (proc.stderr.strip().splitlines() or [""])[-1]
    else:
        verdict = "error"
        detail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    return Outcome(name, target, verdict, traces, seconds, detail[:300])


def main(argv: list[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args_in:
        cut = args_in.index("--")
        args_in, extra = args_in[:cut], args_in[cut + 1 :]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--target",
        default="both",
        choices=("inproc", "grpc", "harness", "both", "all"),
        help="inproc, grpc, harness (the in-process implementation behind the harness service), "
        "both (inproc and grpc: the default) or all three",
    )
    p.add_argument("--only", help="comma-separated mutant names (default: all)")
    p.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds per conform run (default 300)"
    )
    p.add_argument(
        "--tree",
        type=Path,
        help="the checkout to copy and mutate (default: this one), e.g. a worktree of main "
        "for a baseline",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--list", action="store_true", help="list the catalogue and exit")
    args = p.parse_args(args_in)

    global TREE
    if args.tree is not None:
        TREE = args.tree.resolve()
    mutants = list(MUTANTS)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        names = {m.name for m in mutants}
        unknown = [n for n in wanted if n not in names]
        if unknown:
            p.error(f"unknown mutants {unknown}; see --list")
        mutants = [m for m in mutants if m.name in wanted]
    if args.list:
        for m in MUTANTS:
            eq = " [argued equivalent]" if m.equivalent else ""
            print(f"{m.name:48} {m.where:5} {m.bug}{eq}")
        return 0
    targets = {"both": ["inproc", "grpc"], "all": ["inproc", "grpc", "harness"]}.get(
        args.target, [args.target]
    )

    start = time.perf_counter()
    # The unmutated tree first: a campaign that fails on it would make every kill meaningless.
    for t in targets:
        base = run_one(None, t, args.timeout, extra)
        if base.verdict != "survived":
            print(f"the unmutated tree does not conform on {t}: {base}", file=sys.stderr)
            return 2
    jobs = [(m, t) for m in mutants for t in targets]
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = list(pool.map(lambda mt: run_one(mt[0], mt[1], args.timeout, extra), jobs))
    total = time.perf_counter() - start

    by: dict[tuple[str, str], Outcome] = {(o.mutant, o.target): o for o in outcomes}
    summary: dict[str, Any] = {}
    for t in targets:
        runs = [by[(m.name, t)] for m in mutants]
        # The score proper: mutants the target runs the code of, less those argued equivalent.
        reach = [
            by[(m.name, t)]
            for m in mutants
            # Only the gRPC target runs the servers' edge code.
            if (t == "grpc" or m.where != "edge") and not m.equivalent
        ]
        summary[t] = {
            "killed": sum(o.killed for o in runs),
            "mutants": len(runs),
            "rate": round(sum(o.killed for o in runs) / len(runs), 3) if runs else 0.0,
            "killed_of_reachable": sum(o.killed for o in reach),
            "reachable": len(reach),
            "seconds": round(sum(o.seconds for o in runs), 1),
        }
    if args.json:
        print(
            json.dumps(
                {
                    "conform_args": extra,
                    "outcomes": [asdict(o) | {"seconds": round(o.seconds, 2)} for o in outcomes],
                    "equivalent": {m.name: m.equivalent for m in mutants if m.equivalent},
                    "summary": summary,
                    "seconds": round(total, 1),
                },
                sort_keys=True,
            )
        )
        return 0
    head = f"{'mutant':48} {'where':5}"
    for t in targets:
        head += f" {t + ' (traces, s)':>26}"
    print(head)
    for m in mutants:
        row = f"{m.name:48} {m.where:5}"
        for t in targets:
            o = by[(m.name, t)]
            tr = "-" if o.traces is None or not o.killed else str(o.traces)
            row += f" {o.verdict:>10} {tr:>6} {o.seconds:7.1f}s"
        if m.equivalent:
            row += "  (argued equivalent)"
        print(row)
    print()
    for t in targets:
        s = summary[t]
        print(
            f"{t}: killed {s['killed']}/{s['mutants']} ({100 * s['rate']:.0f} %); "
            f"{s['killed_of_reachable']}/{s['reachable']} "
            f"({100 * s['killed_of_reachable'] / max(1, s['reachable']):.0f} %) of the mutants "
            "whose code it runs, less those argued equivalent; "
            f"{s['seconds']} s of conform runs"
        )
    print(f"total {total:.1f} s (conform args: {' '.join(extra) or 'defaults'})")
    for m in mutants:
        if m.conform_args:
            print(f"  {m.name}: run with {' '.join(m.conform_args)} first")
    return 0


if __name__ == "__main__":
    sys.exit(main())
