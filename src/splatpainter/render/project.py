"""Projection and SH stages in vectorised PyTorch (differentiable through autograd).

These are the reference's per-Gaussian stages (and a public helper, ``sh_to_color``). The
numba path has fused twins with explicit backward passes in ``_kernels_proj``: on two cores
the dozens of small tensor ops and their autograd graph cost ~40 ms for 20k Gaussians, the
fused kernels ~10 ms (benchmarks/render_speed.py prints both).

Conventions (OpenCV, as gsplat): camera looks along +z, pixel ``(i, j)`` (column, row) has its
centre at ``(i + 0.5, j + 0.5)``, a camera-space point projects to ``u = fx x/z + cx``.

The rules (shared by every backend, as gsplat 1.5's ``fully_fused_projection``):

- culled (radius 0): camera-space depth ``z`` outside ``[near_plane, far_plane]``; a 2D
  covariance (after the ``eps2d`` dilation) that is not positive definite or has a standard
  deviation above ``MAX_SIGMA_PX`` pixels (overflow guard: such a splat would be drawn
  differently by float32 and float64 arithmetic and covers any image many times over);
  effective opacity below 1/255 (it can never reach the alpha cut-off); both per-axis radii
  ``<= radius_clip``; a box entirely outside the image.
- per-axis radii: ``ceil(k * sqrt(cov_xx))``, ``ceil(k * sqrt(cov_yy))`` with
  ``k = min(3.33, sqrt(2 ln(255 opacity)))``, the half-extents of the ellipse outside which
  alpha < 1/255 (the rasteriser skips those pixels anyway, so the box loses nothing).
- "antialiased" mode multiplies opacity by ``sqrt(det(cov) / det(cov + eps2d I))``
  (Mip-Splatting's compensation; 0 when the undilated covariance is degenerate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from splatpainter.assets import gaussians
from splatpainter.assets.gaussians import quat_to_rotmat, sh_basis

NEAR_PLANE = 0.2  # INRIA 3DGS culls Gaussians closer than 0.2 (view-space z)
FAR_PLANE = 1e10  # gsplat's default: no far culling in practice
EPS2D = 0.3  # low-pass dilation added to the 2D covariance (pixels^2)
TILE = 16
ALPHA_MAX = 0.99  # compositing: alpha clamp
ALPHA_MIN = 1.0 / 255.0  # compositing: alphas below are skipped
T_MIN = 1e-4  # compositing: a Gaussian that would push transmittance below this stops the pixel
EXTEND_MAX = 3.33  # gsplat's cap on the box half-extent, in standard deviations
MAX_SIGMA_PX = 1e6  # overflow guard: larger 2D standard deviations are culled
MAX_LOG_SCALE = 80.0  # exp() stays finite in float32; far beyond any non-culled Gaussian
RASTERIZE_MODES = ("classic", "antialiased")


@dataclass
class Projected:
    """Per-Gaussian screen-space quantities; culled Gaussians have ``radii == 0``."""

    means2d: torch.Tensor  # [N,2] pixel coordinates
    conics: torch.Tensor  # [N,3] (a, b, c) of the inverse 2D covariance [[a,b],[b,c]]
    depths: torch.Tensor  # [N] camera-space z (1 for culled Gaussians)
    radii: torch.Tensor  # [N] int32, the larger per-axis radius in pixels (0 = culled)
    extents: torch.Tensor | None = None  # [N,2] int32 per-axis radii (x, y); None = square
    compensations: torch.Tensor | None = None  # [N] opacity factor (antialiased mode)


def axis_radii(radii: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rx, ry) from per-axis ``[N,2]`` or square ``[N]`` radii."""
    if radii.dim() == 2:
        return radii[:, 0], radii[:, 1]
    return radii, radii


