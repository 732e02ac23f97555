"""The least-squares colour change of the touched Gaussians (edit/solve.py) and its use."""

import dataclasses

import pytest
import torch

from splatpainter.assets.procedural import make_demo_asset
from splatpainter.edit import EditView
from splatpainter.edit.methods import apply_color_delta, build_edit_sample
from splatpainter.edit.signals import gather_signals
from splatpainter.model import EditorConfig, EditorModel, Stage1Config, Stage2Config
from splatpainter.model.stage1 import Stage1Latent, voxelize
from splatpainter.model.stage2 import SignalSettings
from splatpainter.render import render
from splatpainter.train.data import SequenceSpec, apply_color_transform, base_colors, view_camera
from splatpainter.train.data import with_base_colors as with_colors
from splatpainter.train.examples import build_example, cache_key

SMALL = SequenceSpec(min_gaussians=1000, max_gaussians=1500, view_size=32, num_heldout=3)


def small_config(**s2) -> EditorConfig:
    return EditorConfig(
        stage1=Stage1Config(grid_size=8, dim=32, latent_dim=64, num_views=2, view_size=32),
        stage2=Stage2Config(dim=64, num_blocks=1, head_hidden=32, **s2),
    )


def _recolour_edit(n: int = 2500, size: int = 64):
    demo = make_demo_asset(n, seed=3)
    asset = demo.asset
    colors = base_colors(asset)
    part = demo.primitive_id == 2  # the torus
    target = colors.clone()
    target[part] = apply_color_transform(colors[part], "hsv", torch.tensor([0.4, 1.1, 0.9]))
    cam = view_camera(asset, 30.0, 30.0, size)
    edited = render(with_colors(asset, target), cam).rgb.clamp(0, 1)
    return asset, EditView(cam, edited)


def _view_psnr(asset, view, delta) -> float:
    out = render(apply_color_delta(asset, delta), view.camera).rgb
    return float(-10 * torch.log10(((out - view.image) ** 2).mean()))


def test_solve_reproduces_the_edit_view_far_better_than_the_mean_residual():
    asset, view = _recolour_edit()
    sig, _ = gather_signals(asset, [view], solve_iters=30)
    touched = sig.in_mask_weight > 0
    mean_residual = torch.where(touched[:, None], sig.residual, 0.0)
    solved = _view_psnr(asset, view, sig.solved)
    backprojected = _view_psnr(asset, view, mean_residual)
    assert solved > backprojected + 3.0, (solved, backprojected)
    assert solved > 35.0
    # Only touched Gaussians move, and every colour stays displayable.
    assert torch.all(sig.solved[~touched] == 0)
    new = base_colors(asset) + sig.solved
    assert float(new.min()) >= -1e-6 and float(new.max()) <= 1 + 1e-6


def test_more_steps_fit_the_view_better_and_no_steps_means_no_solve():
    asset, view = _recolour_edit()
    fits = [_view_psnr(asset, view, gather_signals(asset, [view], solve_iters=k)[0].solved)
            for k in (1, 4, 16)]  # fmt: skip
    assert fits[0] < fits[1] < fits[2], fits
    assert gather_signals(asset, [view])[0].solved is None


def test_pixels_outside_a_given_mask_ask_to_stay():
    """A stroke whose mask ends mid-Gaussian: the solve keeps the outside pixels closer to the
    render than the mean residual does (which paints edge Gaussians with the full colour)."""
    asset, _ = _recolour_edit()
    cam = view_camera(asset, 30.0, 30.0, 64)
    before = render(asset, cam).rgb.clamp(0, 1)
    yy, xx = torch.meshgrid(torch.arange(64), torch.arange(64), indexing="ij")
    mask = ((yy - 32) ** 2 + (xx - 32) ** 2 <= 8**2).float()
    edited = torch.where(mask[..., None] > 0, torch.tensor([0.9, 0.1, 0.6]), before)
    view = EditView(cam, edited, mask)
    sig, _ = gather_signals(asset, [view], solve_iters=12)
    mean_residual = torch.where((sig.in_mask_weight > 0)[:, None], sig.residual, 0.0)
    outside = mask == 0

    def leak(delta):
        out = render(apply_color_delta(asset, delta), cam).rgb
        return float(((out - before)[outside] ** 2).mean())

    assert leak(sig.solved) < 0.5 * leak(mean_residual)
    assert _view_psnr(asset, view, sig.solved) > _view_psnr(asset, view, mean_residual)


