"""numba kernels of the model's passes over every Gaussian of a large asset.

`nearest_in_balls` is the compiled form of "each point's k nearest among its own candidate
set", which torch can only do as a distance matrix over a whole chunk's candidates and a topk
(2.5 s of the 1M-Gaussian cold open; this kernel about 1 s there, under load).  Its reference
is `nearest_in_balls_reference`, the same selection point by point in torch; tests check the
two agree.

`sheet_flips` is `hypotheses.sheet_vote` (which faint normals their trusted neighbours turn)
row by row, in float64; tests check it against `sheet_vote` on float64 tensors.

`grid_knn` is the exact k nearest of each query by a uniform grid (the asset's k-NN graph,
`model/graph.py`): scipy's k-d tree took 1.9 s of the 1M cold open's graph, this 0.9-1.0 s.
Tests compare it bit for bit with brute force.

`unmasked_voxel_sums` is Stage II's per-Gaussian inputs (`Stage2Editor._gaussian_inputs`)
summed per voxel over the Gaussians no edit view's mask covers, in one pass: for those the
inputs are the recolour's and the relight's candidate changes, the colour bin's statistics
and the seen weight, and a local edit at a million Gaussians needs only their voxel sums
(model/restricted.py).  Its reference is the torch path itself; tests check the two agree.

`edge_inputs` makes the learned propagation's edge-MLP inputs (`propagate.EdgeAffinity`: the
two ends' embeddings' product and difference, `propagate.edge_geometry`) from the edges' end
indices in one pass, where torch gathered each end's rows and wrote ten temporaries of them
(the inputs were half of a 1M paint edit's walk).  Its reference is the torch path; tests check
the two agree.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit, prange


def _f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().to(torch.float32).contiguous().numpy()


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().double().contiguous().numpy()


@njit(cache=True, inline="always")
def _keep_nearest(d, j, best_d, best_j, kept, k):  # pragma: no cover
    """Insert (d, j) into the k best so far (best_d, best_j, `kept` of them) in (distance,
    index) order, the last dropping out when full; returns how many are kept."""
    if kept == k and (d > best_d[k - 1] or (d == best_d[k - 1] and j > best_j[k - 1])):
        return kept
    at = kept if kept < k else k - 1
    while at > 0 and (best_d[at - 1] > d or (best_d[at - 1] == d and best_j[at - 1] > j)):
        best_d[at] = best_d[at - 1]
        best_j[at] = best_j[at - 1]
        at -= 1
    best_d[at] = d
    best_j[at] = j
    return kept + 1 if kept < k else kept


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
            kept = _keep_nearest(dx * dx + dy * dy + dz * dz, j, best_d, best_j, kept, k)
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
        _f64(points),
        row_ball.cpu().long().contiguous().numpy(),
        _f64(candidates),
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


@njit(parallel=True, cache=True)
def _sheet_flips(rows, near, normals, means, min_scale):  # pragma: no cover
    r, k = near.shape
    out = np.zeros(r, dtype=np.bool_)
    for t in prange(r):
        i = rows[t]
        nx, ny, nz = normals[i, 0], normals[i, 1], normals[i, 2]
        agree = 0.0
        for s in range(k):
            j = near[t, s]
            if j < 0:
                continue
            cos = normals[j, 0] * nx + normals[j, 1] * ny + normals[j, 2] * nz
            dx = means[j, 0] - means[i, 0]
            dy = means[j, 1] - means[i, 1]
            dz = means[j, 2] - means[i, 2]
            offset = abs(dx * nx + dy * ny + dz * nz)
            reach = 0.25 * math.sqrt(dx * dx + dy * dy + dz * dz) + min_scale[i]
            if abs(cos) > 0.8 and offset <= reach:
                agree += 1.0 if cos > 0 else (-1.0 if cos < 0 else 0.0)
        out[t] = agree < 0
    return out


def sheet_flips(
    rows: torch.Tensor,
    near: torch.Tensor,
    normals: torch.Tensor,
    means: torch.Tensor,
    log_scales: torch.Tensor,
) -> torch.Tensor:
    """[R] bool: which normals of `rows` [R] `hypotheses.sheet_vote` turns, given each one's
    neighbours `near` [R, k] (indices into the Gaussians; -1: none), in float64.  One pass per
    row instead of torch's [R, k, 3] gathers (about 0.6 s of the 1M cold open; this 0.17 s
    with its conversions).  The
    tests check it against `sheet_vote` on float64 tensors, bit for bit."""
    flips = _sheet_flips(
        rows.cpu().long().contiguous().numpy(),
        near.cpu().long().contiguous().numpy(),
        _f64(normals),
        _f64(means),
        _f64(log_scales.detach().double().exp().amin(-1)),
    )
    return torch.from_numpy(flips).to(rows.device)


@njit(parallel=True, cache=True)
def _edge_inputs(u, points, normals, colors, src, dst, spacing):  # pragma: no cover
    r, k = dst.shape
    e = u.shape[1]
    out = np.empty((r, k, 2 * e + 5), dtype=np.float32)
    for t in prange(r):
        i = src[t]
        for c in range(k):
            j = dst[t, c]
            x = out[t, c]
            for q in range(e):
                x[q] = u[i, q] * u[j, q]
                x[e + q] = abs(u[i, q] - u[j, q])
            dx = points[j, 0] - points[i, 0]
            dy = points[j, 1] - points[i, 1]
            dz = points[j, 2] - points[i, 2]
            dist = max(np.float32(math.sqrt(dx * dx + dy * dy + dz * dz)), np.float32(1e-12))
            cos = normals[i, 0] * normals[j, 0] + normals[i, 1] * normals[j, 1]
            cos += normals[i, 2] * normals[j, 2]
            along = dx * normals[i, 0] + dy * normals[i, 1] + dz * normals[i, 2]
            x[2 * e] = math.log1p(dist / spacing)
            x[2 * e + 1] = abs(cos)
            x[2 * e + 2] = cos
            x[2 * e + 3] = abs(along) / dist
            x[2 * e + 4] = (
                abs(colors[i, 0] - colors[j, 0]) + abs(colors[i, 1] - colors[j, 1])
            ) + abs(colors[i, 2] - colors[j, 2])
    return out


def edge_inputs(
    u: torch.Tensor,
    points: torch.Tensor,
    normals: torch.Tensor,
    colors: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    spacing: float,
) -> torch.Tensor:
    """[R, k, 2E + 5] the edge MLP's inputs on the edges from the Gaussians src [R] to
    dst [R, k] (their embeddings u [N, E], centres, normals, colours; spacing: the local
    length unit)."""
    out = _edge_inputs(
        _f32(u), _f32(points), _f32(normals), _f32(colors),
        src.cpu().long().contiguous().numpy(), dst.cpu().long().contiguous().numpy(),
        np.float32(spacing),
    )  # fmt: skip
    return torch.from_numpy(out).to(u.device)


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


# ------------------------------------------------------------------------- grid k-NN
GRID_POINTS_PER_CELL = 5.0  # the grid's occupied cells hold about this many points
GRID_COUNTED_SIDE = 512  # the finest grid whose occupancy is counted (a 16 MB bitmap)


@njit(cache=True, inline="always")
def _cell_key(points, i, lo, cell, g):  # pragma: no cover
    """The linear id of the cell floor((p - lo) / cell) of point i, clamped to [0, g - 1]."""
    key = 0
    for a in range(3):
        key = key * g + min(max(math.floor((points[i, a] - lo[a]) / cell), 0), g - 1)
    return key


@njit(cache=True)
def _occupied_cells(points, lo, cell, g):  # pragma: no cover
    """The number of distinct cells (`_cell_key`) of points: a bitmap of the g^3 cells (the
    caller keeps g^3 small)."""
    bits = np.zeros(((g * g * g) >> 6) + 1, dtype=np.uint64)
    count = 0
    for i in range(points.shape[0]):
        key = _cell_key(points, i, lo, cell, g)
        w, b = key >> 6, np.uint64(1) << np.uint64(key & 63)
        if bits[w] & b == 0:
            bits[w] |= b
            count += 1
    return count


def occupied_cells(points: torch.Tensor, lo: torch.Tensor, cell: float, g: int) -> int:
    """How many cells of the cubic grid of side `cell` from `lo` (g per axis, coordinates
    clamped into it) the points [N, 3] occupy: the same cells as torch's
    ((p - lo) / cell).floor().long().clamp(0, g - 1) in float64."""
    p = _f64(points)
    return int(_occupied_cells(p, lo.detach().cpu().double().numpy(), float(cell), int(g)))


@njit(cache=True)
def _cell_keys(points, lo, cell, g):  # pragma: no cover
    keys = np.empty(points.shape[0], dtype=np.int64)
    for i in range(points.shape[0]):
        keys[i] = _cell_key(points, i, lo, cell, g)
    return keys


@njit(cache=True, inline="always")
def _row_range(ukeys, ustarts, k0, k1):  # pragma: no cover
    """The sorted points' positions [a, b) of the cells with keys in [k0, k1]."""
    a = np.searchsorted(ukeys, k0, side="left")
    b = np.searchsorted(ukeys, k1, side="right")
    return ustarts[a], ustarts[b]


