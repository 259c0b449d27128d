import pytest

from kvhandoff.model_checker.explore import build_graph, explore, to_dot
from kvhandoff.spec import ALWAYS, Config, default_config, get_variant, parse_set
from kvhandoff.spec.actions import action_name
from kvhandoff.spec.properties import SOMETIMES, TERMINATION
from kvhandoff.spec.trace import load_trace, replay
from kvhandoff.spec.variants import VARIANTS
from tests.explored import SMALL, explored

TINY = ["requests=a:1:1", "decode_pages=1", "max_faults=0"]


def test_state_counts_of_two_small_configs_are_pinned() -> None:
    tiny = explore(get_variant("reference"), parse_set(default_config(), TINY), reduce=False)
    assert (tiny.states, tiny.extra["transitions"]) == (16, 18)
    small = explore(get_variant("reference"), parse_set(default_config(), SMALL), reduce=False)
    assert (small.states, small.extra["transitions"]) == (5040, 12415)
    small_incident = explore(
        get_variant("incident"), parse_set(default_config(), SMALL), reduce=False
    )
    assert small_incident.states == 4467


def test_with_two_prefill_ranks_the_small_config_grows_and_the_reference_stays_safe() -> None:
    result = explore(
        get_variant("reference"),
        parse_set(default_config(), [*SMALL, "prefill_ranks=2"]),
        reduce=False,
    )
    assert (result.states, result.extra["transitions"]) == (11513, 35387)
    assert result.verdict == "safe" and all(result.witnesses.values())


def test_the_first_rank_variant_reads_a_page_whose_other_shard_never_landed() -> None:
    variant = get_variant("first_rank_completion_accepted")
    result = explored(variant.name)
    read = result.result_for("decode_reads_only_validated_pages")
    assert read.trace is not None
    final = replay(variant, result.config, read.trace)[-1]
    (r,) = [r for r, q in enumerate(final.requests) if q.read is not None]
    own = final.requests[r].read
    assert own is not None and None in own, "a shard of a read page is still zeroed"
    names = [action_name(a) for a in read.trace]
    assert names.count("prefill_send_completion") == 1, "decode accepted one rank's report"


def test_the_reference_protocol_is_safe_at_the_default_config_with_every_witness_reached() -> None:
    result = explored("reference")
    assert result.verdict == "safe"
    assert result.exit_code == 0
    assert {r.property for r in result.results} == {p.name for p in ALWAYS} | {TERMINATION.name}
    assert all(result.witnesses.values()), result.witnesses
    assert set(result.witnesses) == {w.name for w in SOMETIMES}
    assert result.extra["response_bound"] > 0


def test_the_default_config_breaks_both_deployment_checks_and_the_reference_is_still_safe() -> None:
    result = explored("reference")
    assert result.extra["deployment"] == {
        "context_window_fits_pools": False,
        "prefill_admits_everything_decode_admits": False,
    }


def test_every_always_property_is_paired_with_a_witness() -> None:
    names = {w.name for w in SOMETIMES}
    for prop in (*ALWAYS, TERMINATION):
        assert prop.witness in names


INCIDENT_SHORTEST = [
    "router_submit_request",
    "client_cancel_request",
    "router_submit_request",
    "prefill_reject_request",
    "decode_admit_request",
    "decode_reserve_pages",
    "prefill_receive_grant",
    "prefill_write_page",
    "decode_receive_write",
    "prefill_send_completion",
    "decode_receive_completion",
    "decode_generate",
]


def test_the_incident_counterexample_is_pinned() -> None:
    result = explored("incident")
    assert result.verdict == "violated"
    read = result.result_for("decode_reads_only_validated_pages")
    assert read.trace is not None
    assert [action_name(a) for a in read.trace] == INCIDENT_SHORTEST