def test_stage2_offers_the_solved_change_as_its_first_hypothesis():
    asset, view = _recolour_edit(n=1500, size=32)
    model = EditorModel.initial(small_config(solve_iters=3))
    latent = Stage1Latent(voxelize(asset.means, 8), torch.zeros(0), torch.zeros(0))
    sample = build_edit_sample(asset, [view], latent, settings=SignalSettings(solve_iters=3))
    cand = model.stage2._gaussian_inputs(sample)[0]
    assert torch.equal(cand[:, 0], sample.signals.solved)
    plain = build_edit_sample(asset, [view], latent)
    assert torch.equal(model.stage2._gaussian_inputs(plain)[0][:, 0], plain.signals.residual)


def test_training_examples_carry_the_solve_and_key_the_cache_on_it():
    s1 = Stage1Config(grid_size=8, num_views=2, view_size=32)
    ex = build_example(100_000, SMALL, s1, 32, SignalSettings(solve_iters=2))
    assert all(step["signals"]["solved"] is not None for step in ex["steps"])
    keys = {
        cache_key(SMALL, s1, 32, SignalSettings(*s))
        for s in [(0, 0.0), (2, 0.0), (2, 0.01), (2, 0.01, True), (2, 0.01, True, True)]
    }
    assert len(keys) == 5


def test_cached_colour_maps_reach_a_step_only_where_its_hint_would_fit_them():
    from splatpainter.train.examples import example_sample

    s1 = Stage1Config(grid_size=8, num_views=2, view_size=32)
    ex = build_example(100_000, SMALL, s1, 32, SignalSettings(2, 0.0, True, True))
    step = ex["steps"][0]
    assert step["signals"]["affine"].shape == (4, 3) and len(step["signals"]["shading"]) == 3
    for hint, has_affine, has_shading in [
        ("auto", True, True),
        ("recolor", True, False),
        ("relight", False, True),
        ("paint", False, False),
    ]:
        sig = example_sample(step, None, hint).signals
        assert (sig.affine is not None, sig.shading is not None) == (has_affine, has_shading)
        # the solves centred on a map come and go with it
        centred = (sig.solved_affine is not None, sig.solved_shading is not None)
        assert centred == (has_affine, has_shading)


def test_local_kinds_move_only_gaussians_a_masked_pixel_shows():
    """paint and detail: a Gaussian without in-mask weight gets an exactly zero delta."""
    from splatpainter.edit import EditSession, ModelMethod

    asset, view = _recolour_edit(n=1500, size=32)
    model = EditorModel.initial(small_config(solve_iters=2)).eval()
    shown = gather_signals(asset, [view])[0].in_mask_weight > 0
    assert 0 < int(shown.sum()) < asset.num_gaussians
    for kind in ("paint", "detail"):
        out = EditSession(asset, ModelMethod(model, kind=kind)).apply(view)
        moved = (out.sh != asset.sh).flatten(1).any(1)
        assert bool(moved.any()) and not bool((moved & ~shown).any()), kind


def _relit_edit(light, ambient: float, diffuse: float, flip: float = 0.0, size: int = 64):
    """A relit demo asset seen from one view; `flip` of the normals given to the fit point the
    wrong way (as estimated normals of faintly seen Gaussians do)."""
    demo = make_demo_asset(2500, seed=3)
    asset, normals = demo.asset, demo.normals.float()
    colors = base_colors(asset)
    light = torch.nn.functional.normalize(torch.tensor(light, dtype=torch.float32), dim=0)
    shade = ambient + diffuse * (normals @ light).clamp_min(0)
    cam = view_camera(asset, 30.0, 30.0, size)
    edited = render(with_colors(asset, (colors * shade[:, None]).clamp(0, 1)), cam).rgb.clamp(0, 1)
    given = normals.clone()
    wrong = torch.rand(len(given), generator=torch.Generator().manual_seed(0)) < flip
    given[wrong] = -given[wrong]
    return asset, EditView(cam, edited), given, light


