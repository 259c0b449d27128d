"""The check behind both "committed generated code matches" tests (impl's and the harness's)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def assert_committed_code_is_fresh(
    proto_root: Path, generate: Callable[[Path], list[Path]], tmp_path: Path
) -> None:
    """`proto_root/gen` holds exactly what `generate` writes now: no file stale, missing or extra
    (`make proto` regenerates both trees)."""
    fresh = generate(tmp_path / "gen")
    committed_root = proto_root / "gen"
    assert fresh, "protoc produced nothing"
    for path in fresh:
        rel = path.relative_to(tmp_path / "gen")
        committed = committed_root / rel
        assert committed.exists(), f"{rel} is not committed; run `make proto`"
        assert committed.read_text() == path.read_text(), f"{rel} is stale; run `make proto`"
    committed_files = {
        p.relative_to(committed_root)
        for p in committed_root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert committed_files == {p.relative_to(tmp_path / "gen") for p in fresh}
