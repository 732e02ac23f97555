"""The k-nearest-neighbour graph of an asset's Gaussians: the 3D structure edits spread over.

Plain data in, plain data out (no learning): `knn` is a k-d tree query (scipy), exact, and
deterministic; `anchor_subsample` picks a spatially even subset (one Gaussian per occupied cell
of a grid sized for about `target` cells) for the coarse level of a propagation, so reach across
an asset does not grow with its Gaussian count.
"""

from __future__ import annotations

import numpy as np
import torch


def knn(points: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices [N, k] (int64) and distances [N, k] of each point's k nearest other points,
    nearest first.  With fewer than k + 1 points the missing neighbours repeat the point itself
    at distance 0 (a self-loop changes no propagation)."""
    from scipy.spatial import cKDTree

    n = int(points.shape[0])
    if n == 0:
        return points.new_zeros((0, k), dtype=torch.int64), points.new_zeros((0, k))
    p = points.detach().cpu().double().numpy()
    kk = min(k + 1, n)
    dist, idx = cKDTree(p).query(p, k=kk, workers=-1)
    dist = np.asarray(dist).reshape(n, kk)
    idx = np.asarray(idx).reshape(n, kk)
    # drop each point itself (the first column, unless a duplicate point came first)
    own = np.arange(n)[:, None]
    keep = idx != own
    keep[keep.sum(1) == kk, -1] = False  # a point with kk duplicates: drop the farthest
    idx = idx[keep].reshape(n, kk - 1)
    dist = dist[keep].reshape(n, kk - 1)
    if kk - 1 < k:
        pad = k - (kk - 1)
        idx = np.concatenate([idx, np.repeat(own, pad, 1)], 1)
        dist = np.concatenate([dist, np.zeros((n, pad))], 1)
    return (
        torch.from_numpy(idx).to(points.device),
        torch.from_numpy(dist).to(device=points.device, dtype=points.dtype),
    )


def nearest(queries: torch.Tensor, points: torch.Tensor, k: int = 1):
    """Indices [Q, k] and distances [Q, k] of the k points nearest to each query."""
    from scipy.spatial import cKDTree

    kk = min(k, int(points.shape[0]))
    q = queries.detach().cpu().double().numpy()
    dist, idx = cKDTree(points.detach().cpu().double().numpy()).query(q, k=kk, workers=-1)
    idx = np.asarray(idx).reshape(-1, kk)
    dist = np.asarray(dist).reshape(-1, kk)
    return (
        torch.from_numpy(idx).to(queries.device),
        torch.from_numpy(dist).to(device=queries.device, dtype=queries.dtype),
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
        cell = span / g
        ijk = ((p - lo) / cell).floor().long().clamp(0, g - 1)
        lin = (ijk[:, 0] * g + ijk[:, 1]) * g + ijk[:, 2]
        count = _occupied(lin, g**3)
        best = (g, lin, cell)
        if count > target:
            b = g
        elif count < target:
            a = g + 1
        if a >= b or count == target:
            break
    g, lin, cell = best
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


def _occupied(lin: torch.Tensor, cells: int) -> int:
    """The number of distinct values of `lin` (in 0..cells-1): a bitmap when it is small
    (a tenth of sorting a million ids for each of the bisection's steps), else unique."""
    if cells > 1 << 25:
        return int(torch.unique(lin).numel())
    seen = torch.zeros(cells, dtype=torch.bool, device=lin.device)
    seen[lin] = True
    return int(seen.sum())
