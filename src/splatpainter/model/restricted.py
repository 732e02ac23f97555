"""Stage II for a local edit, computed only where it can change something.

A local edit kind (paint, detail: `stage2.LOCAL_HINTS`) moves only the Gaussians that a masked
pixel shows (`touched`); every other Gaussian keeps its bits by construction.  Their deltas
depend on the whole asset only through a few small things: the voxel tokens (per-voxel means
over every Gaussian, then attention among voxels), the edit statistics and colour bins (sums
over every seen Gaussian), and the learned walk (`model/propagate.py`).  The walk is local in
its fine steps and global only through the anchors:

- after `fine_steps` steps a Gaussian's value depends on the Gaussians within that many hops
  of the k-NN graph (their read-back from the anchors, their seeds);
- the coarse walk among the anchors depends on the seeds pooled to each anchor, which are
  zero except at touched Gaussians, and on each anchor's Gaussian count.

So the walk runs on a subgraph: the touched Gaussians' `fine_steps`-hop neighbourhood and every
anchor, carrying the whole asset's Gaussian count per anchor (`SplatGraph.home_count`).
Edges leaving the subgraph become self-loops: only Gaussians `fine_steps` hops out have them,
and what they compute cannot travel back to a touched one in time.  The cheap per-Gaussian
inputs (signals, hypotheses, bins) and the voxels' signal tokens are computed for every
Gaussian; the walk only on the subgraph, and the network (voxel and view tokens, blocks, head)
through the editor's own forward on the touched Gaussians (`local_forward`).
`tests/splatpainter/test_sp_restricted.py` checks it against the full forward: untouched
Gaussians bit for bit, touched ones to float rounding (the walk on the subgraph can differ from
the whole graph's in the last bit).
"""

from __future__ import annotations

import copy
import dataclasses
import time

import torch
from torch import nn

from splatpainter.model.layers import segment_mean
from splatpainter.model.propagate import SplatGraph
from splatpainter.model.stage1 import Stage1Latent
from splatpainter.model.stage2 import (
    LOCAL_HINTS,
    EditSample,
    GaussianInputs,
    GaussianSignals,
    Stage2Editor,
)
from splatpainter.model.ttt import FastWeights


@dataclasses.dataclass
class LocalDeltas:
    """Stage II's output for the Gaussians `rows` only (every other delta is exactly zero)."""

    rows: torch.Tensor  # [R] int64, ascending
    rgb: torch.Tensor  # [R, 3]
    rest_map: torch.Tensor  # [R, 3, 3]
    gate: torch.Tensor  # [R]
    subgraph_size: int  # Gaussians the walk ran on


def can_restrict(editor: Stage2Editor, sample: EditSample) -> bool:
    """Whether `local_forward` applies: a local kind (only touched Gaussians move)."""
    return sample.hint in LOCAL_HINTS


def walk_hops(graph: SplatGraph, touched: torch.Tensor, hops: int) -> torch.Tensor:
    """[N] int16: each Gaussian's hop count from the touched ones along the k-NN graph's edges
    (0: touched) up to `hops`; hops + 1 for an anchor further out (the coarse walk runs on every
    anchor); -1 outside the region the walk must run on for the touched ones' values."""
    n = graph.fine_idx.shape[0]
    hop = torch.full((n,), -1, dtype=torch.int16, device=touched.device)
    hop[touched] = 0
    frontier = touched
    for h in range(1, hops + 1):
        nxt = graph.fine_idx[frontier].flatten()
        nxt = nxt[hop[nxt] < 0]
        if nxt.numel() == 0:
            break
        hop[nxt] = h
        frontier = torch.unique(nxt)
    a = graph.anchors
    hop[a] = torch.where(hop[a] < 0, hops + 1, hop[a])
    return hop


