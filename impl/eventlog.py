"""Structured event log: JSON Lines, one file per server (format in docs/event-log.md).

Line 1: ``{"kvhandoff_trace": 1, "kind": "event_log", "server": ..., "mode": ..., "config": {...}}``.
Each further line: ``{"seq": N, "server": ..., "event": KIND, "args": {...}}``. Args come from the
protocol cores' ``Log`` commands, which never carry prompt content or token ids.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

TRACE_VERSION = 1


class EventLog:
    def __init__(
        self, path: Path | None, server: str, mode: str, config: Mapping[str, Any]
    ) -> None:
        self.path = path
        self.server = server
        self._seq = 0
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        self.resumed = False  # True when continuing the file of an earlier run of this server
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size > 0:
            # A restarted server continues its file; seq keeps increasing.
            last = path.read_text().rstrip("\n").rsplit("\n", 1)[-1]
            self._seq = int(json.loads(last).get("seq", 0))
            self.resumed = True
            self._file = path.open("a", encoding="utf-8")
            return
        self._file = path.open("w", encoding="utf-8")
        header = {
            "kvhandoff_trace": TRACE_VERSION,
            "kind": "event_log",
            "server": server,
            "mode": mode,
            "config": dict(config),
        }
        self._file.write(json.dumps(header, sort_keys=True) + "\n")
        self._file.flush()

    def write(self, event: str, args: Mapping[str, Any]) -> None:
        with self._lock:
            self._seq += 1
            if self._file is None:
                return
            line = {"seq": self._seq, "server": self.server, "event": event, "args": dict(args)}
            self._file.write(json.dumps(line, sort_keys=True, default=list) + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def read_events(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Header and event lines of a log file."""
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return lines[0], lines[1:]
