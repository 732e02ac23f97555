"""Per-Gaussian evidence from edit views, read off the renderer's compositing weights.

For a colour override c (one RGB per Gaussian) the rendered pixel is
rgb_p = sum_g w_gp c_g + T_p * background, so the gradient of sum_p <rgb_p, t_p> with respect to
c_g is sum_p w_gp t_p: any weighted sum of a per-pixel quantity over each Gaussian's footprint,
with the renderer's own visibility (occlusion, opacity) built in.  Per view one pass of
`render.api.splat_sums` (all channels at once, the cost of about one render) with

    t_p = (m_p, m_p |r_p|, m_p r_p)  -> in-mask weight, in-mask |residual| mass, in-mask
                                        residual mass (RGB)

over the mask's box of pixels alone (the targets are zero outside it), and t_p = 1 over the
whole view for the total weight, which depends on the geometry only: it is remembered
(`VIEW_WEIGHTS`) through a session of colour edits, as is the frame the user painted on
(`SHOWN_FRAMES`).

where r = edited - render and |r| its max over channels.  Sums over all views, normalised, are the
`GaussianSignals` that both the model (its gate and inputs) and back-projection use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from splatpainter.edit.views import EditView, effective_mask, pixel_box
from splatpainter.model.stage2 import GaussianSignals
from splatpainter.render.memo import ViewMemo

# Each view's total compositing weight per Gaussian [N]: geometry and camera only, so it holds
# through a session of colour edits from one view.
VIEW_WEIGHTS = ViewMemo(entries=4)
# The frames shown to the user (`shown_frame`): an edit painted on one is fitted on it.
SHOWN_FRAMES = ViewMemo(entries=4)


def _geometry(asset) -> list[torch.Tensor]:
    return [asset.means, asset.quats, asset.log_scales, asset.opacity_logits]


def _frame_key(asset, background) -> tuple[list[torch.Tensor], tuple[float, ...]]:
    bg = () if background is None else tuple(torch.as_tensor(background).flatten().tolist())
    return [*_geometry(asset), asset.sh], bg


def shown_frame(asset, camera, background=(0.0, 0.0, 0.0)) -> torch.Tensor:
    """render(asset, camera).rgb [H, W, 3] (no gradient), remembered: an edit painted on this
    frame (`gather_signals` with the same asset, camera and background) is fitted on it
    without rendering it again."""
    from splatpainter.render import render

    tensors, bg = _frame_key(asset, background)
    rgb = SHOWN_FRAMES.get(tensors, camera, bg)
    if rgb is None:
        with torch.no_grad():
            rgb = render(asset.detach(), camera, background=background).rgb
        SHOWN_FRAMES.put(tensors, camera, rgb, bg)
    return rgb


def view_weights(asset, camera) -> torch.Tensor:
    """Each Gaussian's total compositing weight in the view [N] (`splat_weights`), remembered
    while the asset's geometry stays the same."""
    from splatpainter.render import splat_weights

    geometry = _geometry(asset)
    wt = VIEW_WEIGHTS.get(geometry, camera)
    if wt is None:
        wt = splat_weights(asset.detach(), camera)
        VIEW_WEIGHTS.put(geometry, camera, wt)
    return wt


@dataclass
class ViewEvidence:
    """What one edit view contributes (kept for the model's view tokens)."""

    view: EditView
    render: torch.Tensor  # [H, W, 3] current render from the view's camera
    mask: torch.Tensor  # [H, W] effective mask
    contributing: torch.Tensor  # [N] bool: the Gaussians with any compositing weight in the view

    @property
    def wanted_change(self) -> torch.Tensor:
        """[H, W, 3] m (edited - render): the change of the render the view asks for."""
        return self.mask[..., None] * (self.view.image.to(self.render) - self.render)


def solve_from_evidence(
    asset,
    evidence: list[ViewEvidence],
    touched: torch.Tensor,
    *,
    iters: int,
    prior_px: float,
    centers: tuple[torch.Tensor, ...] | None = None,
) -> torch.Tensor | list[torch.Tensor]:
    """The least-squares colour change [N, 3] of the `touched` Gaussians (edit/solve.py) that
    reproduces what the views ask for, each colour kept in [0, 1] (a list of them, one per
    centre, when centres are given: see `solve_color_delta`)."""
    from splatpainter.assets.gaussians import sh_dc_to_rgb
    from splatpainter.edit.solve import solve_color_delta

    return solve_color_delta(
        asset,
        [ev.view.camera for ev in evidence],
        [ev.wanted_change for ev in evidence],
        touched,
        sh_dc_to_rgb(asset.sh[:, 0, :]).clamp_max(1.0),
        contributing=[ev.contributing for ev in evidence],
        iters=iters,
        prior_px=prior_px,
        centers=centers,
    )


