"""The tokenizer: one token per UTF-8 byte (ids 0..255). Deterministic, reversible, no files.

Token 0 (NUL) doubles as prefill's placeholder token and as what a scrubbed page reads back as.
"""

from __future__ import annotations

from collections.abc import Sequence

VOCAB_SIZE = 256
PLACEHOLDER_TOKEN = 0


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(tokens: Sequence[int]) -> str:
    return bytes(t for t in tokens if 0 <= t < VOCAB_SIZE).decode("utf-8", errors="replace")
