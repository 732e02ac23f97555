"""Editing methods behind one interface, and the learned one (Stage I + Stage II model).

A method turns (asset, edit views, state) into (new asset, new state).  `state` is whatever the
method carries across edits (None for the stateless baselines); the session snapshots it per
history entry, so undo/redo restore it along with the asset, and saves it in session files.

Every method writes back only the Gaussians it means to change (`torch.where` on a per-Gaussian
selection), so Gaussians it does not touch keep their exact bits.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from splatpainter.assets.gaussians import SH_C0, map_sh_bands, sh_dc_to_rgb
from splatpainter.edit.signals import gather_signals
from splatpainter.edit.views import EditView
from splatpainter.model import restricted
from splatpainter.model.restricted import can_restrict, chunked_forward, local_forward
from splatpainter.model.stage1 import Stage1Latent
from splatpainter.model.stage2 import (
    EDIT_HINTS,
    EditSample,
    SignalSettings,
    edit_reading,
    hint_maps,
)
from splatpainter.model.ttt import FastWeights


class EditMethod:
    """Base class: subclasses implement `apply`; stateful ones also `initial_state`."""

    name = "base"

    def __init__(self, *, background: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> None:
        self.background = tuple(float(b) for b in background)

    def initial_state(self, asset) -> Any:
        return None

    def reset_state(self, asset, state: Any) -> Any:
        return self.initial_state(asset)

    def apply(self, asset, views: list[EditView], state: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """Name and parameters (stored in session files and checked on load)."""
        return {"name": self.name, "background": list(self.background)}

    def state_to_dict(self, state: Any) -> Any:
        return None

    def state_from_dict(self, d: Any, device: torch.device | str = "cpu") -> Any:
        return None


def write_back(asset, selected: torch.Tensor, **new: torch.Tensor):
    """Asset with attributes `new` taken only where `selected` [N] is True (others bit-exact)."""
    changes = {}
    for name, value in new.items():
        old = getattr(asset, name)
        sel = selected.view(-1, *([1] * (old.dim() - 1)))
        changes[name] = torch.where(sel, value.to(old.dtype), old)
    return asset.replace(**changes)


def normalized_plucker(camera, center: torch.Tensor, extent: torch.Tensor) -> torch.Tensor:
    """Plücker rays [H, W, 6] in the asset's normalised frame (origin at centre, unit cube)."""
    origins, dirs = camera.pixel_rays()
    o = (origins.to(center) - center) / extent
    d = dirs.to(center)
    return torch.cat([d, torch.linalg.cross(o, d, dim=-1)], dim=-1)


REFERENCE_VIEW_PIXELS = 128 * 128


def build_edit_sample(
    asset,
    views: list[EditView],
    latent: Stage1Latent,
    *,
    hint: str = "auto",
    background=(0.0, 0.0, 0.0),
    settings: SignalSettings = SignalSettings(),
    fit_maps: tuple[str, ...] | None = None,
) -> EditSample:
    """Render the edit views against the asset and assemble Stage II's input (no gradients).

    fit_maps: the colour maps to fit to the views' pixels when settings.fit_maps (default:
    those the hint can use, as in training); the others are fitted to the solved change."""
    if fit_maps is None:
        fit_maps = hint_maps(hint) if settings.fit_maps else ()
    signals, evidence = gather_signals(
        asset,
        views,
        background=background,
        solve_iters=settings.solve_iters,
        solve_prior_px=settings.solve_prior_px,
        normals=latent.normals,
        fit_maps=fit_maps,
        map_solves=settings.map_solves,
    )
    vox = latent.vox
    pix = []
    for ev in evidence:
        edited = ev.view.image.to(ev.render)
        plk = normalized_plucker(ev.view.camera.to(asset.device), vox.center, vox.extent)
        pix.append(
            torch.cat(
                [edited, ev.render, edited - ev.render, plk.to(edited), ev.mask[..., None]],
                dim=-1,
            )
        )
    # Compositing weights are in pixels, so they grow with the view's resolution; the editor was
    # trained on 128x128 views, so weights are expressed in pixels of a view of that size.
    area = sum(int(v.camera.width) * int(v.camera.height) for v in views) / max(len(views), 1)
    scale = REFERENCE_VIEW_PIXELS / area if area > 0 else 1.0
    if scale != 1.0:
        signals = dataclasses.replace(
            signals,
            in_mask_weight=signals.in_mask_weight * scale,
            weight=None if signals.weight is None else signals.weight * scale,
        )
    return EditSample(
        latent=latent,
        views=pix,
        signals=signals,
        colors=sh_dc_to_rgb(asset.sh[:, 0, :], clamp=False),
        hint=hint,
    )


