"""How a message finds its request: by request id (the reference, our implementation) or by room
(SGLang's `bootstrap_room`), and the binding of writes and completions to decode's request.

The default scenario's requests 0 (tenant a) and 2 (tenant b) share room 1. These tests pin what
each design option does there: the reference is unchanged by the binding (it already matched by
request id), SGLang's combination leaks a cancelled request's data to the next tenant on its
room, and the binding alone keeps every safety property when prefill matches by room.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvhandoff.model_checker.explore import build_graph, explore
from kvhandoff.model_checker.z3_crosscheck import edge_mismatches
from kvhandoff.model_checker.z3_engines import bmc
from kvhandoff.spec.actions import DecodeGenerate, PrefillReceiveGrant, PrefillWritePage
from kvhandoff.spec.config import Config, parse_set
from kvhandoff.spec.variants import REFERENCE, get_variant
from tests.explored import explored

SAFETY = (
    "decode_reads_only_validated_pages",
    "no_cross_tenant_read",
    "accepted_completion_implies_full_coverage",
    "rejected_request_gets_error_not_output",
    "page_has_single_owner",
    "no_late_write_lands_in_reallocated_page",
    "freed_pages_hold_no_readable_data",
)
# Two requests on one room, two pages: the smallest scenario where a grant can be taken by the
# wrong request.
SHARED_ROOM = ["requests=a:1:1,b:1:1", "decode_pages=2", "context_window=2"]


def test_the_binding_changes_nothing_where_prefill_matches_by_request_id() -> None:
    unbound = replace(REFERENCE, design=replace(REFERENCE.design, binds_request=False))
    config = parse_set(Config(), SHARED_ROOM)
    assert len(build_graph(unbound, config)[0].states) == len(
        build_graph(REFERENCE, config)[0].states
    )


def test_room_keyed_matching_sends_a_cancelled_request_s_data_to_the_next_tenant() -> None:
    result = explored("room_keyed_matching")
    leak = result.result_for("no_cross_tenant_read")
    assert leak.verdict == "violated" and leak.depth == 16 and leak.trace is not None
    # The grant decode made for request 2 (tenant b) is taken by request 0 (tenant a) on the
    # same room, which writes its own data; decode then generates for request 2.
    grant = next(a for a in leak.trace if isinstance(a, PrefillReceiveGrant))
    assert grant.message.request == 2
    writers = {a.request for a in leak.trace if isinstance(a, PrefillWritePage)}
    assert writers == {0}
    assert leak.trace[-1] == DecodeGenerate(2)


def test_binding_writes_and_completions_to_the_request_keeps_every_safety_property() -> None:
    result = explored("room_keyed_with_binding")
    assert all(result.result_for(p).verdict == "holds" for p in SAFETY)
    # What it costs: the request whose grant was taken waits for ever.
    assert result.result_for("every_request_terminates").verdict == "violated"


@pytest.mark.parametrize(
    "name",
    [
        "m10_stale_status_adopted",
        pytest.param("generation_reset_on_restart", marks=pytest.mark.slow),
    ],
)
def test_catalogue_bugs_that_need_an_unbound_transfer_say_so(name: str) -> None:
    variant = get_variant(name)
    assert not variant.design.binds_request
    broken = variant.breaks[0]
    assert explored(name).result_for(broken).verdict == "violated"
    # With the binding the same bug no longer reaches its property: the defence that had to go,
    # as the catalogue's explanation says.
    bound = replace(variant, design=replace(variant.design, binds_request=True))
    assert explore(bound, Config()).result_for(broken).verdict == "holds"


def test_bmc_finds_the_explorer_s_room_collision_run() -> None:
    variant = get_variant("room_keyed_matching")
    config = parse_set(Config(), SHARED_ROOM)
    by_explorer = explore(variant, config).result_for("no_late_write_lands_in_reallocated_page")
    assert by_explorer.verdict == "violated"
    by_bmc = bmc(variant, config, depth=by_explorer.depth).result_for(
        "no_late_write_lands_in_reallocated_page"
    )
    assert by_bmc.verdict == "violated" and by_bmc.depth == by_explorer.depth


def test_the_z3_relation_has_the_explorer_s_edges_under_room_keyed_matching() -> None:
    config = parse_set(Config(), SHARED_ROOM)
    for name in ("room_keyed_matching", "room_keyed_with_binding"):
        variant = get_variant(name)
        states = build_graph(variant, config)[0].states
        picks = [
            s for s in states if any(m.kind in ("grant", "abort", "failure") for m in s.network)
        ]
        sample = picks[:: max(1, len(picks) // 15)] + states[:: max(1, len(states) // 10)]
        assert edge_mismatches(variant, config, sample) == []
