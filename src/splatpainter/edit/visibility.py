"""How much of each Gaussian an edit view really sees: its seen share and its depth behind the
visible surface, from the renderer's compositing weights plus the Gaussian's own alpha footprint.

The renderer composites w_gp = T_gp alpha_gp (transmittance in front of g at pixel p times g's
own alpha there), and the colour gradient reads sum_p m_p w_gp off a render.  That sum alone
cannot tell a faint Gaussian in plain sight (small alpha, T = 1) from an opaque one behind a
surface (alpha ~ 1, T ~ 0.01): both carry little weight.  The missing half is the footprint
sum_p m_p alpha_gp that the Gaussian would have if nothing were in front of it, a function of
the projection alone (`alpha_footprint`).  Their ratio, `Visibility.seen`, is the alpha-weighted
mean transmittance in front of the Gaussian over its pixels: the fraction of it that is seen.

A low seen share has two causes that matter differently: the Gaussian sits under overlapping
neighbours of the *same* surface (dense splats cover one another; it still belongs to what the
view shows), or it lies *behind* the visible surface (the back of an object).  The depth gap
tells them apart: the weight-averaged difference between the Gaussian's depth and the rendered
expected depth of its pixels (the surface the view shows there).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from splatpainter.render.project import ALPHA_MAX, ALPHA_MIN, TILE, project_gaussians, tile_rects

CHUNK_PAIRS = 1 << 21  # (Gaussian, pixel) pairs evaluated at once: ~50 MB of temporaries


@torch.no_grad()
def alpha_footprint(
    asset,
    camera,
    pixel_weights: torch.Tensor,
    subset: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-Gaussian sum_p m_p alpha_gp [N] (float64), ignoring occlusion by other Gaussians.

    Alpha is evaluated as the rasteriser does it: pixel centres at +0.5, alpha = min(0.99,
    opacity exp(power)), skipped where power > 0 or alpha < 1/255, only inside the Gaussian's
    3-sigma tile rectangle; vectorised over the (Gaussian, pixel) pairs of each Gaussian's
    alpha >= 1/255 box, in bounded chunks.  pixel_weights m [H, W] (e.g. an edit mask); subset
    [N] bool restricts the work to those Gaussians (the others get 0), culled ones get 0.
    """
    h, w = int(camera.height), int(camera.width)
    m = pixel_weights.detach().to(device="cpu", dtype=torch.float64)
    if tuple(m.shape) != (h, w):
        raise ValueError(f"pixel_weights must be [{h}, {w}] (H, W), got {tuple(m.shape)}")
    n = asset.num_gaussians
    out = torch.zeros(n, dtype=torch.float64)
    nz = m.nonzero()
    if n == 0 or nz.numel() == 0:
        return out.to(asset.means.device)
    my0, mx0 = (int(v) for v in nz.min(0).values)
    my1, mx1 = (int(v) + 1 for v in nz.max(0).values)

    def cpu32(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to("cpu", torch.float32)

    w2c = cpu32(camera.world_to_cam)
    proj = project_gaussians(
        cpu32(asset.means), cpu32(asset.quats), cpu32(asset.log_scales), w2c,
        cpu32(camera.K()), w, h,
    )  # fmt: skip
    op = torch.sigmoid(cpu32(asset.opacity_logits))
    con = proj.conics
    a, b, c = con[:, 0].double(), con[:, 1].double(), con[:, 2].double()
    det = a * c - b * b
    level = 2.0 * torch.log((255.0 * op.double()).clamp_min(1e-30))  # alpha >= 1/255 ellipse
    keep = (proj.radii > 0) & (level > 0) & (det > 0)
    if subset is not None:
        keep &= subset.detach().to("cpu", torch.bool)
    ids = keep.nonzero().squeeze(1)
    if ids.numel() == 0:
        return out.to(asset.means.device)
    # Pixel box: the (slightly enlarged) alpha >= 1/255 ellipse, the tile rectangle the
    # rasteriser bins the Gaussian into, and the box of weighted pixels.  Every pixel in it is
    # still tested exactly, so the margins change no result.
    mx, my = proj.means2d[ids, 0].double(), proj.means2d[ids, 1].double()
    ex = torch.sqrt(level[ids] * c[ids] / det[ids]) * 1.001 + 0.01
    ey = torch.sqrt(level[ids] * a[ids] / det[ids]) * 1.001 + 0.01
    rect = tile_rects(proj.means2d[ids], proj.radii[ids], w, h)
    x0 = torch.maximum(torch.ceil(mx - ex - 0.5).long(), rect[:, 0] * TILE).clamp_min(mx0)
    x1 = torch.minimum(torch.floor(mx + ex - 0.5).long() + 1, rect[:, 2] * TILE).clamp_max(mx1)
    y0 = torch.maximum(torch.ceil(my - ey - 0.5).long(), rect[:, 1] * TILE).clamp_min(my0)
    y1 = torch.minimum(torch.floor(my + ey - 0.5).long() + 1, rect[:, 3] * TILE).clamp_max(my1)
    nx, ny = (x1 - x0).clamp_min(0), (y1 - y0).clamp_min(0)
    count = nx * ny
    live = count > 0
    ids, x0, y0, nx, count = ids[live], x0[live], y0[live], nx[live], count[live]
    flat_m = m.reshape(-1)
    ends = torch.cumsum(count, 0)
    start = 0
    while start < ids.numel():
        # The longest run of Gaussians whose pairs fit one chunk (at least one Gaussian).
        base = int(ends[start - 1]) if start > 0 else 0
        stop = max(int(torch.searchsorted(ends, base + CHUNK_PAIRS, right=True)), start + 1)
        cnt = count[start:stop]
        local = torch.repeat_interleave(torch.arange(stop - start), cnt)
        offs = torch.arange(int(cnt.sum())) - torch.repeat_interleave(
            torch.cumsum(cnt, 0) - cnt, cnt
        )
        row_len = nx[start:stop][local]
        px = x0[start:stop][local] + offs % row_len
        py = y0[start:stop][local] + offs // row_len
        g = ids[start:stop][local]
        # The rasteriser's float32 arithmetic.
        dx = proj.means2d[g, 0] - (px.float() + 0.5)
        dy = proj.means2d[g, 1] - (py.float() + 0.5)
        power = -0.5 * (con[g, 0] * dx * dx + con[g, 2] * dy * dy) - con[g, 1] * dx * dy
        alpha = torch.clamp_max(op[g] * torch.exp(power), ALPHA_MAX)
        ok = (power <= 0) & (alpha >= ALPHA_MIN)
        contrib = torch.where(ok, alpha.double(), torch.zeros((), dtype=torch.float64))
        out.index_add_(0, g, contrib * flat_m[py * w + px])
        start = stop
    return out.to(asset.means.device)


@dataclass
class Visibility:
    """Per-Gaussian sums over the (masked) pixels of one or more views, all [N] float64."""

    weight: torch.Tensor  # sum m w_gp: compositing weight (pixels)
    footprint: torch.Tensor  # sum m alpha_gp: own alpha, as if nothing were in front
    gap_weight: torch.Tensor  # sum m w_gp (z_g - depth_p): weight x depth behind the surface

    @property
    def seen(self) -> torch.Tensor:
        """weight / footprint in [0, 1]: the alpha-weighted mean transmittance (0 if unseen)."""
        f = self.footprint
        safe = torch.where(f > 0, f, torch.ones_like(f))
        return torch.where(f > 0, self.weight / safe, torch.zeros_like(f)).clamp(0.0, 1.0)

    @property
    def depth_gap(self) -> torch.Tensor:
        """Weight-averaged depth of the Gaussian behind its pixels' rendered surface (0 if unseen).

        Near 0 (within the Gaussian's own extent) for Gaussians of the visible surface; about
        the object's thickness for ones behind it.
        """
        w = self.weight
        safe = torch.where(w > 0, w, torch.ones_like(w))
        return torch.where(w > 0, self.gap_weight / safe, torch.zeros_like(w))


def visibility(
    asset,
    views: Sequence[tuple[object, torch.Tensor]],
    subset: torch.Tensor | None = None,
) -> Visibility:
    """`Visibility` summed over (camera, pixel_weights [H, W]) pairs.

    One colour-override render and backward pass per view gives sum m w and sum m w depth_p
    (the renderer's own weights and expected depth); `alpha_footprint` adds sum m alpha.
    subset [N] bool limits the footprint work to those Gaussians (the others get footprint 0,
    hence seen 0).
    """
    from splatpainter.render import render

    a = asset.detach()
    n = a.num_gaussians
    zeros = torch.zeros(n, dtype=torch.float64, device=a.means.device)
    weight, footprint, gap = zeros.clone(), zeros.clone(), zeros.clone()
    for camera, pixel_weights in views:
        cam = camera.to(a.device)
        colors = a.means.new_zeros(n, 3).requires_grad_(True)
        with torch.enable_grad():
            out = render(a, cam, colors=colors)
            m = pixel_weights.to(out.alpha)
            t = torch.stack([m, m * out.depth.detach(), torch.zeros_like(m)], dim=-1)
            (grad,) = torch.autograd.grad((out.rgb * t).sum(), colors)
        w2c = cam.world_to_cam.to(a.means)
        z = a.means @ w2c[2, :3] + w2c[2, 3]  # camera-space depth, as the renderer's
        wm = grad[:, 0].double()
        weight += wm
        gap += wm * z.double() - grad[:, 1].double()
        footprint += alpha_footprint(a, cam, m, subset)
    return Visibility(weight=weight, footprint=footprint, gap_weight=gap)
