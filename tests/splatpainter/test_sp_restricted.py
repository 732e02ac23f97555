"""Edits at capture scale: the restricted Stage II path, the disk cache of Stage I latents, and
the region-by-region orientation of faint normals, each against the plain computation."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from splatpainter.assets.demo import tiled_demo_asset
from splatpainter.assets.gaussians import GaussianAsset
from splatpainter.assets.procedural import make_demo_asset
from splatpainter.camera import orbit_cameras
from splatpainter.edit import EditView, ModelMethod
from splatpainter.edit.methods import apply_color_delta, build_edit_sample
from splatpainter.model.editor import load_editor
from splatpainter.model.latent_cache import LatentCache, LatentCacheWarning
from splatpainter.model.restricted import local_forward
from splatpainter.render import render


def tiled(per_tile: int, side: int) -> GaussianAsset:
    """The demo asset repeated on a side^3 lattice (as benchmarks/edit_speed.py builds 1M)."""
    return tiled_demo_asset(per_tile, side, step=1.1)[1]


def painted_view(asset, index: int = 0, size: int = 128, color=(1.0, 0.0, 1.0)) -> EditView:
    cam = orbit_cameras(asset, 4, width=size, height=size)[index]
    img = render(asset, cam).rgb.clamp(0, 1).clone()
    img[size // 3 : size // 2, size // 4 : size // 2] = torch.tensor(color)
    return EditView(cam, img)


def two_view_solve(iters: int) -> tuple[tuple, dict]:
    """`solve_color_delta`'s arguments for two painted views of the tiled asset."""
    from splatpainter.assets.gaussians import sh_dc_to_rgb
    from splatpainter.edit.signals import gather_signals

    asset = tiled(2500, 2)
    views = [painted_view(asset, 0), painted_view(asset, 2, color=(0.2, 0.9, 0.1))]
    signals, evidence = gather_signals(asset, views)
    args = (
        asset,
        [ev.view.camera for ev in evidence],
        [ev.wanted_change for ev in evidence],
        signals.in_mask_weight > 0,
        sh_dc_to_rgb(asset.sh[:, 0, :]).clamp_max(1.0),
    )
    return args, {
        "contributing": [ev.contributing for ev in evidence],
        "iters": iters,
        "prior_px": 0.01,
    }


def full_edit(model, asset, view, state, kind):
    """The unrestricted path: Stage II on every Gaussian, then the dense write-back."""
    settings = model.stage2.config.signal_settings()
    sample = build_edit_sample(asset, [view], state["latent"], hint=kind, settings=settings)
    with torch.no_grad():
        deltas, fast = model.stage2([sample], state["fast"])
    return apply_color_delta(asset, deltas[0]["rgb"], deltas[0]["rest_map"]), fast, sample


@pytest.mark.parametrize("kind", ["paint", "detail"])
def test_local_edit_on_a_tiled_asset_equals_the_full_forward(kind):
    """A 50k tiled asset (the 1M benchmark's asset, small): ModelMethod.apply takes the
    restricted path (the walk on a subgraph, the network on the touched Gaussians) and gives
    the full forward's asset and fast weights, over two edits in a row: every Gaussian it does
    not touch bit for bit, the touched ones to float rounding: the walk on the subgraph and on
    the whole graph can differ in the last bit (in one edit, 6 of 4,301 touched Gaussians by at
    most 2.4e-7; likely torch's elementwise CPU kernels, which round a value by where it falls
    in their vector loop, and that depends on the tensor's length), and the voxel means are
    summed in another order (`region_inputs`: 21 of 150,000 SH values by 1e-6 to 1.8e-6)."""
    asset = tiled(6250, 2)
    model = load_editor()
    model.latent_cache = None  # (50k: the disk cache would keep it in ~/.cache)
    method = ModelMethod(model, kind=kind)
    state = method.initial_state(asset)
    for i, color in enumerate([(1.0, 0.0, 1.0), (0.1, 0.8, 0.2)]):
        view = painted_view(asset, i, color=color)
        new, new_state = method.apply(asset, [view], state)
        ref, ref_fast, sample = full_edit(model, asset, view, state, kind)
        local, _ = local_forward(model.stage2, sample, state["fast"])
        untouched = torch.ones(asset.num_gaussians, dtype=torch.bool)
        untouched[local.rows] = False
        assert torch.equal(new.sh[untouched], ref.sh[untouched])
        assert torch.equal(new.sh[untouched], asset.sh[untouched])
        torch.testing.assert_close(new.sh, ref.sh, rtol=0, atol=5e-6)
        changed = int((new.sh != asset.sh).flatten(1).any(1).sum())
        assert 100 < changed < asset.num_gaussians // 5
        for a, b in zip(new_state["fast"], ref_fast, strict=True):
            for k in ("w0", "w1", "w2"):
                torch.testing.assert_close(getattr(a, k), getattr(b, k), rtol=0, atol=1e-6)
        assert local.rows.numel() < local.subgraph_size < asset.num_gaussians // 2
        asset, state = new, new_state


