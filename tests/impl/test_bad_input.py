"""Every kind of bad input gets a gRPC status whose message names the offending value, and the
servers keep serving: a request in flight at the time still completes, and pages come back."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest

from kvhandoff.impl.client import GenerateResult
from kvhandoff.impl.cluster import Cluster
from kvhandoff.impl.core.decode import GrantView
from kvhandoff.impl.pool import DTYPE_NAME, PoolShape, page_digest
from kvhandoff.impl.proto import rpc
from kvhandoff.impl.proto.gen.kvhandoff.v1 import handoff_pb2 as pb
from kvhandoff.impl.servers.base import answered
from kvhandoff.impl.tokenizer import encode

PROMPT = encode("HELD-REQUEST-" * 4)  # 52 tokens = 13 pages


@dataclass
class Held:
    """A request whose prefill writes are paused after the first message: a live grant."""

    cluster: Cluster
    request_id: str
    grant: GrantView
    _thread: threading.Thread
    _box: list[GenerateResult]

    def finish(self) -> GenerateResult:
        self.cluster.resume_prefill_writes(self.request_id)
        self._thread.join(30)
        return self._box[0]


@pytest.fixture
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    return make_cluster("reference", pages_per_message=2, waiting_timeout_s=20.0)


@pytest.fixture
def held(cluster: Cluster) -> Iterator[Held]:
    rid = "held-1"
    cluster.stall_prefill_writes(rid)
    box: list[GenerateResult] = []

    def run() -> None:
        with cluster.client() as c:
            box.append(c.generate("tenant-h", PROMPT, 16, request_id=rid, timeout=30))

    thread = threading.Thread(target=run)
    thread.start()
    grant = cluster.wait_for_grant(rid, pages_written=2)
    h = Held(cluster, rid, grant, thread, box)
    yield h
    # Nothing lost: the held request still completes with its own tokens, pages all come back.
    result = h.finish()
    assert result.status == "ok", result
    assert result.tokens == PROMPT[:16]
    assert cluster.wait_quiescent(10)


def decode_stub(cluster: Cluster) -> object:
    return rpc.decode_stub(grpc.insecure_channel(cluster.decode))


def page_write(cluster: Cluster, g: GrantView, **overrides: object) -> pb.PageWrite:
    shape = cluster.decode_server.settings.shape
    data = bytes(shape.page_bytes)
    fields: dict[str, object] = dict(
        request_id="held-1",
        room=g.room,
        generation=g.generation,
        token=g.token,
        message_id=99,
        page_ids=[g.pages[0]],
        digests=[page_digest(data)],
        page_shape=list(shape.page_shape),
        dtype=DTYPE_NAME,
        data=data,
    )
    fields.update(overrides)
    return pb.PageWrite(**fields)  # type: ignore[arg-type]


def refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def write(cluster: Cluster, msg: pb.PageWrite) -> grpc.RpcError:
    stub = rpc.decode_stub(grpc.insecure_channel(cluster.decode))
    return refused(lambda: stub.WritePages(iter([msg]), timeout=10))


def test_a_write_for_an_unknown_request_is_refused_naming_the_request(
    cluster: Cluster, held: Held
) -> None:
    err = write(cluster, page_write(cluster, held.grant, request_id="no-such-request"))
    assert err.code() is grpc.StatusCode.NOT_FOUND
    assert "no-such-request" in err.details()


def test_a_write_for_the_wrong_room_is_refused_naming_the_room(
    cluster: Cluster, held: Held
) -> None:
    err = write(cluster, page_write(cluster, held.grant, room=held.grant.room + 1))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert str(held.grant.room + 1) in err.details()


@pytest.mark.parametrize("delta", [-1, 1])
def test_a_write_for_an_old_or_unknown_generation_is_refused(
    cluster: Cluster, held: Held, delta: int
) -> None:
    gen = held.grant.generation + delta
    err = write(cluster, page_write(cluster, held.grant, generation=gen))
    assert err.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert str(gen) in err.details()


def test_a_write_with_the_wrong_capability_token_is_refused(cluster: Cluster, held: Held) -> None:
    err = write(cluster, page_write(cluster, held.grant, token=b"x" * 16))
    assert err.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "capability token" in err.details() and "held-1" in err.details()
    assert (
        cluster.decode_server.metrics.get("kvhandoff_refused_writes_total", reason="bad_token") == 1
    )


def test_a_write_to_a_page_outside_the_pool_is_refused_naming_the_page(
    cluster: Cluster, held: Held
) -> None:
    err = write(cluster, page_write(cluster, held.grant, page_ids=[10_000]))
    assert err.code() is grpc.StatusCode.OUT_OF_RANGE
    assert "10000" in err.details()


def test_a_write_to_a_page_not_granted_is_refused_naming_the_page(
    cluster: Cluster, held: Held
) -> None:
    other = max(held.grant.pages) + 1
    err = write(cluster, page_write(cluster, held.grant, page_ids=[other]))
    assert err.code() is grpc.StatusCode.PERMISSION_DENIED
    assert f"page {other}" in err.details()


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ({"page_shape": [2, 2, 4, 2, 8]}, "[2, 2, 4, 2, 8]"),
        ({"dtype": "float16"}, "float16"),
        ({"data": b"\x00" * 10, "digests": [page_digest(b"\x00" * 10)]}, "10 bytes"),
        ({"digests": []}, "0 digests"),
    ],
)
def test_page_data_of_the_wrong_shape_dtype_or_size_is_refused(
    cluster: Cluster, held: Held, override: dict[str, object], named: str
) -> None:
    err = write(cluster, page_write(cluster, held.grant, **override))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert named in err.details()


def test_page_data_that_does_not_match_its_digest_is_refused(cluster: Cluster, held: Held) -> None:
    err = write(cluster, page_write(cluster, held.grant, digests=[b"\x00\x00\x00\x01"]))
    assert err.code() is grpc.StatusCode.DATA_LOSS
    # Names the page, not digest values (the sender logs the message: issue 15, private logs).
    assert f"page {held.grant.pages[0]}: the data received does not match" in err.details()
    assert "00000001" not in err.details()


def test_a_completion_for_an_unknown_request_is_refused(cluster: Cluster, held: Held) -> None:
    stub = rpc.decode_stub(grpc.insecure_channel(cluster.decode))
    err = refused(
        lambda: stub.Complete(pb.Completion(request_id="ghost", room=1, generation=1), timeout=10)
    )
    assert err.code() is grpc.StatusCode.NOT_FOUND and "ghost" in err.details()


def test_a_completion_with_a_wrong_token_does_not_touch_the_request(
    cluster: Cluster, held: Held
) -> None:
    stub = rpc.decode_stub(grpc.insecure_channel(cluster.decode))
    g = held.grant
    msg = pb.Completion(
        request_id="held-1", room=g.room, generation=g.generation, token=b"bad", page_count=2**31
    )
    err = refused(lambda: stub.Complete(msg, timeout=10))
    assert err.code() is grpc.StatusCode.PERMISSION_DENIED


def test_a_huge_page_count_in_a_completion_fails_validation_naming_the_count(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster("reference", pages_per_message=2)
    cluster.stall_prefill_writes("victim")
    box: list[GenerateResult] = []
    t = threading.Thread(
        target=lambda: box.append(cluster.client().generate("t", PROMPT, 8, request_id="victim"))
    )
    t.start()
    g = cluster.wait_for_grant("victim", pages_written=2)
    stub = rpc.decode_stub(grpc.insecure_channel(cluster.decode))
    msg = pb.Completion(
        request_id="victim", room=g.room, generation=g.generation, token=g.token, page_count=2**31
    )
    err = refused(lambda: stub.Complete(msg, timeout=10))
    assert err.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert str(2**31) in err.details()
    cluster.resume_prefill_writes("victim")
    t.join(30)
    assert box[0].status == "error" and box[0].code == "DATA_LOSS"  # fail closed, no answer
    assert cluster.wait_quiescent(10)


def test_huge_lengths_are_refused_naming_the_value(cluster: Cluster, held: Held) -> None:
    with cluster.client() as c:
        r = c.generate("t", encode("hi"), max_tokens=1_000_000)
    assert r.code == "INVALID_ARGUMENT" and "1000000" in r.error
    stub = rpc.decode_stub(grpc.insecure_channel(cluster.decode))
    sub = pb.DecodeSubmitRequest(
        request_id="huge", tenant="t", room=1, prompt_tokens=2**40, max_tokens=4
    )
    err = refused(lambda: stub.Submit(sub, timeout=10))
    assert err.code() is grpc.StatusCode.OUT_OF_RANGE and str(2**40) in err.details()


def test_a_prompt_over_every_limit_is_refused_naming_its_length(
    cluster: Cluster, held: Held
) -> None:
    with cluster.client() as c:
        r = c.generate("t", [65] * 10_000)
    assert r.code == "OUT_OF_RANGE" and "10000 tokens" in r.error and "256" in r.error


def test_a_token_outside_the_vocabulary_is_refused_naming_it(cluster: Cluster, held: Held) -> None:
    with cluster.client() as c:
        r = c.generate("t", [65, 300, 66])
    assert r.code == "INVALID_ARGUMENT" and "300" in r.error


def test_a_duplicate_request_id_is_refused_naming_it(cluster: Cluster, held: Held) -> None:
    with cluster.client() as c:
        r = c.generate("t", encode("again"), request_id="held-1")
    assert r.code == "ALREADY_EXISTS" and "held-1" in r.error


def test_cancel_of_an_unknown_request_names_it(cluster: Cluster, held: Held) -> None:
    from kvhandoff.impl.errors import RequestFailed

    with cluster.client() as c, pytest.raises(RequestFailed, match="nobody"):
        c.cancel("nobody")


def test_a_grant_without_pages_is_refused(cluster: Cluster, held: Held) -> None:
    stub = rpc.prefill_stub(grpc.insecure_channel(cluster.prefill))
    err = refused(
        lambda: stub.ReceiveGrant(pb.Grant(request_id="g", room=5, generation=1), timeout=10)
    )
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT and "0 pages" in err.details()


def test_a_message_over_the_size_limit_is_refused_and_decode_keeps_serving(
    cluster: Cluster, held: Held
) -> None:
    limit = cluster.config.max_message_bytes
    big = page_write(cluster, held.grant, data=bytes(limit + 1))
    err = write(cluster, big)
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(limit) in err.details()
    with cluster.client() as c:
        assert c.generate("t", encode("still serving"), 4).status == "ok"


def test_a_peer_that_disconnects_mid_stream_leaves_decode_serving(
    cluster: Cluster, held: Held
) -> None:
    stop = threading.Event()
    # A page prefill has not written yet: its own write lands later and the handoff validates.
    first = page_write(cluster, held.grant, page_ids=[held.grant.pages[-1]])

    def stream() -> Iterator[pb.PageWrite]:
        yield first
        stop.wait(10)  # hold the stream open, then the call is cancelled under it

    stub = rpc.decode_stub(grpc.insecure_channel(cluster.decode))
    future = stub.WritePages.future(stream(), timeout=10)
    time.sleep(0.3)
    future.cancel()
    stop.set()
    assert future.cancelled()
    with cluster.client() as c:
        assert c.generate("t", encode("after disconnect"), 4).status == "ok"


def test_pool_shape_rejects_nonsense_sizes() -> None:
    from kvhandoff.impl.errors import ConfigError

    with pytest.raises(ConfigError, match="page_size must be >= 1, got 0"):
        PoolShape(page_size=0)


def test_a_client_that_goes_away_mid_request_is_withdrawn_from_both_sides(cluster: Cluster) -> None:
    cluster.stall_prefill_writes("impatient")
    with cluster.client() as c:
        result = c.generate("t", PROMPT, 8, request_id="impatient", timeout=0.5)
    assert result.code == "DEADLINE_EXCEEDED"
    cluster.resume_prefill_writes("impatient")
    assert cluster.wait_quiescent(10)
    assert cluster.decode_pages()[1] == 0
    with cluster.client() as c:
        assert c.generate("t", encode("next"), 4).status == "ok"


def test_an_error_a_server_answers_is_told_apart_from_a_broken_call(cluster: Cluster) -> None:
    # The router relays a broken call to prefill (a crash) to decode even in m15, where an
    # error prefill answers stays silent: the two must be told apart.
    stub = rpc.decode_stub(grpc.insecure_channel(cluster.decode))
    ghost = pb.Completion(request_id="ghost", room=1, generation=1)
    assert answered(refused(lambda: stub.Complete(ghost, timeout=10)))
    nobody = rpc.decode_stub(grpc.insecure_channel("127.0.0.1:1"))
    broken = refused(lambda: nobody.Complete(ghost, timeout=5))
    assert broken.code() is grpc.StatusCode.UNAVAILABLE and not answered(broken)


@pytest.mark.parametrize(
    ("field", "code"),
    [("room", grpc.StatusCode.INVALID_ARGUMENT), ("token", grpc.StatusCode.PERMISSION_DENIED)],
)
def test_an_abort_with_a_wrong_room_or_token_is_refused_and_the_request_completes(
    cluster: Cluster, held: Held, field: str, code: grpc.StatusCode
) -> None:
    # Issue 15: prefill accepted an abort with the right generation and any room.
    g = held.grant
    fields: dict[str, object] = dict(
        request_id="held-1", room=g.room, generation=g.generation, token=g.token
    )
    fields[field] = {"room": g.room + 1, "token": b"guess"}[field]
    stub = rpc.prefill_stub(grpc.insecure_channel(cluster.prefill))
    err = refused(lambda: stub.ReceiveAbort(pb.Abort(**fields), timeout=10))  # type: ignore[arg-type]
    assert err.code() is code and "held-1" in err.details()
    ack = pb.AbortAck(request_id="held-1", room=g.room, generation=g.generation, token=b"guess")
    err = refused(
        lambda: rpc.decode_stub(grpc.insecure_channel(cluster.decode)).ReceiveAbortAck(
            ack, timeout=10
        )
    )
    assert err.code() is grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.parametrize(
    ("role", "method", "type_name"),
    [
        ("router", "/kvhandoff.v1.Router/Generate", "GenerateRequest"),
        ("router", "/kvhandoff.v1.Router/Cancel", "CancelRequest"),
        ("prefill", "/kvhandoff.v1.Prefill/Submit", "PrefillSubmitRequest"),
        ("prefill", "/kvhandoff.v1.Prefill/ReceiveGrant", "Grant"),
        ("prefill", "/kvhandoff.v1.Prefill/ReceiveAbort", "Abort"),
        ("decode", "/kvhandoff.v1.Decode/Submit", "DecodeSubmitRequest"),
        ("decode", "/kvhandoff.v1.Decode/Complete", "Completion"),
        ("decode", "/kvhandoff.v1.Decode/Reject", "Rejection"),
        ("decode", "/kvhandoff.v1.Decode/ReceiveAbortAck", "AbortAck"),
        ("decode", "/kvhandoff.v1.Decode/WritePages", "PageWrite"),
    ],
)
def test_a_message_that_does_not_parse_is_invalid_argument_naming_its_type(
    cluster: Cluster, role: str, method: str, type_name: str
) -> None:
    channel = grpc.insecure_channel(getattr(cluster, role))
    for payload, what in [(b"\xff\xff\xff", "corrupt"), (b"\x0a\x02\xff\xfe", "UTF-8")]:
        if method.endswith("WritePages"):
            call = channel.stream_unary(method)
            err = refused(lambda c=call, p=payload: c(iter([p]), timeout=10))  # type: ignore[misc]
        else:
            unary = channel.unary_unary(method)
            err = refused(lambda u=unary, p=payload: u(p, timeout=10))  # type: ignore[misc]
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, err
        assert f"malformed kvhandoff.v1.{type_name} message" in err.details()
        assert what in err.details() and answered(err)
    with cluster.client() as c:
        assert c.generate("t", encode("still serving"), 4).status == "ok"


def test_every_peer_controlled_size_has_a_bound_with_a_clear_error(
    cluster: Cluster, held: Held
) -> None:
    """Issue 15: decode kept reasons of up to 8 MiB; prefill parked grants of 2^20 pages."""
    prefill = rpc.prefill_stub(grpc.insecure_channel(cluster.prefill))
    decode = rpc.decode_stub(grpc.insecure_channel(cluster.decode))
    router = rpc.router_stub(grpc.insecure_channel(cluster.router))
    g = held.grant
    cases: list[tuple[Callable[[], object], str]] = [
        (
            lambda: decode.Reject(
                pb.Rejection(request_id="x", room=1, code="ABORTED", reason="r" * 5000), timeout=10
            ),
            "reason of 5000 characters is over the bound of 4096",
        ),
        (
            lambda: router.Cancel(pb.CancelRequest(request_id="held-1", reason="r" * 4097)),
            "reason of 4097 characters is over the bound of 4096",
        ),
        (
            lambda: prefill.Submit(
                pb.PrefillSubmitRequest(
                    request_id="i" * 129, tenant="t", room=1, prompt_tokens=[1]
                ),
                timeout=10,
            ),
            "request_id of 129 characters is over the bound of 128",
        ),
        (
            lambda: router.Generate(pb.GenerateRequest(tenant="t" * 200, prompt_tokens=[1])),
            "tenant of 200 characters is over the bound of 128",
        ),
        (
            lambda: decode.Complete(
                pb.Completion(
                    request_id="held-1", room=g.room, generation=g.generation, token=b"k" * 65
                ),
                timeout=10,
            ),
            "token of 65 bytes is over the bound of 64",
        ),
        (
            lambda: decode.WritePages(
                iter([page_write(cluster, g, digests=[b"d" * 100])]), timeout=10
            ),
            "digest 0 of 100 bytes is over the bound of 64",
        ),
        (
            lambda: prefill.ReceiveGrant(
                pb.Grant(request_id="orphan", room=5, generation=1, page_ids=[0] * (1 << 20)),
                timeout=10,
            ),
            f"grant of {1 << 20} pages must have 1..64",
        ),
    ]
    for call, message in cases:
        err = refused(call)
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, (message, err)
        assert message in err.details()
    assert cluster.prefill_server.core.parked_grants == 0


def test_prefill_bounds_the_requests_it_holds() -> None:
    from kvhandoff.impl.core import prefill as pc
    from kvhandoff.impl.core.common import RequestId, Room, Status, Tenant

    core = pc.PrefillCore(
        pc.PrefillConfig(page_size=4, max_prompt_tokens=64, max_active_requests=2)
    )
    for i in range(2):
        core.handle(pc.SubmitRequest(RequestId(f"r{i}"), Tenant("t"), Room(i), 8, 0.0))
    cmds = core.handle(pc.SubmitRequest(RequestId("r2"), Tenant("t"), Room(2), 8, 0.0))
    assert [c.status for c in cmds if hasattr(c, "status")] == [Status.RESOURCE_EXHAUSTED]
    assert "max_active_requests=2" in str(cmds)
