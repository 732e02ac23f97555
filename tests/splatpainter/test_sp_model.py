"""Stage I / Stage II model pieces and the checkpoint format."""

import dataclasses
import math

import pytest
import torch

from splatpainter.assets.procedural import make_demo_asset, random_procedural_asset
from splatpainter.model import (
    CheckpointError,
    EditorConfig,
    EditorModel,
    GaussianSignals,
    Stage1Config,
    Stage2Config,
    load_checkpoint,
    load_weights_into,
    save_checkpoint,
)
from splatpainter.model.stage1 import (
    Stage1Latent,
    asset_content_hash,
    member_groups,
    neighbor_mean,
    voxelize,
)
from splatpainter.model.stage2 import VIEW_CHANNELS, EditSample, patchify


def small_config(**s2) -> EditorConfig:
    return EditorConfig(
        stage1=Stage1Config(
            grid_size=8, dim=32, latent_dim=64, num_layers=1, num_views=2, view_size=32
        ),
        stage2=Stage2Config(dim=64, num_blocks=1, head_hidden=32, **s2),
    )


def test_voxelize_assigns_each_gaussian_its_cell():
    means = torch.rand(500, 3, generator=torch.Generator().manual_seed(0)) * 2 - 1
    vox = voxelize(means, 4)
    ijk = vox.voxel_ijk[vox.gauss_voxel]
    cell = ((vox.normalize(means) + 0.5) * 4).floor().clamp(0, 3).long()
    assert torch.equal(ijk, cell)
    lin = (vox.voxel_ijk[:, 0] * 4 + vox.voxel_ijk[:, 1]) * 4 + vox.voxel_ijk[:, 2]
    assert torch.all(lin[1:] > lin[:-1])  # unique, sorted
    c = vox.voxel_centers()[vox.gauss_voxel]
    assert (c - vox.normalize(means)).abs().max() <= 0.5 / 4 + 1e-6


def test_member_groups_cover_each_gaussian_once_within_one_voxel():
    gv = torch.tensor([0] * 7 + [1] * 2 + [2] * 11 + [3])
    gv = gv[torch.randperm(len(gv), generator=torch.Generator().manual_seed(1))]
    index, valid = member_groups(gv, max_group=4)
    assert index.shape[1] == 4
    members = index[valid]
    assert torch.equal(members.sort().values, torch.arange(len(gv)))
    for row, ok in zip(index, valid, strict=True):
        assert ok.any() and len(set(gv[row[ok]].tolist())) == 1


def test_neighbor_mean_matches_brute_force():
    g = 5
    ijk = torch.tensor([[0, 0, 0], [0, 0, 1], [1, 1, 1], [3, 3, 3], [4, 4, 4], [2, 3, 3]])
    lin = (ijk[:, 0] * g + ijk[:, 1]) * g + ijk[:, 2]
    order = torch.argsort(lin)
    ijk, lin = ijk[order], lin[order]
    vals = torch.randn(len(lin), 3)
    got = neighbor_mean(lin, ijk, vals, g)
    for i in range(len(lin)):
        d = (ijk - ijk[i]).abs().max(-1).values
        nb = (d == 1).nonzero().flatten()
        want = vals[nb].mean(0) if len(nb) else torch.zeros(3)
        torch.testing.assert_close(got[i], want)


