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
always stable.  A step needs A_v and A_v^T per view, only on the box of pixels the touched
Gaussians reach (a cropped camera), so a small stroke is cheap: the view's compositing weights
are taken once (`render.compositing_weights`) and a step is a gather and a scatter over them;
where they are too many to hold (or the backend does not give them) a step is a render and
its colour backward.
The first step is the weighted mean residual scaled by the Gaussian's share of its pixels; later
ones correct overlaps and edges.
A solve may instead be centred on a prediction c (a colour map's change): it starts at c, and the
damping and the prior act on d - c, so where the views leave the change undetermined (a part
seen through a few pixels) it keeps the prediction instead of shrinking toward no change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from splatpainter.assets.colorspace import adjust_hsv, hsv_to_rgb, rgb_to_hsv
from splatpainter.edit.views import pixel_box
from splatpainter.model.hypotheses import box_colors, ridge_solve
from splatpainter.model.stage2 import COLOR_MAPS

SOLVE_ITERS = 12  # projected FISTA steps (each: one render + colour backward per edit view)
SOLVE_DAMPING = 1e-2  # lam, relative to the SIRT scaling D


def view_colors(asset, camera) -> torch.Tensor:
    """[N, 3] float64: the colour each Gaussian shows this camera (SH at its view direction), as
    the renderer composites it.  An edit's colour map acts on the SH bands as on the base colour,
    so a view's pixel change is the map's action on these colours, not on the base ones."""
    from splatpainter.render.project import sh_to_color

    a = asset.detach()
    w2c = camera.to(a.device).world_to_cam
    return sh_to_color(a.means.double(), a.sh.double(), w2c.double(), a.sh_degree)


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
    centers: tuple[torch.Tensor, ...] | None = None,
) -> torch.Tensor | list[torch.Tensor]:
    """Per-Gaussian colour delta [N, 3] (zero outside `touched` [N] bool).

    targets[v] [H, W, 3]: the wanted change of view v's render (m (edited - render)); colors
    [N, 3]: the current base colours, so that colours + delta stays in [0, 1];
    contributing[v] [N] bool (optional): the Gaussians with any compositing weight in view v.
    The others change no pixel of it, so its renders leave them out.  prior_px: mu, in pixels
    of a 128x128 view (scaled with the views' area).  window_only: the steps render only the
    Gaussians with weight in the window (the same numbers; False renders all of a view's
    contributing Gaussians, the way to check that).
    centers: instead, a list of solves sharing the views' set-up, each started at and pulled
    (by the damping and the prior) toward its centre [N, 3] instead of toward no change.  Where
    the views leave a change undetermined (a part seen through a few pixels, Gaussians that
    overlap), the solve keeps its centre there: centred on a colour map's prediction it is the
    map, corrected where the views say otherwise.
    """
    from splatpainter.render import ColorRender

    a = asset.detach()
    n = a.num_gaussians
    delta = colors.new_zeros(n, 3)
    if iters <= 0 or not bool(touched.any()):
        return delta if centers is None else [delta.clone() for _ in centers]
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
            matrix = _entries_step(asset_v, cam, touched[idx], slot[idx], rows.numel(), tgt)
            if matrix is not None:
                g, step = matrix
                diag.index_add_(0, idx, g)
                if step is not None:
                    views.append(step)
                continue
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
            render_v = ColorRender(asset_v.subset(near), window)
            tgt_v = tgt.to(colors)[y0 : y1 + 1, x0 : x1 + 1]
            views.append(lambda y, r=render_v, s=seen, i=at[seen], t=tgt_v: gram(r, s, i, y, t))
        diag = diag[rows].mean(-1, keepdim=True)
        area = sum(int(c.width) * int(c.height) for c in cameras) / len(cameras)
        mu = prior_px * area / (128 * 128)
        ok = diag > 1e-12
        inv = torch.where(ok, 1.0 / ((1.0 + damping) * diag.clamp_min(1e-12) + mu), 0.0)
        out = []
        for center in (None,) if centers is None else centers:
            c = colors.new_zeros(rows.numel(), 3)
            if center is not None:
                c = torch.minimum(torch.maximum(center[rows].to(c), lo), hi)
            x = y = c
            t = 1.0
            for _ in range(iters):
                g = (damping * diag + mu) * (y - c)
                for step in views:
                    g += step(y)
                x_new = torch.minimum(torch.maximum(y - inv * g, lo), hi)
                t_new = 0.5 * (1.0 + (1.0 + 4.0 * t * t) ** 0.5)
                y = x_new + ((t - 1.0) / t_new) * (x_new - x)
                x, t = x_new, t_new
            d = delta.clone()
            d[rows] = torch.where(ok, x, 0.0)
            out.append(d)
        return out[0] if centers is None else out


