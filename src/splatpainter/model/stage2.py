"""Stage II: the editor.  Voxel tokens + edit-view tokens -> appearance deltas, with TTT state.

Each block:  voxel self-attention  ->  TTT layer  ->  MLP.  In the TTT layer the fast weights are
first *updated* with the edit-view tokens (patches of [edited RGB, current render, residual,
Plücker rays, mask]) and then *applied* to the voxel tokens; the updated fast weights are the
state that carries over to the next edit.

Per-Gaussian heads read (voxel token, Stage I Gaussian feature, current colour, edit signals) and
predict deltas to SH DC (optionally higher bands and opacity); geometry is never touched.

Identity preservation is structural, not learned.  Every delta is multiplied by a gate

    gate_g = support_g * clamp(absres_g / residual_tau, 0, 1)

where support_g is the fraction of Gaussian g's compositing weight (over the edit views) that lands
inside the edit mask and absres_g the weight-averaged |edited - render| there (both from the
renderer, see `splatpainter.edit.signals`).  A camera that sees none of the asset gives support 0,
an edit equal to the current render gives absres 0: in both cases every delta is exactly zero.
Gaussians below `min_weight` / `support_min` are gated to zero as well.  With
`delta_scope="global"` (recolour/relight) the gate becomes one scalar, the largest per-Gaussian
gate, so unseen Gaussians may change too, yet the two no-op cases stay exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from splatpainter.model.layers import MLP, SelfAttention, fourier_encode, segment_mean
from splatpainter.model.stage1 import MAX_SH_REST, SH_C0, Stage1Latent
from splatpainter.model.ttt import FastWeights, TTTConfig, TTTLayer

# Channels of an edit-view pixel: edited rgb, render rgb, residual rgb, Plücker (6), mask.
VIEW_CHANNELS = 3 + 3 + 3 + 6 + 1
SIGNAL_DIM = 3 + 1 + 1  # residual rgb, |residual|, support


@dataclass
class Stage2Config:
    """Sizes and options of the Stage II editor."""

    dim: int = 128
    num_blocks: int = 3
    num_heads: int = 4
    mlp_ratio: int = 2
    ttt_hidden_ratio: int = 2
    ttt_heads: int = 4
    ns_steps: int = 5
    damping: float = 0.0  # TTT anchor damping for long edit sequences (0 = off)
    patch_size: int = 8
    fourier_freqs: int = 6
    head_hidden: int = 64
    gauss_feat_dim: int = 32  # must match Stage I
    predict_sh_rest: bool = False
    predict_opacity: bool = False
    backproject_skip: bool = True  # delta_dc includes gain * residual / C0 (gain learned, init 1)
    delta_scope: str = "visible"  # "visible" | "global"
    residual_tau: float = 0.01  # |residual| at which the gate saturates (colour units)
    support_min: float = 0.5  # Gaussians with less of their weight inside the mask stay fixed
    min_weight: float = 1e-3  # ... and so do those with less absolute in-mask weight (pixels)

    def __post_init__(self) -> None:
        if self.delta_scope not in ("visible", "global"):
            raise ValueError(f"delta_scope must be 'visible' or 'global', got {self.delta_scope!r}")
        if self.dim % self.num_heads or self.dim % self.ttt_heads:
            raise ValueError(f"dim {self.dim} must be divisible by num_heads and ttt_heads")
        if self.patch_size < 1:
            raise ValueError("patch_size must be >= 1")

    def ttt_config(self) -> TTTConfig:
        return TTTConfig(
            dim=self.dim,
            num_heads=self.ttt_heads,
            hidden_ratio=self.ttt_hidden_ratio,
            ns_steps=self.ns_steps,
            damping=self.damping,
        )


@dataclass
class GaussianSignals:
    """Per-Gaussian edit evidence gathered from the edit views (see edit/signals.py)."""

    residual: torch.Tensor  # [N, 3] weighted mean (edited - render) inside the mask
    abs_residual: torch.Tensor  # [N] weighted mean of max-channel |edited - render|
    support: torch.Tensor  # [N] in-mask weight / total weight over the edit views
    in_mask_weight: torch.Tensor  # [N] absolute in-mask compositing weight (pixels)

    def as_features(self) -> torch.Tensor:
        return torch.cat([self.residual, self.abs_residual[:, None], self.support[:, None]], dim=-1)


@dataclass
class EditSample:
    """Everything Stage II needs for one asset and one edit (one or several views)."""

    latent: Stage1Latent
    views: list[torch.Tensor]  # each [H, W, VIEW_CHANNELS]
    signals: GaussianSignals
    colors: torch.Tensor  # [N, 3] current base colours (0.5 + C0 * sh_dc)


def patchify(img: torch.Tensor, p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[H, W, C] -> tokens [T, p*p*C] (zero-padded to a multiple of p) and mask coverage [T]."""
    h, w, c = img.shape
    ph, pw = -h % p, -w % p
    x = F.pad(img.permute(2, 0, 1), (0, pw, 0, ph)).permute(1, 2, 0)
    hh, ww = (h + ph) // p, (w + pw) // p
    x = x.reshape(hh, p, ww, p, c).permute(0, 2, 1, 3, 4).reshape(hh * ww, p * p * c)
    cover = x.view(hh * ww, p * p, c)[..., -1].mean(-1)  # last channel is the mask
    return x, cover


