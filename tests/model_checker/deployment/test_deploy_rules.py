"""C3–C7 and vLLM's own checks: each misconfiguration is an error naming what to change."""

from __future__ import annotations

import json

from deploy_helpers import incident

from kvhandoff.model_checker.deployment import (
    CheckerOptions,
    Finding,
    Severity,
    decide,
    from_commands,
)

FIXED = 1_048_576


def errors_of(decision_findings: tuple[Finding, ...]) -> dict[str, Finding]:
    return {f.code: f for f in decision_findings if f.severity is Severity.ERROR}


def test_a_fixed_incident_has_no_errors() -> None:
    assert errors_of(decide(incident(prefill_pool=FIXED)).findings) == {}


def test_mismatched_page_sizes_name_the_flag() -> None:
    found = errors_of(
        decide(
            incident(
                prefill_pool=FIXED,
                prefill_flags=("--page-size 64",),
                decode_flags=("--page-size 32",),
            )
        ).findings
    )
    assert set(found) == {"page-size-mismatch"}
    assert found["page-size-mismatch"].flags == ("--page-size",)
    assert found["page-size-mismatch"].rule == "C4"


def test_the_fake_backend_on_either_role_is_an_error() -> None:
    flag = "--disaggregation-transfer-backend fake"
    found = errors_of(decide(incident(prefill_pool=FIXED, decode_flags=(flag,))).findings)
    assert {"decode-fake-backend", "transfer-backend-mismatch"} == set(found)
    assert found["decode-fake-backend"].flags == ("--disaggregation-transfer-backend",)


def test_a_bootstrap_timeout_below_decodes_wait_names_both_variables() -> None:
    d = from_commands(
        incident_cmd("prefill", FIXED),
        incident_cmd("decode", 2_097_152),
        CheckerOptions(env=["decode:SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600"]),
    )
    found = errors_of(decide(d).findings)
    assert set(found) == {"bootstrap-timeout-below-waiting-timeout"}
    f = found["bootstrap-timeout-below-waiting-timeout"]
    assert f.rule == "C6"
    assert f.flags == (
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT",
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT (--env decode:)",
    )
    assert "≥ 600" in f.fix


def test_decode_queueing_counts_against_the_bootstrap_timeout() -> None:
    d = from_commands(
        incident_cmd("prefill", FIXED),
        incident_cmd("decode", 2_097_152),
        CheckerOptions(max_decode_queueing_s=30),
    )
    assert "bootstrap-timeout-below-waiting-timeout" in errors_of(decide(d).findings)


def test_deferred_release_off_or_too_short_is_an_error() -> None:
    off = from_commands(
        incident_cmd("prefill", FIXED),
        "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=false "
        + incident_cmd("decode", 2_097_152),
        CheckerOptions(),
    )
    assert set(errors_of(decide(off).findings)) == {"deferred-release-off"}
    short = from_commands(
        incident_cmd("prefill", FIXED),
        incident_cmd("decode", 2_097_152),
        CheckerOptions(decode_env=["SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT=5"]),
    )
    assert set(errors_of(decide(short).findings)) == {"deferred-release-timeout-too-short"}


def test_a_checksum_on_one_side_only_is_an_error_and_off_on_both_a_warning() -> None:
    one = decide(
        incident(prefill_pool=FIXED, prefill_flags=("--disaggregation-enable-kv-checksum",))
    )
    assert set(errors_of(one.findings)) == {"kv-checksum-asymmetric"}
    neither = decide(incident(prefill_pool=FIXED))
    assert [f.severity for f in neither.findings if f.code == "kv-checksum-off"] == [
        Severity.WARNING
    ]


def test_a_prefill_chunk_larger_than_the_pool_is_an_error() -> None:
    d = decide(incident(prefill_pool=FIXED, prefill_flags=("--chunked-prefill-size 2000000",)))
    assert set(errors_of(d.findings)) == {"prefill-chunk-larger-than-pool"}
    assert decide(incident(prefill_pool=FIXED, prefill_flags=("--chunked-prefill-size -1",))).safe


def incident_cmd(role: str, pool: int) -> str:
    return (
        f"python -m sglang.launch_server --model-path m --disaggregation-mode {role} "
        f"--context-length 1048576 --max-total-tokens {pool}"
    )


def vllm_cmd(role: str, *flags: str, **kv: object) -> str:
    config = {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
        **kv,
    }
    return f"vllm serve m --kv-transfer-config '{json.dumps(config)}' " + " ".join(flags)


def vllm_errors(prefill: str, decode: str, **opts: object) -> dict[str, Finding]:
    return errors_of(decide(from_commands(prefill, decode, CheckerOptions(**opts))).findings)  # type: ignore[arg-type]


SIZED = ("--max-model-len 8192", "--num-gpu-blocks-override 1025")


def test_a_symmetric_vllm_pair_is_safe() -> None:
    assert vllm_errors(vllm_cmd("prefill", *SIZED), vllm_cmd("decode", *SIZED)) == {}


def test_a_vllm_pool_below_max_model_len_will_not_start() -> None:
    found = vllm_errors(
        vllm_cmd("prefill", "--max-model-len 8192", "--num-gpu-blocks-override 100"),
        vllm_cmd("decode", *SIZED),
    )
    assert set(found) == {"prefill-startup-check-fails"}
    assert "--max-model-len" in found["prefill-startup-check-fails"].flags


def test_vllm_recompute_on_decode_and_wrong_roles_are_errors() -> None:
    found = vllm_errors(
        vllm_cmd("prefill", *SIZED, kv_role="kv_consumer"),
        vllm_cmd("decode", *SIZED, kv_load_failure_policy="recompute"),
    )
    assert set(found) == {"prefill-kv-role-wrong", "decode-load-failure-recompute"}


def test_a_vllm_lease_shorter_than_decode_queueing_is_an_error() -> None:
    found = vllm_errors(
        vllm_cmd("prefill", *SIZED, kv_connector_extra_config={"kv_lease_duration": 10}),
        vllm_cmd("decode", *SIZED),
        max_decode_queueing_s=20,
    )
    assert set(found) == {"lease-shorter-than-decode-queueing"}


def test_vllm_block_size_mismatch_is_an_error() -> None:
    found = vllm_errors(vllm_cmd("prefill", *SIZED, "--block-size 32"), vllm_cmd("decode", *SIZED))
    assert set(found) == {"block-size-mismatch"}


def test_vllm_batched_tokens_below_max_model_len_without_chunking_will_not_start() -> None:
    found = vllm_errors(
        vllm_cmd("prefill", *SIZED, "--no-enable-chunked-prefill --max-num-batched-tokens 2048"),
        vllm_cmd("decode", *SIZED),
    )
    assert set(found) == {"prefill-batched-tokens-below-max-model-len"}


def test_a_context_length_beyond_the_models_window_will_not_start_without_the_override() -> None:
    def check(*env: str) -> set[str]:
        d = from_commands(
            incident_cmd("prefill", FIXED),
            incident_cmd("decode", 2_097_152),
            CheckerOptions(model_context_length=202_752, env=list(env)),
        )
        return set(errors_of(decide(d).findings))

    assert check() == {"prefill-context-beyond-model", "decode-context-beyond-model"}
    assert check("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1") == set()
