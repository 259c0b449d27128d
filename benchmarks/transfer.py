"""Handoff throughput of each transport (gRPC, Mooncake) vs a raw TCP socket, same run.

    python benchmarks/transfer.py [--device cpu|cuda] [--pages 64] [--repeats 20]
                                  [--transports grpc,mooncake] [--json]

Transports: ``grpc`` streams the pages inside the gRPC write stream; ``mooncake`` writes them
one-sided into decode's landing pool with Mooncake's TransferEngine over TCP and sends data-less
notices on the stream (decode then copies each slot out, digests and stores it). The handoff clock
is the same for both.

gRPC: a reference-mode cluster on loopback, prefill, decode and router each in its own process
(``kvhandoff serve ROLE``), as deployed; each request's prompt fills ``--pages`` pages, and a
handoff is timed inside decode from the opening of its write stream to the validated completion (page
writes, per-page digests on receipt, copies into the torch pool, completion check). Validation
time is decode's CPU time (read from its /metrics) in digest and coverage checks (including the core's bookkeeping and event
logging of each write, so it is an upper bound), plus prefill's digests, reported separately.

Raw TCP: one thread sends the same page bytes with ``sendall`` in the same message sizes, the
other receives them page by page and copies each into a torch pool of the same shape: the same
data movement with no protocol at all. gRPC handoffs and raw transfers alternate, so a change in
machine conditions during the run affects both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from kvhandoff.impl.client import Client  # noqa: E402
from kvhandoff.impl.pool import PagePool, PoolShape, resolve_device, tensor_from_bytes  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(
    role: str, args: argparse.Namespace, *extra: str
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    tokens = args.pages * args.page_size
    cmd = [
        sys.executable,
        "-m",
        "kvhandoff.cli.main",
        "serve",
        role,
        "--json",
        "--device",
        args.device,
        "--page-size",
        str(args.page_size),
        "--layers",
        str(args.layers),
        "--heads",
        str(args.heads),
        "--head-dim",
        str(args.head_dim),
        "--decode-pages",
        str(args.pages * 2),
        "--prefill-pages",
        str(args.pages * 2),
        "--context-window",
        str(tokens),
        "--pages-per-message",
        str(args.pages_per_message),
        "--max-message-bytes",
        str(64 << 20),
        *extra,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=_env())
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"kvhandoff serve {role} did not start")
    return proc, json.loads(line)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _scrape(address: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            key = name.split("{", 1)[0]
            out[key] = out.get(key, 0.0) + float(value)
    return out


class RawTcp:
    """The same bytes over a plain loopback TCP socket: the sender writes pre-built messages of
    the same size; the receiver takes one page at a time and copies it into a torch pool of the
    same shape (its best case: receiving and storing overlap)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.shape = PoolShape(args.layers, args.page_size, args.heads, args.head_dim)
        self.device = resolve_device(args.device)
        self.pool = PagePool(self.shape, args.pages, self.device)
        self.pages = args.pages
        page_bytes = self.shape.page_bytes
        self.payload = os.urandom(args.pages * page_bytes)
        step = args.pages_per_message * page_bytes
        self.chunks = [self.payload[i : i + step] for i in range(0, len(self.payload), step)]

    def once(self) -> float:
        """Seconds from the first byte received to the last page stored."""
        page_bytes = self.shape.page_bytes
        done: list[float] = []
        with socket.create_server(("127.0.0.1", 0)) as server:
            port = server.getsockname()[1]

            def receive() -> None:
                conn, _ = server.accept()
                with conn:
                    buf = bytearray(page_bytes)
                    view = memoryview(buf)
                    start = 0.0
                    for page in range(self.pages):
                        got = 0
                        while got < page_bytes:
                            n = conn.recv_into(view[got:])
                            if not start:
                                start = time.perf_counter()
                            got += n
                        self.pool.store([page], tensor_from_bytes(bytes(buf), 1, self.shape))
                    if self.device.type == "cuda":
                        torch.cuda.synchronize()
                    done.append(time.perf_counter() - start)

            t = threading.Thread(target=receive)
            t.start()
            with socket.create_connection(("127.0.0.1", port)) as sock:
                for chunk in self.chunks:
                    sock.sendall(chunk)
            t.join()
        return done[0]


