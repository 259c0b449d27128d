"""Every implementation bug mode is caught, by a conformance campaign or by replaying the model
checker's counterexample of the variant of the same name; this table pins which.

A mode reproduces the same combination of bugs as its spec variant (`impl/modes.py`), so the
variant's counterexample is a program that shows the mode's bug: replayed in the mode it diverges
from the reference, the implementation does at every step what the variant predicts, and its run
breaks the property the counterexample breaks; replayed in the reference mode the same program
conforms.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvhandoff.conformance import campaign
from kvhandoff.conformance.replay import replay_trace
from kvhandoff.impl.modes import MODES
from kvhandoff.model_checker.engines import ENGINES, EngineOptions
from kvhandoff.spec.config import default_config
from kvhandoff.spec.trace import Trace
from kvhandoff.spec.variants import get_variant

CAUGHT_BY_CONFORM = {
    "incident",
    "m1_placeholder_rejection",
    "m6_asymmetric_truncation",
    "m7_release_before_drain",
    "m8_release_on_timeout",
    "m16_router_ignores_prefill_error",
    "m18_orphan_grant_accepted",
    "m20_unscrubbed_pages",
}
# mode -> the property (one its variant is catalogued to break) whose shortest counterexample,
# replayed in that mode, diverges and breaks it on the implementation.
CAUGHT_BY_REPLAY = {
    "m2_local_completion_count": "accepted_completion_implies_full_coverage",
    "m3_decode_trusts_completion": "decode_reads_only_validated_pages",
    "m5_digest_skipped": "decode_reads_only_validated_pages",
    "m10_stale_status_adopted": "no_cross_tenant_read",
    # Liveness: decode holds the pages of a request prefill aborted; the target does not settle.
    "m15_silent_prefill_abort": "every_request_terminates",
}
# Modes whose replay diverges before the counterexample's violation, at this event: the mode is
# M10 alone, and the implementation's coverage record is per generation, so decode fails the new
# request on the stale completion (which the reference ignores) instead of adopting it (the
# variant adds unscrubbed pages and a digest over page contents for the adoption to succeed).
DIVERGES_BEFORE_THE_VIOLATION = {"m10_stale_status_adopted": "decode_receive_completion"}


def test_the_table_covers_every_bug_mode_once() -> None:
    modes = set(MODES) - {"reference"}
    assert modes == CAUGHT_BY_CONFORM | set(CAUGHT_BY_REPLAY)
    assert not CAUGHT_BY_CONFORM & set(CAUGHT_BY_REPLAY)


@pytest.mark.parametrize("mode", sorted(CAUGHT_BY_CONFORM))
def test_conform_catches(mode: str, tmp_path: Path) -> None:
    report = campaign.run("inproc", mode, traces=3000, steps=20, seed=0, out_dir=tmp_path)
    assert report.verdict == "diverges", mode


def _counterexample(variant: str, prop: str) -> Trace:
    config = default_config()
    result = ENGINES["explore"](get_variant(variant), config, EngineOptions())
    trace = next(r.trace for r in result.results if r.property == prop and r.trace)
    return Trace(config, tuple(trace), {"variant": variant})


@pytest.mark.parametrize("mode", sorted(CAUGHT_BY_REPLAY))
def test_replaying_the_counterexample_catches(mode: str) -> None:
    prop = CAUGHT_BY_REPLAY[mode]
    assert prop in get_variant(mode).breaks
    trace = _counterexample(mode, prop)
    report = replay_trace(trace, "inproc", mode)
    assert report.verdict == "diverges", report.summary()
    if mode in DIVERGES_BEFORE_THE_VIOLATION:
        assert report.first_divergence is not None
        assert report.first_divergence["event"]["event"] == DIVERGES_BEFORE_THE_VIOLATION[mode]
    else:
        # The mode is the variant: the implementation did what the counterexample shows, step
        # by step, and broke the same property.
        assert all(s.as_predicted for s in report.steps[: len(trace.actions)]), report.summary()
        assert prop in report.reproduced, report.summary()
    # ... because of the mode: the same program conforms on the reference implementation.
    reference = replay_trace(trace, "inproc", "reference")
    assert reference.conforms, reference.summary()
    assert prop not in reference.reproduced
