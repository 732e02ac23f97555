"""numba kernels of the model's per-asset geometry passes (see stage1.orient_faint_locally).

`nearest_in_balls` is the compiled form of "each point's k nearest among its own candidate
set", which torch can only do as a distance matrix over a whole chunk's candidates and a topk
(2.5 s of the 1M-Gaussian cold open; this kernel about 1 s there, under load).  Its reference
is `nearest_in_balls_reference`, the same selection point by point in torch; tests check the
two agree.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange


@njit(parallel=True, cache=True)
def _nearest_in_balls(points, row_ball, candidates, starts, sizes, flat, k):  # pragma: no cover
    n = points.shape[0]
    out = np.full((n, k), -1, dtype=np.int64)
    for i in prange(n):
        b = row_ball[i]
        best_d = np.full(k, np.inf)
        best_j = np.full(k, -1, dtype=np.int64)
        kept = 0
        px, py, pz = points[i, 0], points[i, 1], points[i, 2]
        for m in range(starts[b], starts[b] + sizes[b]):
            j = flat[m]
            dx = px - candidates[j, 0]
            dy = py - candidates[j, 1]
            dz = pz - candidates[j, 2]
            d = dx * dx + dy * dy + dz * dz
            if kept == k and (d > best_d[k - 1] or (d == best_d[k - 1] and j > best_j[k - 1])):
                continue
            # insert (d, j) in (distance, index) order; the last one drops out when full
            at = kept if kept < k else k - 1
            while at > 0 and (best_d[at - 1] > d or (best_d[at - 1] == d and best_j[at - 1] > j)):
                best_d[at] = best_d[at - 1]
                best_j[at] = best_j[at - 1]
                at -= 1
            best_d[at] = d
            best_j[at] = j
            if kept < k:
                kept += 1
        for t in range(kept):
            out[i, t] = best_j[t]
    return out


def nearest_in_balls(
    points: torch.Tensor,
    row_ball: torch.Tensor,
    candidates: torch.Tensor,
    starts: torch.Tensor,
    sizes: torch.Tensor,
    flat: torch.Tensor,
    k: int,
) -> torch.Tensor:
    """[P, k] int64: for each point [P, 3] the k nearest of the candidates [C, 3] listed in its
    ball (ball b: flat[starts[b] : starts[b] + sizes[b]], indices into candidates), nearest
    first by exact float64 distance, ties to the lower index; -1 where a ball has fewer."""
    out = _nearest_in_balls(
        points.detach().cpu().double().contiguous().numpy(),
        row_ball.cpu().long().contiguous().numpy(),
        candidates.detach().cpu().double().contiguous().numpy(),
        starts.cpu().long().contiguous().numpy(),
        sizes.cpu().long().contiguous().numpy(),
        flat.cpu().long().contiguous().numpy(),
        int(k),
    )
    return torch.from_numpy(out)


def nearest_in_balls_reference(points, row_ball, candidates, starts, sizes, flat, k):
    """The same by torch, point by point (slow and obvious: the tests' reference)."""
    out = torch.full((points.shape[0], k), -1, dtype=torch.int64)
    p, c = points.double(), candidates.double()
    for i in range(points.shape[0]):
        b = int(row_ball[i])
        ball = flat[int(starts[b]) : int(starts[b]) + int(sizes[b])]
        d = ((c[ball] - p[i]) ** 2).sum(-1)
        order = torch.from_numpy(np.lexsort((ball.numpy(), d.numpy())))[:k]
        out[i, : order.numel()] = ball[order]
    return out
