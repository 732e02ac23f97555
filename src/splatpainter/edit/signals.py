"""Per-Gaussian evidence from edit views, read off the renderer's compositing weights.

For a colour override c (one RGB per Gaussian) the rendered pixel is
rgb_p = sum_g w_gp c_g + T_p * background, so the gradient of sum_p <rgb_p, t_p> with respect to
c_g is sum_p w_gp t_p: any weighted sum of a per-pixel quantity over each Gaussian's footprint,
with the renderer's own visibility (occlusion, opacity) built in.  Per view one pass of
`render.api.splat_sums` (all channels at once, the cost of about one render) with

    t_p = (m_p, m_p |r_p|, 1, m_p r_p)  -> in-mask weight, in-mask |residual| mass, total
                                           weight, in-mask residual mass (RGB)

where r = edited - render and |r| its max over channels.  Sums over all views, normalised, are the
`GaussianSignals` that both the model (its gate and inputs) and back-projection use.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from splatpainter.edit.views import EditView, effective_mask
from splatpainter.model.stage2 import GaussianSignals


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
    asset, evidence: list[ViewEvidence], touched: torch.Tensor, *, iters: int, prior_px: float
) -> torch.Tensor:
    """The least-squares colour change [N, 3] of the `touched` Gaussians (edit/solve.py) that
    reproduces what the views ask for, each colour kept in [0, 1]."""
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
) -> tuple[GaussianSignals, list[ViewEvidence]]:
    """Render every view once and accumulate per-Gaussian signals (no gradient leaves here).

    solve_iters > 0 also solves for the least-squares colour change of the touched Gaussians
    (`GaussianSignals.solved`, see edit/solve.py) and fits the `fit_maps` ("affine", "shading":
    the latter needs the Gaussians' normals) to the views' pixels.
    """
    from splatpainter.render import render, splat_sums

    a = asset.detach()
    n = a.num_gaussians
    zeros = a.means.new_zeros(n)
    wm, wa, wt = zeros.clone(), zeros.clone(), zeros.clone()
    wr = a.means.new_zeros(n, 3)
    evidence = []
    for view in views:
        cam = view.camera.to(a.device)
        with torch.no_grad():  # what the user sees and edits
            ref = render(a, cam, background=background).rgb
        edited = view.image.to(ref)
        mask = effective_mask(view, ref)
        res = edited - ref
        absres = res.abs().amax(-1)
        targets = torch.cat(
            [torch.stack([mask, mask * absres, torch.ones_like(mask)], -1), mask[..., None] * res],
            -1,
        )
        sums = splat_sums(a, cam, targets)  # [N, 6], one pass for all six
        wm += sums[:, 0]
        wa += sums[:, 1]
        wt += sums[:, 2]
        wr += sums[:, 3:]
        evidence.append(ViewEvidence(view, ref, mask, sums[:, 2] > 0))
    has = wm > 0
    support = torch.where(wt > 0, wm / torch.where(wt > 0, wt, torch.ones_like(wt)), zeros)
    contributing = [ev.contributing for ev in evidence]
    solved = affine = shading = None
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
            affine, shading = fit_color_maps(
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
    )
    return signals, evidence
