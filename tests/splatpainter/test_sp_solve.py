"""The least-squares colour change of the touched Gaussians (edit/solve.py) and its use."""

import torch

from splatpainter.assets.procedural import make_demo_asset
from splatpainter.edit import EditView
from splatpainter.edit.methods import apply_color_delta, build_edit_sample
from splatpainter.edit.signals import gather_signals
from splatpainter.model import EditorConfig, EditorModel, Stage1Config, Stage2Config
from splatpainter.model.stage1 import Stage1Latent, voxelize
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
    sample = build_edit_sample(asset, [view], latent, solve_iters=3)
    cand = model.stage2._gaussian_inputs(sample)[0]
    assert torch.equal(cand[:, 0], sample.signals.solved)
    plain = build_edit_sample(asset, [view], latent)
    assert torch.equal(model.stage2._gaussian_inputs(plain)[0][:, 0], plain.signals.residual)


def test_training_examples_carry_the_solve_and_key_the_cache_on_it():
    s1 = Stage1Config(grid_size=8, num_views=2, view_size=32)
    ex = build_example(100_000, SMALL, s1, 32, solve_iters=2)
    assert all(step["signals"]["solved"] is not None for step in ex["steps"])
    assert cache_key(SMALL, s1, 32, (2, 0.0)) != cache_key(SMALL, s1, 32, (0, 0.0))
    assert cache_key(SMALL, s1, 32, (2, 0.01)) != cache_key(SMALL, s1, 32, (2, 0.0))


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