def subgraph(
    graph: SplatGraph, keep: torch.Tensor, hop: torch.Tensor | None = None, fine_steps: int = 0
) -> SplatGraph:
    """The graph on the Gaussians `keep` [S] (ascending), edges leaving it turned into
    self-loops, the anchors and coarse level unchanged.  fine_dist is the full graph's local
    spacing in every row: the walk reads it only as that median.

    hop [S] (`walk_hops` at keep, for a walk of `fine_steps`): the walk then computes the fine
    affinities of the Gaussians within fine_steps - 1 hops alone and the read-back ones within
    fine_steps (what a Gaussian h hops out holds reaches a touched one h steps later, so a
    step's result further out never arrives).  Only Gaussians fine_steps hops out have edges
    leaving the region, so every affinity computed is the full graph's."""
    n = graph.fine_idx.shape[0]
    pos = torch.full((n,), -1, dtype=torch.int64, device=keep.device)
    pos[keep] = torch.arange(keep.numel(), device=keep.device)
    fine = pos[graph.fine_idx[keep]]
    own = torch.arange(keep.numel(), device=keep.device)[:, None].expand_as(fine)
    fine = torch.where(fine >= 0, fine, own)
    spacing = graph.fine_spacing()
    sub = SplatGraph(
        fine_idx=fine,
        fine_dist=spacing.expand(keep.numel(), graph.fine_dist.shape[1]),
        anchors=pos[graph.anchors],
        coarse_idx=graph.coarse_idx,
        coarse_dist=graph.coarse_dist,
        up_idx=graph.up_idx[keep],
        up_dist=graph.up_dist[keep],
        points=graph.points[keep],
        attrs=graph.attrs[keep],
    )
    sub.cacheable = False  # one edit's subgraph: its affinities are not kept (propagate.py)
    sub.home_count = graph.anchor_counts()
    sub._kept("_spacing", sub.fine_dist, lambda: spacing)  # its rows all hold that median
    if hop is not None:
        sub.fine_rows = (hop < fine_steps).nonzero().squeeze(1)
        sub.up_rows = (hop <= fine_steps).nonzero().squeeze(1)
    return sub


def _signals_rows(sig: GaussianSignals, idx: torch.Tensor) -> GaussianSignals:
    """The per-Gaussian signals of the Gaussians idx (fitted maps are shared)."""

    def take(t):
        return None if t is None else t[idx]

    return dataclasses.replace(
        sig,
        residual=sig.residual[idx],
        abs_residual=sig.abs_residual[idx],
        support=sig.support[idx],
        in_mask_weight=sig.in_mask_weight[idx],
        weight=take(sig.weight),
        solved=take(sig.solved),
        solved_affine=take(sig.solved_affine),
        solved_shading=take(sig.solved_shading),
    )


class _Clock:
    """Records the seconds since the previous call under a name (nothing when off)."""

    def __init__(self, out: dict[str, float] | None) -> None:
        self.out = out
        self.t = time.perf_counter()

    def __call__(self, name: str) -> None:
        if self.out is not None:
            now = time.perf_counter()
            self.out[name] = self.out.get(name, 0.0) + now - self.t
            self.t = now


def region_inputs(
    editor: Stage2Editor, s: EditSample, keep: torch.Tensor, at: torch.Tensor
) -> tuple[GaussianInputs, torch.Tensor]:
    """Stage II's per-Gaussian inputs at the Gaussians `keep` [R] (ascending; every Gaussian with
    in-mask weight among them; the SH band maps at keep[at] alone), and every voxel's mean of
    them over the whole asset [V, F] (what the voxel tokens read).

    The Gaussians outside keep have no in-mask weight, so their inputs are the recolour's and
    the relight's candidate changes, their colour bin's statistics and their seen weight: one
    compiled pass sums those per voxel (`_kernels.unmasked_voxel_sums`) instead of building the
    [N, F] inputs of a million Gaussians; the statistics over every Gaussian come from
    `edit_totals`.  The result is the full computation's to float rounding (the sums' order);
    an HSV recolour, which that pass does not compute, takes the full computation."""
    from splatpainter.model._kernels import unmasked_voxel_sums
    from splatpainter.model.hypotheses import edit_totals, fit_hypothesis_maps
    from splatpainter.model.stage2 import UNMASKED_COLUMNS

    sig, vox = s.signals, s.latent.vox
    normals = s.latent.normals
    if normals is None:
        normals = torch.zeros_like(s.colors)
    if sig.hsv is not None:
        full = editor._gaussian_inputs(s, rest_rows=keep[at])
        means = segment_mean(full.per_gauss, vox.gauss_voxel, vox.num_voxels)
        return full.rows(keep, rest_too=False), means
    rows = _signals_rows(sig, keep)
    seen_delta = rows.residual if rows.solved is None else rows.solved
    w = rows.in_mask_weight * rows.support
    colors, nrm = s.colors[keep], normals[keep]
    affine, shading = fit_hypothesis_maps(colors, seen_delta, w, nrm, rows.affine, rows.shading)
    rows = dataclasses.replace(rows, affine=affine, shading=shading)  # fitted once, here
    latent = Stage1Latent(vox, s.latent.voxel_latent, s.latent.gauss_feat[keep], nrm, None)
    weight = sig.total_weight()
    totals = edit_totals(s.colors, sig.abs_residual, sig.in_mask_weight, weight)
    sample = EditSample(latent, s.views, rows, colors, s.hint)
    inputs = editor._gaussian_inputs(sample, rest_rows=at, totals=totals)
    in_region = torch.zeros(s.colors.shape[0], dtype=torch.bool, device=keep.device)
    in_region[keep] = True
    width = inputs.per_gauss.shape[1]
    sums = unmasked_voxel_sums(
        s.colors, normals, weight, vox.gauss_voxel, in_region, affine, shading,
        totals.bin_stats, vox.num_voxels, width, UNMASKED_COLUMNS,
    )  # fmt: skip
    sums.index_add_(0, vox.gauss_voxel[keep], inputs.per_gauss.to(sums.dtype))
    count = torch.bincount(vox.gauss_voxel, minlength=vox.num_voxels).clamp_min(1)
    return inputs, (sums / count[:, None].to(sums.dtype)).to(s.colors.dtype)


