"""The committed gRPC code under impl/proto/gen is exactly what `make proto` generates."""

from __future__ import annotations

from pathlib import Path

from impl.proto.build import PROTO_ROOT, generate


def test_committed_generated_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    fresh = generate(tmp_path / "gen")
    committed_root = PROTO_ROOT / "gen"
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
