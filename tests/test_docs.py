"""Every command shown in the guides still prints what the guides say.

In each of DOCS, in document order, in one scratch folder per document (with `examples/`,
`docs/` and `tests/` linked in):
- each fenced `console` block holds `$ kvhandoff ...` commands, each followed by its output, and
  `$ echo $?` lines followed by the exit code of the command before; the command is run in-process
  and its output must match, except timings (`1.23 s`, `12,345 states/s`, `took 4.5 s`), which may
  differ; a line `...` in the docs stands for any number of output lines;
- a fenced block preceded by `<!-- output of: kvhandoff ... -->` must equal that command's output
  (the charts in the guides are real outputs);
- a fenced `python` block whose first line is `# from PATH` must appear verbatim in that file.

Blocks that cannot run yet use `text` fences and are not collected. After a deliberate change of
output, regenerate the outputs from real runs with:

    PYTHONPATH=. python -m tests.test_docs --regen
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["docs/incident-walkthrough.md", "docs/reviewing-a-change.md", "docs/conformance-guide.md"]
ITEM = re.compile(
    r"(?:<!-- output of: (?P<of>[^\n]*?) -->\n```(?P<oflang>\w*)\n(?P<ofbody>.*?)```)"
    r"|(?:```console\n(?P<console>.*?)```)"
    r"|(?:```python\n# from (?P<src>\S+)\n(?P<excerpt>.*?)```)",
    re.DOTALL,
)
TIMING = [
    (re.compile(r"\d[\d,]*(\.\d+)? s\b"), "<T> s"),
    (re.compile(r"\d[\d,]* states/s"), "<N> states/s"),
]


@dataclass
class Step:
    command: str
    output: str
    exit_code: int | None  # from the `$ echo $?` that follows, if any


def parse_console(block: str) -> list[Step]:
    steps: list[Step] = []
    for chunk in re.split(r"^\$ ", block, flags=re.MULTILINE)[1:]:
        command, _, output = chunk.partition("\n")
        if command == "echo $?":
            assert steps, "echo $? before any command"
            steps[-1].exit_code = int(output.strip())
        else:
            steps.append(Step(command, output, None))
    return steps


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kvhandoff-docs-") as tmp:
        work = Path(tmp)
        for name in ("examples", "docs", "tests"):
            (work / name).symlink_to(ROOT / name)
        yield work


def execute(command: str, cwd: Path) -> tuple[str, int]:
    """Run one documented `kvhandoff ...` command in-process, in `cwd`, as a shell would."""
    from kvhandoff.cli.main import main

    words = shlex.split(command)
    assert words[0] == "kvhandoff", f"the docs run only kvhandoff commands: {command}"
    buffer = io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            code = main(words[1:])
    finally:
        os.chdir(here)
    return buffer.getvalue(), code


def normalise(text: str) -> str:
    for pattern, repl in TIMING:
        text = pattern.sub(repl, text)
    return text


def matches(documented: str, actual: str) -> bool:
    """Line by line, timings ignored; a documented `...` line matches any run of lines."""
    segments: list[list[str]] = [[]]
    for line in normalise(documented).splitlines():
        if line == "...":
            segments.append([])
        else:
            segments[-1].append(line)
    lines = normalise(actual).splitlines()
    first, *middle = segments
    if lines[: len(first)] != first:
        return False
    if not middle:
        return len(lines) == len(first)
    *middle, last = middle
    at = len(first)
    for seg in middle:
        while lines[at : at + len(seg)] != seg:
            at += 1
            if at + len(seg) > len(lines):
                return False
        at += len(seg)
    return len(lines) - at >= len(last) and (not last or lines[-len(last) :] == last)


@dataclass
class Item:
    doc: str
    kind: str  # "console" | "output" | "excerpt"
    text: str  # the command, or the source path
    expected: str
    exit_code: int | None = None


def items(doc: str) -> list[Item]:
    out: list[Item] = []
    for m in ITEM.finditer((ROOT / doc).read_text(encoding="utf-8")):
        if m.group("of") is not None:
            out.append(Item(doc, "output", m.group("of"), m.group("ofbody")))
        elif m.group("console") is not None:
            for s in parse_console(m.group("console")):
                out.append(Item(doc, "console", s.command, s.output, s.exit_code))
        else:
            out.append(Item(doc, "excerpt", m.group("src"), m.group("excerpt")))
    return out


def test_each_guide_shows_commands_that_are_tested() -> None:
    for doc in DOCS:
        assert any(i.kind == "console" for i in items(doc)), doc
    walkthrough = items("docs/incident-walkthrough.md")
    assert {i.kind for i in walkthrough} == {"console", "output", "excerpt"}
    codes = {i.exit_code for d in DOCS for i in items(d) if i.kind == "console"}
    assert {0, 1, 2} <= codes


@pytest.mark.parametrize("doc", DOCS)
def test_every_command_in_the_guide_still_prints_what_it_shows(doc: str) -> None:
    failures = []
    with scratch() as work:
        for item in items(doc):
            if item.kind == "excerpt":
                source = (ROOT / item.text).read_text(encoding="utf-8")
                if item.expected not in source:
                    failures.append(f"excerpt no longer in {item.text}:\n{item.expected}")
                continue
            output, code = execute(item.text, work)
            if not matches(item.expected, output):
                failures.append(
                    f"$ {item.text}\n--- documented\n{item.expected}--- actual\n{output}"
                )
            if item.kind == "console":
                if item.exit_code is None:
                    failures.append(f"$ {item.text}: not followed by `$ echo $?`")
                elif code != item.exit_code:
                    failures.append(f"$ {item.text}: exit {code}, the docs say {item.exit_code}")
    assert not failures, "\n\n".join(failures)


def regenerate(doc: str) -> None:
    """Rewrite a guide's outputs from real runs (elisions `...` are kept where they still match)."""
    path = ROOT / doc
    text = path.read_text(encoding="utf-8")
    with scratch() as work:

        def fill(m: re.Match[str]) -> str:
            if m.group("of") is not None:
                output, _ = execute(m.group("of"), work)
                return f"<!-- output of: {m.group('of')} -->\n```{m.group('oflang')}\n{output}```"
            if m.group("console") is not None:
                lines = []
                for s in parse_console(m.group("console")):
                    output, code = execute(s.command, work)
                    shown = s.output if s.output and matches(s.output, output) else output
                    lines.append(f"$ {s.command}\n{shown}$ echo $?\n{code}\n")
                return "```console\n" + "".join(lines) + "```"
            return m.group(0)

        path.write_text(ITEM.sub(fill, text), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--regen"]:
        for d in sys.argv[2:] or DOCS:
            regenerate(d)
