"""Real SGLang and vLLM command lines are read tolerantly; modelled flags are read strictly."""

from __future__ import annotations

import json

import pytest
from deploy_helpers import sglang

from kvhandoff.model_checker.deployment import CheckerOptions, ConfigInputError, from_commands
from kvhandoff.model_checker.deployment.cmdline import parse_command
from kvhandoff.model_checker.deployment.model import Engine, Setting

DECODE = sglang("decode", "--context-length 32768 --max-total-tokens 65536")
PREFILL = sglang("prefill", "--context-length 32768 --max-total-tokens 65536")


def vllm(role: str, *flags: str, kv: dict[str, object] | None = None) -> str:
    config = kv or {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
    }
    return " ".join(
        [
            "vllm serve meta-llama/Llama-3.1-8B-Instruct --port 8100 --enforce-eager",
            f"--kv-transfer-config '{json.dumps(config)}'",
            *flags,
        ]
    )


def input_error(prefill: str, decode: str, **opts: object) -> ConfigInputError:
    with pytest.raises(ConfigInputError) as info:
        from_commands(prefill, decode, CheckerOptions(**opts))  # type: ignore[arg-type]
    return info.value


def test_unmodelled_flags_with_and_without_values_are_skipped() -> None:
    cmd = parse_command(
        sglang("prefill", "--enable-metrics --watchdog-timeout 600 --context-length=4096"),
        "--prefill",
    )
    assert cmd.engine is Engine.SGLANG
    assert cmd.values["context_length"] == (4096, "--context-length")
    assert {"--trust-remote-code", "--enable-metrics", "--watchdog-timeout"} <= set(cmd.ignored)


def test_leading_environment_words_become_the_servers_environment() -> None:
    d = from_commands(
        "env SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=900 " + PREFILL, DECODE, CheckerOptions()
    )
    assert d.prefill.bootstrap_timeout_s.value == 900.0
    assert d.prefill.bootstrap_timeout_s.source.startswith(
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"
    )


def test_per_role_env_options_override_the_command_line() -> None:
    d = from_commands(
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT=100 " + PREFILL,
        DECODE,
        CheckerOptions(decode_env=["SGLANG_DISAGGREGATION_WAITING_TIMEOUT=450"]),
    )
    assert d.decode.waiting_timeout_s.value == 450.0
    assert d.prefill.waiting_timeout_s.value == 100.0


@pytest.mark.parametrize(
    ("extra", "flag", "value"),
    [
        ("--page-size abc", "--page-size", "abc"),
        ("--context-length -5", "--context-length", "-5"),
        ("--max-total-tokens 12.5", "--max-total-tokens", "12.5"),
        ("--chunked-prefill-size 0", "--chunked-prefill-size", "0"),
        ("--disaggregation-transfer-backend rdma", "--disaggregation-transfer-backend", "rdma"),
        ("--mem-fraction-static 1.5", "--mem-fraction-static", "1.5"),
    ],
)
def test_a_malformed_value_of_a_modelled_flag_names_the_flag_and_value(
    extra: str, flag: str, value: str
) -> None:
    err = input_error(sglang("prefill", "--max-total-tokens 65536", extra), DECODE)
    assert (err.flag, err.value) == (flag, value)
    assert flag in str(err) and repr(value) in str(err)


def test_a_modelled_flag_without_its_value_is_an_error() -> None:
    err = input_error(sglang("prefill", "--max-total-tokens 65536 --page-size"), DECODE)
    assert err.flag == "--page-size" and "missing value" in str(err)
    err = input_error(sglang("prefill", "--page-size --max-total-tokens 65536"), DECODE)
    assert err.flag == "--page-size"


def test_a_flag_given_twice_with_different_values_is_contradictory() -> None:
    err = input_error(PREFILL + " --context-length 8192", DECODE)
    assert err.flag == "--context-length" and "twice" in str(err)


def test_the_wrong_disaggregation_mode_is_contradictory() -> None:
    err = input_error(DECODE, DECODE)
    assert err.flag == "--disaggregation-mode" and err.value == "decode"


def test_an_unknown_launcher_is_rejected() -> None:
    err = input_error("python serve.py --context-length 10", DECODE)
    assert err.flag == "--prefill" and "not an SGLang or vLLM launch command" in str(err)


def test_unbalanced_quotes_are_reported() -> None:
    err = input_error(PREFILL + " --kv-cache-dtype 'fp8", DECODE)
    assert err.flag == "--prefill" and "cannot split" in str(err)


def test_an_undeterminable_pool_says_which_option_to_give() -> None:
    err = input_error(sglang("prefill", "--context-length 32768"), DECODE)
    assert err.flag == "--prefill-pool-tokens"
    assert "--max-total-tokens" in str(err) and "GPU memory" in str(err)


