"""How far a long run has got, for whoever shows it (the command line's progress display) and for
what Ctrl-C reports as covered.

The engines and the conformance campaign call `report(task, **counts)` now and then (the explorer
every few thousand states: a call per state would cost more than the display is worth); nothing
here prints. With no listener a report only keeps its counts, so library users pay a dict update.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

Counts = Mapping[str, int | str]
Listener = Callable[[str, Counts], None]

_listeners: list[Listener] = []
_last: dict[str, dict[str, int | str]] = {}


def report(task: str, **counts: int | str) -> None:
    """The latest counts of `task` ("explore", "matrix", "conform", ...), replacing earlier ones."""
    _last[task] = dict(counts)
    for listener in _listeners:
        listener(task, counts)


def covered() -> dict[str, dict[str, int | str]]:
    """The last counts reported by each task since `reset()`, in the order tasks first reported."""
    return {task: dict(counts) for task, counts in _last.items()}


def reset() -> None:
    _last.clear()


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)
