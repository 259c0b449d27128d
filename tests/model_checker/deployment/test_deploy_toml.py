"""The neutral TOML format describes the same deployments, and refuses what it does not know."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvhandoff.model_checker.deployment import ConfigInputError, decide, from_toml
from kvhandoff.model_checker.deployment.model import Engine

EXAMPLE = Path(__file__).parents[3] / "docs" / "examples" / "incident.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deployment.toml"
    path.write_text(text, encoding="utf-8")
    return path


def fixed(pool: int) -> str:
    return EXAMPLE.read_text(encoding="utf-8").replace(
        "pool_tokens = 681280", f"pool_tokens = {pool}"
    )


def test_the_documented_incident_file_is_unsafe_at_the_incident_boundary() -> None:
    d = decide(from_toml(EXAMPLE))
    leak = [f for f in d.findings if f.leak]
    assert len(leak) == 1 and leak[0].lengths is not None
    assert (leak[0].lengths.lo, leak[0].lengths.hi) == (681_274, 1_048_569)
    assert d.deployment.prefill.page_size.source == "[deployment] page_size"


def test_the_incident_file_with_the_pool_fixed_is_safe(tmp_path: Path) -> None:
    assert decide(from_toml(write(tmp_path, fixed(1_048_576)))).safe


def test_a_role_table_overrides_the_deployment_table(tmp_path: Path) -> None:
    text = fixed(1_048_576).replace("[decode]\n", "[decode]\npage_size = 32\n")
    d = decide(from_toml(write(tmp_path, text)))
    assert [f.code for f in d.findings if f.severity == "error"] == ["page-size-mismatch"]
    assert "[decode] page_size" in d.findings[0].flags


def test_vllm_in_toml(tmp_path: Path) -> None:
    text = """
[deployment]
engine = "vllm"
kv_connector = "NixlConnector"
[prefill]
context_length = 8192
pool_tokens = 100000
kv_role = "kv_producer"
[decode]
context_length = 8192
pool_tokens = 100000
kv_role = "kv_consumer"
"""
    d = decide(from_toml(write(tmp_path, text)))
    assert d.deployment.engine is Engine.VLLM
    assert d.safe


@pytest.mark.parametrize(
    ("edit", "flag"),
    [
        (("[prefill]\n", "[prefill]\npool_tokenz = 5\n"), "[prefill] pool_tokenz"),
        (("pool_tokens = 681280", 'pool_tokens = "lots"'), "[prefill] pool_tokens"),
        (("pool_tokens = 681280", "pool_tokens = true"), "[prefill] pool_tokens"),
        (("pool_tokens = 681280", "pool_tokens = -1"), "[prefill] pool_tokens"),
        (("pool_tokens = 681280", "# pool left out"), "[prefill] pool_tokens"),
        (('engine = "sglang"', 'engine = "trt"'), "[deployment] engine"),
        (('version = "0.5.11"', 'version = "0.4"'), "[deployment] version"),
        (
            ('transfer_backend = "mooncake"', 'transfer_backend = "tcp"'),
            "[deployment] transfer_backend",
        ),
        (("waiting_timeout_s = 300", "waiting_timeout_s = -3"), "[decode] waiting_timeout_s"),
        (("[decode]", "[decoder]"), "[decoder]"),
        (("page_size = 64", "page_size = [64]"), "[deployment] page_size"),
    ],
)
def test_bad_toml_names_the_key(tmp_path: Path, edit: tuple[str, str], flag: str) -> None:
    text = EXAMPLE.read_text(encoding="utf-8").replace(*edit)
    with pytest.raises(ConfigInputError) as info:
        from_toml(write(tmp_path, text))
    assert info.value.flag == flag


def test_a_file_that_is_not_toml_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigInputError, match="not valid TOML"):
        from_toml(write(tmp_path, "[deployment\nengine = 1"))
    with pytest.raises(ConfigInputError, match="cannot read"):
        from_toml(tmp_path / "missing.toml")
