"""numba kernels of the model's passes over every Gaussian of a large asset.

`nearest_in_balls` is the compiled form of "each point's k nearest among its own candidate
set", which torch can only do as a distance matrix over a whole chunk's candidates and a topk
(2.5 s of the 1M-Gaussian cold open; this kernel about 1 s there, under load).  Its reference
is `nearest_in_balls_reference`, the same selection point by point in torch; tests check the
two agree.

`unmasked_voxel_sums` is Stage II's per-Gaussian inputs (`Stage2Editor._gaussian_inputs`)
summed per voxel over the Gaussians no edit view's mask covers, in one pass: for those the
inputs are the recolour's and the relight's candidate changes, the colour bin's statistics
and the seen weight, and a local edit at a million Gaussians needs only their voxel sums
(model/restricted.py).  Its reference is the torch path itself; tests check the two agree.
"""

from __future__ import annotations

import math

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


@njit(cache=True, inline="always")
def _candidate(c, new, lo, hi):  # pragma: no cover
    """hypotheses.map_candidates' change of one channel: the new value kept in the colour box
    (`box_colors`), minus the old one, clamped to [-1, 1] (as edit_hypotheses stacks it)."""
    d = min(max(new, lo), hi) - c
    return min(max(d, np.float32(-1.0)), np.float32(1.0))


@njit(parallel=True, cache=True)
def _unmasked_voxel_sums(
    colors, normals, weight, voxel, skip, affine, shade, light, bin_stats, bins, n_vox, width,
    cols, n_thr,
):  # pragma: no cover  # fmt: skip
    n = colors.shape[0]
    acc = np.zeros((n_thr, n_vox, width))
    per = (n + n_thr - 1) // n_thr
    zero, one = np.float32(0.0), np.float32(1.0)
    scale = np.float32(bins - 1e-4)
    for t in prange(n_thr):  # each thread its own rows and sums: the same result every run
        a = acc[t]
        for i in range(t * per, min(n, (t + 1) * per)):
            if skip[i]:
                continue
            v = voxel[i]
            c0, c1, c2 = colors[i, 0], colors[i, 1], colors[i, 2]
            a[v, cols[0]] += np.float32(math.log1p(np.float64(weight[i])))
            lit = normals[i, 0] * light[0] + normals[i, 1] * light[1] + normals[i, 2] * light[2]
            f = shade[0] + shade[1] * max(lit, zero)
            for k in range(3):
                c = colors[i, k]
                lo, hi = min(c, zero), max(c, one)
                new = c0 * affine[0, k] + c1 * affine[1, k] + c2 * affine[2, k] + affine[3, k]
                a[v, cols[1] + k] += _candidate(c, new, lo, hi)
                a[v, cols[2] + k] += _candidate(c, c * f, lo, hi)
            q0 = math.floor(min(max(c0, zero), one) * scale)
            q1 = math.floor(min(max(c1, zero), one) * scale)
            q2 = math.floor(min(max(c2, zero), one) * scale)
            b = (q0 * bins + q1) * bins + q2
            for j in range(bin_stats.shape[1]):
                a[v, cols[3] + j] += bin_stats[b, j]
    out = np.zeros((n_vox, width))
    for t in range(n_thr):
        out += acc[t]
    return out


def _f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().to(torch.float32).contiguous().numpy()


def unmasked_voxel_sums(
    colors: torch.Tensor,
    normals: torch.Tensor,
    weight: torch.Tensor,
    voxel: torch.Tensor,
    skip: torch.Tensor,
    affine: torch.Tensor,
    shading: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    bin_stats: torch.Tensor,
    num_voxels: int,
    width: int,
    columns: tuple[int, int, int, int],
) -> torch.Tensor:
    """[num_voxels, width] float64: per voxel, the sum of the per-Gaussian inputs of the
    Gaussians not in `skip` [N] bool (summed elsewhere; it holds every Gaussian with in-mask
    weight, so the others' inputs are zero but for these): log(1 + weight) [N] in column
    columns[0], the affine recolour's [4, 3] and the shading's
    (ambient, diffuse, light) candidate changes from columns[1] and columns[2], and the colour
    bin's `bin_stats` [COLOR_BINS^3, BIN_STATS_DIM] from columns[3].  float32 maths as torch's
    (the sums' order aside)."""
    import numba

    from splatpainter.model.hypotheses import COLOR_BINS

    a, d, light = shading
    out = _unmasked_voxel_sums(
        _f32(colors), _f32(normals), _f32(weight), voxel.cpu().long().contiguous().numpy(),
        skip.cpu().contiguous().numpy(), _f32(affine),
        np.array([float(a), float(d)], dtype=np.float32), _f32(light), _f32(bin_stats),
        COLOR_BINS, int(num_voxels), int(width), np.array(columns, dtype=np.int64),
        numba.get_num_threads(),
    )  # fmt: skip
    return torch.from_numpy(out).to(colors.device)
