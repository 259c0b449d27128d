"""Prometheus metrics, derived from the event log so the two never disagree.

Built on ``prometheus_client``: one registry per server (a test cluster runs three servers in one
process, each with its own ``/metrics``), every series labelled ``server="<role>"``. Each metric
is declared once in `DECLARED` with its help text and label names, so a name always carries the
same labels; a name not declared there (a new caller) gets the labels of its first use.

The API stays small for the servers: `inc` (counter), `gauge` (read at scrape time), `time`
(histogram of seconds), `observe` (one event-log line), `get` (tests), `serve`, `close`.
"""

from __future__ import annotations

import math
import threading
import time as _time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# `<name>_created` timestamps per series double the exposition and no dashboard of ours reads them.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

# Seconds: from a local handoff (milliseconds) to a request stuck behind a full pool.
SECONDS_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


@dataclass(frozen=True)
class Declared:
    kind: str  # "counter" | "histogram"
    help: str
    labels: tuple[str, ...] = ()
    # Exposed at 0 from the start (unlabelled only) so dashboards and alerts see them before the
    # first event.
    eager: bool = False


DECLARED: dict[str, Declared] = {
    "kvhandoff_events_total": Declared("counter", "Event-log lines written, by event.", ("event",)),
    "kvhandoff_admission_failures_total": Declared(
        "counter", "Requests refused at admission (*_reject_request events).", eager=True
    ),
    "kvhandoff_validation_failures_total": Declared(
        "counter", "Completions decode refused to validate, by reason.", ("reason",)
    ),
    "kvhandoff_refused_writes_total": Declared(
        "counter", "Page writes decode refused, by reason.", ("reason",)
    ),
    "kvhandoff_invariant_alarms_total": Declared(
        "counter", "Broken invariants decode noticed but could not prevent (bug modes).", ("alarm",)
    ),
    "kvhandoff_requests_total": Declared(
        "counter",
        "Client requests answered by the router, by status (ok/error) and gRPC code.",
        ("status", "code"),
    ),
    "kvhandoff_handoffs_total": Declared("counter", "Handoffs completed and validated at decode."),
    "kvhandoff_handoff_seconds_total": Declared(
        "counter", "Seconds spent in validated handoffs (first page write to completion)."
    ),
    "kvhandoff_handoff_pages_total": Declared("counter", "Pages moved by validated handoffs."),
    "kvhandoff_handoff_bytes_total": Declared("counter", "Bytes moved by validated handoffs."),
    "kvhandoff_landed_pages_total": Declared(
        "counter", "Decode: pages accepted from one-sided writes (--transport mooncake)."
    ),
    "kvhandoff_request_duration_seconds": Declared(
        "histogram",
        "Router: seconds from admitting a request to answering the client, by status.",
        ("status",),
    ),
    "kvhandoff_handoff_duration_seconds": Declared(
        "histogram",
        "Decode: seconds from reserving a request's pages to a validated completion.",
    ),
    "kvhandoff_queue_wait_seconds": Declared(
        "histogram",
        "Prefill: seconds an admitted request waited for decode's grant (free pages).",
    ),
    "kvhandoff_rpc_duration_seconds": Declared(
        "histogram", "Seconds each served RPC took, by method and gRPC code.", ("method", "code")
    ),
}
_DEFAULT_HELP = "kvhandoff metric (see docs/event-log.md)."
# Start-time maps are bounded: a request whose end event never comes (a crash) must not grow them.
_MAX_OPEN = 100_000


