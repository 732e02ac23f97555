"""The compiled CPU path: ``torch.autograd.Function`` wrappers around the numba kernels.

Three functions, composed by autograd like gsplat's stages: projection (means, quats,
log_scales -> 2D means, conics, depths, radii), SH colour (means, sh -> RGB) and the tile
rasteriser (2D quantities -> images). Everything runs in float32 on the CPU.
"""

from __future__ import annotations

import numpy as np
import torch

from splatpainter.render import _kernels, _kernels_proj
from splatpainter.render.project import TILE, Projected, camera_center


def _np32(x: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(x.detach().to(device="cpu", dtype=torch.float32).numpy())


def _np64(x: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(x.detach().to(device="cpu", dtype=torch.float64).numpy())


def _intrinsics(K: torch.Tensor) -> np.ndarray:
    k = _np64(K)
    return np.array([k[0, 0], k[1, 1], k[0, 2], k[1, 2]], dtype=np.float64)


class _ProjectNumba(torch.autograd.Function):
    @staticmethod
    def forward(ctx, means, quats, log_scales, world_to_cam, K, width, height):
        arrays = (_np32(means), _np32(quats), _np32(log_scales))
        cam = (_np64(world_to_cam), _intrinsics(K), width, height)
        means2d, conics, depths, radii = _kernels_proj.project_forward(*arrays, *cam)
        ctx.save_for_backward(means, quats, log_scales)  # version-checked by autograd
        ctx.saved = (cam, radii)
        radii_t = torch.from_numpy(radii)
        ctx.mark_non_differentiable(radii_t)
        return (
            torch.from_numpy(means2d),
            torch.from_numpy(conics),
            torch.from_numpy(depths),
            radii_t,
        )

    @staticmethod
    def backward(ctx, v_means2d, v_conics, v_depths, _v_radii):
        cam, radii = ctx.saved
        arrays = tuple(_np32(t) for t in ctx.saved_tensors)
        n = radii.shape[0]
        v2 = _np32(v_means2d) if v_means2d is not None else np.zeros((n, 2), np.float32)
        vc = _np32(v_conics) if v_conics is not None else np.zeros((n, 3), np.float32)
        vd = _np32(v_depths) if v_depths is not None else np.zeros(n, np.float32)
        v_means, v_quats, v_logs = _kernels_proj.project_backward(*arrays, *cam, radii, v2, vc, vd)
        return (torch.from_numpy(v_means), torch.from_numpy(v_quats), torch.from_numpy(v_logs),
                None, None, None, None)  # fmt: skip


class _ShNumba(torch.autograd.Function):
    @staticmethod
    def forward(ctx, means, sh, world_to_cam, degree):
        campos = _np64(camera_center(world_to_cam.double()))
        ctx.save_for_backward(means, sh)
        ctx.saved = (campos, degree)
        return torch.from_numpy(_kernels_proj.sh_forward(_np32(means), _np32(sh), campos, degree))

    @staticmethod
    def backward(ctx, v_colors):
        means, sh = (_np32(t) for t in ctx.saved_tensors)
        campos, degree = ctx.saved
        v_sh, v_means = _kernels_proj.sh_backward(means, sh, campos, degree, _np32(v_colors))
        return torch.from_numpy(v_means), torch.from_numpy(v_sh), None, None


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
) -> Projected:
    """Compiled twin of ``project.project_gaussians`` (float32 CPU outputs)."""
    means2d, conics, depths, radii = _ProjectNumba.apply(
        _cpu32(means), _cpu32(quats), _cpu32(log_scales), world_to_cam, K, width, height
    )
    return Projected(means2d=means2d, conics=conics, depths=depths, radii=radii)


def sh_to_color_numba(
    means: torch.Tensor, sh: torch.Tensor, world_to_cam: torch.Tensor, degree: int
) -> torch.Tensor:
    """Compiled twin of ``project.sh_to_color`` (float32 CPU output)."""
    return _ShNumba.apply(_cpu32(means), _cpu32(sh), world_to_cam, degree)


def bin_tiles(
    means2d: torch.Tensor, radii: torch.Tensor, depths: torch.Tensor, width: int, height: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Tile offsets [T+1] and flat Gaussian ids, each tile's list sorted by (depth, index)."""
    tiles_x = (width + TILE - 1) // TILE
    tiles_y = (height + TILE - 1) // TILE
    r = np.ascontiguousarray(radii.detach().cpu().numpy().astype(np.int32, copy=False))
    depth_bits = _np32(depths).view(np.uint32)
    offsets, ids = _kernels.bin_gaussians(_np32(means2d), r, depth_bits, tiles_x, tiles_y)
    return offsets, ids, tiles_x


class _RasterizeNumba(torch.autograd.Function):
    @staticmethod
    def forward(ctx, means2d, conics, colors, opacities, depths, radii, background, width, height):
        offsets, ids, tiles_x = bin_tiles(means2d, radii, depths, width, height)
        packed = _kernels.pack_rows(
            ids, _np32(means2d), _np32(conics), _np32(colors), _np32(opacities), _np32(depths)
        )
        bg = _np32(background)
        rgb, alpha, depth, final_t, last_idx = _kernels.raster_forward(
            packed, offsets, width, height, tiles_x, bg
        )
        ctx.saved = (packed, offsets, ids, tiles_x, bg, final_t, last_idx, width, height)
        ctx.n = means2d.shape[0]
        return torch.from_numpy(rgb), torch.from_numpy(alpha), torch.from_numpy(depth)

    @staticmethod
    def backward(ctx, grad_rgb, grad_alpha, grad_depth):
        packed, offsets, ids, tiles_x, bg, final_t, last_idx, width, height = ctx.saved
        hw = (height, width)
        g_rgb = _np32(grad_rgb) if grad_rgb is not None else np.zeros((*hw, 3), np.float32)
        g_a = _np32(grad_alpha) if grad_alpha is not None else np.zeros(hw, np.float32)
        g_d = _np32(grad_depth) if grad_depth is not None else np.zeros(hw, np.float32)
        rows = _kernels.raster_backward(
            packed, offsets, width, height, tiles_x, bg, final_t, last_idx, g_rgb, g_a, g_d
        )
        per_g = torch.from_numpy(_kernels.reduce_grads(ids, rows, ctx.n))
        return (
            per_g[:, 0:2],
            per_g[:, 2:5],
            per_g[:, 5:8],
            per_g[:, 8],
            per_g[:, 9],
            None,
            None,
            None,
            None,
        )


def rasterize_numba(
    means2d: torch.Tensor,
    conics: torch.Tensor,
    colors: torch.Tensor,
    opacities: torch.Tensor,
    depths: torch.Tensor,
    radii: torch.Tensor,
    width: int,
    height: int,
    background: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Composite Gaussians; returns rgb [H,W,3], alpha [H,W], unnormalised depth sum [H,W].

    Inputs are used in float32 on the CPU; outputs come back in ``means2d``'s dtype and device.
    """
    dtype, device = means2d.dtype, means2d.device

    rgb, alpha, depth = _RasterizeNumba.apply(
        _cpu32(means2d),
        _cpu32(conics),
        _cpu32(colors),
        _cpu32(opacities),
        _cpu32(depths),
        radii.cpu(),
        _cpu32(background),
        width,
        height,
    )
    return (
        rgb.to(device=device, dtype=dtype),
        alpha.to(device=device, dtype=dtype),
        depth.to(device=device, dtype=dtype),
    )
