"""The suite drives an engine through the harness service (`--target HOST:PORT`) exactly as it
drives a local target: the reference conforms, the incident diverges and leaks, bad addresses
and bad requests get clear errors, and the server keeps serving. Servers listen on loopback
only, on ports the OS picks, and are stopped by the tests."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from kvhandoff.cli.main import main
from kvhandoff.conformance import campaign
from kvhandoff.conformance.harness_server import HarnessServer, serve
from kvhandoff.conformance.inproc import InProcTarget
from kvhandoff.conformance.proto.rpc import harness_stub, pb
from kvhandoff.conformance.remote_target import (
    HarnessBroken,
    HarnessUnreachable,
    RemoteTarget,
    parse_address,
)
from kvhandoff.conformance.replay import incident_counterexample, replay_trace
from kvhandoff.conformance.target import Event, Target, TargetAnswer
from kvhandoff.spec.config import Config, default_config
from kvhandoff.spec.trace import dump_trace

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def stub(inproc_server: HarnessServer) -> Iterator[Any]:
    with grpc.insecure_channel(inproc_server.address) as channel:
        yield harness_stub(channel)


# ------------------------------------------------------------------ verdicts through HOST:PORT


def test_reference_conforms_through_the_harness_service(
    inproc_server: HarnessServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["conform", "--target", inproc_server.address, "--traces", "25", "--seed", "3"]
    code = main([*argv, "--json", "--out", str(tmp_path)])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    # Hypothesis runs the examples it discards too: at least the 25 asked for.
    assert out["verdict"] == "conforms" and out["traces"] >= 25
    assert out["target"] == inproc_server.address and out["not_covered"] == {}


def test_the_service_adds_transport_not_behaviour(
    inproc_server: HarnessServer, tmp_path: Path
) -> None:
    # The same seed draws the same programs through the service as in-process: every step the
    # spec chose was explained the same way on both sides.
    remote = campaign.run(inproc_server.address, "reference", traces=20, seed=5, out_dir=tmp_path)
    local = campaign.run("inproc", "reference", traces=20, seed=5, out_dir=tmp_path)
    assert remote.verdict == local.verdict == "conforms"
    assert remote.step_count == local.step_count > 20
    assert remote.coverage is not None and local.coverage is not None
    assert remote.coverage.probes == local.coverage.probes  # forged messages, through Probe


def test_incident_diverges_through_the_harness_service_and_the_failure_replays(
    inproc_server: HarnessServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["conform", "--target", inproc_server.address, "--mode", "incident", "--traces", "100"]
    assert main([*argv, "--json", "--out", str(tmp_path)]) == 1
    failure = json.loads(capsys.readouterr().out)["failures"][0]
    assert Path(failure["trace_file"]).exists()
    assert failure["trace_file"].startswith(str(tmp_path / "conform-127.0.0.1_"))
    # The shrunk program reproduces through the service, and the reference mode passes it.
    replay = ["replay", failure["trace_file"], "--target", inproc_server.address]
    assert main([*replay, "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["verdict"] == "diverges"
    assert main([*replay, "--mode", "reference"]) == 0


def test_replaying_the_incident_through_the_harness_service_leaks_the_canary(
    inproc_server: HarnessServer,
) -> None:
    target = RemoteTarget(inproc_server.address)
    try:
        report = replay_trace(incident_counterexample(), target, mode="incident")
    finally:
        target.shutdown()
    assert report.verdict == "diverges"
    assert report.leaks == [("r1", "r0")]  # tenant b's answer carries tenant a's canary
    assert report.answers["r1"]["ok"] and report.answers["r1"]["tenant"] == "b"
    assert report.first_divergence is not None
    assert target.name == f"inproc at {inproc_server.address}"


def test_the_real_servers_behind_the_harness_service_leak_and_conform_coarsely(
    tmp_path: Path,
) -> None:
    server = serve("127.0.0.1:0", "grpc")
    try:
        target = RemoteTarget(server.address)
        assert not target.fine_grained  # the gRPC cluster is a coarse target
        report = replay_trace(incident_counterexample(), target, mode="incident")
        assert report.verdict == "diverges"
        reader, writer = report.leaks[0]
        assert reader.endswith("r1") and writer.endswith("r0")
        target.shutdown()
        run = campaign.run(server.address, "reference", traces=5, steps=20, out_dir=tmp_path)
        assert run.verdict == "conforms", run.failures
        assert run.traces == 5
        # The gRPC target's adversarial rounds need its cluster: through the service there are
        # none, and the report says so.
        assert "decode's integrity checks" in run.not_covered["adversarial rounds"]
    finally:
        server.stop()


# ------------------------------------------------------------------ addresses


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("localhost:http", "port 'http' is not a number in 1..65535"),
        (":50061", "expected HOST:PORT"),
        ("127.0.0.1:70000", "port '70000' is not a number in 1..65535"),
        ("http://127.0.0.1:50061", "without a scheme"),
        ("::1:50061", "an IPv6 host goes in brackets"),
        ("bad host:1", "'bad host' is not a host name or IPv4 address"),
    ],
)
def test_a_malformed_address_exits_2_and_says_why(
    target: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["conform", "--target", target]) == 2
    err = capsys.readouterr().err
    assert why in err and repr(target) in err


def test_an_address_where_nothing_listens_exits_3_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    free = serve("127.0.0.1:0", "inproc")
    address = free.address
    free.stop()  # a port that was just free: nothing listens there now
    assert main(["conform", "--target", address]) == 3
    err = capsys.readouterr().err
    assert f"harness service at {address}: Info: no answer (UNAVAILABLE" in err
    assert "kvhandoff harness-serve" in err
    trace = tmp_path / "incident.jsonl"
    counterexample = incident_counterexample()
    trace.write_text(dump_trace(counterexample.config, counterexample.actions))
    assert main(["replay", str(trace), "--target", address]) == 3
    assert f"harness service at {address}: Info: no answer" in capsys.readouterr().err


def test_parse_address_accepts_names_ipv4_and_bracketed_ipv6() -> None:
    assert parse_address("harness.example.internal:50051") == ("harness.example.internal", 50051)
    assert parse_address("[::1]:7") == ("[::1]", 7)
    assert parse_address("127.0.0.1:0", allow_port_zero=True) == ("127.0.0.1", 0)


def test_an_unknown_mode_is_refused_with_the_engines_modes(
    inproc_server: HarnessServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["conform", "--target", inproc_server.address, "--mode", "nope"]) == 2
    err = capsys.readouterr().err
    assert f"the engine at {inproc_server.address} has no mode 'nope'" in err
    assert "m7_release_before_drain" in err


# ------------------------------------------------------------------ bad requests, server survives


def _refused(call: Any, *args: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=10)
    err: Any = info.value
    return err.code(), err.details()


def test_bad_requests_get_clear_statuses_and_the_server_keeps_serving(
    inproc_server: HarnessServer, stub: Any, tmp_path: Path
) -> None:
    config = json.dumps(default_config().to_json())
    # Nothing before Reset.
    code, msg = _refused(stub.Submit, pb.RequestRef(session="x", request=0))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "call Reset first" in msg
    code, msg = _refused(stub.Reset, pb.ResetRequest(config_json="{not json", mode="reference"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "config_json is not JSON" in msg
    code, msg = _refused(stub.Reset, pb.ResetRequest(config_json='{"pages": 1}', mode="reference"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "unknown config keys ['pages']" in msg
    two_ranks = json.dumps({**default_config().to_json(), "prefill_ranks": 2})
    code, msg = _refused(stub.Reset, pb.ResetRequest(config_json=two_ranks, mode="reference"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "prefill_ranks" in msg
    code, msg = _refused(stub.Reset, pb.ResetRequest(config_json=config, mode="nope"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "unknown mode 'nope'; modes:" in msg

    session = stub.Reset(pb.ResetRequest(config_json=config, mode="reference"), timeout=10)
    assert list(session.request_ids) == ["r0", "r1", "r2"]
    s = session.session
    code, msg = _refused(stub.Submit, pb.RequestRef(session=s, request=9))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert msg == "request 9 is out of range: the scenario has 3 requests (0..2)"
    code, msg = _refused(stub.Deliver, pb.DeliverRequest(session=s, kind="teleport", request=0))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "unknown step kind 'teleport'" in msg
    assert "prefill_submit" in msg
    code, msg = _refused(stub.Drop, pb.MessageRef(session=s, kind="write", request=0))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "unknown message kind 'write'" in msg
    code, msg = _refused(stub.Deliver, pb.DeliverRequest(session=s, kind="write", request=0))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "needs a page" in msg

    # A second client's Reset ends the first session: the first client is told, not confused.
    other = stub.Reset(pb.ResetRequest(config_json=config, mode="reference"), timeout=10)
    code, msg = _refused(stub.Settle, pb.SessionRef(session=s))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"session {s!r} is not the current one ({other.session!r})" in msg

    # Still serving: a whole campaign runs after all of that.
    report = campaign.run(inproc_server.address, "reference", traces=5, out_dir=tmp_path)
    assert report.verdict == "conforms"


class _Limited(Target):
    """An engine that cannot lose, duplicate or time out messages: it delegates everything else
    to the in-process target, and leaves those operations at the base class's defaults."""

    name = "limited"
    explode = False  # the test flips it: answers() then fails like a crashed engine

    def __init__(self) -> None:
        self.inner = InProcTarget()

    def start(self, config: Config, mode: str) -> None:
        self.inner.start(config, mode)

    def submit(self, r: int) -> None:
        self.inner.submit(r)

    def cancel(self, r: int) -> bool:
        return self.inner.cancel(r)

    def deliver(self, kind: str, r: int, page: int | None = None) -> bool:
        return self.inner.deliver(kind, r, page)

    def prefill_abort(self, r: int) -> bool:
        return self.inner.prefill_abort(r)

    def restart_prefill(self) -> None:
        self.inner.restart_prefill()

    def restart_decode(self) -> None:
        self.inner.restart_decode()

    def settle(self) -> None:
        self.inner.settle()

    def take_events(self) -> list[Event]:
        return self.inner.take_events()

    def answers(self) -> dict[int, TargetAnswer]:
        if self.explode:
            raise RuntimeError("engine lost its answer table")
        return self.inner.answers()

    def quiescent(self) -> bool:
        return self.inner.quiescent()


