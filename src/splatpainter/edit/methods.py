"""Editing methods behind one interface, and the learned one (Stage I + Stage II model).

A method turns (asset, edit views, state) into (new asset, new state).  `state` is whatever the
method carries across edits (None for the stateless baselines); the session snapshots it per
history entry, so undo/redo restore it along with the asset, and saves it in session files.

Every method writes back only the Gaussians it means to change (`torch.where` on a per-Gaussian
selection), so Gaussians it does not touch keep their exact bits.
"""

from __future__ import annotations

from typing import Any

import torch

from splatpainter.edit.signals import gather_signals
from splatpainter.edit.views import EditView
from splatpainter.model.stage1 import SH_C0, Stage1Latent
from splatpainter.model.stage2 import EditSample
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


class ModelMethod(EditMethod):
    """The SplatPainter editor: Stage I latent (once per asset) + Stage II with TTT state."""

    name = "model"

    def __init__(self, model, *, background=(0.0, 0.0, 0.0)) -> None:
        super().__init__(background=background)
        self.model = model.eval()

    def initial_state(self, asset) -> dict[str, Any]:
        latent = self.model.encode_asset(asset)
        return {"fast": [f.detach() for f in self.model.stage2.init_state(1)], "latent": latent}

    def reset_state(self, asset, state: dict[str, Any]) -> dict[str, Any]:
        # The latent is a function of the (fixed) geometry and is kept; the fast weights reset.
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
        }

    @torch.no_grad()
    def apply(self, asset, views: list[EditView], state: dict[str, Any]):
        signals, evidence = gather_signals(asset, views, background=self.background)
        if not any(bool(ev.mask.any()) for ev in evidence):
            # Nothing marked as edited: the network would gate every delta to zero and leave the
            # fast weights untouched (all token weights are zero), so skip the work.
            return asset, state
        latent: Stage1Latent = state["latent"]
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
        sample = EditSample(
            latent=latent, views=pix, signals=signals, colors=0.5 + SH_C0 * asset.sh[:, 0, :]
        )
        deltas, fast = self.model.stage2([sample], state["fast"])
        d = deltas[0]
        selected = d["gate"] > 0
        sh = asset.sh.clone()
        sh[:, 0, :] = asset.sh[:, 0, :] + d["sh_dc"]
        if "sh_rest" in d and asset.sh.shape[1] > 1:
            k = asset.sh.shape[1] - 1
            sh[:, 1:, :] = asset.sh[:, 1:, :] + d["sh_rest"][:, :k, :]
        new = {"sh": sh}
        if "opacity_logits" in d:
            new["opacity_logits"] = asset.opacity_logits + d["opacity_logits"]
        out = write_back(asset, selected, **new)
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
