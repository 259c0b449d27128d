"""Structured event log: JSON Lines, one file per server (format in docs/event-log.md).

Line 1: ``{"kvhandoff_trace": 1, "kind": "event_log", "server": ..., "mode": ..., "config": {...}}``.
Each further line: ``{"seq": N, "server": ..., "event": KIND, "args": {...}}``. Args come from the
protocol cores' ``Log`` commands, which never carry prompt content or token ids.

Digests are keyed before they are written. A page digest is an unkeyed hash of a few tokens' K/V
from a deterministic model, so a log of raw digests gives the prompt back to anyone who hashes
every candidate page (issue 15 did it in seconds). Every ``digest`` arg is written as
HMAC-SHA256(key, digest bytes) cut to 16 bytes, with a per-deployment secret key: two logs written
with the same key still agree on equal digests (all the validator compares), and without the key
they say nothing about the data. The key is never written; the header carries ``digest_key_id``
(a hash of the key) so a reader can tell whether two logs used the same one.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

TRACE_VERSION = 1
KEYED_FIELDS = ("digest",)


def new_log_key() -> bytes:
    """A fresh per-deployment secret for keyed log digests."""
    return secrets.token_bytes(32)


def key_id(key: bytes) -> str:
    """Names a key without revealing it: 8 bytes of SHA-256 over a domain tag and the key."""
    return hashlib.sha256(b"kvhandoff log key id\0" + key).hexdigest()[:16]


def keyed_digest(key: bytes, hex_digest: str) -> str:
    """What a log writes for ``hex_digest``: HMAC-SHA256 under ``key``, 16 bytes, hex. An empty
    digest (none was sent, M5) stays empty: the validator tells "no digest" from "a digest"."""
    if not hex_digest:
        return ""
    try:
        raw = bytes.fromhex(hex_digest)
    except ValueError:
        raw = hex_digest.encode()
    return hmac.new(key, raw, hashlib.sha256).hexdigest()[:32]


class EventLog:
    def __init__(
        self,
        path: Path | None,
        server: str,
        mode: str,
        config: Mapping[str, Any],
        key: bytes | None = None,
    ) -> None:
        self.path = path
        self.server = server
        self._key = key if key is not None else new_log_key()
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
            "digest_key_id": key_id(self._key),
        }
        self._file.write(json.dumps(header, sort_keys=True) + "\n")
        self._file.flush()

    def write(self, event: str, args: Mapping[str, Any]) -> None:
        with self._lock:
            self._seq += 1
            if self._file is None:
                return
            private = dict(args)
            for name in KEYED_FIELDS:
                value = private.get(name)
                if isinstance(value, str):
                    private[name] = keyed_digest(self._key, value)
            line = {"seq": self._seq, "server": self.server, "event": event, "args": private}
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
