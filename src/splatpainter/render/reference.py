"""Slow, obvious pure-PyTorch rasteriser: the ground truth the compiled kernels are tested against.

Per 16x16 tile it takes the Gaussians whose per-axis tile rectangle covers the tile (the same
binning as the fast path), sorts them by (depth, index), evaluates every pixel against every
one of them densely and composites with cumulative products. Autograd does the backward.
Colours may have any number of channels (``background`` matching).
"""

from __future__ import annotations

import torch

from splatpainter.render import project
from splatpainter.render.project import TILE, tile_rects


def rasterize_reference(
    means2d: torch.Tensor,
    conics: torch.Tensor,
    colors: torch.Tensor,
    opacities: torch.Tensor,
    depths: torch.Tensor,
    radii: torch.Tensor,
    width: int,
    height: int,
    background: torch.Tensor,
    alpha_max: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Composite Gaussians; returns colour [H,W,D], alpha [H,W], accumulated depth [H,W].

    ``radii`` is [N,2] (per-axis, as the projection returns) or [N] (square boxes).
    ``alpha_max`` overrides the clamp ``project.ALPHA_MAX`` (only the gsplat parity test
    does, with gsplat's 0.999). The constants are read at call time, like the numba path.
    """
    alpha_max = project.ALPHA_MAX if alpha_max is None else alpha_max
    alpha_min, t_min = project.ALPHA_MIN, project.T_MIN
    dtype, dev = means2d.dtype, means2d.device
    tw = (width + TILE - 1) // TILE
    th = (height + TILE - 1) // TILE
    with torch.no_grad():
        rect = tile_rects(means2d.detach(), radii, width, height)
        visible = (radii > 0) if radii.dim() == 1 else (radii[:, 0] > 0)
        order = torch.argsort(depths.detach(), stable=True)
        order = order[visible[order]]
        rect = rect[order]
    bg = background.to(dtype)
    rows_rgb, rows_alpha, rows_depth = [], [], []
    for ty in range(th):
        y_lo, y_hi = ty * TILE, min((ty + 1) * TILE, height)
        tiles_rgb, tiles_alpha, tiles_depth = [], [], []
        for tx in range(tw):
            x_lo, x_hi = tx * TILE, min((tx + 1) * TILE, width)
            hit = (rect[:, 0] <= tx) & (tx < rect[:, 2]) & (rect[:, 1] <= ty) & (ty < rect[:, 3])
            ids = order[hit]
            ys, xs = torch.meshgrid(
                torch.arange(y_lo, y_hi, dtype=dtype, device=dev) + 0.5,
                torch.arange(x_lo, x_hi, dtype=dtype, device=dev) + 0.5,
                indexing="ij",
            )
            pix = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)  # [P,2]
            d = means2d[ids][None, :, :] - pix[:, None, :]  # [P,G,2]
            con = conics[ids]
            power = -0.5 * (con[:, 0] * d[..., 0] ** 2 + con[:, 2] * d[..., 1] ** 2) - con[:, 1] * (
                d[..., 0] * d[..., 1]
            )
            alpha = torch.clamp_max(opacities[ids] * torch.exp(power), alpha_max)
            alpha = torch.where((power <= 0) & (alpha >= alpha_min), alpha, torch.zeros_like(alpha))
            with torch.no_grad():
                # Early termination: a Gaussian that would push T below t_min is not drawn,
                # and neither is anything behind it.
                keep = torch.cumprod(1 - alpha, dim=1) >= t_min
            alpha = torch.where(keep, alpha, torch.zeros_like(alpha))
            trans = torch.cumprod(1 - alpha, dim=1)
            t_before = torch.cat([torch.ones_like(trans[:, :1]), trans[:, :-1]], dim=1)
            weights = alpha * t_before  # [P,G]
            t_final = (
                trans[:, -1]
                if trans.shape[1]
                else torch.ones(pix.shape[0], dtype=dtype, device=dev)
            )
            rgb = weights @ colors[ids] + t_final[:, None] * bg
            shape = (y_hi - y_lo, x_hi - x_lo)
            tiles_rgb.append(rgb.reshape(*shape, colors.shape[1]))
            tiles_alpha.append((1 - t_final).reshape(shape))
            tiles_depth.append((weights @ depths[ids]).reshape(shape))
        rows_rgb.append(torch.cat(tiles_rgb, dim=1))
        rows_alpha.append(torch.cat(tiles_alpha, dim=1))
        rows_depth.append(torch.cat(tiles_depth, dim=1))
    return torch.cat(rows_rgb, dim=0), torch.cat(rows_alpha, dim=0), torch.cat(rows_depth, dim=0)
