"""Learned propagation: where an edit spreads, decided over the 3D structure of the asset.

The edit views say something only about the Gaussians they see.  Which unseen Gaussians share
the fate of the seen ones is a question of 3D structure: spatial neighbourhood, surface
continuity, object instance, then appearance.  This module answers it with a learned random walk
with restart on the asset's k-nearest-neighbour graph, at two levels:

1. every Gaussian gets a small embedding u_i of what it is (Stage I feature, colour, normal,
   scale, opacity; no position, so an identical twin elsewhere gets the same embedding);
2. every edge (i, j) gets C learned affinities a_ij = sigmoid(MLP(u_i * u_j, |u_i - u_j|,
   distance / local spacing, normal agreement, offset along the normal, colour difference));
3. the seen Gaussians emit C-channel seeds s_i = MLP(their edit evidence), held with a confidence
   c_i that grows with how much the edit views see them;
4. seeds are pooled to about `anchors` evenly spread Gaussians and walked for `coarse_steps`
   steps there (reach across the asset at any Gaussian count), read back to every Gaussian
   through learned affinities to its nearest anchors, and refined for `fine_steps` steps on the
   full graph:  z_i <- c_i s_i + (1 - c_i) sum_j a_ij z_j / (sum_j a_ij + eps).

A Gaussian the walk never reaches (an identical twin across a gap, a part behind a fence of low
affinities) ends with z = 0: it is the graph, not colour, that carries the edit there.  The
graph (`SplatGraph`) is plain data built once per asset (`build_graph`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from splatpainter.model.graph import anchor_subsample, knn, nearest
from splatpainter.model.layers import MLP

UP_NEIGHBOURS = 3  # anchors each Gaussian reads the coarse walk from
NODE_ATTRS = 5  # see node_attributes
GEO_DIM = 5  # distance / spacing, |n_i.n_j|, n_i.n_j, offset along n_i / distance, colour diff
AFFINITY_ROWS = 1 << 16  # edge rows per chunk of the edge MLP (see Propagation._affinity)
WALK_EPS = 1e-2  # a Gaussian whose neighbours all have affinity ~0 keeps (almost) nothing


@dataclass
class SplatGraph:
    """The two-level k-NN graph of one asset (indices into its Gaussians; no learning)."""

    fine_idx: torch.Tensor  # [N, k] nearest other Gaussians
    fine_dist: torch.Tensor  # [N, k]
    anchors: torch.Tensor  # [M] indices of the anchor Gaussians
    coarse_idx: torch.Tensor  # [M, k] nearest other anchors (indices into anchors)
    coarse_dist: torch.Tensor  # [M, k]
    up_idx: torch.Tensor  # [N, UP_NEIGHBOURS] nearest anchors of each Gaussian
    up_dist: torch.Tensor  # [N, UP_NEIGHBOURS]
    points: torch.Tensor  # [N, 3] centres in the asset's unit frame (centre 0, side 1)
    attrs: torch.Tensor  # [N, NODE_ATTRS] scale-free shape and appearance of each Gaussian

    def to_dict(self) -> dict[str, torch.Tensor]:
        return {k: getattr(self, k).cpu() for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict[str, torch.Tensor], device="cpu") -> SplatGraph:
        return cls(**{k: d[k].to(device) for k in cls.__dataclass_fields__})


def node_attributes(asset, spacing: torch.Tensor) -> torch.Tensor:
    """[N, NODE_ATTRS]: sorted log-scales in units of the local spacing (flat or round, small
    or large), opacity, and the energy of the view-dependent SH bands."""
    ls = torch.sort(asset.log_scales.detach(), -1).values - spacing.log()
    opacity = torch.sigmoid(asset.opacity_logits.detach())[:, None]
    rest = asset.sh[:, 1:, :].detach()
    energy = rest.pow(2).sum((1, 2)).sqrt()[:, None] if rest.shape[1] else opacity * 0
    return torch.cat([ls, opacity, torch.log1p(10.0 * energy)], -1)


def build_graph(asset, k: int, anchors: int) -> SplatGraph:
    """k-NN graphs over all Gaussians and over ~`anchors` evenly spread ones, with each
    Gaussian's position in the unit frame and its scale-free attributes."""
    means = asset.means.detach()
    fine_idx, fine_dist = knn(means, k)
    anc = anchor_subsample(means, anchors)
    coarse_idx, coarse_dist = knn(means[anc], k)
    up_idx, up_dist = nearest(means, means[anc], UP_NEIGHBOURS)
    if up_idx.shape[1] < UP_NEIGHBOURS:  # fewer anchors than that: repeat the nearest
        pad = UP_NEIGHBOURS - up_idx.shape[1]
        up_idx = torch.cat([up_idx, up_idx[:, :1].expand(-1, pad)], 1)
        up_dist = torch.cat([up_dist, up_dist[:, :1].expand(-1, pad)], 1)
    lo, hi = means.min(0).values, means.max(0).values
    extent = (hi - lo).max().clamp_min(1e-9)
    points = (means - (lo + hi) / 2) / extent
    spacing = fine_dist[:, 0].median().clamp_min(1e-12)
    return SplatGraph(
        fine_idx, fine_dist / extent, anc, coarse_idx, coarse_dist / extent, up_idx,
        up_dist / extent, points, node_attributes(asset, spacing),
    )  # fmt: skip


