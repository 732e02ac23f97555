"""numba kernels of the compiled rasteriser around compositing: tile binning, per-Gaussian
attribute rows, and the deterministic per-Gaussian reduction of gradient rows. Compositing itself
(forward and backward) is in ``_kernels_lanes``.

Binning sorts the visible Gaussians once by (depth, index) and deals them to their tiles, so
each tile's list comes out in that order; results are bit-identical whatever the thread
count. The backward pass accumulates into per-intersection gradient rows (one row per
(tile, Gaussian) pair, no atomics), which ``reduce_grads`` then sums per Gaussian in a fixed
order.

Row layout (float32, ``gaussian_rows``): mean x, mean y, conic a, b, c, r, g, b, opacity,
depth, then the footprint (x / y half-extent). Gradient rows (one per intersection) hold the
first ten columns.

The tile size is an argument (``tile``), defined once in ``project.py``: numba would freeze
imported globals into its on-disk cache.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

PACK = 10  # gradient columns per intersection
ROW = 12  # columns of ``gaussian_rows``


@njit(cache=True, inline="always")
def _tile_rect(x, y, rx, ry, tile, tiles_x, tiles_y):  # pragma: no cover - compiled
    """Half-open tile rectangle of a per-axis box, in float32 exactly like ``tile_rects``."""
    rxf = np.float32(rx)
    ryf = np.float32(ry)
    t = np.float32(tile)
    x0 = min(max(int(np.floor((x - rxf) / t)), 0), tiles_x)
    x1 = min(max(int(np.ceil((x + rxf) / t)), 0), tiles_x)
    y0 = min(max(int(np.floor((y - ryf) / t)), 0), tiles_y)
    y1 = min(max(int(np.ceil((y + ryf) / t)), 0), tiles_y)
    return x0, y0, x1, y1


@njit(cache=True)
def depth_order(keys, rects):  # pragma: no cover - compiled
    """The stable ascending order of uint32 ``keys`` (a permutation of their positions), and
    ``rects`` [M,4] permuted alike.

    LSD radix sort, three passes of 11/11/10 bits: linear time, no comparisons (the per-tile
    comparison sorts it replaces were half of the binning time). The rectangles travel with
    the keys, so that dealing the sorted Gaussians to their tiles reads memory in order (a
    gather by the permutation missed the cache at every Gaussian of a 1M scene). Depths of
    visible Gaussians are > 0, so their float32 bit patterns (uint32) order like the values;
    stability keeps equal depths in index order.
    """
    m = keys.shape[0]
    src = np.arange(m)
    dst = np.empty(m, dtype=np.int64)
    k_src = keys.copy()
    k_dst = np.empty(m, dtype=np.uint32)
    r_src = rects.copy()
    r_dst = np.empty_like(rects)
    for shift in (0, 11, 22):
        counts = np.zeros(2049, dtype=np.int64)
        for k in range(m):
            counts[((k_src[k] >> np.uint32(shift)) & np.uint32(2047)) + 1] += 1
        for b in range(2048):
            counts[b + 1] += counts[b]
        for k in range(m):
            b = (k_src[k] >> np.uint32(shift)) & np.uint32(2047)
            pos = counts[b]
            counts[b] = pos + 1
            dst[pos] = src[k]
            k_dst[pos] = k_src[k]
            for q in range(4):
                r_dst[pos, q] = r_src[k, q]
        src, dst = dst, src
        k_src, k_dst = k_dst, k_src
        r_src, r_dst = r_dst, r_src
    return src, r_src


@njit(parallel=True, cache=True)
def bin_gaussians(means2d, extents, depth_bits, tile, tiles_x, tiles_y):  # pragma: no cover
    """Per-tile lists (CSR: offsets [T+1], slots) of the Gaussians whose per-axis box
    (``extents`` [N,2]) touches the tile, and ``hit`` [H] (ascending): the Gaussians that touch
    any tile. Lists hold slots, positions in ``hit`` (``hit[slot]`` is the Gaussian), each
    list in (depth, index) order: the hit Gaussians are sorted once (``depth_order``) and then
    dealt to their tiles in that order, so no list needs sorting. ``depth_bits`` is the
    float32 depth array viewed as uint32."""
    n = means2d.shape[0]
    n_tiles = tiles_x * tiles_y
    rects = np.zeros((n, 4), dtype=np.int32)
    for g in prange(n):
        if extents[g, 0] > 0:
            x0, y0, x1, y1 = _tile_rect(
                means2d[g, 0], means2d[g, 1], extents[g, 0], extents[g, 1], tile, tiles_x, tiles_y
            )
            rects[g, 0] = x0
            rects[g, 1] = y0
            rects[g, 2] = x1
            rects[g, 3] = y1
    counts = np.zeros(n_tiles + 1, dtype=np.int64)
    n_hit = 0
    for g in range(n):
        if rects[g, 2] > rects[g, 0] and rects[g, 3] > rects[g, 1]:
            n_hit += 1
        for ty in range(rects[g, 1], rects[g, 3]):
            for tx in range(rects[g, 0], rects[g, 2]):
                counts[ty * tiles_x + tx + 1] += 1
    hit = np.empty(n_hit, dtype=np.int64)
    keys = np.empty(n_hit, dtype=np.uint32)
    hit_rects = np.empty((n_hit, 4), dtype=np.int32)
    k = 0
    for g in range(n):
        if rects[g, 2] > rects[g, 0] and rects[g, 3] > rects[g, 1]:
            hit[k] = g
            keys[k] = depth_bits[g]
            for q in range(4):
                hit_rects[k, q] = rects[g, q]
            k += 1
    order, sorted_rects = depth_order(keys, hit_rects)
    offsets = np.cumsum(counts)
    cursor = offsets[:-1].copy()
    slots = np.empty(offsets[-1], dtype=np.int64)
    for k in range(n_hit):
        c = order[k]
        for ty in range(sorted_rects[k, 1], sorted_rects[k, 3]):
            for tx in range(sorted_rects[k, 0], sorted_rects[k, 2]):
                t = ty * tiles_x + tx
                slots[cursor[t]] = c
                cursor[t] += 1
    return offsets, slots, hit


@njit(parallel=True, cache=True)
def gaussian_rows(hit, means2d, conics, colors, opacities, depths, alpha_min):  # pragma: no cover
    """The compositing attributes of each hit Gaussian (``hit`` from ``bin_gaussians``) in one
    contiguous row [H, ROW]: the rasteriser reads one cache line per (tile, Gaussian) pair
    instead of gathering from six arrays, and culled Gaussians (most of a scene seen from
    inside) cost nothing.

    Columns 10, 11 hold the half-extents in x and y of the ellipse ``d^T C d <= level`` where
    ``alpha >= alpha_min``, slightly enlarged, so the rasteriser visits only rows and lane
    runs that can receive the Gaussian (each visited pixel is still tested exactly, so the
    margins change no result); -1 if alpha never reaches the cut-off.
    """
    rows = np.empty((hit.shape[0], ROW), dtype=np.float32)
    for c in prange(hit.shape[0]):
        g = hit[c]
        a = conics[g, 0]
        b = conics[g, 1]
        cc = conics[g, 2]
        op = opacities[g]
        rows[c, 0] = means2d[g, 0]
        rows[c, 1] = means2d[g, 1]
        rows[c, 2] = a
        rows[c, 3] = b
        rows[c, 4] = cc
        rows[c, 5] = colors[g, 0]
        rows[c, 6] = colors[g, 1]
        rows[c, 7] = colors[g, 2]
        rows[c, 8] = op
        rows[c, 9] = depths[g]
        rows[c, 10] = -1.0
        rows[c, 11] = -1.0
        # alpha >= alpha_min  <=>  d^T C d <= 2 ln(op / alpha_min); extents from C^-1.
        level = 2.0 * np.log(max(np.float64(op) / alpha_min, 1e-30))
        det = np.float64(a) * cc - np.float64(b) * b
        if level > 0.0 and det > 0.0:
            rows[c, 10] = np.sqrt(level * cc / det) * 1.001 + 0.01
            rows[c, 11] = np.sqrt(level * a / det) * 1.001 + 0.01
    return rows


@njit(cache=True)
def reduce_grads(slots, hit, grads, n_gaussians):  # pragma: no cover
    """Sum per-intersection rows (gradients, or any [M, C]) per Gaussian, in a fixed
    (deterministic) order."""
    out = np.zeros((n_gaussians, grads.shape[1]), dtype=np.float32)
    for m in range(slots.shape[0]):
        g = hit[slots[m]]
        for k in range(grads.shape[1]):
            out[g, k] += grads[m, k]
    return out
