"""`kvhandoff serve` (run prefill, decode, router or all three) and `kvhandoff generate`."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from kvhandoff.cli.main import EXIT_INCONCLUSIVE, EXIT_OK, EXIT_VIOLATED, UsageError

# gRPC codes meaning the router never answered; `generate` exits 3 for them, 1 for a refusal.
NO_ANSWER_CODES = ("UNAVAILABLE", "DEADLINE_EXCEEDED")

ROLES = ("prefill", "decode", "router", "all")


def register(subparsers: Any) -> None:
    from kvhandoff.impl.modes import MODES

    serve = subparsers.add_parser(
        "serve",
        help="run the prefill, decode or router gRPC server, or all three on loopback",
        description=(
            "Run kvhandoff servers. Modes: " + ", ".join(MODES) + ". Ctrl-C or SIGTERM stops "
            "them cleanly."
        ),
    )
    serve.add_argument("role", choices=ROLES)
    serve.add_argument(
        "--transport",
        choices=("grpc", "mooncake"),
        default="grpc",
        help="how page data moves: in the gRPC write stream (grpc) or one-sided with Mooncake's "
        "transfer engine over TCP (mooncake; set it on prefill and decode)",
    )
    serve.add_argument(
        "--mode", default="reference", help="implementation mode (see impl/modes.py)"
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument(
        "--port",
        type=int,
        default=0,
        help="port of a single role, or of the router with `all` (0 = any)",
    )
    serve.add_argument(
        "--prefill",
        help="prefill address HOST:PORT (decode, router); with several prefill instances, their "
        "addresses comma-separated in instance order",
    )
    serve.add_argument(
        "--decode",
        help="decode address HOST:PORT (prefill, router); with several decode instances, their "
        "addresses comma-separated in instance order",
    )
    serve.add_argument(
        "--instance",
        type=int,
        default=0,
        help="this prefill's or decode's number among the instances of its role, the position of "
        "its address in the others' --prefill/--decode lists (default 0)",
    )
    serve.add_argument(
        "--prefill-instances",
        type=int,
        default=1,
        help="with `all`: how many prefill servers to start (the router places each request on "
        "the least loaded; default 1)",
    )
    serve.add_argument(
        "--decode-instances",
        type=int,
        default=1,
        help="with `all`: how many decode servers to start, each with its own pool of "
        "--decode-pages (default 1)",
    )
    serve.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when available)")
    serve.add_argument(
        "--log-dir", type=Path, help="write one JSON Lines event log per server here"
    )
    serve.add_argument(
        "--log-key-file",
        type=Path,
        help="secret (>= 16 bytes) that keys the digests written in event logs; give every role "
        "the same file to compare their logs. Without it, each start makes a fresh key, which "
        "is never printed or logged",
    )
    serve.add_argument(
        "--state-dir",
        type=Path,
        help="decode's persisted state (boot counter); decode instance N > 0 keeps it in "
        "STATE/decodeN",
    )
    serve.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics (0 = any port)")
    serve.add_argument("--page-size", type=int, default=4, help="tokens per page")
    serve.add_argument("--decode-pages", type=int, help="decode pool size in pages")
    serve.add_argument("--prefill-pages", type=int, help="prefill pool size in pages")
    serve.add_argument("--context-window", type=int, help="advertised context window in tokens")
    serve.add_argument("--layers", type=int, default=2)
    serve.add_argument("--heads", type=int, default=2)
    serve.add_argument("--head-dim", type=int, default=16)
    serve.add_argument("--pages-per-message", type=int, default=16, help="pages per write message")
    serve.add_argument(
        "--max-message-bytes", type=int, default=8 << 20, help="gRPC message size limit"
    )
    serve.add_argument(
        "--waiting-timeout",
        type=float,
        default=30.0,
        help="decode waits this long for a completion (s)",
    )
    serve.add_argument(
        "--pki-dir",
        type=Path,
        help="mutual TLS with identities: a CA in this directory (created if absent) issues each "
        "server a certificate naming its role. `serve all` without --pki-dir or --insecure makes "
        "a throwaway one in a fresh temporary directory",
    )
    serve.add_argument(
        "--tls-cert", type=Path, help="one role: its certificate (must name the role)"
    )
    serve.add_argument("--tls-key", type=Path)
    serve.add_argument("--tls-ca", type=Path)
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext, no authorization: any caller may call any RPC and claim any tenant",
    )
    serve.add_argument(
        "--json",
        action="store_true",
        help="print the addresses and limits as one JSON line once healthy",
    )
    serve.set_defaults(func=run_serve)

    gen = subparsers.add_parser(
        "generate",
        help="send one prompt to a router and print the answer",
        description=(
            "Send one prompt to a router and print the answer. Exit 0 answered, 1 refused (the "
            "router answered with an error), 2 bad usage, 3 no answer (nothing listening at "
            "--router, or no reply within --timeout)."
        ),
    )
    gen.add_argument("--router", required=True, help="router address HOST:PORT")
    gen.add_argument("--tenant", required=True)
    src = gen.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (one token per UTF-8 byte)")
    src.add_argument("--prompt-file", type=Path, help="file holding the prompt text")
    src.add_argument("--prompt-tokens", type=Path, help="file of whitespace-separated token ids")
    gen.add_argument("--max-tokens", type=int, default=16)
    gen.add_argument("--request-id", default="")
    gen.add_argument(
        "--retry",
        action="store_true",
        help="retry --request-id after its earlier call got an error: the router serves it as "
        "the next attempt of the same request (same id, tenant and room)",
    )
    gen.add_argument("--timeout", type=float, default=60.0)
    gen.add_argument(
        "--pki-dir",
        type=Path,
        help="the servers' CA directory: mints a client certificate for --tenant from it",
    )
    gen.add_argument("--tls-cert", type=Path, help="a client certificate naming the tenant")
    gen.add_argument("--tls-key", type=Path)
    gen.add_argument("--tls-ca", type=Path)
    gen.add_argument("--json", action="store_true")
    gen.set_defaults(func=run_generate)


INSECURE_NOTICE = (
    "kvhandoff serve: INSECURE: plaintext gRPC without authorization; any caller that reaches "
    "these ports may call any RPC and claim any tenant (use --pki-dir for mutual TLS)"
)


def _security(args: argparse.Namespace) -> tuple[Path | None, Any]:
    """(PKI directory, TLS files of a single role): at most one of --pki-dir, --tls-* and
    --insecure; `serve all` with none of them gets a throwaway PKI (made by the caller)."""
    chosen = [
        name
        for name, on in (
            ("--pki-dir", args.pki_dir is not None),
            ("--tls-cert/--tls-key/--tls-ca", args.tls_cert is not None),
            ("--insecure", args.insecure),
        )
        if on
    ]
    if len(chosen) > 1:
        raise UsageError(f"{' and '.join(chosen)} exclude each other")
    if args.role == "all" and args.tls_cert is not None:
        raise UsageError("serve all runs three roles, each with its own certificate: use --pki-dir")
    if args.role != "all" and not chosen:
        raise UsageError(
            f"serve {args.role} needs --pki-dir DIR (mutual TLS, the same CA for every role), "
            "--tls-cert/--tls-key/--tls-ca, or --insecure"
        )
    tls = _tls(args)
    if tls is not None:
        from kvhandoff.impl.tls import identity_of_pem

        identity = identity_of_pem(tls.cert.read_bytes())
        if identity is None or identity.role != args.role:
            raise UsageError(
                f"certificate {str(tls.cert)!r} names {identity or 'no kvhandoff identity'}, "
                f"not the role {args.role!r} (a SAN URI kvhandoff:role={args.role})"
            )
    return args.pki_dir, tls


def _tls(args: argparse.Namespace) -> Any:
    from kvhandoff.impl.tls import TlsFiles

    given = [args.tls_cert, args.tls_key, args.tls_ca]
    if not any(given):
        return None
    if not all(given):
        raise UsageError("--tls-cert, --tls-key and --tls-ca go together")
    for p in given:
        if not p.is_file():
            raise UsageError(f"TLS file {str(p)!r} does not exist")
    return TlsFiles(args.tls_cert, args.tls_key, args.tls_ca)


def _log_key(args: argparse.Namespace) -> bytes | None:
    path: Path | None = args.log_key_file
    if path is None:
        return None  # the servers make a fresh one
    try:
        key = path.read_bytes().strip()
    except OSError as exc:
        raise UsageError(f"cannot read --log-key-file {str(path)!r}: {exc.strerror}") from exc
    if len(key) < 16:
        raise UsageError(
            f"--log-key-file {str(path)!r} holds {len(key)} bytes; a log key needs at least 16"
        )
    return key


def _cluster_config(args: argparse.Namespace) -> Any:
    from kvhandoff.impl.cluster import ClusterConfig
    from kvhandoff.impl.errors import ConfigError
    from kvhandoff.impl.modes import get_mode

    try:
        get_mode(args.mode)
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc
    for name in (
        "page_size",
        "decode_pages",
        "prefill_pages",
        "context_window",
        "layers",
        "heads",
        "head_dim",
    ):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    return ClusterConfig(
        mode=args.mode,
        device=args.device,
        page_size=args.page_size,
        layers=args.layers,
        heads=args.heads,
        head_dim=args.head_dim,
        decode_pages=args.decode_pages,
        prefill_pages=args.prefill_pages,
        context_window=args.context_window,
        waiting_timeout_s=args.waiting_timeout,
        router_port=args.port if args.role == "all" else 0,
        pages_per_message=args.pages_per_message,
        max_message_bytes=args.max_message_bytes,
        host=args.host,
        metrics=args.metrics_port is not None,
        log_dir=args.log_dir,
        state_dir=args.state_dir,
        pki=args.pki_dir if args.role == "all" else None,
        log_key=_log_key(args),
        transport=args.transport,
        prefill_instances=args.prefill_instances,
        decode_instances=args.decode_instances,
    ).resolved()


def _stop_on_signal() -> threading.Event:
    """An event that SIGINT or SIGTERM sets. Installed before a server prints its address: a
    supervisor that reads the address and stops the server at once must get a clean stop (exit
    0), not the signal's default action."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _wait_for(stop: threading.Event) -> None:
    while not stop.wait(0.5):
        pass


