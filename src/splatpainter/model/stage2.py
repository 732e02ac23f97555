"""Stage II: the editor.  Voxel tokens + edit-view tokens -> appearance deltas, with TTT state.

Each block:  voxel self-attention  ->  TTT layer  ->  MLP.  In the TTT layer the fast weights are
first *updated* with the edit-view tokens (patches of [edited RGB, current render, residual,
Plücker rays, mask]) and then *applied* to the voxel tokens; the updated fast weights are the
state that carries over to the next edit.

Per-Gaussian heads read (voxel token, Stage I Gaussian feature, colour, normal, edit signals,
closed-form edit hypotheses, the edit-kind hint) and predict a colour delta

    delta_g = E * w_g * (sum_k softmax(mix_g)_k hypothesis_gk + 0.1 tanh(corr_g)),
    w_g = clamp((sigmoid(gate_g) - floor) / (1 - floor), 0, 1)

where the hypotheses (`splatpainter.model.hypotheses`) are the seen Gaussians' own change (the
least-squares colour change that reproduces the edit views, `edit/solve.py`, when
`solve_iters` > 0; else the back-projected residual), and an affine recolour and a Lambertian
relight fitted to it (or, with `fit_maps`, to the edit views' pixels).  w_g is a *learned*
per-Gaussian edit weight: it is free to change Gaussians no edit view sees (the far side of a
recoloured part, the unseen side of a relit object) and to leave them (the back of a painted
object).  With `propagate`, the heads also read a learned walk over the asset's k-NN graph
(model/propagate.py): where the edit spreads is decided by 3D structure, not by colour alone.
SH DC takes the delta; the higher SH bands follow the chosen hypotheses' colour maps
(`rest_map`: the affine map's linear part, the shading factor, the identity for the seen
change), so highlights change with a recolour or relight.  Geometry and opacity are never
touched.

Identity preservation where nothing is asked is structural: E = clamp(sum_g in-mask weight_g *
|residual|_g / evidence_tau, 0, 1) is exactly zero when no edit pixel lands on the asset or the
edited image equals the render, and then every delta is exactly zero.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from appshell.tables import check_limits, limited
from splatpainter.assets.gaussians import SH_C0
from splatpainter.model.hypotheses import (
    BIN_STATS_DIM,
    EDIT_STATS_DIM,
    NUM_HYPOTHESES,
    EditTotals,
    edit_hypotheses,
    fit_hypothesis_maps,
    hypothesis_rest_maps,
    recolor_band_maps,
    shading_factor,
    with_seen_solve,
)
from splatpainter.model.layers import (
    MLP,
    SelfAttention,
    column_major,
    fourier_encode,
    segment_mean,
)
from splatpainter.model.propagate import NODE_ATTRS, Propagation
from splatpainter.model.stage1 import MAX_WIDTH, Stage1Latent
from splatpainter.model.ttt import FastWeights, TTTConfig, TTTLayer

# Channels of an edit-view pixel: edited rgb, render rgb, residual rgb, Plücker (6), mask.
VIEW_CHANNELS = 3 + 3 + 3 + 6 + 1
SIGNAL_DIM = 3 + 1 + 1 + 1  # residual rgb, |residual|, support, log(1 + visible weight)
# The per-Gaussian inputs' columns (`_gaussian_inputs`: signals, candidates hypothesis by
# hypothesis, colour-bin statistics) that are not zero for a Gaussian without in-mask weight:
# log(1 + visible weight), the recolour's and the relight's candidate changes, the bin
# statistics.  `_kernels.unmasked_voxel_sums` fills these for a restricted edit.
UNMASKED_COLUMNS = (SIGNAL_DIM - 1, SIGNAL_DIM + 3, SIGNAL_DIM + 6, SIGNAL_DIM + 9)
# The edit-kind hint: "auto" lets the model infer the kind.
EDIT_HINTS = ("auto", "paint", "recolor", "relight", "detail")
# Which hypotheses (the seen Gaussians' own change, affine recolour, relight) a hint allows:
# paint and detail are local (LOCAL_HINTS): they only move Gaussians a masked pixel shows, and the
# others keep their exact bits; "auto" leaves the choice to the network.
LOCAL_HINTS = ("paint", "detail")
HINT_HYPOTHESES = {
    "auto": torch.tensor([True, True, True]),
    "paint": torch.tensor([True, False, False]),
    "recolor": torch.tensor([True, True, False]),
    "relight": torch.tensor([True, False, True]),
    "detail": torch.tensor([True, False, False]),
}


COLOR_MAPS = ("affine", "shading")  # the hypotheses' maps that can be fitted to pixels


def hint_maps(hint: str) -> tuple[str, ...]:
    """The colour maps ("affine", "shading") worth fitting to the edit views' pixels for a hint:
    those of the hypotheses it allows."""
    allowed = HINT_HYPOTHESES[hint][1:].tolist()
    return tuple(m for m, ok in zip(COLOR_MAPS, allowed, strict=True) if ok)


@dataclass
class Stage2Config:
    """Sizes and options of the Stage II editor."""

    dim: int = limited(128, ge=1, le=MAX_WIDTH)
    num_blocks: int = limited(3, ge=0, le=64)
    num_heads: int = limited(4, ge=1, le=64)
    mlp_ratio: int = limited(2, ge=1, le=16)
    ttt_hidden_ratio: int = limited(2, ge=1, le=16)
    ttt_heads: int = limited(4, ge=1, le=64)
    ns_steps: int = limited(5, ge=0, le=64)
    # TTT anchor damping for long edit sequences (0 = off)
    damping: float = limited(0.0, ge=0, lt=1)
    patch_size: int = limited(8, ge=1, le=256)
    fourier_freqs: int = limited(6, ge=0, le=32)
    head_hidden: int = limited(64, ge=1, le=MAX_WIDTH)
    gauss_feat_dim: int = limited(32, ge=1, le=MAX_WIDTH)  # must match Stage I
    # in-mask weight x |residual| (pixels) at which E saturates
    evidence_tau: float = limited(0.05, gt=0)
    correction_scale: float = limited(0.1, ge=0)  # bound of the free per-Gaussian colour correction
    # learned edit weights below this are exactly zero
    gate_floor: float = limited(0.05, ge=0, lt=1)
    hint_restricts: bool = True  # a kind hint limits the hypotheses (see HINT_HYPOTHESES)
    # Least-squares steps for the seen Gaussians' own change (edit/solve.py); 0: the weighted
    # mean residual of back-projection, as the weights trained before the solve existed expect.
    solve_iters: int = limited(0, ge=0, le=1000)
    # the solve's pull toward no change, in pixels of weight
    solve_prior_px: float = limited(0.0, ge=0)
    # Fit the recolour and shading hypotheses to the edit views' pixels (with the solve; see
    # edit/solve.py `fit_color_maps`) instead of to the solved per-Gaussian change.
    fit_maps: bool = False
    # Centred solve (inference only; off: as the weights were trained).  The signals carry the
    # least-squares change centred on the affine recolour's prediction (with fit_maps and the
    # solve; edit/solve.py `solve_color_delta` centers), and when the first pass reads a
    # non-local edit as a recolour (the affine recolour carries at least `centre_share` of its
    # edit weight, and its map explains the seen change: rmse below `centre_map_fit` of the
    # mean residual), the seen Gaussians' own change becomes that solve and the head runs
    # once more.  A part seen through a few pixels leaves the plain solve undetermined, and
    # its pull toward no change drifts it off the map; the centred one keeps the map there and
    # follows the views where they pin a Gaussian down.
    map_solves: bool = False
    centre_share: float = limited(0.1, ge=0, le=1)
    centre_map_fit: float = limited(0.6, ge=0)
    # Learned propagation over the asset's k-NN graph (model/propagate.py); off: the weights
    # trained before it existed.
    propagate: bool = False
    prop_channels: int = limited(8, ge=1, le=256)
    prop_k: int = limited(10, ge=1, le=64)
    prop_anchors: int = limited(2048, ge=1, le=1 << 20)
    prop_coarse_steps: int = limited(24, ge=0, le=1000)
    prop_fine_steps: int = limited(4, ge=0, le=1000)
    # Reach (inference only; 0: off, as the weights were trained): when the first pass reads a
    # non-local edit as a recolour (the affine recolour carries at least `prop_reach_share` of
    # its edit weight), the walk is taken again with `prop_reach_steps` coarse steps and the
    # head run once more on it, so that a recolour reaches the far side of a large part while
    # a paint stroke keeps the walk it was trained with (a long walk leaks paint).
    prop_reach_steps: int = limited(0, ge=0, le=1000)
    prop_reach_share: float = limited(0.9, gt=0, le=1)
    # Structural priors on the choice between hypotheses (0: off, as in weights trained before
    # them).  seen_prior_px: the seen change is available to a Gaussian in proportion to
    # 1 - exp(-in-mask weight / this), so an unseen one takes a map or keeps its colour through
    # its gate, not through a zero "seen change".  map_prior: the affine recolour and the
    # shading compete with log-odds -(rmse^2 - min rmse^2) / map_prior^2, their fit to the seen
    # change (a global recolour is not read as a relight that fits it worse).
    seen_prior_px: float = limited(0.0, ge=0)
    map_prior: float = limited(0.0, ge=0)
    # Commitment (0: off, as in weights trained before it): edit weights above 1 - gate_floor
    # are exactly one, hypothesis weights below `commit` exactly zero (the rest renormalised)
    # and a free correction below `commit` of its bound exactly zero, so that a confident
    # choice applies its map exactly instead of to within a few thousandths (trained through
    # straight-through gradients, as the gate floor is).
    commit: float = limited(0.0, ge=0, lt=1 / 3)
    # Kind hints the network's inputs read as "auto" (empty: every hint as the weights were
    # trained; set by a phase of no steps, phase 11).  Such a hint still rules hypotheses out
    # and fits only its maps; the network is not told it.  Trained on a twentieth of the
    # edits, the relight hint's inputs cost 1.2-1.4 dB against "auto" on relights whose truth
    # its shading map is.
    untold_hints: tuple[str, ...] = ()
    # Corrections on the seen change only (inference; off: as the weights were trained): the
    # free correction applies in proportion to the weight of the seen Gaussians' own change in
    # a Gaussian's mix, so a Gaussian that takes a colour map takes it exactly (around the map
    # of a global recolour or a relight, which is the whole edit, the corrections only added
    # error), and a paint stroke keeps its corrections.
    seen_corrections: bool = False
    # Relight commitment (inference; 0: off): when the shading carries at least this share of
    # a non-local edit's weight, the edit is read as a relight, which changes the light on the
    # whole asset: the head runs again with every gate open and (map_solves) the seen
    # Gaussians' own change the solve centred on the shading, as phase 10 centres a recolour
    # on its map.
    relight_share: float = limited(0.0, ge=0, le=1)
    # ... and when the shading also explains the seen change (its rmse below `relight_fit` of
    # the mean residual; 0: off), every Gaussian takes exactly the shading: the seen ones too,
    # instead of the centred solve, whose per-Gaussian freedom only adds the views' noise to a
    # light change the map already describes.  Real captures' view-dependent shading fits
    # worse (0.4-0.6 of the residual on the capture suite, 0.1-0.33 on the procedural and
    # distractor ones) and keeps the centred solve.
    relight_fit: float = limited(0.0, ge=0)

    def __post_init__(self) -> None:
        check_limits(self, "stage2")  # before the checks below divide by these
        self.untold_hints = tuple(self.untold_hints)
        unknown = [h for h in self.untold_hints if h not in EDIT_HINTS[1:]]
        if unknown:
            raise ValueError(
                f"stage2.untold_hints: unknown kind hints {unknown}; use some of {EDIT_HINTS[1:]}"
            )
        if self.dim % self.num_heads or self.dim % self.ttt_heads:
            raise ValueError(f"dim {self.dim} must be divisible by num_heads and ttt_heads")
        if self.patch_size < 1:
            raise ValueError("patch_size must be >= 1")
        if self.solve_iters < 0 or not self.solve_prior_px >= 0:
            raise ValueError("solve_iters and solve_prior_px must be >= 0")
        if not self.evidence_tau > 0:
            raise ValueError("evidence_tau must be positive")

    def signal_settings(self) -> SignalSettings:
        return SignalSettings(self.solve_iters, self.solve_prior_px, self.fit_maps, self.map_solves)

    def ttt_config(self) -> TTTConfig:
        return TTTConfig(
            dim=self.dim,
            num_heads=self.ttt_heads,
            hidden_ratio=self.ttt_hidden_ratio,
            ns_steps=self.ns_steps,
            damping=self.damping,
        )


@dataclass(frozen=True)
class SignalSettings:
    """How the edit signals are computed from the edit views (edit/signals.py); the weights
    expect the settings they were trained with (Stage2Config carries them)."""

    solve_iters: int = 0
    solve_prior_px: float = 0.0
    fit_maps: bool = False
    map_solves: bool = False


@dataclass
class GaussianSignals:
    """Per-Gaussian edit evidence gathered from the edit views (see edit/signals.py)."""

    residual: torch.Tensor  # [N, 3] weighted mean (edited - render) inside the mask
    abs_residual: torch.Tensor  # [N] weighted mean of max-channel |edited - render|
    support: torch.Tensor  # [N] in-mask weight / total weight over the edit views
    in_mask_weight: torch.Tensor  # [N] absolute in-mask compositing weight (pixels)
    weight: torch.Tensor | None = None  # [N] total compositing weight (pixels) over the views
    solved: torch.Tensor | None = None  # [N, 3] least-squares colour change (edit/solve.py)
    # the recolour [4, 3] and shading (ambient, diffuse, light) fitted to the views' pixels
    # (edit/solve.py `fit_color_maps`); None: fitted to the per-Gaussian change instead
    affine: torch.Tensor | None = None
    shading: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # an HSV recolour (hue degrees, saturation, brightness) that explains the pixels better
    # than the affine map, used in its place (`hypotheses.recolor`); None: the affine map
    hsv: torch.Tensor | None = None
    # [N, 3] the seen Gaussians' least-squares change centred on the recolour's / the
    # shading's prediction (SignalSettings.map_solves: the model reads the former, a rule's
    # recolour or relight either; edit/solve.py `solve_color_delta` centers)
    solved_affine: torch.Tensor | None = None
    solved_shading: torch.Tensor | None = None

    def total_weight(self) -> torch.Tensor:
        if self.weight is not None:
            return self.weight
        return torch.where(
            self.support > 0, self.in_mask_weight / self.support.clamp_min(1e-12), self.support
        )

    def feature_columns(self) -> list[torch.Tensor]:
        """The signals the network reads per Gaussian, as [N, C_i] pieces."""
        return [
            self.residual,
            self.abs_residual[:, None],
            self.support[:, None],
            torch.log1p(self.total_weight())[:, None],
        ]

    def evidence(self, tau: float) -> torch.Tensor:
        """E in [0, 1]: exactly 0 when no masked pixel both lands on the asset and differs."""
        return torch.clamp((self.in_mask_weight * self.abs_residual).sum() / tau, 0.0, 1.0)


class GaussianInputs(NamedTuple):
    """What the head and the walk read per Gaussian of one sample (`_gaussian_inputs`)."""

    cand: torch.Tensor  # [N, NUM_HYPOTHESES, 3] the candidate deltas the mix applies
    stats: torch.Tensor  # [EDIT_STATS_DIM] the edit's statistics
    per_gauss: torch.Tensor  # [N, F] signals, candidates and colour-bin statistics
    normals: torch.Tensor  # [N, 3]
    rest: torch.Tensor  # [N or rows, NUM_HYPOTHESES, 3, 3] the SH bands' maps
    whole_asset: bool = False  # every gate open: the edit reaches every Gaussian (a relight)
    shading_only: bool = False  # every Gaussian takes exactly the shading (relight_fit)

    def rows(self, idx: torch.Tensor, rest_too: bool = True) -> GaussianInputs:
        """These inputs at the Gaussians idx (the band maps too unless already taken there)."""
        return self._replace(
            cand=self.cand[idx], per_gauss=self.per_gauss[idx], normals=self.normals[idx],
            rest=self.rest[idx] if rest_too else self.rest,
        )  # fmt: skip

    def centred(self, sig: GaussianSignals, on: str = "affine") -> GaussianInputs:
        """These inputs with each seen Gaussian's own change (hypothesis 0) the solve centred
        on the affine recolour or (on="shading") the shading (Stage2Config.map_solves); the
        features stay as they were."""
        solved = sig.solved_shading if on == "shading" else sig.solved_affine
        own = with_seen_solve(self.cand[:, 0], sig.in_mask_weight, solved)
        return self._replace(cand=torch.cat([own[:, None], self.cand[:, 1:]], 1))


@dataclass
class EditSample:
    """Everything Stage II needs for one asset and one edit (one or several views)."""

    latent: Stage1Latent
    views: list[torch.Tensor]  # each [H, W, VIEW_CHANNELS]
    signals: GaussianSignals
    colors: torch.Tensor  # [N, 3] current base colours (0.5 + C0 * sh_dc)
    hint: str = "auto"  # one of EDIT_HINTS

    def __post_init__(self) -> None:
        if self.hint not in EDIT_HINTS:
            raise ValueError(f"unknown edit kind {self.hint!r}; use one of {EDIT_HINTS}")


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
        per_gauss = SIGNAL_DIM + 3 * NUM_HYPOTHESES + BIN_STATS_DIM
        walk = c.prop_channels if c.propagate else 0
        self.propagation = None
        if c.propagate:
            self.propagation = Propagation(
                node_dim=c.gauss_feat_dim + 3 + 3 + NODE_ATTRS,
                seed_dim=per_gauss + 2 + len(EDIT_HINTS),
                channels=c.prop_channels,
                coarse_steps=c.prop_coarse_steps,
                fine_steps=c.prop_fine_steps,
            )
        self.voxel_in = nn.Linear(latent_dim, c.dim)
        self.voxel_pos = nn.Linear(3 * 2 * c.fourier_freqs, c.dim)
        self.voxel_sig = nn.Linear(per_gauss, c.dim)
        self.edit_stats = nn.Linear(EDIT_STATS_DIM, c.dim)
        self.hint_embed = nn.Embedding(len(EDIT_HINTS), c.dim)
        self.edit_in = nn.Linear(c.patch_size**2 * VIEW_CHANNELS, c.dim)
        self.blocks = nn.ModuleList(EditorBlock(c) for _ in range(c.num_blocks))
        self.norm_out = nn.LayerNorm(c.dim)
        head_in = (
            c.dim + c.gauss_feat_dim + 3 + 3 + per_gauss + EDIT_STATS_DIM + len(EDIT_HINTS) + walk
        )
        self.head = MLP(head_in, c.head_hidden, 1 + NUM_HYPOTHESES + 3)
        nn.init.normal_(self.head.fc2.weight, std=0.01)
        with torch.no_grad():  # start as back-projection: gate ~ 0.5, mix on the residual
            self.head.fc2.bias.zero_()
            self.head.fc2.bias[1] = 3.0

    def init_state(self, batch: int = 1) -> list[FastWeights]:
        return [blk.ttt.init_state(batch) for blk in self.blocks]

    def _gaussian_inputs(
        self,
        s: EditSample,
        rest_rows: torch.Tensor | None = None,
        totals: EditTotals | None = None,
    ) -> GaussianInputs:
        """The per-Gaussian inputs of one sample.  rest_rows: the band maps of those Gaussians
        only (a restricted edit needs no others); totals: the whole asset's, when the sample
        holds some of its Gaussians (`edit_hypotheses`)."""
        sig = s.signals
        normals = s.latent.normals
        if normals is None:
            normals = torch.zeros_like(s.colors)
        # The seen Gaussians' own change: the least-squares solve when there is one.
        seen_delta = sig.residual if sig.solved is None else sig.solved
        affine, shading = fit_hypothesis_maps(
            s.colors, seen_delta, sig.in_mask_weight * sig.support, normals, sig.affine,
            sig.shading,
        )  # fmt: skip
        cand, stats, bins = edit_hypotheses(
            s.colors,
            seen_delta,
            sig.abs_residual,
            sig.in_mask_weight,
            sig.support,
            sig.total_weight(),
            normals,
            affine=affine,
            shading=shading,
            hsv=sig.hsv,
            totals=totals,
        )
        per_gauss = column_major([*sig.feature_columns(), cand.flatten(1), bins])
        w = sig.in_mask_weight * sig.support
        band = recolor_band_maps(s.colors, affine, sig.hsv, seen_delta, w, rest_rows)
        n_rest = normals if rest_rows is None else normals[rest_rows]
        rest = hypothesis_rest_maps(band, shading_factor(shading, n_rest), n_rest)
        return GaussianInputs(cand, stats, per_gauss, normals, rest)

    def _told_index(self, s: EditSample) -> int:
        """The kind hint the network reads for this sample, as its index in EDIT_HINTS: its
        own, or "auto" for a hint in Stage2Config.untold_hints."""
        return EDIT_HINTS.index("auto" if s.hint in self.config.untold_hints else s.hint)

    def _told(self, s: EditSample) -> torch.Tensor:
        """That hint one-hot [len(EDIT_HINTS)]."""
        return F.one_hot(torch.tensor(self._told_index(s)), len(EDIT_HINTS))

    def _walker(self, s: EditSample, cand, per_gauss, normals) -> Callable[..., torch.Tensor]:
        """The learned propagation of one edit, prepared: walker(coarse_steps=None) gives its
        per-Gaussian channels [N, prop_channels] (a second call reuses every affinity)."""
        graph = s.latent.graph
        if graph is None:
            raise ValueError("this editor propagates over the asset's graph: the latent has none")
        sig = s.signals
        # only the Gaussians with in-mask weight seed the walk: their seed inputs alone
        seen = (sig.in_mask_weight > 0).nonzero().squeeze(1)
        c = cand[seen]
        agree = (c[:, 1:] - c[:, :1]).abs().amax(-1)  # [S, 2]
        hint = self._told(s).to(cand)
        seed_in = torch.cat([per_gauss[seen], agree, hint.expand(seen.numel(), -1)], -1)
        nodes = torch.cat([s.latent.gauss_feat, s.colors, normals, graph.attrs.to(cand)], -1)
        prop = self.propagation
        prep = prop.prepare(
            graph, nodes, seed_in, sig.in_mask_weight, normals, s.colors.detach(), seed_rows=seen
        )
        return functools.partial(prop.walk, prep)

    def _walk(self, s: EditSample, cand, per_gauss, normals) -> torch.Tensor:
        """The learned propagation's per-Gaussian channels [N, prop_channels]."""
        return self._walker(s, cand, per_gauss, normals)()

    def forward(
        self, samples: list[EditSample], state: list[FastWeights]
    ) -> tuple[list[dict[str, torch.Tensor]], list[FastWeights]]:
        """Predict per-Gaussian deltas for each sample; returns (deltas, new state).

        deltas[b]: "rgb" [N, 3] colour delta, "sh_dc" [N, 3] (= rgb / C0), "rest_map" [N, 3, 3]
        (the higher SH bands' colour map, see methods.apply_color_delta), "gate" [N] (the
        effective edit weight E * sigmoid(gate)), "mix" [N, NUM_HYPOTHESES], "evidence" [].
        """
        c = self.config
        inputs = [self._gaussian_inputs(s) for s in samples]
        vtok = []
        for s, inp in zip(samples, inputs, strict=True):
            stats, per_gauss = inp.stats, inp.per_gauss
            vox = s.latent.vox
            sig = segment_mean(per_gauss, vox.gauss_voxel, vox.num_voxels)
            pos = fourier_encode(vox.voxel_centers() * 2.0, c.fourier_freqs)
            hint = self.hint_embed.weight[self._told_index(s)]
            vtok.append(
                self.voxel_in(s.latent.voxel_latent)
                + self.voxel_pos(pos)
                + self.voxel_sig(sig)
                + self.edit_stats(stats)
                + hint
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
        for b, (s, inp) in enumerate(zip(samples, inputs, strict=True)):
            cand, per_gauss, normals = inp.cand, inp.per_gauss, inp.normals
            walker = None
            if self.propagation is not None:
                walker = self._walker(s, cand, per_gauss, normals)
            walk = None if walker is None else walker()
            d = self._head(s, x[b], inp, walk)
            again = self._second_pass(s, d["gate"], d["mix"], inp.stats)
            if again is not None:  # a recolour or a relight read as one (Stage2Config)
                if again.reach_steps is not None:
                    walk = walker(again.reach_steps)
                d = self._head(s, x[b], again.inputs(inp, s.signals), walk)
            out.append(d)
        return out, new_state

    def _head(
        self, s: EditSample, xb: torch.Tensor, inputs: GaussianInputs, walk
    ) -> dict[str, torch.Tensor]:
        """The per-Gaussian head of one sample: its deltas (see `forward`) from the voxel
        tokens xb [V, dim], its per-Gaussian inputs and the walk's channels (or None)."""
        c = self.config
        stats, per_gauss, normals = inputs.stats, inputs.per_gauss, inputs.normals
        hint = self._told(s).to(xb)
        own = [s.latent.gauss_feat, s.colors, normals, per_gauss]  # each Gaussian's own inputs
        y = self.head.fc2(
            F.gelu(self._head_hidden(xb, s.latent.vox.gauss_voxel, own, stats, hint, walk))
        )
        evidence = s.signals.evidence(c.evidence_tau).to(y.dtype)
        # Edit weights below gate_floor are exactly zero: where the network is confident a
        # Gaussian is not part of the edit, it keeps its bits (and is not written back).
        f = c.gate_floor
        soft = torch.sigmoid(y[:, 0])
        top = 1 - f if c.commit > 0 else 1.0  # committed: above 1 - f is exactly one
        hard = torch.clamp((soft - f) / (top - f), 0.0, 1.0)
        if inputs.whole_asset:  # a relight read as one (Stage2Config.relight_share)
            hard = torch.ones_like(hard)
        elif self.training:  # straight-through: a gate below the floor can still learn to open
            hard = hard + (soft - soft.detach())
        gate = evidence * hard
        if s.hint in LOCAL_HINTS:  # only what a masked pixel shows may move; the rest
            gate = gate * (s.signals.in_mask_weight > 0).to(gate)  # keeps its bits
        logits = y[:, 1 : 1 + NUM_HYPOTHESES]
        if c.seen_prior_px > 0:  # the seen change says nothing about an unseen Gaussian
            seen = 1.0 - torch.exp(-s.signals.in_mask_weight / c.seen_prior_px)
            logits = logits + _first_column(seen.clamp_min(1e-4).log())
        if c.map_prior > 0:  # the map that explains the seen change better is likelier
            err = stats[1:3] ** 2
            logits = logits - F.pad((err - err.min()) / c.map_prior**2, (1, 0))
        if c.hint_restricts:  # a given kind rules hypotheses out (paint: no recolour)
            allowed = HINT_HYPOTHESES[s.hint].to(logits.device)
            logits = logits.masked_fill(~allowed, float("-inf"))
        mix = torch.softmax(logits, -1)
        corr = torch.tanh(y[:, 1 + NUM_HYPOTHESES :])
        if c.commit > 0:
            mix = _committed(mix, c.commit, self.training, renormalise=True)
            corr = _committed(corr, c.commit, self.training, renormalise=False)
        if inputs.shading_only:  # a relight its shading map explains (relight_fit)
            mix = F.one_hot(torch.full_like(gate, 2, dtype=torch.long), NUM_HYPOTHESES).to(mix)
        corr = c.correction_scale * corr
        if c.seen_corrections:  # a map the Gaussian takes applies exactly
            corr = corr * mix[:, :1]
        rgb = gate[:, None] * ((mix[..., None] * inputs.cand).sum(1) + corr)
        # The view-dependent bands follow the chosen hypotheses' maps (identity: unchanged).
        eye = torch.eye(3, dtype=rgb.dtype, device=rgb.device)
        mixed = (mix[..., None, None] * inputs.rest).sum(1)
        rest_map = eye + gate[:, None, None] * (mixed - eye)
        return {"rgb": rgb, "sh_dc": rgb / SH_C0, "rest_map": rest_map, "gate": gate,
                "mix": mix, "evidence": evidence}  # fmt: skip

    def _head_hidden(self, xb, gauss_voxel, own, stats, hint, walk) -> torch.Tensor:
        """The head's first layer on its input row [voxel token, own..., stats, hint, walk] of
        every Gaussian, computed by parts: the voxel tokens' share once per voxel (then taken
        per Gaussian), the edit's (stats, hint) once as a bias, and one product for the columns
        that are each Gaussian's own.  The same function as the layer on the concatenated rows
        (to float rounding) without building them: 154 floats a Gaussian, most of the head's
        time at a million Gaussians."""
        w, b = self.head.fc1.weight, self.head.fc1.bias
        d = xb.shape[-1]
        widths = [d, *(t.shape[-1] for t in own), stats.shape[-1], hint.shape[-1]]
        cut = list(itertools.accumulate(widths))  # where each part's columns end
        const = torch.cat([stats, hint]) @ w[:, cut[-3] : cut[-1]].T + b
        mine = torch.cat(own if walk is None else [*own, walk], -1)
        cols = torch.cat([w[:, d : cut[-3]], w[:, cut[-1] :]], 1)  # (no walk: none after hint)
        per_voxel = xb @ w[:, :d].T + const
        return torch.addmm(per_voxel[gauss_voxel], mine, cols.T)

    def _second_pass(
        self, s: EditSample, gate: torch.Tensor, mix: torch.Tensor, stats: torch.Tensor
    ) -> SecondPass | None:
        """How the head runs again when the first pass (its gate [N] and mix
        [N, NUM_HYPOTHESES] over every Gaussian, the edit's stats) reads a non-local edit as a
        relight (Stage2Config.relight_share: every gate open, the seen Gaussians centred on
        the shading) or as a recolour: the walk further (prop_reach_steps / prop_reach_share)
        and the seen Gaussians centred on the map (map_solves / centre_share /
        centre_map_fit); None: the first pass stands."""
        c = self.config
        if self.training or s.hint in LOCAL_HINTS:  # only masked Gaussians move: nothing to do
            return None
        shares = hypothesis_shares(gate, mix)
        if c.relight_share > 0 and shares[2] >= c.relight_share:
            exact = c.relight_fit > 0 and float(stats[2]) < c.relight_fit * float(stats[3])
            on = "shading" if c.map_solves and s.signals.solved_shading is not None else None
            return SecondPass(None, None if exact else on, whole_asset=True, shading_only=exact)
        share = shares[1]
        steps = None
        if c.prop_reach_steps > 0 and self.propagation is not None and share >= c.prop_reach_share:
            steps = c.prop_reach_steps
        map_explains = float(stats[1]) < c.centre_map_fit * float(stats[3])
        centred = (
            c.map_solves
            and s.signals.solved_affine is not None
            and share >= c.centre_share
            and map_explains
        )
        if steps is None and not centred:
            return None
        return SecondPass(steps, "affine" if centred else None)


class SecondPass(NamedTuple):
    """How the head runs again on a recolour or a relight (`Stage2Editor._second_pass`)."""

    reach_steps: int | None  # the walk's coarse steps; None: the first walk
    # the map ("affine", "shading") whose centred solve is the seen Gaussians' own change;
    # None: the plain solve
    centre: str | None
    whole_asset: bool = False  # every gate open
    shading_only: bool = False  # every Gaussian exactly on the shading

    def inputs(self, inputs: GaussianInputs, sig: GaussianSignals) -> GaussianInputs:
        """The head's inputs for this pass, from the first pass's."""
        if self.centre is not None:
            inputs = inputs.centred(sig, self.centre)
        return inputs._replace(whole_asset=self.whole_asset, shading_only=self.shading_only)


def hypothesis_shares(gate: torch.Tensor, mix: torch.Tensor) -> list[float]:
    """The shares of an edit's weight (gate [N]) that each hypothesis carries (mix
    [N, NUM_HYPOTHESES]): the seen change, the affine recolour, the relight; zeros where nothing
    moves."""
    gate, mix = gate.detach(), mix.detach()  # a decision, not a function to differentiate
    total = float(gate.sum())
    if total <= 0:
        return [0.0] * mix.shape[1]
    return [float(v) / total for v in (gate[:, None] * mix).sum(0)]


def recolor_share(gate: torch.Tensor, mix: torch.Tensor) -> float:
    """The share of an edit's weight that the affine recolour carries (`hypothesis_shares`)."""
    return hypothesis_shares(gate, mix)[1]


READINGS = ("paint", "recolor", "relight")  # what each hypothesis carrying an edit reads as


def edit_reading(
    gate: torch.Tensor, mix: torch.Tensor, seen: torch.Tensor, moved: torch.Tensor
) -> dict:
    """How the editor read one edit under a hint that leaves the kind open: as the kind whose
    hypothesis carries most of its weight (the seen change: paint, a local change; the affine
    map: a recolour; the shading: a relight), with every share, and how many of the Gaussians
    it moved (moved [N] bool) no edit view's mask covers (seen [N] bool: those it covers)."""
    shares = hypothesis_shares(gate, mix)
    return {
        "read_as": READINGS[max(range(len(shares)), key=shares.__getitem__)],
        "shares": dict(zip(READINGS, (round(v, 4) for v in shares), strict=True)),
        "moved_gaussians": int(moved.sum()),
        "moved_beyond_the_mask": int((moved & ~seen).sum()),
    }


def _committed(w: torch.Tensor, floor: float, training: bool, renormalise: bool) -> torch.Tensor:
    """w shrunk toward zero by `floor` (|w| - floor, clamped at zero, sign kept), rescaled so
    that the largest value keeps its reach: a mixture renormalised to sum one (its largest
    weight is at least 1/3 > floor), a correction in [-1, 1] divided by 1 - floor.  Training
    adds the gradient of w itself (straight-through, as the gate floor does), so that a value
    below the floor still learns."""
    kept = torch.sign(w) * (w.abs() - floor).clamp_min(0.0)
    out = kept / kept.sum(-1, keepdim=True) if renormalise else kept / (1.0 - floor)
    return out + (w - w.detach()) if training else out


def _first_column(v: torch.Tensor) -> torch.Tensor:
    """[N] -> [N, NUM_HYPOTHESES]: v in the column of the seen change, zeros elsewhere."""
    return F.pad(v[:, None], (0, NUM_HYPOTHESES - 1))


def _pad(items: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack [L_i, D] tensors into [B, max L, D] with a validity mask [B, max L]."""
    n = max(t.shape[0] for t in items)
    out = items[0].new_zeros(len(items), n, items[0].shape[-1])
    mask = torch.zeros(len(items), n, dtype=torch.bool, device=items[0].device)
    for i, t in enumerate(items):
        out[i, : t.shape[0]] = t
        mask[i, : t.shape[0]] = True
    return out, mask
