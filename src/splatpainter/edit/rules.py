"""The strongest editors that use no learning: the hand-written fits alone, and a spatial diffusion.

An evaluation that wants to show what the trained editor's weights are worth has to compare it
with what one gets without them.  Both methods here read the edit exactly as the model does
(`gather_signals` with the model's `SignalSettings`, then `edit_hypotheses`: the seen Gaussians'
solved change, an affine recolour map, a Lambertian shading) and then decide by fixed rules:

- `RuleMethod` ("rule"): spread by colour.  recolour = the affine map on every Gaussian whose
  colour bin was mostly changed where seen (`color_bin_stats` share > 0.5) and that the views
  do not clearly show unchanged, plus the solved change on the other seen Gaussians that
  changed; relight = the fitted shading on every Gaussian; paint / detail = the solved change
  on the seen Gaussians only.
- `DiffusionMethod` ("diffusion"): spread by space.  A label diffuses over a fixed k-NN affinity
  (weights exp(-d^2 / sigma^2), sigma = the median neighbour distance), seeded 1 on the seen
  Gaussians that changed and clamped to 0 on the seen ones that did not; unseen Gaussians above
  0.5 (the seeds included) take the fitted map (affine or shading, chosen as the rule chooses;
  none for local kinds), the other seen ones that changed take their solved change.

In "auto" (what users run) the kind is decided from the evidence alone (`decide_kind`); given a
kind hint both use it.  A colour map applies to every SH band (`apply_color_delta`'s rest map:
the affine map's linear part for a recolour, shade x I for a relight), so highlights in higher
bands follow the new colour.  Both are stateless and exact no-ops when no edit pixel differs
from the render.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from splatpainter.assets.gaussians import sh_dc_to_rgb
from splatpainter.edit.methods import EditMethod, apply_color_delta
from splatpainter.edit.signals import gather_signals
from splatpainter.edit.views import EditView
from splatpainter.model.hypotheses import CHANGE_TAU
from splatpainter.model.stage1 import Stage1Config
from splatpainter.model.stage2 import EDIT_HINTS, LOCAL_HINTS, SignalSettings, hint_maps

# What the rules use when no model says otherwise: a short least-squares solve with a light
# prior, and both colour maps fitted to the views' pixels (map_solves: the seen Gaussians of a
# recolour or relight on the solve centred on the map, evaluate's diffusion_centred).
DEFAULT_SETTINGS = SignalSettings(solve_iters=6, solve_prior_px=0.01, fit_maps=True)
BIN_SHARE = 0.5  # a colour bin spreads a recolour when more than this share of it changed
# A Gaussian is clearly seen with this much in-mask compositing weight, in pixels of a 128x128
# view (faint ones behind a surface have ~0.04): only clearly seen ones count as evidence of
# "unchanged".
SEEN_PX = 0.5
REFERENCE_VIEW_PIXELS = 128 * 128
FIT_EXPLAINS = 0.5  # a map explains the change if it leaves less than this share of its RMS
MOST_CHANGED = 0.5  # "most of the view changed": a global edit
MIN_SINGULAR = 0.1  # a recolour keeps colours apart; a solid paint maps them all to one
KNN = 10
DIFFUSION_STEPS = 150


@dataclass
class EditFit:
    """What the views say about one edit, and the maps fitted to it."""

    kind: str  # "paint", "recolor", "relight" or "detail" (decided or given)
    seen_delta: torch.Tensor  # [N, 3] the solved change (zero where no masked pixel shows it)
    seen: torch.Tensor  # [N] bool: clearly seen in the masked pixels
    changed: torch.Tensor  # [N] bool: seen and their solved change is not negligible
    cand_affine: torch.Tensor  # [N, 3] the affine recolour's delta on every Gaussian
    cand_shade: torch.Tensor  # [N, 3] the shading's delta on every Gaussian
    # [N, 3] each map's delta as applied: on the seen Gaussians the solve centred on the map
    # (`hypotheses.with_seen_solve`), elsewhere the map's
    apply_affine: torch.Tensor
    apply_shade: torch.Tensor
    linear: torch.Tensor  # [3, 3] the affine map's linear part on a colour column vector
    rest_linear: torch.Tensor  # [3, 3] or [N, 3, 3] the recolour's SH-band maps (see fit_edit)
    shade: torch.Tensor  # [N] the shading factor
    bin_share: torch.Tensor  # [N] changed share of the seen weight of each colour bin (-1: none)


_NORMALS: dict[str, torch.Tensor] = {}  # the last few assets' normals (a session edits one)


def _normals(asset, stage1: Stage1Config) -> torch.Tensor:
    """Oriented normals as the model's Stage I computes them (its normal views vote); computed
    once per asset content and view settings, like the model's Stage I cache."""
    from splatpainter.model.stage1 import asset_content_hash, asset_normals

    key = f"{asset_content_hash(asset)}:{stage1.normal_views}:{stage1.normal_view_size}"
    if key not in _NORMALS:
        while len(_NORMALS) >= 4:
            _NORMALS.pop(next(iter(_NORMALS)))
        _NORMALS[key] = asset_normals(asset, stage1)
    return _NORMALS[key]


