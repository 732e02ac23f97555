"""Autograd-aware ``all_to_all_single`` with split sizes (backward: same op, splits swapped)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["all_to_all"]


def _a2a(
    x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: dist.ProcessGroup | None
) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):  # type: ignore[override]
        ctx.out_splits, ctx.in_splits, ctx.group = out_splits, in_splits, group
        return _a2a(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return _a2a(grad, ctx.in_splits, ctx.out_splits, ctx.group), None, None, None


def all_to_all(
    x: torch.Tensor,
    out_splits: Sequence[int],
    in_splits: Sequence[int],
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Rows ``x[sum(in_splits[:j]) : ...]`` go to rank j; rows from rank j arrive in order.

    Exact for every dtype: bools travel as uint8 and integers in their own dtype, so integer
    features (ids, positions) are never rounded.
    """
    outs, ins = [int(s) for s in out_splits], [int(s) for s in in_splits]
    if x.dtype == torch.bool:
        return _a2a(x.to(torch.uint8), outs, ins, group).to(torch.bool)
    if not (x.requires_grad and torch.is_grad_enabled()):
        return _a2a(x, outs, ins, group)
    return _AllToAll.apply(x, outs, ins, group)