# Compositing weights one view's steps may hold (`render.compositing_weights`): with their
# copies and sparse layouts ~80 bytes each, 2^21 are ~0.17 GB while they last.  A view with more
# (a recolour of a whole 512x512 view of a dense capture) steps by renders instead.
MATRIX_ENTRIES = 1 << 21


def _entries_step(asset_v, camera, touched: torch.Tensor, slot: torch.Tensor, size: int, tgt):
    """One view's share of the solve from its compositing weights A over the box the touched
    Gaussians are drawn in: (A^T A 1_S [n, 3], the step x -> A_S^T (A_S x - t) on the touched
    rows, None if they reach no pixel), or None where the weights are not to be had (another
    backend, or more than MATRIX_ENTRIES of them): the view then steps by renders
    (`_reach_pass`, `ColorRender`).  The same maths as those renders (the entries are the
    raster's weights bit for bit), summed in another order; one compositing pass per view
    instead of two per step."""
    from splatpainter.render import compositing_weights, footprint_box

    n = touched.numel()
    fbox = footprint_box(asset_v.subset(touched), camera)
    if fbox is None:
        return asset_v.means.new_zeros(n, 3), None
    fx0, fy0, fx1, fy1 = fbox
    crop = camera.cropped(fx0, fy0, fx1 - fx0 + 1, fy1 - fy0 + 1)
    weights = compositing_weights(asset_v, crop, limit=MATRIX_ENTRIES)
    if weights is None:
        return None
    ones = touched[:, None].to(asset_v.means.dtype)
    diag = weights.adjoint(weights.apply(ones)).expand(-1, 3)
    on_s = weights.remapped(slot, size)  # x is zero off the touched rows: their entries alone
    if on_s.pixel.numel() == 0:
        return diag, None
    t = tgt.to(asset_v.means.dtype)[fy0 : fy1 + 1, fx0 : fx1 + 1]
    return diag, on_s.residual_step(t)


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
CLAMP_ITERS = 4  # fits of the recolour, each on the clamped set of the one before
HUE_STEPS = 36  # hue turns tried to start the HSV recolour's fit
HSV_ITERS = 3  # its Gauss-Newton steps (each: one 12-channel render per view)
START_PIXELS = 1024  # changed pixels the start's hue search looks at (evenly picked)
# A pixel takes part in the recolour fit if its change exceeds this (the eval's "changed" test).
CHANGED_LEVEL = 2.0 / 255.0
SHADING_ITERS = 3  # refits of the lit set (each: one 9-channel render per view)
ROBUST_ITERS = 4  # reweighting rounds per lit set (no renders)
ROBUST_SCALE = 4.0 / 255.0  # a pixel this far off counts half


