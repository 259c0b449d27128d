"""Retries and several instances through the harness service: an engine that declares them in
Info (`retries`, `instances`) is driven through `--target HOST:PORT` exactly as the same engine
in-process (the same programs, the same steps, the same verdicts), its own bugs on retries and
instances are caught there as in-process, and an engine that declares neither is asked nothing
version 1 of the service did not ask. Servers listen on loopback, on ports the OS picks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import grpc
import pytest

from kvhandoff.cli.main import main
from kvhandoff.conformance import campaign
from kvhandoff.conformance.harness_server import HarnessServer, serve
from kvhandoff.conformance.inproc import InProcTarget
from kvhandoff.conformance.lockstep import Divergence
from kvhandoff.conformance.proto.rpc import harness_stub, pb
from kvhandoff.conformance.remote_target import RemoteTarget
from kvhandoff.conformance.replay import replay_trace
from kvhandoff.conformance.target import Target
from kvhandoff.spec.actions import PrefillRestart
from kvhandoff.spec.config import Config, RequestSpec, default_config
from tests.conformance.test_instances_conformance import TWO_PREFILLS, _OnePeer, _run_with
from tests.conformance.test_retry import ignore_attempts_on_abort

DATA = Path(__file__).parent / "data"
RETRY_TRACE = DATA / "retry_stale_abort.jsonl"


class _VersionOne(InProcTarget):
    """An engine of version 1 of the service: one instance of each, no retries, no probes."""

    retries = False
    instances = False
    probe = Target.probe  # the base class's: "cannot", so Probe is UNIMPLEMENTED
    page_contents = Target.page_contents  # and PageContents


@pytest.fixture(scope="module")
def v1_server() -> Iterator[HarnessServer]:
    server = serve("127.0.0.1:0", "v1", factory=_VersionOne)
    try:
        yield server
    finally:
        server.stop()


class _Recording(InProcTarget):
    """The in-process target, noting every operation the suite asks of it with its arguments:
    what the suite asks in-process and what reaches the engine behind the service must be the
    same list."""

    calls: ClassVar[list[tuple[Any, ...]]] = []

    def start(self, config: Config, mode: str) -> None:
        self.calls.append(("start", config, mode, dict(self.shortfall)))
        super().start(config, mode)

    def page_contents(self) -> dict[int, str | None]:
        contents = super().page_contents()
        self.calls.append(("page_contents", contents))
        return contents

    def deliver(
        self, kind: str, r: int, page: int | None = None, attempt: int | None = None
    ) -> bool:
        done = super().deliver(kind, r, page, attempt)
        self.calls.append(("deliver", kind, r, page, attempt, done))
        return done

    def drop(self, kind: str, r: int, attempt: int | None = None) -> bool:
        done = super().drop(kind, r, attempt)
        self.calls.append(("drop", kind, r, attempt, done))
        return done

    def retransmit(self, kind: str, r: int, attempt: int | None = None) -> bool:
        done = super().retransmit(kind, r, attempt)
        self.calls.append(("retransmit", kind, r, attempt, done))
        return done

    def duplicate(self, kind: str, r: int, attempt: int | None = None) -> bool:
        done = super().duplicate(kind, r, attempt)
        self.calls.append(("duplicate", kind, r, attempt, done))
        return done

    def retry(self, r: int) -> bool:
        done = super().retry(r)
        self.calls.append(("retry", r, done))
        return done

    def restart_prefill(self, pinst: int = 0) -> None:
        self.calls.append(("restart_prefill", pinst))
        super().restart_prefill(pinst)

    def restart_decode(self, dinst: int = 0) -> None:
        self.calls.append(("restart_decode", dinst))
        super().restart_decode(dinst)

    def suspect_prefill_dead(self, dinst: int = 0, pinst: int = 0) -> bool:
        done = super().suspect_prefill_dead(dinst, pinst)
        self.calls.append(("suspect_prefill_dead", dinst, pinst, done))
        return done

    def probe(self, attack: Any) -> Any:
        got = super().probe(attack)
        self.calls.append(("probe", attack, got))
        return got


def _calls_both_ways(tmp_path: Path, **options: Any) -> tuple[list[Any], list[Any]]:
    """The operations a campaign asks of the recording engine in-process, then through the
    service (the same seed, so the same programs)."""
    _Recording.calls = []
    local = campaign.run(
        "inproc", "reference", traces=15, seed=5, out_dir=tmp_path, target=_Recording(), **options
    )
    assert local.verdict == "conforms", local.failures
    here, _Recording.calls = _Recording.calls, []
    server = serve("127.0.0.1:0", "recording", factory=_Recording)
    target = RemoteTarget(server.address)
    try:
        remote = campaign.run(
            server.address,
            "reference",
            traces=15,
            seed=5,
            out_dir=tmp_path,
            target=target,
            **options,
        )
    finally:
        target.shutdown()
        server.stop()
    assert remote.verdict == "conforms", remote.failures
    assert remote.step_count == local.step_count
    return here, _Recording.calls


def test_info_says_what_the_engine_plays(
    inproc_server: HarnessServer, v1_server: HarnessServer
) -> None:
    assert RemoteTarget(inproc_server.address).retries is True
    assert RemoteTarget(inproc_server.address).instances is True
    assert RemoteTarget(v1_server.address).retries is False
    assert RemoteTarget(v1_server.address).instances is False


# ------------------------------------------------------------------ retries


def test_the_suite_s_retry_operations_reach_the_engine_with_their_attempts(
    tmp_path: Path,
) -> None:
    here, there = _calls_both_ways(tmp_path, max_retries=1)
    assert here == there
    # Prompts that end inside a page reach the engine (Reset's shortfall), and its pages are
    # read back for the data check (PageContents).
    assert any(c[0] == "start" and c[3] for c in there)
    assert any(c[0] == "page_contents" and any(c[1].values()) for c in there)
    assert any(c[0] == "retry" and c[-1] for c in there)
    attempts = {c[4] for c in there if c[0] == "deliver"}
    assert {None, 0, 1} <= attempts


def test_a_retry_trace_replays_through_the_service_and_its_mutant_is_caught(
    inproc_server: HarnessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = replay_trace(RETRY_TRACE, RemoteTarget(inproc_server.address))
    assert report.conforms, report.first_divergence
    stale = [
        e
        for e in report.events
        if e["event"] == "prefill_receive_abort" and e["args"].get("outcome") == "stale_attempt"
    ]
    assert stale, "the first attempt's abort, delivered by its attempt, is found stale"
    # The engine behind the service (this process) ignores attempts: prefill finishes the
    # retry on its first attempt's abort.
    ignore_attempts_on_abort(monkeypatch)
    report = replay_trace(RETRY_TRACE, RemoteTarget(inproc_server.address))
    assert not report.conforms and report.first_divergence is not None
    event = report.first_divergence["event"]
    assert event["event"] == "prefill_finish_request" and event["args"]["attempt"] == 1


# ------------------------------------------------------------------ instances


def test_the_suite_s_instance_operations_reach_the_engine_with_their_instances(
    tmp_path: Path,
) -> None:
    here, there = _calls_both_ways(tmp_path, instances=True)
    assert here == there
    assert ("restart_prefill", 1) in there or ("restart_decode", 1) in there
    assert any(c[0] == "probe" and c[-1] is not None for c in there)


def test_a_restart_of_prefill_instance_1_reaches_it_through_the_service(
    inproc_server: HarnessServer,
) -> None:
    target = RemoteTarget(inproc_server.address)
    try:
        session = _run_with(target, PrefillRestart(pinst=1))  # type: ignore[arg-type]
        answers = target.answers()
    finally:
        target.shutdown()
    assert PrefillRestart(pinst=1) in [step.action for step in session.steps if step.performed]
    detect = [e for e in session.events if e["event"] == "decode_detect_prefill_restart"]
    lost = [e["args"] for e in detect if e["args"].get("prefill_instance") == 1]
    assert lost and lost[0]["failed"] == ["r1"]
    assert answers[0].ok and answers[0].read == ["a", "a"]
    assert not answers[1].ok


def test_a_decode_that_takes_every_prefill_for_one_is_caught_through_the_service() -> None:
    server = serve("127.0.0.1:0", "one-peer", factory=_OnePeer)
    target = RemoteTarget(server.address)
    try:
        with pytest.raises(Divergence) as caught:
            _run_with(target, PrefillRestart(pinst=1))  # type: ignore[arg-type]
    finally:
        target.shutdown()
        server.stop()
    # It fails r0 too, whose prefill instance did not restart.
    assert caught.value.kind == "unexplained_event"
    assert '"request_id": "r0"' in caught.value.message
    assert '"status": "error"' in caught.value.message


def test_probe_checks_its_arguments_and_answers_when_there_is_nothing_to_forge(
    inproc_server: HarnessServer,
) -> None:
    with grpc.insecure_channel(inproc_server.address) as channel:
        stub = harness_stub(channel)
        one = json.dumps(default_config().to_json())
        s = stub.Reset(pb.ResetRequest(config_json=one, mode="reference"), timeout=10).session
        code, msg = _refused(stub.Probe, pb.ProbeRequest(session=s, attack="nope", request=0))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown attack 'nope'; expected one of: completion_undercount" in msg
        code, msg = _refused(
            stub.Probe, pb.ProbeRequest(session=s, attack="write_wrong_room", request=7)
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "request 7 is out of range" in msg
        # No grant yet: nothing to forge a write from.
        got = stub.Probe(pb.ProbeRequest(session=s, attack="write_wrong_room", request=0))
        assert not got.performed


# ------------------------------------------------------------------ an engine of version 1


def _refused(call: Any, request: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)
    err: Any = info.value
    return err.code(), err.details()


def test_an_engine_of_version_1_is_asked_only_what_it_plays(
    v1_server: HarnessServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with grpc.insecure_channel(v1_server.address) as channel:
        stub = harness_stub(channel)
        two = json.dumps(TWO_PREFILLS.to_json())
        code, msg = _refused(stub.Reset, pb.ResetRequest(config_json=two, mode="reference"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "prefill_instances=2, decode_instances=2" in msg
        one = json.dumps(default_config().to_json())
        s = stub.Reset(pb.ResetRequest(config_json=one, mode="reference"), timeout=10).session
        bad = pb.ResetRequest(config_json=one, mode="reference", shortfall={0: 16})
        code, msg = _refused(stub.Reset, bad)
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "shortfall {0: 16}" in msg and "under page_size (16) tokens" in msg
        s = stub.Reset(pb.ResetRequest(config_json=one, mode="reference"), timeout=10).session
        code, msg = _refused(stub.Retry, pb.RequestRef(session=s, request=0))
        assert code == grpc.StatusCode.UNIMPLEMENTED and "does not play retries" in msg
        code, msg = _refused(
            stub.Deliver, pb.DeliverRequest(session=s, kind="grant", request=0, attempt=1)
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "attempt 1 given" in msg
        code, msg = _refused(stub.RestartPrefill, pb.InstanceRef(session=s, prefill_instance=1))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "prefill instance 1 is out of range: the scenario has 1 prefill instance" in msg
        code, msg = _refused(
            stub.Deliver, pb.DeliverRequest(session=s, kind="heartbeat", request=2)
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "decode instance 2" in msg
        # A client of version 1 sends a SessionRef: the same bytes as an InstanceRef of
        # instance 0, served as before.
        restart = channel.unary_unary(
            "/kvhandoff.harness.v1.Harness/RestartPrefill",
            request_serializer=pb.SessionRef.SerializeToString,
            response_deserializer=pb.Done.FromString,
        )
        restart(pb.SessionRef(session=s), timeout=10)
        events = json.loads("[" + ",".join(stub.Events(pb.SessionRef(session=s)).events) + "]")
        assert [e["event"] for e in events if e["event"] == "prefill_restart"] == [
            "prefill_restart"
        ]
    # What it cannot do is reported, not skipped in silence.
    report = campaign.run(v1_server.address, "reference", traces=5, out_dir=tmp_path)
    assert report.verdict == "conforms"
    assert {"probe", "page_contents"} <= set(report.not_covered)
    # The suite does not ask it for retries or instances, and says why.
    argv = ["conform", "--target", v1_server.address, "--traces", "5", "--out", str(tmp_path)]
    assert main([*argv, "--instances"]) == 2
    err = capsys.readouterr().err
    assert "prefill_instances=2, decode_instances=2" in err and "one prefill and one decode" in err
    assert main([*argv, "--max-retries", "1"]) == 2
    assert "retr" in capsys.readouterr().err
    with pytest.raises(ValueError, match="plays one instance of each"):
        RemoteTarget(v1_server.address).restart_prefill(pinst=1)


def test_a_shrunk_program_on_instances_replays_through_the_service(
    inproc_server: HarnessServer, v1_server: HarnessServer, tmp_path: Path
) -> None:
    # The bug is found by a forged write (an adversarial probe): replayed through the service,
    # the probe is played again; an engine that cannot probe says so instead of conforming
    # quietly.
    report = campaign.run(
        "inproc", "m7_release_before_drain", traces=300, seed=0, instances=True, out_dir=tmp_path
    )
    assert report.verdict == "diverges"
    trace = Path(report.failures[0].trace_file)
    assert '"prefill_instances": 2' in trace.read_text().splitlines()[0]
    address = inproc_server.address
    assert not replay_trace(trace, RemoteTarget(address), "m7_release_before_drain").conforms
    assert replay_trace(trace, RemoteTarget(address), "reference").conforms
    header = json.loads(trace.read_text().splitlines()[0])
    assert header["failure"] == "adversarial"
    one = tmp_path / "one-instance.jsonl"
    # The same program on one instance of each, for the engine of version 1.
    header["config"].update(prefill_instances=1, decode_instances=1, decode_pages=3)
    one.write_text("\n".join([json.dumps(header), *trace.read_text().splitlines()[1:]]) + "\n")
    assert not replay_trace(one, "inproc", "m7_release_before_drain").conforms
    quiet = replay_trace(one, RemoteTarget(v1_server.address), "m7_release_before_drain")
    assert quiet.verdict == "conforms"
    assert "adversarial probe" in quiet.not_covered["probe"]


def test_the_real_servers_behind_the_service_run_where_the_placement_says(
    tmp_path: Path,
) -> None:
    placed = replace(
        campaign.campaign_config(instances=True),
        placement="fixed",
        requests=(
            RequestSpec("a", 2, 1, prefill_instance=1, decode_instance=1),
            RequestSpec("b", 1, 2, prefill_instance=0, decode_instance=1),
            RequestSpec("a", 1, 3, prefill_instance=1, decode_instance=0),
        ),
    )
    server = serve("127.0.0.1:0", "grpc")
    target = RemoteTarget(server.address)
    try:
        assert target.instances and not target.retries and not target.fine_grained
        target.start(placed, "reference")
        for r in range(3):
            target.submit(r)
        target.settle()
        target.restart_prefill(pinst=1)
        target.settle()
        events = target.take_events()
        admitted = {
            e["args"]["request_id"]: e["server"]
            for e in events
            if e["event"] in ("prefill_admit_request", "decode_reserve_pages")
            and e["server"].startswith("prefill")
        }
        assert admitted == {
            target.request_id(0): "prefill1",
            target.request_id(1): "prefill",
            target.request_id(2): "prefill1",
        }
        assert [e["server"] for e in events if e["event"] == "prefill_restart"] == ["prefill1"]
        assert {h["config"].get("instance", 0) for h in target.last_headers} == {0, 1}
        target.close()
        report = campaign.run(
            server.address,
            "reference",
            traces=4,
            seed=0,
            out_dir=tmp_path,
            target=target,
            instances=True,
        )
        assert report.verdict == "conforms", report.failures
    finally:
        target.shutdown()
        server.stop()


class _Stop(Exception):
    pass


def test_the_default_program_count_follows_the_engine_s_granularity(
    inproc_server: HarnessServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1000 programs kill at the same programs through the service as in-process, 100 miss four
    # (benchmarks/results/conformance_mutation.txt): a fine-grained engine gets the 1000.
    seen: list[int] = []

    def run(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["traces"])
        raise _Stop

    monkeypatch.setattr(campaign, "run", run)
    with pytest.raises(_Stop):
        main(["conform", "--target", inproc_server.address])
    coarse = serve("127.0.0.1:0", "grpc")  # the real servers start only at Reset
    try:
        with pytest.raises(_Stop):
            main(["conform", "--target", coarse.address])
    finally:
        coarse.stop()
    with pytest.raises(_Stop):
        main(["conform", "--target", inproc_server.address, "--traces", "7"])
    assert seen == [1000, 100, 7]
