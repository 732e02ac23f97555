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

from splatpainter.edit.views import pixel_box
from splatpainter.model.hypotheses import ridge_solve
from splatpainter.model.stage2 import COLOR_MAPS

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
    window_only: bool = True,
) -> torch.Tensor:
    """Per-Gaussian colour delta [N, 3] (zero outside `touched` [N] bool).

    targets[v] [H, W, 3]: the wanted change of view v's render (m (edited - render)); colors
    [N, 3]: the current base colours, so that colours + delta stays in [0, 1];
    contributing[v] [N] bool (optional): the Gaussians with any compositing weight in view v.
    The others change no pixel of it, so its renders leave them out.  prior_px: mu, in pixels
    of a 128x128 view (scaled with the views' area).  window_only: the steps render only the
    Gaussians with weight in the window (the same numbers; False renders all of a view's
    contributing Gaussians, the way to check that).
    """
    from splatpainter.render import ColorRender

    a = asset.detach()
    n = a.num_gaussians
    delta = colors.new_zeros(n, 3)
    if iters <= 0 or not bool(touched.any()):
        return delta
    sel = touched[:, None].to(colors.dtype)
    # The steps run on the touched Gaussians alone (T rows, not N): every other one stays 0.
    rows = touched.nonzero().squeeze(1)
    slot = torch.full((n,), -1, dtype=torch.int64, device=touched.device)
    slot[rows] = torch.arange(rows.numel(), device=touched.device)
    lo, hi = (-colors[rows]).clamp(max=0.0), (1.0 - colors[rows]).clamp(min=0.0)

    def gram(render_v, seen: torch.Tensor, at: torch.Tensor, x, t):
        """A_v^T (A_v x - t) at the touched Gaussians, for x [T, 3] on them.  render_v: A_v,
        a `ColorRender` (the view's geometry projected and binned once) of Gaussians of which
        `seen` [n_v] bool are touched ones, at rows `at` of x."""
        xv = x.new_zeros(seen.numel(), 3)
        xv[seen] = x[at]
        xv.requires_grad_(True)
        with torch.enable_grad():
            err = render_v(xv) - t
            (gv,) = torch.autograd.grad(0.5 * (err**2).sum(), xv)
        return torch.zeros_like(x).index_add_(0, at, gv[seen])

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
            g, box, inside = _reach_pass(asset_v, cam, ones[idx])
            diag.index_add_(0, idx, g)
            if box is None:
                continue
            (y0, x0), (y1, x1) = box
            window = cam.cropped(x0, y0, x1 - x0 + 1, y1 - y0 + 1)
            # Only the Gaussians with compositing weight in the window change a pixel of it (the
            # others are skipped there, or come after a pixel is opaque), so the steps render
            # those alone: at capture scale a stroke's window holds a small part of the view.
            # The touched ones stay whatever their weight: leaving out one with a non-zero
            # colour changed the render in the last bits (two views), leaving out the others
            # never did (tests/splatpainter/test_sp_restricted.py checks it bit for bit).
            near = (inside > 0) | touched[idx] if window_only else inside >= 0
            near = near.nonzero().squeeze(1)
            at = slot[idx[near]]
            seen = at >= 0
            views.append(
                (
                    ColorRender(asset_v.subset(near), window),
                    seen,
                    at[seen],
                    tgt.to(colors)[y0 : y1 + 1, x0 : x1 + 1],
                )
            )
        diag = diag[rows].mean(-1, keepdim=True)
        area = sum(int(c.width) * int(c.height) for c in cameras) / len(cameras)
        mu = prior_px * area / (128 * 128)
        ok = diag > 1e-12
        inv = torch.where(ok, 1.0 / ((1.0 + damping) * diag.clamp_min(1e-12) + mu), 0.0)
        x = colors.new_zeros(rows.numel(), 3)
        y = x
        t = 1.0
        for _ in range(iters):
            g = (damping * diag + mu) * y
            for render_v, seen, at, tgt in views:
                g += gram(render_v, seen, at, y, tgt)
            x_new = torch.minimum(torch.maximum(y - inv * g, lo), hi)
            t_new = 0.5 * (1.0 + (1.0 + 4.0 * t * t) ** 0.5)
            y = x_new + ((t - 1.0) / t_new) * (x_new - x)
            x, t = x_new, t_new
        delta[rows] = torch.where(ok, x, 0.0)
        return delta