def test_stage1_batch_of_different_sizes_equals_one_by_one():
    model = EditorModel.initial(small_config())
    a = random_procedural_asset(1, n=300).asset
    b = random_procedural_asset(2, n=450).asset
    views = [model.preprocess(x) for x in (a, b)]
    with torch.no_grad():
        batched = model.stage1([a, b], views)
        single = [model.stage1([x], [v])[0] for x, v in zip((a, b), views, strict=True)]
    for p, q in zip(batched, single, strict=True):
        torch.testing.assert_close(p.voxel_latent, q.voxel_latent, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(p.gauss_feat, q.gauss_feat, rtol=1e-4, atol=1e-5)
    assert batched[1].gauss_feat.shape == (450, 32)
    dec = model.stage1.decode(batched[0])
    assert dec["sh_dc"].shape == (300, 3)


def test_image_features_see_the_asset():
    model = EditorModel.initial(small_config())
    asset = make_demo_asset(800).asset
    views = model.preprocess(asset)
    x = model.stage1.gaussian_inputs(asset, voxelize(asset.means, 8), views)
    frac = x[:, -1]
    # Most surface Gaussians are seen by at least one of two orbit views; not all (occlusion).
    assert 0.3 < float((frac > 0).float().mean()) < 1.0


def test_stage1_is_cached_by_content():
    model = EditorModel.initial(small_config())
    asset = make_demo_asset(400).asset
    la = model.encode_asset(asset)
    assert model.encode_asset(asset.clone()) is la
    other = asset.replace(sh=asset.sh + 0.1)
    assert asset_content_hash(other) != asset_content_hash(asset)
    assert model.encode_asset(other) is not la


def test_stage1_latent_roundtrip_dict():
    model = EditorModel.initial(small_config())
    lat = model.encode_asset(make_demo_asset(300).asset)
    back = Stage1Latent.from_dict(lat.to_dict())
    assert torch.equal(back.voxel_latent, lat.voxel_latent)
    assert torch.equal(back.vox.gauss_voxel, lat.vox.gauss_voxel)


def _sample(model, asset, signals, hw=16):
    lat = model.encode_asset(asset)
    view = torch.rand(hw, hw, VIEW_CHANNELS, generator=torch.Generator().manual_seed(3))
    view[..., -1] = 1.0
    return EditSample(lat, [view], signals, 0.5 + 0.28209479 * asset.sh[:, 0])


def test_stage2_no_evidence_means_exactly_zero_deltas():
    """The learned gate is multiplied by the edit's evidence E: zero residual or zero in-mask
    weight everywhere gives E = 0 and exactly-zero deltas, whatever the network says."""
    model = EditorModel.initial(small_config())
    asset = make_demo_asset(300).asset
    n = asset.num_gaussians
    z = torch.zeros(n)
    nothing_seen = GaussianSignals(torch.randn(n, 3), torch.rand(n), z.clone(), z.clone())
    nothing_changed = GaussianSignals(torch.zeros(n, 3), z.clone(), torch.ones(n), torch.ones(n))
    for sig in (nothing_seen, nothing_changed):
        with torch.no_grad():
            out, _ = model.stage2([_sample(model, asset, sig)], model.stage2.init_state(1))
        d = out[0]
        assert float(d["evidence"]) == 0.0
        assert torch.equal(d["gate"], z)
        assert torch.count_nonzero(d["sh_dc"]) == 0 and torch.count_nonzero(d["rgb"]) == 0


def test_stage2_gate_can_reach_unseen_gaussians():
    """No hard visibility gate: with evidence present, Gaussians with zero support get a
    non-zero edit weight (the network decides), unlike the old support threshold."""
    model = EditorModel.initial(small_config())
    asset = make_demo_asset(300).asset
    n = asset.num_gaussians
    seen = torch.zeros(n, dtype=torch.bool)
    seen[: n // 3] = True
    f = seen.float()
    sig = GaussianSignals(0.2 * f[:, None].expand(n, 3), 0.2 * f, f, 3.0 * f, 3.0 * f)
    with torch.no_grad():
        out, _ = model.stage2([_sample(model, asset, sig)], model.stage2.init_state(1))
    assert float(out[0]["evidence"]) == 1.0
    assert bool((out[0]["gate"][~seen] > 0).all())


def test_committed_weights_drop_what_is_below_the_floor_and_keep_their_reach():
    from splatpainter.model.stage2 import _committed

    mix = torch.tensor([[0.97, 0.03, 0.0], [0.9, 0.1, 0.0], [0.4, 0.35, 0.25]])
    got = _committed(mix, 0.05, training=False, renormalise=True)
    assert torch.equal(got[0], torch.tensor([1.0, 0.0, 0.0]))
    torch.testing.assert_close(got[1], torch.tensor([0.85, 0.05, 0.0]) / 0.9)
    torch.testing.assert_close(got.sum(-1), torch.ones(3))
    corr = torch.tensor([[-0.04, 0.03, 0.5, -1.0]])
    got = _committed(corr, 0.05, training=False, renormalise=False)
    torch.testing.assert_close(got, torch.tensor([[0.0, 0.0, 0.45 / 0.95, -1.0]]))
    w = corr.clone().requires_grad_()
    _committed(w, 0.05, training=True, renormalise=False).sum().backward()
    # below the floor the straight-through gradient alone, above it that plus the shrink's
    assert torch.equal(w.grad[0, :2], torch.ones(2))
    torch.testing.assert_close(w.grad[0, 2:], torch.full((2,), 1 + 1 / 0.95))


def test_stage2_commit_applies_a_confident_choice_exactly():
    """A head confident in the seen change (gate logit 5, hypothesis logits 5 / 0 / 0, a
    correction of 0.02 of its bound) moves every Gaussian by exactly its seen change with
    `commit`, and only to within a few thousandths without it."""
    asset = make_demo_asset(300).asset
    n = asset.num_gaussians
    g = torch.Generator().manual_seed(4)
    residual = torch.randn(n, 3, generator=g) * 0.1
    sig = GaussianSignals(residual, torch.full((n,), 0.2), torch.ones(n), torch.ones(n))
    rgb = {}
    for commit in (0.0, 0.05):
        model = EditorModel.initial(small_config(commit=commit)).eval()
        fc2 = model.stage2.head.fc2
        with torch.no_grad():
            fc2.weight.zero_()
            fc2.bias.copy_(torch.tensor([5.0, 5.0, 0.0, 0.0, 0.02, 0.02, 0.02]))
            out, _ = model.stage2([_sample(model, asset, sig)], model.stage2.init_state(1))
        assert float(out[0]["evidence"]) == 1.0
        rgb[commit] = out[0]["rgb"]
    assert torch.equal(rgb[0.05], residual)
    assert 1e-4 < float((rgb[0.0] - residual).abs().max()) < 0.02


def test_stage2_deltas_and_state_depend_on_edit():
    model = EditorModel.initial(small_config())
    asset = make_demo_asset(300).asset
    n = asset.num_gaussians
    g = torch.Generator().manual_seed(4)
    sig = GaussianSignals(
        torch.randn(n, 3, generator=g) * 0.1, torch.full((n,), 0.2), torch.ones(n), torch.ones(n)
    )
    state0 = model.stage2.init_state(1)
    with torch.no_grad():
        out, state1 = model.stage2([_sample(model, asset, sig)], state0)
        out2, _ = model.stage2([_sample(model, asset, sig)], state1)
    assert out[0]["sh_dc"].abs().sum() > 0
    assert not torch.equal(state1[0].w0, state0[0].w0)
    assert not torch.allclose(out[0]["sh_dc"], out2[0]["sh_dc"])


def test_stage2_is_trainable_end_to_end():
    model = EditorModel(small_config())
    asset = make_demo_asset(200).asset
    n = asset.num_gaussians
    sig = GaussianSignals(
        torch.randn(n, 3) * 0.1, torch.full((n,), 0.2), torch.ones(n), torch.ones(n)
    )
    lat = model.stage1([asset], [model.preprocess(asset)])[0]
    view = torch.rand(16, 16, VIEW_CHANNELS)
    sample = EditSample(lat, [view], sig, torch.rand(n, 3))
    out, _ = model.stage2([sample], model.stage2.init_state(1))
    out[0]["sh_dc"].square().sum().backward()
    assert model.stage2.blocks[0].ttt.w0.grad.abs().sum() > 0
    assert model.stage1.embed.weight.grad.abs().sum() > 0


def test_patchify_pads_and_orders():
    img = torch.arange(5 * 6 * 2, dtype=torch.float32).reshape(5, 6, 2)
    toks, cover = patchify(img, 4)
    assert toks.shape == (2 * 2, 4 * 4 * 2)
    # First token = top-left 4x4 block, row-major pixels, channels last.
    torch.testing.assert_close(toks[0].view(4, 4, 2), img[:4, :4])
    assert cover.shape == (4,)


def test_checkpoint_roundtrip(tmp_path):
    model = EditorModel.initial(small_config(), seed=7)
    path = tmp_path / "w.pt"
    save_checkpoint(model, path)
    assert [p.name for p in tmp_path.iterdir()] == ["w.pt"]  # no temp file left behind
    payload = torch.load(path, weights_only=True)
    assert payload["format"] == "splatpainter-editor" and payload["version"] == 1
    assert payload["config"] == dataclasses.asdict(model.config)
    back = load_checkpoint(path)
    assert back.weights_fingerprint() == model.weights_fingerprint()
    other = EditorModel.initial(small_config(), seed=8)
    assert other.weights_fingerprint() != model.weights_fingerprint()
    load_weights_into(other, path)
    assert other.weights_fingerprint() == model.weights_fingerprint()


def test_checkpoint_wrong_architecture_is_named(tmp_path):
    path = tmp_path / "w.pt"
    save_checkpoint(EditorModel.initial(small_config()), path)
    bigger = EditorModel.initial(
        dataclasses.replace(small_config(), stage2=Stage2Config(dim=64, num_blocks=2))
    )
    with pytest.raises(CheckpointError, match=r"stage2\.num_blocks"):
        load_weights_into(bigger, path)
    # A config that claims one architecture but carries weights of another.
    payload = torch.load(path, weights_only=True)
    payload["config"]["stage2"]["head_hidden"] = 48
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=r"shape mismatch stage2\.head\.fc1\.weight"):
        load_checkpoint(path)
    payload["config"]["stage2"]["bogus"] = 1
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=r"unknown key\(s\) stage2\.bogus"):
        load_checkpoint(path)
    torch.save({"model": {}}, path)
    with pytest.raises(CheckpointError, match="not a splatpainter-editor"):
        load_checkpoint(path)
    path.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="not a readable"):
        load_checkpoint(path)