def test_shading_fitted_to_pixels_recovers_the_light_exactly():
    asset, view, normals, light = _relit_edit([0.3, -0.5, 0.8], 0.35, 0.7)
    sig, _ = gather_signals(asset, [view], solve_iters=6, normals=normals, fit_maps=("shading",))
    a, d, fitted = sig.shading
    assert abs(float(a) - 0.35) < 5e-3 and abs(float(d) - 0.7) < 5e-3
    assert float(fitted @ light) > 0.999
    assert sig.affine is None  # not asked for


def test_shading_fit_shrugs_off_a_few_wrong_normals():
    asset, view, normals, light = _relit_edit([0.3, -0.5, 0.8], 0.35, 0.7, flip=0.05)
    sig, _ = gather_signals(asset, [view], solve_iters=6, normals=normals, fit_maps=("shading",))
    a, d, fitted = sig.shading
    assert abs(float(a) - 0.35) < 0.03 and abs(float(d) - 0.7) < 0.1
    assert float(fitted @ light) > 0.98


def test_affine_recolour_fitted_to_pixels_matches_a_global_colour_transform():
    demo = make_demo_asset(2500, seed=3)
    asset = demo.asset
    colors = base_colors(asset)
    m = torch.tensor([[0.7, 0.2, 0.0], [0.1, 0.6, 0.2], [0.0, 0.1, 0.8], [0.05, 0.0, 0.1]])
    new = torch.cat([colors, torch.ones_like(colors[:, :1])], -1) @ m
    cam = view_camera(asset, 30.0, 30.0, 64)
    view = EditView(cam, render(with_colors(asset, new), cam).rgb.clamp(0, 1))
    sig, _ = gather_signals(asset, [view], solve_iters=6, fit_maps=("affine",))
    assert torch.allclose(sig.affine, m, atol=0.02), sig.affine
    assert sig.shading is None


def test_hints_fit_only_the_maps_they_can_use():
    from splatpainter.model.stage2 import hint_maps

    assert hint_maps("auto") == ("affine", "shading")
    assert hint_maps("recolor") == ("affine",)
    assert hint_maps("relight") == ("shading",)
    assert hint_maps("paint") == hint_maps("detail") == ()


def test_colour_maps_are_left_to_the_per_gaussian_fit_when_every_masked_pixel_is_clipped():
    """A pure magenta stroke sits at the top of the colour box: no pixel says how bright the
    edit really is, so nothing is fitted to pixels (and nothing fails)."""
    demo = make_demo_asset(1500, seed=3)
    cam = view_camera(demo.asset, 30.0, 30.0, 32)
    img = render(demo.asset, cam).rgb.clamp(0, 1).clone()
    img[10:20, 10:20] = torch.tensor([1.0, 0.0, 1.0])
    mask = torch.zeros(32, 32)
    mask[10:20, 10:20] = 1.0
    view = EditView(cam, img, mask)
    sig, _ = gather_signals(demo.asset, [view], solve_iters=2, normals=demo.normals.float(),
                            fit_maps=("affine", "shading"))  # fmt: skip
    assert sig.solved is not None and sig.affine is None and sig.shading is None


def _sh3_asset(n: int = 2500, seed: int = 3):
    """The demo asset at SH degree 3 with view-dependent bands of a capture's size."""
    asset = make_demo_asset(n, seed=seed).asset.with_sh_degree(3)
    sh = asset.sh.clone()
    gen = torch.Generator().manual_seed(seed)
    sh[:, 1:, :] = 0.08 * torch.randn(sh[:, 1:, :].shape, generator=gen)
    return asset.replace(sh=sh)


