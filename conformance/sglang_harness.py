"""SGLang 0.5.23's disaggregation classes behind kvhandoff's harness service.

Runs in the SGLang environment (`make venv-sglang`); `kvhandoff conform --target sglang`
(`conformance.sglang_target`) starts it as a subprocess and speaks the harness protocol to it
(conformance/proto/.../harness.proto), so the two environments never share a process.

What is SGLang's and what is ours:
- SGLang's: `MooncakeKVBootstrapServer`, `MooncakeKVManager` (prefill and decode), one
  `MooncakeKVSender` and one `MooncakeKVReceiver` per request, their status polling, timeouts,
  heartbeat, abort notifications and drain acks, Mooncake's TCP transfers into decode's CPU pool.
- Ours (the stubs a scheduler would be): the router (answers the client; refuses a prompt over the
  context window), the allocators (lowest free pages first, never zeroed, as SGLang's are not),
  the limits checked at intake, and the copy "model" (decode generates by reading the pages).
  Prefill runs in its own process (`conformance.sglang_prefill`) so that a crash is a SIGKILL.

The event mapping (SGLang's step -> the kvhandoff event the spec explains):
    MooncakeKVReceiver made, init() -> WaitingForInput      decode_admit_request
    send_metadata(pages) (the destination pages: the grant) decode_reserve_pages
    sender.poll() WaitingForInput (transfer_infos arrived)  prefill_receive_grant
    sender.send(pages) (one-sided Mooncake writes queued)   prefill_write_page, one per page
    sender.poll() Success                                   prefill_send_completion (no digest)
    receiver.poll() Success; pages read from decode's pool  decode_receive_write (accepted: the
                                                            page holds the writer's bytes) and
                                                            decode_receive_completion validated
    receiver.poll() Failed, "Timed out ..." / "Lost ..."    decode_waiting_timeout /
                                                            decode_detect_prefill_restart
    receiver.abort() (client cancel)                        decode_abort_request
    is_abort_release_safe (prefill's ABORT ack)             decode_receive_abort_ack
    pages back to the allocator                             decode_release_pages (scrubbed false)
SGLang names a transfer by its bootstrap room only; a generation is the harness's id for each
reservation (`boot << 32 | n`), and prefill's lines carry the current one of their room.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from kvhandoff.conformance.target import (
    Event,
    Target,
    TargetAnswer,
    UnsupportedScenario,
    _tenant_byte,
    canary_owner,
    require_one_prefill_rank,
)
from kvhandoff.spec.config import Config

ROOT = Path(__file__).resolve().parent.parent
POOL_PAGES = 64
"""Pages of each side's CPU pool (registered with Mooncake once, for every trace)."""
SETTLE_S = 20.0
DEFERRED_RELEASE_S = 3.0
"""SGLang's SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT for these runs (default 30)."""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Prefill:
    """One prefill process (`conformance.sglang_prefill`); started importing, then `go`."""

    def __init__(self, port: int, page_size: int, boot: int) -> None:
        self.boot = boot
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kvhandoff.conformance.sglang_prefill",
                "--bootstrap-port",
                str(port),
                "--pool-pages",
                str(POOL_PAGES),
                "--page-size",
                str(page_size),
                "--boot",
                str(boot),
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=os.environ.copy(),
        )
        self.page_size = page_size
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.stdout: IO[str] = self.proc.stdout
        self.stdin: IO[str] = self.proc.stdin

    def _line(self, timeout: float) -> dict[str, Any]:
        line = self.stdout.readline()
        if not line:
            raise RuntimeError(
                f"the SGLang prefill process (boot {self.boot}) exited with "
                f"{self.proc.poll()} before it was ready"
            )
        value: dict[str, Any] = json.loads(line)
        return value

    def wait_imported(self) -> None:
        self._line(120)

    def go(self) -> None:
        self.send_raw("go")
        self._line(60)

    def send_raw(self, text: str) -> None:
        self.stdin.write(text + "\n")
        self.stdin.flush()

    def send(self, **cmd: Any) -> None:
        try:
            self.send_raw(json.dumps(cmd))
        except (BrokenPipeError, ValueError):
            pass  # a crashed prefill: the request is lost with it, as on a real crash

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


@dataclass
class _Req:
    r: int
    rid: str
    tenant: str
    tokens: int
    room: int
    state: str = "new"  # new, pages, waiting, held, done
    receiver: Any = None
    pages: list[int] = field(default_factory=list)
    generation: int = 0
    aborted: bool = False
    hold_deadline: float = 0.0
    prefill_done: bool = False
    decode_done: bool = False
    error: str = ""


