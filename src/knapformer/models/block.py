"""A reference DiT-style transformer over packed variable-length sequences.

The model is plain PyTorch: it knows nothing about ranks. Attention is a callable passed to
``forward`` (``attention(q, k, v) -> out``, all ``[T, H, D]``), so the same weights run

* single-process: ``local_attention(cu_seqlens, max_seqlen)``;
* balanced: ``balanced_forward(model, balancer, x, positions)``, which routes the tokens and the
  integer RoPE positions, uses the balancer's Ulysses hooks inside every block, and routes the
  output back (parallelism applied from outside, so FSDP2 / activation checkpointing wrap the
  blocks as usual).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from knapformer.attention.varlen import varlen_attention

if TYPE_CHECKING:
    from knapformer.distributed.balancer import Balancer

__all__ = [
    "AttentionFn",
    "PackedTransformer",
    "TransformerBlock",
    "apply_rope",
    "balanced_attention",
    "balanced_forward",
    "local_attention",
    "rope_cos_sin",
]

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float = 10000.0, dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[T]`` integer positions -> ``cos, sin`` of shape ``[T, head_dim / 2]``.

    Angles are computed in float64 from the exact integer positions, so a token gets the same
    rotation whichever rank it is routed to.
    """
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
    half = head_dim // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float64, device=positions.device) / half)
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    dtype = dtype or torch.get_default_dtype()
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of each head's features: ``x`` is ``[T, H, D]``. Computed in the
    wider of the two dtypes (fp32 tables rotate bf16 activations in fp32), returned in ``x``'s."""
    wide = torch.promote_types(x.dtype, cos.dtype)
    x1, x2 = x.to(wide).chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).to(x.dtype)


class TransformerBlock(nn.Module):
    """Pre-norm block: ``x + Attn(RMSNorm(x))``, then ``x + MLP(RMSNorm(x))``."""

    def __init__(self, d_model: int, num_heads: int, mlp_ratio: float = 4.0, eps: float = 1e-6):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        hidden = int(d_model * mlp_ratio)
        self.attn_norm = nn.RMSNorm(d_model, eps=eps)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.mlp_norm = nn.RMSNorm(d_model, eps=eps)
        self.fc1 = nn.Linear(d_model, hidden)
        self.fc2 = nn.Linear(hidden, d_model)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], attention: AttentionFn
    ) -> torch.Tensor:
        T, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(T, 3, self.num_heads, self.head_dim).unbind(1)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = attention(q, k, v)  # [T, H, D]: the only place tokens of one sequence interact
        x = x + self.out(a.reshape(T, d))
        return x + self.fc2(F.gelu(self.fc1(self.mlp_norm(x)), approximate="tanh"))


class PackedTransformer(nn.Module):
    """Input projection, ``num_blocks`` blocks, final norm and output projection."""

    def __init__(
        self,
        in_dim: int,
        d_model: int,
        num_heads: int,
        num_blocks: int,
        out_dim: int | None = None,
        rope_theta: float = 10000.0,
    ):
        super().__init__()
        self.rope_theta = rope_theta
        self.head_dim = d_model // num_heads
        self.inp = nn.Linear(in_dim, d_model)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, num_heads) for _ in range(num_blocks))
        self.norm = nn.RMSNorm(d_model, eps=1e-6)
        self.outp = nn.Linear(d_model, out_dim or in_dim)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, attention: AttentionFn
    ) -> torch.Tensor:
        """``x``: ``[T, in_dim]`` packed tokens; ``positions``: ``[T]`` int64 RoPE positions."""
        rope = rope_cos_sin(positions, self.head_dim, self.rope_theta, dtype=x.dtype)
        h = self.inp(x)
        for block in self.blocks:
            h = block(h, rope, attention)
        return self.outp(self.norm(h))


def local_attention(cu_seqlens: torch.Tensor, max_seqlen: int, causal: bool = False) -> AttentionFn:
    """Attention over the sequences of a single-process packed batch."""

    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return varlen_attention(q, k, v, cu_seqlens, max_seqlen, causal=causal)

    return attn


def balanced_attention(balancer: Balancer, causal: bool = False) -> AttentionFn:
    """Attention over the balanced layout: Ulysses inside multi-GPU bags."""

    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return balancer.attention(q, k, v, causal=causal)

    return attn


def balanced_forward(
    model: nn.Module,
    balancer: Balancer,
    x: torch.Tensor,
    positions: torch.Tensor,
    *features: torch.Tensor,
    causal: bool = False,
) -> torch.Tensor:
    """Route ``x`` and its positions, run ``model`` balanced, return outputs in ``x``'s layout.

    Call ``balancer.plan_step(local_lengths)`` first. Extra ``features`` are routed along and
    passed to the model after the positions (e.g. modality tags for an MMDiT).
    """
    routed = balancer.route(x, positions, *features)
    y = model(routed[0], routed[1], *routed[2:], attention=balanced_attention(balancer, causal))
    return balancer.reverse_route(y)