def _normal_solve(xtx: torch.Tensor, xty: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
    """argmin |X b - y|^2 + eps |b - prior|^2 from X^T X, X^T y (eps keeps it well posed)."""
    return ridge_solve(xtx, xty, prior, 1e-6 * (float(xtx.diagonal().sum()) + 1e-12))


def _window_map(asset_v, window) -> Callable[[torch.Tensor], torch.Tensor]:
    """x [n, C] -> A x [h, w, C] float64 for the fits' many products with one view's A: its
    compositing weights taken once and laid out as a sparse matrix (the same weights as the
    raster, bit for bit: `render.compositing_weights`), or a render per product where they are
    too many to hold or the backend does not give them."""
    from splatpainter.render import compositing_weights

    weights = compositing_weights(asset_v, window, limit=MATRIX_ENTRIES)
    if weights is None:
        dt = asset_v.means.dtype
        return lambda x: _render_linear(asset_v, window, x.to(dt)).to(torch.float64)
    matrix = weights.matrix(torch.float64)
    shape = (weights.height, weights.width)
    return lambda x: (matrix @ x.to(torch.float64)).view(*shape, -1)


class _FitView(NamedTuple):
    """One edit view's share of the colour-map fits: the window of its usable masked pixels."""

    render: Callable[[torch.Tensor], torch.Tensor]  # A x [h, w, C] float64 of x [n, C]
    idx: torch.Tensor  # [n] their rows in the asset
    before: torch.Tensor  # [h, w, 3] the render
    change: torch.Tensor  # [h, w, 3] edited - render
    weight: torch.Tensor  # [h, w] masked and not clipped at the top
    colors: torch.Tensor  # [n, 3] the colours they show this view (`view_colors`)


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

    Both maps act on the colour c each Gaussian shows the view (`view_colors`: its base colour
    plus the SH bands, which the maps move alike), and a render is linear in it
    (rgb = A c + T bg), so their pixel changes are linear in the maps' parameters: an affine
    map M, b changes channel k by sum_j M_jk A c_j + b_k A 1 - A c_k, and a shading
    c -> c (a + max(0, n.v)) with a fixed lit set L = {n.v > 0} by
    (a - 1) A c + sum_x v_x A (c n_x [L]).  Fitting pixels instead of the
    solved per-Gaussian colours avoids their noise (overlapping Gaussians share a pixel's
    change arbitrarily); the lit set is refitted until it settles.  Masked pixels take part,
    except clipped ones; the recolour uses only pixels that changed.  shading_init [3]: a
    first guess of v (e.g. fitted to the solved per-Gaussian colours) for the first lit set.
    maps: which of the two to fit (the other comes back as None; both do when no masked pixel
    is usable).  normals [N, 3] are needed for the shading only; colors [N, 3] are the base
    colours.
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
        asset_v = a.subset(idx)
        before, change = ren[crop], (ed - ren)[crop]
        views.append(
            _FitView(
                _window_map(asset_v, window),
                idx,
                before,
                change,
                w[crop],
                view_colors(asset_v, cam),
            )
        )

    affine = shading = hsv = None
    if not views:  # no usable pixel (all masked ones clipped): nothing to fit
        return affine, shading, hsv
    with torch.no_grad():
        # one multi-channel render per view gives A c and A 1 (the renderer's colours may have
        # any number of channels, and the compositing is shared by all of them)
        both = [
            v.render(torch.cat([v.colors, torch.ones_like(v.colors[:, :1])], -1)) for v in views
        ]
        base = [b[..., :3] for b in both]
        if "affine" in maps:
            affine = _fit_affine(views, both, colors)
            hsv = _fit_hsv(views, both)
            if hsv is not None:
                base_v = [colors.to(dt)[v.idx] for v in views]
                lin = affine[:3]
                affine_out = [
                    box_colors(c @ lin + affine[3], c) + (v.colors - c) @ lin
                    for v, c in zip(views, base_v, strict=True)
                ]
                if _rss(views, both, affine_out) <= hsv[1]:
                    hsv = None
                else:
                    hsv = hsv[0].to(colors.dtype)
            affine = affine.to(colors.dtype)
        if "shading" in maps:
            if normals is None:
                raise ValueError("fitting the shading needs the Gaussians' normals")
            av_ = _fit_shading(views, base, normals.to(dt), shading_init)
            d = av_[1:].norm()
            light = av_[1:] / d.clamp_min(1e-12)
            shading = tuple(x.to(colors.dtype) for x in (av_[0], d, light))
    return affine, shading, hsv  # type: ignore[return-value]


def _fit_affine(views, both: list[torch.Tensor], colors: torch.Tensor) -> torch.Tensor:
    """Per output channel k: features (A c_r, A c_g, A c_b, A 1) against t_k + A c_k, on the
    pixels that changed.  both[v]: [h, w, 4] renders of (c, 1).

    The new base colour stays in the colour box (`edit_hypotheses` clamps it there, as a 2D
    tool does), and the renderer shows no negative colour, so a strong recolour is affine
    only where neither clamps.  With the clamped sets fixed the pixels are still linear in the
    map: a Gaussian whose base colour is clamped adds its bound plus its SH bands' map, an
    unclamped one the map of its whole view colour, one shown black nothing.  The sets are
    refitted until they settle."""
    dt = both[0].dtype
    prior = torch.cat([torch.eye(3, dtype=dt), torch.zeros(1, 3, dtype=dt)])
    base = colors.to(dt)
    state = None  # per view (free, bound, shown), each [n, 3]; None: every Gaussian free
    aff = prior
    for _ in range(CLAMP_ITERS):
        xtx = torch.zeros(3, 4, 4, dtype=dt)
        xty = torch.zeros(3, 4, 1, dtype=dt)
        for i, (v, feats4) in enumerate(zip(views, both, strict=True)):
            y = _edited_pixels(v, feats4)
            if state is None:
                per_channel = [(feats4.reshape(-1, 4), y[:, k]) for k in range(3)]
            else:
                free, bound, shown = state[i]
                c = base[v.idx]
                parts = [
                    torch.cat([c * free[:, k : k + 1] + v.colors - c, free[:, k : k + 1]], -1)
                    * shown[:, k : k + 1]
                    for k in range(3)
                ]
                parts.append(bound * (1 - free) * shown)
                r = v.render(torch.cat(parts, -1))
                per_channel = [
                    (r[..., 4 * k : 4 * k + 4].reshape(-1, 4), y[:, k] - r[..., 12 + k].reshape(-1))
                    for k in range(3)
                ]
            changed = _changed_weight(v)
            for k, (feats, yk) in enumerate(per_channel):
                fw = feats * changed
                xtx[k] += fw.T @ feats
                xty[k] += fw.T @ yk[:, None]
        aff = torch.stack(
            [_normal_solve(xtx[k], xty[k], prior[:, k : k + 1])[:, 0] for k in range(3)], 1
        )
        now = [_clamp_state(base[v.idx], v.colors, aff) for v in views]
        if state is not None and all(
            all(bool((x == y).all()) for x, y in zip(a, b, strict=True))
            for a, b in zip(now, state, strict=True)
        ):
            break
        state = now
    return aff


def _clamp_state(c: torch.Tensor, view_c: torch.Tensor, aff: torch.Tensor):
    """(free, bound, shown) [n, 3] of Gaussians with base colours c and view colours view_c
    under the affine map: channels the colour box leaves alone, the box's bound where it does
    not, and channels whose new view colour the renderer shows (not below 0)."""
    new = c @ aff[:3] + aff[3]
    lo, hi = c.clamp_max(0.0), c.clamp_min(1.0)
    free = (new >= lo) & (new <= hi)
    shown = box_colors(new, c) + (view_c - c) @ aff[:3] >= 0
    return free.to(c.dtype), torch.where(new > hi, hi, lo), shown.to(c.dtype)


def _changed_weight(v: _FitView) -> torch.Tensor:
    """[h * w, 1] the weight of the pixels the recolour fits (masked, unclipped, changed)."""
    return (v.weight * (v.change.abs().amax(-1) > CHANGED_LEVEL)).reshape(-1, 1)


def _edited_pixels(v: _FitView, feats4: torch.Tensor) -> torch.Tensor:
    """[h * w, 3] the edited view less the background's share: what the recolour's new view
    colours must render to (feats4: the view's render of (c, 1), black background)."""
    return (v.change + feats4[..., :3]).reshape(-1, 3)


def _rss(views, both, outs: list[torch.Tensor]) -> float:
    """Weighted squared error of the recolour fits' pixels when each view's Gaussians show
    outs[v] [n, 3] (their new view colours)."""
    total = 0.0
    for v, feats4, out in zip(views, both, outs, strict=True):
        y = _edited_pixels(v, feats4)
        r = v.render(out).reshape(-1, 3)
        total += float((_changed_weight(v) * (y - r) ** 2).sum())
    return total


def _hsv_start(views) -> tuple[float, float, float] | None:
    """(hue turn, saturation gain, brightness gain) that best map the changed pixels' colours
    before the edit to after, the best of HUE_STEPS turns (on at most START_PIXELS of them).
    A pixel mixes Gaussians' colours, so this only starts the fit on them."""
    keep = [(_changed_weight(v)[:, 0], v) for v in views]
    w = torch.cat([m[m > 0] for m, _ in keep])
    if len(w) == 0:
        return None
    before = torch.cat([v.before.reshape(-1, 3)[m > 0] for m, v in keep]).clamp_min(0.0)
    after = torch.cat([(v.before + v.change).reshape(-1, 3)[m > 0] for m, v in keep])
    pick = torch.arange(0, len(w), max(1, len(w) // START_PIXELS))
    w, before, after = w[pick], before[pick], after[pick]
    hues = torch.arange(HUE_STEPS, dtype=torch.float64) * (360.0 / HUE_STEPS)
    hsv = rgb_to_hsv(before).repeat(HUE_STEPS, 1)
    hsv[:, 0] += hues.repeat_interleave(len(w))
    turned = hsv_to_rgb(hsv).reshape(HUE_STEPS, -1)  # [hues, pixels * 3]
    # saturation x s, value x v: v val - v s (val - turned), linear in (v, v s)
    val = before.amax(-1, keepdim=True).expand_as(before).reshape(1, -1)
    x = torch.stack([val.expand_as(turned), turned - val], -1)  # [hues, P3, 2]
    wx = x * w.repeat_interleave(3)[None, :, None]
    y = after.reshape(1, -1, 1).expand(HUE_STEPS, -1, -1)
    eye = 1e-9 * torch.eye(2, dtype=x.dtype)
    ab = torch.linalg.solve(wx.transpose(1, 2) @ x + eye, wx.transpose(1, 2) @ y)  # [hues, 2, 1]
    rss = ((x @ ab - y) ** 2 * w.repeat_interleave(3)[None, :, None]).sum((1, 2))
    best = int(rss.argmin())
    v_gain = max(float(ab[best, 0, 0]), 1e-3)
    s_gain = float(ab[best, 1, 0]) / v_gain
    return float(hues[best]), min(max(s_gain, 0.0), 10.0), min(v_gain, 10.0)


def _fit_hsv(views, both) -> tuple[torch.Tensor, float] | None:
    """An HSV adjustment (hue degrees, saturation gain, brightness gain) of the view colours
    that best reproduces the recolour fit's pixels, and its weighted squared error: Gauss-Newton
    from `_hsv_start`, the render of each parameter's finite difference giving its column."""
    start = _hsv_start(views)
    if start is None:
        return None
    p = torch.tensor(start, dtype=torch.float64)
    steps = torch.tensor([0.5, 1e-3, 1e-3], dtype=torch.float64)
    hsv_v = [rgb_to_hsv(v.colors) for v in views]  # view colours are >= 0
    best = None
    for _ in range(HSV_ITERS):
        xtx = torch.zeros(3, 3, dtype=torch.float64)
        xty = torch.zeros(3, dtype=torch.float64)
        rss = 0.0
        for v, feats4, hsv in zip(views, both, hsv_v, strict=True):
            trials = [p, *(p + torch.eye(3, dtype=p.dtype)[j] * steps[j] for j in range(3))]
            outs = [box_colors(adjust_hsv(hsv, *t.tolist()), v.colors) for t in trials]
            r = v.render(torch.cat(outs, -1)).reshape(-1, 12)
            y = _edited_pixels(v, feats4)
            res = y - r[:, :3]
            jac = torch.stack(
                [(r[:, 3 * j + 3 : 3 * j + 6] - r[:, :3]) / steps[j] for j in range(3)], -1
            )
            m = _changed_weight(v)
            rss += float((m * res**2).sum())
            jw = jac * m[..., None]
            xtx += torch.einsum("pcj,pck->jk", jw, jac)
            xty += torch.einsum("pcj,pc->j", jw, res)
        if best is None or rss < best[1]:
            best = (p.clone(), rss)
        damp = 1e-6 * float(xtx.diagonal().sum()) + 1e-12
        p = p + torch.linalg.solve(xtx + damp * torch.eye(3, dtype=p.dtype), xty)
        p[0] = torch.remainder(p[0], 360.0)
        p[1:] = p[1:].clamp(0.0, 10.0)
    return best


def _fit_shading(views, base, nrm: torch.Tensor, init: torch.Tensor | None) -> torch.Tensor:
    """(a, v) [4] by least squares on a fixed lit set, refitted until the set settles.  Pixels
    the shading cannot explain (a Gaussian whose estimated normal points the wrong way) are
    down-weighted (Cauchy IRLS), so a few percent of them cannot bend the light."""
    dt = nrm.dtype
    prior = torch.tensor([[1.0], [0.0], [0.0], [0.0]], dtype=dt)
    av = prior[:, 0].clone()
    # start: every Gaussian lit, or the lit set of a first guess (saves a round of renders)
    lit = (nrm @ init.to(dt)) > 0 if init is not None else nrm.new_ones(len(nrm), dtype=torch.bool)
    for _ in range(SHADING_ITERS):
        rows = []
        for v, rc in zip(views, base, strict=True):
            lit_c = v.colors * lit[v.idx, None].to(dt)
            n_v = nrm[v.idx]
            rs = v.render(torch.cat([lit_c * n_v[:, x : x + 1] for x in range(3)], -1))
            t, w = v.change, v.weight
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