def test_initial_weights_are_deterministic():
    a = EditorModel.initial(small_config())
    b = EditorModel.initial(small_config())
    assert a.weights_fingerprint() == b.weights_fingerprint()


def test_config_errors():
    with pytest.raises(ValueError, match="gauss_feat_dim"):
        EditorConfig(stage1=Stage1Config(gauss_feat_dim=16), stage2=Stage2Config())
    with pytest.raises(ValueError, match="evidence_tau"):
        Stage2Config(evidence_tau=0.0)
    with pytest.raises(ValueError, match="unknown edit kind"):
        EditSample(None, [], None, None, hint="sharpen")


def test_stage2_batch_of_different_sizes_equals_one_by_one():
    model = EditorModel.initial(small_config())
    samples = []
    for seed, n, hw in ((1, 250, 16), (2, 400, 24)):
        asset = random_procedural_asset(seed, n=n).asset
        g = torch.Generator().manual_seed(seed)
        sig = GaussianSignals(
            torch.randn(n, 3, generator=g) * 0.1,
            torch.rand(n, generator=g),
            torch.rand(n, generator=g),
            torch.rand(n, generator=g),
        )
        samples.append(_sample(model, asset, sig, hw=hw))
    with torch.no_grad():
        batched, state_b = model.stage2(samples, model.stage2.init_state(2))
        for i, s in enumerate(samples):
            single, state_s = model.stage2([s], model.stage2.init_state(1))
            torch.testing.assert_close(
                batched[i]["sh_dc"], single[0]["sh_dc"], rtol=1e-4, atol=1e-5
            )
            torch.testing.assert_close(state_b[0].w1[i], state_s[0].w1[0], rtol=1e-4, atol=1e-5)


