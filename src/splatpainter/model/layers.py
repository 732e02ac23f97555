"""Small building blocks shared by Stage I and Stage II (plain pre-norm transformer parts)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def fourier_encode(x: torch.Tensor, num_freqs: int) -> torch.Tensor:
    """[..., C] -> [..., C * 2 * num_freqs] with sin/cos at octave frequencies pi * 2^j.

    Inputs are expected roughly in [-1, 1] (positions normalised to the asset's bounding cube).
    """
    freqs = math.pi * (2.0 ** torch.arange(num_freqs, dtype=x.dtype, device=x.device))
    ang = x[..., None] * freqs  # [..., C, F]
    return torch.cat([ang.sin(), ang.cos()], dim=-1).flatten(-2)


class MLP(nn.Module):
    """Linear -> GELU -> Linear."""

    def __init__(self, dim_in: int, hidden: int, dim_out: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim_in, hidden)
        self.fc2 = nn.Linear(hidden, dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SelfAttention(nn.Module):
    """Multi-head self-attention with an optional key-padding mask (True = real token)."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.num_heads, d // self.num_heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        attn_mask = None if key_mask is None else key_mask[:, None, None, :]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.proj(o.transpose(1, 2).reshape(b, t, d))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: int = 2) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, mlp_ratio * dim, dim)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), key_mask)
        return x + self.mlp(self.norm2(x))


def column_major(pieces: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat(pieces, -1) of [N, C_i] pieces, as the [N, C] transposed view of a contiguous
    [C, N] buffer: the same values (every op reading them gives the same bits), and
    `segment_mean` sums it along contiguous rows, about 3x faster at a million rows."""
    return torch.cat([p.T for p in pieces], 0).T


def segment_mean(values: torch.Tensor, segment: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Mean of `values` [N, C] per segment id in [0, num_segments)."""
    if values.dim() == 2 and values.T.is_contiguous() and not values.is_contiguous():
        # a `column_major` view: each column summed in the same order, so the same bits
        out = values.new_zeros(values.shape[1], num_segments).index_add_(1, segment, values.T)
        out = out.T.contiguous()
    else:
        out = values.new_zeros(num_segments, values.shape[-1]).index_add_(0, segment, values)
    count = torch.bincount(segment, minlength=num_segments).clamp_min(1).to(values.dtype)
    return out / count[:, None]
