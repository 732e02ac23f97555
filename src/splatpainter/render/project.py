"""Projection and SH stages in vectorised PyTorch (differentiable through autograd).

These are the reference's per-Gaussian stages (and a public helper, ``sh_to_color``). The
numba path has fused twins with explicit backward passes in ``_kernels_proj``: on two cores
the dozens of small tensor ops and their autograd graph cost ~40 ms for 20k Gaussians, the
fused kernels ~10 ms (benchmarks/render_speed.py prints both).

Conventions (OpenCV, as gsplat): camera looks along +z, pixel ``(i, j)`` (column, row) has its
centre at ``(i + 0.5, j + 0.5)``, a camera-space point projects to ``u = fx x/z + cx``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from splatpainter.assets.gaussians import SH_C0, quat_to_rotmat, sh_basis

NEAR_PLANE = 0.01
EPS2D = 0.3  # low-pass dilation added to the 2D covariance (pixels^2)
TILE = 16


@dataclass
class Projected:
    """Per-Gaussian screen-space quantities; culled Gaussians have ``radii == 0``."""

    means2d: torch.Tensor  # [N,2] pixel coordinates
    conics: torch.Tensor  # [N,3] (a, b, c) of the inverse 2D covariance [[a,b],[b,c]]
    depths: torch.Tensor  # [N] camera-space z
    radii: torch.Tensor  # [N] int32, 3-sigma radius in pixels (0 = culled)


def tile_rects(means2d: torch.Tensor, radii: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """Tile rectangles [N,4] (x0, y0, x1, y1), half-open, clamped to the tile grid."""
    tw = (width + TILE - 1) // TILE
    th = (height + TILE - 1) // TILE
    r = radii.to(means2d.dtype)
    x0 = torch.floor((means2d[:, 0] - r) / TILE).clamp(0, tw)
    x1 = torch.floor((means2d[:, 0] + r + TILE - 1) / TILE).clamp(0, tw)
    y0 = torch.floor((means2d[:, 1] - r) / TILE).clamp(0, th)
    y1 = torch.floor((means2d[:, 1] + r + TILE - 1) / TILE).clamp(0, th)
    return torch.stack([x0, y0, x1, y1], dim=-1).to(torch.int64)


def project_gaussians(
    means: torch.Tensor,
    quats: torch.Tensor,
    log_scales: torch.Tensor,
    world_to_cam: torch.Tensor,
    K: torch.Tensor,
    width: int,
    height: int,
) -> Projected:
    """EWA projection: 2D mean, conic, depth and 3-sigma radius per Gaussian.

    Gaussians with the mean closer than the near plane, a degenerate 2D covariance or a
    3-sigma box that touches no tile get ``radius 0``; their outputs are finite placeholders
    so that gradients through them are exactly zero (never ``0 * inf``).
    """
    dtype = means.dtype
    R = world_to_cam[:3, :3].to(dtype)
    t = world_to_cam[:3, 3].to(dtype)
    K = K.to(dtype)
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    p_cam = means @ R.T + t
    x, y, z = p_cam.unbind(-1)
    with torch.no_grad():
        in_front = z >= NEAR_PLANE
    z_safe = torch.where(in_front, z, torch.ones_like(z))
    x_safe = torch.where(in_front, x, torch.zeros_like(x))
    y_safe = torch.where(in_front, y, torch.zeros_like(y))

    # Jacobian of the perspective map, with x/z, y/z clamped to 1.3x the field of view (as
    # 3DGS/gsplat) so that Gaussians far outside the frustum do not blow up.
    tan_x = 0.5 * width / fx
    tan_y = 0.5 * height / fy
    lim_x_pos = (width - cx) / fx + 0.3 * tan_x
    lim_x_neg = cx / fx + 0.3 * tan_x
    lim_y_pos = (height - cy) / fy + 0.3 * tan_y
    lim_y_neg = cy / fy + 0.3 * tan_y
    inv_z = 1.0 / z_safe
    tx = z_safe * torch.minimum(torch.maximum(x_safe * inv_z, -lim_x_neg), lim_x_pos)
    ty = z_safe * torch.minimum(torch.maximum(y_safe * inv_z, -lim_y_neg), lim_y_pos)
    zeros = torch.zeros_like(z_safe)
    J = torch.stack(
        [fx * inv_z, zeros, -fx * tx * inv_z * inv_z, zeros, fy * inv_z, -fy * ty * inv_z * inv_z],
        dim=-1,
    ).reshape(-1, 2, 3)

    rot = quat_to_rotmat(quats)
    M = rot * torch.exp(log_scales)[:, None, :]  # R S
    T = J @ (R @ M)  # [N,2,3] = J W R S
    cov = T @ T.transpose(1, 2)  # J W Sigma W^T J^T
    a = cov[:, 0, 0] + EPS2D
    b = cov[:, 0, 1]
    c = cov[:, 1, 1] + EPS2D
    det = a * c - b * b
    with torch.no_grad():
        ok = in_front & (det > 0)
    det_safe = torch.where(ok, det, torch.ones_like(det))
    conics = torch.stack([c / det_safe, -b / det_safe, a / det_safe], dim=-1)
    means2d = torch.stack([fx * x_safe * inv_z + cx, fy * y_safe * inv_z + cy], dim=-1)

    with torch.no_grad():
        mid = 0.5 * (a + c)
        lam = mid + torch.sqrt(torch.clamp(mid * mid - det, min=0.1))
        radii = torch.ceil(3.0 * torch.sqrt(lam))
        radii = torch.where(ok, radii, torch.zeros_like(radii)).to(torch.int32)
        rect = tile_rects(means2d.detach(), radii, width, height)
        empty = (rect[:, 2] <= rect[:, 0]) | (rect[:, 3] <= rect[:, 1])
        radii = torch.where(empty, torch.zeros_like(radii), radii)
    return Projected(means2d=means2d, conics=conics, depths=z_safe, radii=radii)


def camera_center(world_to_cam: torch.Tensor) -> torch.Tensor:
    """World-space camera centre ``-R^T t``."""
    R = world_to_cam[:3, :3]
    return -(R.T @ world_to_cam[:3, 3])


def sh_to_color(
    means: torch.Tensor, sh: torch.Tensor, world_to_cam: torch.Tensor, degree: int
) -> torch.Tensor:
    """View-dependent RGB [N,3]: SH of the direction camera -> mean, + 0.5, clamped at 0."""
    k = (degree + 1) ** 2
    if degree == 0:
        rgb = SH_C0 * sh[:, 0, :]
    else:
        dirs = means - camera_center(world_to_cam).to(means.dtype)
        dirs = dirs / dirs.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        basis = sh_basis(dirs, degree)
        rgb = (basis[:, :, None] * sh[:, :k, :]).sum(dim=1)
    return torch.clamp_min(rgb + 0.5, 0.0)
