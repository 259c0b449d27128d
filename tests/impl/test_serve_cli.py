"""`kvhandoff serve` and `kvhandoff generate` from the command line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvhandoff.cli.main import main
from tests.schema_check import assert_matches_schema

ROOT = Path(__file__).resolve().parents[2]


def kvhandoff(*args: str) -> list[str]:
    return [
        sys.executable,
        "-c",
        "import sys; from kvhandoff.cli.main import main; sys.exit(main())",
        *args,
    ]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    return e


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, object]]]:
    proc = subprocess.Popen(
        kvhandoff(
            "serve",
            "all",
            "--mode",
            "incident",
            "--device",
            "cpu",
            "--json",
            "--log-dir",
            str(tmp_path / "logs"),
            "--state-dir",
            str(tmp_path / "state"),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else "no output"
    yield proc, json.loads(line)
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def test_serve_all_prints_addresses_and_incident_shaped_limits_then_stops_on_sigterm(
    served: tuple[subprocess.Popen[str], dict[str, object]], tmp_path: Path
) -> None:
    proc, info = served
    assert set(info) == {"schema", "router", "prefill", "decode", "limits", "pki"}
    assert info["schema"] == "kvhandoff.serve-all/1"
    assert info["pki"] and Path(str(info["pki"]), "ca.crt").is_file()  # throwaway CA
    limits = info["limits"]
    assert isinstance(limits, dict)
    assert limits["context_window"] > limits["prefill_max_prompt"]
    assert limits["decode_max_prompt"] > limits["prefill_max_prompt"]
    tokens = tmp_path / "tokens.txt"
    tokens.write_text(" ".join(["65"] * 10))
    out = subprocess.run(
        kvhandoff(
            "generate",
            "--router",
            str(info["router"]),
            "--tenant",
            "A",
            "--pki-dir",
            str(info["pki"]),
            "--prompt-tokens",
            str(tokens),
            "--max-tokens",
            "6",
            "--json",
        ),
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["status"] == "ok" and answer["tokens"] == [65] * 6 and answer["text"] == "AAAAAA"
    assert set(answer) >= {"request_id", "tenant", "status", "error", "tokens", "text"}
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert (tmp_path / "logs" / "decode.jsonl").exists()
    assert not Path(str(info["pki"])).exists()  # the throwaway CA goes with the servers


def test_generate_reports_a_clear_error_with_exit_1(
    served: tuple[subprocess.Popen[str], dict[str, object]],
) -> None:
    _, info = served
    out = subprocess.run(
        kvhandoff(
            "generate",
            "--router",
            str(info["router"]),
            "--tenant",
            "A",
            "--pki-dir",
            str(info["pki"]),
            "--prompt",
            "x" * 5000,
            "--json",
        ),
        capture_output=True,
        text=True,
        env=env(),
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 1
    answer = json.loads(out.stdout)
    assert answer["status"] == "error" and "5000" in answer["error"]


def test_an_unknown_mode_is_exit_2_listing_the_modes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "all", "--mode", "m99"]) == 2
    err = capsys.readouterr().err
    assert "m99" in err and "reference" in err and "m20_unscrubbed_pages" in err


def test_bad_prompt_tokens_are_exit_2_naming_the_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "t.txt"
    f.write_text("1 2 banana")
    assert (
        main(["generate", "--router", "127.0.0.1:1", "--tenant", "t", "--prompt-tokens", str(f)])
        == 2
    )
    assert "banana" in capsys.readouterr().err
    f.write_text("1 999")
    assert (
        main(["generate", "--router", "127.0.0.1:1", "--tenant", "t", "--prompt-tokens", str(f)])
        == 2
    )
    assert "999" in capsys.readouterr().err


def test_a_non_utf8_prompt_or_binary_prompt_file_is_exit_2_naming_the_byte(
    tmp_path: Path,
) -> None:
    # A real process: a non-UTF-8 argv reaches Python as surrogates, as it does from a shell.
    bad_arg = os.fsdecode(b"caf\xe9")
    run = subprocess.run(
        kvhandoff("generate", "--router", "127.0.0.1:1", "--tenant", "t", "--prompt", bad_arg),
        capture_output=True,
        text=True,
        env=env(),
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert "--prompt is not UTF-8 text: byte 0xe9 at offset 3" in run.stderr
    assert "Traceback" not in run.stderr
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\x7fELF\x02\x01\x00\x00\xff")
    for flag in ("--prompt-file", "--prompt-tokens"):
        run = subprocess.run(
            kvhandoff("generate", "--router", "127.0.0.1:1", "--tenant", "t", flag, str(binary)),
            capture_output=True,
            text=True,
            env=env(),
            timeout=60,
        )
        assert run.returncode == 2, run.stderr
        assert "blob.bin" in run.stderr and "byte 0xff at offset 8" in run.stderr


def test_a_single_role_needs_a_security_choice_and_insecure_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "decode", "--prefill", "127.0.0.1:1"]) == 2
    assert "needs --pki-dir DIR" in capsys.readouterr().err
    assert main(["serve", "all", "--insecure", "--pki-dir", "x"]) == 2
    assert "exclude each other" in capsys.readouterr().err
    proc = subprocess.Popen(
        kvhandoff("serve", "all", "--insecure", "--device", "cpu", "--json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        info = json.loads(proc.stdout.readline())
        assert info["pki"] is None
        # (torch may warn first on stderr)
        assert any("INSECURE" in proc.stderr.readline() for _ in range(10))
        from kvhandoff.impl.client import Client

        with Client(str(info["router"])) as c:
            assert c.generate("t", [72, 105], 2).text == "Hi"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_a_single_role_needs_its_peers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "decode"]) == 2
    assert "--prefill" in capsys.readouterr().err


def test_each_role_serves_as_its_own_process(tmp_path: Path) -> None:
    import socket
    import urllib.request

    from kvhandoff.impl.client import Client
    from kvhandoff.impl.tls import Pki

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    pp, dp = free_port(), free_port()
    roles = [
        ("prefill", "--port", str(pp), "--decode", f"127.0.0.1:{dp}"),
        (
            "decode",
            "--port",
            str(dp),
            "--prefill",
            f"127.0.0.1:{pp}",
            "--metrics-port",
            "0",
            "--state-dir",
            str(tmp_path / "state"),
        ),
        ("router", "--prefill", f"127.0.0.1:{pp}", "--decode", f"127.0.0.1:{dp}"),
    ]
    pki = tmp_path / "pki"  # one CA for the three processes, created by the first
    Pki.open(pki)
    procs: list[subprocess.Popen[str]] = []
    infos: dict[str, dict[str, object]] = {}
    try:
        for role, *flags in roles:
            proc = subprocess.Popen(
                kvhandoff(
                    "serve", role, "--device", "cpu", "--json", "--pki-dir", str(pki), *flags
                ),
                stdout=subprocess.PIPE,
                text=True,
                env=env(),
                cwd=ROOT,
            )
            procs.append(proc)
            assert proc.stdout is not None
            infos[role] = json.loads(proc.stdout.readline())
            assert_matches_schema("serve", infos[role])
        with Client(str(infos["router"]["router"]), Pki(pki).issue("client", "t")) as c:
            result = c.generate("t", [72, 105, 33], 3)
        assert result.status == "ok" and result.text == "Hi!"
        metrics = (
            urllib.request.urlopen(f"http://{infos['decode']['metrics']}/metrics", timeout=5)
            .read()
            .decode()
        )
        assert 'kvhandoff_pages_used{server="decode"} 0' in metrics
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert [proc.wait(20) for proc in procs] == [0, 0, 0]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


def test_prompt_text_and_prompt_files_use_the_byte_tokenizer(tmp_path: Path) -> None:
    import argparse

    from kvhandoff.cli.cmd_serve import _read_prompt

    f = tmp_path / "p.txt"
    f.write_text("hé")
    from_file = argparse.Namespace(prompt=None, prompt_file=f, prompt_tokens=None)
    from_text = argparse.Namespace(prompt="hé", prompt_file=None, prompt_tokens=None)
    assert _read_prompt(from_file) == _read_prompt(from_text) == [104, 195, 169]


def _serve_all_json(*extra: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """`serve all --insecure --json --metrics-port 0` with `extra` options, started, and the line
    it printed (checked against its schema)."""
    args = ["serve", "all", "--device", "cpu", "--json", "--metrics-port", "0", "--insecure"]
    proc = subprocess.Popen(
        kvhandoff(*args, *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=ROOT,
    )
    assert proc.stdout is not None
    info = json.loads(proc.stdout.readline())
    assert_matches_schema("serve-all", info)
    return proc, info


def test_serve_all_json_prints_each_servers_metrics_address(tmp_path: Path) -> None:
    import urllib.request

    from kvhandoff.impl.client import Client

    proc, info = _serve_all_json("--state-dir", str(tmp_path / "state"))
    try:
        metrics = info["metrics"]
        assert set(metrics) == {"router", "prefill", "decode"}
        assert len({a.rsplit(":", 1)[1] for a in metrics.values()}) == 3
        with Client(str(info["router"])) as c:
            assert c.generate("t", [72, 105, 33], 3).status == "ok"
        body = (
            urllib.request.urlopen(f"http://{metrics['router']}/metrics", timeout=5).read().decode()
        )
        assert 'kvhandoff_requests_total{code="OK",server="router",status="ok"} 1' in body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    # Three servers cannot share one fixed port.
    assert main(["serve", "all", "--metrics-port", "9100"]) == 2


def test_a_short_log_key_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "key"
    key.write_bytes(b"short")
    assert main(["serve", "all", "--log-key-file", str(key)]) == 2
    assert "holds 5 bytes; a log key needs at least 16" in capsys.readouterr().err


def test_serve_all_starts_several_instances_of_each_worker(tmp_path: Path) -> None:
    proc, info = _serve_all_json("--prefill-instances", "2", "--decode-instances", "3")
    try:
        assert len(info["prefills"]) == 2 and len(info["decodes"]) == 3
        assert set(info["metrics"]) == {
            "router",
            "prefill",
            "prefill1",
            "decode",
            "decode1",
            "decode2",
        }
        assert info["prefill"] == info["prefills"][0] and info["decode"] == info["decodes"][0]
        assert all(a.startswith("127.0.0.1:") for a in info["prefills"] + info["decodes"])
        from kvhandoff.impl.client import Client

        with Client(str(info["router"])) as c:
            assert [c.generate("t", [72, 105], 2).text for _ in range(4)] == ["Hi"] * 4
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["serve", "prefill", "--insecure", "--decode", "127.0.0.1:1,localhost"],
            "'localhost' is not HOST:PORT (several instances: comma-separated",
        ),
        (
            [
                "serve",
                "decode",
                "--insecure",
                "--prefill",
                "127.0.0.1:1",
                "--decode-instances",
                "2",
            ],
            "start one server per instance and list their addresses",
        ),
        (
            ["serve", "decode", "--insecure", "--prefill", "127.0.0.1:1", "--instance", "-1"],
            "--instance -1: a prefill or decode instance number is >= 0",
        ),
        (
            ["serve", "all", "--insecure", "--prefill-instances", "0"],
            "prefill_instances=0: a cluster runs 1..16 instances of a role",
        ),
    ],
)
def test_bad_instance_options_are_exit_2_naming_the_value(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err