def test_safetensors_weights_of_another_architecture_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    from splatpainter.model.editor import load_weights, save_weights

    path = tmp_path / "w.safetensors"
    save_weights(EditorModel.initial(small_config()), path, trained="true")
    assert load_weights(path).trained
    # Weights of one architecture under the config of another.
    other = dataclasses.asdict(
        dataclasses.replace(small_config(), stage2=Stage2Config(dim=64, head_hidden=48))
    )
    import json

    meta = {"format": "splatpainter-editor-weights", "config": json.dumps(other)}
    save_file(load_file(path), path, metadata=meta)
    with pytest.raises(CheckpointError, match=r"shape mismatch stage2\.head\.fc1\.weight"):
        load_weights(path)
    save_file(load_file(path), path, metadata={"format": "something else"})
    with pytest.raises(CheckpointError, match="no editor config"):
        load_weights(path)
    path.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_weights(path)


def test_a_face_on_view_outvotes_more_weight_seen_edge_on_from_behind():
    """A flat Gaussian (axis z) seen face-on from +z with weight 0.5 and edge-on from just
    behind with weight 1.5 (a low-resolution silhouette): weight x sign would turn it to -z; the
    squared weight x cosine keeps +z.  A view that sees it face-on from -z with more weight
    still turns it (the vote is not one-sided)."""
    from splatpainter.model.hypotheses import estimate_normals

    quats = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    log_scales = torch.tensor([[-3.0, -3.0, -7.0]])
    means = torch.zeros(1, 3)
    centers = torch.tensor([[0.0, 0.0, 2.0], [2.0, 0.0, -0.1]])
    n = estimate_normals(quats, log_scales, means, torch.tensor([[0.5], [1.5]]), centers)
    assert torch.allclose(n, torch.tensor([[0.0, 0.0, 1.0]]))
    centers[1] = torch.tensor([0.0, 0.0, -2.0])
    n = estimate_normals(quats, log_scales, means, torch.tensor([[0.5], [0.6]]), centers)
    assert torch.allclose(n, torch.tensor([[0.0, 0.0, -1.0]]))


