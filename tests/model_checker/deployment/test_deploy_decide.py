"""Z3's verdicts and boundary lengths, checked against the incident and against brute force."""

from __future__ import annotations

import pytest
import z3
from deploy_helpers import incident, oracle_sglang
from hypothesis import given, settings
from hypothesis import strategies as st

import kvhandoff.model_checker.deployment.decision as decision_module
from kvhandoff.model_checker.deployment import (
    Finding,
    InconclusiveError,
    LengthRange,
    Severity,
    decide,
)
from kvhandoff.model_checker.deployment.decision import _Z3, Decision
from kvhandoff.model_checker.deployment.engines import Kind
from kvhandoff.model_checker.deployment.model import Deployment, Engine, Role, RoleConfig, Setting


def errors(decision: Decision, rule: str | None = None) -> list[str]:
    return [
        f.code
        for f in decision.findings
        if f.severity is Severity.ERROR and (rule is None or f.rule == rule)
    ]


def finding(decision: Decision, code: str) -> Finding:
    matches = [f for f in decision.findings if f.code == code]
    assert len(matches) == 1, [f.code for f in decision.findings]
    return matches[0]


def test_the_incident_deployment_leaks_for_prompts_of_681274_to_1048569_tokens() -> None:
    d = decide(incident(version="0.5.11"))
    assert not d.safe
    leak = finding(d, "placeholder:placeholder/full")
    assert (leak.rule, leak.leak) == ("C2", True)
    assert leak.lengths == LengthRange(681_274, 1_048_569)
    assert "--max-total-tokens" in leak.flags


def test_the_incident_prefill_pool_is_below_its_window_for_681274_to_1048575_tokens() -> None:
    d = decide(incident(version="0.5.11"))
    c1 = finding(d, "prefill-pool-below-context")
    assert c1.rule == "C1"
    assert c1.lengths == LengthRange(681_274, 1_048_575)
    assert "at least 1,048,576" in c1.fix


def test_the_incident_on_0_5_23_makes_decode_wait_instead_of_leaking() -> None:
    d = decide(incident(version="0.5.23"))
    wait = finding(d, "decode-waits:retired/full")
    assert (wait.rule, wait.leak, wait.lengths) == ("C2", False, LengthRange(681_274, 1_048_569))
    assert "300 s" in wait.detail
    assert not any(f.leak for f in d.findings)


def test_the_incident_with_the_pool_fixed_is_proved_safe() -> None:
    d = decide(incident(prefill_pool=1_048_576))
    assert d.safe, errors(d)
    assert any(claim.startswith("C2/C3") for claim in d.proved)
    assert any(claim.startswith("C1") for claim in d.proved)


def test_a_pool_one_page_short_of_the_window_is_unsafe() -> None:
    d = decide(incident(prefill_pool=1_048_575))
    assert finding(d, "prefill-pool-below-context").lengths == LengthRange(1_048_569, 1_048_575)
    assert finding(d, "placeholder:placeholder/full").lengths == LengthRange(1_048_569, 1_048_569)


def test_identical_small_pools_break_c1_on_both_roles_but_hand_off_alike() -> None:
    d = decide(incident(decode_pool=681_280))
    assert sorted(errors(d)) == ["decode-pool-below-context", "prefill-pool-below-context"]
    assert not any(f.leak for f in d.findings)


def test_auto_truncate_on_prefill_only_leaks_and_names_the_flag() -> None:
    d = decide(incident(prefill_flags=("--allow-auto-truncate",)))
    short = finding(d, "short:truncated/full")
    assert (short.rule, short.leak) == ("C3", True)
    # At exactly max_req_input_len (681,274) truncation keeps every token, so the sides agree:
    # the leak starts one token later.
    assert short.lengths == LengthRange(681_275, 1_048_569)
    assert short.flags == ("--allow-auto-truncate",)
    assert "auto-truncate-asymmetric" in errors(d, "C3")


def test_a_gap_inside_a_range_is_reported_as_not_contiguous() -> None:
    n = z3.Int("n")
    assert _Z3(1000).length_range(z3.Or(n == 3, n == 7), n, "gap") == LengthRange(3, 7, False)
    assert _Z3(1000).length_range(z3.And(n >= 3, n <= 7), n, "no gap") == LengthRange(3, 7)
    assert _Z3(1000).length_range(z3.And(n >= 3, n <= 2), n, "empty") is None


def test_z3_unknown_is_inconclusive_never_safe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decision_module, "_check", lambda solver: z3.unknown)
    with pytest.raises(InconclusiveError, match="unknown"):
        decide(incident(prefill_pool=1_048_576))


def _small(
    context: tuple[int, int],
    pool: tuple[int, int],
    truncate: tuple[bool, bool],
    version: str,
    window: int,
) -> Deployment:
    def role(r: Role, i: int) -> RoleConfig:
        return RoleConfig(
            role=r,
            engine=Engine.SGLANG,
            context_length=Setting(context[i], "--context-length"),
            pool_tokens=Setting(pool[i], "--max-total-tokens"),
            page_size=Setting(1, "default"),
            allow_auto_truncate=Setting(truncate[i], "--allow-auto-truncate"),
        )

    return Deployment(
        engine=Engine.SGLANG,
        version=version,
        prefill=role(Role.PREFILL, 0),
        decode=role(Role.DECODE, 1),
        router_window=Setting(window, "--context-window"),
    )


def _covered(decision: Decision, rule_codes: tuple[str, ...]) -> set[int]:
    out: set[int] = set()
    for f in decision.findings:
        if f.severity is Severity.ERROR and f.lengths and f.code.split(":")[0] in rule_codes:
            assert f.lengths.contiguous
            out |= set(range(f.lengths.lo, f.lengths.hi + 1))
    return out


@settings(max_examples=25, deadline=None)
@given(
    context=st.tuples(st.integers(8, 40), st.integers(8, 40)),
    pool=st.tuples(st.integers(8, 50), st.integers(8, 50)),
    truncate=st.tuples(st.booleans(), st.booleans()),
    version=st.sampled_from(["0.5.11", "0.5.23"]),
    extra_window=st.integers(-3, 3),
)
def test_the_reported_ranges_are_exactly_the_lengths_brute_force_finds(
    context: tuple[int, int],
    pool: tuple[int, int],
    truncate: tuple[bool, bool],
    version: str,
    extra_window: int,
) -> None:
    window = max(2, max(context) + extra_window)
    d = decide(_small(context, pool, truncate, version, window))
    v0511 = version == "0.5.11"
    bad = set()
    for n in range(1, window):
        kp, ep = oracle_sglang(n, context[0], pool[0], truncate[0], v0511)
        kd, ed = oracle_sglang(n, context[1], pool[1], truncate[1], v0511)
        both_stop = not kp.proceeds and not kd.proceeds
        same = (
            kp.proceeds
            and kd.proceeds
            and ep == ed
            and ((kp is Kind.PLACEHOLDER) == (kd is Kind.PLACEHOLDER))
        )
        if not (both_stop or same):
            bad.add(n)
    codes = ("placeholder", "short", "decode-waits", "prefill-waits", "decode-less")
    assert _covered(d, codes) == bad
    assert d.safe == (not bad and not errors(d))
    for i, role in enumerate(("prefill", "decode")):
        limit = min(context[i] - 1, pool[i] - 1) - 5
        c1 = {n for n in range(1, window) if pool[i] < context[i] and limit <= n < context[i]}
        assert _covered(d, (f"{role}-pool-below-context",)) == c1