def tile_rects(means2d: torch.Tensor, radii: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """Tile rectangles [N,4] (x0, y0, x1, y1), half-open, clamped to the tile grid.

    ``radii`` is [N,2] (per axis) or [N] (a square box). As gsplat: floor of the low edge,
    ceil of the high edge, in float32.
    """
    tw = (width + TILE - 1) // TILE
    th = (height + TILE - 1) // TILE
    rx, ry = axis_radii(radii)
    m = means2d.detach().to(torch.float32)
    rx, ry = rx.to(torch.float32), ry.to(torch.float32)
    x0 = torch.floor((m[:, 0] - rx) / TILE).clamp(0, tw)
    x1 = torch.ceil((m[:, 0] + rx) / TILE).clamp(0, tw)
    y0 = torch.floor((m[:, 1] - ry) / TILE).clamp(0, th)
    y1 = torch.ceil((m[:, 1] + ry) / TILE).clamp(0, th)
    return torch.stack([x0, y0, x1, y1], dim=-1).to(torch.int64)


def box_extent(opacities: torch.Tensor | None) -> torch.Tensor | float:
    """Half-extent of the drawn box in standard deviations: where alpha falls below 1/255."""
    if opacities is None:
        return EXTEND_MAX
    ratio = (opacities.detach().double() / ALPHA_MIN).clamp_min(1.0)
    return torch.sqrt(2.0 * torch.log(ratio)).clamp_max(EXTEND_MAX)


def _camera_cov2d(means, quats, log_scales, world_to_cam, K, width, height, near_plane, far_plane):
    """View-space position (placeholders where out of range) and the undilated 2D covariance."""
    dtype = means.dtype
    R = world_to_cam[:3, :3].to(dtype)
    t = world_to_cam[:3, 3].to(dtype)
    K = K.to(dtype)
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    p_cam = means @ R.T + t
    x, y, z = p_cam.unbind(-1)
    with torch.no_grad():
        in_range = (z >= near_plane) & (z <= far_plane)
    z_safe = torch.where(in_range, z, torch.ones_like(z))
    x_safe = torch.where(in_range, x, torch.zeros_like(x))
    y_safe = torch.where(in_range, y, torch.zeros_like(y))

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
    M = rot * torch.exp(log_scales.clamp_max(MAX_LOG_SCALE))[:, None, :]  # R S
    T = J @ (R @ M)  # [N,2,3] = J W R S
    cov = T @ T.transpose(1, 2)  # J W Sigma W^T J^T
    means2d = torch.stack([fx * x_safe * inv_z + cx, fy * y_safe * inv_z + cy], dim=-1)
    a0, b, c0 = cov[:, 0, 0], cov[:, 0, 1], cov[:, 1, 1]
    with torch.no_grad():
        mv = MAX_SIGMA_PX * MAX_SIGMA_PX
        finite = (a0 <= mv) & (c0 <= mv) & (b.abs() <= mv)  # False for nan/inf
    return means2d, z_safe, in_range, finite, a0, b, c0


def overflow_mask(
    means, quats, log_scales, world_to_cam, K, width, height, *, near_plane, far_plane
) -> torch.Tensor:
    """[N] bool: Gaussians in the depth range that the overflow guard culls (no gradient)."""
    with torch.no_grad():
        args = (means.double(), quats.double(), log_scales.double())
        cam = (world_to_cam.double(), K.double(), width, height, near_plane, far_plane)
        _, _, in_range, finite, _, _, _ = _camera_cov2d(*args, *cam)
    return in_range & ~finite


def project_gaussians(
    means: torch.Tensor,
    quats: torch.Tensor,
    log_scales: torch.Tensor,
    world_to_cam: torch.Tensor,
    K: torch.Tensor,
    width: int,
    height: int,
    *,
    opacities: torch.Tensor | None = None,
    near_plane: float = NEAR_PLANE,
    far_plane: float = FAR_PLANE,
    eps2d: float = EPS2D,
    radius_clip: float = 0.0,
    antialiased: bool = False,
) -> Projected:
    """EWA projection: 2D mean, conic, depth, per-axis radii (and compensation) per Gaussian.

    ``opacities`` [N] (sigmoid of the logits) make the boxes opacity-aware; without them the
    boxes are 3.33 sigma. Culled Gaussians get finite placeholder outputs so that gradients
    through them are exactly zero (never ``0 * inf``). Differentiable w.r.t. means, quats,
    log_scales, world_to_cam and K.
    """
    dtype = means.dtype
    means2d, z_safe, in_range, finite, a0, b, c0 = _camera_cov2d(
        means, quats, log_scales, world_to_cam, K, width, height, near_plane, far_plane
    )
    ok0 = in_range & finite
    one = torch.ones_like(a0)
    a0 = torch.where(ok0, a0, one)  # placeholders: no inf/nan reaches the maths below
    c0 = torch.where(ok0, c0, one)
    b = torch.where(ok0, b, torch.zeros_like(b))
    a, c = a0 + eps2d, c0 + eps2d
    det = a * c - b * b
    with torch.no_grad():
        ok = ok0 & (det > 0)
    det_safe = torch.where(ok, det, one)
    conics = torch.stack([c / det_safe, -b / det_safe, a / det_safe], dim=-1)
    comp = None
    if antialiased:
        det0 = a0 * c0 - b * b
        with torch.no_grad():
            pos = ok & (det0 > 0)
        ratio = torch.where(pos, det0, one) / det_safe
        comp = torch.where(pos, torch.sqrt(ratio), torch.zeros_like(ratio))

    with torch.no_grad():
        op = None
        if opacities is not None:
            op = opacities.detach().to(dtype)
            op = op * comp.detach() if comp is not None else op
            ok = ok & (op >= ALPHA_MIN)
        k = box_extent(op)
        k = k.to(dtype) if torch.is_tensor(k) else k
        a_ok = torch.where(ok, a, one)
        c_ok = torch.where(ok, c, one)
        rx = torch.ceil(k * torch.sqrt(a_ok))
        ry = torch.ceil(k * torch.sqrt(c_ok))
        ok = ok & ((rx > radius_clip) | (ry > radius_clip))
        m32 = means2d.detach().to(torch.float32)
        rx32, ry32 = rx.to(torch.float32), ry.to(torch.float32)
        inside = (m32[:, 0] + rx32 > 0) & (m32[:, 0] - rx32 < width)
        inside &= (m32[:, 1] + ry32 > 0) & (m32[:, 1] - ry32 < height)
        ok = ok & inside
        extents = torch.stack([rx, ry], dim=-1)
        extents = torch.where(ok[:, None], extents, torch.zeros_like(extents)).to(torch.int32)
        radii = extents.max(dim=-1).values
    return Projected(
        means2d=means2d,
        conics=conics,
        depths=z_safe,
        radii=radii,
        extents=extents,
        compensations=comp,
    )


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
        rgb = gaussians.SH_C0 * sh[:, 0, :]  # read at call time, like the numba path
    else:
        dirs = means - camera_center(world_to_cam).to(means.dtype)
        dirs = dirs / dirs.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        basis = sh_basis(dirs, degree)
        rgb = (basis[:, :, None] * sh[:, :k, :]).sum(dim=1)
    return torch.clamp_min(rgb + 0.5, 0.0)


def check_options(near_plane, far_plane, eps2d, radius_clip, rasterize_mode) -> str | None:
    """The problem with the projection options, or None (shared by the API and the CLI)."""
    for name, v in (("near_plane", near_plane), ("far_plane", far_plane), ("eps2d", eps2d)):
        bad = isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v)
        if bad or (math.isinf(v) and not (name == "far_plane" and v > 0)):
            return f"{name} must be a finite number (far_plane may be inf), got {v!r}"
    if isinstance(radius_clip, bool) or not isinstance(radius_clip, int | float):
        return f"radius_clip must be a number, got {radius_clip!r}"
    if not 0 < near_plane < far_plane:
        return f"need 0 < near_plane < far_plane, got near={near_plane}, far={far_plane}"
    if eps2d < 0:
        return f"eps2d must be >= 0, got {eps2d}"
    if rasterize_mode not in RASTERIZE_MODES:
        return f"rasterize_mode must be one of {RASTERIZE_MODES}, got {rasterize_mode!r}"
    return None