# Half an 8-bit level: where an edit moves a Gaussian's colour by less than this in every view
# direction and colour channel, no pixel of any render moves by as much (a pixel is a convex
# combination of colours, the colour clamp is 1-Lipschitz), and the Gaussian keeps its bits.  Under
# "auto" a stroke otherwise nudged 25-60% of an asset's Gaussians by under 1e-3, which a session
# would accumulate, write to files and send to the browser as deltas.  ROUNDING_ROOM keeps
# float32 renders under the level.
IMPERCEPTIBLE = 0.5 / 255
ROUNDING_ROOM = 1e-6
WRITE_BACK_ROWS = 1 << 17  # Gaussians whose new SH apply_color_delta holds at once


def sh_rest_norm_bound(degree: int) -> float:
    """max over unit directions d of ||(Y_lm(d)) for 1 <= l <= degree||_2, for the real SH
    basis: the addition theorem gives sum_m Y_lm(d)^2 = (2l + 1) / (4 pi) whatever d."""
    return math.sqrt(sum(2 * el + 1 for el in range(1, degree + 1)) / (4 * math.pi))


def colour_change_bound(old_sh: torch.Tensor, new_sh: torch.Tensor) -> torch.Tensor:
    """[R] an upper bound, over view directions and colour channels, of how far each Gaussian's
    view-dependent colour moves from SH [R, K, 3] old_sh to new_sh (Cauchy-Schwarz on the bands;
    in their dtype: float32 rounds it by a few 1e-7 of itself, inside ROUNDING_ROOM)."""
    bound = SH_C0 * (new_sh[:, 0] - old_sh[:, 0]).abs()
    if new_sh.shape[1] > 1:
        degree = math.isqrt(new_sh.shape[1]) - 1
        bound = bound + sh_rest_norm_bound(degree) * (new_sh[:, 1:] - old_sh[:, 1:]).norm(dim=1)
    return bound.amax(-1)


def apply_color_delta(
    asset,
    rgb_delta: torch.Tensor,
    rest_map: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
    *,
    min_change: float = IMPERCEPTIBLE,
):
    """Add a base-colour delta [N, 3] to SH DC and map the higher SH bands by `rest_map`
    [N, 3, 3] (rest'[n, k] = rest_map[n] @ rest[n, k]: a linear colour map applies to every band,
    a shading scales the view-dependent terms too).  A Gaussian keeps its bits where its colour
    would move by less than `min_change` in every direction (`colour_change_bound`;
    IMPERCEPTIBLE; 0: wherever its delta is zero and its map the identity).

    rows [R] (optional): the deltas and maps are those of these Gaussians only (the others'
    are zero / the identity); the work is then per changed Gaussian, plus one copy of sh."""
    if rows is None:
        moved = (rgb_delta != 0).any(-1)
        if rest_map is not None:
            eye = torch.eye(3, dtype=rest_map.dtype, device=rest_map.device)
            moved = moved | (rest_map != eye).flatten(1).any(-1)
        rows = moved.nonzero().flatten()
        rgb_delta = rgb_delta[rows]
        rest_map = None if rest_map is None else rest_map[rows]
    kept_rows, kept_sh = [], []
    for lo in range(0, rows.numel(), WRITE_BACK_ROWS):  # a block at a time: bounded memory
        block = slice(lo, lo + WRITE_BACK_ROWS)
        old = asset.sh[rows[block]]
        new = old.clone()
        new[:, 0, :] = old[:, 0, :] + (rgb_delta[block] / SH_C0).to(old)
        if rest_map is not None and asset.sh.shape[1] > 1:
            new[:, 1:, :] = map_sh_bands(old[:, 1:, :], rest_map[block])
        bound = colour_change_bound(old, new)
        moved = bound >= min_change - ROUNDING_ROOM if min_change > 0 else bound > 0
        kept_rows.append(rows[block][moved])
        kept_sh.append(new[moved])
    kept = torch.cat(kept_rows) if kept_rows else rows
    if kept.numel() == 0:
        return asset
    sh = asset.sh.clone()
    sh[kept] = torch.cat(kept_sh)
    return asset.replace(sh=sh)


