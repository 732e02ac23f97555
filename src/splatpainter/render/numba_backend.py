"""The compiled CPU path: ``torch.autograd.Function`` wrappers around the numba kernels.

Three functions, composed by autograd like gsplat's stages: projection (means, quats,
log_scales, world_to_cam, K -> 2D means, conics, depths, per-axis radii, compensations), SH
colour (means, sh, camera centre -> RGB) and the tile rasteriser (2D quantities, colours,
background -> images). Every differentiable input gets its gradient (the camera pose, the
intrinsics and the background included). Everything runs in float32 on the CPU.

The maths' constants are read here at call time and passed to the kernels as arguments (see
``_kernels_proj``), so editing one takes effect in the compiled path at once.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from splatpainter.assets import gaussians
from splatpainter.render import _kernels, _kernels_lanes, _kernels_proj, project
from splatpainter.render.project import Projected, camera_center


def _np32(x: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(x.detach().to(device="cpu", dtype=torch.float32).numpy())


def _np64(x: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(x.detach().to(device="cpu", dtype=torch.float64).numpy())


def _intrinsics(K: torch.Tensor) -> np.ndarray:
    k = _np64(K)
    return np.array([k[0, 0], k[1, 1], k[0, 2], k[1, 2]], dtype=np.float64)


def proj_opts(
    near_plane: float = project.NEAR_PLANE,
    far_plane: float = project.FAR_PLANE,
    eps2d: float = project.EPS2D,
    radius_clip: float = 0.0,
    antialiased: bool = False,
) -> np.ndarray:
    """The ``opts`` array of the projection kernels (layout ``_kernels_proj.O_*``)."""
    o = np.zeros(_kernels_proj.N_OPTS, dtype=np.float64)
    o[_kernels_proj.O_NEAR] = near_plane
    o[_kernels_proj.O_FAR] = far_plane
    o[_kernels_proj.O_EPS2D] = eps2d
    o[_kernels_proj.O_RCLIP] = radius_clip
    o[_kernels_proj.O_AA] = 1.0 if antialiased else 0.0
    o[_kernels_proj.O_ALPHA_MIN] = project.ALPHA_MIN
    o[_kernels_proj.O_EXTEND] = project.EXTEND_MAX
    o[_kernels_proj.O_MAX_SIGMA] = project.MAX_SIGMA_PX
    o[_kernels_proj.O_MAX_LOGS] = project.MAX_LOG_SCALE
    return o


def sh_consts() -> np.ndarray:
    """(C0, C1, C2[5], C3[7]) as defined in ``assets.gaussians`` right now."""
    g = gaussians
    return np.array([g.SH_C0, g.SH_C1, *g.SH_C2, *g.SH_C3], dtype=np.float64)


def raster_thresholds() -> np.ndarray:
    """float32 [alpha_max, alpha_min, t_min] of the compositing rules in ``project``."""
    return np.array([project.ALPHA_MAX, project.ALPHA_MIN, project.T_MIN], dtype=np.float32)


def _grad_like(g: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(g).to(device=like.device, dtype=like.dtype)


class _ProjectNumba(torch.autograd.Function):
    @staticmethod
    def forward(ctx, means, quats, log_scales, world_to_cam, K, opacities, width, height, opts):
        arrays = (_np32(means), _np32(quats), _np32(log_scales))
        cam = (_np64(world_to_cam), _intrinsics(K), width, height, opts)
        op = _np32(opacities) if opacities is not None else np.zeros(0, np.float32)
        means2d, conics, depths, extents, comps = _kernels_proj.project_forward(*arrays, op, *cam)
        ctx.save_for_backward(means, quats, log_scales)  # version-checked by autograd
        ctx.saved = (cam, extents)
        ctx.like = (world_to_cam, K)
        ext_t = torch.from_numpy(extents)
        ctx.mark_non_differentiable(ext_t)
        return (
            torch.from_numpy(means2d),
            torch.from_numpy(conics),
            torch.from_numpy(depths),
            ext_t,
            torch.from_numpy(comps),
        )

    @staticmethod
    def backward(ctx, v_means2d, v_conics, v_depths, _v_ext, v_comps):
        cam, extents = ctx.saved
        arrays = tuple(_np32(t) for t in ctx.saved_tensors)
        n = extents.shape[0]

        def arr(v, shape):
            return _np32(v) if v is not None else np.zeros(shape, np.float32)

        grads = (arr(v_means2d, (n, 2)), arr(v_conics, (n, 3)), arr(v_depths, n))
        want_cam = ctx.needs_input_grad[3] or ctx.needs_input_grad[4]
        v_means, v_quats, v_logs, v_cam = _kernels_proj.project_backward(
            *arrays, *cam, extents, *grads, arr(v_comps, n), want_cam
        )
        w2c, K = ctx.like
        v_w2c = v_k = None
        if ctx.needs_input_grad[3]:
            g = np.zeros((4, 4))
            g[:3, :3] = v_cam[:9].reshape(3, 3)
            g[:3, 3] = v_cam[9:12]
            v_w2c = _grad_like(g, w2c)
        if ctx.needs_input_grad[4]:
            g = np.zeros((3, 3))
            g[0, 0], g[1, 1], g[0, 2], g[1, 2] = v_cam[12:16]
            v_k = _grad_like(g, K)
        return (torch.from_numpy(v_means), torch.from_numpy(v_quats), torch.from_numpy(v_logs),
                v_w2c, v_k, None, None, None, None)  # fmt: skip


class _ShNumba(torch.autograd.Function):
    @staticmethod
    def forward(ctx, means, sh, campos, degree, shc, visible):
        cp = _np64(campos)
        ctx.save_for_backward(means, sh)
        ctx.saved = (cp, degree, shc, visible)
        ctx.like = campos
        rgb = _kernels_proj.sh_forward(_np32(means), _np32(sh), cp, degree, shc, visible)
        return torch.from_numpy(rgb)

    @staticmethod
    def backward(ctx, v_colors):
        means, sh = (_np32(t) for t in ctx.saved_tensors)
        cp, degree, shc, visible = ctx.saved
        v_sh, v_means = _kernels_proj.sh_backward(
            means, sh, cp, degree, shc, visible, _np32(v_colors)
        )
        v_cp = None
        if ctx.needs_input_grad[2]:  # colour depends on (mean - camera centre)
            v_cp = _grad_like(-v_means.astype(np.float64).sum(axis=0), ctx.like)
        return torch.from_numpy(v_means), torch.from_numpy(v_sh), v_cp, None, None, None


def _cpu32(x: torch.Tensor) -> torch.Tensor:
    return x.to(device="cpu", dtype=torch.float32)


def project_numba(
    means: torch.Tensor,
    quats: torch.Tensor,
    log_scales: torch.Tensor,
    world_to_cam: torch.Tensor,
    K: torch.Tensor,
    width: int,
    height: int,
    *,
    opacities: torch.Tensor | None = None,
    near_plane: float = project.NEAR_PLANE,
    far_plane: float = project.FAR_PLANE,
    eps2d: float = project.EPS2D,
    radius_clip: float = 0.0,
    antialiased: bool = False,
) -> Projected:
    """Compiled twin of ``project.project_gaussians`` (float32 CPU outputs)."""
    opts = proj_opts(near_plane, far_plane, eps2d, radius_clip, antialiased)
    op = None if opacities is None else opacities.detach()
    means2d, conics, depths, extents, comps = _ProjectNumba.apply(
        _cpu32(means), _cpu32(quats), _cpu32(log_scales), world_to_cam, K, op, width, height, opts
    )
    return Projected(
        means2d=means2d,
        conics=conics,
        depths=depths,
        radii=extents.max(dim=-1).values,
        extents=extents,
        compensations=comps if antialiased else None,
    )


def sh_to_color_numba(
    means: torch.Tensor,
    sh: torch.Tensor,
    world_to_cam: torch.Tensor,
    degree: int,
    visible: torch.Tensor | None = None,
) -> torch.Tensor:
    """Compiled twin of ``project.sh_to_color`` (float32 CPU output).

    ``visible`` [N] bool limits the work to those Gaussians (the others get colour 0 and no
    gradient): in a scene seen from inside, most Gaussians are culled.
    """
    campos = camera_center(world_to_cam.to(device="cpu", dtype=torch.float64))
    n = means.shape[0]
    vis = np.ones(n, np.bool_) if visible is None else visible.detach().cpu().numpy()
    return _ShNumba.apply(_cpu32(means), _cpu32(sh), campos, degree, sh_consts(), vis)


def bin_tiles(
    means2d: torch.Tensor, extents: torch.Tensor, depths: torch.Tensor, width: int, height: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Tile offsets [T+1], flat slots (each tile's list in (depth, index) order), the hit
    Gaussians (``hit[slot]`` is a Gaussian's index) and the number of tile columns."""
    return _bin(_np32(means2d), _extents(extents), _np32(depths).view(np.uint32), width, height)


