"""k-induction, any-size proofs and Spacer: proofs that count, and proofs that fail loudly."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
import z3

from kvhandoff.model_checker import z3_derived
from kvhandoff.model_checker.prove import _inductive_subset, prove, prove_fixed
from kvhandoff.model_checker.z3_encoding import Encoding
from kvhandoff.model_checker.z3_engines import kinduction, spacer
from kvhandoff.model_checker.z3_invariants import fixed_invariants
from kvhandoff.spec.config import Config, RequestSpec
from kvhandoff.spec.variants import REFERENCE, get_variant

TINY = Config(
    decode_pages=1,
    requests=(RequestSpec("a", 1, 1),),
    context_window=1,
    prefill_max_prompt=1,
    decode_max_prompt=1,
    max_faults=0,
)


def test_kinduction_proves_the_reference_for_every_depth_at_the_default_config() -> None:
    result = kinduction(REFERENCE, Config(), depth=1)
    assert result.verdict == "safe"
    assert result.extra["k"] == 1
    assert result.extra["scope"] == "fixed-config"


def test_kinduction_proves_the_one_sided_fenced_design_too() -> None:
    assert kinduction(get_variant("one_sided_fenced"), Config(), depth=1).verdict == "safe"


def test_kinduction_without_the_invariants_reports_a_counterexample_to_induction() -> None:
    enc = Encoding(REFERENCE, Config(), width=None)
    weak = dict(fixed_invariants(enc))
    del weak["owned_pages_hold_owner_data_or_nothing"]
    del weak["validated_pages_hold_own_data"]
    result = kinduction(REFERENCE, Config(), depth=1, invariants=weak, fallback_depth=4)
    assert result.verdict == "unknown"  # not inductive, and BMC finds no real counterexample
    cti = result.extra["cti"]
    assert cti["action"] and cti["fails"] and cti["before"] and cti["after"]


def test_prove_covers_any_pool_size_and_lists_every_obligation() -> None:
    started = time.perf_counter()
    result = prove(REFERENCE, Config())
    assert time.perf_counter() - started < 60
    assert result.verdict == "safe"
    assert result.extra["scope"] == "any-size"
    obligations = result.extra["obligations"]
    assert {o["kind"] for o in obligations} == {"initiation", "consecution", "safety"}
    assert all(o["verdict"] == "proved" for o in obligations)
    actions = {o["action"] for o in obligations if o["kind"] == "consecution"}
    assert {"decode_reserve_pages", "decode_receive_write", "decode_release_pages"} <= actions
    assert result.extra["obligations_total"] == len(obligations)


def test_a_weakened_invariant_makes_prove_fail_naming_action_invariant_and_cti() -> None:
    # "Validated pages hold own data" replaced by: true. Without it nothing says what decode
    # reads when it generates, so consecution of the read property fails under decode_generate.
    weaken: dict[str, Any] = {"validated_pages_hold_own_data": lambda m, s, tag: z3.BoolVal(True)}
    obligations = z3_derived.prove_derived(REFERENCE.design, weaken=weaken)
    failed = [o for o in obligations if o.verdict == "failed"]
    assert failed
    named = {(o.action, o.invariant) for o in failed}
    assert ("decode_generate", "decode_reads_only_validated_pages") in named
    cex = failed[0].counterexample
    assert cex is not None and cex["Reqs"] >= 1 and "before" in cex and "after" in cex


def test_prove_on_a_broken_design_fails_an_obligation_and_finds_the_real_counterexample() -> None:
    result = prove(get_variant("m20_unscrubbed_pages"), Config(), depth=8)
    assert result.verdict == "violated"
    assert result.result_for("freed_pages_hold_no_readable_data").verdict == "violated"
    # Each property on its own: the one that fails does not make the others unknown.
    assert result.result_for("no_cross_tenant_read").verdict == "holds"
    assert result.result_for("page_has_single_owner").verdict == "holds"
    failed = result.extra["failed_obligations"]
    assert any(
        o["invariant"] == "freed_pages_hold_no_readable_data"
        and o["action"] in ("decode_release_pages", "decode_restart")
        for o in failed
    )


@pytest.mark.slow
def test_fixed_config_obligations_name_the_action_of_a_failure() -> None:
    obligations = prove_fixed(get_variant("m8_release_on_timeout"), Config())
    failed = {(o.action, o.invariant) for o in obligations if o.verdict == "failed"}
    assert ("decode_release_timeout", "fenced_writes_land_in_held_pages") in failed


@pytest.mark.slow
def test_spacer_proves_a_tiny_config_and_its_invariant_is_rechecked() -> None:
    result = spacer(REFERENCE, TINY, timeout=120)  # about 3 s on an idle machine
    assert result.verdict == "safe"
    assert result.extra["scope"] == "fixed-config"


def test_spacer_out_of_time_is_unknown_never_safe() -> None:
    result = spacer(REFERENCE, Config(), timeout=0.5)
    assert result.verdict == "unknown"
    assert all(r.verdict == "unknown" for r in result.results)


def test_a_failed_claim_takes_only_the_claims_that_lean_on_it() -> None:
    # a holds alone; b fails; c holds only while b is assumed. Houdini keeps exactly {a}.
    def ob(name: str, ok: bool) -> z3_derived.Obligation:
        return z3_derived.Obligation("consecution", name, "x", "proved" if ok else "failed", 0.0)

    asked: list[set[str] | None] = []

    def run(only: set[str] | None) -> list[z3_derived.Obligation]:
        asked.append(only)
        claims = {"a", "b", "c"} if only is None else only
        return [ob(n, n == "a" or (n == "c" and "b" in claims)) for n in sorted(claims)]

    kept, rounds, first = _inductive_subset(run, run(None))
    assert kept == {"a"} and rounds == 2
    assert asked == [None, {"a", "c"}, {"a"}]
    assert first["b"].invariant == "b" and first["c"].invariant == "c"


def test_houdini_rounds_re_ask_only_what_leaned_on_a_dropped_claim() -> None:
    # The fixed-config prove assumes each claim through a literal of its own: an obligation
    # proved from claims all still kept is carried into the next round, not asked again. The
    # rounds must end exactly where rounds asked afresh end, obligation by obligation.
    from kvhandoff.model_checker.prove import _FixedRounds

    variant = get_variant("m7_release_before_drain")
    # One request, one page, one fault: m7's bug (release before the drain) already fails
    # claims here, in two rounds, in seconds.
    one = replace(TINY, max_faults=1)
    rounds = _FixedRounds(variant, one, timeout=120)
    first = rounds(None)
    kept, n, _ = _inductive_subset(rounds, first)
    assert n >= 1  # claims were dropped, so there was a later round to carry obligations into
    carried = rounds.last
    assert carried is not None and any(o.reused for o in carried)
    assert all(o.assumed is not None for o in carried if o.verdict == "proved")

    def afresh(only: set[str] | None) -> list[z3_derived.Obligation]:
        return prove_fixed(variant, one, timeout=120, only=only)

    kept_afresh, n_afresh, _ = _inductive_subset(afresh, afresh(None))
    assert (kept, n) == (kept_afresh, n_afresh)
    answers = sorted((o.kind, o.invariant, o.action or "", o.verdict) for o in carried)
    assert answers == sorted(
        (o.kind, o.invariant, o.action or "", o.verdict) for o in afresh(kept_afresh)
    )
