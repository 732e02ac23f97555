"""The least-squares colour change of the Gaussians an edit touches, from the edit views alone.

Back-projection gives each Gaussian the weighted mean residual of its in-mask pixels.  A Gaussian
that straddles the mask's edge then takes the full new colour and bleeds it onto the pixels
around the stroke, and overlapping Gaussians each take the whole residual, so the edited view is
not reproduced.  With geometry fixed, a render is linear in the per-Gaussian colours:
rgb_p = sum_g w_gp c_g + T_p bg, i.e. rgb = A c + T bg.  So the change that reproduces the edit
is a linear least-squares problem over the touched Gaussians S (those with in-mask weight):

    min_{d, supp(d) in S}  sum_v |A_v d - m_v (edited_v - render_v)|^2 + d^T (lam D + mu) d,

where pixels outside the mask ask to stay as they are, and each colour stays in [0, 1].  The
prior mu (in pixels) keeps Gaussians that carry almost no weight in the views where they are:
without it, a Gaussian behind the painted surface with 0.01 px of weight would take whatever
colour fits that 0.01 px, and show it from the back.  It is
solved with projected, accelerated (FISTA) gradient steps preconditioned by
D = diag(A^T A 1_S), the SIRT scaling: for a non-negative A it bounds A^T A, so a unit step is
always stable.  One step costs one render and its colour backward per view, and only of the
window of pixels the touched Gaussians reach (a cropped camera), so a small stroke is cheap.
The first step is the weighted mean residual scaled by the Gaussian's share of its pixels; later
ones correct overlaps and edges.
"""

from __future__ import annotations

import torch

SOLVE_ITERS = 12  # projected FISTA steps (each: one render + colour backward per edit view)
SOLVE_DAMPING = 1e-2  # lam, relative to the SIRT scaling D


def _render_linear(asset, camera, colors: torch.Tensor) -> torch.Tensor:
    """A c: the render of per-Gaussian colours c [N, 3] on a black background."""
    from splatpainter.render import render

    return render(asset, camera, colors=colors).rgb


def solve_color_delta(
    asset,
    cameras: list,
    targets: list[torch.Tensor],
    touched: torch.Tensor,
    colors: torch.Tensor,
    *,
    contributing: list[torch.Tensor] | None = None,
    iters: int = SOLVE_ITERS,
    damping: float = SOLVE_DAMPING,
    prior_px: float = 0.0,
) -> torch.Tensor:
    """Per-Gaussian colour delta [N, 3] (zero outside `touched` [N] bool).

    targets[v] [H, W, 3]: the wanted change of view v's render (m (edited - render)); colors
    [N, 3]: the current base colours, so that colours + delta stays in [0, 1];
    contributing[v] [N] bool (optional): the Gaussians with any compositing weight in view v.
    The others change no pixel of it, so its renders leave them out.  prior_px: mu, in pixels
    of a 128x128 view (scaled with the views' area).
    """
    a = asset.detach()
    n = a.num_gaussians
    delta = colors.new_zeros(n, 3)
    if iters <= 0 or not bool(touched.any()):
        return delta
    sel = touched[:, None].to(colors.dtype)
    lo, hi = (-colors).clamp(max=0.0) * sel, (1.0 - colors).clamp(min=0.0) * sel

    def gram(asset_v, cam, idx, x: torch.Tensor, t: torch.Tensor | None):
        """(A_v x, A_v^T (A_v x - t)) for the Gaussians idx of view v (t=None: t = 0)."""
        xv = x[idx].detach().requires_grad_(True)
        with torch.enable_grad():
            out = _render_linear(asset_v, cam, xv)
            err = out if t is None else out - t
            (gv,) = torch.autograd.grad(0.5 * (err**2).sum(), xv)
        return out.detach(), torch.zeros_like(x).index_add_(0, idx, gv)

    with torch.no_grad():
        # D = A^T A 1_S (per Gaussian; the same for every channel): A^T (A 1_S - 0).  A 1_S also
        # shows the window of pixels the touched Gaussians reach: the rest stay out.
        ones = sel.expand(n, 3).contiguous()
        diag = torch.zeros_like(ones)
        views = []
        for v, (cam, tgt) in enumerate(zip(cameras, targets, strict=True)):
            keep = touched if contributing is None else contributing[v] | touched
            idx = keep.nonzero().squeeze(1)
            asset_v = a.subset(idx)
            cam = cam.to(a.device)
            reach, g = gram(asset_v, cam, idx, ones, None)
            diag += g
            pix = (reach > 0).any(-1).nonzero()
            if pix.numel() == 0:
                continue
            (y0, x0), (y1, x1) = pix.min(0).values.tolist(), pix.max(0).values.tolist()
            window = cam.cropped(x0, y0, x1 - x0 + 1, y1 - y0 + 1)
            views.append((asset_v, window, idx, tgt.to(colors)[y0 : y1 + 1, x0 : x1 + 1]))
        diag = diag.mean(-1, keepdim=True)
        area = sum(int(c.width) * int(c.height) for c in cameras) / len(cameras)
        mu = prior_px * area / (128 * 128)
        ok = touched[:, None] & (diag > 1e-12)
        inv = torch.where(ok, 1.0 / ((1.0 + damping) * diag.clamp_min(1e-12) + mu), 0.0)
        x = delta
        y = delta
        t = 1.0
        for _ in range(iters):
            g = (damping * diag + mu) * y
            for asset_v, window, idx, tgt in views:
                g += gram(asset_v, window, idx, y, tgt)[1]
            x_new = torch.minimum(torch.maximum(y - inv * g, lo), hi)
            t_new = 0.5 * (1.0 + (1.0 + 4.0 * t * t) ** 0.5)
            y = x_new + ((t - 1.0) / t_new) * (x_new - x)
            x, t = x_new, t_new
        return torch.where(ok, x, 0.0)