class SglangEngine(Target):
    """The coarse target the harness serves: client operations, prefill crashes, settle."""

    name = "sglang"
    fine_grained = False

    def __init__(self) -> None:
        self.port = _free_port()
        self.page_size = 0
        self.prefill: _Prefill | None = None
        self.standby: _Prefill | None = None
        self.boot = 0
        self.decode: Any = None
        self.trace_no = 0
        self.lock = threading.RLock()
        self.events: list[Event] = []
        self.seq: dict[str, int] = {}
        self.reqs: dict[int, _Req] = {}
        self.by_rid: dict[str, _Req] = {}
        self.results: dict[int, TargetAnswer] = {}
        self.gen_counter = 0
        self.last_headers: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._driver: threading.Thread | None = None
        self.reuse_rooms = os.environ.get("KVHANDOFF_SGLANG_REUSE_ROOMS") == "1"
        # SGLang's allocators never zero a freed page (finding 1 in docs/sglang.md); with
        # KVHANDOFF_SGLANG_SCRUB=1 the harness's decode allocator does, to look past it.
        self.scrub = os.environ.get("KVHANDOFF_SGLANG_SCRUB") == "1"

    # ------------------------------------------------------------------ processes

    def _spawn_standby(self) -> None:
        self.standby = _Prefill(self.port, self.page_size, self.boot + 1)

    def _start_prefill(self) -> None:
        if self.standby is None:
            self._spawn_standby()
        assert self.standby is not None
        self.standby.wait_imported()
        self.prefill, self.standby = self.standby, None
        self.prefill.go()
        self.boot = self.prefill.boot
        threading.Thread(target=self._read_prefill, args=(self.prefill,), daemon=True).start()
        self._spawn_standby()  # imports SGLang now, ready for the next crash

    def _start_decode(self) -> None:
        import torch
        from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager
        from sglang.srt.disaggregation.utils import DisaggregationMode

        from kvhandoff.conformance.sglang_runtime import (
            KV_LAYERS,
            PAGE_BYTES,
            kv_args,
            publish_role,
        )

        server_args = publish_role("decode", self.port)
        self.pool = torch.zeros(KV_LAYERS, POOL_PAGES, PAGE_BYTES, dtype=torch.uint8)
        self.aux = torch.zeros(POOL_PAGES, 16, dtype=torch.uint8)
        self.decode = MooncakeKVManager(
            kv_args(self.pool, self.aux, self.page_size),
            DisaggregationMode.DECODE,
            server_args,
            False,
        )
        self._driver = threading.Thread(target=self._drive, daemon=True)
        self._driver.start()

    # ------------------------------------------------------------------ the log

    def emit(self, server: str, event: str, **args: Any) -> None:
        with self.lock:
            n = self.seq.get(server, 0) + 1
            self.seq[server] = n
            self.events.append({"seq": n, "server": server, "event": event, "args": args})

    def _read_prefill(self, proc: _Prefill) -> None:
        for line in proc.stdout:
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                continue
            if ev.get("server") != "prefill":
                continue
            with self.lock:
                if proc is not self.prefill:
                    continue
                args = ev["args"]
                req = self.by_rid.get(str(args.get("request_id")))
                if req is None:
                    continue
                if ev["event"] in (
                    "prefill_receive_grant",
                    "prefill_write_page",
                    "prefill_send_completion",
                ):
                    args["generation"] = req.generation
                self.emit("prefill", ev["event"], **args)
                if ev["event"] == "prefill_finish_request":
                    req.prefill_done = True
                    if args.get("status") != "ok" and req.r not in self.results:
                        # The router answers with prefill's error (its reject or failure).
                        self._answer(req, False, str(args.get("code", "ABORTED")), args)

    # ------------------------------------------------------------------ Target API

    def start(self, config: Config, mode: str) -> None:
        require_one_prefill_rank(config)
        if mode != "reference":
            raise UnsupportedScenario(
                f"mode {mode!r}: the sglang target runs SGLang as installed (mode reference)"
            )
        if any(q.pages > POOL_PAGES for q in config.requests) or config.decode_pages > POOL_PAGES:
            raise UnsupportedScenario(f"the sglang target's pools hold {POOL_PAGES} pages")
        if self.decode is None:
            self.page_size = config.page_size
            self._start_prefill()
            self._start_decode()
        elif config.page_size != self.page_size:
            raise UnsupportedScenario(
                f"page_size {config.page_size}: this harness started with {self.page_size}"
            )
        self.settle()
        with self.lock:
            self.trace_no += 1
            self.config = config
            self.events = []
            self.seq = {}
            self.reqs = {}
            self.by_rid = {}
            self.results = {}
            self.free = list(range(config.decode_pages))
            self.last_headers = [self._header()]
        self._restarted = False

    def _header(self) -> dict[str, Any]:
        c = self.config
        return {
            "kvhandoff_trace": 1,
            "kind": "event_log",
            "server": "merged",
            "mode": "reference",
            "engine": "sglang 0.5.23 (mooncake, tcp)",
            "config": {
                "page_size": c.page_size,
                "decode_pages": c.decode_pages,
                "context_window": c.context_window * c.page_size,
                "prefill_max_prompt": c.prefill_max_prompt * c.page_size,
                "decode_max_prompt": c.decode_max_prompt * c.page_size,
            },
        }

    def request_id(self, r: int) -> str:
        return f"t{self.trace_no}r{r}"

    def submit(self, r: int) -> None:
        from sglang.srt.disaggregation.mooncake.conn import MooncakeKVReceiver

        c = self.config
        q = c.requests[r]
        tokens = self.prompt_tokens(c, r)
        # SGLang's router draws a fresh bootstrap room per request; the scenario's rooms are
        # reused only with `reuse_rooms` (rooms collide inside SGLang: docs/sglang.md).
        room = self.trace_no * 1000 + (q.room if self.reuse_rooms else 100 + r)
        req = _Req(r, self.request_id(r), q.tenant, tokens, room)
        with self.lock:
            self.reqs[r] = req
            self.by_rid[req.rid] = req
            if tokens > c.context_window * c.page_size:
                # Refused at the door: logged as the reject alone (no submit line).
                self.emit(
                    "router",
                    "router_reject_request",
                    request_id=req.rid,
                    tenant=q.tenant,
                    room=room,
                    prompt_tokens=tokens,
                    max_tokens=tokens,
                    code="OUT_OF_RANGE",
                    reason=f"prompt of {tokens} tokens is over the context window",
                )
                self.results[r] = TargetAnswer(False, "OUT_OF_RANGE", "over the context window")
                req.state, req.prefill_done, req.decode_done = "done", True, True
                return
            self.emit(
                "router",
                "router_submit_request",
                request_id=req.rid,
                tenant=q.tenant,
                room=room,
                prompt_tokens=tokens,
                max_tokens=tokens,
            )
        assert self.prefill is not None
        self.prefill.send(
            op="admit",
            rid=req.rid,
            room=room,
            tenant=q.tenant,
            byte=_tenant_byte(q.tenant),
            tokens=tokens,
            limit=c.prefill_max_prompt * c.page_size,
        )
        with self.lock:
            if tokens > c.decode_max_prompt * c.page_size:
                self.emit(
                    "decode",
                    "decode_reject_request",
                    request_id=req.rid,
                    tenant=q.tenant,
                    room=room,
                    prompt_tokens=tokens,
                    code="OUT_OF_RANGE",
                    reason="over decode's limit",
                )
                req.state, req.decode_done = "done", True
                if r not in self.results:
                    self._answer(req, False, "OUT_OF_RANGE", {})
                return
            addr = f"127.0.0.1:{self.port}"
            self.decode.try_ensure_parallel_info(addr)
            req.receiver = MooncakeKVReceiver(self.decode, addr, room)
            req.receiver.init(0)
            self.emit(
                "decode",
                "decode_admit_request",
                request_id=req.rid,
                tenant=q.tenant,
                room=room,
                prompt_tokens=tokens,
                max_tokens=tokens,
            )
            req.state = "pages"

    def cancel(self, r: int) -> bool:
        with self.lock:
            req = self.reqs.get(r)
            if req is None or r in self.results:
                return False
            self.emit("router", "client_cancel_request", request_id=req.rid, tenant=req.tenant)
            self.results[r] = TargetAnswer(False, "CANCELLED", "cancelled by the client")
            self.emit(
                "router",
                "router_answer_client",
                request_id=req.rid,
                tenant=req.tenant,
                status="error",
                code="CANCELLED",
            )
            if self.prefill is not None and not req.prefill_done:
                self.prefill.send(op="abort", rid=req.rid)
            if req.state in ("pages", "waiting"):
                req.aborted = True
                req.receiver.abort()
                self.emit(
                    "decode",
                    "decode_abort_request",
                    request_id=req.rid,
                    generation=req.generation or None,
                    reason="client cancelled",
                )
        return True

    def restart_prefill(self) -> None:
        assert self.prefill is not None
        old = self.prefill
        with self.lock:
            for req in self.reqs.values():
                req.prefill_done = True  # whatever prefill held died with it
        old.kill()
        # KVHANDOFF_SGLANG_DOWN_S: how long prefill stays dead before its new process serves
        # (0: at once, from a standby that has imported SGLang already).
        time.sleep(float(os.environ.get("KVHANDOFF_SGLANG_DOWN_S", "0")))
        self._start_prefill()
        with self.lock:
            self._restarted = True
            self.emit("prefill", "prefill_restart", boot_epoch=self.boot)

    def restart_decode(self) -> None:
        raise UnsupportedScenario(
            "the sglang target does not restart decode (its KV manager lives in this process)"
        )

    def settle(self) -> None:
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            with self.lock:
                busy = [q for q in self.reqs.values() if not (q.decode_done and q.prefill_done)]
            if not busy:
                return
            time.sleep(0.02)

    def wait_answered(self, r: int) -> None:
        deadline = time.monotonic() + SETTLE_S
        while r in self.reqs and r not in self.results and time.monotonic() < deadline:
            time.sleep(0.01)

    def take_events(self) -> list[Event]:
        with self.lock:
            out, self.events = self.events, []
        return out

    def answers(self) -> dict[int, TargetAnswer]:
        with self.lock:
            return dict(self.results)

    def quiescent(self) -> bool:
        with self.lock:
            return (
                all(q.decode_done and q.prefill_done for q in self.reqs.values())
                and len(self.free) == self.config.decode_pages
            )

    def describe(self) -> str:
        with self.lock:
            return (
                ", ".join(
                    f"{q.rid}: decode {q.state}{'' if q.prefill_done else ', prefill busy'}"
                    + (f" (SGLang raised {q.error})" if q.error else "")
                    for q in self.reqs.values()
                    if not (q.decode_done and q.prefill_done)
                )
                + f"; {self.config.decode_pages - len(self.free)} decode pages held"
            )

    def page_contents(self) -> dict[int, str | None] | None:
        return None

    def close(self) -> None:
        return None

    def shutdown(self) -> None:
        self._stop.set()
        for p in (self.prefill, self.standby):
            if p is not None:
                p.kill()
        self.prefill = self.standby = None

    # ------------------------------------------------------------------ decode's scheduler stub

    def _answer(self, req: _Req, ok: bool, code: str, info: dict[str, Any]) -> None:
        self.results.setdefault(
            req.r, TargetAnswer(ok, "" if ok else code, str(info.get("reason", "")))
        )
        args: dict[str, Any] = {
            "request_id": req.rid,
            "tenant": req.tenant,
            "status": "ok" if ok else "error",
        }
        if not ok:
            args["code"] = code
        self.emit("router", "router_answer_client", **args)

    def _drive(self) -> None:
        while not self._stop.is_set():
            try:
                with self.lock:
                    for req in list(self.reqs.values()):
                        if req.error:
                            continue
                        try:
                            self._step(req)
                        except Exception as exc:
                            # SGLang raised inside a poll: the request is stuck there (describe
                            # says why; the run does not settle).
                            req.error = f"{type(exc).__name__}: {exc}"
                            print(f"sglang harness: {req.rid}: {req.error}", file=sys.stderr)
            except Exception as exc:  # keep driving
                print(f"sglang harness: driver: {type(exc).__name__}: {exc}", file=sys.stderr)
            time.sleep(0.005)

    def _step(self, req: _Req) -> None:
        import numpy as np
        from sglang.srt.disaggregation.base.conn import KVPoll

        if req.state == "pages":
            status = req.receiver.poll()
            if status == KVPoll.Failed:
                self._fail(req)
                return
            n = -(-req.tokens // self.page_size)
            if len(self.free) < n:
                return  # decode waits for free pages (its prealloc queue)
            req.pages, self.free = self.free[:n], self.free[n:]
            self.gen_counter += 1
            req.generation = (1 << 32) | self.gen_counter
            self.emit(
                "decode",
                "decode_reserve_pages",
                request_id=req.rid,
                tenant=req.tenant,
                room=req.room,
                generation=req.generation,
                pages=req.pages,
                page_count=n,
            )
            req.receiver.send_metadata(np.array(req.pages, dtype=np.int32), aux_index=req.pages[0])
            req.state = "waiting"
        elif req.state == "waiting":
            status = req.receiver.poll()
            if status == KVPoll.Success:
                self._complete(req)
            elif status == KVPoll.Failed:
                self._fail(req)
        elif req.state == "held":
            safe = self.decode.is_abort_release_safe(req.room, 1)
            if safe:
                self.emit(
                    "decode",
                    "decode_receive_abort_ack",
                    request_id=req.rid,
                    room=req.room,
                    generation=req.generation,
                    matched=True,
                )
            if safe or time.monotonic() >= req.hold_deadline:
                self._release(req, "drained" if safe else "abort_ack_timeout")

    def _complete(self, req: _Req) -> None:
        from kvhandoff.conformance.sglang_prefill import page_digest

        tenants = list(self.config.tenants)
        read: list[str | None] = []
        for p in req.pages:
            owner = canary_owner(int(self.pool[0, p, 0]), tenants)
            read.append(owner)
            self.emit(
                "decode",
                "decode_receive_write",
                request_id=req.rid,
                room=req.room,
                generation=req.generation,
                page=p,
                message_id=0,
                digest=page_digest(self.pool, p),
                outcome="accepted",
            )
        self.emit(
            "decode",
            "decode_receive_completion",
            request_id=req.rid,
            room=req.room,
            generation=req.generation,
            page_count=len(req.pages),
            digest="",
            verdict="validated",
        )
        self.emit(
            "decode",
            "decode_generate",
            request_id=req.rid,
            generation=req.generation,
            pages=req.pages,
            page_count=len(req.pages),
            prompt_tokens=req.tokens,
            tokens_generated=req.tokens,
        )
        self.emit(
            "decode",
            "decode_answer",
            request_id=req.rid,
            tenant=req.tenant,
            generation=req.generation,
            status="ok",
        )
        foreign = [
            (
                ",".join(
                    self.request_id(i) for i, q in enumerate(self.config.requests) if q.tenant == t
                ),
                t,
            )
            for t in sorted({t for t in read if t is not None and t != req.tenant})
        ]
        if req.r not in self.results:
            self.results[req.r] = TargetAnswer(True, read=read, foreign=foreign)
            self.emit(
                "router", "router_answer_client", request_id=req.rid, tenant=req.tenant, status="ok"
            )
        req.receiver.clear()
        self._release(req, "answered")

    def _fail(self, req: _Req) -> None:
        with self.decode.failure_lock:
            reason = str(self.decode.failure_records.pop(req.room, "failed"))
        if "Timed out" in reason or "timed out" in reason:
            self.emit(
                "decode",
                "decode_waiting_timeout",
                request_id=req.rid,
                generation=req.generation or None,
                waited_s=float(os.environ.get("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "0")),
            )
        elif "Lost connection" in reason:
            self.emit(
                "decode",
                "decode_detect_prefill_restart",
                old_epoch=self.boot - 1,
                new_epoch=None,
                reason=reason,
                failed=[req.rid],
            )
        code = "CANCELLED" if req.aborted else "ABORTED"
        self.emit(
            "decode",
            "decode_answer",
            request_id=req.rid,
            tenant=req.tenant,
            generation=req.generation or None,
            status="error",
            code=code,
        )
        if req.r not in self.results:
            self._answer(req, False, code, {"reason": reason})
        req.receiver.clear()
        if req.pages and req.aborted:
            # SGLang's decode holds an aborted transfer's pages until prefill's drain ack or
            # SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT (on by default).
            req.state = "held"
            req.hold_deadline = time.monotonic() + DEFERRED_RELEASE_S
            return
        self._release(req, reason[:60] if req.pages else "")

    def _release(self, req: _Req, reason: str) -> None:
        if req.pages:
            self.emit(
                "decode",
                "decode_release_pages",
                request_id=req.rid,
                generation=req.generation,
                pages=req.pages,
                page_count=len(req.pages),
                scrubbed=self.scrub,
                reason=reason,
            )
            if self.scrub:
                self.pool[:, req.pages] = 0
            self.free = sorted(self.free + req.pages)
        req.state = "done"
        req.decode_done = True


def main(argv: list[str]) -> int:
    import argparse

    from kvhandoff.conformance.harness_server import ListenError, serve
    from kvhandoff.conformance.sglang_runtime import DEFERRED_ENV, prepare_sglang

    p = argparse.ArgumentParser(prog="python -m kvhandoff.conformance.sglang_harness")
    p.add_argument("--listen", default="127.0.0.1:0")
    args = p.parse_args(argv)
    os.environ.update(DEFERRED_ENV)
    prepare_sglang()
    engine = SglangEngine()
    try:
        server = serve(args.listen, "sglang", factory=lambda: engine)
    except ListenError as exc:
        print(f"sglang harness: {exc}", file=sys.stderr)
        return 2
    print(f"LISTENING {server.address}", flush=True)
    try:
        sys.stdin.read()  # the parent closes stdin (or dies): stop
    finally:
        engine.shutdown()
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
