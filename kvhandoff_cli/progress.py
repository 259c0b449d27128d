"""Progress on stderr for long commands, and what Ctrl-C reports.

`main()` runs every command under `shown()`: while it runs, each `model_checker.progress.report`
updates one status line on stderr (rich), only when stderr is a terminal, so pipes, CI logs and
the documented outputs stay as they are. `KVHANDOFF_PROGRESS=always` prints plain lines (at most
one a second) even to a pipe, `never` turns it off.

On Ctrl-C the command stops where it is; `interrupted_lines()` says what it had covered (the last
counts each task reported) and the command exits 130, the shell's code for death by SIGINT.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from kvhandoff.model_checker import progress

EXIT_INTERRUPTED = 130

# How each task's counts read, in this order; unknown keys follow as key=value.
_LABELS = {
    "states": "{:,} states",
    "depth": "depth {}",
    "transitions": "{:,} transitions",
    "cell": "cell {}",
    "traces": "{:,} traces",
    "steps": "{:,} steps",
    "stage": "stage {}",
    "variants": "{} variants",
    "obligations": "{:,} obligations settled",
    "checking": "now {}",
}


def describe(task: str, counts: progress.Counts) -> str:
    parts = []
    for key, fmt in _LABELS.items():
        if key in counts:
            parts.append(fmt.format(counts[key]))
    parts += [f"{k}={v}" for k, v in counts.items() if k not in _LABELS]
    return f"{task}: {', '.join(parts)}"


def interrupted_lines(command: str) -> list[str]:
    covered = progress.covered()
    if not covered:
        return [f"kvhandoff {command}: interrupted before any progress was reported"]
    return [f"kvhandoff {command}: interrupted; covered so far:"] + [
        f"  {describe(task, counts)}" for task, counts in covered.items()
    ]


def _mode(stream: TextIO) -> str:
    wanted = os.environ.get("KVHANDOFF_PROGRESS", "auto").lower()
    if wanted in ("always", "never"):
        return "plain" if wanted == "always" and not stream.isatty() else wanted
    return "always" if stream.isatty() else "never"


@contextmanager
def shown(command: str, stream: TextIO | None = None) -> Iterator[None]:
    """Show progress for the duration of one command."""
    out = stream or sys.stderr
    progress.reset()
    mode = _mode(out)
    if mode == "never":
        yield
        return
    if mode == "plain":
        last = [0.0]

        def plain(task: str, counts: progress.Counts) -> None:
            now = time.monotonic()
            if now - last[0] >= 1.0:
                last[0] = now
                print(f"kvhandoff {command}: {describe(task, counts)}", file=out, flush=True)

        with progress.listening(plain):
            yield
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    display = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(file=out, soft_wrap=True),  # output passing through is not re-wrapped
        transient=True,  # the command's own output is what stays on screen
    )
    tasks: dict[str, Any] = {}

    def live(task: str, counts: progress.Counts) -> None:
        text = describe(task, counts)
        if not tasks:
            # Started at the first report: a command that reports nothing (serve, explain)
            # keeps a plain terminal.
            display.start()
        if task not in tasks:
            tasks[task] = display.add_task(text, total=None)
        else:
            display.update(tasks[task], description=text)

    try:
        with progress.listening(live):
            yield
    finally:
        if tasks:
            display.stop()
