"""Baselines behind the same interface as the model: back-projection and per-edit optimisation."""

from __future__ import annotations

import time
from typing import Any

import torch

from splatpainter.edit.methods import EditMethod, write_back
from splatpainter.edit.signals import gather_signals
from splatpainter.edit.views import EditView, effective_mask
from splatpainter.model.stage1 import SH_C0


class BackprojectMethod(EditMethod):
    """Move each Gaussian's colour to the compositing-weighted average of its edited pixels.

    Written in residual form: colour_g += sum_p w_gp m_p (edited_p - render_p) / sum_p w_gp m_p,
    i.e. the Gaussian's colour goes to (its colour + the mean correction its pixels ask for).  For
    an opaque surface this is the weighted-average target colour; unlike "set the colour to the
    average target" it is exactly a no-op when the edited image equals the render (a pixel blends
    several Gaussians, so the average target is not any single Gaussian's colour).  Only Gaussians
    with at least `min_support` of their visible weight inside the mask and `min_weight` in-mask
    weight (pixels) change; the SH DC term moves, higher bands stay.
    """

    name = "backproject"

    def __init__(
        self,
        *,
        min_support: float = 0.9,
        min_weight: float = 1e-2,
        background=(0.0, 0.0, 0.0),
    ) -> None:
        super().__init__(background=background)
        self.min_support = float(min_support)
        self.min_weight = float(min_weight)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "min_support": self.min_support,
            "min_weight": self.min_weight,
        }

    @torch.no_grad()
    def apply(self, asset, views: list[EditView], state: Any):
        s, _ = gather_signals(asset, views, background=self.background)
        selected = (
            (s.in_mask_weight >= self.min_weight)
            & (s.support >= self.min_support)
            & (s.residual != 0).any(-1)
        )
        sh = asset.sh.clone()
        sh[:, 0, :] = asset.sh[:, 0, :] + s.residual.to(asset.sh) / SH_C0
        return write_back(asset, selected, sh=sh), state


class OptimizeMethod(EditMethod):
    """Per-edit optimisation: Adam on appearance through the differentiable renderer.

    Loss per view = mean over pixels of  m (render - edited)^2 + preserve_weight (1 - m)
    (render - current render)^2: pull the mask toward the edit, hold the rest where it was.
    Stops after `steps` or `time_budget` seconds, whichever first.
    `fit_geometry=True` also frees means, scales, rotations and opacity (to show the damage).
    Only Gaussians that ever received a non-zero gradient are written back.
    """

    name = "optimize"

    def __init__(
        self,
        *,
        steps: int = 100,
        lr: float = 0.05,
        time_budget: float | None = None,
        fit_geometry: bool = False,
        preserve_weight: float = 20.0,
        background=(0.0, 0.0, 0.0),
    ) -> None:
        super().__init__(background=background)
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        self.steps = int(steps)
        self.lr = float(lr)
        self.time_budget = time_budget
        self.fit_geometry = bool(fit_geometry)
        self.preserve_weight = float(preserve_weight)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "steps": self.steps,
            "lr": self.lr,
            "time_budget": self.time_budget,
            "fit_geometry": self.fit_geometry,
            "preserve_weight": self.preserve_weight,
        }

    def apply(self, asset, views: list[EditView], state: Any):
        from splatpainter.render import render

        base = asset.detach()
        targets = []
        with torch.no_grad():
            for v in views:
                cam = v.camera.to(base.device)
                ref = render(base, cam, background=self.background).rgb
                targets.append((cam, v.image.to(ref), effective_mask(v, ref), ref))
        if all(float((m * (e - r).abs().amax(-1)).max()) == 0 for _, e, m, r in targets):
            return asset, state  # nothing to fit: no masked pixel differs from the render
        names = ["sh"]
        if self.fit_geometry:
            names += ["means", "log_scales", "quats", "opacity_logits"]
        params = {k: getattr(base, k).clone().requires_grad_(True) for k in names}
        touched = torch.zeros(base.num_gaussians, dtype=torch.bool, device=base.device)
        opt = torch.optim.Adam(params.values(), lr=self.lr)
        start = time.perf_counter()
        for _ in range(self.steps):
            if self.time_budget is not None and time.perf_counter() - start > self.time_budget:
                break
            cur = base.replace(**params)
            loss = base.means.new_zeros(())
            for cam, edited, mask, ref in targets:
                rgb = render(cur, cam, background=self.background).rgb
                m = mask[..., None]
                err = m * (rgb - edited) ** 2 + self.preserve_weight * (1 - m) * (rgb - ref) ** 2
                loss = loss + err.sum() / mask.numel()
            opt.zero_grad(set_to_none=False)
            loss.backward()
            with torch.no_grad():
                for p in params.values():
                    touched |= (p.grad != 0).reshape(p.shape[0], -1).any(-1)
            opt.step()
        new = {k: v.detach() for k, v in params.items()}
        return write_back(base, touched, **new), state