def run_serve(args: argparse.Namespace) -> int:
    from kvhandoff.impl.cluster import Cluster
    from kvhandoff.impl.errors import KvhandoffError

    pki_dir = _security(args)[0] if args.role == "all" else None
    throwaway: tempfile.TemporaryDirectory[str] | None = None
    if args.role == "all" and pki_dir is None and not args.insecure:
        throwaway = tempfile.TemporaryDirectory(prefix="kvhandoff-pki-")
        args.pki_dir = Path(throwaway.name)
    config = _cluster_config(args)
    if args.role == "all" and args.metrics_port not in (None, 0):
        raise UsageError(
            f"--metrics-port {args.metrics_port}: serve all starts three servers, so it takes 0 "
            "(any free ports, printed at start: the 'metrics' object of --json)"
        )
    if config.transport == "mooncake" and args.role != "router":
        _reexec_with_loopback_bind()
    try:
        if args.role == "all":
            if args.insecure:
                print(INSECURE_NOTICE, file=sys.stderr, flush=True)
            cluster = Cluster(config)
            try:
                cluster.wait_healthy()
                pki = str(config.pki) if config.pki is not None else None
                stop = _stop_on_signal()
                if args.json:
                    from kvhandoff.cli import output

                    output.print_json("serve-all", {**cluster.addresses(), "pki": pki})
                else:
                    prefills = ", ".join(s.address for s in cluster.prefill_servers)
                    decodes = ", ".join(s.address for s in cluster.decode_servers)
                    print(
                        f"kvhandoff serve all ({config.mode}): router {cluster.router}, "
                        f"prefill {prefills}, decode {decodes}"
                        + "".join(
                            f"; {role} metrics http://{a}/metrics"
                            for role, a in cluster.metrics_addresses().items()
                        ),
                        flush=True,
                    )
                    if pki is not None:
                        kind = "throwaway CA" if throwaway is not None else "CA"
                        print(
                            f"mutual TLS, {kind} in {pki}: kvhandoff generate --pki-dir {pki} "
                            "--tenant T ...",
                            flush=True,
                        )
                _wait_for(stop)
            finally:
                cluster.stop()
                if throwaway is not None:
                    throwaway.cleanup()
            return EXIT_OK
        return _serve_one(args, config)
    except KvhandoffError as exc:
        raise UsageError(str(exc)) from exc