def test_a_strong_affine_recolour_is_recovered_through_the_colour_box_and_the_sh_bands():
    """The map moves the SH bands too (the pixels change by the map of the view colours), and
    it pushes a third of the colour channels out of the box, where the edit clamps them: the
    pixel fit models both, so it still finds the map."""
    from splatpainter.assets.gaussians import map_sh_bands

    asset = _sh3_asset()
    colors = base_colors(asset)
    m = torch.tensor([[1.5, -0.3, 0.2], [0.4, 1.3, -0.4], [-0.2, 0.3, 1.4], [0.15, -0.2, 0.1]])
    raw = torch.cat([colors, torch.ones_like(colors[:, :1])], -1) @ m
    assert float(((raw < 0) | (raw > 1)).float().mean()) > 0.3
    sh = with_colors(asset, raw.clamp(0, 1)).sh.clone()
    sh[:, 1:, :] = map_sh_bands(asset.sh[:, 1:, :], m[:3].T.expand(len(colors), 3, 3))
    cam = view_camera(asset, 30.0, 30.0, 64)
    view = EditView(cam, render(asset.replace(sh=sh), cam).rgb.clamp(0, 1))
    sig, _ = gather_signals(asset, [view], solve_iters=6, fit_maps=("affine",))
    assert torch.allclose(sig.affine, m, atol=0.03), sig.affine
    assert sig.hsv is None  # the affine map explains the pixels better


def test_an_hsv_adjustment_is_recognised_and_recovered():
    """The web editor's own HSV tool on every Gaussian: no affine map makes a hue turn of
    120 degrees, so the recolour fitted in its place is that adjustment, and its colours are
    the tool's on every Gaussian."""
    from splatpainter.assets.colorspace import adjust_hsv_colors
    from splatpainter.model.hypotheses import recolor
    from splatpainter.web.selection import adjust_hsv

    asset = _sh3_asset()
    edited = adjust_hsv(asset, torch.ones(asset.num_gaussians, dtype=torch.bool), 120.0, 1.3, 0.8)
    cam = view_camera(asset, 30.0, 30.0, 64)
    view = EditView(cam, render(edited, cam).rgb.clamp(0, 1))
    sig, _ = gather_signals(asset, [view], solve_iters=6, fit_maps=("affine",))
    assert sig.hsv is not None
    hue, sat, val = sig.hsv.tolist()
    assert abs(hue - 120.0) < 1.0 and abs(sat - 1.3) < 0.03 and abs(val - 0.8) < 0.02, sig.hsv
    colors = base_colors(asset)
    got = recolor(colors, sig.affine, sig.hsv)
    want = adjust_hsv_colors(colors, 120.0, 1.3, 0.8)
    assert float((got - want).abs().max()) < 0.02


def test_the_maps_fitted_on_compositing_weights_are_the_maps_fitted_on_renders(monkeypatch):
    """The fits' products with each view's A come from its compositing weights (one pass, a
    sparse product each); where those are not to be had, a render each. Same maps either way:
    an HSV recolour of an SH-3 asset (affine, HSV and shading fits), in two views."""
    from splatpainter.edit import solve
    from splatpainter.web.selection import adjust_hsv

    asset = _sh3_asset()
    normals = make_demo_asset(2500, seed=3).normals.float()
    edited = adjust_hsv(asset, torch.ones(asset.num_gaussians, dtype=torch.bool), 60.0, 1.2, 0.9)
    views = [
        EditView(cam, render(edited, cam).rgb.clamp(0, 1))
        for cam in (view_camera(asset, 30.0, 30.0, 48), view_camera(asset, 150.0, 10.0, 40))
    ]

    def fitted():
        sig, _ = gather_signals(
            asset, views, solve_iters=6, normals=normals, fit_maps=("affine", "shading")
        )
        return sig.affine, sig.hsv, sig.shading

    by_weights = fitted()
    monkeypatch.setattr(solve, "MATRIX_ENTRIES", -1)  # no view's weights: renders
    by_renders = fitted()
    assert by_weights[1] is not None and by_renders[1] is not None
    for got, want in zip(
        by_weights[:2] + by_weights[2], by_renders[:2] + by_renders[2], strict=True
    ):
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got, want)


def _affine_part_edit(size: int):
    """The torus recoloured by an affine map (the map the affine fit can find exactly), seen
    in one view of `size` pixels."""
    demo = make_demo_asset(2500, seed=3)
    asset = demo.asset
    colors = base_colors(asset)
    part = demo.primitive_id == 2
    m = torch.tensor([[0.5, 0.3, 0.1], [0.1, 0.4, 0.3], [0.2, 0.1, 0.5], [0.1, 0.05, 0.2]])
    target = colors.clone()
    target[part] = torch.cat([colors[part], torch.ones_like(colors[part, :1])], -1) @ m
    cam = view_camera(asset, 30.0, 30.0, size)
    edited = render(with_colors(asset, target), cam).rgb.clamp(0, 1)
    return asset, EditView(cam, edited), target - colors, part