class EditorBlock(nn.Module):
    """Voxel self-attention -> TTT (update with edit tokens, apply to voxels) -> MLP."""

    def __init__(self, cfg: Stage2Config) -> None:
        super().__init__()
        self.norm_attn = nn.LayerNorm(cfg.dim)
        self.attn = SelfAttention(cfg.dim, cfg.num_heads)
        self.norm_edit = nn.LayerNorm(cfg.dim)
        self.norm_ttt = nn.LayerNorm(cfg.dim)
        self.ttt = TTTLayer(cfg.ttt_config())
        self.norm_mlp = nn.LayerNorm(cfg.dim)
        self.mlp = MLP(cfg.dim, cfg.mlp_ratio * cfg.dim, cfg.dim)

    def forward(
        self,
        x: torch.Tensor,
        voxel_mask: torch.Tensor,
        edit_tokens: torch.Tensor,
        edit_weight: torch.Tensor,
        state: FastWeights,
    ) -> tuple[torch.Tensor, FastWeights]:
        x = x + self.attn(self.norm_attn(x), voxel_mask)
        state = self.ttt.update(state, self.norm_edit(edit_tokens), edit_weight)
        x = x + self.ttt.apply(state, self.norm_ttt(x))
        x = x + self.mlp(self.norm_mlp(x))
        return x, state