@njit(cache=True, inline="always")
def _scan(
    qx, qy, qz, i, psorted, porder, a, b, exclude, best_d, best_j, kept, k
):  # pragma: no cover  # fmt: skip
    """Insert the sorted points a..b-1 into the k best (distance, index) of query i."""
    for m in range(a, b):
        j = porder[m]
        if exclude and j == i:
            continue
        dx = qx - psorted[m, 0]
        dy = qy - psorted[m, 1]
        dz = qz - psorted[m, 2]
        kept = _keep_nearest(dx * dx + dy * dy + dz * dz, j, best_d, best_j, kept, k)
    return kept


@njit(cache=True)
def _scan_cells(q, i, psorted, porder, ukeys, ustarts, lo, cell, g, exclude, best_d, best_j, k):
    """The k best of query i over every occupied cell, nearest boxes first pruned (for a query
    far from every point, where widening the block ring by ring would take long)."""
    kept = 0
    for u in range(ukeys.shape[0]):
        key = ukeys[u]
        c = (key // (g * g), (key // g) % g, key % g)
        gap = 0.0
        for a in range(3):  # the box widened by a rounding margin
            low = lo[a] + c[a] * cell - 1e-9 * cell
            d = max(low - q[a], q[a] - (low + 1.000000002 * cell), 0.0)
            gap += d * d
        if kept == k and gap > best_d[k - 1]:
            continue
        kept = _scan(q[0], q[1], q[2], i, psorted, porder, ustarts[u], ustarts[u + 1], exclude,
                     best_d, best_j, kept, k)  # fmt: skip
    return kept


@njit(cache=True, inline="always")
def _clear(q, c, r, lo, cell, g, eps):  # pragma: no cover
    """The distance from q to the outside of the block of cells c-r..c+r on every axis (inf
    where the block reaches the grid's edge), less a rounding margin."""
    out = np.inf
    for a in range(3):
        if c[a] - r > 0:
            out = min(out, q[a] - (lo[a] + (c[a] - r) * cell))
        if c[a] + r < g - 1:
            out = min(out, lo[a] + (c[a] + r + 1) * cell - q[a])
    return out - eps


@njit(parallel=True, cache=True)
def _grid_knn(
    queries, psorted, porder, ukeys, ustarts, qorder, gkeys, gstarts, lo, cell, g, k, exclude
):  # pragma: no cover  # fmt: skip
    nq = queries.shape[0]
    out_j = np.full((nq, k), -1, dtype=np.int64)
    out_d = np.full((nq, k), np.inf)
    eps = 1e-9 * cell
    for grp in prange(gkeys.shape[0]):
        key = gkeys[grp]
        c = np.array([key // (g * g), (key // g) % g, key % g], dtype=np.int64)
        # the 3 x 3 x 3 block around the group's cell: nine rows of consecutive keys
        ra = np.empty(9, dtype=np.int64)
        rb = np.empty(9, dtype=np.int64)
        nrows = 0
        z0, z1 = max(c[2] - 1, 0), min(c[2] + 1, g - 1)
        for x in range(max(c[0] - 1, 0), min(c[0] + 1, g - 1) + 1):
            for y in range(max(c[1] - 1, 0), min(c[1] + 1, g - 1) + 1):
                base = (x * g + y) * g
                ra[nrows], rb[nrows] = _row_range(ukeys, ustarts, base + z0, base + z1)
                nrows += 1
        best_d = np.empty(k)
        best_j = np.empty(k, dtype=np.int64)
        for t in range(gstarts[grp], gstarts[grp + 1]):
            i = qorder[t]
            q = queries[i]
            kept = 0
            for r in range(nrows):
                kept = _scan(q[0], q[1], q[2], i, psorted, porder, ra[r], rb[r], exclude,
                             best_d, best_j, kept, k)  # fmt: skip
            r = 1
            while True:  # widen ring by ring until nothing outside can be nearer
                clear = _clear(q, c, r, lo, cell, g, eps)
                if kept == k and (clear == np.inf or best_d[k - 1] < clear * clear):
                    break
                if clear == np.inf:
                    break  # the block holds every point
                r += 1
                if (2 * r + 1) ** 2 > ukeys.shape[0]:  # far from every point: scan all cells
                    kept = _scan_cells(q, i, psorted, porder, ukeys, ustarts, lo, cell, g,
                                       exclude, best_d, best_j, k)  # fmt: skip
                    break
                z0, z1 = max(c[2] - r, 0), min(c[2] + r, g - 1)
                for x in range(max(c[0] - r, 0), min(c[0] + r, g - 1) + 1):
                    for y in range(max(c[1] - r, 0), min(c[1] + r, g - 1) + 1):
                        base = (x * g + y) * g
                        if abs(x - c[0]) == r or abs(y - c[1]) == r:  # the whole row is new
                            a, b = _row_range(ukeys, ustarts, base + z0, base + z1)
                            kept = _scan(q[0], q[1], q[2], i, psorted, porder, a, b, exclude,
                                         best_d, best_j, kept, k)  # fmt: skip
                            continue
                        for z in (c[2] - r, c[2] + r):  # only the row's two ends are new
                            if 0 <= z < g:
                                a, b = _row_range(ukeys, ustarts, base + z, base + z)
                                kept = _scan(q[0], q[1], q[2], i, psorted, porder, a, b,
                                             exclude, best_d, best_j, kept, k)  # fmt: skip
            for s in range(kept):
                out_j[i, s] = best_j[s]
                out_d[i, s] = best_d[s]
    return out_j, out_d


def _grid_side(p: np.ndarray, lo: np.ndarray, extent: float, per_cell: float) -> int:
    """Cells per axis for occupied cells of about `per_cell` points: bisection on the counted
    occupancy up to GRID_COUNTED_SIDE cells per axis, extrapolated beyond it by the dimension
    the last doubling shows (a surface: 2)."""
    target = max(p.shape[0] / per_cell, 1.0)
    top = GRID_COUNTED_SIDE
    o_top = _occupied_cells(p, lo, extent / top, top)
    if o_top < target:
        o_half = _occupied_cells(p, lo, extent / (top // 2), top // 2)
        dim = min(max(math.log2(max(o_top, 1) / max(o_half, 1)), 1.0), 3.0)
        return int(min(top * (target / o_top) ** (1 / dim), 1 << 20))
    a, b = 1, top
    while a < b:  # the smallest side whose occupancy reaches the target
        g = (a + b) // 2
        if _occupied_cells(p, lo, extent / g, g) >= target:
            b = g
        else:
            a = g + 1
    return a


def _by_cell(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The order that sorts points by cell key [N], the occupied keys [C] ascending and where
    each one's points start in that order [C + 1] (the last: N)."""
    order = np.argsort(keys, kind="stable")
    occupied, first = np.unique(keys[order], return_index=True)
    return order, occupied, np.append(first, keys.shape[0]).astype(np.int64)


def grid_knn(
    queries: np.ndarray, points: np.ndarray, k: int, exclude_self: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """For each query [Q, 3] its k nearest points [P, 3] (float64): indices [Q, k] int64 and
    squared distances [Q, k], nearest first by exact float64 distance, ties to the lower index;
    -1 and inf where there are fewer.  exclude_self: the queries are the points, and each
    leaves itself out.

    A uniform grid of about GRID_POINTS_PER_CELL points per occupied cell: each query scans the
    3 x 3 x 3 block of cells around its own and widens it ring by ring until the k-th nearest
    is nearer than anything outside the block can be, so the result is the exact k nearest
    (the tests compare it with a brute-force search).  Queries of one cell share its lookups."""
    q = np.ascontiguousarray(queries, dtype=np.float64)
    p = np.ascontiguousarray(points, dtype=np.float64)
    nq = q.shape[0]
    if nq == 0 or p.shape[0] == 0 or k <= 0:
        return np.full((nq, max(k, 0)), -1, dtype=np.int64), np.full((nq, max(k, 0)), np.inf)
    both = p if exclude_self else np.concatenate([p, q])
    lo = both.min(0)
    extent = float((both.max(0) - lo).max()) or 1.0
    g = _grid_side(p, lo, extent, GRID_POINTS_PER_CELL)
    cell = extent / g * (1 + 1e-9)  # every point inside the grid without clamping
    porder, ukeys, ustarts = _by_cell(_cell_keys(p, lo, cell, g))
    if exclude_self:
        qorder, gkeys, gstarts = porder, ukeys, ustarts
    else:
        qorder, gkeys, gstarts = _by_cell(_cell_keys(q, lo, cell, g))
    return _grid_knn(
        q, np.ascontiguousarray(p[porder]), porder, ukeys, ustarts, qorder, gkeys, gstarts,
        lo, cell, g, int(k), bool(exclude_self),
    )  # fmt: skip