@torch.no_grad()
def local_forward(
    editor: Stage2Editor,
    s: EditSample,
    state: list[FastWeights],
    timings: dict[str, float] | None = None,
) -> tuple[LocalDeltas, list[FastWeights]]:
    """`Stage2Editor.forward` for one sample of a local kind, restricted to the Gaussians it can
    move (see the module doc); returns their deltas and the new fast weights.  timings: if
    given, receives the seconds of each part (for benchmarks/edit_speed.py).

    The editor's own forward runs, on a sample of the touched Gaussians only, through a shallow
    copy of the editor whose three seams return what the full asset gives: the per-Gaussian
    inputs (`region_inputs`, taken at the rows), the voxels' signal tokens (from their means
    over every Gaussian), and the walk (on the subgraph).  So the head, the gate and the
    mixing are the editor's, whatever they become."""
    clock = _Clock(timings)
    if not can_restrict(editor, s):
        raise ValueError(f"edit kind {s.hint!r} is not local; use the full forward")
    sig = s.signals
    rows = (sig.in_mask_weight > 0).nonzero().squeeze(1)
    vox = s.latent.vox
    prop, graph = editor.propagation, s.latent.graph
    keep, hop = rows, None
    if prop is not None:
        if graph is None:
            raise ValueError("this editor propagates over the asset's graph: the latent has none")
        hop = walk_hops(graph, rows, prop.fine_steps)
        keep = (hop >= 0).nonzero().squeeze(1)
    at = torch.searchsorted(keep, rows)  # the touched Gaussians among keep
    region, voxel_means = region_inputs(editor, s, keep, at)
    voxel_sig = editor.voxel_sig(voxel_means)
    clock("stage2_inputs_all_gaussians")
    size = 0
    walk = None
    if hop is not None:  # (the editor propagates)
        size = int(keep.numel())
        sub_graph = subgraph(graph, keep, hop[keep], prop.fine_steps)
        sub_latent = Stage1Latent(
            vox, s.latent.voxel_latent, s.latent.gauss_feat[keep], None, sub_graph
        )
        sub = EditSample(sub_latent, s.views, _signals_rows(sig, keep), s.colors[keep], s.hint)
        z = editor._walk(sub, region.cand, region.per_gauss, region.normals)
        walk = z[at]
        clock("stage2_walk_subgraph")
    inputs = region.rows(at, rest_too=False)
    view = _rows_editor(editor, inputs, voxel_sig, walk)
    row_vox = dataclasses.replace(vox, gauss_voxel=vox.gauss_voxel[rows])
    latent = Stage1Latent(row_vox, s.latent.voxel_latent, s.latent.gauss_feat[rows], None, None)
    signals = _RowSignals(**vars(_signals_rows(sig, rows)), full=sig)
    out, new_state = view([EditSample(latent, s.views, signals, s.colors[rows], s.hint)], state)
    clock("stage2_network_touched")
    d = out[0]
    return LocalDeltas(rows, d["rgb"], d["rest_map"], d["gate"], size), new_state


HEAD_ROWS = 1 << 18  # Gaussians per chunk of a non-local edit's head (`chunked_forward`)