class Stage2Editor(nn.Module):
    """The editing network (batched over assets; the session uses batch 1)."""

    def __init__(self, config: Stage2Config, latent_dim: int) -> None:
        super().__init__()
        self.config = config
        c = config
        self.voxel_in = nn.Linear(latent_dim, c.dim)
        self.voxel_pos = nn.Linear(3 * 2 * c.fourier_freqs, c.dim)
        self.voxel_sig = nn.Linear(SIGNAL_DIM, c.dim)
        self.edit_in = nn.Linear(c.patch_size**2 * VIEW_CHANNELS, c.dim)
        self.blocks = nn.ModuleList(EditorBlock(c) for _ in range(c.num_blocks))
        self.norm_out = nn.LayerNorm(c.dim)
        self.out_dim = 3 + (3 * MAX_SH_REST if c.predict_sh_rest else 0) + int(c.predict_opacity)
        self.head = MLP(c.dim + c.gauss_feat_dim + 3 + SIGNAL_DIM, c.head_hidden, self.out_dim)
        nn.init.normal_(self.head.fc2.weight, std=0.01)
        nn.init.zeros_(self.head.fc2.bias)
        self.bp_gain = nn.Parameter(torch.ones(())) if c.backproject_skip else None

    def init_state(self, batch: int = 1) -> list[FastWeights]:
        return [blk.ttt.init_state(batch) for blk in self.blocks]

    def gate(self, s: GaussianSignals) -> torch.Tensor:
        """Per-Gaussian delta gate in [0, 1]; exactly 0 where the edit gives no evidence."""
        c = self.config
        g = s.support * torch.clamp(s.abs_residual / c.residual_tau, 0.0, 1.0)
        ok = (s.in_mask_weight >= c.min_weight) & (s.support >= c.support_min)
        g = torch.where(ok, g, torch.zeros_like(g))
        if c.delta_scope == "global":
            g = g.max().expand_as(g) if g.numel() else g
        return g

    def forward(
        self, samples: list[EditSample], state: list[FastWeights]
    ) -> tuple[list[dict[str, torch.Tensor]], list[FastWeights]]:
        """Predict per-Gaussian deltas for each sample; returns (deltas, new state).

        deltas[b] has "sh_dc" [N,3] (+ "sh_rest" [N,15,3], "opacity_logits" [N]) and "gate" [N].
        """
        c = self.config
        # Voxel tokens, padded to [B, V, D].
        vtok = []
        for s in samples:
            vox = s.latent.vox
            sig = segment_mean(s.signals.as_features(), vox.gauss_voxel, vox.num_voxels)
            pos = fourier_encode(vox.voxel_centers() * 2.0, c.fourier_freqs)
            vtok.append(
                self.voxel_in(s.latent.voxel_latent) + self.voxel_pos(pos) + self.voxel_sig(sig)
            )
        x, vmask = _pad(vtok)
        # Edit tokens, padded to [B, T, D]; a view with no masked pixel contributes nothing.
        etok, ewt = [], []
        for s in samples:
            toks, wts = [], []
            for v in s.views:
                t, cover = patchify(v, c.patch_size)
                toks.append(t)
                wts.append(torch.full_like(cover, float(cover.sum() > 0)))
            etok.append(self.edit_in(torch.cat(toks)))
            ewt.append(torch.cat(wts))
        e, emask = _pad(etok)
        ew, _ = _pad([w[:, None] for w in ewt])
        ew = ew[..., 0] * emask.to(ew.dtype)
        new_state = []
        for blk, st in zip(self.blocks, state, strict=True):
            x, st = blk(x, vmask, e, ew, st)
            new_state.append(st)
        x = self.norm_out(x)
        out = []
        for b, s in enumerate(samples):
            vox = s.latent.vox
            sig = s.signals
            z = torch.cat(
                [x[b, vox.gauss_voxel], s.latent.gauss_feat, s.colors, sig.as_features()], dim=-1
            )
            y = self.head(z)
            gate = self.gate(sig).to(y.dtype)
            dc = y[:, :3]
            if self.bp_gain is not None:
                dc = dc + self.bp_gain * sig.residual / SH_C0
            d = {"sh_dc": dc * gate[:, None], "gate": gate}
            i = 3
            if c.predict_sh_rest:
                rest = y[:, i : i + 3 * MAX_SH_REST].reshape(-1, MAX_SH_REST, 3)
                d["sh_rest"] = rest * gate[:, None, None]
                i += 3 * MAX_SH_REST
            if c.predict_opacity:
                d["opacity_logits"] = y[:, i] * gate
            out.append(d)
        return out, new_state


def _pad(items: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack [L_i, D] tensors into [B, max L, D] with a validity mask [B, max L]."""
    n = max(t.shape[0] for t in items)
    out = items[0].new_zeros(len(items), n, items[0].shape[-1])
    mask = torch.zeros(len(items), n, dtype=torch.bool, device=items[0].device)
    for i, t in enumerate(items):
        out[i, : t.shape[0]] = t
        mask[i, : t.shape[0]] = True
    return out, mask