def test_faults_the_engine_cannot_inject_are_skipped_and_reported_not_covered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = serve("127.0.0.1:0", "limited", factory=_Limited)
    try:
        argv = ["conform", "--target", server.address, "--traces", "150", "--seed", "1"]
        assert main([*argv, "--out", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert "conforms" in out
        skipped = re.search(r"not covered \(the target cannot perform these; [^)]*\): (.*)", out)
        assert skipped is not None, out
        names = skipped.group(1).split(", ")
        assert "fire_timeout" in names and any(n.startswith("drop ") for n in names)
        assert not any(n.startswith("deliver") for n in names)  # what it can do, it does
        report = campaign.run(server.address, "reference", traces=40, seed=1, out_dir=tmp_path)
        assert "UNIMPLEMENTED: the limited backend cannot perform Drop" in next(
            why for op, why in report.not_covered.items() if op.startswith("drop ")
        )
    finally:
        server.stop()


def test_an_engine_that_fails_is_internal_and_the_run_is_inconclusive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engines: list[_Limited] = []

    def factory() -> _Limited:
        engines.append(_Limited())
        return engines[-1]

    server = serve("127.0.0.1:0", "limited", factory=factory)
    try:
        target = RemoteTarget(server.address)
        target.start(default_config(), "reference")
        engines[-1].explode = True
        with pytest.raises(HarnessBroken, match="INTERNAL: Answers: the limited backend failed: "):
            target.answers()
        engines[-1].explode = False
        assert target.answers() == {}  # the server kept serving
        engines[-1].explode = True
        argv = ["conform", "--target", server.address, "--traces", "5", "--out", str(tmp_path)]
        assert main(argv) == 3  # no verdict, and no shrinking of a broken engine
        err = capsys.readouterr().err
        assert "kvhandoff conform: error: harness service at" in err
        assert "engine lost its answer table" in err
    finally:
        server.stop()


def test_a_stopped_server_mid_run_is_reported_as_unreachable() -> None:
    server = serve("127.0.0.1:0", "inproc")
    target = RemoteTarget(server.address)
    target.start(default_config(), "reference")
    server.stop()
    with pytest.raises(HarnessUnreachable, match=f"harness service at {server.address}: Submit"):
        target.submit(0)


# ------------------------------------------------------------------ the command


def test_harness_serve_serves_until_sigterm(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvhandoff.cli.main", "harness-serve", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.fullmatch(
            r"kvhandoff harness-serve: backend inproc on (127\.0\.0\.1:\d+) "
            r"\(kvhandoff conform --target \1\)\n",
            line,
        )
        assert m is not None, line
        report = campaign.run(m.group(1), "reference", traces=10, out_dir=tmp_path)
        assert report.verdict == "conforms"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


@pytest.mark.parametrize(
    ("listen", "why"),
    [("127.0.0.1", "expected HOST:PORT"), ("127.0.0.1:99999", "not a number in 0..65535")],
)
def test_harness_serve_refuses_a_bad_listen_address(
    listen: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["harness-serve", "--listen", listen]) == 2
    assert why in capsys.readouterr().err


# ------------------------------------------------------------------ the guide's worked run

DOCUMENTED = "127.0.0.1:50061"  # the address the guide shows (harness-serve's default)
NOWHERE = "127.0.0.1:50062"  # the guide's address where nothing listens


def test_the_guides_worked_run_still_prints_what_it_shows(
    inproc_server: HarnessServer, tmp_path: Path
) -> None:
    """The guide's harness-run block, re-run against a fresh server on a free port: the port is
    substituted in the commands and mapped back in the output (timings ignored, `...` elides),
    like tests/test_docs.py does for `console` blocks."""
    from kvhandoff.cli.cmd_harness import DEFAULT_LISTEN
    from tests.test_docs import execute, matches, parse_console

    guide = (ROOT / "docs/conformance-guide.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- harness-run: [^\n]*-->\n```text\n(.*?)```", guide, re.DOTALL)
    assert block is not None, "the guide lost its harness-run block"
    steps = parse_console(block.group(1))
    free = serve("127.0.0.1:0", "inproc")
    nowhere = free.address
    free.stop()
    swaps = [
        (DOCUMENTED, inproc_server.address),
        (DOCUMENTED.replace(":", "_"), inproc_server.address.replace(":", "_")),
        (NOWHERE, nowhere),
    ]
    assert DEFAULT_LISTEN == DOCUMENTED
    failures = []
    for step in steps:
        if step.command.startswith("kvhandoff harness-serve"):
            expected = (
                f"kvhandoff harness-serve: backend inproc on {DOCUMENTED} "
                f"(kvhandoff conform --target {DOCUMENTED})\n"
            )
            assert step.output == expected  # the line format is pinned by the SIGTERM test
            continue
        command = step.command
        for documented, real in swaps:
            command = command.replace(documented, real)
        output, code = execute(command, tmp_path)
        for documented, real in swaps:
            output = output.replace(real, documented)
        if not matches(step.output, output):
            failures.append(f"$ {step.command}\n--- documented\n{step.output}--- actual\n{output}")
        if code != step.exit_code:
            failures.append(f"$ {step.command}: exit {code}, the guide says {step.exit_code}")
    assert not failures, "\n\n".join(failures)
