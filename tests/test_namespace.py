"""The one `kvhandoff` namespace: every import goes through it, each source file is one module,
and impl/ stays independent of spec/.

The source folders (spec/, impl/, ...) are reachable from the repository root under their bare
names too; importing one that way would load its files a second time as other modules. So the
tree is checked statically (tools/namespace_imports.py --check) and at run time (no bare name in
sys.modules after importing everything).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sequential import SEQUENTIAL

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "namespace_imports.py"
FOLDERS = ("spec", "model_checker", "impl", "conformance", "kvhandoff_cli")


def _run(*args: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout
    )


def test_the_tree_imports_its_packages_only_through_the_namespace() -> None:
    out = _run(str(TOOL), "--check")
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_namespace_links_every_source_folder() -> None:
    names = {"spec": "spec", "model_checker": "model_checker", "impl": "impl"}
    names |= {"conformance": "conformance", "cli": "kvhandoff_cli"}
    for name, folder in names.items():
        link = ROOT / "kvhandoff" / name
        assert link.is_symlink() and link.resolve() == ROOT / folder, link


def _tree(root: Path) -> None:
    (root / "spec").mkdir()
    (root / "spec" / "__init__.py").write_text("")
    (root / "spec" / "actions.py").write_text("X = 1\n")
    (root / "kvhandoff_cli").mkdir()
    (root / "kvhandoff_cli" / "__init__.py").write_text("")
    (root / "kvhandoff_cli" / "main.py").write_text("")
    (root / "user.py").write_text(
        '"""Run it: python -m kvhandoff_cli.main, or python -m spec.actions."""\n'
        "from spec.actions import X\n"
        "import spec.actions as A\n"
        "import spec\n"
        "import kvhandoff_cli\n"
        "from kvhandoff.spec import actions\n"
        "def f():\n"
        "    from kvhandoff_cli.main import main  # a lazy import\n"
        'MODULES = ["kvhandoff_cli.main", "spec.actions.X", "spec.nothing", "spec", "conformance"]\n'
        'CMD = ["python", "-m", "kvhandoff_cli", "--version"]\n'
        "FOLDER = 'kvhandoff_cli'\n"
        'CODE = "from spec.variants import REFERENCE\\nimport spec.actions as A\\n"\n'
        'RUN = f"import sys; from kvhandoff_cli.main import main; {CMD}"\n'
        'PROSE = "the incident, from spec to proof; import it"\n'
    )
    (root / "guide.md").write_text(
        "```python\nfrom spec.actions import X\n```\n\n`python -m kvhandoff_cli check` or "
        "`pytest -m slow`; the spec.md page.\n"
    )


EXPECTED_USER = (
    '"""Run it: python -m kvhandoff.cli.main, or python -m kvhandoff.spec.actions."""\n'
    "from kvhandoff.spec.actions import X\n"
    "import kvhandoff.spec.actions as A\n"
    "from kvhandoff import spec\n"
    "from kvhandoff import cli as kvhandoff_cli\n"
    "from kvhandoff.spec import actions\n"
    "def f():\n"
    "    from kvhandoff.cli.main import main  # a lazy import\n"
    'MODULES = ["kvhandoff.cli.main", "kvhandoff.spec.actions.X", "spec.nothing", "spec", '
    '"conformance"]\n'
    'CMD = ["python", "-m", "kvhandoff", "--version"]\n'
    "FOLDER = 'kvhandoff_cli'\n"
    'CODE = "from kvhandoff.spec.variants import REFERENCE\\nimport kvhandoff.spec.actions as A\\n"\n'
    'RUN = f"import sys; from kvhandoff.cli.main import main; {CMD}"\n'
    'PROSE = "the incident, from spec to proof; import it"\n'
)


def test_the_rewrite_fixes_each_kind_of_reference_once(tmp_path: Path) -> None:
    _tree(tmp_path)
    check = _run(str(TOOL), "--check", "--root", str(tmp_path))
    assert check.returncode == 1
    assert "not rewritten: user.py" in check.stdout and "not rewritten: guide.md" in check.stdout
    first = _run(str(TOOL), "--root", str(tmp_path), "--no-ruff")
    assert first.returncode == 0, first.stdout + first.stderr
    assert (tmp_path / "user.py").read_text() == EXPECTED_USER
    assert (tmp_path / "guide.md").read_text() == (
        "```python\nfrom kvhandoff.spec.actions import X\n```\n\n`python -m kvhandoff check` or "
        "`pytest -m slow`; the spec.md page.\n"
    )
    again = _run(str(TOOL), "--root", str(tmp_path), "--no-ruff")
    assert again.stdout == "" and again.returncode == 0
    assert _run(str(TOOL), "--check", "--root", str(tmp_path)).returncode == 0


def test_an_import_with_no_one_line_equivalent_is_reported_for_a_hand_edit(
    tmp_path: Path,
) -> None:
    _tree(tmp_path)
    (tmp_path / "user.py").write_text(
        "import spec.actions\nimport os, spec\nCODE = 'import sys, impl; print(impl)'\n"
    )
    out = _run(str(TOOL), "--check", "--root", str(tmp_path))
    assert out.returncode == 1
    assert "user.py:1: `import spec.actions` binds a bare package name" in out.stdout
    assert "user.py:2: split `import os, spec` into one import a line" in out.stdout
    assert "user.py:3: `import sys, impl` inside a string; rewrite by hand" in out.stdout


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "kvhandoff":
                found |= {f"kvhandoff.{a.name}" for a in node.names}
    return found


def test_impl_never_imports_spec() -> None:
    """impl/ is an independent implementation: conformance means something only because it was
    written without the spec (DESIGN.md §2, rule 3). Statically, under either name..."""
    for path in sorted((ROOT / "impl").rglob("*.py")):
        bad = {m for m in _imports(path) if m.split(".")[0] == "spec"}
        bad |= {m for m in _imports(path) if m.split(".")[:2] == ["kvhandoff", "spec"]}
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


IMPORT_ALL = """
import importlib, pkgutil, sys
import kvhandoff.{pkg} as pkg
skip = ("__main__",)
for m in pkgutil.walk_packages(pkg.__path__, "kvhandoff.{pkg}."):
    if not m.name.endswith(skip):
        importlib.import_module(m.name)