def _reach_pass(asset_v, camera, ones: torch.Tensor):
    """One render of (1_S, 1_S, 1) and its colour backward: (A^T A 1_S [n, 3] (the same in
    every channel), the box ((y0, x0), (y1, x1)) of the pixels A 1_S reaches (None: none), and
    each Gaussian's compositing weight inside that box [n]).  A render's channels are
    independent (and the kernels composite three at a time), so channel 0 is what a render of
    1_S gives, and the third channel comes at no extra pass.  The pass renders only the box
    the Gaussians of S are drawn in (`footprint_box`): outside it A 1_S is zero, and at
    capture scale a stroke's box is a small part of the view."""
    from splatpainter.render import footprint_box

    zeros = ones.new_zeros(ones.shape[0])
    fbox = footprint_box(asset_v.subset(ones[:, 0] > 0), camera)
    if fbox is None:
        return ones.new_zeros(ones.shape), None, zeros
    fx0, fy0, fx1, fy1 = fbox
    crop = camera.cropped(fx0, fy0, fx1 - fx0 + 1, fy1 - fy0 + 1)
    x = torch.stack([ones[:, 0], ones[:, 0], torch.ones_like(ones[:, 0])], -1)
    x.requires_grad_(True)
    with torch.enable_grad():
        out = _render_linear(asset_v, crop, x)
        reached = pixel_box(out[..., 0].detach())
        box = None
        inside = torch.zeros_like(out[..., 2].detach())
        if reached is not None:
            x0, y0, x1, y1 = reached
            inside[y0 : y1 + 1, x0 : x1 + 1] = 1.0
            box = ((y0 + fy0, x0 + fx0), (y1 + fy0, x1 + fx0))
        loss = 0.5 * (out[..., 0] ** 2).sum() + (out[..., 2] * inside).sum()
        (g,) = torch.autograd.grad(loss, x)
    return g[:, :1].expand(-1, 3), box, g[:, 2]


# An 8-bit edit clips at the top of the colour box: pixels there say only "at least this bright".
CLIP_LEVEL = 254.5 / 255.0
# A pixel takes part in the recolour fit if its change exceeds this (the eval's "changed" test).
CHANGED_LEVEL = 2.0 / 255.0
SHADING_ITERS = 3  # refits of the lit set (each: one 9-channel render per view)
ROBUST_ITERS = 4  # reweighting rounds per lit set (no renders)
ROBUST_SCALE = 4.0 / 255.0  # a pixel this far off counts half


