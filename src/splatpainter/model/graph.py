"""The k-nearest-neighbour graph of an asset's Gaussians: the 3D structure edits spread over.

Plain data in, plain data out (no learning): `knn` and `nearest` are exact and deterministic
(a compiled grid search, `_kernels.grid_knn`, ties to the lower index: on the 1M tiled asset
the same neighbours and distances as scipy's k-d tree in about half its time);
`anchor_subsample` picks a spatially even subset (one Gaussian per occupied cell of a grid
sized for about `target` cells) for the coarse level of a propagation, so reach across an
asset does not grow with its Gaussian count.
"""

from __future__ import annotations

import numpy as np
import torch

from splatpainter.model._kernels import grid_knn, occupied_cells


def knn(points: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices [N, k] (int64) and distances [N, k] of each point's k nearest other points,
    nearest first (ties to the lower index).  With fewer than k + 1 points the missing
    neighbours repeat the point itself at distance 0 (a self-loop changes no propagation)."""
    n = int(points.shape[0])
    p = points.detach().cpu().double().numpy()
    idx, d2 = grid_knn(p, p, k, exclude_self=True)
    missing = idx < 0
    if missing.any():
        idx[missing] = np.nonzero(missing)[0]
        d2[missing] = 0.0
    return _tensors(idx, d2, points, n, k)


def nearest(queries: torch.Tensor, points: torch.Tensor, k: int = 1):
    """Indices [Q, k] and distances [Q, k] of the k points nearest to each query (nearest
    first, ties to the lower index; k at most the number of points)."""
    kk = min(k, int(points.shape[0]))
    q = queries.detach().cpu().double().numpy()
    idx, d2 = grid_knn(q, points.detach().cpu().double().numpy(), kk)
    return _tensors(idx, d2, queries, q.shape[0], kk)


def _tensors(idx: np.ndarray, d2: np.ndarray, like: torch.Tensor, n: int, k: int):
    return (
        torch.from_numpy(idx.reshape(n, k)).to(like.device),
        torch.from_numpy(np.sqrt(d2).reshape(n, k)).to(device=like.device, dtype=like.dtype),
    )


def anchor_subsample(points: torch.Tensor, target: int) -> torch.Tensor:
    """Sorted indices of about `target` points spread evenly in space: the point nearest to the
    centre of each occupied cell of a cubic grid (its cell size chosen by a few bisection steps
    so that the occupied-cell count is close to `target`).  All points when there are fewer."""
    n = int(points.shape[0])
    if n <= target:
        return torch.arange(n, device=points.device)
    p = points.detach().double()
    lo = p.min(0).values
    span = float((p.max(0).values - lo).max().clamp_min(1e-9))
    best = None
    a, b = 1, 512  # cells per side
    for _ in range(12):
        g = (a + b) // 2
        count = occupied_cells(p, lo, span / g, g)
        best = g
        if count > target:
            b = g
        elif count < target:
            a = g + 1
        if a >= b or count == target:
            break
    g = best
    cell = span / g
    ijk = ((p - lo) / cell).floor().long().clamp(0, g - 1)
    lin = (ijk[:, 0] * g + ijk[:, 1]) * g + ijk[:, 2]
    centre = ((lin // (g * g)).double(), ((lin // g) % g).double(), (lin % g).double())
    c = torch.stack(centre, -1) * cell + lo + cell / 2
    d = (p - c).pow(2).sum(-1)
    # per cell, the point with the smallest distance to the cell centre (ties: lowest index)
    order = torch.argsort(d, stable=True)
    lin_sorted = lin[order]
    first = torch.ones_like(lin_sorted, dtype=torch.bool)
    perm = torch.argsort(lin_sorted, stable=True)
    ls = lin_sorted[perm]
    first_sorted = torch.ones_like(ls, dtype=torch.bool)
    first_sorted[1:] = ls[1:] != ls[:-1]
    first[perm] = first_sorted
    return torch.sort(order[first]).values
