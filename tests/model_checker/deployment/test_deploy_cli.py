"""`kvhandoff check-config`: exit codes, JSON, errors that name the flag, and the protocol bridge."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import z3
from deploy_helpers import incident, sglang

import kvhandoff.model_checker.deployment.decision as decision_module
from kvhandoff.cli.main import main
from kvhandoff.model_checker.deployment import decide
from kvhandoff.model_checker.deployment.bridge import (
    build_spec_config,
    protocol_variant,
    to_protocol_config,
)

MODULES = ["kvhandoff.cli.cmd_check_config"]
EXAMPLE = Path(__file__).parents[3] / "docs" / "examples" / "incident.toml"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["check-config", *argv], modules=MODULES)
    out, err = capsys.readouterr()
    return code, out, err


def incident_args(prefill_pool: int = 681_280) -> list[str]:
    return [
        "--prefill",
        sglang("prefill", "--context-length 1048576", f"--max-total-tokens {prefill_pool}"),
        "--decode",
        sglang("decode", "--context-length 1048576 --max-total-tokens 2097152"),
        "--sglang-version",
        "0.5.11",
    ]


def test_the_incident_exits_1_and_names_the_boundary(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *incident_args())
    assert code == 1
    assert out.startswith("kvhandoff check-config: UNSAFE (exit 1)")
    assert "prompts of 681,274 to 1,048,569 tokens" in out
    assert "kvhandoff check --variant incident" in out


def test_the_fixed_pool_exits_0_with_a_proof(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *incident_args(1_048_576))
    assert code == 0
    assert "SAFE (exit 0)" in out and "proved by Z3" in out


def test_json_carries_the_verdict_the_ranges_and_the_protocol_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, *incident_args(), "--json")
    doc = json.loads(out)
    assert (code, doc["verdict"], doc["exit_code"]) == (1, "unsafe", 1)
    leak = next(f for f in doc["findings"] if f["leak"])
    assert leak["lengths"] == {"lo": 681_274, "hi": 1_048_569, "contiguous": True, "count": 367_296}
    assert doc["roles"]["prefill"]["scheduler_limit"] == 681_274
    assert doc["protocol"]["variant"] == "incident"


def test_a_toml_file_is_checked_like_command_lines(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--config", str(EXAMPLE))
    assert code == 1 and "prompts of 681,274 to 1,048,569 tokens" in out


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--prefill", sglang("prefill", "--page-size abc")], "--page-size"),
        (["--config", str(EXAMPLE), "--prefill-pool-tokens", "5"], "--prefill-pool-tokens"),
        (["--decode", "x"], "--prefill"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    if argv[0] == "--prefill":
        argv = [*argv, "--decode", sglang("decode", "--context-length 10 --max-total-tokens 99")]
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith(f"kvhandoff check-config: error: {named}")


def test_a_non_numeric_checker_option_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run(capsys, *incident_args(), "--prefill-pool-tokens", "lots")
    assert info.value.code == 2
    assert "--prefill-pool-tokens" in capsys.readouterr().err


def test_z3_unknown_exits_3(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decision_module, "_check", lambda solver: z3.unknown)
    code, out, err = run(capsys, *incident_args(1_048_576))
    assert (code, out) == (3, "")
    assert "INCONCLUSIVE" in err


def test_the_bridge_scales_the_incident_to_a_two_page_leak() -> None:
    d = decide(incident())
    pairs = to_protocol_config(d.deployment, d.findings)
    assert pairs == {
        "page_size": "681273",  # one model page = the longest prompt prefill serves whole
        "context_window": "2",
        "prefill_max_prompt": "1",
        "decode_max_prompt": "2",
        "prefill_pool_pages": "1",
        "decode_pages": "3",
        "requests": "a:1:1,b:2:2",
    }
    assert protocol_variant(d.findings) == "incident"


def test_the_bridge_builds_a_spec_config_when_the_spec_provides_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    @dataclass(frozen=True)
    class RequestSpec:
        tenant: str
        pages: int
        room: int

    @dataclass(frozen=True)
    class Config:
        decode_pages: int
        page_size: int
        context_window: int
        prefill_max_prompt: int
        decode_max_prompt: int
        prefill_pool_pages: int
        requests: tuple[RequestSpec, ...]

    fake = types.ModuleType("spec")
    fake.Config = Config  # type: ignore[attr-defined]
    fake.RequestSpec = RequestSpec  # type: ignore[attr-defined]
    # The bridge imports the namespace's spec: the package attribute wins over sys.modules once
    # kvhandoff.spec has been imported, so both are replaced.
    import kvhandoff

    monkeypatch.setitem(sys.modules, "kvhandoff.spec", fake)
    monkeypatch.setattr(kvhandoff, "spec", fake, raising=False)
    d = decide(incident())
    config = build_spec_config(to_protocol_config(d.deployment, d.findings))
    assert isinstance(config, Config)
    assert config.requests == (RequestSpec("a", 1, 1), RequestSpec("b", 2, 2))
    assert config.prefill_max_prompt < config.decode_max_prompt


def test_the_bridge_agrees_with_the_specs_deployment_properties() -> None:
    """Runs once the protocol model (spec/, written separately) provides its deployment checks."""
    spec = pytest.importorskip("kvhandoff.spec")
    if not hasattr(spec, "parse_set") or not hasattr(spec, "DEPLOYMENT"):
        pytest.skip("this checkout's spec/ does not provide parse_set and DEPLOYMENT yet")
    for pool, holds in ((681_280, False), (1_048_576, True)):
        d = decide(incident(prefill_pool=pool))
        config = build_spec_config(to_protocol_config(d.deployment, d.findings))
        assert config is not None
        assert {name: check(config) for name, check in spec.DEPLOYMENT} == {
            "context_window_fits_pools": holds,
            "prefill_admits_everything_decode_admits": holds,
        }


def test_run_protocol_check_runs_kvhandoff_check_on_the_scaled_model(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, list[str]]] = []

    def register(subparsers: Any) -> None:
        p = subparsers.add_parser("check")
        p.add_argument("--variant")
        p.add_argument("--set", action="append", default=[])
        p.set_defaults(func=lambda args: seen.append((args.variant, args.set)) or 1)

    fake = types.ModuleType("kvhandoff.cli.cmd_check")
    fake.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kvhandoff.cli.cmd_check", fake)
    code, out, _ = run(capsys, *incident_args(), "--run-protocol-check")
    assert code == 1  # the deployment's verdict, not the protocol check's
    assert seen == [("incident", [f"{k}={v}" for k, v in _incident_pairs().items()])]
    assert "(kvhandoff check exited 1)" in out


def test_run_protocol_check_without_kvhandoff_check_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "kvhandoff.cli.cmd_check", None)
    code, out, _ = run(capsys, *incident_args(1_048_576), "--run-protocol-check")
    assert code == 0
    assert "kvhandoff check is not available in this checkout" in out


def _incident_pairs() -> dict[str, str]:
    d = decide(incident())
    return to_protocol_config(d.deployment, d.findings)