def test_a_kind_that_is_not_local_keeps_the_full_forward():
    asset = make_demo_asset(3000, seed=0).asset
    model = load_editor()
    state = ModelMethod(model, kind="recolor").initial_state(asset)
    sample = build_edit_sample(asset, [painted_view(asset)], state["latent"], hint="recolor")
    with pytest.raises(ValueError, match="not local"):
        local_forward(model.stage2, sample, state["fast"])


# ------------------------------------------------------------------------- the disk cache
def entry(n: int) -> dict[str, torch.Tensor]:
    return {"x": torch.arange(n, dtype=torch.float32)}


def test_cache_hit_miss_and_lru_eviction(tmp_path):
    size = len(_saved(tmp_path, entry(1000)))
    cache = LatentCache(tmp_path / "c", max_bytes=int(2.5 * size))
    assert cache.get("a") is None and cache.misses == 1
    cache.put("a", entry(1000))
    cache.put("b", entry(1000))
    got = cache.get("a")
    assert cache.hits == 1 and torch.equal(got["x"], entry(1000)["x"])
    os.utime(cache.path("b"), (1, 1))  # b: used longest ago (mtime resolution can be coarse)
    cache.put("c", entry(1000))  # over the limit: b goes, a (used since) stays
    assert cache.evictions == 1
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    assert cache.size_bytes() <= cache.max_bytes
    big = LatentCache(tmp_path / "d", max_bytes=size // 2)
    big.put("huge", entry(1000))  # alone over the limit: not kept
    assert big.get("huge") is None and big.size_bytes() == 0
    off = LatentCache(tmp_path / "e", max_bytes=0)
    off.put("a", entry(10))
    assert off.get("a") is None and not (tmp_path / "e").exists()


def test_a_background_write_is_waited_for_by_every_reader(tmp_path):
    """put(wait=False) (what opening a large asset does) returns before the entry is on disk;
    get, entries and a second put see it whole, and no temporary file stays behind."""
    size = len(_saved(tmp_path, entry(200_000)))
    cache = LatentCache(tmp_path / "c", max_bytes=int(1.5 * size))
    cache.put("a", entry(200_000), wait=False)
    got = cache.get("a")
    assert got is not None and torch.equal(got["x"], entry(200_000)["x"])
    cache.put("b", entry(200_000), wait=False)  # over the limit once written: a goes
    assert [p.name for _, _, p in cache.entries()] == [cache.path("b").name]
    assert cache.evictions == 1 and sorted(os.listdir(tmp_path / "c")) == [cache.path("b").name]


def _saved(tmp_path, data) -> bytes:
    c = LatentCache(tmp_path / "probe", 1 << 30)
    c.put("k", data)
    return c.path("k").read_bytes()


@pytest.mark.parametrize("damage", ["truncate", "garbage", "other key"])
def test_a_corrupt_cache_entry_is_a_warned_miss_and_removed(tmp_path, damage):
    cache = LatentCache(tmp_path, 1 << 30)
    cache.put("a", entry(100))
    p = cache.path("a")
    if damage == "truncate":
        p.write_bytes(p.read_bytes()[:100])
    elif damage == "garbage":
        p.write_bytes(b"not a torch file at all")
    else:
        cache.put("b", entry(100))
        os.replace(cache.path("b"), p)
    with pytest.warns(LatentCacheWarning, match="unusable latent cache entry"):
        assert cache.get("a") is None
    assert not p.exists() and cache.rebuilds == 1


def _latent_tensors(latent) -> list[torch.Tensor]:
    d = latent.to_dict()
    graph = d.pop("graph")
    return [v for v in d.values() if isinstance(v, torch.Tensor)] + list(graph.values())


def test_reopening_an_asset_reads_its_latent_from_disk(tmp_path):
    """A second editor (a new session) on the same asset reads Stage I and the graph back,
    equal to the encoded ones; a damaged entry is rebuilt with a warning; a small asset below
    the threshold never touches the disk."""
    asset = make_demo_asset(2500, seed=3).asset

    def editor():
        model = load_editor()
        model.latent_cache = LatentCache(tmp_path, 1 << 30)
        model.disk_cache_min_gaussians = 1000
        return model

    first = editor()
    encoded = first.encode_asset(asset)
    assert first.latent_cache.misses == 1 and len(first.latent_cache.entries()) == 1
    second = editor()
    read = second.encode_asset(asset)
    assert second.latent_cache.hits == 1
    for a, b in zip(_latent_tensors(encoded), _latent_tensors(read), strict=True):
        assert torch.equal(a, b)
    (path,) = [p for _, _, p in second.latent_cache.entries()]
    path.write_bytes(path.read_bytes()[:-200])
    third = editor()
    with pytest.warns(LatentCacheWarning):
        rebuilt = third.encode_asset(asset)
    third.latent_cache.flush()  # (opening writes the entry in the background)
    assert torch.equal(rebuilt.gauss_feat, encoded.gauss_feat) and path.exists()
    other = make_demo_asset(2000, seed=4).asset
    fourth = editor()
    fourth.disk_cache_min_gaussians = 2001
    fourth.encode_asset(other)
    assert fourth.latent_cache.misses == 0 and len(fourth.latent_cache.entries()) == 1


def test_a_cached_latent_that_does_not_fit_the_asset_is_rebuilt(tmp_path):
    asset = make_demo_asset(1500, seed=5).asset
    model = load_editor()
    model.latent_cache = LatentCache(tmp_path, 1 << 30)
    model.disk_cache_min_gaussians = 0
    good = model.encode_asset(asset)
    (path,) = [p for _, _, p in model.latent_cache.entries()]
    key = path.name.removesuffix(".latent.pt")
    bad = good.to_dict()
    bad["gauss_feat"] = bad["gauss_feat"][:-1]
    model.latent_cache.put(key, bad)
    model._cache.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        again = model.encode_asset(asset)
    assert any("gauss_feat has shape" in str(w.message) for w in seen)
    assert torch.equal(again.gauss_feat, good.gauss_feat)


# ------------------------------------------------------------------------- faint normals
def test_faint_normals_turned_region_by_region_equal_the_all_pairs_call():
    from splatpainter.model.hypotheses import orient_by_neighbours
    from splatpainter.model.stage1 import orient_faint_locally

    g = torch.Generator().manual_seed(1)
    n = 6000
    means = torch.rand(n, 3, generator=g) * torch.tensor([1.0, 1.0, 0.1])
    normals = torch.nn.functional.normalize(torch.randn(n, 3, generator=g), dim=-1)
    trusted = torch.rand(n, generator=g) > 0.7
    log_scales = torch.randn(n, 3, generator=g) - 5
    ref = orient_by_neighbours(normals, means, trusted, log_scales)
    got = orient_faint_locally(normals, means, trusted, log_scales)
    assert int((ref != normals).any(1).sum()) > 100  # the test turns many
    assert torch.equal(got, ref)


def test_asset_normals_by_regions_equal_estimate_normals(monkeypatch):
    from splatpainter.model import stage1
    from splatpainter.model.hypotheses import estimate_normals
    from splatpainter.render.api import splat_weights

    asset = make_demo_asset(4000, seed=2).asset
    cfg = load_editor().config.stage1
    cams = stage1.orbit_views(asset, cfg.normal_views, cfg.normal_view_size)
    weights = torch.stack([splat_weights(asset, c) for c in cams])
    centers = torch.stack([c.camera_center().to(asset.means) for c in cams])
    ref = estimate_normals(asset.quats, asset.log_scales, asset.means, weights, centers)
    monkeypatch.setattr(stage1, "LOCAL_ORIENT_PAIRS", 0)
    assert torch.equal(stage1.asset_normals(asset, cfg), ref)


def test_the_solve_steps_on_the_window_s_gaussians_equal_those_on_every_contributing_one(
    monkeypatch,
):
    """Where a view steps by renders (its compositing weights too many to hold), the
    least-squares steps render only the Gaussians with weight in the stroke's window;
    rendering every Gaussian of the view instead gives the same solve bit for bit (two views
    of the tiled asset)."""
    from splatpainter.edit import solve
    from splatpainter.edit.solve import solve_color_delta

    monkeypatch.setattr(solve, "MATRIX_ENTRIES", -1)

    args, kw = two_view_solve(iters=6)
    window = solve_color_delta(*args, **kw)
    every = solve_color_delta(*args, **kw, window_only=False)
    assert int((window != 0).any(-1).sum()) > 100
    assert torch.equal(window, every)


def test_the_solve_by_compositing_weights_is_the_solve_by_renders(monkeypatch):
    """The solve's steps as a gather and scatter over each view's compositing weights (the
    default) give the solve by a render and its colour backward per step, to float rounding
    (two views of the tiled asset, 12 steps)."""
    from splatpainter.edit import solve

    args, kw = two_view_solve(iters=12)
    by_weights = solve.solve_color_delta(*args, **kw)
    monkeypatch.setattr(solve, "MATRIX_ENTRIES", -1)
    by_renders = solve.solve_color_delta(*args, **kw)
    assert int((by_weights != 0).any(-1).sum()) > 1000
    assert torch.equal(by_weights != 0, by_renders != 0)
    torch.testing.assert_close(by_weights, by_renders, rtol=0, atol=1e-4)


@pytest.mark.parametrize("told", ["paint", "auto"])
def test_the_region_s_inputs_and_voxel_means_are_the_whole_asset_s(told):
    """`region_inputs` (the inputs at the walk's region, the voxel means of the rest by one
    compiled pass) against the plain computation on every Gaussian: the inputs at the region
    and every voxel mean to float rounding; the edit statistics too.  Under "auto" the maps are
    fitted to the views' pixels (an HSV recolour, when fitted, takes the plain path)."""
    from splatpainter.model.layers import segment_mean
    from splatpainter.model.restricted import region_inputs, walk_hops

    asset = tiled(2500, 2)
    model = load_editor()
    model.latent_cache = None
    state = ModelMethod(model, kind=told).initial_state(asset)
    view = painted_view(asset, 1, color=(0.1, 0.2, 0.9))
    settings = model.stage2.config.signal_settings()
    sample = build_edit_sample(asset, [view], state["latent"], hint=told, settings=settings)
    s2 = model.stage2
    rows = (sample.signals.in_mask_weight > 0).nonzero().squeeze(1)
    hop = walk_hops(sample.latent.graph, rows, s2.propagation.fine_steps)
    keep = (hop >= 0).nonzero().squeeze(1)
    at = torch.searchsorted(keep, rows)
    assert 100 < rows.numel() < keep.numel() < asset.num_gaussians // 2
    with torch.no_grad():
        region, means = region_inputs(s2, sample, keep, at)
        full = s2._gaussian_inputs(sample, rest_rows=rows)
        want = segment_mean(full.per_gauss, sample.latent.vox.gauss_voxel, means.shape[0])
    for a, b in [
        (region.per_gauss, full.per_gauss[keep]),
        (region.cand, full.cand[keep]),
        (region.normals, full.normals[keep]),
        (region.rest, full.rest),
        (region.stats, full.stats),
    ]:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert bool((full.per_gauss.abs().sum(0) > 0).all())  # every column is exercised
    torch.testing.assert_close(means, want, rtol=1e-5, atol=1e-6)