def test_the_incident_cross_tenant_trace_shows_the_placeholder_the_completion_and_a_stale_read() -> (
    None
):
    result = explored("incident")
    cross = result.result_for("no_cross_tenant_read")
    assert cross.verdict == "violated" and cross.trace is not None
    names = [action_name(a) for a in cross.trace]
    assert "prefill_reject_request" in names
    assert names.index("prefill_write_page") < names.index("prefill_send_completion")
    assert names[-1] == "decode_generate"
    final = replay(get_variant("incident"), result.config, cross.trace)[-1]
    oversized = cross.trace[-1].request  # type: ignore[union-attr]
    read = final.requests[oversized].read
    assert read is not None
    tenants = {t.tenant for t in read if t is not None}
    own = result.config.requests[oversized].tenant
    assert own in tenants and tenants - {own}, "the answer must mix in another tenant's page"
    # Only one of the pages it reads was written by its own prefill: the placeholder page.
    assert sum(1 for t in read if t is not None and t.tenant == own) == 1


@pytest.mark.parametrize("variant", [v.name for v in VARIANTS])
def test_every_variant_is_caught_by_the_property_it_names_or_is_safe(variant: str) -> None:
    v = get_variant(variant)
    result = explored(variant)
    violated = {r.property for r in result.violated()}
    if v.breaks:
        assert set(v.breaks) <= violated, f"{variant}: expected {v.breaks}, got {violated}"
    else:
        assert result.verdict == "safe", f"{variant} should be safe, violated {violated}"


@pytest.mark.parametrize(
    "variant", ["incident", "m7_release_before_drain", "m15_silent_prefill_abort"]
)
def test_counterexamples_replay_to_the_violation_they_claim(variant: str) -> None:
    v = get_variant(variant)
    result = explored(variant)
    for r in result.violated():
        assert r.trace is not None
        states = replay(v, result.config, r.trace)
        prop = next((p for p in ALWAYS if p.name == r.property), None)
        if prop is not None:
            assert not prop.holds(result.config, states[-1])
            assert all(prop.holds(result.config, s) for s in states[:-1]), "not the shortest"
        text = result.trace_text(r)
        assert load_trace(text).actions == r.trace


def test_a_silent_prefill_abort_leaves_decode_stuck_once_faults_stop() -> None:
    result = explored("m15_silent_prefill_abort")
    term = result.result_for("every_request_terminates")
    assert term.verdict == "violated"
    assert "stuck" in term.detail and "holding pages" in term.detail
    assert term.trace is not None
    assert "prefill_abort_request" in [action_name(a) for a in term.trace]


def test_an_orphan_grant_leaves_prefill_state_that_never_ends() -> None:
    term = explored("m18_orphan_grant_accepted").result_for("every_request_terminates")
    assert term.verdict == "violated" and "orphan" in term.detail


def test_a_state_limit_makes_the_verdict_unknown_not_safe() -> None:
    result = explore(get_variant("reference"), default_config(), max_states=500)
    assert result.verdict == "unknown"
    assert result.exit_code == 3


def test_the_state_graph_exports_to_dot() -> None:
    config = parse_set(Config(), TINY)
    graph, _, _ = build_graph(get_variant("reference"), config, keep_edges=True)
    dot = to_dot(graph, get_variant("reference"), config)
    assert dot.startswith("digraph kvhandoff")
    assert dot.count(" -> ") == 18
    assert graph.to_networkx().number_of_nodes() == 16


def test_a_user_variant_file_runs_through_the_explorer() -> None:
    from kvhandoff.model_checker.variant_loader import load_variant

    variant = load_variant("examples/variant_skip_digest.py")
    result = explore(variant, default_config())
    assert "decode_reads_only_validated_pages" in {r.property for r in result.violated()}
    override = load_variant("tests/data/python_variants/override_reject.py")
    assert not override.is_pure_design
    violated = {r.property for r in explore(override, default_config()).violated()}
    assert violated == {"rejected_request_gets_error_not_output"}
