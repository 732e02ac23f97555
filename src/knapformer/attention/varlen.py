"""One entry point for attention over packed variable-length sequences.

``q, k, v``: ``[T, H, D]`` with sequences packed back to back and delimited by ``cu_seqlens``
(``[n + 1]``, starting at 0, ending at ``T``). Attention never crosses a sequence boundary.

Backends: flash-attn's varlen kernel on CUDA for fp16/bf16 when the package is installed;
otherwise PyTorch SDPA, one call per sequence (exact, works on every device and dtype, has a
backward everywhere; FlexAttention is avoided because it has no CPU backward).
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache

import torch
import torch.nn.functional as F

__all__ = ["VarlenAttentionError", "flash_attn_available", "varlen_attention"]


class VarlenAttentionError(ValueError):
    """Shapes or ``cu_seqlens`` do not describe a valid packed batch."""


@lru_cache(maxsize=1)
def flash_attn_available() -> bool:
    """Whether ``flash_attn`` can be imported (checked once, import guarded)."""
    return importlib.util.find_spec("flash_attn") is not None


def _flash_varlen(q, k, v, cu_seqlens, max_seqlen, causal):  # pragma: no cover - CUDA only
    from flash_attn import flash_attn_varlen_func

    cu = cu_seqlens.to(device=q.device, dtype=torch.int32)
    return flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen, max_seqlen, causal=causal)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    causal: bool = False,
) -> torch.Tensor:
    """Softmax attention of each packed sequence with itself; returns ``[T, H, D]``."""
    if q.dim() != 3 or k.shape != q.shape or v.shape[:2] != q.shape[:2]:
        raise VarlenAttentionError(
            f"expected q, k, v of shape [T, H, D] with equal T and H, got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    T = q.shape[0]
    cu_cpu = cu_seqlens.detach().to("cpu", torch.int64)
    if cu_cpu.dim() != 1 or cu_cpu.numel() < 1 or int(cu_cpu[0]) != 0 or int(cu_cpu[-1]) != T:
        raise VarlenAttentionError(
            f"cu_seqlens must be 1-D, start at 0 and end at T={T}; got {cu_cpu.tolist()[:8]}"
        )
    lens = torch.diff(cu_cpu)
    if bool((lens < 0).any()):
        raise VarlenAttentionError("cu_seqlens must be non-decreasing")
    if T == 0:
        return q.new_zeros(q.shape[0], q.shape[1], v.shape[2]) + 0 * (q.sum() + k.sum() + v.sum())
    if (
        q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and flash_attn_available()
    ):  # pragma: no cover - CUDA only
        return _flash_varlen(q, k, v, cu_seqlens, int(max_seqlen), causal)
    # SDPA wants [B, H, L, D]; one call per sequence keeps memory linear in T.
    outs = []
    for start, end in zip(cu_cpu[:-1].tolist(), cu_cpu[1:].tolist(), strict=True):
        if end == start:
            continue
        qs, ks, vs = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
        outs.append(o.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0)
