"""Prometheus metrics, derived from the event log so the two never disagree.

Served as text exposition on ``/metrics`` by a plain HTTP server on a chosen port (0 = any).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Metrics:
    def __init__(self, server: str) -> None:
        self.server = server
        self._lock = threading.Lock()
        self._counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(float)
        self._gauges: dict[str, Callable[[], float]] = {}
        self._http: ThreadingHTTPServer | None = None
        # Exposed from the start (at 0) so dashboards and alerts see them before the first event.
        for name in (
            "kvhandoff_admission_failures_total",
            "kvhandoff_validation_failures_total",
            "kvhandoff_refused_writes_total",
            "kvhandoff_invariant_alarms_total",
        ):
            self._counters[(name, ())] = 0.0

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counters[key] += value

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        self._gauges[name] = read

    def get(self, name: str, **labels: str) -> float:
        with self._lock:
            return sum(
                v
                for (n, lab), v in self._counters.items()
                if n == name and all((k, val) in lab for k, val in labels.items())
            )

    def observe(self, event: str, args: Mapping[str, Any]) -> None:
        """Count one event-log line."""
        self.inc("kvhandoff_events_total", event=event)
        if event.endswith("_reject_request"):
            self.inc("kvhandoff_admission_failures_total")
        elif event == "decode_receive_write" and args.get("outcome") == "refused":
            self.inc("kvhandoff_refused_writes_total", reason=str(args.get("reason", "")))
        elif event == "decode_receive_completion" and args.get("verdict") == "failed":
            self.inc("kvhandoff_validation_failures_total", reason=str(args.get("reason", ""))[:40])
        elif event == "invariant_alarm":
            self.inc("kvhandoff_invariant_alarms_total", alarm=str(args.get("alarm", "")))

    def render(self) -> str:
        out: list[str] = []
        with self._lock:
            items = sorted(self._counters.items())
        seen: set[str] = set()
        for (name, labels), value in items:
            if name not in seen:
                out.append(f"# TYPE {name} counter")
                seen.add(name)
            lab = ",".join(f'{k}="{_escape(v)}"' for k, v in (("server", self.server), *labels))
            out.append(f"{name}{{{lab}}} {value:g}")
        for name, read in sorted(self._gauges.items()):
            out.append(f"# TYPE {name} gauge")
            out.append(f'{name}{{server="{self.server}"}} {read():g}')
        return "\n".join(out) + "\n"

    def serve(self, host: str, port: int) -> int:
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_error(404, f"no such path {self.path!r}; try /metrics")
                    return
                body = metrics.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
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


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