class _Readers(Collector):
    """Values read at scrape time (pool state, cumulative timers kept by the servers)."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.reads: dict[str, tuple[str, Callable[[], float]]] = {}

    def collect(self) -> Iterable[Metric]:
        for name, (help_text, read) in sorted(self.reads.items()):
            family: CounterMetricFamily | GaugeMetricFamily
            if name.endswith("_total"):
                # A cumulative timer is a counter: rate() works on it, and its name says so.
                family = CounterMetricFamily(name[: -len("_total")], help_text, labels=["server"])
            else:
                family = GaugeMetricFamily(name, help_text, labels=["server"])
            family.add_metric([self.server], read())
            yield family


class Metrics:
    def __init__(self, server: str) -> None:
        self.server = server
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._metrics: dict[str, tuple[Counter | Histogram, tuple[str, ...]]] = {}
        self._readers = _Readers(server)
        self.registry.register(self._readers)
        self._http: ThreadingHTTPServer | None = None
        self._started: dict[tuple[str, str], float] = {}
        for name, decl in DECLARED.items():
            if decl.eager:
                self._child(name, {}, decl.kind)

    # --- the servers' API ---------------------------------------------------------------------

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        child = self._child(name, labels, "counter")
        assert isinstance(child, Counter)
        child.inc(value)

    def time(self, name: str, seconds: float, **labels: str) -> None:
        """One observation of a histogram of seconds."""
        child = self._child(name, labels, "histogram")
        assert isinstance(child, Histogram)
        child.observe(seconds)

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        """A value read at scrape time; a name ending in `_total` is exposed as a counter."""
        help_text = {
            "kvhandoff_pages_free": "Decode pool pages free.",
            "kvhandoff_pages_used": "Decode pool pages held by requests.",
            "kvhandoff_parked_grants": "Prefill: grants waiting for their request to arrive.",
            "kvhandoff_validation_seconds_total": "Decode: seconds spent validating completions.",
            "kvhandoff_sender_digest_seconds_total": "Prefill: seconds spent digesting pages.",
        }.get(name, _DEFAULT_HELP)
        self._readers.reads[name] = (help_text, read)

    def get(self, name: str, **labels: str) -> float:
        """Sum of the series of `name` matching `labels` (a histogram: its observation count)."""
        wanted = {name, f"{name}_total", f"{name}_count"}
        total = 0.0
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name in wanted and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    total += sample.value
        return total

    def observe(self, event: str, args: Mapping[str, Any]) -> None:
        """Count one event-log line; time the spans between paired lines."""
        self.inc("kvhandoff_events_total", event=event)
        rid = str(args.get("request_id", ""))
        if event.endswith("_reject_request"):
            self.inc("kvhandoff_admission_failures_total")
        if event == "decode_receive_write" and args.get("outcome") == "refused":
            self.inc("kvhandoff_refused_writes_total", reason=str(args.get("reason", "")))
        elif event == "decode_receive_completion" and args.get("verdict") == "failed":
            self.inc("kvhandoff_validation_failures_total", reason=str(args.get("reason", ""))[:40])
        elif event == "invariant_alarm":
            self.inc("kvhandoff_invariant_alarms_total", alarm=str(args.get("alarm", "")))
        # Router: a request refused at the door is answered at once.
        if event == "router_reject_request":
            self.inc("kvhandoff_requests_total", status="error", code=str(args.get("code", "")))
            self.time("kvhandoff_request_duration_seconds", 0.0, status="error")
        elif event == "router_submit_request":
            self._start("request", rid)
        elif event == "router_answer_client":
            status = str(args.get("status", ""))
            self.inc("kvhandoff_requests_total", status=status, code=str(args.get("code", "OK")))
            self._stop("request", rid, "kvhandoff_request_duration_seconds", status=status)
        # Decode: pages reserved -> completion validated.
        elif event == "decode_reserve_pages":
            self._start("handoff", rid)
        elif event == "decode_receive_completion" and args.get("verdict") == "validated":
            self._stop("handoff", rid, "kvhandoff_handoff_duration_seconds")
        elif event == "decode_release_pages":
            self._started.pop(("handoff", rid), None)
        # Prefill: admitted -> decode's grant matched (waiting for free pages at decode).
        elif event == "prefill_admit_request":
            self._start("queue", rid)
        elif event == "prefill_receive_grant" and args.get("outcome") == "matched":
            self._stop("queue", rid, "kvhandoff_queue_wait_seconds")
        elif event == "prefill_finish_request":
            self._started.pop(("queue", rid), None)

    def render(self) -> str:
        return _integral(prometheus_client.generate_latest(self.registry).decode())

    def serve(self, host: str, port: int) -> int:
        """Serve `render()` on http://host:port/metrics (port 0: any free one); returns the port.

        A plain HTTP server rather than prometheus_client's own, which would skip `render()`'s
        integer formatting."""
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, f"no such path {self.path!r}; try /metrics")
                    return
                body = metrics.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", prometheus_client.CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep stderr for the servers' own output

        self._http = ThreadingHTTPServer((host, port), Handler)
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        return int(self._http.server_address[1])

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    # --- internals ----------------------------------------------------------------------------

    def _start(self, span: str, rid: str) -> None:
        with self._lock:
            if len(self._started) >= _MAX_OPEN:
                self._started.pop(next(iter(self._started)))
            self._started[(span, rid)] = _time.monotonic()

    def _stop(self, span: str, rid: str, histogram: str, **labels: str) -> None:
        with self._lock:
            began = self._started.pop((span, rid), None)
        if began is not None:
            self.time(histogram, _time.monotonic() - began, **labels)

    def _child(self, name: str, labels: Mapping[str, str], kind: str) -> Counter | Histogram:
        with self._lock:
            entry = self._metrics.get(name)
            if entry is None:
                decl = DECLARED.get(name) or Declared(kind, _DEFAULT_HELP, tuple(sorted(labels)))
                if decl.kind != kind:
                    raise ValueError(f"metric {name} is a {decl.kind}, not a {kind}")
                names = ("server", *decl.labels)
                metric: Counter | Histogram
                if kind == "counter":
                    metric = Counter(name, decl.help, names, registry=self.registry)
                else:
                    metric = Histogram(
                        name, decl.help, names, registry=self.registry, buckets=SECONDS_BUCKETS
                    )
                entry = (metric, decl.labels)
                self._metrics[name] = entry
        metric, label_names = entry
        if set(labels) != set(label_names):
            raise ValueError(
                f"metric {name} takes labels {sorted(label_names)}, got {sorted(labels)}"
            )
        return metric.labels(server=self.server, **labels)


def _integral(text: str) -> str:
    """prometheus_client writes every value as a float, whole ones as `16.0` or, from a million
    on, `1.234567e+06`; a count reads better, and greps exactly, as `16` and `1234567`.

    The value is the last field of a sample line (no timestamps are written); label values with
    spaces sit inside the braces before it."""
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            head, _, value = line.rpartition(" ")
            try:
                number = float(value)
            except ValueError:
                number = math.nan
            if number.is_integer() and abs(number) < 2**53:
                line = f"{head} {int(number)}"
        out.append(line)
    return "\n".join(out) + "\n"


class RpcTimer(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped
    """Times every served unary and client-streaming RPC into `kvhandoff_rpc_duration_seconds`.

    An interceptor, not code in each handler: the servers' handlers stay about the protocol, and
    a new RPC is timed without anyone remembering to."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        # "/kvhandoff.v1.Decode/WritePages" -> "Decode/WritePages"
        method = str(handler_call_details.method).lstrip("/").split(".")[-1]
        metrics = self.metrics

        def timed(inner: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Any]:
            async def wrapped(request: Any, context: Any) -> Any:
                began = _time.perf_counter()
                code = "OK"
                try:
                    return await inner(request, context)
                except BaseException:
                    code = _code_name(context)
                    raise
                finally:
                    metrics.time(
                        "kvhandoff_rpc_duration_seconds",
                        _time.perf_counter() - began,
                        method=method,
                        code=code,
                    )

            return wrapped

        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                timed(handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                timed(handler.stream_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler  # server streaming (health Watch): a duration means nothing there


def _code_name(context: Any) -> str:
    try:
        code = context.code()
    except Exception:  # an older grpc without ServicerContext.code()
        code = None
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    return "UNKNOWN" if code is None else str(code)
