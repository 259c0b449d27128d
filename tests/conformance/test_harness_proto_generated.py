"""The committed harness-service code under conformance/proto/gen is exactly what `make proto`
generates (the same check as tests/impl/test_proto_generated.py for impl/proto/gen)."""

from __future__ import annotations

from pathlib import Path

from kvhandoff.conformance.proto.build import PROTO_ROOT, generate
from tests.proto_check import assert_committed_code_is_fresh


def test_committed_harness_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    assert_committed_code_is_fresh(PROTO_ROOT, generate, tmp_path)


def test_every_target_operation_has_its_rpc() -> None:
    # The service mirrors the Target API one to one (harness.proto's header, the guide's table).
    from kvhandoff.conformance.proto.gen.kvhandoff.harness.v1 import harness_pb2

    rpcs = set(harness_pb2.DESCRIPTOR.services_by_name["Harness"].methods_by_name)
    assert rpcs == {
        "Info", "Reset", "Submit", "Cancel", "Deliver", "Drop", "Retransmit", "Duplicate",
        "FireTimeout", "PrefillAbort", "Retry", "RestartPrefill", "RestartDecode", "SuspectPrefillDead",
        "Probe", "PageContents",
        "Settle", "Events",
        "Answers", "Quiescent", "Describe", "WaitAnswered", "Close", "Shutdown",
    }  # fmt: skip
