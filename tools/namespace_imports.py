"""Rewrite imports of the source folders to the installed `kvhandoff` namespace.

    python tools/namespace_imports.py            # rewrite the tree in place, then ruff-fix it
    python tools/namespace_imports.py --check    # list what is not rewritten yet; exit 1 if any

The repository keeps one folder per part (spec/, model_checker/, impl/, conformance/,
kvhandoff_cli/); the distribution installs them as kvhandoff.spec, ..., kvhandoff.cli (see
kvhandoff/__init__.py). Code must import them only through `kvhandoff.`: a file imported under two
names is two modules, and an object made by one fails `isinstance` against the other's class.

The rewrite is idempotent (a rewritten tree is left as it is) and re-runnable on a merged tree,
so branches that added `from spec.x import y` lines are fixed by running it again. What it changes:

1. import statements in *.py/*.pyi: `from spec.x import y` -> `from kvhandoff.spec.x import y`,
   `import impl.a as b` -> `import kvhandoff.impl.a as b`, `import spec` -> `from kvhandoff import
   spec`, and `kvhandoff_cli` -> `kvhandoff.cli`;
2. string literals in *.py that name a module or an attribute of one ("kvhandoff_cli.cmd_check",
   "impl.proto.gen"), when the module exists in the tree; a bare "kvhandoff_cli" right after a
   "-m" item (`[python, "-m", "kvhandoff_cli"]`) becomes "kvhandoff";
3. `-m MODULE` in any handled file (Python, Markdown, Makefile), same resolution;
4. import lines in Markdown (code examples), and `from X import` / `import X.y as z` inside
   string literals (code a test writes to a file, `python -c` programs, docstring examples).

Bare words ("spec", "conformance") are never rewritten: they are also prose, stage names and
paths. `import spec.x` without `as` (it binds `spec`, used as `spec.x.y`) has no one-line
equivalent and is reported for a hand edit. After rewriting, ruff sorts the imports and formats
the changed files (line lengths move) when ruff is installed.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import shutil
import subprocess
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "kvhandoff"
# Source folder -> its name under the namespace.
FOLDERS = {
    "spec": "spec",
    "model_checker": "model_checker",
    "impl": "impl",
    "conformance": "conformance",
    "kvhandoff_cli": "cli",
}
# Directories never walked: tool caches and build outputs. Symbolic links are never followed: the
# namespace's links (kvhandoff/spec -> ../spec) reach folders walked under their own names.
SKIP_DIRS = {
    ".git",
    ".venv",
    ".venv-sglang",
    ".venv-vllm",
    "__pycache__",
    "build",
    "dist",
    "node_modules",
    ".render-cache",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
}
# These name the old modules on purpose (the tool, and its test's un-rewritten samples).
SKIP_FILES = {Path("tools/namespace_imports.py"), Path("tests/test_namespace.py")}

_NAMES = "|".join(FOLDERS)
_DASH_M = re.compile(rf"(?<![\w-])(-m\s+)((?:{_NAMES})(?:\.\w+)*)\b")
_LAYOUT = {tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT}
# Code inside string literals (variant files a test writes, `python -c` programs, docstring
# examples): `from X import` and `import X.y as z`; other imports of a folder are reported.
_START = r"(?:(?<![\w.])|(?<=\\n))"  # a word start, or right after a `\n` escape
_TEXT_FROM = re.compile(rf"{_START}(from\s+)((?:{_NAMES})(?:\.\w+)*)(?=\s+import\b)")
_TEXT_IMPORT_AS = re.compile(rf"{_START}(import\s+)((?:{_NAMES})(?:\.\w+)*)(?=\s+as\s)")
_TEXT_IMPORT = re.compile(r"(?:^|;|\\n|\n|[\"'])\s*import\s+([\w.]+(?:\s*,\s*[\w.]+)*)")
_MD_IMPORT = re.compile(rf"^(\s*(?:>>> |\.\.\. )?)(from|import)(\s+)((?:{_NAMES})(?:\.\w+)*)\b")


@dataclass
class Result:
    changed: dict[Path, str] = field(default_factory=dict)  # path -> new text
    manual: list[str] = field(default_factory=list)  # what needs a hand edit


def new_module(name: str) -> str:
    """`spec.actions` -> `kvhandoff.spec.actions`; `kvhandoff_cli.main` -> `kvhandoff.cli.main`."""
    top, _, rest = name.partition(".")
    return ".".join(p for p in (NAMESPACE, FOLDERS[top], rest) if p)


def _exists(root: Path, dotted: str) -> bool:
    """Whether `dotted` starts with a module or package of the tree (the rest may be attributes)."""
    parts = dotted.split(".")
    if parts[0] not in FOLDERS or len(parts) < 2:
        return False
    base = root / parts[0] / parts[1]
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _dash_m_target(root: Path, module: str) -> str | None:
    if module == "kvhandoff_cli":
        return NAMESPACE  # kvhandoff/__main__.py runs the same command
    return new_module(module) if _exists(root, module) else None


def rewrite_dash_m(root: Path, text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        target = _dash_m_target(root, m.group(2))
        return m.group(1) + target if target else m.group(0)

    return _DASH_M.sub(sub, text)


def _offsets(text: str) -> list[int]:
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def rewrite_python(root: Path, text: str, where: str, manual: list[str]) -> str:
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        manual.append(f"{where}: not parsed ({exc.msg} at line {exc.lineno}); left as it is")
        return text
    starts = _offsets(text)
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement) on `text`

    def span(node: ast.stmt) -> tuple[int, int]:
        assert node.end_lineno is not None and node.end_col_offset is not None
        return (
            starts[node.lineno - 1] + node.col_offset,
            starts[node.end_lineno - 1] + node.end_col_offset,
        )

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top = node.module.split(".")[0]
            if top not in FOLDERS:
                continue
            a, b = span(node)
            stmt = text[a:b]
            m = re.match(rf"from(\s+){re.escape(node.module)}\b", stmt)
            if m is None:
                manual.append(f"{where}:{node.lineno}: unusual import layout; rewrite by hand")
                continue
            edits.append((a, a + m.end(), f"from{m.group(1)}{new_module(node.module)}"))
        elif isinstance(node, ast.Import):
            ours = [al for al in node.names if al.name.split(".")[0] in FOLDERS]
            if not ours:
                continue
            a, b = span(node)
            if len(node.names) > 1:
                manual.append(f"{where}:{node.lineno}: split `{text[a:b]}` into one import a line")
            elif ours[0].asname:
                al = ours[0]
                edits.append((a, b, f"import {new_module(al.name)} as {al.asname}"))
            elif "." not in ours[0].name:
                name = ours[0].name
                alias = "" if FOLDERS[name] == name else f" as {name}"
                edits.append((a, b, f"from {NAMESPACE} import {FOLDERS[name]}{alias}"))
            else:
                manual.append(
                    f"{where}:{node.lineno}: `{text[a:b]}` binds a bare package name; write "
                    f"`import {new_module(ours[0].name)} as ...` by hand"
                )
    # String literals: tokens, so that quotes and prefixes are kept exactly.
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        tokens = []
    significant = [t for t in tokens if t.type not in _LAYOUT]
    for i, tok in enumerate(significant):
        if tok.type != tokenize.STRING:
            continue
        prefix = re.match(r"^[A-Za-z]*", tok.string)
        assert prefix is not None
        if "b" in prefix.group(0).lower():
            continue
        try:
            value = "" if "f" in prefix.group(0).lower() else ast.literal_eval(tok.string)
        except (ValueError, SyntaxError):
            continue
        if not isinstance(value, str):
            continue
        after_dash_m = (
            i >= 2
            and significant[i - 1].string == ","
            and (significant[i - 2].string in ('"-m"', "'-m'"))
        )
        if value == "kvhandoff_cli" and after_dash_m:
            new_text = tok.string.replace(value, NAMESPACE, 1)  # a folder name elsewhere
        elif re.fullmatch(rf"(?:{_NAMES})(?:\.\w+)+", value) and _exists(root, value):
            new_text = tok.string.replace(value, new_module(value), 1)
        else:
            new_text = rewrite_code_in_text(tok.string, f"{where}:{tok.start[0]}", manual)
            if new_text == tok.string:
                continue
        a = starts[tok.start[0] - 1] + tok.start[1]
        b = starts[tok.end[0] - 1] + tok.end[1]
        edits.append((a, b, new_text))
    for a, b, new in sorted(edits, reverse=True):
        text = text[:a] + new + text[b:]
    return rewrite_dash_m(root, text)


def rewrite_code_in_text(text: str, where: str, manual: list[str]) -> str:
    text = _TEXT_FROM.sub(lambda m: m.group(1) + new_module(m.group(2)), text)
    text = _TEXT_IMPORT_AS.sub(lambda m: m.group(1) + new_module(m.group(2)), text)
    for m in _TEXT_IMPORT.finditer(text):
        names = [n.strip() for n in m.group(1).split(",")]
        if any(n.split(".")[0] in FOLDERS for n in names):
            manual.append(f"{where}: `import {m.group(1)}` inside a string; rewrite by hand")
    return text


def rewrite_markdown(root: Path, text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        module = m.group(4)
        if m.group(2) == "import" and "." not in module:
            return f"{m.group(1)}from {NAMESPACE} import {FOLDERS[module]}"
        return f"{m.group(1)}{m.group(2)}{m.group(3)}{new_module(module)}"

    lines = [_MD_IMPORT.sub(sub, line) for line in text.splitlines(keepends=True)]
    return rewrite_dash_m(root, "".join(lines))


def files(root: Path) -> list[Path]:
    out: list[Path] = []
    stack = [root]
    while stack:
        d = stack.pop()
        for p in sorted(d.iterdir()):
            if p.is_symlink():
                continue
            if p.is_dir():
                if p.name not in SKIP_DIRS and not p.name.endswith(".egg-info"):
                    stack.append(p)
            elif p.suffix in (".py", ".pyi", ".md") or p.name == "Makefile":
                if p.relative_to(root) not in SKIP_FILES:
                    out.append(p)
    return sorted(out)


def rewrite_tree(root: Path) -> Result:
    result = Result()
    for path in files(root):
        rel = path.relative_to(root)
        old = path.read_text()
        if path.suffix in (".py", ".pyi"):
            new = rewrite_python(root, old, str(rel), result.manual)
        elif path.suffix == ".md":
            new = rewrite_markdown(root, old)
        else:
            new = rewrite_dash_m(root, old)
        if new != old:
            result.changed[path] = new
    return result


def _ruff(root: Path, paths: list[Path]) -> None:
    """Sort and format the rewritten files (the namespace prefix reorders first-party imports and
    lengthens lines). The generated gRPC code is excluded by pyproject.toml (--force-exclude)."""
    exe = Path(sys.executable).with_name("ruff")
    ruff = str(exe) if exe.exists() else shutil.which("ruff")
    py = [str(p) for p in paths if p.suffix in (".py", ".pyi")]
    if not py:
        return
    if ruff is None:
        print("ruff not found: run `ruff check --select I --fix . && ruff format .` yourself")
        return
    common = ["--force-exclude", "--quiet"]
    subprocess.run([ruff, "check", "--select", "I", "--fix", *common, *py], cwd=root, check=False)
    subprocess.run([ruff, "format", *common, *py], cwd=root, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if needed")
    parser.add_argument("--root", type=Path, default=ROOT, help="tree to rewrite (default: repo)")
    parser.add_argument("--no-ruff", action="store_true", help="do not run ruff afterwards")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    result = rewrite_tree(root)
    for line in result.manual:
        print(f"hand edit needed: {line}")
    if args.check:
        for path in result.changed:
            print(f"not rewritten: {path.relative_to(root)}")
        if result.changed or result.manual:
            print(
                f"{len(result.changed)} file(s) still use the bare source-folder modules; "
                "run: python tools/namespace_imports.py"
            )
            return 1
        return 0
    for path, text in result.changed.items():
        path.write_text(text)
        print(f"rewrote {path.relative_to(root)}")
    if not args.no_ruff:
        _ruff(root, list(result.changed))
    return 1 if result.manual else 0


if __name__ == "__main__":
    sys.exit(main())