def fit_edit(
    asset,
    views: list[EditView],
    *,
    kind: str = "auto",
    settings: SignalSettings = DEFAULT_SETTINGS,
    stage1: Stage1Config | None = None,
    background=(0.0, 0.0, 0.0),
) -> EditFit | None:
    """Gather the signals and fit the hypotheses; None when no masked pixel differs from the
    render (nothing to do)."""
    from splatpainter.model.hypotheses import (
        edit_hypotheses,
        fit_affine,
        fit_shading,
        recolor_band_maps,
        shading_factor,
        with_seen_solve,
    )

    need_shading = kind in ("auto", "relight")
    normals = _normals(asset, stage1 or Stage1Config()) if need_shading else None
    maps = hint_maps(kind) if settings.fit_maps else ()
    s, _ = gather_signals(
        asset,
        views,
        background=background,
        solve_iters=settings.solve_iters,
        solve_prior_px=settings.solve_prior_px,
        normals=normals,
        fit_maps=maps,
        map_solves=settings.map_solves,
    )
    if float((s.in_mask_weight * s.abs_residual).sum()) == 0.0:
        return None
    a = asset.detach()
    colors = sh_dc_to_rgb(a.sh[:, 0, :], clamp=False)
    if normals is None:
        normals = torch.zeros_like(colors)
    normals = normals.to(colors)
    seen_delta = s.residual if s.solved is None else s.solved
    cand, stats, bins = edit_hypotheses(
        colors,
        seen_delta,
        s.abs_residual,
        s.in_mask_weight,
        s.support,
        s.total_weight(),
        normals,
        affine=s.affine,
        shading=s.shading,
        hsv=s.hsv,
    )
    w = s.in_mask_weight * s.support
    aff = fit_affine(colors, colors + seen_delta, w) if s.affine is None else s.affine.to(colors)
    if s.shading is None:
        amb, dif, light = fit_shading(colors, colors + seen_delta, normals, w)
    else:
        amb, dif, light = (t.to(colors) for t in s.shading)
    shade = shading_factor((amb, dif, light), normals)
    area = sum(int(v.camera.width) * int(v.camera.height) for v in views) / max(len(views), 1)
    seen = s.in_mask_weight * (REFERENCE_VIEW_PIXELS / max(area, 1.0)) >= SEEN_PX
    changed = (s.in_mask_weight > 0) & (seen_delta.abs().amax(-1) > CHANGE_TAU)
    fit = EditFit(
        kind=kind,
        seen_delta=seen_delta,
        seen=seen,
        changed=changed,
        cand_affine=cand[:, 1],
        cand_shade=cand[:, 2],
        apply_affine=with_seen_solve(cand[:, 1], s.in_mask_weight, s.solved_affine),
        apply_shade=with_seen_solve(cand[:, 2], s.in_mask_weight, s.solved_shading),
        linear=aff[:3].T.contiguous(),
        rest_linear=recolor_band_maps(colors, aff, s.hsv, seen_delta, w).contiguous(),
        shade=shade,
        bin_share=bins[:, 0],
    )
    if kind == "auto":
        fit.kind = decide_kind(fit, w, float(stats[0]))
    return fit


def decide_kind(fit: EditFit, w: torch.Tensor, changed_share: float) -> str:
    """The edit kind from the evidence alone: which map explains the seen change best.

    On the seen Gaussians that changed (weighted by their in-mask share), the RMS error of the
    shading's and the affine map's deltas against the solved change is compared with the RMS of
    the change itself.  relight: the shading explains it (error below FIT_EXPLAINS of it), better
    than the affine map, and most of the view changed.  recolor: the affine map explains it and
    either most of the view changed (a global recolour) or the map keeps colours apart (its
    smallest singular value is above MIN_SINGULAR; a solid paint maps every colour to one).
    Otherwise a local edit ("paint": only what the views show moves)."""
    wc = w * fit.changed.to(w.dtype)
    total = float(wc.sum())
    if total <= 0.0:
        return "paint"

    def rms(delta: torch.Tensor) -> float:
        return math.sqrt(float((((delta - fit.seen_delta) ** 2).sum(-1) * wc).sum()) / total)

    size = rms(torch.zeros_like(fit.seen_delta))
    err_aff, err_shade = rms(fit.cand_affine), rms(fit.cand_shade)
    most = changed_share > MOST_CHANGED
    if err_shade < FIT_EXPLAINS * size and err_shade < err_aff and most:
        return "relight"
    if err_aff < FIT_EXPLAINS * size:
        spread = float(torch.linalg.svdvals(fit.linear.double()).min())
        if most or spread > MIN_SINGULAR:
            return "recolor"
    return "paint"