def test_the_profiled_pool_and_the_cap_combine_as_sglang_does() -> None:
    d = from_commands(
        sglang("prefill", "--context-length 32768 --max-total-tokens 65536 --page-size 64"),
        DECODE,
        CheckerOptions(prefill_pool_tokens=50_000),
    )
    # min(profiled 50,000, cap 65,536), rounded down to a whole number of 64-token pages.
    assert d.prefill.pool_tokens.value == 49_984
    assert d.prefill.pool_tokens.source == "--prefill-pool-tokens"
    assert any("rounds it down to 49,984" in n for n in d.prefill.notes)


def test_a_missing_context_length_needs_the_models_window() -> None:
    err = input_error(sglang("prefill", "--max-total-tokens 65536"), DECODE)
    assert err.flag == "--context-length"
    d = from_commands(
        sglang("prefill", "--max-total-tokens 65536"),
        DECODE,
        CheckerOptions(model_context_length=32768),
    )
    assert d.prefill.context_length == Setting(32768, "--model-context-length")


def test_vllm_serve_with_blocks_override_and_human_readable_length() -> None:
    d = from_commands(
        vllm("prefill", "--max-model-len 32k --num-gpu-blocks-override 2049 --block-size 16"),
        vllm("decode", "--max-model-len 32000 --num-gpu-blocks-override 4097"),
        CheckerOptions(),
    )
    assert d.engine is Engine.VLLM
    assert d.prefill.context_length.value == 32_000
    # One block is vLLM's null block.
    assert d.prefill.pool_tokens.value == 2048 * 16
    assert d.decode.kv_role.value == "kv_consumer"


def test_vllm_max_model_len_minus_one_auto_fits_the_pool() -> None:
    d = from_commands(
        vllm("prefill", "--max-model-len -1 --num-gpu-blocks-override 101"),
        vllm("decode", "--max-model-len -1 --num-gpu-blocks-override 101"),
        CheckerOptions(),
    )
    assert d.prefill.context_length.value == 1600


def test_vllm_blocks_override_and_explicit_pool_contradict() -> None:
    err = input_error(
        vllm("prefill", "--max-model-len 1000 --num-gpu-blocks-override 101"),
        vllm("decode", "--max-model-len 1000 --num-gpu-blocks-override 101"),
        prefill_pool_tokens=5000,
    )
    assert err.flag == "--prefill-pool-tokens" and "drop one" in str(err)


def test_vllm_malformed_kv_transfer_config_names_the_flag() -> None:
    bad = "vllm serve m --max-model-len 1000 --num-gpu-blocks-override 101 --kv-transfer-config '{nope'"
    err = input_error(bad, vllm("decode", "--max-model-len 1000 --num-gpu-blocks-override 101"))
    assert err.flag == "--kv-transfer-config" and "JSON" in str(err)


def test_vllm_without_kv_transfer_config_is_not_disaggregated() -> None:
    err = input_error(
        "vllm serve m --max-model-len 1000 --num-gpu-blocks-override 101",
        vllm("decode", "--max-model-len 1000 --num-gpu-blocks-override 101"),
    )
    assert err.flag == "--kv-transfer-config" and "missing" in str(err)


def test_mixing_engines_is_refused() -> None:
    err = input_error(PREFILL, vllm("decode", "--max-model-len 1000 --num-gpu-blocks-override 101"))
    assert err.flag == "--decode" and "SGLang" in str(err) and "vLLM" in str(err)


def test_a_malformed_environment_value_names_the_variable() -> None:
    err = input_error(PREFILL, DECODE, env=["SGLANG_DISAGGREGATION_WAITING_TIMEOUT=soon"])
    assert (err.flag, err.value) == ("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "soon")
    err = input_error(PREFILL, DECODE, env=["JUSTAKEY"])
    assert err.flag == "--env"


def test_env_and_role_env_that_disagree_are_contradictory() -> None:
    err = input_error(
        PREFILL,
        DECODE,
        env=["SGLANG_DISAGGREGATION_WAITING_TIMEOUT=300"],
        decode_env=["SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600"],
    )
    assert "contradicts" in str(err)


def test_env_can_be_scoped_to_one_role() -> None:
    d = from_commands(
        PREFILL,
        DECODE,
        CheckerOptions(env=["decode:SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600"]),
    )
    assert d.decode.waiting_timeout_s.value == 600.0
    assert d.prefill.waiting_timeout_s.is_default


def test_a_router_window_of_one_token_admits_nothing_and_is_refused() -> None:
    err = input_error(PREFILL, DECODE, router_window=1)
    assert err.flag == "--context-window"


def test_a_wrapper_before_the_launcher_is_skipped() -> None:
    cmd = parse_command("numactl --interleave=all uv run " + PREFILL, "--prefill")
    assert cmd.engine is Engine.SGLANG
    assert cmd.values["max_total_tokens"] == (65536, "--max-total-tokens")
    api = parse_command(
        "python3.11 -m vllm.entrypoints.openai.api_server --model m --max-model-len 4096",
        "--decode",
    )
    assert api.engine is Engine.VLLM and api.values["context_length"] == (4096, "--max-model-len")