def test_a_solve_centred_on_the_zero_change_is_the_plain_solve_bit_for_bit():
    from splatpainter.edit.signals import solve_from_evidence

    asset, view, _, _ = _affine_part_edit(32)
    sig, evidence = gather_signals(asset, [view], solve_iters=6)
    touched = sig.in_mask_weight > 0
    plain = solve_from_evidence(asset, evidence, touched, iters=6, prior_px=0.0)
    zero, other = solve_from_evidence(
        asset, evidence, touched, iters=6, prior_px=0.0,
        centers=(torch.zeros_like(plain), torch.full_like(plain, 0.3)),
    )  # fmt: skip
    assert torch.equal(zero, plain) and torch.equal(plain, sig.solved)
    assert not torch.equal(other, plain) and torch.all(other[~touched] == 0)


def test_a_solve_centred_on_the_map_keeps_it_where_a_small_view_says_little():
    """At 32 pixels the torus is seen through few pixels: the least-squares change drifts far
    from the truth (overlapping Gaussians share a pixel's change arbitrarily), the solve
    centred on the fitted map stays near it, and still reproduces the view."""
    asset, view, truth, part = _affine_part_edit(32)
    sig, _ = gather_signals(asset, [view], solve_iters=6, fit_maps=("affine",), map_solves=True)
    assert sig.solved_shading is None  # not fitted, not solved
    seen = (sig.in_mask_weight > 0) & part
    plain = (sig.solved - truth)[seen].abs().amax(-1).median()
    centred = (sig.solved_affine - truth)[seen].abs().amax(-1).median()
    assert centred < 0.02 and centred < plain / 1.5, (centred, plain)
    assert torch.all(sig.solved_affine[sig.in_mask_weight == 0] == 0)
    assert _view_psnr(asset, view, sig.solved_affine) > 50.0  # the view is still reproduced
    new = base_colors(asset) + sig.solved_affine
    assert float(new.min()) >= -1e-6 and float(new.max()) <= 1 + 1e-6


def test_the_seen_gaussians_take_the_centred_solve_and_the_others_keep_theirs():
    from splatpainter.model.hypotheses import with_seen_solve

    delta = torch.rand(5, 3)
    weight = torch.tensor([0.0, 1.0, 0.5, 0.0, 2.0])
    solved = torch.full((5, 3), 7.0)
    out = with_seen_solve(delta, weight, solved)
    seen = weight > 0
    assert torch.equal(out[seen], solved[seen]) and torch.equal(out[~seen], delta[~seen])
    assert with_seen_solve(delta, weight, None) is delta


def _centred_editor_pair(**s2):
    """One recolour edit and two editors with the same weights: one that centres a recolour
    it reads as one (every share qualifies), one that never does."""
    asset, view, _, _ = _affine_part_edit(32)
    settings = SignalSettings(solve_iters=3, fit_maps=True, map_solves=True)
    kw = dict(solve_iters=3, fit_maps=True, map_solves=True, centre_share=0.0, **s2)
    torch.manual_seed(0)
    centring = EditorModel.initial(small_config(centre_map_fit=1e9, **kw))
    torch.manual_seed(0)
    plain = EditorModel.initial(small_config(centre_map_fit=0.0, **kw))
    with torch.no_grad():
        latent = centring.encode_asset(asset)
    sample = build_edit_sample(asset, [view], latent, settings=settings)
    return sample, centring, plain