def _identity_maps(n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.eye(3, dtype=like.dtype, device=like.device).expand(n, 3, 3).clone()


def apply_fit(asset, fit: EditFit, reach: torch.Tensor):
    """The edited asset: the Gaussians in `reach` [N] (those a spreading rule selected) take the
    fitted map of the kind, the other seen Gaussians that changed their solved change (the
    solve smears a change onto overlapping neighbours, so where the map applies it is the
    better estimate); local kinds move only what the views show."""
    n = fit.seen_delta.shape[0]
    eye = _identity_maps(n, fit.seen_delta)
    zero = torch.zeros_like(fit.seen_delta)
    if fit.kind == "relight":
        cand, rest = fit.apply_shade, fit.shade[:, None, None] * eye
    elif fit.kind == "recolor":
        cand, rest = fit.apply_affine, fit.rest_linear.expand(n, 3, 3)
    else:
        reach = torch.zeros_like(reach)
        cand, rest = zero, eye
    solved = fit.changed & ~reach
    delta = torch.where(reach[:, None], cand, torch.where(solved[:, None], fit.seen_delta, zero))
    # the solved change of a recoloured or relit Gaussian maps its higher bands too
    mapped = reach | (solved & (fit.kind not in LOCAL_HINTS))
    return apply_color_delta(asset, delta, torch.where(mapped[:, None, None], rest, eye))


class FitMethod(EditMethod):
    """Shared parameters of the no-learning editors (stateless)."""

    def __init__(
        self,
        *,
        kind: str = "auto",
        settings: SignalSettings = DEFAULT_SETTINGS,
        stage1: Stage1Config | None = None,
        background=(0.0, 0.0, 0.0),
    ) -> None:
        super().__init__(background=background)
        if kind not in EDIT_HINTS:
            raise ValueError(f"unknown edit kind {kind!r}; use one of {', '.join(EDIT_HINTS)}")
        self.kind = kind
        self.settings = settings
        self.stage1 = stage1 or Stage1Config()

    def describe(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            **super().describe(),
            "settings": asdict(self.settings),
            "normal_views": [self.stage1.num_views, self.stage1.view_size],
        }

    def fit(self, asset, views: list[EditView]) -> EditFit | None:
        return fit_edit(
            asset,
            views,
            kind=self.kind,
            settings=self.settings,
            stage1=self.stage1,
            background=self.background,
        )


class RuleMethod(FitMethod):
    """The hand-written fits with no network: spread a recolour by colour (see the module)."""

    name = "rule"

    @torch.no_grad()
    def apply(self, asset, views: list[EditView], state: Any):
        fit = self.fit(asset, views)
        if fit is None:
            return asset, state
        if fit.kind == "relight":
            reach = torch.ones_like(fit.changed)
        elif fit.kind == "recolor":
            reach = (fit.bin_share > BIN_SHARE) & ~(fit.seen & ~fit.changed)
        else:
            reach = torch.zeros_like(fit.changed)
        return apply_fit(asset, fit, reach), state


def diffuse_labels(
    points: torch.Tensor,
    ones: torch.Tensor,
    zeros: torch.Tensor,
    *,
    k: int = KNN,
    steps: int = DIFFUSION_STEPS,
) -> torch.Tensor:
    """Label [N] in [0, 1] diffused over the k-NN graph of `points` from the Gaussians `ones`
    (held at 1) and `zeros` (held at 0; `ones` wins where both).  Each step replaces a free
    label by the affinity-weighted mean of its neighbours', exp(-d^2 / sigma^2) with sigma the
    median neighbour distance; parts the graph does not connect to a seed stay at exactly 0."""
    from splatpainter.model.graph import knn

    x = ones.to(points.dtype)
    n = int(points.shape[0])
    if n < 2 or not bool(ones.any()):
        return x
    idx, dist = knn(points.detach(), min(k, n - 1))
    pos = dist[dist > 0]
    sigma = float(pos.median()) if pos.numel() else 1.0
    w = torch.exp(-((dist / sigma) ** 2))
    w = w / w.sum(1, keepdim=True).clamp_min(1e-30)
    fixed = ones | zeros
    seed = x.clone()
    for _ in range(steps):
        x = torch.where(fixed, seed, (w * x[idx]).sum(1))
    return x


class DiffusionMethod(FitMethod):
    """Spread the edit by spatial diffusion over a k-NN graph (see the module docstring)."""

    name = "diffusion"

    def __init__(self, *, k: int = KNN, steps: int = DIFFUSION_STEPS, **kw: Any) -> None:
        super().__init__(**kw)
        if k < 1 or steps < 0:
            raise ValueError(f"need k >= 1 and steps >= 0, got k={k}, steps={steps}")
        self.k = int(k)
        self.steps = int(steps)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "k": self.k, "steps": self.steps}

    @torch.no_grad()
    def apply(self, asset, views: list[EditView], state: Any):
        fit = self.fit(asset, views)
        if fit is None:
            return asset, state
        reach = torch.zeros_like(fit.changed)
        if fit.kind not in LOCAL_HINTS:
            label = diffuse_labels(
                asset.means, fit.changed, fit.seen & ~fit.changed, k=self.k, steps=self.steps
            )
            reach = label > 0.5  # the seen unchanged ones are held at 0
        return apply_fit(asset, fit, reach), state
