"""What a view gives, remembered through a session of colour edits (render/memo.py), and the
edit evidence computed from the mask's box alone (edit/signals.py)."""

import dataclasses

import torch

from splatpainter.assets.procedural import make_demo_asset
from splatpainter.edit import EditView
from splatpainter.edit import signals as sig_mod
from splatpainter.edit.methods import apply_color_delta
from splatpainter.edit.signals import gather_signals, shown_frame
from splatpainter.render import footprint_box, render, splat_sums
from splatpainter.render.memo import ViewMemo
from splatpainter.train.data import view_camera


def _stroke(n: int = 1500, size: int = 48, seed: int = 5):
    asset = make_demo_asset(n, seed=seed).asset
    cam = view_camera(asset, 25.0, 20.0, size)
    img = render(asset, cam).rgb.clamp(0, 1).clone()
    img[size // 3 : size // 2, size // 4 : size // 2] = torch.tensor([1.0, 0.0, 1.0])
    return asset, EditView(cam, img)


def _clear() -> None:
    sig_mod.VIEW_WEIGHTS.clear()
    sig_mod.SHOWN_FRAMES.clear()


def _fields(s) -> dict:
    return {k: v for k, v in vars(s).items() if isinstance(v, torch.Tensor)}


def test_remembered_view_results_give_the_same_signals_bit_for_bit():
    asset, view = _stroke()
    _clear()
    cold, cold_ev = gather_signals(asset, [view], solve_iters=4)
    hits = sig_mod.VIEW_WEIGHTS.hits
    warm, warm_ev = gather_signals(asset, [view], solve_iters=4)
    assert sig_mod.VIEW_WEIGHTS.hits == hits + 1  # the weights came from the memo
    for k, v in _fields(cold).items():
        assert torch.equal(v, _fields(warm)[k]), k
    assert torch.equal(cold_ev[0].render, warm_ev[0].render)
    assert torch.equal(cold_ev[0].contributing, warm_ev[0].contributing)


def test_in_mask_sums_from_the_masks_box_equal_those_of_the_whole_view():
    asset, view = _stroke()
    _clear()
    signals, ev = gather_signals(asset, [view])
    ref = render(asset, view.camera).rgb
    m = ev[0].mask
    res = view.image - ref
    targets = torch.cat(
        [torch.stack([m, m * res.abs().amax(-1), torch.ones_like(m)], -1), m[..., None] * res], -1
    )
    full = splat_sums(asset, view.camera, targets)
    # A crop clamps the projection's Jacobian at its own field of view (gsplat's rule), so a
    # large Gaussian centred far outside it is drawn a little differently: weights agree to a
    # thousandth of a pixel, the in-mask total to 1e-4.
    torch.testing.assert_close(signals.in_mask_weight, full[:, 0], rtol=1e-4, atol=2e-3)
    assert abs(float(signals.in_mask_weight.sum() / full[:, 0].sum()) - 1) < 1e-4
    torch.testing.assert_close(signals.weight, full[:, 2], rtol=1e-5, atol=1e-5)
    has = full[:, 0] > 0.01
    want = full[:, 3:] / full[:, :1].clamp_min(1e-12)
    torch.testing.assert_close(signals.residual[has], want[has], rtol=1e-3, atol=1e-3)


def test_a_colour_edit_keeps_the_view_weights_and_drops_the_shown_frame():
    asset, view = _stroke()
    _clear()
    frame = shown_frame(asset, view.camera)
    assert torch.equal(frame, render(asset, view.camera).rgb)
    hits = sig_mod.SHOWN_FRAMES.hits
    assert shown_frame(asset, view.camera) is frame
    assert sig_mod.SHOWN_FRAMES.hits == hits + 1
    sig_mod.view_weights(asset, view.camera)
    edited = apply_color_delta(asset, torch.full((asset.num_gaussians, 3), 0.1))
    w_hits, f_misses = sig_mod.VIEW_WEIGHTS.hits, sig_mod.SHOWN_FRAMES.misses
    _, ev = gather_signals(edited, [view])
    assert sig_mod.VIEW_WEIGHTS.hits == w_hits + 1  # same geometry: the same weights
    assert sig_mod.SHOWN_FRAMES.misses == f_misses + 1  # new colours: rendered anew
    assert torch.equal(ev[0].render, render(edited, view.camera).rgb)


def test_the_memo_sees_in_place_changes_other_cameras_and_dropped_tensors():
    memo = ViewMemo(entries=2)
    asset, view = _stroke(n=400)
    cam = view.camera
    t = [asset.means.clone()]
    memo.put(t, cam, torch.ones(3))
    assert torch.equal(memo.get(t, cam), torch.ones(3))
    memo.get(t, cam).mul_(2)  # a caller that writes into a remembered value: it is dropped
    assert memo.get(t, cam) is None
    memo.put(t, cam, torch.ones(3))
    assert memo.get([asset.means.clone()], cam) is None  # equal values, another tensor
    other = dataclasses.replace(cam, cx=cam.cx + 0.5)
    assert memo.get(t, other) is None
    t[0].add_(0.0)  # an in-place write, even of nothing, is a change
    assert memo.get(t, cam) is None
    memo.put(t, cam, torch.zeros(3))
    del t
    memo.put([asset.quats], cam, torch.zeros(1))
    assert len(memo._items) == 1  # the dropped tensor's entry went with it
    for i in range(3):
        memo.put([asset.quats], cam, torch.zeros(1), extra=i)
    assert len(memo._items) == 2


def test_the_footprint_box_holds_every_pixel_its_gaussians_reach():
    asset, view = _stroke(n=1200)
    cam = view.camera
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        pick = torch.rand(asset.num_gaussians, generator=g) < 0.05
        colors = torch.zeros(asset.num_gaussians, 3)
        colors[pick] = 1.0
        reach = render(asset, cam, colors=colors).rgb[..., 0] > 0
        box = footprint_box(asset.subset(pick), cam)
        pix = reach.nonzero()
        if pix.numel() == 0:
            continue
        assert box is not None
        x0, y0, x1, y1 = box
        assert int(pix[:, 0].min()) >= y0 and int(pix[:, 0].max()) <= y1
        assert int(pix[:, 1].min()) >= x0 and int(pix[:, 1].max()) <= x1
        # and a render of the crop is that box of the render (up to the Jacobian clamp)
        crop = cam.cropped(x0, y0, x1 - x0 + 1, y1 - y0 + 1)
        whole = render(asset, cam, colors=colors).rgb[y0 : y1 + 1, x0 : x1 + 1]
        torch.testing.assert_close(render(asset, crop, colors=colors).rgb, whole, atol=2e-3, rtol=0)