def moved(before, after) -> torch.Tensor:
    """[N] bool: the Gaussians whose colours (any SH band) `after` changed."""
    if after is before:
        return torch.zeros(before.num_gaussians, dtype=torch.bool, device=before.sh.device)
    return (after.sh != before.sh).flatten(1).any(1)


class ModelMethod(EditMethod):
    """The SplatPainter editor: Stage I latent (once per asset) + Stage II with TTT state.

    kind: the edit-kind hint (one of EDIT_HINTS; "auto" lets the model infer it).
    refresh_latent: re-encode Stage I after every edit, so the latent sees the edited colours
    (costs one Stage I pass per edit; off by default, as in training, where the latent is the
    source asset's).
    reading: how the model read the last edit it applied (`stage2.edit_reading`: the kind it
    took it for, the shares, how far it moved beyond the mask; None for a local kind, which
    moves only what the mask shows, or when nothing was asked), for the command line's and the
    browser's report.
    """

    name = "model"

    def __init__(
        self, model, *, kind: str = "auto", refresh_latent: bool = False, background=(0.0, 0.0, 0.0)
    ) -> None:
        super().__init__(background=background)
        if kind not in EDIT_HINTS:
            raise ValueError(f"unknown edit kind {kind!r}; use one of {', '.join(EDIT_HINTS)}")
        self.model = model.eval()
        self.kind = kind
        self.refresh_latent = bool(refresh_latent)
        self.reading: dict[str, Any] | None = None

    def initial_state(self, asset) -> dict[str, Any]:
        latent = self.model.encode_asset(asset)
        return {"fast": [f.detach() for f in self.model.stage2.init_state(1)], "latent": latent}

    def reset_state(self, asset, state: dict[str, Any]) -> dict[str, Any]:
        # The latent depends on the asset, not on the edit history; the fast weights reset.
        return {
            "fast": [f.detach() for f in self.model.stage2.init_state(1)],
            "latent": state["latent"],
        }

    def describe(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            **super().describe(),
            "config": asdict(self.model.config),
            "weights": self.model.weights_fingerprint(),
            "refresh_latent": self.refresh_latent,  # the kind hint may change between edits
        }

    @torch.no_grad()
    def apply(self, asset, views: list[EditView], state: dict[str, Any]):
        latent: Stage1Latent = state["latent"]
        sample = build_edit_sample(
            asset,
            views,
            latent,
            hint=self.kind,
            background=self.background,
            settings=self.model.stage2.config.signal_settings(),
        )
        self.reading = None
        if float(sample.signals.evidence(self.model.stage2.config.evidence_tau)) == 0.0:
            # Nothing seen or nothing changed: every delta would be exactly zero; the fast
            # weights stay as they were too.
            return asset, state
        seen = sample.signals.in_mask_weight > 0
        if can_restrict(self.model.stage2, sample):
            # A local kind moves only touched Gaussians: Stage II runs on them and the part of
            # the graph they depend on (model/restricted.py; the same numbers as the full pass).
            local, fast = local_forward(self.model.stage2, sample, state["fast"])
            out = apply_color_delta(asset, local.rgb, local.rest_map, rows=local.rows)
        elif asset.num_gaussians > restricted.HEAD_ROWS:
            # At capture scale the head runs in chunks of Gaussians (its inputs took 1.9 GB
            # at once at 1M); the same numbers as the full pass.
            delta, fast = chunked_forward(self.model.stage2, sample, state["fast"])
            out = apply_color_delta(asset, delta["rgb"], delta["rest_map"])
            self.reading = edit_reading(delta["gate"], delta["mix"], seen, moved(asset, out))
        else:
            deltas, fast = self.model.stage2([sample], state["fast"])
            d = deltas[0]
            out = apply_color_delta(asset, d["rgb"], d["rest_map"])
            self.reading = edit_reading(d["gate"], d["mix"], seen, moved(asset, out))
        if self.refresh_latent:
            latent = self.model.encode_asset(out)
        return out, {"fast": [f.detach() for f in fast], "latent": latent}

    def state_to_dict(self, state: dict[str, Any]) -> dict[str, Any]:
        return {
            "fast": [f.to_dict() for f in state["fast"]],
            "latent": state["latent"].to_dict(),
        }

    def state_from_dict(self, d: dict[str, Any], device: torch.device | str = "cpu"):
        return {
            "fast": [FastWeights.from_dict(f, device) for f in d["fast"]],
            "latent": Stage1Latent.from_dict(d["latent"], device),
        }