def _reexec_with_loopback_bind() -> None:
    """Mooncake's listeners bind every interface unless a bind wrapper is preloaded (see
    impl/transport/loopback.py); preloading needs a fresh process image."""
    from kvhandoff.impl.errors import ConfigError
    from kvhandoff.impl.transport import loopback

    try:
        loopback.reexec_with_preload()
    except ConfigError as exc:
        raise UsageError(str(exc)) from exc


def _address_list(args: argparse.Namespace, role: str) -> tuple[str, ...]:
    """The addresses of --prefill or --decode, one per instance (empty where not given)."""
    text = getattr(args, role) or ""
    if not text:
        return ()
    addresses = tuple(a.strip() for a in text.split(","))
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(
                f"--{role} {text!r}: {address!r} is not HOST:PORT (several instances: "
                "comma-separated, in instance order)"
            )
    return addresses


def _serve_one(args: argparse.Namespace, config: Any) -> int:
    from kvhandoff.impl.modes import get_mode
    from kvhandoff.impl.pool import PoolShape
    from kvhandoff.impl.servers.base import BaseServer, CommonSettings, Runtime
    from kvhandoff.impl.servers.decode import DecodeServer, DecodeSettings
    from kvhandoff.impl.servers.prefill import PrefillServer, PrefillSettings
    from kvhandoff.impl.servers.router import RouterServer, RouterSettings

    need = {"prefill": ["decode"], "decode": ["prefill"], "router": ["prefill", "decode"]}[
        args.role
    ]
    for peer in need:
        if not getattr(args, peer):
            raise UsageError(f"serve {args.role} needs --{peer} HOST:PORT")
    prefills, decodes = _address_list(args, "prefill"), _address_list(args, "decode")
    if args.role != "all" and (args.prefill_instances != 1 or args.decode_instances != 1):
        raise UsageError(
            f"--prefill-instances and --decode-instances start servers with `serve all`; for "
            f"serve {args.role}, start one server per instance and list their addresses in "
            "--prefill/--decode"
        )
    if args.instance < 0 or (args.instance and args.role == "router"):
        raise UsageError(
            f"--instance {args.instance}: a prefill or decode instance number is >= 0 (the "
            "router has none)"
        )
    limits = config.limits()
    mode = get_mode(config.mode)
    pki_dir, tls = _security(args)
    if args.insecure:
        print(INSECURE_NOTICE, file=sys.stderr, flush=True)
    if pki_dir is not None:
        from kvhandoff.impl.tls import Pki

        tls = Pki.open(pki_dir).issue(args.role)
    common = CommonSettings(
        host=args.host,
        port=args.port,
        log_dir=args.log_dir,
        metrics_port=args.metrics_port,
        tls=tls,
        max_message_bytes=config.max_message_bytes,
        log_key=config.log_key,
    )
    shape = PoolShape(config.layers, config.page_size, config.heads, config.head_dim)
    server: BaseServer
    if args.role == "prefill":
        server = PrefillServer(
            PrefillSettings(
                common,
                decodes,
                args.instance,
                shape,
                config.prefill_pages,
                limits.prefill_max_prompt,
                limits.context_window,
                pages_per_message=config.pages_per_message,
                device=config.device,
                transport=config.transport,
            ),
            mode,
        )
    elif args.role == "decode":
        server = DecodeServer(
            DecodeSettings(
                common,
                prefills,
                args.instance,
                shape,
                config.decode_pages,
                limits.decode_max_prompt,
                limits.context_window,
                waiting_timeout_s=config.waiting_timeout_s,
                device=config.device,
                # Instance j's boot counter under STATE/decodeJ, as in `serve all`: instances
                # given one --state-dir do not share a counter.
                state_dir=(
                    config.state_dir / f"decode{args.instance}"
                    if config.state_dir is not None and args.instance
                    else config.state_dir
                ),
                transport=config.transport,
            ),
            mode,
        )
    else:
        server = RouterServer(
            RouterSettings(common, prefills, decodes, limits.context_window), mode
        )
    runtime = Runtime()
    try:
        runtime.run(server.start())
        stop = _stop_on_signal()
        line: dict[str, Any] = {args.role: server.address, "limits": limits.as_json()}
        if server.metrics_port is not None:
            line["metrics"] = f"{args.host}:{server.metrics_port}"
        if args.json:
            from kvhandoff.cli import output

            output.print_json("serve", line)
        else:
            print(f"kvhandoff serve {args.role}: {server.address}", flush=True)
        _wait_for(stop)
        runtime.run(server.stop(grace=1.0))
    finally:
        runtime.close()
        server.event_log.close()
    return EXIT_OK


