"""The k-NN graph, the learned propagation over it, and growing an editor by it."""

import dataclasses

import torch

from splatpainter.assets.gaussians import GaussianAsset
from splatpainter.assets.procedural import build_asset, make_demo_asset, sphere
from splatpainter.model import EditorConfig, EditorModel, GaussianSignals, Stage1Config
from splatpainter.model.graph import anchor_subsample, knn, nearest
from splatpainter.model.propagate import build_graph
from splatpainter.model.stage2 import VIEW_CHANNELS, EditSample, Stage2Config
from splatpainter.train.config import ConfigError
from splatpainter.train.loop import grow_state


def small_config(**s2) -> EditorConfig:
    return EditorConfig(
        stage1=Stage1Config(
            grid_size=8, dim=32, latent_dim=64, num_layers=1, num_views=2, view_size=32
        ),
        stage2=Stage2Config(dim=64, num_blocks=1, head_hidden=32, **s2),
    )


def test_knn_matches_brute_force_and_excludes_self():
    p = torch.rand(700, 3, generator=torch.Generator().manual_seed(0))
    idx, dist = knn(p, 6)
    d = torch.cdist(p.double(), p.double())
    d.fill_diagonal_(float("inf"))
    want = d.topk(6, largest=False)
    assert torch.allclose(dist.double(), want.values, atol=1e-6)
    assert not bool((idx == torch.arange(700)[:, None]).any())
    # fewer points than k + 1: the missing neighbours are self-loops at distance 0
    idx, dist = knn(p[:3], 5)
    assert idx.shape == (3, 5) and bool((idx[:, 2:] == torch.arange(3)[:, None]).all())
    q_idx, _ = nearest(p[:5] + 1e-4, p, 1)
    assert q_idx[:, 0].tolist() == [0, 1, 2, 3, 4]


def test_anchor_subsample_is_even_deterministic_and_sized():
    p = torch.rand(5000, 3, generator=torch.Generator().manual_seed(1))
    a = anchor_subsample(p, 400)
    assert torch.equal(a, anchor_subsample(p, 400))
    assert torch.equal(a, torch.unique(a))
    assert 250 <= a.numel() <= 550
    assert torch.equal(anchor_subsample(p[:100], 400), torch.arange(100))


def _two_spheres(n: int = 1200) -> GaussianAsset:
    """Two identical spheres 0.6 apart: no k-NN edge joins them."""
    one = build_asset([sphere(0.15, (0.0, 0.0, 0.0))], n, seed=0).asset
    two = one.replace(means=one.means + torch.tensor([0.6, 0.0, 0.0]))
    return GaussianAsset.concat([one, two])


def _sample(model, asset, signals, hint="auto"):
    lat = model.encode_asset(asset)
    view = torch.rand(16, 16, VIEW_CHANNELS, generator=torch.Generator().manual_seed(3))
    view[..., -1] = 1.0
    colors = 0.5 + 0.28209479 * asset.sh[:, 0]
    return EditSample(lat, [view], signals, colors, hint)


def _walk_inputs(model, asset, seen: torch.Tensor, level: float):
    """(the editor's Stage II, the sample, and the walk's inputs) for an edit that changes the
    `seen` Gaussians by `level` in every channel."""
    n = asset.num_gaussians
    sig = GaussianSignals(
        level * seen[:, None].expand(n, 3), level * seen, seen, 2 * seen, 2 * seen
    )
    sample = _sample(model, asset, sig)
    s2 = model.stage2
    inp = s2._gaussian_inputs(sample)
    return s2, sample, inp.cand, inp.per_gauss, inp.normals


def _random_walk_editor(seed: int, anchors: int) -> EditorModel:
    """An editor whose propagation has large random weights (any learned walk)."""
    torch.manual_seed(seed)
    model = EditorModel(small_config(propagate=True, prop_anchors=anchors)).eval()
    for p in model.stage2.propagation.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return model


