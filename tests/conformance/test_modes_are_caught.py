"""Every implementation bug mode is caught, by a conformance campaign or by replaying the model
checker's counterexample of the variant of the same name; this table pins which."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance import campaign
from conformance.replay import replay_trace
from impl.modes import MODES
from model_checker.engines import ENGINES, EngineOptions
from spec.config import default_config
from spec.trace import Trace
from spec.variants import get_variant

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
# mode -> the violated property whose counterexample, replayed in that mode, diverges.
CAUGHT_BY_REPLAY = {
    "m10_stale_status_adopted": "no_cross_tenant_read",
}
# Defence-in-depth bugs that nothing in the implementation can trigger on its own: the reference
# prefill never sends a completion that disagrees with the grant (the spec variants pair them
# with a truncation or placeholder for the same reason; caught in combination: `incident`), and
# a silent prefill abort (m15) is masked by the reference router, which withdraws the request
# from decode when prefill reports an error.
LATENT_ALONE = {
    "m2_local_completion_count",
    "m3_decode_trusts_completion",
    "m5_digest_skipped",
    "m15_silent_prefill_abort",
}


def test_the_table_covers_every_bug_mode() -> None:
    modes = set(MODES) - {"reference"}
    assert modes == CAUGHT_BY_CONFORM | set(CAUGHT_BY_REPLAY) | LATENT_ALONE


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
    trace = _counterexample(mode, CAUGHT_BY_REPLAY[mode])
    report = replay_trace(trace, "inproc", mode)
    assert report.verdict == "diverges"
    # ... because of the mode: the same program conforms on the reference implementation.
    assert replay_trace(trace, "inproc", "reference").conforms


@pytest.mark.parametrize("mode", sorted(LATENT_ALONE))
def test_latent_modes_conform_alone(mode: str, tmp_path: Path) -> None:
    report = campaign.run("inproc", mode, traces=300, steps=20, seed=0, out_dir=tmp_path)
    assert report.verdict == "conforms"