def _normal_solve(xtx: torch.Tensor, xty: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """argmin |X b - y|^2 + eps |b - prior|^2 from X^T X, X^T y (eps keeps it well posed)."""
    return ridge_solve(xtx, xty, prior, 1e-6 * (float(xtx.diagonal().sum()) + 1e-12))


def fit_color_maps(
    asset,
    cameras: list,
    edited: list[torch.Tensor],
    renders: list[torch.Tensor],
    masks: list[torch.Tensor],
    colors: torch.Tensor,
    normals: torch.Tensor | None,
    contributing: list[torch.Tensor] | None = None,
    shading_init: torch.Tensor | None = None,
    maps: tuple[str, ...] = COLOR_MAPS,
) -> tuple[torch.Tensor | None, tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]:
    """The affine recolour [4, 3] and the shading (ambient, diffuse, light dir) that best
    reproduce the edit views' pixels, fitted in image space.

    Both maps act on base colours, and a render is linear in them (rgb = A c + T bg), so their
    pixel changes are linear in the maps' parameters: an affine map M, b changes channel k by
    sum_j M_jk A c_j + b_k A 1 - A c_k, and a shading c -> c (a + max(0, n.v)) with a fixed lit
    set L = {n.v > 0} by (a - 1) A c + sum_x v_x A (c n_x [L]).  Fitting pixels instead of the
    solved per-Gaussian colours avoids their noise (overlapping Gaussians share a pixel's
    change arbitrarily); the lit set is refitted until it settles.  Masked pixels take part,
    except clipped ones; the recolour uses only pixels that changed.  shading_init [3]: a
    first guess of v (e.g. fitted to the solved per-Gaussian colours) for the first lit set.
    maps: which of the two to fit (the other comes back as None; both do when no masked pixel
    is usable).  normals [N, 3] are needed for the shading only.
    """
    a = asset.detach()
    dt = torch.float64
    views = []
    for v, cam in enumerate(cameras):
        idx = (
            torch.arange(a.num_gaussians)
            if contributing is None
            else contributing[v].nonzero().squeeze(1)
        )
        cam = cam.to(a.device)
        ed, ren, m = edited[v].to(dt), renders[v].to(dt), masks[v].to(dt)
        w = m * (ed.amax(-1) < CLIP_LEVEL).to(dt)
        box = pixel_box(w)
        if box is None:
            continue
        x0, y0, x1, y1 = box
        window = cam.cropped(x0, y0, x1 - x0 + 1, y1 - y0 + 1)
        crop = (slice(y0, y1 + 1), slice(x0, x1 + 1))
        views.append((a.subset(idx), window, idx, (ed - ren)[crop], w[crop]))

    def render_of(asset_v, cam, idx, per_gauss: torch.Tensor) -> torch.Tensor:
        return _render_linear(asset_v, cam, per_gauss[idx].to(a.means.dtype)).to(dt)

    c = colors.to(dt)
    affine = shading = None
    if not views:  # no usable pixel (all masked ones clipped): nothing to fit
        return affine, shading
    with torch.no_grad():
        # one multi-channel render per view gives A c and A 1 (the renderer's colours may have
        # any number of channels, and the compositing is shared by all of them)
        both = [
            render_of(av, cam, idx, torch.cat([c, torch.ones_like(c[:, :1])], -1))
            for av, cam, idx, _, _ in views
        ]
        base = [b[..., :3] for b in both]
        if "affine" in maps:
            affine = _fit_affine(views, both).to(colors.dtype)
        if "shading" in maps:
            if normals is None:
                raise ValueError("fitting the shading needs the Gaussians' normals")
            av_ = _fit_shading(views, base, render_of, c, normals.to(dt), shading_init)
            d = av_[1:].norm()
            light = av_[1:] / d.clamp_min(1e-12)
            shading = tuple(x.to(colors.dtype) for x in (av_[0], d, light))
    return affine, shading  # type: ignore[return-value]


def _fit_affine(views, both: list[torch.Tensor]) -> torch.Tensor:
    """Per output channel k: features (A c_r, A c_g, A c_b, A 1) against t_k + A c_k, on the
    pixels that changed.  both[v]: [h, w, 4] renders of (c, 1)."""
    dt = both[0].dtype
    xtx = torch.zeros(3, 4, 4, dtype=dt)
    xty = torch.zeros(3, 4, 1, dtype=dt)
    for (_, _, _, t, w), feats4 in zip(views, both, strict=True):
        rc = feats4[..., :3]
        feats = feats4.reshape(-1, 4)
        wk = (w * (t.abs().amax(-1) > CHANGED_LEVEL).to(dt)).reshape(-1, 1)
        y = (t + rc).reshape(-1, 3)
        xtx += (feats * wk).T @ feats
        xty += ((feats * wk).T @ y).T[:, :, None]
    prior = torch.cat([torch.eye(3, dtype=dt), torch.zeros(1, 3, dtype=dt)])
    return torch.stack(
        [_normal_solve(xtx[k], xty[k], prior[:, k : k + 1])[:, 0] for k in range(3)], 1
    )


def _fit_shading(
    views, base, render_of, c: torch.Tensor, nrm: torch.Tensor, init: torch.Tensor | None
) -> torch.Tensor:
    """(a, v) [4] by least squares on a fixed lit set, refitted until the set settles.  Pixels
    the shading cannot explain (a Gaussian whose estimated normal points the wrong way) are
    down-weighted (Cauchy IRLS), so a few percent of them cannot bend the light."""
    dt = c.dtype
    prior = torch.tensor([[1.0], [0.0], [0.0], [0.0]], dtype=dt)
    av = prior[:, 0].clone()
    # start: every Gaussian lit, or the lit set of a first guess (saves a round of renders)
    lit = (nrm @ init.to(dt)) > 0 if init is not None else nrm.new_ones(len(nrm), dtype=torch.bool)
    for _ in range(SHADING_ITERS):
        rows = []
        for (asset_v, cam, idx, t, w), rc in zip(views, base, strict=True):
            lit_c = c * lit[:, None].to(dt)
            rs = render_of(
                asset_v, cam, idx, torch.cat([lit_c * nrm[:, x : x + 1] for x in range(3)], -1)
            )
            feats = torch.stack([rc, *rs.split(3, -1)], -1).reshape(-1, 4)
            wk = w[..., None].expand_as(rc).reshape(-1, 1)
            rows.append((feats, wk, (t + rc).reshape(-1, 1)))
        robust = [torch.ones_like(wk) for _, wk, _ in rows]
        for _ in range(ROBUST_ITERS):
            xtx = torch.zeros(4, 4, dtype=dt)
            xty = torch.zeros(4, 1, dtype=dt)
            for (feats, wk, y), rw in zip(rows, robust, strict=True):
                fw = feats * (wk * rw)
                xtx += fw.T @ feats
                xty += fw.T @ y
            av = _normal_solve(xtx, xty, prior)[:, 0]
            robust = [
                1.0 / (1.0 + ((feats @ av[:, None] - y) / ROBUST_SCALE) ** 2)
                for feats, _, y in rows
            ]
        new_lit = (nrm @ av[1:]) > 0
        if bool((new_lit == lit).all()):
            break
        lit = new_lit
    return av
