"""The committed gRPC code under impl/proto/gen is exactly what `make proto` generates."""

from __future__ import annotations

from pathlib import Path

from kvhandoff.impl.proto.build import PROTO_ROOT, generate
from tests.proto_check import assert_committed_code_is_fresh


def test_committed_generated_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    assert_committed_code_is_fresh(PROTO_ROOT, generate, tmp_path)
