"""numba kernels of the compiled rasteriser: tile binning, forward and backward compositing.

One thread owns one 16x16 tile at a time (``prange`` over tiles), so every write is private:
the forward writes its own pixels, the backward accumulates into per-intersection gradient
rows (one row per (tile, Gaussian) pair), which a serial pass then sums per Gaussian in a fixed
order. No atomics, and results are bit-identical from run to run whatever the thread count.

Packed per-intersection row layout (float32): mean x, mean y, conic a, b, c, r, g, b, opacity,
depth, then the footprint (x / y half-extent, ellipse level; see ``pack_rows``). Gradient rows
hold the first ten columns.

The tile size and the compositing constants (alpha clamp, alpha cut-off, minimum
transmittance) are arguments (``tile``, ``thr`` = float32 [alpha_max, alpha_min, t_min]),
defined once in ``project.py``: numba would freeze imported globals into its on-disk cache.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

PACK = 10
_HALF = np.float32(0.5)
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)


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


@njit(parallel=True, cache=True)
def bin_gaussians(means2d, extents, depth_bits, tile, tiles_x, tiles_y):  # pragma: no cover
    """Per-tile lists (CSR: offsets [T+1], ids) of the Gaussians whose per-axis box
    (``extents`` [N,2]) touches the tile, each list sorted by (depth, index): filled in index
    order, then sorted per tile in parallel (no global sort). ``depth_bits`` is the float32
    depth array viewed as uint32."""
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
    for g in range(n):
        for ty in range(rects[g, 1], rects[g, 3]):
            for tx in range(rects[g, 0], rects[g, 2]):
                counts[ty * tiles_x + tx + 1] += 1
    offsets = np.cumsum(counts)
    cursor = offsets[:-1].copy()
    ids = np.empty(offsets[-1], dtype=np.int64)
    for g in range(n):
        for ty in range(rects[g, 1], rects[g, 3]):
            for tx in range(rects[g, 0], rects[g, 2]):
                t = ty * tiles_x + tx
                ids[cursor[t]] = g
                cursor[t] += 1
    for t in prange(n_tiles):
        lo = offsets[t]
        hi = offsets[t + 1]
        if hi - lo < 2:
            continue
        # Depths of visible Gaussians are > 0, so their float32 bit patterns order like the
        # values; the low 32 bits (position in the index-ordered list) break ties by index.
        keys = np.empty(hi - lo, dtype=np.uint64)
        for k in range(hi - lo):
            keys[k] = (np.uint64(depth_bits[ids[lo + k]]) << np.uint64(32)) | np.uint64(k)
        keys.sort()
        seg = ids[lo:hi].copy()
        for k in range(hi - lo):
            ids[lo + k] = seg[np.int64(keys[k] & np.uint64(0xFFFFFFFF))]
    return offsets, ids


@njit(parallel=True, cache=True)
def pack_rows(ids, means2d, conics, colors, opacities, depths, alpha_min):  # pragma: no cover
    """Gather each intersection's attributes into one contiguous row (cache friendly).

    Columns 10, 11 hold the half-extents in x and y of the ellipse ``d^T C d <= level`` where
    ``alpha >= alpha_min`` and column 12 that level, all slightly enlarged, so the rasteriser
    visits only pixels that can receive the Gaussian (each visited pixel is still tested
    exactly, so the margins change no result).
    """
    m_total = ids.shape[0]
    packed = np.empty((m_total, PACK + 3), dtype=np.float32)
    for m in prange(m_total):
        g = ids[m]
        a = conics[g, 0]
        b = conics[g, 1]
        c = conics[g, 2]
        op = opacities[g]
        packed[m, 0] = means2d[g, 0]
        packed[m, 1] = means2d[g, 1]
        packed[m, 2] = a
        packed[m, 3] = b
        packed[m, 4] = c
        packed[m, 5] = colors[g, 0]
        packed[m, 6] = colors[g, 1]
        packed[m, 7] = colors[g, 2]
        packed[m, 8] = op
        packed[m, 9] = depths[g]
        # alpha >= alpha_min  <=>  d^T C d <= 2 ln(op / alpha_min); extents from C^-1.
        level = 2.0 * np.log(max(np.float64(op) / alpha_min, 1e-30))
        det = np.float64(a) * c - np.float64(b) * b
        if level <= 0.0 or det <= 0.0:
            packed[m, 10] = -1.0
            packed[m, 11] = -1.0
            packed[m, 12] = -1.0
        else:
            packed[m, 10] = np.sqrt(level * c / det) * 1.001 + 0.01
            packed[m, 11] = np.sqrt(level * a / det) * 1.001 + 0.01
            packed[m, 12] = level * 1.002 + 1e-3
    return packed


@njit(cache=True, inline="always")
def _pixel_range(center, extent, lo, hi):  # pragma: no cover
    """Pixels ``p`` in [lo, hi) whose centre ``p + 0.5`` is within ``extent`` of ``center``."""
    if extent < 0.0:
        return lo, lo
    p0 = int(np.ceil(center - extent - 0.5))
    p1 = int(np.floor(center + extent - 0.5)) + 1
    return max(p0, lo), min(p1, hi)


@njit(cache=True, inline="always")
def _row_range(mx, dy, ca, cb, cc, level, lo, hi):  # pragma: no cover
    """Pixels of one row (dy = my - y) inside the ellipse a dx^2 + 2b dx dy + c dy^2 <= level.

    dx = mx - x, so the row's pixel centres run from mx - dx_hi to mx - dx_lo.
    """
    a = np.float64(ca)
    bd = np.float64(cb) * dy
    disc = bd * bd - a * (np.float64(cc) * dy * dy - level)
    if disc < 0.0:
        return lo, lo
    sq = np.sqrt(disc)
    p0 = int(np.ceil(mx - (sq - bd) / a - 0.51))
    p1 = int(np.floor(mx + (sq + bd) / a - 0.49)) + 1
    return max(p0, lo), min(p1, hi)


@njit(parallel=True, cache=True, fastmath={"nsz", "arcp"})
def raster_forward(
    packed, offsets, width, height, tile, tiles_x, background, thr
):  # pragma: no cover
    """Front-to-back compositing; also returns final transmittance and list end per pixel.

    Gaussian-major inside a tile: each Gaussian updates only the pixels of its alpha
    footprint; per pixel the operations and their order are exactly the textbook loop's.
    """
    rgb = np.empty((height, width, 3), dtype=np.float32)
    alpha_out = np.empty((height, width), dtype=np.float32)
    depth_out = np.empty((height, width), dtype=np.float32)
    final_t = np.empty((height, width), dtype=np.float32)
    last_idx = np.empty((height, width), dtype=np.int64)
    n_tiles = offsets.shape[0] - 1
    bg0, bg1, bg2 = background[0], background[1], background[2]
    alpha_max, alpha_min, t_min = thr[0], thr[1], thr[2]
    for t in prange(n_tiles):
        x_lo = (t % tiles_x) * tile
        y_lo = (t // tiles_x) * tile
        x_hi = min(x_lo + tile, width)
        y_hi = min(y_lo + tile, height)
        start = offsets[t]
        end = offsets[t + 1]
        acc = np.zeros((tile, tile, 4), dtype=np.float32)
        trans = np.ones((tile, tile), dtype=np.float32)
        last = np.full((tile, tile), start, dtype=np.int64)
        done = np.zeros((tile, tile), dtype=np.bool_)
        n_done = 0
        n_pix = (x_hi - x_lo) * (y_hi - y_lo)
        for m in range(start, end):
            if n_done == n_pix:
                break
            mx = packed[m, 0]
            my = packed[m, 1]
            ca = packed[m, 2]
            cb = packed[m, 3]
            cc = packed[m, 4]
            op = packed[m, 8]
            level = np.float64(packed[m, 12])
            py0, py1 = _pixel_range(my, packed[m, 11], y_lo, y_hi)
            for py in range(py0, py1):
                dy = my - (np.float32(py) + _HALF)
                iy = py - y_lo
                px0, px1 = _row_range(mx, np.float64(dy), ca, cb, cc, level, x_lo, x_hi)
                for px in range(px0, px1):
                    ix = px - x_lo
                    if done[iy, ix]:
                        continue
                    dx = mx - (np.float32(px) + _HALF)
                    power = -_HALF * (ca * dx * dx + cc * dy * dy) - cb * dx * dy
                    if power > _ZERO:
                        continue
                    alpha = min(alpha_max, op * np.exp(power))
                    if alpha < alpha_min:
                        continue
                    T = trans[iy, ix]
                    test_t = T * (_ONE - alpha)
                    if test_t < t_min:
                        done[iy, ix] = True
                        n_done += 1
                        continue
                    w = alpha * T
                    acc[iy, ix, 0] += packed[m, 5] * w
                    acc[iy, ix, 1] += packed[m, 6] * w
                    acc[iy, ix, 2] += packed[m, 7] * w
                    acc[iy, ix, 3] += packed[m, 9] * w
                    trans[iy, ix] = test_t
                    last[iy, ix] = m + 1
        for py in range(y_lo, y_hi):
            for px in range(x_lo, x_hi):
                iy = py - y_lo
                ix = px - x_lo
                T = trans[iy, ix]
                rgb[py, px, 0] = acc[iy, ix, 0] + T * bg0
                rgb[py, px, 1] = acc[iy, ix, 1] + T * bg1
                rgb[py, px, 2] = acc[iy, ix, 2] + T * bg2
                alpha_out[py, px] = _ONE - T
                depth_out[py, px] = acc[iy, ix, 3]
                final_t[py, px] = T
                last_idx[py, px] = last[iy, ix]
    return rgb, alpha_out, depth_out, final_t, last_idx


@njit(parallel=True, cache=True, fastmath={"nsz", "arcp"})
def raster_backward(
    packed,
    offsets,
    width,
    height,
    tile,
    tiles_x,
    background,
    thr,
    final_t,
    last_idx,
    grad_rgb,
    grad_alpha,
    grad_depth,
):  # pragma: no cover
    """Back-to-front pass rebuilding transmittance from the final T; per-intersection grads.

    For pixel p and Gaussian k (R = colour composited behind k, renormalised to T_{k+1}):
    dC/da_k = T_k (c_k - R) - bg T_final / (1 - a_k),  dA/da_k = T_final / (1 - a_k).
    """
    grads = np.zeros((packed.shape[0], PACK), dtype=np.float32)
    n_tiles = offsets.shape[0] - 1
    bg0, bg1, bg2 = background[0], background[1], background[2]
    alpha_max, alpha_min = thr[0], thr[1]
    for t in prange(n_tiles):
        x_lo = (t % tiles_x) * tile
        y_lo = (t // tiles_x) * tile
        x_hi = min(x_lo + tile, width)
        y_hi = min(y_lo + tile, height)
        start = offsets[t]
        trans = np.empty((tile, tile), dtype=np.float32)
        rec = np.zeros((tile, tile, 4), dtype=np.float32)
        bg_term = np.empty((tile, tile), dtype=np.float32)
        gpix = np.empty((tile, tile, 4), dtype=np.float32)  # tile-local copies of the
        last = np.empty((tile, tile), dtype=np.int64)  # per-pixel inputs (cache friendly)
        max_last = start
        for py in range(y_lo, y_hi):
            for px in range(x_lo, x_hi):
                iy = py - y_lo
                ix = px - x_lo
                tf = final_t[py, px]
                trans[iy, ix] = tf
                gpix[iy, ix, 0] = grad_rgb[py, px, 0]
                gpix[iy, ix, 1] = grad_rgb[py, px, 1]
                gpix[iy, ix, 2] = grad_rgb[py, px, 2]
                gpix[iy, ix, 3] = grad_depth[py, px]
                last[iy, ix] = last_idx[py, px]
                bg_term[iy, ix] = (
                    grad_alpha[py, px]
                    - (
                        grad_rgb[py, px, 0] * bg0
                        + grad_rgb[py, px, 1] * bg1
                        + grad_rgb[py, px, 2] * bg2
                    )
                ) * tf
                max_last = max(max_last, last_idx[py, px])
        for m in range(max_last - 1, start - 1, -1):
            mx = packed[m, 0]
            my = packed[m, 1]
            ca = packed[m, 2]
            cb = packed[m, 3]
            cc = packed[m, 4]
            cr = packed[m, 5]
            cg = packed[m, 6]
            cbl = packed[m, 7]
            op = packed[m, 8]
            dep = packed[m, 9]
            level = np.float64(packed[m, 12])
            py0, py1 = _pixel_range(my, packed[m, 11], y_lo, y_hi)
            g_mx = _ZERO
            g_my = _ZERO
            g_ca = _ZERO
            g_cb = _ZERO
            g_cc = _ZERO
            g_r = _ZERO
            g_g = _ZERO
            g_b = _ZERO
            g_op = _ZERO
            g_dep = _ZERO
            for py in range(py0, py1):
                dy = my - (np.float32(py) + _HALF)
                iy = py - y_lo
                px0, px1 = _row_range(mx, np.float64(dy), ca, cb, cc, level, x_lo, x_hi)
                for px in range(px0, px1):
                    ix = px - x_lo
                    if m >= last[iy, ix]:
                        continue
                    dx = mx - (np.float32(px) + _HALF)
                    power = -_HALF * (ca * dx * dx + cc * dy * dy) - cb * dx * dy
                    if power > _ZERO:
                        continue
                    gauss = np.exp(power)
                    raw = op * gauss
                    alpha = min(alpha_max, raw)
                    if alpha < alpha_min:
                        continue
                    one_minus = _ONE - alpha
                    T = trans[iy, ix] / one_minus
                    trans[iy, ix] = T
                    w = alpha * T
                    g0 = gpix[iy, ix, 0]
                    g1 = gpix[iy, ix, 1]
                    g2 = gpix[iy, ix, 2]
                    gd = gpix[iy, ix, 3]
                    g_r += w * g0
                    g_g += w * g1
                    g_b += w * g2
                    g_dep += w * gd
                    r0 = rec[iy, ix, 0]
                    r1 = rec[iy, ix, 1]
                    r2 = rec[iy, ix, 2]
                    rd = rec[iy, ix, 3]
                    d_alpha = (
                        T * ((cr - r0) * g0 + (cg - r1) * g1 + (cbl - r2) * g2 + (dep - rd) * gd)
                        + bg_term[iy, ix] / one_minus
                    )
                    rec[iy, ix, 0] = cr * alpha + one_minus * r0
                    rec[iy, ix, 1] = cg * alpha + one_minus * r1
                    rec[iy, ix, 2] = cbl * alpha + one_minus * r2
                    rec[iy, ix, 3] = dep * alpha + one_minus * rd
                    if raw > alpha_max:
                        continue  # clamped: alpha does not depend on the Gaussian here
                    g_op += gauss * d_alpha
                    d_power = alpha * d_alpha
                    g_mx += d_power * (-ca * dx - cb * dy)
                    g_my += d_power * (-cb * dx - cc * dy)
                    g_ca += d_power * (-_HALF * dx * dx)
                    g_cb += d_power * (-dx * dy)
                    g_cc += d_power * (-_HALF * dy * dy)
            grads[m, 0] = g_mx
            grads[m, 1] = g_my
            grads[m, 2] = g_ca
            grads[m, 3] = g_cb
            grads[m, 4] = g_cc
            grads[m, 5] = g_r
            grads[m, 6] = g_g
            grads[m, 7] = g_b
            grads[m, 8] = g_op
            grads[m, 9] = g_dep
    return grads


@njit(cache=True)
def reduce_grads(ids, grads, n_gaussians):  # pragma: no cover
    """Sum per-intersection gradient rows per Gaussian, in a fixed (deterministic) order."""
    out = np.zeros((n_gaussians, PACK), dtype=np.float32)
    for m in range(ids.shape[0]):
        g = ids[m]
        for k in range(PACK):
            out[g, k] += grads[m, k]
    return out
