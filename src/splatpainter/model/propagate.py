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

The edge affinities depend on the asset (its graph, Stage I features, normals and current
colours) and the weights, not on the edit.  At capture scale they are most of a non-local
edit's network time, so inference keeps those of the last large asset (`AffinityCache`) and
the next edit recomputes only the chunks of edges where something they read has changed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import ClassVar

import torch
from torch import nn

from appshell.inputs import env_megabytes
from splatpainter.model.graph import anchor_subsample, knn, nearest
from splatpainter.model.layers import MLP

UP_NEIGHBOURS = 3  # anchors each Gaussian reads the coarse walk from
NODE_ATTRS = 5  # see node_attributes
GEO_DIM = 5  # distance / spacing, |n_i.n_j|, n_i.n_j, offset along n_i / distance, colour diff
AFFINITY_ROWS = 1 << 16  # edge rows per chunk of the edge MLP (see Propagation._affinity)
WALK_EPS = 1e-2  # a Gaussian whose neighbours all have affinity ~0 keeps (almost) nothing
# Graphs of at least this many Gaussians keep their affinities between edits (smaller ones
# compute them in well under a second, and training and evaluation stay on the plain path).
AFFINITY_CACHE_MIN_GAUSSIANS = 50_000
AFFINITY_CACHE_ENV = "SPLATPAINTER_AFFINITY_CACHE_MB"
AFFINITY_CACHE_DEFAULT_MB = 1024  # a 1M-Gaussian asset's entry takes about 500 MB


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
    # A restricted edit's subgraph (model/restricted.py) holds only some of an anchor's
    # Gaussians: it carries the whole asset's Gaussian count per anchor [M] (not a field: a
    # graph's own counts follow from up_idx).
    home_count: ClassVar[torch.Tensor | None] = None
    # ... and needs the fine and read-back affinities of some of its rows only (indices; None:
    # every row; the others are zero, and a walk step gives such a Gaussian its seed alone).
    fine_rows: ClassVar[torch.Tensor | None] = None
    up_rows: ClassVar[torch.Tensor | None] = None

    def _kept(self, name: str, source: torch.Tensor, compute: Callable[[], torch.Tensor]):
        """compute(), kept on the graph while `source` is the same tensor, unchanged in place:
        at a million Gaussians each restricted edit's subgraph asks for these again."""
        memo = self.__dict__.get(name)
        if memo is None or memo[0] is not source or memo[1] != source._version:
            memo = (source, source._version, compute())
            self.__dict__[name] = memo
        return memo[2]

    def fine_spacing(self) -> torch.Tensor:
        """The median distance to the nearest neighbour: the walk's unit of length."""
        return self._kept("_spacing", self.fine_dist, lambda: self.fine_dist[:, 0].median())

    def anchor_counts(self) -> torch.Tensor:
        """[M] Gaussians homed at each anchor (what a subgraph carries as `home_count`)."""
        m = self.anchors.numel()
        return self._kept(
            "_counts", self.up_idx, lambda: torch.bincount(self.up_idx[:, 0], minlength=m)
        )

    def to_dict(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name).cpu() for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict[str, torch.Tensor], device="cpu") -> SplatGraph:
        return cls(**{f.name: d[f.name].to(device) for f in fields(cls)})


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


def affinity_cache_bytes() -> int:
    """The affinity cache's limit the environment names (0: off); unreadable: the default."""
    return env_megabytes(AFFINITY_CACHE_ENV, AFFINITY_CACHE_DEFAULT_MB)


@dataclass
class _Affinities:
    """One graph's read-back and fine affinities, and everything they were computed from."""

    graph: SplatGraph
    tensors: tuple[torch.Tensor, ...]  # the graph's tensors then ...
    versions: tuple[int, ...]  # ... and their in-place versions
    params: list[torch.Tensor]  # the propagation's weights (copies)
    rows: int  # AFFINITY_ROWS: the chunks the affinities were computed in
    u: torch.Tensor  # [N, embed] node embeddings
    normals: torch.Tensor  # [N, 3]
    colors: torch.Tensor  # [N, 3]
    up: torch.Tensor  # [N, UP_NEIGHBOURS, C] read-back affinities
    fine_norm: torch.Tensor  # [N, k, C] fine affinities, normalised per Gaussian (`_normalise`)

    def nbytes(self) -> int:
        ts = [self.u, self.normals, self.colors, self.up, self.fine_norm, *self.params]
        return sum(t.numel() * t.element_size() for t in ts)


