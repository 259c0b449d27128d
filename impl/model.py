"""A small attention model that really computes from the KV pages, built deterministically.

Prefill: each prompt token is embedded (a fixed random unit vector per token id) and projected by
per-layer orthogonal matrices into K and V, ``layers x tokens x heads x head_dim``.

Decode: step ``t`` of the answer attends over the gathered pages of the request with a content
query plus a positional (ALiBi-style) bias that is sharp enough to select position
``t mod prompt_len``; the attended V is projected back, averaged over layers and read out against
the embedding table. So the default weights form a *copy head*: the answer reproduces, in order,
the tokens whose K/V sit in the attended pages. An answer generated from a stale page therefore
visibly contains the previous owner's tokens; a scrubbed (all-zero) page reads back as token 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from kvhandoff.impl.pool import PoolShape
from kvhandoff.impl.tokenizer import VOCAB_SIZE

# Bias per position of distance: large enough that softmax puts all of its mass (in float32) on
# the selected position, whatever the content scores are.
_POSITION_SLOPE = 1.0e4


class CopyHeadModel:
    def __init__(self, shape: PoolShape, device: torch.device, seed: int = 0) -> None:
        self.shape = shape
        self.device = device
        d = shape.heads * shape.head_dim
        g = torch.Generator().manual_seed(seed)
        emb = torch.randn(VOCAB_SIZE, d, generator=g)
        self.embedding = (emb / emb.norm(dim=1, keepdim=True)).to(device)
        w_k, w_v = [], []
        for _ in range(shape.layers):
            w_k.append(torch.linalg.qr(torch.randn(d, d, generator=g))[0])
            w_v.append(torch.linalg.qr(torch.randn(d, d, generator=g))[0])
        self.w_k = torch.stack(w_k).to(device)  # (L, d, d)
        self.w_v = torch.stack(w_v).to(device)
        self.query = torch.randn(shape.layers, shape.heads, shape.head_dim, generator=g).to(device)

    def prefill(self, tokens: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``tokens``: each (layers, tokens, heads, head_dim)."""
        s = self.shape
        ids = torch.tensor(list(tokens), dtype=torch.long, device=self.device)
        x = self.embedding[ids]  # (T, d)
        k = torch.einsum("td,lde->lte", x, self.w_k)
        v = torch.einsum("td,lde->lte", x, self.w_v)
        shape = (s.layers, len(tokens), s.heads, s.head_dim)
        return k.reshape(shape), v.reshape(shape)

    def decode(
        self, k: torch.Tensor, v: torch.Tensor, prompt_len: int, max_tokens: int
    ) -> list[int]:
        """Generate ``max_tokens`` tokens attending over the first ``prompt_len`` positions of the
        gathered K/V (layers, positions, heads, head_dim)."""
        s = self.shape
        k = k[:, :prompt_len]
        v = v[:, :prompt_len]
        steps = torch.arange(max_tokens, device=self.device) % prompt_len  # (S,)
        positions = torch.arange(prompt_len, device=self.device)  # (T,)
        bias = -_POSITION_SLOPE * (positions[None, :] - steps[:, None]).abs().float()  # (S, T)
        content = torch.einsum("lhe,lthe->lht", self.query, k) / math.sqrt(s.head_dim)
        scores = content[:, :, None, :] + bias[None, None, :, :]  # (L, H, S, T)
        attn = torch.softmax(scores, dim=-1)
        out = torch.einsum("lhst,lthe->lshe", attn, v)  # (L, S, H, D)
        out = out.reshape(s.layers, max_tokens, s.heads * s.head_dim)
        x = torch.einsum("lse,lde->lsd", out, self.w_v).mean(dim=0)  # undo V projection
        logits = x @ self.embedding.T  # (S, vocab)
        return [int(t) for t in logits.argmax(dim=-1).tolist()]