def test_faint_normals_take_the_side_of_their_own_sheet():
    """Two parallel sheets (the near and far walls of a thin part), normals +z and -z, well seen;
    faintly seen Gaussians whose vote went to the wrong side are turned back to their sheet's
    side, and the far wall does not turn the near wall's Gaussians."""
    from splatpainter.model.hypotheses import orient_by_neighbours

    g = torch.Generator().manual_seed(0)
    xy = torch.rand(800, 2, generator=g)
    z = torch.where(torch.arange(800) < 400, 0.0, 0.05)  # spacing ~0.035, walls 0.05 apart
    means = torch.cat([xy, z[:, None]], -1)
    truth = torch.where(z[:, None] == 0, torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.0, 0, -1]))
    trusted = torch.rand(800, generator=g) > 0.2
    wrong = ~trusted & (torch.rand(800, generator=g) > 0.5)
    given = torch.where(wrong[:, None], -truth, truth)
    log_scales = torch.full((800, 3), -5.0)
    out = orient_by_neighbours(given, means, trusted, log_scales)
    assert int(wrong.sum()) > 20
    assert torch.equal(out, truth)
    assert torch.equal(out[trusted], given[trusted])  # trusted ones are never turned


def test_a_bulky_gaussian_takes_its_surface_s_normal_and_a_flat_one_its_own_axis():
    """Centres jittered around the plane z = 0.1 x: a bulky Gaussian (axes 1 : 0.8 : 0.6, the
    shortest along x) takes the plane's normal from its neighbours' spread; a flat one
    (1 : 1 : 0.1, shortest along x too) keeps its own axis, as the procedural splats need."""
    from splatpainter.model.hypotheses import FLAT_RATIO, surface_axes

    g = torch.Generator().manual_seed(4)
    xy = torch.rand(400, 2, generator=g)
    means = torch.stack([xy[:, 0], xy[:, 1], 0.1 * xy[:, 0]], -1)
    means = means + 0.002 * torch.randn(400, 3, generator=g)
    quats = torch.tensor([1.0, 0.0, 0.0, 0.0]).expand(400, 4)
    bulky = torch.log(torch.tensor([0.6, 0.8, 1.0])) - 4
    flat = torch.log(torch.tensor([FLAT_RATIO / 3, 1.0, 1.0])) - 4
    log_scales = torch.where(torch.arange(400)[:, None] < 200, bulky, flat)
    n = surface_axes(quats, log_scales, means)
    plane = torch.nn.functional.normalize(torch.tensor([-0.1, 0.0, 1.0]), dim=0)
    cos = (n[:200] * plane).sum(-1).abs()
    assert float(cos.min()) > 0.98
    assert torch.equal(n[200:].abs(), torch.tensor([1.0, 0.0, 0.0]).expand(200, 3))
    assert torch.allclose(n.norm(dim=-1), torch.ones(400))