def test_walk_never_reaches_a_part_of_the_graph_no_seen_gaussian_is_in():
    """Whatever the weights: the twin across the gap gets exactly zero walk, because the
    graph, not colour, carries the edit there."""
    asset = _two_spheres()
    n = asset.num_gaussians
    model = _random_walk_editor(5, 200)
    seen = torch.zeros(n)
    seen[: n // 4] = 1.0  # a quarter of the first sphere
    s2, sample, cand, per_gauss, normals = _walk_inputs(model, asset, seen, 0.3)
    with torch.no_grad():
        z = s2._walk(sample, cand, per_gauss, normals)
    half = n // 2
    assert z[: n // 2].abs().sum() > 0
    assert torch.count_nonzero(z[half:]) == 0


def test_graph_roundtrips_with_the_latent():
    from splatpainter.model.stage1 import Stage1Latent

    model = EditorModel.initial(small_config(propagate=True, prop_anchors=64))
    lat = model.encode_asset(make_demo_asset(400).asset)
    back = Stage1Latent.from_dict(lat.to_dict())
    assert torch.equal(back.graph.fine_idx, lat.graph.fine_idx)
    assert torch.equal(back.graph.attrs, lat.graph.attrs)


def test_grown_editor_starts_as_the_function_it_grew_from():
    """grow_state: the propagation's new head inputs start at zero weight, so the grown model
    predicts exactly what the source did; the walk then learns from there."""
    asset = make_demo_asset(500).asset
    n = asset.num_gaussians
    src = EditorModel.initial(small_config(), seed=2)
    grown = EditorModel.initial(small_config(propagate=True, prop_anchors=64), seed=7)
    grown.load_state_dict(grow_state(src, grown, "test"))
    g = torch.Generator().manual_seed(4)
    sig = GaussianSignals(
        torch.randn(n, 3, generator=g) * 0.1, torch.full((n,), 0.2), torch.ones(n), torch.ones(n)
    )
    with torch.no_grad():
        a, _ = src.stage2([_sample(src, asset, sig)], src.stage2.init_state(1))
        b, _ = grown.stage2([_sample(grown, asset, sig)], grown.stage2.init_state(1))
    assert torch.equal(a[0]["rgb"], b[0]["rgb"])
    other = EditorModel.initial(dataclasses.replace(small_config(), stage2=Stage2Config(dim=32)))
    try:
        grow_state(other, grown, "other.safetensors")
    except ConfigError as e:
        assert "other.safetensors" in str(e)
    else:
        raise AssertionError("weights of another architecture were taken")


def test_no_evidence_keeps_the_view_dependent_bands_exactly():
    model = EditorModel.initial(small_config(propagate=True, prop_anchors=64))
    asset = make_demo_asset(300, sh_degree=3).asset
    n = asset.num_gaussians
    z = torch.zeros(n)
    sig = GaussianSignals(torch.randn(n, 3), torch.rand(n), z.clone(), z.clone())
    with torch.no_grad():
        out, _ = model.stage2([_sample(model, asset, sig)], model.stage2.init_state(1))
    assert torch.equal(out[0]["rest_map"], torch.eye(3).expand(n, 3, 3))


def test_graph_of_an_asset_has_unit_frame_points():
    asset = make_demo_asset(800).asset
    g = build_graph(asset, 8, 100)
    assert g.points.abs().max() <= 0.5 + 1e-6
    assert g.fine_idx.shape == (800, 8) and g.up_idx.shape[0] == 800
    assert g.anchors.numel() <= 200


def test_walk_in_chunks_equals_the_walk_at_once(monkeypatch):
    """The edge MLP runs in chunks of rows at capture scale (memory); the walk is the same."""
    import splatpainter.model.propagate as prop

    asset = _two_spheres(900)
    n = asset.num_gaussians
    torch.manual_seed(6)
    model = EditorModel(small_config(propagate=True, prop_anchors=150)).eval()
    seen = torch.zeros(n)
    seen[: n // 5] = 1.0
    s2, sample, cand, per_gauss, normals = _walk_inputs(model, asset, seen, 0.2)
    with torch.no_grad():
        whole = s2._walk(sample, cand, per_gauss, normals)
        monkeypatch.setattr(prop, "AFFINITY_ROWS", 97)  # chunks that do not divide n
        chunked = s2._walk(sample, cand, per_gauss, normals)
    assert whole.abs().sum() > 0
    assert torch.allclose(chunked, whole, rtol=1e-5, atol=1e-7)


def test_walk_gather_without_gradients_is_the_indexing_bit_for_bit():
    """The walk's neighbour gather by index_select (inference) gives exactly `z[nbr]`, so an
    edit walks to the same bits as the training-time indexing would."""
    from splatpainter.model.propagate import Propagation, _gather

    g = torch.Generator().manual_seed(0)
    z = torch.randn(300, 8, generator=g)
    nbr = torch.randint(0, 300, (300, 10), generator=g)
    assert torch.equal(_gather(z, nbr), z[nbr])
    aff = torch.rand(300, 10, 8, generator=g)
    seeds, conf = torch.randn(300, 8, generator=g), torch.rand(300, generator=g)
    plain = Propagation._walk(torch.zeros_like(seeds), seeds, conf, nbr, aff, 30)
    with torch.enable_grad():
        tracked = Propagation._walk(
            torch.zeros_like(seeds).requires_grad_(), seeds, conf, nbr, aff, 30
        )
    assert torch.equal(plain, tracked.detach())


def test_edge_affinities_written_in_place_are_the_ones_autograd_sees():
    """Without gradients the edge MLP's input is written into one buffer, not concatenated:
    the same numbers bit for bit as the training path's."""
    from splatpainter.model.propagate import GEO_DIM, EdgeAffinity

    torch.manual_seed(0)
    edge = EdgeAffinity(16, 32, 8)
    u_i = torch.randn(50, 1, 16).expand(-1, 10, -1)
    u_j, geo = torch.randn(50, 10, 16), torch.randn(50, 10, GEO_DIM)
    with torch.no_grad():
        fast = edge(u_i, u_j, geo)
    with torch.enable_grad():
        slow = edge(u_i, u_j, geo)
    assert slow.requires_grad and torch.equal(fast, slow.detach())


def test_a_walk_that_skips_the_rows_it_cannot_use_gives_the_touched_ones_the_same_values():
    """A restricted edit's subgraph computes the fine affinities within fine_steps - 1 hops of
    the touched Gaussians and the read-back ones within fine_steps alone; the touched ones'
    walk values are those of the walk with every affinity of the subgraph (and of the whole
    graph), and the rows it skipped were really left out."""
    from splatpainter.model.restricted import subgraph, walk_hops

    asset = _two_spheres(900)
    n = asset.num_gaussians
    model = _random_walk_editor(7, 150)
    seen = torch.zeros(n)
    seen[40:90] = 1.0
    s2, sample, cand, per_gauss, normals = _walk_inputs(model, asset, seen, 0.2)
    graph, steps = sample.latent.graph, s2.propagation.fine_steps
    touched = seen.nonzero().squeeze(1)
    hop = walk_hops(graph, touched, steps)
    keep = (hop >= 0).nonzero().squeeze(1)
    at = torch.searchsorted(keep, touched)

    def walk(sub):
        latent = dataclasses.replace(
            sample.latent, gauss_feat=sample.latent.gauss_feat[keep], graph=sub
        )
        sig = sample.signals
        rows = dataclasses.replace(
            sig, **{f: getattr(sig, f)[keep] for f in ("residual", "abs_residual", "support")},
            in_mask_weight=sig.in_mask_weight[keep],
            weight=None if sig.weight is None else sig.weight[keep],
        )  # fmt: skip
        s = EditSample(latent, sample.views, rows, sample.colors[keep], sample.hint)
        return s2._walk(s, cand[keep], per_gauss[keep], normals[keep])

    with torch.no_grad():
        whole = s2._walk(sample, cand, per_gauss, normals)[touched]
        every = walk(subgraph(graph, keep))
        some_sub = subgraph(graph, keep, hop[keep], steps)
        some = walk(some_sub)
    assert 0 < some_sub.fine_rows.numel() < some_sub.up_rows.numel() < keep.numel()
    assert whole.abs().sum() > 0
    torch.testing.assert_close(some[at], every[at], rtol=0, atol=1e-7)
    torch.testing.assert_close(some[at], whole, rtol=0, atol=1e-6)
    outer = hop[keep] == steps  # their steps were not computed: they keep their seed alone
    assert not torch.allclose(some[outer], every[outer])


def test_the_graph_keeps_its_spacing_and_anchor_counts_until_they_change():
    model = EditorModel.initial(small_config(propagate=True, prop_anchors=64))
    graph = model.asset_graph(make_demo_asset(600, seed=2).asset)
    spacing, counts = graph.fine_spacing(), graph.anchor_counts()
    assert graph.fine_spacing() is spacing and graph.anchor_counts() is counts
    assert torch.equal(spacing, graph.fine_dist[:, 0].median())
    m = graph.anchors.numel()
    assert torch.equal(counts, torch.bincount(graph.up_idx[:, 0], minlength=m))
    graph.fine_dist.mul_(2.0)  # changed in place: computed again
    graph.up_idx[:, 0] = graph.up_idx[0, 0]
    assert torch.equal(graph.fine_spacing(), 2.0 * spacing)
    assert int(graph.anchor_counts()[graph.up_idx[0, 0]]) == 600