@torch.no_grad()
def test_a_recolour_read_as_one_runs_the_head_again_centred_on_its_map():
    """The second pass changes only what the seen Gaussians take as their own change: the
    gate, the mix and every unseen Gaussian are the first pass's, bit for bit."""
    sample, centring, plain = _centred_editor_pair()
    sig = sample.signals
    assert sig.solved_affine is not None
    for m in (centring, plain):
        m.stage2.eval()
    inp = centring.stage2._gaussian_inputs(sample)
    first = plain.stage2([sample], plain.stage2.init_state())[0][0]
    again = centring.stage2._second_pass(sample, first["gate"], first["mix"], inp.stats)
    assert again is not None and again.centre == "affine" and again.reach_steps is None
    assert not again.whole_asset
    assert plain.stage2._second_pass(sample, first["gate"], first["mix"], inp.stats) is None
    out = centring.stage2([sample], centring.stage2.init_state())[0][0]
    seen = sig.in_mask_weight > 0
    assert torch.equal(out["gate"], first["gate"]) and torch.equal(out["mix"], first["mix"])
    assert torch.equal(out["rgb"][~seen], first["rgb"][~seen])
    assert not torch.equal(out["rgb"][seen], first["rgb"][seen])
    centred = inp.centred(sig)
    assert torch.equal(centred.cand[seen, 0], sig.solved_affine[seen])
    assert torch.equal(centred.cand[~seen], inp.cand[~seen])
    assert torch.equal(centred.cand[:, 1:], inp.cand[:, 1:])
    assert torch.equal(centred.per_gauss, inp.per_gauss)  # the features stay the first pass's


@torch.no_grad()
def test_chunked_and_paint_edits_agree_with_the_centring_forward():
    from splatpainter.model.restricted import chunked_forward

    sample, centring, _ = _centred_editor_pair()
    centring.stage2.eval()
    full = centring.stage2([sample], centring.stage2.init_state())[0][0]
    chunked, _ = chunked_forward(centring.stage2, sample, centring.stage2.init_state(), 700)
    for k in ("rgb", "rest_map", "gate"):
        assert torch.allclose(chunked[k], full[k], atol=1e-6), k
    paint = dataclasses.replace(sample, hint="paint")  # a local edit is never centred
    g = torch.ones(sample.colors.shape[0])
    mix = torch.zeros(g.numel(), 3)
    mix[:, 1] = 1.0
    stats = centring.stage2._gaussian_inputs(sample).stats
    assert centring.stage2._second_pass(paint, g, mix, stats) is None


@torch.no_grad()
def test_an_untold_hint_reads_as_auto_and_still_rules_its_hypotheses_out():
    """Stage2Config.untold_hints: the network reads an edit hinted "relight" as it reads one
    under "auto" (the same gate), and the hint still keeps the affine recolour out of the mix;
    told the hint, the same weights read it otherwise."""
    sample, model, _ = _centred_editor_pair(untold_hints=["relight"])
    s2 = model.stage2.eval()
    assert s2.config.untold_hints == ("relight",)

    def edit(hint: str):
        return s2([dataclasses.replace(sample, hint=hint)], s2.init_state())[0][0]

    relight, auto = edit("relight"), edit("auto")
    assert torch.equal(relight["gate"], auto["gate"])
    assert torch.all(relight["mix"][:, 1] == 0) and bool((auto["mix"][:, 1] > 0).any())
    s2.config.untold_hints = ()
    assert not torch.equal(edit("relight")["gate"], auto["gate"])
    with pytest.raises(ValueError, match="untold_hints"):
        small_config(untold_hints=["sharpen"])


@torch.no_grad()
def test_a_relight_read_as_one_opens_every_gate_and_centres_on_the_shading():
    """Stage2Config.relight_share: when the shading carries that share of the edit's weight,
    the head runs again with every gate at the edit's evidence and each seen Gaussian's own
    change the solve centred on the shading; the mix is the first pass's, and the chunked
    forward agrees.  A local hint never takes the second pass."""
    from splatpainter.model.restricted import chunked_forward

    sample, model, _ = _centred_editor_pair(relight_share=1e-6)
    s2 = model.stage2.eval()
    out = s2([sample], s2.init_state())[0][0]
    s2.config.relight_share = 0.0
    s2.config.centre_map_fit = 0.0  # nor a recolour's centring: the first pass alone
    first = s2([sample], s2.init_state())[0][0]
    s2.config.relight_share, s2.config.centre_map_fit = 1e-6, 1e9
    inp = s2._gaussian_inputs(sample)
    again = s2._second_pass(sample, first["gate"], first["mix"], inp.stats)
    assert again is not None and again.whole_asset and again.centre == "shading"
    assert bool((first["gate"] < first["evidence"]).any())  # the first pass left some closed
    assert torch.equal(out["gate"], torch.full_like(out["gate"], float(first["evidence"])))
    assert torch.equal(out["mix"], first["mix"])
    centred = again.inputs(inp, sample.signals)
    seen = sample.signals.in_mask_weight > 0
    assert torch.equal(centred.cand[seen, 0], sample.signals.solved_shading[seen])
    assert torch.equal(centred.cand[:, 1:], inp.cand[:, 1:]) and centred.whole_asset
    chunked, _ = chunked_forward(s2, sample, s2.init_state(), 700)
    for k in ("rgb", "rest_map", "gate"):
        assert torch.allclose(chunked[k], out[k], atol=1e-6), k
    paint = dataclasses.replace(sample, hint="paint")
    assert s2._second_pass(paint, first["gate"], first["mix"], inp.stats) is None