def _utf8(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"{what} is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} "
            "(the tokenizer takes UTF-8 text; give token ids with --prompt-tokens)"
        ) from None


def _read_prompt(args: argparse.Namespace) -> list[int]:
    from kvhandoff.impl.tokenizer import VOCAB_SIZE, encode

    if args.prompt is not None:
        # A non-UTF-8 argument reaches Python as lone surrogates (PEP 383): get the bytes back.
        raw = os.fsencode(args.prompt)
        return encode(_utf8(raw, "--prompt"))
    path: Path = args.prompt_file or args.prompt_tokens
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {str(path)!r}: {exc.strerror}") from exc
    text = _utf8(data, repr(str(path)))
    if args.prompt_file is not None:
        return encode(text)
    tokens: list[int] = []
    for word in text.split():
        try:
            value = int(word)
        except ValueError:
            raise UsageError(f"{str(path)!r}: token {word!r} is not an integer") from None
        if not 0 <= value < VOCAB_SIZE:
            raise UsageError(f"{str(path)!r}: token id {value} is outside 0..{VOCAB_SIZE - 1}")
        tokens.append(value)
    return tokens


def run_generate(args: argparse.Namespace) -> int:
    from kvhandoff.impl.client import Client

    tokens = _read_prompt(args)
    if args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    tls = _tls(args)
    if args.pki_dir is not None:
        if tls is not None:
            raise UsageError("--pki-dir and --tls-cert/--tls-key/--tls-ca exclude each other")
        from kvhandoff.impl.errors import ConfigError
        from kvhandoff.impl.tls import Pki

        if not (args.pki_dir / "ca.crt").is_file():
            raise UsageError(f"--pki-dir {str(args.pki_dir)!r} holds no CA (ca.crt)")
        try:
            tls = Pki.open(args.pki_dir).issue("client", args.tenant)
        except ConfigError as exc:
            raise UsageError(str(exc)) from exc
    with Client(args.router, tls=tls) as client:
        if args.retry and not args.request_id:
            raise UsageError("--retry needs the --request-id of the request that failed")
        result = client.generate(
            args.tenant, tokens, args.max_tokens, args.request_id, args.timeout, retry=args.retry
        )
    if args.json:
        from kvhandoff.cli import output

        output.print_json("generate", result.as_json())
    elif result.status == "ok":
        print(result.text)
    else:
        print(f"error {result.code}: {result.error}", file=sys.stderr)
    if result.status == "ok":
        return EXIT_OK
    # No answer (nothing listening, or no reply in time) is not a refusal: a script retries the
    # one and reports the other.
    return EXIT_INCONCLUSIVE if result.code in NO_ANSWER_CODES else EXIT_VIOLATED
