"""The mooncake transport: one-sided page writes with Mooncake's TransferEngine, on loopback only.

Every engine here binds and connects on 127.0.0.1 (the suite runs with the loopback bind wrapper
preloaded, see tests/conftest.py); the first test checks that on the process's own sockets.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from kvhandoff.impl.client import Client
from kvhandoff.impl.cluster import Cluster
from kvhandoff.impl.errors import TransportError
from kvhandoff.impl.eventlog import read_events
from kvhandoff.impl.tokenizer import encode
from kvhandoff.impl.transport import OneSidedTransport, WriteOp, open_transport

pytest.importorskip("mooncake.engine", reason="the mooncake extra is not installed (make venv)")

LOOPBACK_V4 = ipaddress.ip_address("127.0.0.1")


def listening_addresses(pid: str = "self") -> list[tuple[str, int]]:
    """(address, port) of every TCP socket of process ``pid`` in LISTEN state, from /proc."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, width in ((f"/proc/{pid}/net/tcp", 8), (f"/proc/{pid}/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:
                continue
            hex_addr, hex_port = local.split(":")
            assert len(hex_addr) == width
            raw = bytes.fromhex(hex_addr)
            # /proc prints each 32-bit word in host (little-endian) order.
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.append((str(ipaddress.ip_address(words)), int(hex_port, 16)))
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


@pytest.fixture
def transports() -> Iterator[Callable[[], OneSidedTransport]]:
    opened: list[OneSidedTransport] = []

    def make() -> OneSidedTransport:
        t = open_transport("mooncake")
        assert isinstance(t, OneSidedTransport)
        opened.append(t)
        return t

    yield make
    for t in opened:
        t.close()


def test_mooncake_engines_listen_on_loopback_only(
    transports: Callable[[], OneSidedTransport],
) -> None:
    before = set(listening_addresses())
    t = transports()
    new = set(listening_addresses()) - before
    # The handshake listener and the TCP data listener.
    assert len(new) >= 2, new
    assert all(is_loopback(addr) for addr, _ in new), new
    assert t.endpoint.startswith("127.0.0.1:")
    assert int(t.endpoint.rsplit(":", 1)[1]) in {port for _, port in new}


def test_writes_land_inside_registered_memory_and_nowhere_else(
    transports: Callable[[], OneSidedTransport],
) -> None:
    sender, receiver = transports(), transports()
    target = torch.zeros(4096, dtype=torch.uint8)
    receiver.register(target.data_ptr(), target.numel())
    source = torch.arange(4096, dtype=torch.int64).to(torch.uint8)
    sender.write(receiver.endpoint, [WriteOp(source.data_ptr(), target.data_ptr() + 1024, 2048)])
    assert torch.equal(target[1024:3072], source[:2048])
    assert not target[:1024].any() and not target[3072:].any()
    # A range that runs past the registered buffer is refused by the receiving engine.
    with pytest.raises(TransportError, match="outside its registered memory"):
        sender.write(
            receiver.endpoint, [WriteOp(source.data_ptr(), target.data_ptr() + 3072, 2048)]
        )
    assert not target[3072:].any()


def test_a_write_to_a_dead_peer_fails_fast(transports: Callable[[], OneSidedTransport]) -> None:
    sender, receiver = transports(), transports()
    buf = torch.zeros(64, dtype=torch.uint8)
    receiver.register(buf.data_ptr(), buf.numel())
    endpoint = receiver.endpoint
    receiver.close()
    del receiver
    dead = "127.0.0.1:1"  # nothing listens on port 1
    t0 = time.monotonic()
    with pytest.raises(TransportError, match=dead):
        sender.write(dead, [WriteOp(buf.data_ptr(), buf.data_ptr(), 64)])
    assert time.monotonic() - t0 < 5
    assert endpoint != dead


def test_serve_all_with_mooncake_preloads_the_wrapper_and_listens_on_loopback(
    tmp_path: Path,
) -> None:
    env = {
        k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "KVHANDOFF_PRELOAD_TRIED")
    }
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = str(root)
    code = "import sys; from kvhandoff.cli.main import main; sys.exit(main())"
    args = ["serve", "all", "--transport", "mooncake", "--device", "cpu", "--json", "--insecure"]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args, "--state-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=root,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "serve all --transport mooncake printed nothing"
        router = json.loads(line)["router"]
        preload = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        assert any(e.startswith(b"LD_PRELOAD=") and b"loopback_bind" in e for e in preload)
        listening = listening_addresses(str(proc.pid))
        assert len(listening) >= 5, listening  # 3 gRPC servers + 2 engines x 2 listeners
        assert all(is_loopback(addr) for addr, _ in listening), listening
        with Client(router) as c:
            result = c.generate("A", prompt("OVERTHECLI", 30), 10)
        assert result.status == "ok" and result.text == "OVERTHECLI", result
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0