bare = {folders!r}
print(sorted(n for n in sys.modules if n.split(".")[0] in bare or n.startswith("kvhandoff.spec")))
print(len([n for n in sys.modules if n.startswith("kvhandoff.")]))
"""


@pytest.mark.parametrize("pkg", ["impl", "cli"])
def test_importing_every_module_loads_each_file_once_and_impl_loads_no_spec(
    pkg: str, tmp_path: Path
) -> None:
    """...and at run time, from a folder that is not the repository (only the installed
    namespace is importable there): no module under a bare folder name, and importing all of
    impl loads no spec module. `cli` imports everything else too."""
    out = _run("-c", IMPORT_ALL.format(pkg=pkg, folders=FOLDERS), cwd=tmp_path, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded, count = out.stdout.splitlines()
    if pkg == "impl":
        assert loaded == "[]", loaded
    else:
        assert not [n for n in ast.literal_eval(loaded) if n.split(".")[0] in FOLDERS], loaded
        assert "kvhandoff.spec" in loaded  # the check is not vacuous: spec is reachable
    assert int(count) > 20


def test_python_dash_m_kvhandoff_runs_beside_a_users_own_spec_package(tmp_path: Path) -> None:
    # An engine repository with its own spec/ and impl/ packages: they must not shadow ours.
    for name in ("spec", "impl"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise ImportError('the user package')\n")
    out = _run("-m", "kvhandoff", "--version", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("kvhandoff ")
    usage = _run("-m", "kvhandoff", "check", *SEQUENTIAL, "--variant", "nope", cwd=tmp_path)
    assert usage.returncode == 2
    assert usage.stderr.startswith("kvhandoff check: error: unknown variant 'nope'")