@torch.no_grad()
def test_a_relight_its_shading_explains_takes_exactly_the_shading_everywhere():
    """Stage2Config.relight_fit: a relight read as one whose shading fits the seen change
    (rmse below relight_fit of the mean residual) puts every Gaussian, seen ones too, exactly
    on the shading candidate at the edit's evidence, its bands on the shading's map; a fit
    above that bound keeps the solve centred on the shading, as relight_fit = 0 does."""
    from splatpainter.model.restricted import chunked_forward

    sample, model, _ = _centred_editor_pair(relight_share=1e-6, seen_corrections=True)
    s2 = model.stage2.eval()
    inp = s2._gaussian_inputs(sample)
    centred = s2([sample], s2.init_state())[0][0]
    ratio = float(inp.stats[2]) / float(inp.stats[3])
    g, m = centred["gate"], centred["mix"]
    for fit, exact in ((0.0, False), (ratio * 0.999, False), (ratio * 1.001, True)):
        s2.config.relight_fit = fit
        again = s2._second_pass(sample, g, m, inp.stats)
        assert again is not None and again.whole_asset and again.shading_only == exact
        assert again.centre == (None if exact else "shading")
    out = s2([sample], s2.init_state())[0][0]
    assert torch.equal(out["gate"], centred["gate"])
    assert torch.equal(out["mix"], torch.tensor([0.0, 0.0, 1.0]).expand_as(out["mix"]))
    assert torch.equal(out["rgb"], out["gate"][:, None] * inp.cand[:, 2])
    assert torch.allclose(out["rest_map"][:, 0, 0] - 1, out["gate"] * (inp.rest[:, 2, 0, 0] - 1))
    seen = sample.signals.in_mask_weight > 0
    assert not torch.equal(out["rgb"][seen], centred["rgb"][seen])
    chunked, _ = chunked_forward(s2, sample, s2.init_state(), 700)
    for k in ("rgb", "rest_map", "gate"):
        assert torch.allclose(chunked[k], out[k], atol=1e-6), k


@torch.no_grad()
def test_seen_corrections_scale_the_free_correction_by_the_seen_changes_weight():
    """Stage2Config.seen_corrections: rgb = gate (sum_k mix_k cand_k + mix_0 corr), with corr
    the correction the same weights give without it, so a Gaussian whose mix takes only a
    map takes that map exactly."""
    sample, _, model = _centred_editor_pair()  # the editor that never centres
    s2 = model.stage2.eval()
    plain = s2([sample], s2.init_state())[0][0]
    s2.config.seen_corrections = True
    exact = s2([sample], s2.init_state())[0][0]
    assert torch.equal(exact["gate"], plain["gate"]) and torch.equal(exact["mix"], plain["mix"])
    gate, mix = plain["gate"], plain["mix"]
    maps = (mix[..., None] * s2._gaussian_inputs(sample).cand).sum(1)
    open_ = gate > 0
    corr = plain["rgb"][open_] / gate[open_, None] - maps[open_]
    assert float(corr.abs().max()) > 1e-3  # the untrained head corrects
    want = gate[open_, None] * (maps[open_] + mix[open_, :1] * corr)
    assert torch.allclose(exact["rgb"][open_], want, atol=1e-6)
    assert torch.equal(exact["rgb"][~open_], torch.zeros_like(exact["rgb"][~open_]))
