"""numba kernels of the compositing pass, written so that LLVM vectorises each tile row.

Inside a tile the loop is Gaussian-major (as in ``_kernels``' history): each Gaussian visits
the rows its alpha ellipse reaches, and each such row is processed as one run of ``LANES``
(16) pixels with no data-dependent branch: the per-pixel rules (power <= 0, alpha clamp,
alpha cut-off, early termination, the list end of the backward pass) become masks. A run of
16 float32 lanes compiles to two AVX2 vector iterations; the branchy scalar loop it replaces
spent most of its time on mispredicted branches (rows are 1-8 px long, pixels end at random
Gaussians). Per-row state lives in one 1D array per tile row with compile-time offsets
(``q * LANES + lane``), which is what lets LLVM prove that the lanes do not alias.

``exp`` of float32 is evaluated inline (``_exp_neg``: Cody-Waite range reduction and a
degree-5 minimax polynomial, as Cephes' ``expf``; at most 1.4 float32 ulp from the exact value,
checked by a test) because numba's ``np.exp`` is a libm call that blocks vectorisation.

One thread owns one tile (``prange`` over tiles, interleaved between threads); every write is
private, results are bit-identical whatever the thread count. The compositing constants
arrive as arguments (``thr`` = float32 [alpha_max, alpha_min, t_min]), never as imported
globals (numba freezes those into its on-disk cache). The tile size is an argument too;
tiles wider than ``LANES`` are processed as several lane runs per row.

Per-Gaussian rows: see ``_kernels.gaussian_rows`` (columns 0-9 the Gaussian, 10 and 11 the
x / y half-extent of its alpha footprint, negative for none), read through the tile lists
(``offsets``, ``ids``: row indices, the slots of ``_kernels.bin_gaussians``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

LANES = 16  # pixels per vectorised run (one 16 px tile row)
PACK = 10  # gradient columns per intersection (as ``_kernels.PACK``)
_F = np.float32
_HALF = _F(0.5)
_ONE = _F(1.0)
_ZERO = _F(0.0)
# exp(x) = 2^k * exp(r), k = round(x / ln 2), r = x - k ln 2 in two parts (Cody-Waite);
# exp(r) by the degree-5 minimax polynomial of Cephes' expf (S. L. Moshier).
_LOG2E = _F(1.4426950408889634)
_LN2_HI = _F(0.693359375)
_LN2_LO = _F(-2.12194440e-4)
_E0 = _F(1.9875691500e-4)
_E1 = _F(1.3981999507e-3)
_E2 = _F(8.3334519073e-3)
_E3 = _F(4.1665795894e-2)
_E4 = _F(1.6666665459e-1)
_E5 = _F(5.0000001201e-1)
_EXP_LO = _F(-80.0)  # below: returns exp(-80) (~1.8e-35), far under any alpha cut-off
_CHECK = 16  # the forward recounts live rows every this many Gaussians
# no reassociation (each pixel's operations keep the textbook order); multiply-adds may fuse
_FLAGS = {"nsz", "arcp", "contract"}

# forward row state: transmittance, colour r g b, depth, live (1 until the pixel stops)
_F_T, _F_R, _F_G, _F_B, _F_D, _F_LIVE = range(6)
_F_NQ = 6
# backward row state: transmittance, colour / depth behind, pixel gradients, background term
_B_T, _B_R0, _B_R1, _B_R2, _B_RD, _B_G0, _B_G1, _B_G2, _B_GD, _B_BG = range(10)
_B_NQ = 10


@intrinsic
def _bits_to_f32(typingctx, x):  # pragma: no cover - compiled
    """Reinterpret an int32 as float32 (a bitcast, vectorisable)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))

    return sig, codegen


@intrinsic
def _fma(typingctx, a, b, c):  # pragma: no cover - compiled
    """a * b + c rounded once (``llvm.fma``, vectorisable): an explicit fused multiply-add,
    so that the forward and backward kernels compute every alpha with the same roundings
    although both let LLVM fuse the other multiply-adds (``contract``)."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fnty = ir.FunctionType(f32, [f32, f32, f32])
        fn = builder.module.declare_intrinsic("llvm.fma", [f32], fnty)
        return builder.call(fn, args)

    return sig, codegen


@njit(cache=True, inline="always")
def _power(ca, cb, dx, dy, cdy):  # pragma: no cover - compiled
    """-(a dx^2 + 2 b dx dy + c dy^2) / 2 with ``cdy`` = c dy^2, in a fixed order of fused
    operations (nothing left for LLVM to contract, whatever the surrounding code)."""
    return _fma(-cb * dx, dy, -_HALF * _fma(ca * dx, dx, cdy))


@njit(cache=True, inline="always")
def _exp_neg(x):  # pragma: no cover - compiled
    """exp(x) for float32 x <= 0 (x > 0 is treated as 0), branch-free."""
    x = min(max(x, _EXP_LO), _ZERO)
    k = np.floor(x * _LOG2E + _HALF)
    r = x - k * _LN2_HI
    r = r - k * _LN2_LO
    p = _E0
    p = p * r + _E1
    p = p * r + _E2
    p = p * r + _E3
    p = p * r + _E4
    p = p * r + _E5
    p = p * (r * r) + r + _ONE
    return p * _bits_to_f32((np.int32(k) + np.int32(127)) << np.int32(23))


@njit(cache=True, fastmath=_FLAGS)
def exp_neg_array(x):  # pragma: no cover - compiled
    """``_exp_neg`` elementwise, compiled with the kernels' flags (for tests)."""
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = _exp_neg(x[i])
    return out


