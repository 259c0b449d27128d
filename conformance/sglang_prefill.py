"""SGLang's prefill side in a process of its own, for the SGLang conformance harness.

Runs in the SGLang environment (`make venv-sglang`), started by `conformance.sglang_harness`
(never by kvhandoff's own environment). It owns what a prefill server owns in SGLang's
disaggregation: the bootstrap server (`MooncakeKVBootstrapServer`), the prefill
`MooncakeKVManager` over a CPU tensor that stands for the KV pool, and one `MooncakeKVSender` per
request. No model and no scheduler: a small loop plays the scheduler's part (admit, give the
sender its pages once decode's destination arrived, clear it when done) and reports what SGLang's
objects did as JSON lines on stdout. A crash is this process killed with SIGKILL; a restart is a
new process on the same bootstrap port.

Protocol (one JSON object per line). stdin, from the harness:
    {"op": "admit", "rid", "room", "tenant", "byte", "tokens", "limit"}
    {"op": "abort", "rid"}          the router withdrew the request (client cancel)
    {"op": "quit"}
stdout, to the harness: {"ready": true, "boot": N} once serving, then one
{"server": "prefill", "event", "args"} object per step (generation ids are the harness's: it adds
them, since SGLang names a transfer by its room only).
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kvhandoff.conformance.sglang_runtime import (
    KV_LAYERS,
    PAGE_BYTES,
    kv_args,
    prepare_sglang,
    publish_role,
)


def page_digest(pool: Any, page: int) -> str:
    """32 hex characters over one page's bytes in every layer (the log's `digest` width)."""
    h = hashlib.sha256()
    for layer in range(KV_LAYERS):
        h.update(pool[layer, page].numpy().tobytes())
    return h.hexdigest()[:32]


@dataclass
class _Req:
    rid: str
    room: int
    tenant: str
    tokens: int
    pages: list[int]
    sender: Any
    state: str = "bootstrapping"  # bootstrapping -> sending -> done
    cancelled: bool = False
    grant: list[int] = field(default_factory=list)


class PrefillSide:
    def __init__(self, bootstrap_port: int, pool_pages: int, page_size: int, boot: int) -> None:
        import torch

        prepare_sglang()
        from sglang.srt.disaggregation.mooncake.conn import (
            MooncakeKVBootstrapServer,
            MooncakeKVManager,
        )
        from sglang.srt.disaggregation.utils import DisaggregationMode

        self.boot = boot
        self.page_size = page_size
        self.addr = f"127.0.0.1:{bootstrap_port}"
        server_args = publish_role("prefill", bootstrap_port)
        self.bootstrap = MooncakeKVBootstrapServer(host="127.0.0.1", port=bootstrap_port)
        self.pool = torch.zeros(KV_LAYERS, pool_pages, PAGE_BYTES, dtype=torch.uint8)
        self.aux = torch.zeros(max(4, pool_pages), 16, dtype=torch.uint8)
        self.manager = MooncakeKVManager(
            kv_args(self.pool, self.aux, page_size), DisaggregationMode.PREFILL, server_args, False
        )
        self.free = list(range(pool_pages))
        self.reqs: dict[str, _Req] = {}
        self.lock = threading.Lock()
        self.out_lock = threading.Lock()
        # The scheduler is one thread in SGLang: a command (admit, abort) and a step of the
        # loop never interleave (else a cancel could fall between a grant and its writes).
        self.sched = threading.RLock()

    def emit(self, event: str, **args: Any) -> None:
        with self.out_lock:
            sys.stdout.write(json.dumps({"server": "prefill", "event": event, "args": args}) + "\n")
            sys.stdout.flush()

    # ------------------------------------------------------------------ commands

    def admit(self, cmd: dict[str, Any]) -> None:
        with self.sched:
            self._admit(cmd)

    def _admit(self, cmd: dict[str, Any]) -> None:
        from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender

        rid, room, tokens = str(cmd["rid"]), int(cmd["room"]), int(cmd["tokens"])
        if tokens > int(cmd["limit"]):
            # SGLang's scheduler refuses a prompt over its limit at intake
            # (`retire_unadmitted_request`): no sender is made, so decode is not told.
            self.emit(
                "prefill_reject_request",
                request_id=rid,
                room=room,
                tenant=cmd["tenant"],
                prompt_tokens=tokens,
                placeholder=False,
                reason=f"prompt of {tokens} tokens exceeds prefill's limit of {cmd['limit']} tokens",
            )
            self.emit(
                "prefill_finish_request",
                request_id=rid,
                status="error",
                code="OUT_OF_RANGE",
                reason="rejected at intake",
            )
            return
        n = -(-tokens // self.page_size)
        with self.lock:
            pages, self.free = self.free[:n], self.free[n:]
        for i, p in enumerate(pages):
            self.pool[:, p] = int(cmd["byte"])
            if i == n - 1 and tokens % self.page_size:
                # The last page holds only the prompt's remaining tokens.
                used = (tokens % self.page_size) * (PAGE_BYTES // self.page_size)
                self.pool[:, p, used:] = 0
        sender = MooncakeKVSender(self.manager, self.addr, room)
        with self.lock:
            self.reqs[rid] = _Req(rid, room, str(cmd["tenant"]), tokens, pages, sender)
        self.emit(
            "prefill_admit_request",
            request_id=rid,
            tenant=cmd["tenant"],
            room=room,
            prompt_tokens=tokens,
        )

    def abort(self, rid: str) -> None:
        with self.sched:
            self._abort(rid)

    def _abort(self, rid: str) -> None:
        with self.lock:
            req = self.reqs.get(rid)
        if req is None or req.state == "done":
            return
        req.cancelled = True
        req.sender.abort()
        self.emit("prefill_cancel_request", request_id=rid, reason="client cancelled")

    # ------------------------------------------------------------------ the scheduler's loop

    def step(self) -> None:
        with self.lock:
            reqs = [r for r in self.reqs.values() if r.state != "done"]
        for req in reqs:
            with self.sched:
                self._step(req)

    def _step(self, req: _Req) -> None:
        from sglang.srt.disaggregation.base.conn import KVPoll

        if req.state == "done":
            return
        status = req.sender.poll()
        if req.state == "bootstrapping" and status == KVPoll.WaitingForInput:
            info = self.manager.transfer_infos.get(req.room, {})
            grant: list[int] = []
            for ti in info.values():
                if not getattr(ti, "is_dummy", False):
                    grant = [int(x) for x in ti.dst_kv_indices]
            req.grant = grant
            self.emit(
                "prefill_receive_grant",
                request_id=req.rid,
                room=req.room,
                pages=grant,
                page_count=len(grant),
                prompt_tokens=req.tokens,
                outcome="matched",
            )
            self._send(req)
        elif status == KVPoll.Success and req.state == "sending":
            self.emit(
                "prefill_send_completion",
                request_id=req.rid,
                room=req.room,
                page_count=len(req.pages),
                pages_written=min(len(req.pages), len(req.grant)),
                prompt_tokens=req.tokens,
                digest="",
            )
            self._finish(req, "ok")
        elif status == KVPoll.Failed:
            with self.manager.failure_lock:
                reason = self.manager.failure_records.get(req.room, "failed")
            self._finish(req, "error", reason)

    def _send(self, req: _Req) -> None:
        import numpy as np

        req.sender.init(len(req.pages), aux_index=0)
        for i, page in enumerate(req.pages[: len(req.grant)]):
            self.emit(
                "prefill_write_page",
                request_id=req.rid,
                room=req.room,
                page=req.grant[i],
                index=i,
                message_id=0,
                digest=page_digest(self.pool, page),
            )
        req.state = "sending"
        req.sender.send(np.array(req.pages, dtype=np.int32))

    def _finish(self, req: _Req, status: str, reason: str = "") -> None:
        req.state = "done"
        args: dict[str, Any] = {"request_id": req.rid, "status": status}
        if status != "ok":
            args["code"] = "CANCELLED" if req.cancelled else "ABORTED"
            args["reason"] = reason
        self.emit("prefill_finish_request", **args)
        req.sender.clear()
        with self.lock:
            # SGLang's allocator returns pages without zeroing them.
            self.free = sorted(self.free + req.pages)


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m kvhandoff.conformance.sglang_prefill")
    p.add_argument("--bootstrap-port", type=int, required=True)
    p.add_argument("--pool-pages", type=int, required=True)
    p.add_argument("--page-size", type=int, required=True)
    p.add_argument("--boot", type=int, default=1)
    args = p.parse_args(argv)
    # The harness starts a standby process ahead of a crash: it imports SGLang now and waits for
    # a line on stdin before it binds anything (`go`).
    prepare_sglang()
    sys.stdout.write(json.dumps({"imported": True}) + "\n")
    sys.stdout.flush()
    if sys.stdin.readline().strip() != "go":
        return 0
    side = PrefillSide(args.bootstrap_port, args.pool_pages, args.page_size, args.boot)
    sys.stdout.write(json.dumps({"ready": True, "boot": args.boot}) + "\n")
    sys.stdout.flush()
    stop = threading.Event()

    def commands() -> None:
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "admit":
                side.admit(cmd)
            elif cmd["op"] == "abort":
                side.abort(str(cmd["rid"]))
            elif cmd["op"] == "quit":
                break
        stop.set()

    threading.Thread(target=commands, daemon=True).start()
    while not stop.is_set():
        side.step()
        time.sleep(0.005)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