def _start_cluster(
    args: argparse.Namespace, transport: str, procs: list[subprocess.Popen[str]]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    pp, dp = _free_port(), _free_port()
    t = ("--transport", transport)
    p, pinfo = _serve(
        "prefill", args, "--port", str(pp), "--decode", f"127.0.0.1:{dp}", "--metrics-port", "0", *t
    )
    procs.append(p)
    d, dinfo = _serve(
        "decode", args, "--port", str(dp), "--prefill", f"127.0.0.1:{pp}", "--metrics-port", "0", *t
    )
    procs.append(d)
    r, rinfo = _serve("router", args, "--prefill", f"127.0.0.1:{pp}", "--decode", f"127.0.0.1:{dp}")
    procs.append(r)
    return pinfo, dinfo, rinfo


def run(args: argparse.Namespace) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """One cluster per transport, prefill, decode and router each in their own process, as
    deployed; a handoff on every transport and a raw TCP transfer alternate so that all see the
    same machine conditions."""
    raw = RawTcp(args)
    procs: list[subprocess.Popen[str]] = []
    raw_times: list[float] = []
    clusters = {}
    clients: dict[str, Client] = {}
    before: dict[str, tuple[dict[str, float], dict[str, float]]] = {}
    after: dict[str, tuple[dict[str, float], dict[str, float]]] = {}
    e2e: dict[str, list[float]] = {t: [] for t in args.transports}
    tokens = args.pages * args.page_size
    prompt = [65 + (i % 26) for i in range(tokens)]
    try:
        for transport in args.transports:
            clusters[transport] = _start_cluster(args, transport, procs)
            clients[transport] = Client(
                clusters[transport][2]["router"], max_message_bytes=64 << 20
            )
            clients[transport].generate_or_raise("warmup", prompt, 4)
        raw.once()
        for transport, (pinfo, dinfo, _) in clusters.items():
            before[transport] = (_scrape(dinfo["metrics"]), _scrape(pinfo["metrics"]))
        for _ in range(args.repeats):
            for transport in args.transports:
                t0 = time.perf_counter()
                clients[transport].generate_or_raise("bench", prompt, 4)
                e2e[transport].append(time.perf_counter() - t0)
            raw_times.append(raw.once())
        for transport, (pinfo, dinfo, _) in clusters.items():
            after[transport] = (_scrape(dinfo["metrics"]), _scrape(pinfo["metrics"]))
    finally:
        for client in clients.values():
            client.close()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(20)

    def delta(a: dict[str, float], b: dict[str, float], key: str) -> float:
        return b.get(key, 0.0) - a.get(key, 0.0)

    reports = {}
    for transport in args.transports:
        (d0, p0), (d1, p1) = before[transport], after[transport]
        seconds = delta(d0, d1, "kvhandoff_handoff_seconds_total")
        handoffs = delta(d0, d1, "kvhandoff_handoffs_total")
        reports[transport] = {
            "handoffs": handoffs,
            "mean_handoff_s": seconds / handoffs,
            "pages_per_s": delta(d0, d1, "kvhandoff_handoff_pages_total") / seconds,
            "bytes_per_s": delta(d0, d1, "kvhandoff_handoff_bytes_total") / seconds,
            "landed_pages": delta(d0, d1, "kvhandoff_landed_pages_total"),
            "validation_share": delta(d0, d1, "kvhandoff_validation_seconds_total") / seconds,
            "sender_digest_share": delta(p0, p1, "kvhandoff_sender_digest_seconds_total") / seconds,
            "median_request_s": statistics.median(e2e[transport]),
        }
    total = sum(raw_times)
    raw_report = {
        "handoffs": len(raw_times),
        "mean_handoff_s": total / len(raw_times),
        "median_handoff_s": statistics.median(raw_times),
        "pages_per_s": args.pages * len(raw_times) / total,
        "bytes_per_s": len(raw.payload) * len(raw_times) / total,
    }
    return reports, raw_report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--pages", type=int, default=64, help="pages per handoff")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--pages-per-message", type=int, default=16)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument(
        "--transports",
        default="grpc,mooncake",
        type=lambda v: [t for t in v.split(",") if t],
        help="comma-separated transports to measure (grpc, mooncake)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    unknown = [t for t in args.transports if t not in ("grpc", "mooncake")]
    if unknown or not args.transports:
        p.error(f"--transports takes grpc and/or mooncake, got {args.transports}")
    shape = PoolShape(args.layers, args.page_size, args.heads, args.head_dim)
    reports, r = run(args)
    report: dict[str, Any] = {
        "device": args.device,
        "page_bytes": shape.page_bytes,
        "pages_per_handoff": args.pages,
        "pages_per_message": args.pages_per_message,
        **reports,
        "raw_tcp": r,
        **{f"{t}_vs_raw": g["bytes_per_s"] / r["bytes_per_s"] for t, g in reports.items()},
    }
    if args.json:
        print(json.dumps(report))
        return 0
    mib = 1 << 20
    print(
        f"page {shape.page_bytes // 1024} KiB, {args.pages} pages per handoff "
        f"({args.pages * shape.page_bytes / mib:.0f} MiB), {args.pages_per_message} pages per "
        f"message, device {args.device}, {args.repeats} handoffs per transport"
    )
    for t, g in reports.items():
        print(
            f"{t + ' handoff':<20}: {g['pages_per_s']:10.0f} pages/s "
            f"{g['bytes_per_s'] / mib:8.1f} MiB/s (mean {g['mean_handoff_s'] * 1e3:.1f} ms, "
            f"request {g['median_request_s'] * 1e3:.1f} ms median)"
        )
    print(
        f"{'raw TCP':<20}: {r['pages_per_s']:10.0f} pages/s {r['bytes_per_s'] / mib:8.1f} MiB/s "
        f"(mean {r['mean_handoff_s'] * 1e3:.1f} ms)"
    )
    for t in reports:
        print(f"{t + ' / raw':<20}: {report[t + '_vs_raw']:.2f}")
    for t, g in reports.items():
        print(
            f"{t + ' validation':<20}: {g['validation_share'] * 100:.1f}% of handoff time at "
            f"decode (+ {g['sender_digest_share'] * 100:.1f}% sender digests at prefill)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