def gather_signals(
    asset,
    views: list[EditView],
    *,
    background=(0.0, 0.0, 0.0),
    solve_iters: int = 0,
    solve_prior_px: float = 0.0,
    normals: torch.Tensor | None = None,
    fit_maps: tuple[str, ...] = (),
    map_solves: bool = False,
) -> tuple[GaussianSignals, list[ViewEvidence]]:
    """Render every view once and accumulate per-Gaussian signals (no gradient leaves here).

    solve_iters > 0 also solves for the least-squares colour change of the touched Gaussians
    (`GaussianSignals.solved`, see edit/solve.py) and fits the `fit_maps` ("affine", "shading":
    the latter needs the Gaussians' normals) to the views' pixels; map_solves then solves again
    centred on each fitted map's prediction (`solved_affine`, `solved_shading`).
    """
    from splatpainter.render import splat_sums

    a = asset.detach()
    n = a.num_gaussians
    zeros = a.means.new_zeros(n)
    wm, wa, wt = zeros.clone(), zeros.clone(), zeros.clone()
    wr = a.means.new_zeros(n, 3)
    evidence = []
    for view in views:
        cam = view.camera.to(a.device)
        ref = shown_frame(asset, cam, background)  # what the user sees and edits
        edited = view.image.to(ref)
        mask = effective_mask(view, ref)
        total = view_weights(asset, cam)
        wt += total
        box = pixel_box(mask)
        if box is not None:  # the in-mask sums, from the mask's box alone (zero outside it)
            x0, y0, x1, y1 = box
            crop = (slice(y0, y1 + 1), slice(x0, x1 + 1))
            m, res = mask[crop], (edited - ref)[crop]
            targets = torch.cat(
                [torch.stack([m, m * res.abs().amax(-1)], -1), m[..., None] * res], -1
            )
            sums = splat_sums(a, cam.cropped(x0, y0, x1 - x0 + 1, y1 - y0 + 1), targets)  # [N, 5]
            wm += sums[:, 0]
            wa += sums[:, 1]
            wr += sums[:, 2:]
        evidence.append(ViewEvidence(view, ref, mask, total > 0))
    has = wm > 0
    support = torch.where(wt > 0, wm / torch.where(wt > 0, wt, torch.ones_like(wt)), zeros)
    contributing = [ev.contributing for ev in evidence]
    solved = affine = shading = hsv = None
    if solve_iters > 0:
        from splatpainter.assets.gaussians import sh_dc_to_rgb
        from splatpainter.edit.solve import fit_color_maps

        solved = solve_from_evidence(a, evidence, has, iters=solve_iters, prior_px=solve_prior_px)
        if normals is None:
            fit_maps = tuple(m for m in fit_maps if m != "shading")
        if fit_maps and bool(has.any()):
            from splatpainter.model.hypotheses import fit_shading

            colors = sh_dc_to_rgb(a.sh[:, 0, :], clamp=False)
            init = None
            if normals is not None:
                normals = normals.to(colors)
                _, dif, light = fit_shading(colors, colors + solved, normals, wm * support)
                init = dif * light
            affine, shading, hsv = fit_color_maps(
                a,
                [ev.view.camera for ev in evidence],
                [ev.view.image for ev in evidence],
                [ev.render for ev in evidence],
                [ev.mask for ev in evidence],
                colors,
                normals,
                contributing,
                shading_init=init,
                maps=fit_maps,
            )
    solved_affine = solved_shading = None
    if map_solves and (affine is not None or shading is not None):
        solved_affine, solved_shading = _map_solves(
            a, evidence, has, solve_iters, solve_prior_px, normals, affine, shading, hsv
        )
    safe = torch.where(has, wm, torch.ones_like(wm))
    signals = GaussianSignals(
        residual=torch.where(has[:, None], wr / safe[:, None], torch.zeros_like(wr)),
        abs_residual=torch.where(has, wa / safe, zeros),
        support=support,
        in_mask_weight=wm,
        weight=wt,
        solved=solved,
        affine=affine,
        shading=shading,
        hsv=hsv,
        solved_affine=solved_affine,
        solved_shading=solved_shading,
    )
    return signals, evidence


def _map_solves(asset, evidence, touched, iters, prior_px, normals, affine, shading, hsv):
    """(solved_affine, solved_shading) [N, 3] or None for a map not fitted: the touched
    Gaussians' least-squares change started at and pulled toward each map's prediction."""
    from splatpainter.assets.gaussians import sh_dc_to_rgb
    from splatpainter.model.hypotheses import map_candidates

    colors = sh_dc_to_rgb(asset.sh[:, 0, :], clamp=False)
    if normals is None:
        normals = torch.zeros_like(colors)
    identity = colors.new_tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]])
    flat = (colors.new_tensor(1.0), colors.new_tensor(0.0), colors.new_tensor([0.0, 0.0, 1.0]))
    cand = map_candidates(
        colors,
        identity if affine is None else affine.to(colors),
        hsv,
        flat if shading is None else shading,
        normals.to(colors),
    )
    fitted = [m is not None for m in (affine, shading)]
    centers = tuple(c.clamp(-1, 1) for c, f in zip(cand, fitted, strict=True) if f)
    solved = solve_from_evidence(
        asset, evidence, touched, iters=iters, prior_px=prior_px, centers=centers
    )
    out = iter(solved)
    return tuple(next(out) if f else None for f in fitted)
