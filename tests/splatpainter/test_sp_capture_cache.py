"""Capture scale (#22): the faster opening (one binning per preprocessing view, faint
normals oriented by cell, the anchors' occupied-cell count) and the edge-affinity cache of
non-local edits, each against the plain computation, bit for bit, on test-sized assets."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

import splatpainter.model.propagate as prop
from splatpainter.assets.demo import tiled_demo_asset
from splatpainter.assets.gaussians import GaussianAsset
from splatpainter.camera import orbit_cameras
from splatpainter.edit import EditView, ModelMethod
from splatpainter.model.editor import load_editor
from splatpainter.model.graph import knn as graph_knn
from splatpainter.model.stage2 import recolor_share
from splatpainter.render import render, splat_weights
from splatpainter.render.api import render_and_weights
from splatpainter.train.data import base_colors, with_base_colors


def tiled(per_tile: int, side: int) -> GaussianAsset:
    """The demo asset repeated on a side^3 lattice (as benchmarks/edit_speed.py builds 1M)."""
    return tiled_demo_asset(per_tile, side, step=1.1)[1]


# ------------------------------------------------------------------------- opening
@pytest.mark.parametrize("backend", ["numba", "reference"])
def test_render_and_weights_equal_the_render_and_the_splat_weights(backend):
    asset = tiled(1500, 2)
    cams = orbit_cameras(asset, 2, width=64, height=48, elevation_deg=-30.0)
    for cam in [*cams, orbit_cameras(asset, 3, width=40, height=40)[1]]:
        with torch.no_grad():
            ref = render(asset, cam, backend=backend)
        weights = splat_weights(asset, cam, backend=backend)
        out, got = render_and_weights(asset, cam, backend=backend)
        assert int((weights > 0).sum()) > 500
        assert torch.equal(got, weights)
        for name in ("rgb", "alpha", "depth", "radii", "means2d"):
            assert torch.equal(getattr(out, name), getattr(ref, name)), name
        assert not out.rgb.requires_grad


def test_splat_sums_of_the_compiled_pass_equal_the_gradient_of_a_render():
    """The numba backend's forward-like sums pass (`_kernels_lanes.raster_sums`) against the
    reference backend's autograd: five channels of signed per-pixel values, two odd-sized
    views (tiles cut by the image edge), below and above."""
    from splatpainter.render import splat_sums

    asset = tiled(1500, 2)
    g = torch.Generator().manual_seed(3)
    cams = [*orbit_cameras(asset, 2, width=64, height=48, elevation_deg=-30.0),
            orbit_cameras(asset, 3, width=40, height=41)[1]]  # fmt: skip
    for cam in cams:
        targets = torch.rand(cam.height, cam.width, 5, generator=g) - 0.3
        fast = splat_sums(asset, cam, targets)
        ref = splat_sums(asset, cam, targets, backend="reference")
        assert int((ref != 0).any(1).sum()) > 500
        assert torch.equal(fast != 0, ref != 0)
        torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
        weights = splat_weights(asset, cam)
        assert torch.equal(
            weights, splat_sums(asset, cam, torch.ones(cam.height, cam.width, 1))[:, 0]
        )


def test_faint_normals_by_cells_equal_the_all_pairs_call_on_clustered_points():
    """Dense clusters of faint Gaussians with a few trusted ones spread far and near: the
    cell balls (centre, reach, 16th trusted) must still hold every faint Gaussian's 16
    nearest trusted, so the cells turn each normal as the all-pairs call in float64 does.  The
    float32 all-pairs call rounds its distances (|x|^2 + |y|^2 - 2 x.y, clusters 4 units from
    the origin 0.02 wide) and takes another 16th neighbour on 3 of 6,681 rows here."""
    from splatpainter.model.hypotheses import orient_by_neighbours
    from splatpainter.model.stage1 import orient_faint_locally

    g = torch.Generator().manual_seed(7)
    centres = torch.rand(12, 3, generator=g) * 4
    spread = torch.tensor([0.02, 0.3, 0.05, 1.0])[torch.randint(0, 4, (12,), generator=g)]
    means = torch.cat(
        [c + s * torch.randn(600, 3, generator=g) for c, s in zip(centres, spread, strict=True)]
    )
    n = means.shape[0]
    normals = torch.nn.functional.normalize(torch.randn(n, 3, generator=g), dim=-1)
    trusted = torch.rand(n, generator=g) > 0.93
    log_scales = torch.randn(n, 3, generator=g) - 4
    exact = orient_by_neighbours(normals.double(), means.double(), trusted, log_scales.double())
    flip = (exact * normals.double()).sum(-1) < 0
    ref = torch.where(flip[:, None], -normals, normals)
    assert torch.equal(orient_faint_locally(normals, means, trusted, log_scales), ref)
    assert int(flip.sum()) > 100
    rounded = orient_by_neighbours(normals, means, trusted, log_scales)
    assert int((rounded != ref).any(1).sum()) <= 3


def test_nearest_in_balls_of_the_kernel_equals_the_torch_reference():
    """Each point's k nearest among its own ball: exact ties (points on a lattice, copies of a
    candidate) go to the lower index, a ball with fewer than k pads with -1, as the reference."""
    from splatpainter.model._kernels import nearest_in_balls, nearest_in_balls_reference

    g = torch.Generator().manual_seed(3)
    cand = torch.cat(
        [torch.rand(300, 3, generator=g), torch.randint(0, 4, (200, 3), generator=g) / 4]
    )
    cand = torch.cat([cand, cand[:50]])  # exact duplicates at higher indices
    points = torch.cat(
        [torch.rand(400, 3, generator=g), torch.randint(0, 4, (100, 3), generator=g) / 4]
    )
    sizes = torch.randint(3, 120, (60,), generator=g)
    flat = torch.cat([torch.randperm(cand.shape[0], generator=g)[: int(s)] for s in sizes])
    starts = torch.cumsum(sizes, 0) - sizes
    row_ball = torch.randint(0, 60, (points.shape[0],), generator=g)
    args = (points, row_ball, cand, starts, sizes, flat, 26)
    got, ref = nearest_in_balls(*args), nearest_in_balls_reference(*args)
    assert torch.equal(got, ref)
    assert bool((got == -1).any()) and bool((got[:, 0] >= 0).all())


def test_edge_inputs_of_the_kernel_equal_the_torch_edge_mlp():
    """`EdgeAffinity.from_indices` (the compiled `_kernels.edge_inputs`) against `forward` on
    inputs torch gathers, including coincident ends (the distance's clamp) and a -1 end
    (torch's wrap-around indexing); and `Propagation._affinity` takes it only at inference."""
    from splatpainter.model.propagate import EdgeAffinity, Propagation, edge_geometry

    g = torch.Generator().manual_seed(7)
    n, r, k, e = 500, 300, 9, 16
    torch.manual_seed(0)
    edge = EdgeAffinity(e, 32, 3)
    u = torch.randn(n, e, generator=g)
    points = torch.rand(n, 3, generator=g)
    points[1] = points[0]
    normals = torch.nn.functional.normalize(torch.randn(n, 3, generator=g), dim=-1)
    colors = torch.rand(n, 3, generator=g)
    src = torch.randint(0, n, (r,), generator=g)
    dst = torch.randint(0, n, (r, k), generator=g)
    src[0], dst[0, 0], dst[0, 1], dst[1, 2] = 0, 1, 0, -1
    spacing = torch.tensor(0.03)
    geo = edge_geometry(
        points[src][:, None], points[dst], normals[src][:, None], normals[dst],
        colors[src][:, None], colors[dst], spacing,
    )  # fmt: skip
    with torch.no_grad():
        want = edge(u[src][:, None].expand(-1, k, -1), u[dst], geo)
        got = edge.from_indices(u, points, normals, colors, src, dst, 0.03)
        fused = Propagation._affinity(edge, u, points, normals, colors, src, dst, spacing)
    assert got.shape == (r, k, 3) and torch.allclose(got, want, rtol=0, atol=1e-6)
    assert torch.equal(fused, got)
    with torch.enable_grad():  # training: the differentiable torch path
        trained = Propagation._affinity(edge, u, points, normals, colors, src, dst, spacing)
    assert trained.requires_grad and torch.allclose(trained, want, rtol=0, atol=1e-6)


def test_sheet_flips_of_the_kernel_equal_sheet_vote_in_float64():
    """Which faint normals their neighbours turn: the kernel against `hypotheses.sheet_vote` on
    float64 tensors, bit for bit, on sheets whose neighbours straddle both of the rule's
    thresholds (|cos| near 0.8, offset near the reach); padding (-1) at a row's end counts as
    no neighbour, as a shorter row would."""
    from splatpainter.model._kernels import sheet_flips
    from splatpainter.model.hypotheses import sheet_vote

    g = torch.Generator().manual_seed(5)
    n, k = 4000, 16
    means = torch.rand(n, 3, generator=g) * torch.tensor([1.0, 1.0, 0.02])
    tilt = torch.randn(n, 3, generator=g) * torch.tensor([0.75, 0.75, 0.0])
    normals = torch.nn.functional.normalize(torch.tensor([0.0, 0.0, 1.0]) + tilt, dim=-1)
    normals = normals * torch.where(torch.rand(n, 1, generator=g) < 0.4, -1.0, 1.0)
    log_scales = torch.randn(n, 3, generator=g) - 6
    rows = torch.randperm(n, generator=g)[:1500]
    near = torch.randint(0, n, (rows.numel(), k), generator=g)
    kept = torch.randint(0, k + 1, (rows.numel(),), generator=g)
    kept[:800] = k
    near[torch.arange(k) >= kept[:, None]] = -1
    got = sheet_flips(rows, near, normals, means, log_scales)
    n64, m64, s64 = normals.double(), means.double(), log_scales.double()
    want = torch.zeros(rows.numel(), dtype=torch.bool)
    for c in range(1, k + 1):  # rows with c neighbours, by the torch rule
        at = (kept == c).nonzero().squeeze(1)
        r, j = rows[at], near[at, :c]
        dist = (m64[j] - m64[r][:, None, :]).norm(dim=-1)
        voted = sheet_vote(n64[r], m64[r], s64[r], n64[j], m64[j], dist)
        want[at] = (voted != n64[r]).any(1)
    assert torch.equal(got, want)
    assert 200 < int(got.sum()) < 1300  # the votes go both ways
    cos = (n64[near[:800].clamp_min(0)] * n64[rows[:800]][:, None]).sum(-1).abs()
    assert int(((cos - 0.8).abs() < 0.02).sum()) > 200  # many neighbours near the threshold


def test_anchor_counts_by_bitmap_equal_unique(monkeypatch):
    """The compiled occupancy count is torch's count of distinct cells, and the anchors it
    picks are those that count picks."""
    from splatpainter.model import _kernels, graph

    # points beyond the grid on either side are clamped into its edge cells
    p = torch.rand(20000, 3, generator=torch.Generator().manual_seed(2)) * 3 - 1
    lo = torch.zeros(3, dtype=torch.float64)
    for g in (1, 7, 64, 200):
        cell = 1.0 / g
        ijk = ((p.double() - lo) / cell).floor().long().clamp(0, g - 1)
        want = int(torch.unique((ijk[:, 0] * g + ijk[:, 1]) * g + ijk[:, 2]).numel())
        assert _kernels.occupied_cells(p, lo, cell, g) == want
    means = tiled(800, 2).means
    got = graph.anchor_subsample(means, 300)

    def by_unique(points, lo, cell, g):
        ijk = ((points.double() - lo) / cell).floor().long().clamp(0, g - 1)
        return int(torch.unique((ijk[:, 0] * g + ijk[:, 1]) * g + ijk[:, 2]).numel())

    monkeypatch.setattr(graph, "occupied_cells", by_unique)
    assert torch.equal(got, graph.anchor_subsample(means, 300))


def _brute_knn(q, p, k, exclude_self):
    d = ((q[:, None, :] - p[None]) ** 2).sum(-1)
    if exclude_self:
        np.fill_diagonal(d, np.inf)
    d = np.pad(d, ((0, 0), (0, max(0, k - p.shape[0]))), constant_values=np.inf)
    idx = np.stack([np.lexsort((np.arange(d.shape[1]), row))[:k] for row in d])
    dist = np.take_along_axis(d, idx, 1)
    return np.where(np.isinf(dist), -1, idx), dist


@pytest.mark.parametrize(
    "shape", ["uniform", "plane", "duplicates", "lattice", "far_clusters", "line", "tiny"]
)
def test_grid_knn_is_the_exact_k_nearest_ties_to_the_lower_index(shape):
    """The compiled grid search (`_kernels.grid_knn`, behind graph.knn and graph.nearest)
    against brute force, bit for bit: exact ties (duplicates, lattice points), a surface, a
    line, clusters far apart with queries between them (the search widens ring by ring, then
    scans every cell), and fewer points than k (padded with -1 and inf)."""
    from splatpainter.model._kernels import grid_knn

    rng = np.random.default_rng(7)
    p = {
        "uniform": rng.random((900, 3)),
        "plane": np.c_[rng.random((900, 2)), np.zeros(900)],
        "duplicates": np.repeat(rng.random((120, 3)), 7, 0),
        "lattice": rng.integers(0, 5, (600, 3)) / 4.0,
        "far_clusters": np.r_[rng.random((300, 3)) * 0.01, rng.random((300, 3)) * 0.01 + 5],
        "line": np.c_[np.linspace(0, 1, 500), np.zeros(500), np.zeros(500)],
        "tiny": rng.random((6, 3)),
    }[shape]
    q = np.r_[rng.random((250, 3)) * 1.4 - 0.2, p[:50] + 1e-3]
    for k in (1, 10, 16):
        idx, d2 = grid_knn(p, p, k, exclude_self=True)
        want_idx, want_d2 = _brute_knn(p, p, k, True)
        assert np.array_equal(idx, want_idx) and np.array_equal(d2, want_d2)
        idx, d2 = grid_knn(q, p, k)
        want_idx, want_d2 = _brute_knn(q, p, k, False)
        assert np.array_equal(idx, want_idx) and np.array_equal(d2, want_d2)


def test_knn_graph_pads_missing_neighbours_with_self_loops():
    p = torch.rand(4, 3, generator=torch.Generator().manual_seed(5))
    idx, dist = graph_knn(p, 6)
    assert bool((idx[:, 3:] == torch.arange(4)[:, None]).all())
    assert bool((dist[:, 3:] == 0).all()) and bool((dist[:, :3] > 0).all())


# ------------------------------------------------------------------------- the affinity cache
def test_walk_steps_in_chunks_equal_the_steps_at_once(monkeypatch):
    g = torch.Generator().manual_seed(4)
    n, k, c = 3000, 10, 8
    aff = torch.rand(n, k, c, generator=g)
    nbr = torch.randint(0, n, (n, k), generator=g)
    z0, seeds = torch.randn(n, c, generator=g), torch.randn(n, c, generator=g)
    conf = torch.rand(n, generator=g)
    whole = prop.Propagation._walk(z0, seeds, conf, nbr, aff, 4)
    monkeypatch.setattr(prop, "AFFINITY_ROWS", 97)  # chunks that do not divide n
    assert torch.equal(prop.Propagation._walk(z0, seeds, conf, nbr, aff, 4), whole)


@pytest.fixture(scope="module")
def recolour_setup():
    """A 12k tiled asset, its open editor, a recolour view and a paint view."""
    asset = tiled(1500, 2)
    model = load_editor()
    model.latent_cache = None
    cam = orbit_cameras(asset, 4, width=96, height=96)[0]
    colors = base_colors(asset)
    recoloured = with_base_colors(asset, (colors[:, [1, 2, 0]] * 0.9 + 0.05).clamp(0, 1))
    with torch.no_grad():
        img = render(recoloured, cam).rgb.clamp(0, 1)
        painted = render(asset, cam).rgb.clamp(0, 1).clone()
    painted[30:50, 30:50] = torch.tensor([1.0, 0.0, 1.0])
    return asset, model, EditView(cam, img), EditView(cam, painted)


@pytest.fixture
def small_chunks(monkeypatch):
    """The cache on for the test-sized asset, with many chunks of edges."""
    monkeypatch.setattr(prop, "AFFINITY_CACHE_MIN_GAUSSIANS", 1000)
    monkeypatch.setattr(prop, "AFFINITY_ROWS", 1024)


def _uncached(model, asset, view, state):
    cache = model.stage2.propagation.affinity_cache
    model.stage2.propagation.affinity_cache = None
    try:
        return ModelMethod(model, kind="recolor").apply(asset, [view], state)
    finally:
        model.stage2.propagation.affinity_cache = cache


def _same(a, b) -> bool:
    (asset_a, state_a), (asset_b, state_b) = a, b
    fast = all(
        torch.equal(getattr(x, k), getattr(y, k))
        for x, y in zip(state_a["fast"], state_b["fast"], strict=True)
        for k in ("w0", "w1", "w2")
    )
    return torch.equal(asset_a.sh, asset_b.sh) and fast


def test_recolours_with_the_affinity_cache_equal_those_without(recolour_setup, small_chunks):
    """Cold (every chunk computed), warm (the same asset: none), and after a paint edit (only
    the chunks around the painted Gaussians, written into the entry's tensors in place): each
    recolour equals the uncached one bit for bit, asset and fast weights.  The recolour
    reaches (it walks twice, the shipped reach pass): one look-up per edit, the second walk on
    the first one's affinities."""
    asset, model, view, paint = recolour_setup
    assert model.stage2.config.prop_reach_steps > 0
    cache = prop.AffinityCache(1 << 30)
    model.stage2.propagation.affinity_cache = cache
    method = ModelMethod(model, kind="recolor")
    state = method.initial_state(asset)
    n_chunks = 2 * -(-asset.num_gaussians // prop.AFFINITY_ROWS)  # read-back and fine

    cold = method.apply(asset, [view], state)
    assert cache.misses == 1 and cache.chunks_computed == n_chunks
    assert 0 < cache.size_bytes() <= cache.max_bytes
    ref = _uncached(model, asset, view, state)
    assert _same(cold, ref)
    assert int((cold[0].sh != asset.sh).any(-1).any(-1).sum()) > asset.num_gaussians // 2

    warm = method.apply(asset, [view], state)
    assert cache.hits == 1 and cache.chunks_computed == n_chunks  # nothing recomputed
    assert _same(warm, ref)

    painted, _ = ModelMethod(model, kind="paint").apply(asset, [paint], state)
    assert cache.hits == 1 and cache.misses == 1  # the restricted walk leaves the cache alone
    changed = int((painted.sh != asset.sh).any(-1).any(-1).sum())
    assert 50 < changed < asset.num_gaussians // 4
    storage = [t.untyped_storage().data_ptr() for t in (cache._entry.up, cache._entry.fine_norm)]
    after = method.apply(painted, [view], state)
    recomputed = cache.chunks_computed - n_chunks
    assert cache.hits == 2 and 0 < recomputed < n_chunks
    # the recomputed chunks were written into the entry's own tensors, not into a second copy
    assert storage == [
        t.untyped_storage().data_ptr() for t in (cache._entry.up, cache._entry.fine_norm)
    ]
    assert _same(after, _uncached(model, painted, view, state))
    model.stage2.propagation.affinity_cache = prop.AffinityCache()


def test_the_affinity_cache_is_invalidated_by_weights_graph_and_asset(recolour_setup, small_chunks):
    asset, model, view, _ = recolour_setup
    model = copy.deepcopy(model)  # its weights are changed below
    cache = model.stage2.propagation.affinity_cache
    assert cache is not None and cache.size_bytes() == 0  # a copy carries an empty cache
    cache.max_bytes = 1 << 30
    method = ModelMethod(model, kind="recolor")
    state = method.initial_state(asset)
    method.apply(asset, [view], state)
    assert cache.misses == 1

    with torch.no_grad():  # other weights: every affinity again
        model.stage2.propagation.fine_edge.mlp.fc1.bias.add_(0.01)
    got = method.apply(asset, [view], state)
    assert cache.misses == 2
    assert _same(got, _uncached(model, asset, view, state))

    graph = state["latent"].graph  # the graph changed in place: again
    with torch.no_grad():
        graph.points[0] += 1e-3
    got = method.apply(asset, [view], state)
    assert cache.misses == 3
    assert _same(got, _uncached(model, asset, view, state))

    graph.attrs = graph.attrs.clone()  # a graph tensor replaced: again
    got = method.apply(asset, [view], state)
    assert cache.misses == 4
    assert _same(got, _uncached(model, asset, view, state))

    other = tiled(1400, 2)  # another asset (another graph)
    state2 = method.initial_state(other)
    got = method.apply(other, [view], state2)
    assert cache.misses == 5
    assert _same(got, _uncached(model, other, view, state2))


def test_the_affinity_cache_is_bounded_and_off_in_training(recolour_setup, small_chunks):
    asset, model, view, _ = recolour_setup
    method = ModelMethod(model, kind="recolor")
    state = method.initial_state(asset)
    ref = _uncached(model, asset, view, state)
    tiny = prop.AffinityCache(max_bytes=1000)  # an entry is larger: none is kept
    model.stage2.propagation.affinity_cache = tiny
    assert _same(method.apply(asset, [view], state), ref)
    assert tiny.misses == 1 and tiny.size_bytes() == 0
    assert prop.AffinityCache(max_bytes=0).max_bytes == 0
    big = prop.AffinityCache(1 << 30)
    model.stage2.propagation.affinity_cache = big
    with torch.enable_grad():  # training computes every affinity, keeps nothing
        from splatpainter.edit.methods import build_edit_sample

        sample = build_edit_sample(asset, [view], state["latent"], hint="recolor")
        model.stage2([sample], state["fast"])
    assert big.misses == 0 and big.hits == 0 and big.size_bytes() == 0
    back = pickle.loads(pickle.dumps(big))
    assert back.max_bytes == big.max_bytes and back.size_bytes() == 0
    model.stage2.propagation.affinity_cache = prop.AffinityCache()


def test_affinity_cache_limit_from_the_environment(monkeypatch):
    monkeypatch.setenv(prop.AFFINITY_CACHE_ENV, "2")
    assert prop.affinity_cache_bytes() == 2 << 20
    monkeypatch.setenv(prop.AFFINITY_CACHE_ENV, "0")
    assert prop.AffinityCache().max_bytes == 0
    monkeypatch.setenv(prop.AFFINITY_CACHE_ENV, "lots")
    with pytest.warns(UserWarning, match="not a number"):
        assert prop.affinity_cache_bytes() == prop.AFFINITY_CACHE_DEFAULT_MB << 20


# ------------------------------------------------------------------------- the chunked head
@pytest.mark.parametrize("kind", ["recolor", "relight", "auto"])
def test_the_head_in_chunks_equals_the_full_forward(recolour_setup, kind):
    """A non-local edit at capture scale runs Stage II's head on chunks of Gaussians (the
    blocks once): the deltas and fast weights equal the full forward's bit for bit."""
    from splatpainter.edit.methods import build_edit_sample
    from splatpainter.model.restricted import chunked_forward

    asset, model, view, _ = recolour_setup
    state = ModelMethod(model, kind=kind).initial_state(asset)
    settings = model.stage2.config.signal_settings()
    sample = build_edit_sample(asset, [view], state["latent"], hint=kind, settings=settings)
    with torch.no_grad():
        deltas, fast = model.stage2([sample], state["fast"])
    assert int((deltas[0]["rgb"] != 0).any(-1).sum()) > asset.num_gaussians // 2
    for rows in (4096, 5000, asset.num_gaussians):
        got, got_fast = chunked_forward(model.stage2, sample, state["fast"], rows)
        for k in ("rgb", "rest_map", "gate", "mix"):
            assert torch.equal(got[k], deltas[0][k]), (rows, k)
        for a, b in zip(got_fast, fast, strict=True):
            assert all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("w0", "w1", "w2"))


def test_a_non_local_apply_at_capture_scale_takes_the_chunked_head(recolour_setup, monkeypatch):
    from splatpainter.model import restricted

    asset, model, view, _ = recolour_setup
    method = ModelMethod(model, kind="recolor")
    state = method.initial_state(asset)
    ref = method.apply(asset, [view], state)  # 12k Gaussians: the full forward
    calls = []
    real = restricted.chunked_forward

    def spy(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(restricted, "HEAD_ROWS", 3000)
    monkeypatch.setattr("splatpainter.edit.methods.chunked_forward", spy)
    assert _same(method.apply(asset, [view], state), ref)
    assert calls == [1]


# ------------------------------------------------------------------------- the reach pass
def _forward(model, asset, view, kind):
    from splatpainter.edit.methods import build_edit_sample

    state = ModelMethod(model, kind=kind).initial_state(asset)
    settings = model.stage2.config.signal_settings()
    sample = build_edit_sample(asset, [view], state["latent"], hint=kind, settings=settings)
    with torch.no_grad():
        deltas, fast = model.stage2([sample], state["fast"])
    return deltas[0], fast, sample, state


@pytest.mark.parametrize("kind", ["auto", "recolor"])
def test_a_recolour_walks_again_further(recolour_setup, kind):
    """An edit the first pass reads as a recolour (the affine map carries at least
    prop_reach_share of its edit weight) is the editor with the longer walk, bit for bit; the
    chunked head decides over every Gaussian and agrees."""
    from splatpainter.model.restricted import chunked_forward

    asset, model, view, _ = recolour_setup
    base = model.with_stage2(prop_reach_steps=0)
    first, *_ = _forward(base, asset, view, kind)
    share = recolor_share(first["gate"], first["mix"])
    assert share > 0.95  # a global recolour
    reach = model.with_stage2(prop_reach_steps=96, prop_reach_share=0.9)
    longer = model.with_stage2(prop_reach_steps=0, prop_coarse_steps=96)
    got, fast, sample, state = _forward(reach, asset, view, kind)
    want, want_fast, *_ = _forward(longer, asset, view, kind)
    assert not torch.equal(got["rgb"], first["rgb"])
    for k in ("rgb", "rest_map", "gate", "mix"):
        assert torch.equal(got[k], want[k]), k
    for a, b in zip(fast, want_fast, strict=True):
        assert all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("w0", "w1", "w2"))
    chunked, _ = chunked_forward(reach.stage2, sample, state["fast"], 5000)
    assert all(torch.equal(chunked[k], got[k]) for k in ("rgb", "rest_map", "gate"))


def test_an_edit_read_as_paint_keeps_the_walk_it_was_trained_with(recolour_setup):
    """Below the share (a paint stroke read in auto) or for a local kind, the reach pass
    changes nothing, bit for bit; nor does it in training."""
    asset, model, view, paint = recolour_setup
    base = model.with_stage2(prop_reach_steps=0)
    reach = model.with_stage2(prop_reach_steps=96, prop_reach_share=0.9)
    first, *_ = _forward(base, asset, paint, "auto")
    share = recolor_share(first["gate"], first["mix"])
    assert share < 0.9
    for kind, v in (("auto", paint), ("paint", paint), ("detail", paint)):
        want, *_ = _forward(base, asset, v, kind)
        got, *_ = _forward(reach, asset, v, kind)
        assert all(torch.equal(got[k], want[k]) for k in ("rgb", "rest_map", "gate")), kind
    # a recolour in training: no second pass (the weights learn the walk they were given)
    want, _, sample, state = _forward(base, asset, view, "recolor")
    reach.stage2.train()
    try:
        with torch.no_grad():
            got = reach.stage2([sample], state["fast"])[0][0]
    finally:
        reach.stage2.eval()
    base.stage2.train()
    with torch.no_grad():
        ref = base.stage2([sample], state["fast"])[0][0]
    assert torch.equal(got["rgb"], ref["rgb"])


def test_the_reach_share_is_a_fraction():
    from splatpainter.model.stage2 import Stage2Config

    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="prop_reach_share"):
            Stage2Config(prop_reach_share=bad)
    with pytest.raises(ValueError, match="prop_reach_steps"):
        Stage2Config(prop_reach_steps=-1)
