"""Drive the three protocol cores together in-process: a fake network and a fake clock.

This is the reference way to run the cores without gRPC or torch (the conformance suite can use it
or copy its shape). Messages between workers are queued and delivered one at a time, in order,
unless a test holds a kind of message back (``hold``) to reorder or delay it. Page *content* is a
ghost tag ``(request_id, tenant)`` of the last write that landed, so a test can see exactly whose
data an answer was generated from.

    net = InProcessCluster(get_mode("incident").behaviour, decode_pages=16, ...)
    net.submit("a1", "A", prompt_len=20); net.run()
    net.answers["a1"].read_tenants  # tenants whose pages decode generated from
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from kvhandoff.impl.core import decode as dc
from kvhandoff.impl.core import prefill as pc
from kvhandoff.impl.core import router as rc
from kvhandoff.impl.core.common import (
    Generation,
    Log,
    PageId,
    Reply,
    RequestId,
    Room,
    Status,
    Tenant,
    pages_for,
)
from kvhandoff.impl.modes import Behaviour


@dataclass
class Answer:
    status: Status
    message: str
    read_tenants: list[str | None] = field(default_factory=list)


@dataclass
class _Msg:
    kind: str
    deliver: Callable[[], object]


class InProcessCluster:
    def __init__(
        self,
        behaviour: Behaviour,
        *,
        page_size: int = 4,
        decode_pages: int = 32,
        prefill_max_prompt: int = 64,
        decode_max_prompt: int = 128,
        context_window: int = 128,
        waiting_timeout_s: float = 30.0,
        orphan_grant_timeout_s: float = 10.0,
        prefill_epoch: int = 1,
    ) -> None:
        self.behaviour = behaviour
        self.page_size = page_size
        self.now = 0.0
        self.router = rc.RouterCore(rc.RouterConfig(context_window, behaviour=behaviour))
        self.prefill = pc.PrefillCore(
            pc.PrefillConfig(
                page_size, prefill_max_prompt, orphan_grant_timeout_s, behaviour=behaviour
            )
        )
        self.decode = dc.DecodeCore(
            dc.DecodeConfig(
                decode_pages,
                page_size,
                decode_max_prompt,
                waiting_timeout_s=waiting_timeout_s,
                behaviour=behaviour,
            ),
            generation_base=1 << 32,
        )
        self.prefill_epoch = prefill_epoch
        self.queue: deque[_Msg] = deque()
        self.held: deque[_Msg] = deque()
        self.hold_kinds: set[str] = set()
        self.content: dict[PageId, tuple[str, str] | None] = {
            PageId(p): None for p in range(decode_pages)
        }
        self.tenants: dict[RequestId, Tenant] = {}
        self.answers: dict[RequestId, Answer] = {}
        self.log: list[tuple[str, str, dict[str, object]]] = []
        self.fail_writes: set[RequestId] = set()
        self._reads: dict[RequestId, list[str | None]] = {}
        self._writers: dict[tuple[RequestId, int], deque[tuple[int, PageId]]] = {}
        self._tokens = 0

    # ------------------------------------------------------------------ test controls

    def submit(
        self,
        rid: str,
        tenant: str,
        prompt_len: int,
        max_tokens: int = 4,
        room: int | None = None,
        retry: bool = False,
    ) -> None:
        """The client submits a request; ``retry=True`` retries an id that got an error."""
        r = RequestId(rid)
        if retry:
            self.answers.pop(r, None)
        self.tenants[r] = Tenant(tenant)
        room_id = Room(room if room is not None else len(self.tenants) * 1000 + 7)
        self.to_router(
            rc.ClientSubmit(
                r, Tenant(tenant), room_id, prompt_len, max_tokens, self.now, retry=retry
            )
        )

    def cancel(self, rid: str) -> None:
        self.to_router(rc.ClientCancel(RequestId(rid)))

    def hold(self, *kinds: str) -> None:
        """Hold back messages of these kinds (e.g. "abort", "write") until `release`."""
        self.hold_kinds.update(kinds)

    def release(self) -> None:
        self.hold_kinds.clear()
        while self.held:
            self.queue.append(self.held.popleft())

    def step(self) -> bool:
        while self.queue:
            msg = self.queue.popleft()
            if msg.kind in self.hold_kinds:
                self.held.append(msg)
                continue
            msg.deliver()
            return True
        return False

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.step():
                return
        raise RuntimeError("the in-process network did not settle")

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.to_decode(dc.Tick(self.now))
        self.to_prefill(pc.Tick(self.now))
        self.run()

    def restart_prefill(self) -> None:
        """Prefill loses all state; decode learns the new epoch from its next heartbeat."""
        self.prefill = pc.PrefillCore(self.prefill.config)
        self.prefill_epoch += 1
        self._writers.clear()
        self.queue = deque(m for m in self.queue if not m.kind.startswith("to_prefill"))
        self.to_decode(dc.PrefillHeartbeat(self.prefill_epoch, self.now))
        self.run()

    def events(self, server: str | None = None) -> list[str]:
        return [k for s, k, _ in self.log if server is None or s == server]

    # ------------------------------------------------------------------ plumbing

    def _send(self, kind: str, deliver: Callable[[], object]) -> None:
        self.queue.append(_Msg(kind, deliver))

    def _record(self, server: str, cmd: Log) -> None:
        self.log.append((server, cmd.kind, dict(cmd.args)))

    @staticmethod
    def _reply(cmds: list[object]) -> Reply:
        return next((c for c in cmds if isinstance(c, Reply)), Reply(Status.OK))

    def submit_to_decode_only(
        self, rid: str, tenant: str, prompt_len: int, max_tokens: int = 4, room: int = 1
    ) -> None:
        """A request that reaches decode but never prefill (an orphan grant follows)."""
        self.tenants[RequestId(rid)] = Tenant(tenant)
        self._decode_submit(
            rc.ForwardToDecode(RequestId(rid), Tenant(tenant), Room(room), prompt_len, max_tokens)
        )

    # to_router / to_prefill / to_decode deliver one event to one core now and route the
    # resulting commands; tests call them directly to inject duplicate, stale or forged messages.

    def to_router(self, event: rc.RouterEvent) -> Reply:
        cmds = self.router.handle(event)
        for cmd in cmds:
            match cmd:
                case Log():
                    self._record("router", cmd)
                case rc.ForwardToPrefill():
                    self._send("to_prefill_submit", partial(self._prefill_submit, cmd))
                case rc.ForwardToDecode():
                    self._send("to_decode_submit", partial(self._decode_submit, cmd))
                case rc.CancelAtPrefill():
                    self._send(
                        "to_prefill_cancel",
                        partial(
                            self.to_prefill,
                            pc.CancelRequest(cmd.request_id, cmd.reason, cmd.attempt),
                        ),
                    )
                case rc.AbortAtDecode():
                    self._send(
                        "to_decode_cancel",
                        partial(
                            self.to_decode,
                            dc.CancelRequest(cmd.request_id, cmd.reason, self.now, cmd.attempt),
                        ),
                    )
                case rc.AnswerClient():
                    reads = self._reads.get(cmd.request_id, []) if cmd.status is Status.OK else []
                    self.answers[cmd.request_id] = Answer(cmd.status, cmd.message, reads)
        reply = self._reply(list(cmds))
        if reply.status is not Status.OK and isinstance(event, rc.ClientSubmit):
            self.answers[event.request_id] = Answer(reply.status, reply.message)
        return reply

    def _prefill_submit(self, c: rc.ForwardToPrefill) -> None:
        reply = self.to_prefill(
            pc.SubmitRequest(c.request_id, c.tenant, c.room, c.prompt_len, self.now, c.attempt)
        )
        if reply.status is not Status.OK:
            self.to_router(rc.PrefillFinished(c.request_id, reply.status, reply.message))

    def _decode_submit(self, c: rc.ForwardToDecode) -> None:
        self._tokens += 1
        token = self._tokens.to_bytes(16, "big")
        reply = self.to_decode(
            dc.SubmitRequest(
                c.request_id,
                c.tenant,
                c.room,
                c.prompt_len,
                c.max_tokens,
                token,
                self.now,
                c.attempt,
            )
        )
        if reply.status is not Status.OK:
            self.to_router(rc.DecodeFinished(c.request_id, reply.status, reply.message))

    def to_prefill(self, event: pc.PrefillEvent) -> Reply:
        cmds = self.prefill.handle(event)
        for cmd in cmds:
            match cmd:
                case Log():
                    self._record("prefill", cmd)
                case pc.StartWrites():
                    self._start_writes(cmd)
                case pc.CancelWrites():
                    if self._writers.pop((cmd.request_id, int(cmd.generation)), None) is not None:
                        self._send(
                            "to_prefill_writes_done",
                            partial(
                                self.to_prefill,
                                pc.WritesFinished(
                                    cmd.request_id, cmd.generation, Status.CANCELLED, "cancelled"
                                ),
                            ),
                        )
                case pc.SendCompletion():
                    self._send("completion", partial(self._completion, cmd))
                case pc.SendRejection():
                    self._send(
                        "rejection",
                        partial(
                            self.to_decode,
                            dc.RejectionReceived(
                                cmd.request_id, cmd.room, cmd.status, cmd.reason, cmd.attempt
                            ),
                        ),
                    )
                case pc.SendAbortAck():
                    self._send(
                        "abort_ack",
                        partial(
                            self.to_decode,
                            dc.AbortAckReceived(
                                cmd.request_id, cmd.room, cmd.generation, cmd.token, cmd.attempt
                            ),
                        ),
                    )
                case pc.AnswerRequest():
                    self._send(
                        "to_router_prefill_result",
                        partial(
                            self.to_router,
                            rc.PrefillFinished(cmd.request_id, cmd.status, cmd.message),
                        ),
                    )
        return self._reply(list(cmds))

    def to_decode(self, event: dc.DecodeEvent) -> Reply:
        cmds = self.decode.handle(event)
        for cmd in cmds:
            match cmd:
                case Log():
                    self._record("decode", cmd)
                case dc.SendGrant():
                    self._send("to_prefill_grant", partial(self._grant, cmd))
                case dc.SendAbort():
                    self._send(
                        "abort",
                        partial(
                            self.to_prefill,
                            pc.AbortReceived(
                                cmd.request_id, cmd.room, cmd.generation, cmd.token, cmd.attempt
                            ),
                        ),
                    )
                case dc.ReleasePages():
                    if cmd.scrub:
                        for p in cmd.pages:
                            self.content[p] = None
                case dc.Generate():
                    n = pages_for(cmd.prompt_len, self.page_size)
                    self._reads[cmd.request_id] = [
                        (c[1] if c is not None else None)
                        for c in (self.content[p] for p in cmd.pages[:n])
                    ]
                    self.to_decode(
                        dc.GenerationFinished(cmd.request_id, cmd.generation, cmd.max_tokens)
                    )
                case dc.AnswerRequest():
                    self._send(
                        "to_router_decode_result",
                        partial(
                            self.to_router,
                            rc.DecodeFinished(cmd.request_id, cmd.status, cmd.message),
                        ),
                    )
        return self._reply(list(cmds))

    def _grant(self, c: dc.SendGrant) -> None:
        reply = self.to_prefill(
            pc.GrantReceived(
                c.request_id,
                c.room,
                c.generation,
                c.pages,
                c.token,
                c.prompt_len,
                self.now,
                c.attempt,
            )
        )
        if reply.status is Status.OK:
            self.to_decode(
                dc.GrantDelivered(c.request_id, c.generation, self.prefill_epoch, self.now)
            )
        else:
            self.to_decode(dc.GrantFailed(c.request_id, c.generation, reply.message, self.now))

    def _start_writes(self, cmd: pc.StartWrites) -> None:
        key = (cmd.request_id, int(cmd.generation))
        self._writers[key] = deque(enumerate(cmd.pages))
        self._send("write", partial(self._next_write, cmd))

    def _next_write(self, cmd: pc.StartWrites) -> None:
        key = (cmd.request_id, int(cmd.generation))
        pending = self._writers.get(key)
        if pending is None:
            return  # cancelled
        if cmd.request_id in self.fail_writes:
            del self._writers[key]
            self.to_prefill(
                pc.WritesFinished(
                    cmd.request_id, cmd.generation, Status.UNAVAILABLE, "injected failure"
                )
            )
            return
        if not pending:
            del self._writers[key]
            self.to_prefill(pc.WritesFinished(cmd.request_id, cmd.generation, Status.OK))
            return
        index, page = pending.popleft()
        digest = _ghost_digest(cmd.request_id, cmd.generation, index)
        self.to_prefill(pc.PageSent(cmd.request_id, cmd.generation, page, index, digest, index))
        self._send("write", partial(self._land, cmd, page, index, digest))

    def _land(self, cmd: pc.StartWrites, page: PageId, index: int, digest: bytes) -> None:
        cmds = self.decode.handle(
            dc.WriteReceived(
                cmd.request_id,
                cmd.room,
                cmd.generation,
                cmd.token,
                page,
                index,
                digest,
                digest,
                attempt=cmd.attempt,
            )
        )
        for c in cmds:
            if isinstance(c, Log):
                self._record("decode", c)
            elif isinstance(c, dc.StorePage):
                self.content[c.page_id] = (cmd.request_id, self.tenants.get(cmd.request_id, "?"))
        reply = self._reply(list(cmds))
        key = (cmd.request_id, int(cmd.generation))
        if reply.status is not Status.OK:
            if self._writers.pop(key, None) is not None:
                self.to_prefill(
                    pc.WritesFinished(cmd.request_id, cmd.generation, reply.status, reply.message)
                )
            return
        if key in self._writers:
            self._send("write", partial(self._next_write, cmd))

    def _completion(self, c: pc.SendCompletion) -> None:
        reply = self.to_decode(
            dc.CompletionReceived(
                c.request_id, c.room, c.generation, c.token, c.page_count, c.digest, c.attempt
            )
        )
        self.to_prefill(
            pc.CompletionAnswered(c.request_id, c.generation, reply.status, reply.message)
        )


def _ghost_digest(rid: RequestId, generation: Generation, index: int) -> bytes:
    return hashlib.sha256(f"{rid}/{generation}/{index}".encode()).digest()[:4]
