"""The page pool stores and scrubs pages; the copy-head model reproduces the attended pages."""

from __future__ import annotations

import torch

from kvhandoff.impl.model import CopyHeadModel
from kvhandoff.impl.pool import (
    PagePool,
    PoolShape,
    page_digest,
    tensor_bytes,
    tensor_from_bytes,
    wire_pages,
)
from kvhandoff.impl.tokenizer import decode, encode

CPU = torch.device("cpu")


def test_decode_reproduces_the_tokens_in_the_gathered_pages_in_order() -> None:
    shape = PoolShape()
    model = CopyHeadModel(shape, CPU)
    tokens = encode("the quick brown fox jumps over the lazy dog")
    k, v = model.prefill(tokens)
    wire = wire_pages(k, v, shape)
    pool = PagePool(shape, 32, CPU)
    pages = [30, 2, 17, 5, 9, 11, 0, 21, 4, 8, 13]
    pool.store(pages, tensor_from_bytes(tensor_bytes(wire), len(pages), shape))
    gk, gv = pool.gather(pages)
    assert decode(model.decode(gk, gv, len(tokens), len(tokens))) == decode(tokens)
    assert model.decode(gk, gv, len(tokens), len(tokens) + 3)[-3:] == tokens[:3]  # wraps around


def test_a_stale_page_shows_its_previous_owner_and_a_scrubbed_page_reads_as_zero() -> None:
    shape = PoolShape()
    model = CopyHeadModel(shape, CPU)
    pool = PagePool(shape, 8, CPU)
    old, new = encode("OLDOWNER"), encode("new!")
    for toks, pages in ((old, [0, 1]), (new, [0])):
        k, v = model.prefill(toks)
        wire = wire_pages(k, v, shape)
        pool.store(pages, tensor_from_bytes(tensor_bytes(wire), len(pages), shape))
    gk, gv = pool.gather([0, 1])
    assert decode(model.decode(gk, gv, 8, 8)) == "new!WNER"
    pool.scrub([1])
    assert pool.is_zero(1) and not pool.is_zero(0)
    gk, gv = pool.gather([0, 1])
    assert model.decode(gk, gv, 8, 8)[4:] == [0, 0, 0, 0]


def test_weights_are_deterministic_and_digests_detect_a_changed_page() -> None:
    shape = PoolShape()
    a, b = CopyHeadModel(shape, CPU), CopyHeadModel(shape, CPU)
    assert torch.equal(a.embedding, b.embedding) and torch.equal(a.w_v, b.w_v)
    k, v = a.prefill(encode("abcd"))
    data = tensor_bytes(wire_pages(k, v, shape))
    assert len(data) == shape.page_bytes
    changed = bytearray(data)
    changed[100] ^= 1
    assert page_digest(data) != page_digest(bytes(changed))