def _graph_tensors(graph: SplatGraph) -> tuple[torch.Tensor, ...]:
    return tuple(getattr(graph, f.name) for f in fields(SplatGraph))


class AffinityCache:
    """The affinities of the last large asset an editor walked on (one entry, at most
    `max_bytes`; 0 keeps nothing).  An entry is reused only for the same graph object (its
    tensors unchanged in place), the same weights (compared exactly) and the same chunking;
    then every chunk of AFFINITY_ROWS edges whose Gaussians' embeddings, normals and colours
    are all bit-equal to the entry's is taken from it, and the others are recomputed as the
    plain computation computes them (the same chunks, so the same bits).  Thread-safe; a copy
    or pickle of a model carries an empty cache."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = affinity_cache_bytes() if max_bytes is None else int(max_bytes)
        self._entry: _Affinities | None = None
        self._lock = threading.Lock()
        self.hits = 0  # calls that reused an entry (wholly or in part)
        self.misses = 0  # calls that computed every affinity
        self.chunks_computed = 0  # fine and read-back chunks computed, over all calls

    def clear(self) -> None:
        with self._lock:
            self._entry = None

    def size_bytes(self) -> int:
        e = self._entry
        return 0 if e is None else e.nbytes()

    def __getstate__(self) -> dict:
        return {"max_bytes": self.max_bytes}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["max_bytes"])

    def __deepcopy__(self, memo: dict) -> AffinityCache:
        return AffinityCache(self.max_bytes)

    def _usable(self, graph: SplatGraph, params: list[torch.Tensor], u: torch.Tensor):
        e = self._entry
        if e is None or e.graph is not graph or e.rows != AFFINITY_ROWS:
            return None
        now = _graph_tensors(graph)  # the same tensors, not changed in place since
        if any(a is not b for a, b in zip(e.tensors, now, strict=True)):
            return None
        if e.versions != tuple(t._version for t in now):
            return None
        if e.u.shape != u.shape or e.u.dtype != u.dtype:
            return None
        if len(e.params) != len(params) or not all(
            a.shape == b.shape and torch.equal(a, b) for a, b in zip(e.params, params, strict=True)
        ):
            return None
        return e


class EdgeAffinity(nn.Module):
    """C affinities in (0, 1) per edge from the two end embeddings and their geometry."""

    def __init__(self, embed_dim: int, hidden: int, channels: int) -> None:
        super().__init__()
        self.mlp = MLP(2 * embed_dim + GEO_DIM, hidden, channels)

    def forward(self, u_i, u_j, geo) -> torch.Tensor:
        x = torch.cat([u_i * u_j, (u_i - u_j).abs(), geo], -1)
        return torch.sigmoid(self.mlp(x))

    def from_indices(self, u, points, normals, colors, src, dst, spacing: float) -> torch.Tensor:
        """`forward` on the edges from the Gaussians src [R] to dst [R, k] (inference), their
        inputs made in one pass by the compiled `_kernels.edge_inputs`."""
        from splatpainter.model._kernels import edge_inputs

        return torch.sigmoid(self.mlp(edge_inputs(u, points, normals, colors, src, dst, spacing)))


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


@dataclass
class PreparedWalk:
    """One edit's walk, all but its steps: what a walk of any length starts from (a second,
    longer walk of the same edit reuses every affinity)."""

    graph: SplatGraph
    seeds: torch.Tensor  # [N, C]
    conf: torch.Tensor  # [N]
    anchor_seeds: torch.Tensor  # [M, C] seeds pooled to each anchor
    anchor_conf: torch.Tensor  # [M]
    coarse_aff: torch.Tensor  # [M, k, C] affinities among the anchors
    up_aff: torch.Tensor  # [N, UP_NEIGHBOURS, C] read-back affinities
    fine_norm: torch.Tensor  # [N, k, C] normalised fine affinities


def _gather(z: torch.Tensor, nbr: torch.Tensor) -> torch.Tensor:
    """z[nbr] ([R, k, C] rows of z [N, C]): without gradients by index_select, the same values
    without advanced indexing's overhead (once per walk step); with them as `z[nbr]`, whose
    backward the training runs were made (and are repeated bit for bit) with."""
    if torch.is_grad_enabled() and z.requires_grad:
        return z[nbr]
    return z.index_select(0, nbr.reshape(-1)).view(*nbr.shape, z.shape[-1])


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
        # the last large asset's affinities, for the next edit (inference only; not weights)
        self.affinity_cache: AffinityCache | None = AffinityCache()

    @staticmethod
    def _affinity(
        edge, u, points, normals, colors, src, dst, spacing, post=None, need=None, old=None,
        in_place=False,
    ) -> torch.Tensor:  # fmt: skip
        """[R, k, C] affinities of the edges from the Gaussians `src` [R] to `dst` [R, k], in
        chunks of AFFINITY_ROWS rows: the edge MLP's inputs and hidden layer are ~40 floats
        per edge, 2.8 GB at a million Gaussians at once (each row's result is its own).
        post: applied to each chunk's result; need [R] bool with old [R, k, C]: a chunk with
        no row in need is taken from old (the rest are computed in the same chunks); with
        in_place, old is the caller's to overwrite, and the recomputed chunks are written into
        it (at a million Gaussians a second [R, k, C] beside it was the peak of an edit)."""

        fused = (  # inference: the compiled edge inputs (EdgeAffinity.from_indices)
            not torch.is_grad_enabled() and u.dtype == torch.float32 and u.device.type == "cpu"
            and spacing.numel() == 1
        )  # fmt: skip
        if fused:
            nodes = [t.to(torch.float32).contiguous() for t in (u, points, normals, colors)]

        def rows(src, dst):
            if fused:
                out = edge.from_indices(*nodes, src, dst, float(spacing))
            else:
                geo = edge_geometry(
                    points[src][:, None], points[dst], normals[src][:, None], normals[dst],
                    colors[src][:, None], colors[dst], spacing,
                )  # fmt: skip
                out = edge(u[src][:, None].expand(-1, dst.shape[1], -1), u[dst], geo)
            return out if post is None else post(out)

        if src.shape[0] <= AFFINITY_ROWS:
            chunks = [(src, dst, need, old)]
        else:
            pieces = [src.split(AFFINITY_ROWS), dst.split(AFFINITY_ROWS)]
            if need is not None:
                pieces += [need.split(AFFINITY_ROWS), old.split(AFFINITY_ROWS)]
            chunks = [(*c, None, None) if need is None else c for c in zip(*pieces, strict=True)]
        if need is not None and not any(bool(n.any()) for _, _, n, _ in chunks):
            return old  # nothing to recompute: the very tensor (no copy)
        if len(chunks) == 1:
            s, d, n, o = chunks[0]
            return rows(s, d) if n is None or bool(n.any()) else o
        reuse = in_place and old is not None
        out = old if reuse else None
        at = 0  # each chunk written into place: a cat of them held both (+0.5 GB at 1M)
        for s, d, n, o in chunks:
            stale = n is None or bool(n.any())
            if stale or not reuse:  # (a kept chunk of old is already in place)
                part = rows(s, d) if stale else o
                if out is None:
                    out = part.new_empty((src.shape[0], *part.shape[1:]))
                out[at : at + s.shape[0]] = part
            at += s.shape[0]
        return out

    @classmethod
    def _rows_affinity(cls, edge, args, dst, spacing, rows, post=None) -> torch.Tensor:
        """`_affinity` of every Gaussian's edges (args: u, points, normals, colors, every), or
        of the `rows` [R] alone, the others zero."""
        if rows is None:
            return cls._affinity(edge, *args, dst, spacing, post)
        *nodes, every = args
        out = cls._affinity(edge, *nodes, rows, dst[rows], spacing, post)
        return out.new_zeros(every.shape[0], *out.shape[1:]).index_copy_(0, rows, out)

    @staticmethod
    def _normalise(aff: torch.Tensor) -> torch.Tensor:
        """a_ij / (sum_j a_ij + eps): what a walk step weighs its neighbours by."""
        return aff / (aff.sum(1, keepdim=True) + WALK_EPS)

    @staticmethod
    def _walk(z0, seeds, conf, nbr, aff, steps: int, norm=None) -> torch.Tensor:
        """steps of z <- conf s + (1 - conf) sum_j a_ij z_j / (sum_j a_ij + eps) (norm: the
        normalised affinities, if already known).  At capture scale each step runs in chunks
        of rows (the same numbers, row by row; [N, k, C] temporaries are 320 MB at 1M)."""
        if norm is None:
            norm = Propagation._normalise(aff)  # [N, k, C]
        held = conf[:, None] * seeds
        keep = 1.0 - conf[:, None]
        n = nbr.shape[0]
        z = z0
        for _ in range(steps):
            if n <= AFFINITY_ROWS:
                z = held + keep * (norm * _gather(z, nbr)).sum(1)
                continue
            nxt = torch.empty_like(held)
            for lo in range(0, n, AFFINITY_ROWS):
                r = slice(lo, lo + AFFINITY_ROWS)
                nxt[r] = held[r] + keep[r] * (norm[r] * _gather(z, nbr[r])).sum(1)
            z = nxt
        return z

    def _cacheable(self, graph: SplatGraph) -> bool:
        """Inference on a large asset's own graph (not a restricted edit's subgraph)."""
        cache = self.affinity_cache
        return (
            cache is not None
            and cache.max_bytes > 0
            and not self.training
            and not torch.is_grad_enabled()
            and graph.fine_idx.shape[0] >= AFFINITY_CACHE_MIN_GAUSSIANS
            and getattr(graph, "cacheable", True)
        )

    def _fine_and_up(self, graph, u, points, normals, colors, spacing, c_spacing):
        """(read-back affinities [N, UP, C], normalised fine affinities [N, k, C]), from the
        affinity cache where it holds them (see AffinityCache)."""
        a, up, fn = graph.anchors, graph.up_idx, graph.fine_idx
        every = torch.arange(u.shape[0], device=u.device)
        args = (u, points, normals, colors, every)
        if not self._cacheable(graph):
            aff_up = self._rows_affinity(self.up_edge, args, a[up], c_spacing, graph.up_rows)
            norm = self._normalise
            fine = self._rows_affinity(self.fine_edge, args, fn, spacing, graph.fine_rows, norm)
            return aff_up, fine
        cache = self.affinity_cache
        params = [p.detach() for p in self.parameters()]
        with cache._lock:
            e = cache._usable(graph, params, u)
            need_up = need_fine = None
            if e is not None:
                changed = (u != e.u).any(1) | (normals != e.normals).any(1)
                changed |= (colors != e.colors).any(1)
                need_up = changed | changed[a[up]].any(1)
                need_fine = changed | changed[fn].any(1)
                if bool(need_fine.all()):  # every edge anew (a recolour before): a miss
                    e = need_up = need_fine = None
            if e is not None:
                cache.hits += 1
            else:
                cache.misses += 1
            # the entry's tensors become this call's (the cache is the only one that keeps them
            # past an edit) and are updated in place: no second copy beside them
            cache._entry = None
            old_up = None if e is None else e.up
            old_fine = None if e is None else e.fine_norm
            del e
            aff_up = self._affinity(
                self.up_edge, *args, a[up], c_spacing, need=need_up, old=old_up, in_place=True
            )
            fine = self._affinity(
                self.fine_edge, *args, fn, spacing, post=self._normalise, need=need_fine,
                old=old_fine, in_place=True,
            )  # fmt: skip
            for need in (need_up, need_fine):
                parts = (every if need is None else need).split(AFFINITY_ROWS)
                cache.chunks_computed += sum(need is None or bool(n.any()) for n in parts)
            tensors = _graph_tensors(graph)
            entry = _Affinities(
                graph, tensors, tuple(t._version for t in tensors), [p.clone() for p in params],
                AFFINITY_ROWS, u, normals.clone(), colors.clone(), aff_up, fine,
            )  # fmt: skip
            cache._entry = entry if entry.nbytes() <= cache.max_bytes else None
        return aff_up, fine

    def prepare(
        self,
        graph: SplatGraph,
        nodes: torch.Tensor,
        seed_inputs: torch.Tensor,
        seen_weight: torch.Tensor,
        normals: torch.Tensor,
        colors: torch.Tensor,
        seed_rows: torch.Tensor | None = None,
    ) -> PreparedWalk:
        """Everything a walk of any length needs (see `forward` for the arguments; seed_rows:
        the Gaussians with seen weight, when seed_inputs holds their rows alone)."""
        points = graph.points
        u = self.embed(nodes)
        conf = 1.0 - torch.exp(-seen_weight.clamp_min(0) / self.conf_weight)
        if seed_rows is None:
            seed_rows = (seen_weight > 0).nonzero().squeeze(1)
            seed_inputs = seed_inputs[seed_rows]
        # an unseen Gaussian holds no seed (of a million, a stroke sees some thousands)
        seeds = u.new_zeros(u.shape[0], self.channels).index_copy(
            0, seed_rows, self.seed(seed_inputs).to(u.dtype)
        )
        spacing = graph.fine_spacing().clamp_min(1e-9)
        # coarse level: seeds pooled to the nearest anchor
        a = graph.anchors
        m = a.shape[0]
        home = graph.up_idx[:, 0]
        w = conf[:, None]
        pooled = seeds.new_zeros(m, self.channels).index_add_(0, home, w * seeds)
        mass = conf.new_zeros(m).index_add_(0, home, conf)
        if graph.home_count is not None:
            count = graph.home_count.to(conf)
        else:
            count = conf.new_zeros(m).index_add_(0, home, torch.ones_like(conf))
        s_a = pooled / mass.clamp_min(1e-6)[:, None]
        c_a = mass / count.clamp_min(1.0)  # the anchor's cell is that well seen
        cn = graph.coarse_idx
        c_spacing = graph.coarse_dist[:, 0].median().clamp_min(1e-9)
        aff = self._affinity(self.coarse_edge, u, points, normals, colors, a, a[cn], c_spacing)
        # the read-back and fine affinities (they do not depend on the edit: maybe cached)
        aff_up, norm = self._fine_and_up(graph, u, points, normals, colors, spacing, c_spacing)
        return PreparedWalk(graph, seeds, conf, s_a, c_a, aff, aff_up, norm)

    def walk(self, prep: PreparedWalk, coarse_steps: int | None = None) -> torch.Tensor:
        """The walk [N, C] (coarse_steps among the anchors: default the module's)."""
        g = prep.graph
        steps = self.coarse_steps if coarse_steps is None else coarse_steps
        z_a = self._walk(
            torch.zeros_like(prep.anchor_seeds), prep.anchor_seeds, prep.anchor_conf,
            g.coarse_idx, prep.coarse_aff, steps,
        )  # fmt: skip
        # read back: each Gaussian from its nearest anchors, by learned affinity
        aff_up = prep.up_aff
        z = (aff_up * z_a[g.up_idx]).sum(1) / (aff_up.sum(1) + WALK_EPS)
        # fine level: a few steps on the full graph sharpen boundaries
        return self._walk(
            z, prep.seeds, prep.conf, g.fine_idx, None, self.fine_steps, norm=prep.fine_norm
        )

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
        return self.walk(self.prepare(graph, nodes, seed_inputs, seen_weight, normals, colors))