def _extents(extents: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(extents.detach().cpu().numpy().astype(np.int32, copy=False))


def _bin(means2d: np.ndarray, ext: np.ndarray, depth_bits: np.ndarray, width: int, height: int):
    """``bin_tiles`` of numpy arrays (``depth_bits``: float32 depths viewed as uint32)."""
    tile = project.TILE
    tiles_x = (width + tile - 1) // tile
    tiles_y = (height + tile - 1) // tile
    offsets, slots, hit = _kernels.bin_gaussians(means2d, ext, depth_bits, tile, tiles_x, tiles_y)
    return offsets, slots, hit, tiles_x


# The passes without gradients (weights, sums, a preprocessing render) first drop the Gaussians
# that no pixel can reach (`_front_bins`) when at least this many are drawn per pixel (a low-
# resolution view of a large asset: 1M Gaussians in 48 x 48 is 440 a pixel, of which 12%
# reach a pixel); the occluder sample holds about a sixteenth of that many per pixel.
CULL_MIN_PER_PIXEL = 32
CULL_SAMPLE_PER_PIXEL = 16


def _bins_and_rows(
    means2d, conics, colors: np.ndarray, opacities, depths, extents, w: int, h: int, bins=None,
    cull: bool = False,
):  # fmt: skip
    """``bin_tiles``' lists (or ``bins``, those of this geometry already) and the hit
    Gaussians' compositing rows (``gaussian_rows``).  ``cull``: lists of only the Gaussians
    that can reach a pixel (``_front_bins``), where that is worth it; a pass without
    gradients then composites the same Gaussians in the same order, to the bit."""
    arrays = (_np32(means2d), _np32(conics), colors, _np32(opacities), _np32(depths))
    if bins is None:
        ext = _extents(extents)
        bins = _front_bins(*arrays, ext, w, h) if cull else None
        if bins is None:
            bins = _bin(arrays[0], ext, arrays[4].view(np.uint32), w, h)
    offsets, ids, hit, tiles_x = bins
    rows = _kernels.gaussian_rows(hit, *arrays, float(project.ALPHA_MIN))
    return offsets, ids, hit, tiles_x, rows


def _front_bins(m2, conics, colors, opacities, depths, ext: np.ndarray, w: int, h: int):
    """``bin_tiles`` of only the Gaussians that some pixel's compositing reaches (None when
    fewer than ``CULL_MIN_PER_PIXEL`` are drawn per pixel: not worth a second pass).

    An evenly strided sample of the drawn Gaussians is composited first, recording where each
    pixel's compositing ends (``_kernels_lanes.raster_stops``).  All Gaussians composited,
    each pixel's transmittance before any Gaussian is at most the sample's (more factors, each
    at most one, and rounding is monotone), so it ends at the same Gaussian or earlier.  A
    Gaussian that comes after the sample's end, in (depth, index) order, at every pixel of its
    footprint is therefore never drawn (``reaches_front``), and dropping it changes nothing:
    the others keep their order, their transmittances and their tile lists' order."""
    drawn = np.flatnonzero(ext[:, 0] > 0)
    if drawn.size < CULL_MIN_PER_PIXEL * w * h:
        return None
    bits = depths.view(np.uint32)
    rows = _kernels.gaussian_rows(
        drawn, m2, conics, colors, opacities, depths, float(project.ALPHA_MIN)
    )
    keys = (bits[drawn].astype(np.int64) << 32) | drawn  # the lists' (depth, index) order
    step = max(2, int(drawn.size // (CULL_SAMPLE_PER_PIXEL * w * h)))
    sample = drawn[::step]
    s_offsets, s_ids, s_hit, tiles_x = _bin(m2[sample], ext[sample], bits[sample], w, h)
    stops = _kernels_lanes.raster_stops(
        rows[::step][s_hit], s_ids, s_offsets, w, h, project.TILE, tiles_x, raster_thresholds(),
        numba.get_num_threads(),
    )  # fmt: skip
    ended = stops >= 0
    stop_keys = np.full(stops.shape, np.iinfo(np.int64).max, dtype=np.int64)
    g = sample[s_hit[s_ids[stops[ended]]]]
    stop_keys[ended] = (bits[g].astype(np.int64) << 32) | g
    front = drawn[_kernels_lanes.reaches_front(rows, keys, stop_keys, w, h)]
    offsets, ids, hit, tiles_x = _bin(m2[front], ext[front], bits[front], w, h)
    return offsets, ids, front[hit], tiles_x


def _gaussian_sums(offsets, ids, hit, tiles_x, rows, w: int, h: int, targets, n: int):
    """[n, C] float32 per-Gaussian sums of ``w_gp targets[p]`` over the binned Gaussians
    (``raster_sums`` per intersection, then ``reduce_grads``)."""
    sums = _kernels_lanes.raster_sums(
        rows, ids, offsets, w, h, project.TILE, tiles_x, raster_thresholds(), targets,
        numba.get_num_threads(),
    )  # fmt: skip
    return _kernels.reduce_grads(ids, hit, sums, n)


class _RasterizeNumba(torch.autograd.Function):
    @staticmethod
    def forward(ctx, means2d, conics, colors, opacities, depths, extents, background, w, h, bins):
        offsets, ids, hit, tiles_x, rows = _bins_and_rows(
            means2d, conics, _np32(colors), opacities, depths, extents, w, h, bins
        )
        thr = raster_thresholds()
        bg = _np32(background)
        tile = project.TILE
        rgb, alpha, depth, final_t, last_idx = _kernels_lanes.raster_forward(
            rows, ids, offsets, w, h, tile, tiles_x, bg, thr, numba.get_num_threads()
        )
        ctx.saved = (rows, offsets, ids, hit, tiles_x, bg, final_t, last_idx, w, h, thr)
        ctx.n = means2d.shape[0]
        return torch.from_numpy(rgb), torch.from_numpy(alpha), torch.from_numpy(depth)

    @staticmethod
    def backward(ctx, grad_rgb, grad_alpha, grad_depth):
        rows, offsets, ids, hit, tiles_x, bg, final_t, last_idx, width, height, thr = ctx.saved
        hw = (height, width)
        g_rgb = _np32(grad_rgb) if grad_rgb is not None else np.zeros((*hw, 3), np.float32)
        g_a = _np32(grad_alpha) if grad_alpha is not None else np.zeros(hw, np.float32)
        g_d = _np32(grad_depth) if grad_depth is not None else np.zeros(hw, np.float32)
        grads = _kernels_lanes.raster_backward(
            rows, ids, offsets, width, height, project.TILE, tiles_x, bg, thr,
            final_t, last_idx, g_rgb, g_a, g_d, numba.get_num_threads(),
        )  # fmt: skip
        per_g = torch.from_numpy(_kernels.reduce_grads(ids, hit, grads, ctx.n))
        v_bg = None
        if ctx.needs_input_grad[6]:  # the background shows through with weight T_final
            v_bg = torch.from_numpy(
                np.einsum("hwc,hw->c", g_rgb.astype(np.float64), final_t.astype(np.float64))
            ).float()
        return (per_g[:, 0:2], per_g[:, 2:5], per_g[:, 5:8], per_g[:, 8], per_g[:, 9],
                None, v_bg, None, None, None)  # fmt: skip


def rasterize_numba(
    means2d: torch.Tensor,
    conics: torch.Tensor,
    colors: torch.Tensor,
    opacities: torch.Tensor,
    depths: torch.Tensor,
    extents: torch.Tensor,
    width: int,
    height: int,
    background: torch.Tensor,
    bins: tuple | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Composite Gaussians; returns colour [H,W,D], alpha [H,W], accumulated depth [H,W].

    ``colors`` [N,D] with any D (``background`` [D]): the kernels composite three channels
    at a time, so D != 3 runs ceil(D/3) passes (zero-padded); alpha and depth come from the
    first. Inputs are used in float32 on the CPU; outputs come back in ``means2d``'s dtype
    and device. ``bins``: ``bin_tiles`` of this geometry, when the caller has them.
    """
    dtype, device = means2d.dtype, means2d.device
    geo = (_cpu32(means2d), _cpu32(conics))
    rest = (_cpu32(opacities), _cpu32(depths), extents.cpu())
    cols, bg = _cpu32(colors), _cpu32(background)
    d = cols.shape[1]
    pad = (-d) % 3
    if pad:
        cols = torch.cat([cols, cols.new_zeros(cols.shape[0], pad)], dim=1)
        bg = torch.cat([bg, bg.new_zeros(pad)])
    images, alpha, depth = [], None, None
    for k in range(0, d + pad, 3):
        img, a, dep = _RasterizeNumba.apply(
            *geo, cols[:, k : k + 3], *rest, bg[k : k + 3], width, height, bins
        )
        images.append(img)
        if alpha is None:
            alpha, depth = a, dep
    image = torch.cat(images, dim=-1)[..., :d] if len(images) > 1 or pad else images[0]
    return (
        image.to(device=device, dtype=dtype),
        alpha.to(device=device, dtype=dtype),
        depth.to(device=device, dtype=dtype),
    )


def splat_sums_numba(
    means2d: torch.Tensor,
    conics: torch.Tensor,
    opacities: torch.Tensor,
    depths: torch.Tensor,
    extents: torch.Tensor,
    width: int,
    height: int,
    targets: torch.Tensor,
) -> torch.Tensor:
    """[N, C] float32: ``sum_p w_gp targets[p]`` with the compositing weights of the forward
    raster (``_kernels_lanes.raster_sums``; no gradient)."""
    bins = _uncoloured_bins(means2d, conics, opacities, depths, extents, width, height)
    return torch.from_numpy(_gaussian_sums(*bins, width, height, _np32(targets), means2d.shape[0]))


def _uncoloured_bins(means2d, conics, opacities, depths, extents, width: int, height: int):
    """``_bins_and_rows`` for the passes that read weights only (the colours zero)."""
    zeros = np.zeros((means2d.shape[0], 3), np.float32)
    return _bins_and_rows(
        means2d, conics, zeros, opacities, depths, extents, width, height, cull=True
    )


def rasterize_and_weights_numba(
    means2d: torch.Tensor,
    conics: torch.Tensor,
    colors: torch.Tensor,
    opacities: torch.Tensor,
    depths: torch.Tensor,
    extents: torch.Tensor,
    width: int,
    height: int,
    background: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``rasterize_numba``'s three images of three colour channels and each Gaussian's
    compositing weight [N] (``splat_sums_numba`` with targets 1), from one binning, without
    gradients: a preprocessing view at 1M Gaussians bins them once, not twice."""
    n = means2d.shape[0]
    offsets, ids, hit, tiles_x, rows = _bins_and_rows(
        means2d, conics, _np32(colors), opacities, depths, extents, width, height, cull=True
    )
    rgb, alpha, depth, _, _ = _kernels_lanes.raster_forward(
        rows, ids, offsets, width, height, project.TILE, tiles_x, _np32(background),
        raster_thresholds(), numba.get_num_threads(),
    )  # fmt: skip
    ones = np.ones((height, width, 1), np.float32)
    weights = _gaussian_sums(offsets, ids, hit, tiles_x, rows, width, height, ones, n)[:, 0]
    return (torch.from_numpy(rgb), torch.from_numpy(alpha), torch.from_numpy(depth),
            torch.from_numpy(weights))  # fmt: skip


def splat_entries_numba(
    means2d: torch.Tensor,
    conics: torch.Tensor,
    opacities: torch.Tensor,
    depths: torch.Tensor,
    extents: torch.Tensor,
    width: int,
    height: int,
    limit: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The forward raster's non-zero compositing weights as (pixel y * width + x, Gaussian,
    weight) [E] each, each pixel's front to back (``_kernels_lanes.raster_weights``); None
    when there are more than ``limit``."""
    offsets, ids, hit, tiles_x, rows = _uncoloured_bins(
        means2d, conics, opacities, depths, extents, width, height
    )
    pix, m, w, total = _kernels_lanes.raster_weights(
        rows, ids, offsets, width, height, project.TILE, tiles_x, raster_thresholds(),
        numba.get_num_threads(), limit,
    )  # fmt: skip
    if total > limit:
        return None
    return torch.from_numpy(pix), torch.from_numpy(hit[ids[m]]), torch.from_numpy(w)