def prompt(text: str, tokens: int) -> list[int]:
    return encode((text * (tokens // len(text) + 1))[:tokens])


def test_handoff_moves_every_page_one_sided(make_cluster: Callable[..., Cluster]) -> None:
    grpc_cluster = make_cluster("reference")
    cluster = make_cluster("reference", transport="mooncake", pages_per_message=3)
    tokens = prompt("ONESIDEDWRITE", 70)  # 18 pages of 4 tokens
    with grpc_cluster.client() as c:
        expected = c.generate("A", tokens, 24)
    with cluster.client() as c:
        result = c.generate("A", tokens, 24)
    assert expected.status == result.status == "ok"
    assert result.tokens == expected.tokens
    decode = cluster.decode_server
    assert decode.metrics.get("kvhandoff_landed_pages_total") == 18
    assert grpc_cluster.decode_server.metrics.get("kvhandoff_landed_pages_total") == 0
    assert cluster.wait_quiescent(10)
    assert decode.landing is not None and not decode.landing.any(), "landing slots not scrubbed"


@pytest.mark.slow  # intermittent: see the note below
def test_decode_refuses_a_notice_for_pages_that_never_landed(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """Prefill claims a page landed but its write skipped it: decode digests what is really in
    the slot, refuses, and answers an error instead of generating from a stale slot.

    In `make test-slow`, not `make test`: on 2026-12-01 it failed 1 run in 3, alone on the
    machine, with the skipped request answered INTERNAL ("prefill: writing pages to decode
    failed: Internal error from Core", gRPC core's own error on the write notice) instead of
    decode's DATA_LOSS. Not analysed yet; the other Mooncake tests pass every time."""
    cluster = make_cluster("reference", transport="mooncake", pages_per_message=4)
    transport = cluster.prefill_server.transport
    assert isinstance(transport, OneSidedTransport)
    real_write = transport.write

    def drop_last_page(endpoint: str, ops: list[WriteOp]) -> None:
        real_write(endpoint, ops[:-1])

    with cluster.client() as c:
        ok_first = c.generate("B", prompt("stalebytes", 40), 8)
        transport.write = drop_last_page  # type: ignore[method-assign]
        bad = c.generate("A", prompt("FRESHBYTES", 40), 8, request_id="skipped")
        transport.write = real_write  # type: ignore[method-assign]
        ok_after = c.generate("A", prompt("FRESHBYTES", 40), 8)
    assert ok_first.status == "ok" and ok_after.status == "ok"
    assert bad.status == "error" and bad.tokens == []
    assert bad.code == "DATA_LOSS", bad
    assert "digest" in bad.error, bad.error
    assert cluster.wait_quiescent(10)
    logs = cluster.config.log_dir
    assert logs is not None
    writes = [
        e["args"]
        for e in read_events(logs / "decode.jsonl")[1]
        if e["event"] == "decode_receive_write" and e["args"].get("request_id") == "skipped"
    ]
    refused = [w for w in writes if w["outcome"] == "refused"]
    assert [w["reason"] for w in refused] == ["digest_mismatch"], writes


def test_abort_waits_for_in_flight_one_sided_writes(make_cluster: Callable[..., Cluster]) -> None:
    """The drain fence: decode keeps an aborted request's pages until prefill acks, and prefill
    acks only once no one-sided write of that generation is still in flight."""
    cluster = make_cluster("reference", transport="mooncake", pages_per_message=2)
    transport = cluster.prefill_server.transport
    assert isinstance(transport, OneSidedTransport)
    real_write = transport.write
    started, release = threading.Event(), threading.Event()

    def slow_write(endpoint: str, ops: list[WriteOp]) -> None:
        started.set()
        assert release.wait(10)
        real_write(endpoint, ops)

    transport.write = slow_write  # type: ignore[method-assign]
    box: list[object] = []

    def run() -> None:
        with cluster.client() as c:
            box.append(c.generate("A", prompt("INFLIGHT", 40), 8, request_id="fenced"))

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(10)
    with cluster.client() as c:
        c.cancel("fenced")
    thread.join(10)
    assert box and getattr(box[0], "code", None) == "CANCELLED"
    time.sleep(0.3)
    # The write is still in flight: the pages stay owned, in the releasing state.
    view = cluster.decode_grant("fenced")
    assert view is not None and view.state == "releasing", view
    assert cluster.decode_pages()[1] == 10
    release.set()
    assert cluster.wait_quiescent(10)
    assert cluster.decode_pages()[1] == 0


@pytest.mark.parametrize(
    ("mode", "traces", "verdict"), [("reference", 10, "conforms"), ("incident", 10, "diverges")]
)
def test_conformance_campaign_over_mooncake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, traces: int, verdict: str
) -> None:
    from kvhandoff.conformance import campaign
    from kvhandoff.conformance.grpc_target import GrpcTarget
    from kvhandoff.impl.transport.mooncake import MooncakeTransport

    writes: list[int] = []
    real_write = MooncakeTransport.write

    def counted(self: MooncakeTransport, endpoint: str, ops: list[WriteOp]) -> None:
        writes.append(len(ops))
        real_write(self, endpoint, ops)

    monkeypatch.setattr(MooncakeTransport, "write", counted)
    target = GrpcTarget(transport="mooncake")
    try:
        report = campaign.run(
            "grpc", mode, traces=traces, steps=20, seed=0, out_dir=tmp_path, target=target
        )
    finally:
        target.shutdown()
    assert report.verdict == verdict, report.failures
    if verdict == "conforms":
        # (The incident's divergence can show before its first page write, so only here.)
        assert sum(writes) > 0, "no page went one-sided"
