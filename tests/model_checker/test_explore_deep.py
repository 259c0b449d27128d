"""Deep explicit-state runs (make test-slow)."""

import pytest

from kvhandoff.model_checker.explore import explore
from kvhandoff.spec import Config, get_variant, parse_set


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
