"""Multi-axis RoPE (FLUX-style): each head's features are split over axes such as (t, h, w).

Angles are computed in float64 from exact integer positions, so a token gets the same rotation
whichever rank it is routed to (positions travel as int64, never as floats).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["apply_rope", "rope_nd"]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of each head's features: ``x`` is ``[T, H, D]``. Computed in the
    wider of the two dtypes (fp32 tables rotate bf16 activations in fp32), returned in ``x``'s."""
    wide = torch.promote_types(x.dtype, cos.dtype)
    x1, x2 = x.to(wide).chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).to(x.dtype)


def rope_nd(
    positions: torch.Tensor,
    axes_dim: Sequence[int],
    theta: float = 10000.0,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[T, A]`` integer positions -> ``cos, sin`` of shape ``[T, sum(axes_dim) / 2]``.

    Axis ``i`` rotates ``axes_dim[i] / 2`` feature pairs with frequencies
    ``theta^(-2j/axes_dim[i])``; the result feeds :func:`apply_rope` (rotate-half layout).
    """
    if positions.dim() != 2 or positions.shape[1] != len(axes_dim):
        raise ValueError(
            f"positions must be [T, {len(axes_dim)}] (one column per RoPE axis), "
            f"got {tuple(positions.shape)}"
        )
    if any(d % 2 or d < 2 for d in axes_dim):
        raise ValueError(f"every RoPE axis needs an even dimension >= 2, got {list(axes_dim)}")
    parts = []
    pos64 = positions.to(torch.float64)
    for i, d in enumerate(axes_dim):
        half = d // 2
        inv = theta ** (-torch.arange(half, dtype=torch.float64, device=positions.device) / half)
        parts.append(pos64[:, i : i + 1] * inv[None, :])
    angles = torch.cat(parts, dim=1)
    dtype = dtype or torch.get_default_dtype()
    return angles.cos().to(dtype), angles.sin().to(dtype)
