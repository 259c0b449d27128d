"""`kvhandoff harness-serve`: the reference harness service, wrapping one of our targets.

An engine team points `kvhandoff conform --target HOST:PORT` at their own implementation of
conformance/proto/kvhandoff/harness/v1/harness.proto; this command serves the same service in
front of ours (in-process cores, or the real gRPC servers), as a working example and for tests.
"""

from __future__ import annotations

import argparse
import ipaddress
from typing import Any

from kvhandoff.cli.main import EXIT_OK, UsageError

DEFAULT_LISTEN = "127.0.0.1:50061"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "harness-serve",
        help="serve the conformance harness service in front of our implementation",
        description=(
            "Serve kvhandoff.harness.v1.Harness (conformance/proto/kvhandoff/harness/v1/"
            "harness.proto) by wrapping a local target, so that `kvhandoff conform --target "
            "HOST:PORT` can drive it. Loopback only by default: the service has no "
            "authentication. Ctrl-C or SIGTERM stops it. Exit 2 on bad usage."
        ),
    )
    p.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to serve on (default {DEFAULT_LISTEN}; port 0 = any free port)",
    )
    p.add_argument(
        "--backend",
        default="inproc",
        choices=("inproc", "grpc"),
        help="inproc: the protocol cores on a fake network (fine-grained: retries, several "
        "instances and adversarial probes too); grpc: the real servers on loopback (coarse: "
        "several instances)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the address, the backend and what it plays (fine_grained, retries, "
        "instances: the flags `conform` can use against it) as one JSON line once serving",
    )
    p.set_defaults(func=run_harness_serve)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def run_harness_serve(args: argparse.Namespace) -> int:
    import sys

    from kvhandoff.cli.cmd_serve import _stop_on_signal, _wait_for
    from kvhandoff.conformance.harness_server import ListenError, serve

    try:
        server = serve(args.listen, args.backend)
    except ListenError as exc:
        raise UsageError(str(exc)) from exc
    try:
        stop = _stop_on_signal()
        host = server.address.rpartition(":")[0]
        if not _is_loopback(host):
            print(
                f"kvhandoff harness-serve: warning: serving on {host}, not loopback: the harness "
                "service has no authentication, and whoever reaches it can drive (and crash) "
                "the backend",
                file=sys.stderr,
            )
        if args.json:
            from kvhandoff.cli import output

            output.print_json(
                "harness-serve",
                {"address": server.address, "backend": args.backend, **server.servicer.plays()},
            )
        else:
            print(
                f"kvhandoff harness-serve: backend {args.backend} on {server.address} "
                f"(kvhandoff conform --target {server.address})",
                flush=True,
            )
        _wait_for(stop)
    finally:
        server.stop()
    return EXIT_OK