def test_a_bulky_gaussian_s_normal_is_nearer_its_surface_with_its_neighbours_tilted_axes():
    """Capture-like Gaussians (train/scenes.py `_capturize`): bulky (1 : 0.8 : 0.6), each tilted
    off the plane z = 0.1 x by its own noise and jittered off it by a third of the spacing.  The
    fit with the neighbours' axes lies nearer the plane's normal than either cue alone, the
    centres' spread or the Gaussian's own axis (median angle, with room for the noise)."""
    from splatpainter.assets.gaussians import rotmat_to_quat
    from splatpainter.assets.procedural import tangent_frames
    from splatpainter.model.hypotheses import SURFACE_NEIGHBOURS, surface_axes, surface_fit_normals

    g = torch.Generator().manual_seed(5)
    n = 3000
    plane = torch.nn.functional.normalize(torch.tensor([-0.1, 0.0, 1.0]), dim=0)
    xy = torch.rand(n, 2, generator=g)
    spacing = n**-0.5
    means = torch.stack([xy[:, 0], xy[:, 1], 0.1 * xy[:, 0]], -1)
    means = means + plane * (0.3 * spacing * torch.randn(n, 1, generator=g))
    tilted = torch.nn.functional.normalize(plane + 0.3 * torch.randn(n, 3, generator=g), dim=1)
    quats = rotmat_to_quat(tangent_frames(tilted))  # the tilted axis is the third, the shortest
    log_scales = torch.log(torch.tensor([1.0, 0.8, 0.6])).expand(n, 3) + math.log(spacing)

    def median_degrees(normals):
        cos = (normals.double() * plane.double()).sum(-1).abs().clamp(max=1.0)
        return float(torch.rad2deg(torch.acos(cos)).median())

    inner = ((xy > 0.1) & (xy < 0.9)).all(1)  # (the square's rim has one-sided neighbourhoods)
    fit = median_degrees(surface_axes(quats, log_scales, means)[inner])
    spread = median_degrees(surface_fit_normals(means, torch.arange(n), SURFACE_NEIGHBOURS)[inner])
    own = median_degrees(tilted[inner])
    assert fit < 0.8 * min(spread, own), (fit, spread, own)  # 3.8 against 5.3 and 19.4


def test_a_column_major_segment_mean_is_the_plain_one_bit_for_bit():
    """Stage II's per-Gaussian inputs are built column-major (`column_major`), whose segment
    sums run along contiguous rows: the same values and voxel means, bit for bit, with
    gradients too."""
    from splatpainter.model.layers import column_major, segment_mean

    g = torch.Generator().manual_seed(0)
    pieces = [torch.randn(5000, c, generator=g) for c in (3, 1, 9, 2)]
    seg = torch.randint(0, 77, (5000,), generator=g)
    plain = torch.cat(pieces, -1)
    cols = column_major(pieces)
    assert not cols.is_contiguous() and torch.equal(cols, plain)
    assert torch.equal(segment_mean(cols, seg, 80), segment_mean(plain, seg, 80))
    assert segment_mean(cols, seg, 80).is_contiguous()
    grads = []
    for build in (lambda ps: torch.cat(ps, -1), column_major):
        ps = [p.clone().requires_grad_() for p in pieces]
        (segment_mean(build(ps), seg, 80) * torch.arange(15.0)).sum().backward()
        grads.append(torch.cat([p.grad for p in ps], -1))
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("propagate", [False, True])
def test_the_head_by_parts_is_its_first_layer_on_the_concatenated_row(propagate):
    """`Stage2Editor._head_hidden` (voxel tokens projected once per voxel, the edit's stats and
    hint as a bias, one product for each Gaussian's own columns) against the head's first layer
    on the rows it stands for, [voxel token, own..., stats, hint, walk], with and without the
    walk's columns; gradients reach every weight and input the same way."""
    from splatpainter.model.editor import load_editor
    from splatpainter.model.hypotheses import EDIT_STATS_DIM
    from splatpainter.model.stage2 import EDIT_HINTS

    torch.manual_seed(0)
    if propagate:
        editor = load_editor().stage2
    else:
        editor = EditorModel.initial(small_config()).stage2
    c = editor.config
    n, v = 500, 40
    xb = torch.randn(v, c.dim, requires_grad=True)
    gv = torch.randint(0, v, (n,))
    per_gauss = editor.voxel_sig.in_features
    own = [torch.randn(n, w, requires_grad=True) for w in (c.gauss_feat_dim, 3, 3, per_gauss)]
    stats = torch.randn(EDIT_STATS_DIM, requires_grad=True)
    hint = torch.nn.functional.one_hot(torch.tensor(2), len(EDIT_HINTS)).float()
    walk = torch.randn(n, c.prop_channels, requires_grad=True) if propagate else None
    parts = [xb[gv], *own, stats.expand(n, -1), hint.expand(n, -1)]
    want = editor.head.fc1(torch.cat(parts if walk is None else [*parts, walk], -1))
    got = editor._head_hidden(xb, gv, own, stats, hint, walk)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    leaves = [editor.head.fc1.weight, editor.head.fc1.bias, xb, *own, stats]
    if walk is not None:
        leaves.append(walk)
    g = torch.randn_like(want)
    grads_want = torch.autograd.grad(want, leaves, g)
    grads_got = torch.autograd.grad(got, leaves, g)
    for a, b in zip(grads_got, grads_want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