@njit(cache=True, inline="always")
def _composite(ca, cb, dx, dy, cdy, op, t, live, amax, amin, tmin):  # pragma: no cover
    """The front-to-back rules for one Gaussian at one pixel (offset dx, dy from its centre),
    shared by every pass that composites: its weight w = alpha T, the pixel's transmittance
    and live flag after it, and whether it was drawn."""
    power = _power(ca, cb, dx, dy, cdy)
    alpha = min(amax, op * _exp_neg(power))
    ok = (power <= _ZERO) & (alpha >= amin) & (live > _ZERO)
    test_t = t * (_ONE - alpha)
    term = ok & (test_t < tmin)
    draw = ok & ~term
    w = alpha * t if draw else _ZERO
    return w, (test_t if draw else t), (_ZERO if term else live), draw


@njit(cache=True, inline="always")
def _fwd_run(
    st, j, last, xs, r, mx, dy, cdy, ca, cb, op, cr, cg, cbl, dep, amax, amin, tmin, mi
):  # pragma: no cover
    """One Gaussian over one run of LANES pixels (the textbook per-pixel rules as masks)."""
    row = st[j]
    la = last[j]
    xr = xs[r]
    for ln in range(LANES):
        w, t, live, draw = _composite(
            ca, cb, mx - xr[ln], dy, cdy, op, row[_F_T * LANES + ln],
            row[_F_LIVE * LANES + ln], amax, amin, tmin,
        )  # fmt: skip
        row[_F_R * LANES + ln] += cr * w
        row[_F_G * LANES + ln] += cg * w
        row[_F_B * LANES + ln] += cbl * w
        row[_F_D * LANES + ln] += dep * w
        row[_F_T * LANES + ln] = t
        la[ln] = mi if draw else la[ln]
        row[_F_LIVE * LANES + ln] = live


@njit(cache=True, inline="always")
def _interleaved_tile(k, n_tiles, n_threads):  # pragma: no cover - compiled
    """The tile that parallel iteration ``k`` of ``range(ceil(n_tiles / n_threads) *
    n_threads)`` handles (-1: none). ``prange`` hands each thread one contiguous block of
    iterations; this map makes thread i's block the tiles i, i + n_threads, ... so that every
    thread gets a share of the busy middle of the image (contiguous blocks gave one of two
    threads 2/3 of the work on an orbit view). Any schedule still covers every tile exactly once."""
    per = (n_tiles + n_threads - 1) // n_threads
    t = (k % per) * n_threads + k // per
    return t if t < n_tiles else -1


