"""One entry point for attention over packed variable-length sequences.

``q, k, v``: ``[T, H, D]`` with sequences packed back to back and delimited by ``cu_seqlens``
(``[n + 1]``, starting at 0, ending at ``T``). Attention never crosses a sequence boundary.

Backends, the one dispatch of the package: on CUDA for fp16/bf16, flash-attn's varlen kernel
when the package is installed, else torch's ``varlen_attn`` when this torch has it (>= 2.11); both
take the device offsets and never synchronise with the host. Otherwise PyTorch SDPA, one call
per sequence (exact, works on every device and dtype, has a backward everywhere; FlexAttention
is avoided because it has no CPU backward), which needs the offsets on the host.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

__all__ = [
    "VarlenAttentionError",
    "flash_attn_available",
    "torch_varlen_available",
    "varlen_attention",
]


class VarlenAttentionError(ValueError):
    """Shapes or ``cu_seqlens`` do not describe a valid packed batch."""


@lru_cache(maxsize=1)
def flash_attn_available() -> bool:
    """Whether ``flash_attn`` can be imported (checked once, import guarded)."""
    return importlib.util.find_spec("flash_attn") is not None


@lru_cache(maxsize=1)
def torch_varlen_available() -> bool:
    """Whether this torch has ``torch.nn.attention.varlen.varlen_attn`` (checked once)."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def _device_varlen(q, k, v, cu_seqlens, max_seqlen, causal):  # pragma: no cover - CUDA only
    """flash-attn's or torch's varlen kernel on the device offsets: no host sync."""
    cu = cu_seqlens
    if cu.device != q.device or cu.dtype != torch.int32:  # (the balancer's already is)
        cu = cu.to(device=q.device, dtype=torch.int32)
    if flash_attn_available():
        from flash_attn import flash_attn_varlen_func

        return flash_attn_varlen_func(q, k, v, cu, cu, max_seqlen, max_seqlen, causal=causal)
    from torch.nn.attention.varlen import varlen_attn

    window = (-1, 0) if causal else (-1, -1)
    return varlen_attn(q, k, v, cu, cu, max_seqlen, max_seqlen, window_size=window)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    causal: bool = False,
    cu_seqlens_host: Sequence[int] | np.ndarray | None = None,
) -> torch.Tensor:
    """Softmax attention of each packed sequence with itself; returns ``[T, H, D]``.

    ``cu_seqlens_host``: the same offsets on the host, when the caller has them (the balancer's
    routing tables and the model's local dispatcher do). Checks and the SDPA loop then read them
    instead of copying ``cu_seqlens`` from the device, which on CUDA would wait for every queued
    kernel; the device kernels (CUDA, fp16/bf16) run without them, unchecked, never syncing."""
    if q.dim() != 3 or k.shape != q.shape or v.shape[:2] != q.shape[:2]:
        raise VarlenAttentionError(
            f"expected q, k, v of shape [T, H, D] with equal T and H, got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    T = q.shape[0]
    device_kernel = (
        q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16)
        and (flash_attn_available() or torch_varlen_available())
    )
    if device_kernel and cu_seqlens_host is None and T > 0:  # pragma: no cover - CUDA only
        return _device_varlen(q, k, v, cu_seqlens, int(max_seqlen), causal)
    if cu_seqlens_host is not None:
        cu_host = np.asarray(cu_seqlens_host, dtype=np.int64)
        if cu_host.shape != tuple(cu_seqlens.shape):
            raise VarlenAttentionError(
                f"cu_seqlens_host has shape {cu_host.shape}, cu_seqlens {tuple(cu_seqlens.shape)}"
            )
    else:
        cu_host = cu_seqlens.detach().to("cpu", torch.int64).numpy()
    if cu_host.ndim != 1 or cu_host.size < 1 or int(cu_host[0]) != 0 or int(cu_host[-1]) != T:
        raise VarlenAttentionError(
            f"cu_seqlens must be 1-D, start at 0 and end at T={T}; got {cu_host.tolist()[:8]}"
        )
    if (np.diff(cu_host) < 0).any():
        raise VarlenAttentionError("cu_seqlens must be non-decreasing")
    if T == 0:
        return q.new_zeros(q.shape[0], q.shape[1], v.shape[2]) + 0 * (q.sum() + k.sum() + v.sum())
    if device_kernel:  # pragma: no cover - CUDA only (offsets checked on the host above)
        return _device_varlen(q, k, v, cu_seqlens, int(max_seqlen), causal)
    # SDPA wants [B, H, L, D]; one call per sequence keeps memory linear in T.
    outs = []
    for start, end in zip(cu_host[:-1].tolist(), cu_host[1:].tolist(), strict=True):
        if end == start:
            continue
        qs, ks, vs = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
        outs.append(o.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0)
