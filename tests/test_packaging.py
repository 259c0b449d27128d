"""Packaging: the declared dependency floors match what the committed generated code demands, and
the built wheel works with the lowest grpcio and protobuf that pyproject.toml allows.

The generated modules check their runtime themselves (protobuf's `ValidateProtobufRuntimeVersion`,
grpc's `GRPC_GENERATED_VERSION`), so a floor below theirs lets pip resolve an environment where
every server dies at import with a VersionError. The fast tests read the floors back from the
files; the slow one builds the wheel and runs a real demo stage against the floors themselves.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.sequential import SEQUENTIAL

ROOT = Path(__file__).resolve().parent.parent
GEN_DIRS = (ROOT / "impl" / "proto" / "gen", ROOT / "conformance" / "proto" / "gen")


def _floors() -> dict[str, tuple[int, ...]]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out: dict[str, tuple[int, ...]] = {}
    for dep in deps:
        m = re.match(r"^([A-Za-z0-9_.-]+)>=([0-9.]+)", dep)
        if m:
            out[m.group(1).lower()] = tuple(int(x) for x in m.group(2).split("."))
    return out


def _generated_versions() -> tuple[set[tuple[int, ...]], set[tuple[int, ...]]]:
    protobuf: set[tuple[int, ...]] = set()
    grpc: set[tuple[int, ...]] = set()
    for gen in GEN_DIRS:
        for f in gen.rglob("*_pb2.py"):
            m = re.search(
                r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*"
                r"(\d+),\s*(\d+),\s*(\d+),",
                f.read_text(),
            )
            assert m, f"{f}: no protobuf runtime version check found"
            protobuf.add(tuple(int(x) for x in m.groups()))
        for f in gen.rglob("*_pb2_grpc.py"):
            m = re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", f.read_text())
            assert m, f"{f}: no GRPC_GENERATED_VERSION found"
            grpc.add(tuple(int(x) for x in m.group(1).split(".")))
    return protobuf, grpc


def test_dependency_floors_cover_the_generated_code() -> None:
    floors = _floors()
    protobuf, grpc = _generated_versions()
    assert protobuf and grpc
    assert floors["protobuf"] >= max(protobuf), (
        f"protobuf floor {floors['protobuf']} is below the generated code's {max(protobuf)}"
    )
    assert floors["grpcio"] >= max(grpc), (
        f"grpcio floor {floors['grpcio']} is below the generated code's {max(grpc)}"
    )
    # Only `make proto` needs the code generator; a runtime install must not pull it.
    assert "grpcio-tools" not in floors


def test_the_code_generator_is_pinned_to_the_release_that_wrote_the_committed_code() -> None:
    # A newer grpcio-tools on a fresh machine writes another GRPC_GENERATED_VERSION, and the
    # generated-code checks then fail there although nothing changed.
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    _, grpc = _generated_versions()
    (written,) = grpc
    wanted = "grpcio-tools==" + ".".join(map(str, written))
    for extra in ("proto", "dev"):
        pins = [d for d in extras[extra] if d.startswith("grpcio-tools")]
        assert pins == [wanted], (extra, pins)


def test_version_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvhandoff", "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert out.stdout.strip() == f"kvhandoff {version}"


def test_torch_import_is_quiet() -> None:
    # torch prints "Failed to initialize NumPy" on every server start when numpy is missing.
    out = subprocess.run(
        [sys.executable, "-W", "default", "-c", "import torch; torch.zeros(1).numpy()"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "NumPy" not in out.stderr, out.stderr


@pytest.mark.slow
def test_wheel_runs_with_the_lowest_allowed_grpcio_and_protobuf(tmp_path: Path) -> None:
    """Build the wheel, install it next to grpcio/protobuf at their floors, run the replay stage
    (real gRPC servers) with `python -m kvhandoff` from a folder outside the source tree that has
    its own `spec` and `impl` packages.

    torch, z3 and the other heavy dependencies come from this venv through a path file, so the
    test downloads only the few megabytes of grpcio and protobuf, not torch.
    """
    floors = _floors()
    pins = {
        name: ".".join(str(x) for x in floors[name])
        for name in ("grpcio", "grpcio-health-checking", "protobuf")
    }
    # setuptools builds in the tree's build/ and packs everything under build/lib: a leftover
    # from the layout before the namespace (top-level spec/, impl/) would go into the wheel.
    shutil.rmtree(ROOT / "build" / "lib", ignore_errors=True)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        check=True,
        timeout=600,
    )
    (wheel,) = wheels.glob("kvhandoff-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # One top-level package, nothing generic (`spec`, `impl`) that a user's tree would clash with.
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    tops = {name.split("/")[0] for name in names}
    assert tops == {"kvhandoff", wheel.name.split("-py")[0] + ".dist-info"}, tops
    assert "kvhandoff/examples/variant_skip_digest.py" in names
    # Plain path lines (not site.addsitedir) so this venv's editable-install hook is not loaded:
    # `kvhandoff` must come from the wheel.
    (Path(site) / "zz_host_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)]
        + [f"{n}=={v}" for n, v in pins.items()],
        check=True,
        timeout=600,
    )
    # An engine repository with packages of its own named like our source folders: the wheel's
    # modules must not be shadowed by them.
    work = tmp_path / "elsewhere"
    for name in ("spec", "impl", "conformance"):
        (work / name).mkdir(parents=True)
        (work / name / "__init__.py").write_text("raise ImportError('the user package')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    probe = subprocess.run(
        [
            str(py),
            "-c",
            "import importlib.metadata as m, kvhandoff.cli, kvhandoff.impl;"
            "print(m.version('grpcio'), m.version('protobuf'));"
            "print(kvhandoff.cli.__file__); print(kvhandoff.impl.__file__)",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    assert probe[0] == f"{pins['grpcio']} {pins['protobuf']}"
    assert probe[1].startswith(site) and probe[2].startswith(site), probe
    version = subprocess.run(
        [str(venv / "bin" / "kvhandoff"), "--version"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout.startswith("kvhandoff ")
    dash_m = subprocess.run(
        [str(py), "-m", "kvhandoff", "--version"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert dash_m.stdout == version.stdout
    demo = subprocess.run(
        [str(py), "-m", "kvhandoff", "demo", "--stages", "replay", "--out", "report"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "VersionError" not in demo.stderr
    assert (work / "report" / "report.md").is_file()
    # A pip user runs the guides' example commands after copying the examples out.
    copied = subprocess.run(
        [str(py), "-m", "kvhandoff", "examples", "--copy", "."],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert copied.returncode == 0, copied.stderr
    check = subprocess.run(
        [
            str(py),
            "-m",
            "kvhandoff",
            "check",
            *SEQUENTIAL,
            "--variant",
            "examples/variant_skip_digest.py",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode == 1, check.stdout[-2000:] + check.stderr[-2000:]
    assert "decode_reads_only_validated_pages" in check.stdout
