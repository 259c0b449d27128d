"""`kvhandoff examples`: the variant files of examples/, for those who installed the wheel.

The guides run `kvhandoff check --variant examples/variant_skip_digest.py` from a source checkout.
The wheel ships the same files inside the package (kvhandoff/examples, a link to examples/ in the
source tree); this command lists them and copies them out, so that the guides' commands work
unchanged from the folder they were copied into, and a reviewer can edit one as a starting point.
"""

from __future__ import annotations

import argparse
import ast
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from kvhandoff.cli.main import EXIT_OK, UsageError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "examples",
        help="list the example variant files, or copy them out (--copy DIR)",
        description=(
            "List the example protocol changes shipped with kvhandoff (variant files for "
            "`kvhandoff check --variant FILE`), with where they are installed. --copy DIR "
            "writes them into DIR/examples, so the guides' commands "
            "(`kvhandoff check --variant examples/variant_skip_digest.py`) run from DIR. "
            "Exit 2 if a file to write exists already."
        ),
    )
    p.add_argument(
        "--copy",
        metavar="DIR",
        type=Path,
        help="write the files into DIR/examples (DIR is created if needed)",
    )
    p.set_defaults(func=run_examples)


def example_folder() -> Traversable:
    return resources.files("kvhandoff") / "examples"


def example_files() -> list[Traversable]:
    folder = example_folder()
    files = sorted(
        (f for f in folder.iterdir() if f.name.endswith(".py") and not f.name.startswith("_")),
        key=lambda f: f.name,
    )
    if not files:
        raise UsageError(f"no example files in {folder} (a broken install?)")
    return files


def summary(source: str) -> str:
    """The first line of the file's docstring: what the change is."""
    doc = ast.get_docstring(ast.parse(source)) or ""
    return doc.split("\n", 1)[0]


def run_examples(args: argparse.Namespace) -> int:
    files = example_files()
    if args.copy is None:
        print(f"example variant files (in {example_folder()}; --copy DIR to edit them):")
        for f in files:
            print(f"  {f.name:30} {summary(f.read_text())}")
        return EXIT_OK
    dest = args.copy / "examples"
    clashes = [str(dest / f.name) for f in files if (dest / f.name).exists()]
    if clashes:
        raise UsageError(f"--copy {args.copy}: not overwriting {', '.join(clashes)}")
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        (dest / f.name).write_text(f.read_text())
        print(f"wrote {dest / f.name}")
    first = next((f.name for f in files if f.name == "variant_skip_digest.py"), files[0].name)
    print(f"run one: cd {args.copy} && kvhandoff check --variant examples/{first}")
    return EXIT_OK