@njit(cache=True, inline="always")
def _tile_box(t, tiles_x, tile, width, height):  # pragma: no cover - compiled
    """Pixel box [x_lo, x_hi) x [y_lo, y_hi) of tile ``t`` (row-major), clipped to the image."""
    x_lo = (t % tiles_x) * tile
    y_lo = (t // tiles_x) * tile
    return x_lo, y_lo, min(x_lo + tile, width), min(y_lo + tile, height)


@njit(cache=True, inline="always")
def _rows(my, ey, y_lo, y_hi):  # pragma: no cover - compiled
    """Rows [y0, y1) whose pixel centres are within ``ey`` of ``my`` (and in the tile)."""
    c = np.float64(my)
    e = np.float64(ey)
    y0 = max(int(np.ceil(c - e - 0.5)), y_lo)
    y1 = min(int(np.floor(c + e - 0.5)) + 1, y_hi)
    return y0, y1


@njit(cache=True, inline="always")
def _cols(mx, ex, x_lo, x_hi):  # pragma: no cover - compiled
    """Columns [p0, p1) whose pixel centres are within ``ex`` of ``mx`` (and in [x_lo, x_hi))."""
    c = np.float64(mx)
    e = np.float64(ex)
    return max(int(np.ceil(c - e - 0.5)), x_lo), min(int(np.floor(c + e - 0.5)) + 1, x_hi)


@njit(cache=True, inline="always")
def _runs(mx, ex, x_lo, x_hi):  # pragma: no cover - compiled
    """Lane runs [r0, r1) of the tile (``x_lo + r * LANES``) that the x extent reaches."""
    p0, p1 = _cols(mx, ex, x_lo, x_hi)
    if p1 <= p0:
        return 0, 0
    return (p0 - x_lo) // LANES, (p1 - 1 - x_lo) // LANES + 1


@njit(cache=True, inline="always")
def _gaussian(rows, g, x_lo, y_lo, x_hi, y_hi):  # pragma: no cover - compiled
    """Row ``g`` unpacked for a tile (shared by both passes): mean x, y, the tile rows
    [y0, y1) and lane runs [r0, r1) of its alpha footprint, conic a, b, c, colour r, g, b,
    opacity, depth. Only for rows with a footprint (column 11 >= 0)."""
    mx = rows[g, 0]
    my = rows[g, 1]
    y0, y1 = _rows(my, rows[g, 11], y_lo, y_hi)
    r0, r1 = _runs(mx, rows[g, 10], x_lo, x_hi)
    return (mx, my, y0, y1, r0, r1, rows[g, 2], rows[g, 3], rows[g, 4],
            rows[g, 5], rows[g, 6], rows[g, 7], rows[g, 8], rows[g, 9])  # fmt: skip


@njit(cache=True, inline="always")
def _pixel_centres(xs, x_lo, n_runs):  # pragma: no cover - compiled
    """xs[r, lane]: the x pixel centre of each lane of each run of the tile."""
    for r in range(n_runs):
        for ln in range(LANES):
            xs[r, ln] = _F(x_lo + r * LANES + ln) + _HALF


@njit(cache=True, inline="always")
def _recount_live(st, live_q, nh, n_runs, live_rows):  # pragma: no cover - compiled
    """Mark the tile rows with a pixel still live (row state column ``live_q``); their count."""
    n_live = 0
    for iy in range(nh):
        any_live = _ZERO
        for j in range(iy * n_runs, (iy + 1) * n_runs):
            for ln in range(LANES):
                any_live = max(any_live, st[j, live_q * LANES + ln])
        live_rows[iy] = 1 if any_live > _ZERO else 0
        n_live += live_rows[iy]
    return n_live


@njit(cache=True, fastmath=_FLAGS)
def _fwd_tile(
    rows, ids, start, end, x_lo, y_lo, x_hi, y_hi, n_runs, thr, st, last, xs, live_rows
):  # pragma: no cover
    """Composite one tile into ``st`` [rows * runs, NQ * LANES] and ``last`` (list ends)."""
    amax, amin, tmin = thr[0], thr[1], thr[2]
    nh = y_hi - y_lo
    _pixel_centres(xs, x_lo, n_runs)
    for iy in range(nh):
        for r in range(n_runs):
            j = iy * n_runs + r
            for ln in range(LANES):
                inside = x_lo + r * LANES + ln < x_hi
                st[j, _F_T * LANES + ln] = _ONE
                st[j, _F_R * LANES + ln] = _ZERO
                st[j, _F_G * LANES + ln] = _ZERO
                st[j, _F_B * LANES + ln] = _ZERO
                st[j, _F_D * LANES + ln] = _ZERO
                st[j, _F_LIVE * LANES + ln] = _ONE if inside else _ZERO
                last[j, ln] = start
        live_rows[iy] = 1
    n_live = nh
    for m in range(start, end):
        if n_live == 0:
            break
        g = ids[m]
        if rows[g, 11] < 0.0:
            continue
        mx, my, y0, y1, r0, r1, ca, cb, cc, cr, cg, cbl, op, dep = _gaussian(
            rows, g, x_lo, y_lo, x_hi, y_hi
        )
        mi = np.int32(m + 1)
        for py in range(y0, y1):
            iy = py - y_lo
            if live_rows[iy] == 0:
                continue
            dy = my - (_F(py) + _HALF)
            cdy = cc * dy * dy
            for r in range(r0, r1):
                j = iy * n_runs + r
                _fwd_run(st, j, last, xs, r, mx, dy, cdy, ca, cb, op,
                         cr, cg, cbl, dep, amax, amin, tmin, mi)  # fmt: skip
        if (m - start) % _CHECK == _CHECK - 1:  # stop early once every pixel has stopped
            n_live = _recount_live(st, _F_LIVE, nh, n_runs, live_rows)


@njit(parallel=True, cache=True)
def raster_forward(
    rows, ids, offsets, width, height, tile, tiles_x, background, thr, n_thr
):  # pragma: no cover
    """Front-to-back compositing: rgb, alpha, accumulated depth, final transmittance and the
    list end (one past the last Gaussian drawn) of every pixel. ``n_thr``: numba's thread
    count (``numba.get_num_threads()``; only the work split depends on it, not the result)."""
    rgb = np.empty((height, width, 3), dtype=np.float32)
    alpha_out = np.empty((height, width), dtype=np.float32)
    depth_out = np.empty((height, width), dtype=np.float32)
    final_t = np.empty((height, width), dtype=np.float32)
    last_idx = np.empty((height, width), dtype=np.int64)
    n_tiles = offsets.shape[0] - 1
    n_runs = (tile + LANES - 1) // LANES
    bg0, bg1, bg2 = background[0], background[1], background[2]
    for k in prange(((n_tiles + n_thr - 1) // n_thr) * n_thr):
        t = _interleaved_tile(k, n_tiles, n_thr)
        if t < 0:
            continue
        x_lo, y_lo, x_hi, y_hi = _tile_box(t, tiles_x, tile, width, height)
        st = np.empty((tile * n_runs, _F_NQ * LANES), dtype=np.float32)
        last = np.empty((tile * n_runs, LANES), dtype=np.int32)
        xs = np.empty((n_runs, LANES), dtype=np.float32)
        live_rows = np.empty(tile, dtype=np.int64)
        start = offsets[t]
        _fwd_tile(rows, ids, start, offsets[t + 1], x_lo, y_lo, x_hi, y_hi, n_runs, thr,
                  st, last, xs, live_rows)  # fmt: skip
        for py in range(y_lo, y_hi):
            for px in range(x_lo, x_hi):
                j = (py - y_lo) * n_runs + (px - x_lo) // LANES
                ln = (px - x_lo) % LANES
                tr = st[j, _F_T * LANES + ln]
                rgb[py, px, 0] = st[j, _F_R * LANES + ln] + tr * bg0
                rgb[py, px, 1] = st[j, _F_G * LANES + ln] + tr * bg1
                rgb[py, px, 2] = st[j, _F_B * LANES + ln] + tr * bg2
                alpha_out[py, px] = _ONE - tr
                depth_out[py, px] = st[j, _F_D * LANES + ln]
                final_t[py, px] = tr
                last_idx[py, px] = last[j, ln]
    return rgb, alpha_out, depth_out, final_t, last_idx


@njit(cache=True, inline="always")
def _bwd_run(
    st, j, last, xs, r, acc, m, mx, dy, cdy, ca, cb, cc, op, cr, cg, cbl, dep, amax, amin
):  # pragma: no cover
    """One Gaussian over one run of LANES pixels, back to front: undo its blend and add its
    per-lane gradient contributions to ``acc`` [PACK * LANES]."""
    row = st[j]
    la = last[j]
    xr = xs[r]
    for ln in range(LANES):
        dx = mx - xr[ln]
        power = _power(ca, cb, dx, dy, cdy)
        gauss = _exp_neg(power)
        raw = op * gauss
        alpha = min(amax, raw)
        ok = (m < la[ln]) & (power <= _ZERO) & (alpha >= amin)
        one_minus = _ONE - alpha
        inv = _ONE / one_minus
        t_old = row[_B_T * LANES + ln]
        t = t_old * inv
        w = alpha * t if ok else _ZERO
        g0 = row[_B_G0 * LANES + ln]
        g1 = row[_B_G1 * LANES + ln]
        g2 = row[_B_G2 * LANES + ln]
        gd = row[_B_GD * LANES + ln]
        acc[5 * LANES + ln] += w * g0
        acc[6 * LANES + ln] += w * g1
        acc[7 * LANES + ln] += w * g2
        acc[9 * LANES + ln] += w * gd
        r0 = row[_B_R0 * LANES + ln]
        r1 = row[_B_R1 * LANES + ln]
        r2 = row[_B_R2 * LANES + ln]
        rd = row[_B_RD * LANES + ln]
        d_alpha = (
            t * ((cr - r0) * g0 + (cg - r1) * g1 + (cbl - r2) * g2 + (dep - rd) * gd)
            + row[_B_BG * LANES + ln] * inv
        )
        row[_B_T * LANES + ln] = t if ok else t_old
        row[_B_R0 * LANES + ln] = cr * alpha + one_minus * r0 if ok else r0
        row[_B_R1 * LANES + ln] = cg * alpha + one_minus * r1 if ok else r1
        row[_B_R2 * LANES + ln] = cbl * alpha + one_minus * r2 if ok else r2
        row[_B_RD * LANES + ln] = dep * alpha + one_minus * rd if ok else rd
        # where alpha is clamped it does not depend on the Gaussian: no geometry/opacity grads
        d_a = d_alpha if ok & (raw <= amax) else _ZERO
        acc[8 * LANES + ln] += gauss * d_a
        d_power = alpha * d_a
        acc[0 * LANES + ln] += d_power * (-ca * dx - cb * dy)
        acc[1 * LANES + ln] += d_power * (-cb * dx - cc * dy)
        acc[2 * LANES + ln] += d_power * (-_HALF * dx * dx)
        acc[3 * LANES + ln] += d_power * (-dx * dy)
        acc[4 * LANES + ln] += d_power * (-_HALF * dy * dy)


@njit(cache=True, fastmath=True)
def _lane_sums(acc, out, m):  # pragma: no cover - compiled
    """out[m, q] = sum over lanes of acc[q]; reassociated (vectorised) in a fixed order."""
    for q in range(PACK):
        s = _ZERO
        for ln in range(LANES):
            s += acc[q * LANES + ln]
        out[m, q] = s


@njit(cache=True, fastmath=_FLAGS, error_model="numpy")
def _bwd_tile(
    rows, ids, start, x_lo, y_lo, x_hi, y_hi, n_runs, thr, bg, final_t, last_idx,
    grad_rgb, grad_alpha, grad_depth, st, last, xs, acc, row_end, grads,
):  # pragma: no cover  # fmt: skip
    """Gradient rows of one tile's intersections (back to front from the last drawn one)."""
    amax, amin = thr[0], thr[1]
    nh = y_hi - y_lo
    _pixel_centres(xs, x_lo, n_runs)
    max_last = start
    for iy in range(nh):
        row_end[iy] = start
        py = y_lo + iy
        for r in range(n_runs):
            j = iy * n_runs + r
            for ln in range(LANES):
                px = x_lo + r * LANES + ln
                if px < x_hi:
                    tf = final_t[py, px]
                    g0 = grad_rgb[py, px, 0]
                    g1 = grad_rgb[py, px, 1]
                    g2 = grad_rgb[py, px, 2]
                    st[j, _B_T * LANES + ln] = tf
                    st[j, _B_G0 * LANES + ln] = g0
                    st[j, _B_G1 * LANES + ln] = g1
                    st[j, _B_G2 * LANES + ln] = g2
                    st[j, _B_GD * LANES + ln] = grad_depth[py, px]
                    st[j, _B_BG * LANES + ln] = (
                        grad_alpha[py, px] - (g0 * bg[0] + g1 * bg[1] + g2 * bg[2])
                    ) * tf
                    e = last_idx[py, px]
                    row_end[iy] = max(row_end[iy], e)
                else:  # outside the image: never drawn
                    st[j, _B_T * LANES + ln] = _ONE
                    st[j, _B_G0 * LANES + ln] = _ZERO
                    st[j, _B_G1 * LANES + ln] = _ZERO
                    st[j, _B_G2 * LANES + ln] = _ZERO
                    st[j, _B_GD * LANES + ln] = _ZERO
                    st[j, _B_BG * LANES + ln] = _ZERO
                    e = start
                last[j, ln] = np.int32(e)
                st[j, _B_R0 * LANES + ln] = _ZERO
                st[j, _B_R1 * LANES + ln] = _ZERO
                st[j, _B_R2 * LANES + ln] = _ZERO
                st[j, _B_RD * LANES + ln] = _ZERO
        max_last = max(max_last, row_end[iy])
    for k in range(PACK * LANES):
        acc[k] = _ZERO
    for m in range(max_last - 1, start - 1, -1):
        g = ids[m]
        if rows[g, 11] < 0.0:
            continue
        mx, my, y0, y1, r0, r1, ca, cb, cc, cr, cg, cbl, op, dep = _gaussian(
            rows, g, x_lo, y_lo, x_hi, y_hi
        )
        mi = np.int32(m)
        touched = False
        for py in range(y0, y1):
            iy = py - y_lo
            if m >= row_end[iy] or r1 <= r0:
                continue  # every pixel of this row stopped before this Gaussian
            touched = True
            dy = my - (_F(py) + _HALF)
            cdy = cc * dy * dy
            for r in range(r0, r1):
                j = iy * n_runs + r
                _bwd_run(st, j, last, xs, r, acc, mi, mx, dy, cdy, ca, cb, cc, op,
                         cr, cg, cbl, dep, amax, amin)  # fmt: skip
        if touched:  # else its row of ``grads`` stays zero
            _lane_sums(acc, grads, m)
            for k in range(PACK * LANES):
                acc[k] = _ZERO


@njit(parallel=True, cache=True)
def raster_backward(
    rows, ids, offsets, width, height, tile, tiles_x, background, thr,
    final_t, last_idx, grad_rgb, grad_alpha, grad_depth, n_thr,
):  # pragma: no cover  # fmt: skip
    """Per-intersection gradient rows [M, PACK] (layout of ``_kernels.gaussian_rows``' first
    ten columns), rebuilding each pixel's transmittance back to front from its final value.

    For pixel p and Gaussian k (R = colour composited behind k, renormalised to T_{k+1}):
    dC/da_k = T_k (c_k - R) - bg T_final / (1 - a_k),  dA/da_k = T_final / (1 - a_k).
    """
    grads = np.zeros((ids.shape[0], PACK), dtype=np.float32)
    n_tiles = offsets.shape[0] - 1
    n_runs = (tile + LANES - 1) // LANES
    for k in prange(((n_tiles + n_thr - 1) // n_thr) * n_thr):
        t = _interleaved_tile(k, n_tiles, n_thr)
        if t < 0:
            continue
        x_lo, y_lo, x_hi, y_hi = _tile_box(t, tiles_x, tile, width, height)
        st = np.empty((tile * n_runs, _B_NQ * LANES), dtype=np.float32)
        last = np.empty((tile * n_runs, LANES), dtype=np.int32)
        xs = np.empty((n_runs, LANES), dtype=np.float32)
        acc = np.empty(PACK * LANES, dtype=np.float32)
        row_end = np.empty(tile, dtype=np.int64)
        _bwd_tile(rows, ids, offsets[t], x_lo, y_lo, x_hi, y_hi, n_runs, thr, background, final_t,
                  last_idx, grad_rgb, grad_alpha, grad_depth, st, last, xs, acc, row_end,
                  grads)  # fmt: skip
    return grads


# sums row state: transmittance, live (as the forward's)
_S_T, _S_LIVE = range(2)
_S_NQ = 2


@njit(cache=True, inline="always")
def _start_weight_rows(st, x_lo, x_hi, nh, n_runs, live_rows):  # pragma: no cover - compiled
    """Every pixel of a tile's ``nh`` rows transparent (T = 1) and live if inside the image."""
    for iy in range(nh):
        for r in range(n_runs):
            j = iy * n_runs + r
            for ln in range(LANES):
                st[j, _S_T * LANES + ln] = _ONE
                st[j, _S_LIVE * LANES + ln] = _ONE if x_lo + r * LANES + ln < x_hi else _ZERO
        live_rows[iy] = 1


@njit(cache=True, inline="always")
def _weights_run(st, j, xs, r, wl, mx, dy, cdy, ca, cb, op, amax, amin, tmin):  # pragma: no cover
    """One Gaussian over one run of LANES pixels, front to back with the forward's rules: its
    weights w = alpha T into ``wl`` [LANES], the run's transmittance and live flags updated."""
    row = st[j]
    xr = xs[r]
    for ln in range(LANES):
        w, t, live, _ = _composite(
            ca, cb, mx - xr[ln], dy, cdy, op, row[_S_T * LANES + ln],
            row[_S_LIVE * LANES + ln], amax, amin, tmin,
        )  # fmt: skip
        wl[ln] = w
        row[_S_T * LANES + ln] = t
        row[_S_LIVE * LANES + ln] = live


@njit(cache=True, inline="always")
def _sum_run(
    st, j, xs, r, tt, acc, wl, nc, mx, dy, cdy, ca, cb, op, amax, amin, tmin
):  # pragma: no cover
    """One Gaussian over one run of LANES pixels, front to back with the forward's rules:
    its weights w = alpha T times the pixels' targets, added to ``acc`` [nc * LANES]."""
    _weights_run(st, j, xs, r, wl, mx, dy, cdy, ca, cb, op, amax, amin, tmin)
    trow = tt[j]
    for c in range(nc):
        for ln in range(LANES):
            acc[c * LANES + ln] += wl[ln] * trow[c * LANES + ln]


@njit(cache=True, fastmath=_FLAGS)
def _sum_tile(
    rows, ids, start, end, x_lo, y_lo, x_hi, y_hi, n_runs, thr, targets, st, xs, tt, acc, wl,
    live_rows, sums,
):  # pragma: no cover  # fmt: skip
    """Per-intersection sums of one tile (``raster_sums``)."""
    amax, amin, tmin = thr[0], thr[1], thr[2]
    nc = targets.shape[2]
    nh = y_hi - y_lo
    _pixel_centres(xs, x_lo, n_runs)
    _start_weight_rows(st, x_lo, x_hi, nh, n_runs, live_rows)
    for iy in range(nh):
        for r in range(n_runs):
            j = iy * n_runs + r
            for ln in range(LANES):
                px = x_lo + r * LANES + ln
                for c in range(nc):
                    tt[j, c * LANES + ln] = targets[y_lo + iy, px, c] if px < x_hi else _ZERO
    for k in range(nc * LANES):
        acc[k] = _ZERO
    n_live = nh
    for m in range(start, end):
        if n_live == 0:
            break
        g = ids[m]
        if rows[g, 11] < 0.0:
            continue
        mx, my, y0, y1, r0, r1, ca, cb, cc, _, _, _, op, _ = _gaussian(
            rows, g, x_lo, y_lo, x_hi, y_hi
        )
        touched = False
        for py in range(y0, y1):
            iy = py - y_lo
            if live_rows[iy] == 0 or r1 <= r0:
                continue
            touched = True
            dy = my - (_F(py) + _HALF)
            cdy = cc * dy * dy
            for r in range(r0, r1):
                j = iy * n_runs + r
                _sum_run(st, j, xs, r, tt, acc, wl, nc, mx, dy, cdy, ca, cb, op,
                         amax, amin, tmin)  # fmt: skip
        if touched:
            for c in range(nc):
                s = _ZERO
                for ln in range(LANES):
                    s += acc[c * LANES + ln]
                    acc[c * LANES + ln] = _ZERO
                sums[m, c] = s
        if (m - start) % _CHECK == _CHECK - 1:  # as the forward: stop once every pixel has
            n_live = _recount_live(st, _S_LIVE, nh, n_runs, live_rows)


@njit(parallel=True, cache=True)
def raster_sums(
    rows, ids, offsets, width, height, tile, tiles_x, thr, targets, n_thr
):  # pragma: no cover
    """Per-intersection sums [M, C] of ``w_gp * targets[p]`` over each tile's pixels, with
    the forward's compositing weights ``w_gp = alpha_gp T_gp`` (front to back, the same rules
    and roundings): the gradient of ``sum_p <rgb_p, targets_p>`` with respect to a colour
    override, in one forward-like pass for any number of channels instead of a render and a
    backward pass per three of them."""
    nc = targets.shape[2]
    sums = np.zeros((ids.shape[0], nc), dtype=np.float32)
    n_tiles = offsets.shape[0] - 1
    n_runs = (tile + LANES - 1) // LANES
    for k in prange(((n_tiles + n_thr - 1) // n_thr) * n_thr):
        t = _interleaved_tile(k, n_tiles, n_thr)
        if t < 0:
            continue
        x_lo, y_lo, x_hi, y_hi = _tile_box(t, tiles_x, tile, width, height)
        st = np.empty((tile * n_runs, _S_NQ * LANES), dtype=np.float32)
        xs = np.empty((n_runs, LANES), dtype=np.float32)
        tt = np.empty((tile * n_runs, nc * LANES), dtype=np.float32)
        acc = np.empty(nc * LANES, dtype=np.float32)
        wl = np.empty(LANES, dtype=np.float32)
        live_rows = np.empty(tile, dtype=np.int64)
        _sum_tile(rows, ids, offsets[t], offsets[t + 1], x_lo, y_lo, x_hi, y_hi, n_runs, thr,
                  targets, st, xs, tt, acc, wl, live_rows, sums)  # fmt: skip
    return sums


@njit(cache=True, fastmath=_FLAGS)
def _weights_tile(
    rows, ids, start, end, x_lo, y_lo, x_hi, y_hi, n_runs, thr, width, st, xs, wl, live_rows,
    out_pix, out_m, out_w, at, emit,
):  # pragma: no cover  # fmt: skip
    """The non-zero compositing weights of one tile, with the forward's rules (as
    ``_sum_tile``): counted, or (``emit``) written from slot ``at`` as (pixel, intersection,
    weight); returns their count.  Each pixel's come front to back."""
    amax, amin, tmin = thr[0], thr[1], thr[2]
    nh = y_hi - y_lo
    _pixel_centres(xs, x_lo, n_runs)
    _start_weight_rows(st, x_lo, x_hi, nh, n_runs, live_rows)
    n_live = nh
    count = 0
    for m in range(start, end):
        if n_live == 0:
            break
        g = ids[m]
        if rows[g, 11] < 0.0:
            continue
        mx, my, y0, y1, r0, r1, ca, cb, cc, _, _, _, op, _ = _gaussian(
            rows, g, x_lo, y_lo, x_hi, y_hi
        )
        for py in range(y0, y1):
            iy = py - y_lo
            if live_rows[iy] == 0 or r1 <= r0:
                continue
            dy = my - (_F(py) + _HALF)
            cdy = cc * dy * dy
            for r in range(r0, r1):
                _weights_run(
                    st, iy * n_runs + r, xs, r, wl, mx, dy, cdy, ca, cb, op, amax, amin, tmin
                )
                for ln in range(LANES):
                    if wl[ln] != _ZERO:
                        if emit:
                            out_pix[at + count] = py * width + x_lo + r * LANES + ln
                            out_m[at + count] = m
                            out_w[at + count] = wl[ln]
                        count += 1
        if (m - start) % _CHECK == _CHECK - 1:  # as the forward: stop once every pixel has
            n_live = _recount_live(st, _S_LIVE, nh, n_runs, live_rows)
    return count


@njit(parallel=True, cache=True)
def _weights_pass(
    rows, ids, offsets, width, height, tile, tiles_x, thr, n_thr, starts, out_pix, out_m, out_w,
    emit,
):  # pragma: no cover  # fmt: skip
    """``_weights_tile`` over every tile: the counts [T], or the triplets written from
    ``starts`` [T]."""
    n_tiles = offsets.shape[0] - 1
    n_runs = (tile + LANES - 1) // LANES
    counts = np.zeros(n_tiles, dtype=np.int64)
    for k in prange(((n_tiles + n_thr - 1) // n_thr) * n_thr):
        t = _interleaved_tile(k, n_tiles, n_thr)
        if t < 0:
            continue
        x_lo, y_lo, x_hi, y_hi = _tile_box(t, tiles_x, tile, width, height)
        st = np.empty((tile * n_runs, _S_NQ * LANES), dtype=np.float32)
        xs = np.empty((n_runs, LANES), dtype=np.float32)
        wl = np.empty(LANES, dtype=np.float32)
        live_rows = np.empty(tile, dtype=np.int64)
        counts[t] = _weights_tile(
            rows, ids, offsets[t], offsets[t + 1], x_lo, y_lo, x_hi, y_hi, n_runs, thr, width,
            st, xs, wl, live_rows, out_pix, out_m, out_w, starts[t] if emit else 0, emit,
        )  # fmt: skip
    return counts


def raster_weights(rows, ids, offsets, width, height, tile, tiles_x, thr, n_thr, limit):
    """Every non-zero compositing weight ``w_gp = alpha_gp T_gp`` (the forward's rules and
    roundings): pixel index (y * width + x) int64 [E], intersection int64 [E], weight float32
    [E], each pixel's front to back, and E.  Counted first, tile by tile: above ``limit``
    the three arrays come back empty (the caller cannot hold them)."""
    n_tiles = offsets.shape[0] - 1
    e64, e32 = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
    args = (rows, ids, offsets, width, height, tile, tiles_x, thr, n_thr)
    counts = _weights_pass(*args, np.zeros(n_tiles, np.int64), e64, e64, e32, False)
    total = int(counts.sum())
    if total > limit:
        return e64, e64, e32, total
    starts = np.zeros(n_tiles, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    pix, m, w = np.empty(total, np.int64), np.empty(total, np.int64), np.empty(total, np.float32)
    _weights_pass(*args, starts, pix, m, w, True)
    return pix, m, w, total


# ------------------------------------------------------------------------- occlusion culling
@njit(cache=True, inline="always")
def _stops_run(
    st, j, xs, r, stop, m, mx, dy, cdy, ca, cb, op, amax, amin, tmin
):  # pragma: no cover
    """One Gaussian over one run of LANES pixels, front to back with the forward's rules:
    the list entry ``m`` recorded in ``stop`` where it ends a pixel (its transmittance would
    fall under the cut-off)."""
    row = st[j]
    xr = xs[r]
    srow = stop[j]
    for ln in range(LANES):
        before = row[_S_LIVE * LANES + ln]
        _, t, live, _ = _composite(
            ca, cb, mx - xr[ln], dy, cdy, op, row[_S_T * LANES + ln], before, amax, amin, tmin
        )
        row[_S_T * LANES + ln] = t
        row[_S_LIVE * LANES + ln] = live
        srow[ln] = m if (before > _ZERO) & (live == _ZERO) else srow[ln]


@njit(cache=True, fastmath=_FLAGS)
def _stops_tile(
    rows, ids, start, end, x_lo, y_lo, x_hi, y_hi, n_runs, thr, st, xs, live_rows, stop
):  # pragma: no cover
    """``raster_stops`` of one tile into ``stop`` [rows * runs, LANES]."""
    amax, amin, tmin = thr[0], thr[1], thr[2]
    nh = y_hi - y_lo
    _pixel_centres(xs, x_lo, n_runs)
    _start_weight_rows(st, x_lo, x_hi, nh, n_runs, live_rows)
    for j in range(nh * n_runs):
        for ln in range(LANES):
            stop[j, ln] = -1
    n_live = nh
    for m in range(start, end):
        if n_live == 0:
            break
        g = ids[m]
        if rows[g, 11] < 0.0:
            continue
        mx, my, y0, y1, r0, r1, ca, cb, cc, _, _, _, op, _ = _gaussian(
            rows, g, x_lo, y_lo, x_hi, y_hi
        )
        for py in range(y0, y1):
            iy = py - y_lo
            if live_rows[iy] == 0 or r1 <= r0:
                continue
            dy = my - (_F(py) + _HALF)
            cdy = cc * dy * dy
            for r in range(r0, r1):
                _stops_run(st, iy * n_runs + r, xs, r, stop, m, mx, dy, cdy, ca, cb, op,
                           amax, amin, tmin)  # fmt: skip
        if (m - start) % _CHECK == _CHECK - 1:  # as the forward: stop once every pixel has
            n_live = _recount_live(st, _S_LIVE, nh, n_runs, live_rows)


@njit(parallel=True, cache=True)
def raster_stops(rows, ids, offsets, width, height, tile, tiles_x, thr, n_thr):  # pragma: no cover
    """int64 [H, W]: the list entry (a slot of ``ids``) at which each pixel's front-to-back
    compositing ends, its transmittance about to fall under the cut-off (-1: it never does),
    with the forward's rules and roundings."""
    out = np.empty((height, width), dtype=np.int64)
    n_tiles = offsets.shape[0] - 1
    n_runs = (tile + LANES - 1) // LANES
    for k in prange(((n_tiles + n_thr - 1) // n_thr) * n_thr):
        t = _interleaved_tile(k, n_tiles, n_thr)
        if t < 0:
            continue
        x_lo, y_lo, x_hi, y_hi = _tile_box(t, tiles_x, tile, width, height)
        st = np.empty((tile * n_runs, _S_NQ * LANES), dtype=np.float32)
        xs = np.empty((n_runs, LANES), dtype=np.float32)
        live_rows = np.empty(tile, dtype=np.int64)
        stop = np.empty((tile * n_runs, LANES), dtype=np.int64)
        _stops_tile(rows, ids, offsets[t], offsets[t + 1], x_lo, y_lo, x_hi, y_hi, n_runs, thr,
                    st, xs, live_rows, stop)  # fmt: skip
        for py in range(y_lo, y_hi):
            for px in range(x_lo, x_hi):
                j = (py - y_lo) * n_runs + (px - x_lo) // LANES
                out[py, px] = stop[j, (px - x_lo) % LANES]
    return out


@njit(parallel=True, cache=True)
def reaches_front(rows, keys, stop_keys, width, height):  # pragma: no cover
    """bool [R]: whether row ``g`` (``_kernels.gaussian_rows``) has a pixel of its footprint
    whose compositing has not ended before it, that is whose ``stop_keys`` [H, W] (the
    (depth, index) key of the Gaussian that ends it, int64 max where none does) is at least
    the row's own key ``keys[g]``.  A row without one is never drawn."""
    n = rows.shape[0]
    out = np.zeros(n, dtype=np.bool_)
    for g in prange(n):
        if rows[g, 11] < 0.0:
            continue
        y0, y1 = _rows(rows[g, 1], rows[g, 11], 0, height)
        p0, p1 = _cols(rows[g, 0], rows[g, 10], 0, width)
        key = keys[g]
        found = False
        for py in range(y0, y1):
            for px in range(p0, p1):
                found = found or stop_keys[py, px] >= key
            if found:
                break
        out[g] = found
    return out
