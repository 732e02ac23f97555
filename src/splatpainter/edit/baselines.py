"""Baselines behind the same interface as the model: back-projection and per-edit optimisation."""

from __future__ import annotations

import numbers
import time
from typing import Any

import torch

from splatpainter.assets.gaussians import SH_C0
from splatpainter.edit.methods import EditMethod, write_back
from splatpainter.edit.signals import gather_signals, solve_from_evidence
from splatpainter.edit.views import EditView, effective_mask
from splatpainter.edit.visibility import Visibility, visibility


class BackprojectMethod(EditMethod):
    """Give the Gaussians the edit view meaningfully sees the colour change its pixels ask for.

    Which Gaussians: a candidate has at least `min_weight` pixels of in-mask weight and
    `min_support` of its visible weight in the mask; the occlusion factor f_g below fades or
    drops the ones behind the visible surface.  How much (SH DC only, higher bands stay):

    - least squares (default, solve_iters > 0): the selected Gaussians' colour change that best
      reproduces the masked pixel change, d = argmin sum_v |A_v d - m_v (edited_v - render_v)|^2
      + prior_px |d|^2, colours kept in [0, 1] (edit/solve.py, `solve_iters` FISTA steps).
      Pixels where a changed Gaussian blends with one that the edit leaves alone ask for the
      blend, not for the whole correction, so a relight does not drag along the Gaussians whose
      colour it does not change; the prior (in pixels of weight) keeps faint ones put.
    - residual (solve_iters=0): dc_g = f_g sum_p w_gp m_p (edited_p - render_p) / sum_p w_gp m_p,
      the compositing-weighted mean correction of its pixels, scaled by f_g.  For an opaque
      surface this takes the Gaussian to the weighted-average target colour.

    Both are exactly a no-op when the edited image equals the render.

    Occlusion: the residual form normalises the correction by the Gaussian's own weight, so
    without a further factor a Gaussian hidden behind a surface (0.04 px of weight, all of it
    inside the painted area) would take the full correction and the paint would show on the
    object's back; the least-squares form uses f_g > 0 only to select the Gaussians it solves for.
    The factor f_g in [0, 1] is the Gaussian's *meaningful share* of its pixels:

        seen_g = sum_p m_p w_gp / sum_p m_p alpha_gp   (visibility.Visibility.seen)

    the fraction of its own alpha that reaches the image (the alpha-weighted mean transmittance
    T_gp in front of it; w_gp = T_gp alpha_gp), so a faint Gaussian in plain sight counts as
    fully seen and an opaque one behind a surface as ~T.  f_g = 1 when seen_g >= share_full,
    0 when seen_g <= share_min, linear between.  Dense splats of one surface also cover one
    another (T is low under an opaque neighbour even on the front surface), so a Gaussian whose
    weight-averaged depth lies at most `surface_sigmas` x its largest scale behind the rendered
    depth of its pixels belongs to the visible surface and keeps f_g = 1; only Gaussians behind
    the visible surface are faded by their share.  surface_sigmas=None uses the share alone;
    share_min = share_full = 0 turns the factor off (the occlusion-blind back-projection).
    """

    name = "backproject"

    def __init__(
        self,
        *,
        min_support: float = 0.9,
        min_weight: float = 1e-2,
        share_min: float = 0.05,
        share_full: float = 0.25,
        surface_sigmas: float | None = 3.0,
        solve_iters: int = 20,
        solve_prior_px: float = 0.1,
        background=(0.0, 0.0, 0.0),
    ) -> None:
        super().__init__(background=background)
        if (
            isinstance(solve_iters, bool)
            or not isinstance(solve_iters, numbers.Integral)
            or solve_iters < 0
        ):
            raise ValueError(f"solve_iters must be an int >= 0, got {solve_iters!r}")
        if not solve_prior_px >= 0:
            raise ValueError(f"solve_prior_px must be >= 0, got {solve_prior_px}")
        self.solve_iters = int(solve_iters)
        self.solve_prior_px = float(solve_prior_px)
        if not 0.0 <= share_min <= share_full <= 1.0:
            raise ValueError(
                f"need 0 <= share_min <= share_full <= 1, got {share_min} and {share_full}"
            )
        if surface_sigmas is not None and not surface_sigmas >= 0:
            raise ValueError(f"surface_sigmas must be >= 0 or None, got {surface_sigmas}")
        self.min_support = float(min_support)
        self.min_weight = float(min_weight)
        self.share_min = float(share_min)
        self.share_full = float(share_full)
        self.surface_sigmas = None if surface_sigmas is None else float(surface_sigmas)

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "min_support": self.min_support,
            "min_weight": self.min_weight,
            "share_min": self.share_min,
            "share_full": self.share_full,
            "surface_sigmas": self.surface_sigmas,
            "solve_iters": self.solve_iters,
            "solve_prior_px": self.solve_prior_px,
        }

    def share_factor(self, asset, vis: Visibility) -> torch.Tensor:
        """f_g [N] in [0, 1] (see the class docstring)."""
        seen = vis.seen
        if self.share_full > self.share_min:
            f = ((seen - self.share_min) / (self.share_full - self.share_min)).clamp(0.0, 1.0)
        else:
            f = (seen >= self.share_min).to(seen.dtype)
        if self.surface_sigmas is not None:
            extent = self.surface_sigmas * asset.log_scales.detach().amax(-1).exp().to(f)
            f = torch.where((vis.weight > 0) & (vis.depth_gap <= extent), torch.ones_like(f), f)
        return f

    @torch.no_grad()
    def apply(self, asset, views: list[EditView], state: Any):
        s, evidence = gather_signals(asset, views, background=self.background)
        candidate = (
            (s.in_mask_weight >= self.min_weight)
            & (s.support >= self.min_support)
            & (s.residual != 0).any(-1)
        )
        if not bool(candidate.any()):
            return asset, state  # nothing seen or nothing to correct: bit-identical
        if self.share_full == 0.0:  # factor off: every candidate counts as fully seen
            f = torch.ones_like(s.in_mask_weight)
        else:
            vis = visibility(asset, [(ev.view.camera, ev.mask) for ev in evidence], candidate)
            f = self.share_factor(asset, vis)
        selected = candidate & (f > 0)
        if self.solve_iters > 0:
            step = solve_from_evidence(
                asset, evidence, selected, iters=self.solve_iters, prior_px=self.solve_prior_px
            )
            selected = (step != 0).any(-1)
        else:
            step = f[:, None].to(s.residual) * s.residual
        sh = asset.sh.clone()
        sh[:, 0, :] = asset.sh[:, 0, :] + step.to(asset.sh) / SH_C0
        return write_back(asset, selected, sh=sh), state