class EdgeAffinity(nn.Module):
    """C affinities in (0, 1) per edge from the two end embeddings and their geometry."""

    def __init__(self, embed_dim: int, hidden: int, channels: int) -> None:
        super().__init__()
        self.mlp = MLP(2 * embed_dim + GEO_DIM, hidden, channels)

    def forward(self, u_i, u_j, geo) -> torch.Tensor:
        return torch.sigmoid(self.mlp(torch.cat([u_i * u_j, (u_i - u_j).abs(), geo], -1)))


def edge_geometry(
    p_i: torch.Tensor,
    p_j: torch.Tensor,
    n_i: torch.Tensor,
    n_j: torch.Tensor,
    c_i: torch.Tensor,
    c_j: torch.Tensor,
    spacing: torch.Tensor,
) -> torch.Tensor:
    """[..., GEO_DIM] scale-free geometry of edges (i, j); spacing: the local length unit."""
    d = p_j - p_i
    dist = d.norm(dim=-1).clamp_min(1e-12)
    cos = (n_i * n_j).sum(-1)
    along = (d * n_i).sum(-1).abs() / dist
    return torch.stack(
        [
            torch.log1p(dist / spacing),
            cos.abs(),
            cos,
            along,
            (c_i - c_j).abs().sum(-1),
        ],
        -1,
    )


