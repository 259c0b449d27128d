import subprocess
import sys


def test_importing_spec_loads_no_io_or_solver_library() -> None:
    code = (
        "import sys, importlib, pkgutil\n"
        "import kvhandoff.spec as spec\n"
        "for m in pkgutil.iter_modules(spec.__path__):\n"
        "    importlib.import_module('kvhandoff.spec.' + m.name)\n"
        "banned = ['torch', 'grpc', 'z3', 'hypothesis', 'networkx']\n"
        "print(','.join(m for m in banned if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_spec_source_has_no_clock_randomness_or_io() -> None:
    from pathlib import Path

    from kvhandoff import spec

    root = Path(spec.__file__).parent
    forbidden = ("import random", "import time", "import logging", "open(", "print(", "datetime")
    for path in root.glob("*.py"):
        text = path.read_text()
        for word in forbidden:
            assert word not in text, f"{path.name} uses {word!r}"