@torch.no_grad()
def chunked_forward(
    editor: Stage2Editor,
    s: EditSample,
    state: list[FastWeights],
    rows_per_chunk: int | None = None,
    timings: dict[str, float] | None = None,
) -> tuple[dict[str, torch.Tensor], list[FastWeights]]:
    """`Stage2Editor.forward` for one sample of any kind, its per-Gaussian head run on
    `rows_per_chunk` (default HEAD_ROWS) Gaussians at a time: the head's inputs (voxel
    token, features, signals, walk: ~210 floats a Gaussian) and hidden layer took 1.9 GB at
    once at 1M Gaussians.
    Returns the deltas' "rgb", "rest_map" and "gate" for every Gaussian, and the new fast
    weights.  As in `local_forward`, the editor's own forward runs on each chunk through a
    shallow copy whose seams return the whole asset's per-Gaussian inputs, voxel signal
    tokens and walk, and whose blocks (voxel attention, TTT update) run once, for the first
    chunk: their inputs are the voxels and views, the same for every chunk.  Whether a
    recolour walks again, further (Stage2Config.prop_reach_steps), or is centred on its map
    (map_solves), and whether a relight opens every gate (relight_share), is decided over
    every Gaussian's gate and mix, as the full forward decides it."""
    clock = _Clock(timings)
    rows_per_chunk = rows_per_chunk or HEAD_ROWS
    full = editor._gaussian_inputs(s)
    cand, per_gauss, normals = full.cand, full.per_gauss, full.normals
    vox = s.latent.vox
    voxel_sig = editor.voxel_sig(segment_mean(per_gauss, vox.gauss_voxel, vox.num_voxels))
    walker = walk = None
    if editor.propagation is not None:
        walker = editor._walker(s, cand, per_gauss, normals)
        walk = walker()
    clock("stage2_inputs_and_walk")
    n = s.colors.shape[0]
    blocks = nn.ModuleList(_Once(b) for b in editor.blocks)

    def head_chunks(full, walk):
        out: dict[str, torch.Tensor] = {}  # filled chunk by chunk (a cat would hold it twice)
        new_state = state
        for lo in range(0, n, rows_per_chunk):
            rows = torch.arange(lo, min(n, lo + rows_per_chunk), device=s.colors.device)
            inputs = full.rows(rows)
            view = _rows_editor(editor, inputs, voxel_sig, None if walk is None else walk[rows])
            view._modules["blocks"] = blocks
            row_vox = dataclasses.replace(vox, gauss_voxel=vox.gauss_voxel[rows])
            gfeat = s.latent.gauss_feat[rows]
            latent = Stage1Latent(row_vox, s.latent.voxel_latent, gfeat, None, None)
            signals = _RowSignals(**vars(_signals_rows(s.signals, rows)), full=s.signals)
            sample = EditSample(latent, s.views, signals, s.colors[rows], s.hint)
            chunk, new_state = view([sample], state)
            for k in ("rgb", "rest_map", "gate", "mix"):
                v = chunk[0][k]
                if k not in out:
                    out[k] = v.new_empty((n, *v.shape[1:]))
                out[k][lo : lo + v.shape[0]] = v
        return out, new_state

    out, new_state = head_chunks(full, walk)
    clock("stage2_head_chunks")
    # over every Gaussian, as forward decides it
    again = editor._second_pass(s, out["gate"], out["mix"], full.stats)
    if again is not None:
        if again.reach_steps is not None:
            walk = walker(again.reach_steps)
        out, new_state = head_chunks(again.inputs(full, s.signals), walk)
        clock("stage2_second_pass")
    return {k: out[k] for k in ("rgb", "rest_map", "gate", "mix")}, new_state


class _Once(nn.Module):
    """A block that runs once and then returns that first result, whatever its input."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block
        self.out = None

    def forward(self, *args):
        if self.out is None:
            self.out = self.block(*args)
        return self.out


@dataclasses.dataclass
class _RowSignals(GaussianSignals):
    """Some Gaussians' signals whose edit evidence E is the whole asset's (a sum over all)."""

    full: GaussianSignals | None = None

    def evidence(self, tau: float) -> torch.Tensor:
        assert self.full is not None
        return self.full.evidence(tau)


class _Fixed(nn.Module):
    """A module that returns a value computed beforehand, whatever its input."""

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__()
        self.value = value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.value


def _rows_editor(
    editor: Stage2Editor, inputs: GaussianInputs, voxel_sig: torch.Tensor, walk: torch.Tensor | None
) -> Stage2Editor:
    """A shallow copy of the editor (same weights, the original untouched, so concurrent edits
    are safe) whose per-Gaussian inputs, voxel signal tokens and walk are the given ones."""
    view = copy.copy(editor)
    view._modules = dict(editor._modules)  # the copy's own table: the editor keeps its modules
    view._modules["voxel_sig"] = _Fixed(voxel_sig)
    view.__dict__["_gaussian_inputs"] = lambda s: inputs
    view.__dict__["_walker"] = lambda s, cand, per_gauss, normals: lambda steps=None: walk
    view.__dict__["_second_pass"] = lambda s, gate, mix, stats: None  # decided over all
    return view
