"""Every `console` block in docs/check-config.md still runs as documented.

Each block holds `$ kvhandoff check-config ...` commands, each followed by its output, and
`$ echo $?` lines followed by the exit code of the command before. After a deliberate change to the
output, regenerate the blocks from real runs with:

    PYTHONPATH=. python tests/model_checker/deployment/test_deploy_docs.py --regen
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "check-config.md"
BLOCK = re.compile(r"```console\n(.*?)```", re.DOTALL)
MODULES = ["kvhandoff.cli.cmd_check_config"]


@dataclass
class Step:
    command: str
    output: str
    exit_code: int | None  # from the `$ echo $?` that follows, if any


def parse_block(block: str) -> list[Step]:
    steps: list[Step] = []
    for chunk in re.split(r"^\$ ", block, flags=re.MULTILINE)[1:]:
        command, _, output = chunk.partition("\n")
        if command == "echo $?":
            assert steps, "echo $? before any command"
            steps[-1].exit_code = int(output.strip())
        else:
            steps.append(Step(command, output, None))
    return steps


def execute(command: str) -> tuple[str, int]:
    """Run one documented command in-process, from the repository root, as a shell would."""
    from kvhandoff.cli.main import main

    words = shlex.split(command)
    assert words[:2] == ["kvhandoff", "check-config"], command
    buffer = io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            code = main(words[1:], modules=MODULES)
    finally:
        os.chdir(cwd)
    return buffer.getvalue(), code


def documented_steps() -> list[Step]:
    return [
        step
        for block in BLOCK.findall(DOC.read_text(encoding="utf-8"))
        for step in parse_block(block)
    ]


def test_the_docs_show_at_least_three_examples_with_verdicts() -> None:
    steps = documented_steps()
    assert len(steps) >= 3
    assert {0, 1, 2} <= {s.exit_code for s in steps}


@pytest.mark.parametrize("step", documented_steps(), ids=lambda s: s.command[:60])
def test_a_documented_command_still_prints_what_the_docs_show(step: Step) -> None:
    output, code = execute(step.command)
    assert output == step.output
    assert step.exit_code is not None, "every documented command is followed by `$ echo $?`"
    assert code == step.exit_code


def regenerate() -> None:
    text = DOC.read_text(encoding="utf-8")

    def fill(match: re.Match[str]) -> str:
        lines = []
        for step in parse_block(match.group(1)):
            output, code = execute(step.command)
            lines.append(f"$ {step.command}\n{output}$ echo $?\n{code}\n")
        return "```console\n" + "".join(lines) + "```"

    DOC.write_text(BLOCK.sub(fill, text), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--regen"]:
        regenerate()
