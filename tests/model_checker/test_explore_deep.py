"""Deep explicit-state runs (make test-slow)."""

import pytest

from kvhandoff.model_checker.explore import explore
from kvhandoff.spec import Config, get_variant, parse_set
from kvhandoff.spec.config import scenario_config
from kvhandoff.spec.variants import VARIANTS


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_reference_is_safe_with_two_faults_in_one_run() -> None:
    # Two faults of any kinds in the same run: a crash and a lost message together, say.
    config = parse_set(Config(), ["max_faults=2"])
    result = explore(get_variant("reference"), config)
    assert result.verdict == "safe", [r.property for r in result.violated()]
    assert all(result.witnesses.values())
    assert result.states is not None and result.states > 1_000_000


@pytest.mark.slow
@pytest.mark.timeout(1800)  # two faults: millions of states since the cancel's trip is modelled
@pytest.mark.parametrize(
    "variant", ["incident", "m7_release_before_drain", "m10_stale_status_adopted"]
)
def test_variants_stay_caught_with_two_faults(variant: str) -> None:
    config = parse_set(Config(), ["max_faults=2"])
    v = get_variant(variant)
    result = explore(v, config)
    assert set(v.breaks) <= {r.property for r in result.violated()}


WIDE_CAUGHT_OTHERWISE = {
    "m10_stale_status_adopted": {"freed_pages_hold_no_readable_data"},
    "room_keyed_matching": {
        "no_late_write_lands_in_reallocated_page",
        "every_request_terminates",
    },
}
"""Variants the wide scenario catches by other properties than their catalogue entry names: its
second request on room 1 is the prompt prefill refuses, so no tenant-b transfer is under way for
a stale completion or a room-keyed grant to feed (docs/spec.md, "Named scenarios")."""


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "variant",
    [
        pytest.param(
            v.name,
            marks=pytest.mark.skip(
                reason="a retry over the wide scenario: 4.8 M states, 405 s and several GiB "
                "(measured once: every_request_terminates broken in 27 steps)"
            ),
        )
        if v.config.get("max_retries")
        else v.name
        for v in VARIANTS
    ],
)
def test_every_catalogue_verdict_holds_on_the_wide_scenario(variant: str) -> None:
    """Two requests in flight at once on one room, two faults per run (`--scenario wide`): every
    variant keeps its catalogue verdict, caught by at least the properties its entry names (it may
    break more), or by those `WIDE_CAUGHT_OTHERWISE` names."""
    v = get_variant(variant)
    result = explore(v, v.scenario(scenario_config("wide")))
    broken = {r.property for r in result.violated()}
    assert bool(broken) == bool(v.breaks), sorted(broken)
    assert WIDE_CAUGHT_OTHERWISE.get(variant, set(v.breaks)) <= broken, sorted(broken)
    if not v.breaks:
        assert all(result.witnesses.values())


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("variant", sorted(WIDE_CAUGHT_OTHERWISE))
def test_a_tenant_b_request_that_fits_restores_the_catalogue_property(variant: str) -> None:
    """The same two requests, both short enough for prefill: every property of the catalogue entry
    breaks (m10's no_cross_tenant_read in 16 steps, room-keyed matching's in 13)."""
    v = get_variant(variant)
    config = parse_set(v.scenario(scenario_config("wide")), ["requests=a:2:1,b:2:1"])
    broken = {r.property for r in explore(v, config).violated()}
    assert set(v.breaks) <= broken, sorted(broken)


def _not_run_on_instances(v: object, faults: bool = False) -> str | None:
    """Why variant `v` is not run on the instances scenario (`faults`: on instance_faults):
    its bug needs a restart or a partition, which `instances` leaves out to stay small
    (`instance_faults` has them), or its own scenario adds what would take millions of states
    over two instances of each (a second prefill rank: checked on the small scenario in
    tests/spec/test_instances.py; a client retry)."""
    config = getattr(v, "config", {})
    if config.get("prefill_ranks"):
        return "a second prefill rank on two instances of each: see tests/spec/test_instances.py"
    if config.get("max_retries"):
        return "a retry over two instances of each: millions of states"
    if faults:
        return None
    if config.get("max_partitions"):
        return "needs a partition: checked on instance_faults"
    if getattr(v, "name", "") == "generation_reset_on_restart":
        return "needs a decode restart: checked on instance_faults (safe on instances)"
    return None


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "variant",
    [
        pytest.param(v.name, marks=pytest.mark.skip(reason=why))
        if (why := _not_run_on_instances(v))
        else v.name
        for v in VARIANTS
    ],
)
def test_every_catalogue_verdict_holds_on_the_instances_scenario(variant: str) -> None:
    """`--scenario instances` (wide on two prefill and two decode instances, every placement):
    every variant whose bug needs no restart, partition or second rank keeps its verdict on
    `wide`, caught by the same properties as there (docs/spec.md, "Several instances")."""
    v = get_variant(variant)
    result = explore(v, v.scenario(scenario_config("instances")))
    broken = {r.property for r in result.violated()}
    assert bool(broken) == bool(v.breaks), sorted(broken)
    assert WIDE_CAUGHT_OTHERWISE.get(variant, set(v.breaks)) <= broken, sorted(broken)
    if not v.breaks:
        # Every witness but a restart's: the scenario has none.
        assert [k for k, ok in result.witnesses.items() if not ok] == ["can_recover_from_crash"]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "variant",
    [
        pytest.param(v.name, marks=pytest.mark.skip(reason=why))
        if (why := _not_run_on_instances(v, faults=True))
        else v.name
        for v in VARIANTS
    ],
)
def test_every_catalogue_verdict_holds_on_the_instance_faults_scenario(variant: str) -> None:
    """`--scenario instance_faults` (instances, one fault per run, which may restart any one
    instance or cut any decode instance off any prefill instance): every variant keeps its
    verdict, the restart and partition bugs included, caught by the properties it breaks on
    `wide` (docs/spec.md, "Several instances")."""
    v = get_variant(variant)
    result = explore(v, v.scenario(scenario_config("instance_faults")))
    broken = {r.property for r in result.violated()}
    assert bool(broken) == bool(v.breaks), sorted(broken)
    assert WIDE_CAUGHT_OTHERWISE.get(variant, set(v.breaks)) <= broken, sorted(broken)
    if not v.breaks:
        assert all(result.witnesses.values()), result.witnesses
