"""A reference pre-norm transformer over packed sequences, for the balancer's own tests only.

Not a model path of the package (the MMDiT plus ``parallelize`` is): it threads an attention
callable through ``forward``, which is what lets these tests check the balancer's route,
Ulysses hooks and reverse route against one process, block by block, in float64, with causal
attention too. RoPE is the package's (:func:`knapformer.models.rope.rope_nd` with one axis).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from knapformer.attention.varlen import varlen_attention
from knapformer.models.rope import apply_rope, rope_nd

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + Attn(RMSNorm(x))``, then ``x + MLP(RMSNorm(x))``."""

    def __init__(self, d_model: int, num_heads: int, mlp_ratio: float = 4.0):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        hidden = int(d_model * mlp_ratio)
        self.attn_norm = nn.RMSNorm(d_model, eps=1e-6)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.mlp_norm = nn.RMSNorm(d_model, eps=1e-6)
        self.fc1 = nn.Linear(d_model, hidden)
        self.fc2 = nn.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor, rope: Any, attention: AttentionFn) -> torch.Tensor:
        T, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(T, 3, self.num_heads, self.head_dim).unbind(1)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        x = x + self.out(attention(q, k, v).reshape(T, d))
        return x + self.fc2(F.gelu(self.fc1(self.mlp_norm(x)), approximate="tanh"))


class PackedTransformer(nn.Module):
    """Input projection, ``num_blocks`` blocks, final norm and output projection."""

    def __init__(self, in_dim: int, d_model: int, num_heads: int, num_blocks: int):
        super().__init__()
        self.head_dim = d_model // num_heads
        self.inp = nn.Linear(in_dim, d_model)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, num_heads) for _ in range(num_blocks))
        self.norm = nn.RMSNorm(d_model, eps=1e-6)
        self.outp = nn.Linear(d_model, in_dim)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, attention: AttentionFn
    ) -> torch.Tensor:
        rope = rope_nd(positions[:, None], [self.head_dim], dtype=x.dtype)
        h = self.inp(x)
        for block in self.blocks:
            h = block(h, rope, attention)
        return self.outp(self.norm(h))


def local_attention(cu_seqlens: torch.Tensor, max_seqlen: int, causal: bool = False) -> AttentionFn:
    """Attention over the sequences of a single-process packed batch."""
    return lambda q, k, v: varlen_attention(q, k, v, cu_seqlens, max_seqlen, causal=causal)


def balanced_forward(
    model: nn.Module, balancer: Any, x: torch.Tensor, positions: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """Route ``x`` and its positions, run ``model`` with the balancer's Ulysses attention,
    route the output back (call ``balancer.plan_step`` first)."""
    routed, pos = balancer.route(x, positions)
    y = model(routed, pos, lambda q, k, v: balancer.attention(q, k, v, causal=causal))
    return balancer.reverse_route(y)