BANDS = ("dc", "all")


class OptimizeMethod(EditMethod):
    """Per-edit optimisation: Adam on appearance through the differentiable renderer.

    Loss per view = mean over pixels of  m (render - edited)^2 + preserve_weight (1 - m)
    (render - current render)^2: pull the mask toward the edit, hold the rest where it was; plus
    prior_px |change of base colour|^2 per Gaussian (in pixels of weight, as the editor's solve):
    Adam scales every step to the same size, so without it a Gaussian seen through the surface
    with 0.01 px of weight would take the paint colour as fast as a visible one, and show it from
    the back.
    bands="dc" (default) frees only the SH DC term, the view-independent colour, so a recolour
    transfers to other views instead of being fitted into view-dependent bands; "all" frees the
    higher bands too.  Stops after `steps` or `time_budget` seconds, whichever comes first (at
    once if the first step gives no Gaussian a gradient: nothing could ever change then).
    `fit_geometry=True` also frees means, scales, rotations and opacity (to show the damage).
    Only Gaussians that ever received a non-zero gradient are written back; the others keep
    their exact bits.
    `last_run` records what the latest `apply` did: steps taken, seconds, why it stopped.
    """

    name = "optimize"

    def __init__(
        self,
        *,
        steps: int = 500,
        lr: float = 0.05,
        time_budget: float | None = None,
        bands: str = "dc",
        fit_geometry: bool = False,
        preserve_weight: float = 20.0,
        prior_px: float = 0.1,
        background=(0.0, 0.0, 0.0),
    ) -> None:
        super().__init__(background=background)
        if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 0:
            raise ValueError(f"steps must be an int >= 0, got {steps!r}")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if time_budget is not None and not time_budget >= 0:
            raise ValueError(f"time_budget must be >= 0 seconds or None, got {time_budget}")
        if bands not in BANDS:
            raise ValueError(f"bands must be one of {BANDS}, got {bands!r}")
        if not preserve_weight >= 0:
            raise ValueError(f"preserve_weight must be >= 0, got {preserve_weight}")
        if not prior_px >= 0:
            raise ValueError(f"prior_px must be >= 0, got {prior_px}")
        self.steps = int(steps)
        self.lr = float(lr)
        self.time_budget = None if time_budget is None else float(time_budget)
        self.bands = bands
        self.fit_geometry = bool(fit_geometry)
        self.preserve_weight = float(preserve_weight)
        self.prior_px = float(prior_px)
        self.last_run: dict[str, Any] = {}

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "steps": self.steps,
            "lr": self.lr,
            "time_budget": self.time_budget,
            "bands": self.bands,
            "fit_geometry": self.fit_geometry,
            "preserve_weight": self.preserve_weight,
            "prior_px": self.prior_px,
        }

    def apply(self, asset, views: list[EditView], state: Any):
        from splatpainter.render import render

        start = time.perf_counter()
        self.last_run = {"steps": 0, "seconds": 0.0, "stopped_by": "no-op"}
        base = asset.detach()
        targets = []
        with torch.no_grad():
            for v in views:
                cam = v.camera.to(base.device)
                ref = render(base, cam, background=self.background).rgb
                targets.append((cam, v.image.to(ref), effective_mask(v, ref), ref))
        if all(float((m * (e - r).abs().amax(-1)).max()) == 0 for _, e, m, r in targets):
            return asset, state  # nothing to fit: no masked pixel differs from the render
        # The free tensors; the SH DC term is its own leaf, so with bands="dc" the higher
        # bands are the original tensor (bit-exact) and get no gradient.
        free = {"sh_dc": base.sh[:, :1].clone()}
        if self.bands == "all" and base.sh.shape[1] > 1:
            free["sh_rest"] = base.sh[:, 1:].clone()
        if self.fit_geometry:
            for k in ("means", "log_scales", "quats", "opacity_logits"):
                free[k] = getattr(base, k).clone()
        for p in free.values():
            p.requires_grad_(True)

        def current(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            rest = params.get("sh_rest", base.sh[:, 1:])
            out = {k: v for k, v in params.items() if not k.startswith("sh_")}
            out["sh"] = torch.cat([params["sh_dc"], rest], dim=1)
            return out

        pixels = sum(m.numel() for _, _, m, _ in targets) / len(targets)
        touched = torch.zeros(base.num_gaussians, dtype=torch.bool, device=base.device)
        opt = torch.optim.Adam(free.values(), lr=self.lr)
        stopped_by, done = "steps", 0
        for _ in range(self.steps):
            if self.time_budget is not None and time.perf_counter() - start >= self.time_budget:
                stopped_by = "time"
                break
            cur = base.replace(**current(free))
            change = SH_C0 * (free["sh_dc"] - base.sh[:, :1])
            loss = self.prior_px * (change**2).sum() / pixels
            for cam, edited, mask, ref in targets:
                rgb = render(cur, cam, background=self.background).rgb
                m = mask[..., None]
                err = m * (rgb - edited) ** 2 + self.preserve_weight * (1 - m) * (rgb - ref) ** 2
                loss = loss + err.sum() / mask.numel()
            opt.zero_grad(set_to_none=False)
            loss.backward()
            with torch.no_grad():
                got = torch.zeros_like(touched)
                for p in free.values():
                    got |= (p.grad != 0).reshape(p.shape[0], -1).any(-1)
            if done == 0 and not bool(got.any()):
                stopped_by = "no gradient"  # no Gaussian affects the loss: none will ever move
                break
            touched |= got
            opt.step()
            done += 1
        self.last_run = {
            "steps": done,
            "seconds": time.perf_counter() - start,
            "stopped_by": stopped_by,
            "written": int(touched.sum()),
        }
        new = {k: v.detach() for k, v in current(free).items()}
        return write_back(base, touched, **new), state