class Propagation(nn.Module):
    """Seeds from the seen Gaussians, walked over the learned-affinity graph (see module doc)."""

    def __init__(
        self,
        node_dim: int,
        seed_dim: int,
        channels: int = 8,
        embed_dim: int = 16,
        hidden: int = 32,
        coarse_steps: int = 24,
        fine_steps: int = 4,
        conf_weight: float = 0.5,
    ) -> None:
        super().__init__()
        self.channels = channels
        self.coarse_steps = coarse_steps
        self.fine_steps = fine_steps
        self.conf_weight = conf_weight
        self.embed = MLP(node_dim, hidden, embed_dim)
        self.seed = MLP(seed_dim, hidden, channels)
        self.fine_edge = EdgeAffinity(embed_dim, hidden, channels)
        self.coarse_edge = EdgeAffinity(embed_dim, hidden, channels)
        self.up_edge = EdgeAffinity(embed_dim, hidden, channels)

    @staticmethod
    def _affinity(edge, u, points, normals, colors, src, dst, spacing) -> torch.Tensor:
        """[R, k, C] affinities of the edges from the Gaussians `src` [R] to `dst` [R, k], in
        chunks of AFFINITY_ROWS rows: the edge MLP's inputs and hidden layer are ~40 floats
        per edge, 2.8 GB at a million Gaussians at once (each row's result is its own)."""

        def rows(src, dst):
            geo = edge_geometry(
                points[src][:, None], points[dst], normals[src][:, None], normals[dst],
                colors[src][:, None], colors[dst], spacing,
            )  # fmt: skip
            return edge(u[src][:, None].expand(-1, dst.shape[1], -1), u[dst], geo)

        if src.shape[0] <= AFFINITY_ROWS:
            return rows(src, dst)
        parts = zip(src.split(AFFINITY_ROWS), dst.split(AFFINITY_ROWS), strict=True)
        return torch.cat([rows(s, d) for s, d in parts])

    @staticmethod
    def _walk(z0, seeds, conf, nbr, aff, steps: int) -> torch.Tensor:
        """steps of z <- conf s + (1 - conf) sum_j a_ij z_j / (sum_j a_ij + eps)."""
        norm = aff / (aff.sum(1, keepdim=True) + WALK_EPS)  # [N, k, C]
        held = conf[:, None] * seeds
        keep = 1.0 - conf[:, None]
        z = z0
        for _ in range(steps):
            z = held + keep * (norm * z[nbr]).sum(1)
        return z

    def forward(
        self,
        graph: SplatGraph,
        nodes: torch.Tensor,
        seed_inputs: torch.Tensor,
        seen_weight: torch.Tensor,
        normals: torch.Tensor,
        colors: torch.Tensor,
    ) -> torch.Tensor:
        """Per-Gaussian walk result [N, C].

        nodes [N, node_dim]: what each Gaussian is; seed_inputs [N, seed_dim]: its edit evidence
        (zero where unseen); seen_weight [N]: its compositing weight over the edit views (pixels).
        """
        points = graph.points
        u = self.embed(nodes)
        conf = 1.0 - torch.exp(-seen_weight.clamp_min(0) / self.conf_weight)
        seeds = self.seed(seed_inputs) * (seen_weight > 0).to(u.dtype)[:, None]
        spacing = graph.fine_dist[:, 0].median().clamp_min(1e-9)
        # coarse level: pool seeds to the nearest anchor, walk among the anchors
        a = graph.anchors
        m = a.shape[0]
        home = graph.up_idx[:, 0]
        w = conf[:, None]
        pooled = seeds.new_zeros(m, self.channels).index_add_(0, home, w * seeds)
        mass = conf.new_zeros(m).index_add_(0, home, conf)
        count = conf.new_zeros(m).index_add_(0, home, torch.ones_like(conf))
        s_a = pooled / mass.clamp_min(1e-6)[:, None]
        c_a = mass / count.clamp_min(1.0)  # the anchor's cell is that well seen
        cn = graph.coarse_idx
        c_spacing = graph.coarse_dist[:, 0].median().clamp_min(1e-9)
        aff = self._affinity(self.coarse_edge, u, points, normals, colors, a, a[cn], c_spacing)
        z_a = self._walk(torch.zeros_like(s_a), s_a, c_a, cn, aff, self.coarse_steps)
        # read back: each Gaussian from its nearest anchors, by learned affinity
        up = graph.up_idx
        every = torch.arange(u.shape[0], device=u.device)
        aff_up = self._affinity(self.up_edge, u, points, normals, colors, every, a[up], c_spacing)
        z = (aff_up * z_a[up]).sum(1) / (aff_up.sum(1) + WALK_EPS)
        # fine level: a few steps on the full graph sharpen boundaries
        fn = graph.fine_idx
        aff = self._affinity(self.fine_edge, u, points, normals, colors, every, fn, spacing)
        return self._walk(z, seeds, conf, fn, aff, self.fine_steps)
