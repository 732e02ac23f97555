"""gsplat-style renderer options, each against the PyTorch reference (images and gradients):
near/far planes, eps2d, radius_clip, antialiased mode, N-channel colours, batched cameras,
gradients for the camera pose, intrinsics and background, per-axis opacity-aware tile
bounds, and the overflow guards (huge or degenerate Gaussians)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from splatpainter.render import RenderError, rasterize
from splatpainter.render.project import ALPHA_MIN, tile_rects

sys.path.insert(0, str(Path(__file__).parent))  # the shared scenes of test_sp_render
from test_sp_render import (
    NAMES,
    H,
    K,
    W,
    _assert_grads_close,
    _loss,
    _render,
    _w2c,
    mixed_scene,
)


def _all_grads(scene, backend, dtype, colors=None, **kw):
    """Render with every input differentiable; returns (output, grads by name)."""
    p = {k: v.detach().to(dtype).requires_grad_(True) for k, v in scene.items()}
    w2c = _w2c().to(dtype).requires_grad_(True)
    k = K.to(dtype).requires_grad_(True)
    ch = 3 if colors is None else colors.shape[1]
    bg = torch.linspace(0.1, 0.9, ch, dtype=dtype).requires_grad_(True)
    col = None if colors is None else colors.to(dtype).requires_grad_(True)
    out = rasterize(
        *(p[n] for n in NAMES), w2c, k, W, H, background=bg, backend=backend, colors=col, **kw
    )
    g = torch.Generator().manual_seed(1)

    def noise(*shape):  # the same numbers whatever the dtype
        return torch.randn(*shape, generator=g).to(dtype)

    loss = (out.rgb * noise(*out.rgb.shape)).sum() + (out.alpha * noise(H, W)).sum()
    loss = loss + 0.3 * (out.depth * noise(H, W)).sum()
    names = [*NAMES, "world_to_cam", "K", "background"] + (["colors"] if col is not None else [])
    inputs = [*(p[n] for n in NAMES), w2c, k, bg] + ([col] if col is not None else [])
    if col is not None:
        names.remove("sh")
        inputs.pop(NAMES.index("sh"))
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    return out, dict(zip(names, grads, strict=True))


def _compare(kw, colors=None, scene=None):
    scene = mixed_scene() if scene is None else scene
    out_f, gf = _all_grads(scene, "numba", torch.float32, colors=colors, **kw)
    out_r, gr = _all_grads(scene, "reference", torch.float64, colors=colors, **kw)
    for name in ("rgb", "alpha", "depth", "depth_accum"):
        a, r = getattr(out_f, name), getattr(out_r, name)
        scale = 1.0 if "depth" not in name else float(r.detach().abs().max())
        err = float((a.detach().double() - r.detach()).abs().max())
        assert err <= 1e-4 * scale, f"{kw} {name}: max abs diff {err:.2e}"
    assert torch.equal(out_f.radii_xy, out_r.radii_xy)
    for name, r in gr.items():
        a = gf[name]
        assert a is not None, f"numba returned no gradient for {name}"
        assert r is not None and r.abs().sum() > 0, name
        _assert_grads_close(a.double(), r, f"{kw} {name}")
    return out_f, out_r


def test_default_camera_pose_intrinsics_and_background_gradients():
    _compare({})


def test_antialiased_mode_matches_reference_and_dims_small_splats():
    out_aa, _ = _compare({"rasterize_mode": "antialiased"})
    classic, _ = _render(mixed_scene(), "numba")
    # compensation <= 1: less opaque overall (early termination makes single pixels
    # non-monotone), and visibly less where small splats dominate
    assert float(out_aa.alpha.detach().mean()) < float(classic.alpha.detach().mean())
    assert float((classic.alpha - out_aa.alpha).detach().max()) > 0.05


@pytest.mark.parametrize(
    "kw",
    [
        {"near_plane": 2.5, "far_plane": 3.2},
        {"eps2d": 0.05, "near_plane": 0.01},
        {"radius_clip": 3.0},
    ],
)
def test_projection_options_match_reference(kw):
    out, _ = _compare(kw)
    base, _ = _render(mixed_scene(), "numba")
    assert (out.radii > 0).sum() < (base.radii > 0).sum() or "eps2d" in kw


def test_feature_channels_any_count():
    scene = mixed_scene(seed=3)
    g = torch.Generator().manual_seed(4)
    for ch in (1, 8):
        feats = torch.randn(scene["means"].shape[0], ch, generator=g)
        out, _ = _compare({}, colors=feats, scene=scene)
        assert out.rgb.shape == (H, W, ch)
    # the first three of eight channels render exactly like a 3-channel render of them
    three, _ = _render(scene, "numba", colors=feats[:, :3])
    eight, _ = _render(scene, "numba", colors=feats, background=None)
    assert torch.equal(eight.rgb[..., :3], three.rgb) and torch.equal(eight.alpha, three.alpha)


def test_batched_cameras_equal_single_renders_and_gradients():
    scene = mixed_scene(seed=5)
    w2cs = torch.stack([_w2c(3.0, 0.2), _w2c(3.5, -0.4)])
    ks = torch.stack([K, K * torch.tensor([[1.1], [1.1], [1.0]])])
    bgs = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.5, 0.0]])
    for backend in ("numba", "reference"):
        p = {k: v.detach().requires_grad_(True) for k, v in scene.items()}
        out = rasterize(*(p[n] for n in NAMES), w2cs, ks, W, H, background=bgs, backend=backend)
        assert out.rgb.shape == (2, H, W, 3) and out.radii.shape == (2, scene["means"].shape[0])
        g_batch = torch.autograd.grad(out.rgb.sum() + out.depth.sum(), p["means"])[0]
        g_single = torch.zeros_like(g_batch)
        for i in range(2):
            one = rasterize(
                *(p[n] for n in NAMES), w2cs[i], ks[i], W, H, background=bgs[i], backend=backend
            )
            assert torch.equal(one.rgb, out.rgb[i]) and torch.equal(one.radii, out.radii[i])
            g_single += torch.autograd.grad(one.rgb.sum() + one.depth.sum(), p["means"])[0]
        assert torch.allclose(g_batch, g_single, atol=1e-5)


def test_near_and_far_planes_cull_in_view_space():
    # one Gaussian straight ahead at view depths 0.011 / 0.19 / 0.21 / 5 / 50
    quats = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    for z, near, far, drawn in [
        (0.011, None, None, False),  # INRIA: z < 0.2 is culled (no more screen-filling splats)
        (0.19, None, None, False),
        (0.21, None, None, True),
        (0.011, 0.01, None, True),
        (5.0, None, 4.0, False),
        (50.0, None, None, True),
        (5.0, 5.5, 10.0, False),
    ]:
        kw = {}
        if near is not None:
            kw["near_plane"] = near
        if far is not None:
            kw["far_plane"] = far
        for backend in ("numba", "reference"):
            out = rasterize(
                torch.tensor([[0.0, 0.0, z]]), quats, torch.full((1, 3), math.log(0.02 * z)),
                torch.tensor([3.0]), torch.zeros(1, 1, 3), torch.eye(4), K, W, H,
                backend=backend, **kw,
            )  # fmt: skip
            assert bool(out.radii[0] > 0) == drawn, (z, near, far, backend)
            assert (float(out.alpha.detach().max()) > 0.5) == drawn


def test_invalid_options_are_clear_errors():
    scene = mixed_scene()
    for kw, match in [
        ({"near_plane": 0.0}, "near_plane"),
        ({"near_plane": 2.0, "far_plane": 1.0}, "far"),
        ({"eps2d": -1.0}, "eps2d"),
        ({"rasterize_mode": "fancy"}, "rasterize_mode"),
        ({"near_plane": float("nan")}, "near_plane"),
        ({"background": (0.0, 0.0, 0.0, 0.0)}, "background"),
    ]:
        with pytest.raises(RenderError, match=match):
            _render(scene, "numba", **kw)
    with pytest.raises(RenderError, match="K must be"):
        rasterize(
            *(scene[n] for n in NAMES), torch.stack([_w2c(), _w2c()]), K[None].repeat(3, 1, 1),
            W, H,
        )  # fmt: skip


def test_tile_bounds_are_per_axis_opacity_aware_and_lose_no_pixel():
    """Boxes are the alpha >= 1/255 extents per axis: fewer tiles than a square 3-sigma box,
    and every pixel a brute-force evaluation (no boxes at all) draws is still drawn."""
    from splatpainter.render.project import project_gaussians

    scene = mixed_scene(seed=2)
    w2c = _w2c()
    op = torch.sigmoid(scene["opacity_logits"])
    gauss = (scene["means"], scene["quats"], scene["log_scales"], w2c)

    def count(r):
        return int(((r[:, 2] - r[:, 0]).clamp_min(0) * (r[:, 3] - r[:, 1]).clamp_min(0)).sum())

    # at 4x the resolution, against the old square 3-sigma box (major-axis sigma)
    big = project_gaussians(*gauss, K * torch.tensor([[4.0], [4.0], [1.0]]), 4 * W, 4 * H,
                            opacities=op)  # fmt: skip
    vis = big.radii > 0
    c = big.conics[vis]
    cov = torch.linalg.inv(torch.stack([c[:, 0], c[:, 1], c[:, 1], c[:, 2]], -1).reshape(-1, 2, 2))
    square = torch.ceil(3 * torch.linalg.eigvalsh(cov)[:, 1].sqrt()).to(torch.int32)
    tight = count(tile_rects(big.means2d[vis], big.extents[vis], 4 * W, 4 * H))
    assert tight < 0.8 * count(tile_rects(big.means2d[vis], square, 4 * W, 4 * H))  # 0.71
    proj = project_gaussians(*gauss, K, W, H, opacities=op)
    vis = proj.radii > 0
    tight = tile_rects(proj.means2d, proj.extents, W, H)[vis]
    # brute force: alpha of every visible Gaussian at every pixel, no boxes
    ys, xs = torch.meshgrid(torch.arange(H) + 0.5, torch.arange(W) + 0.5, indexing="ij")
    d = proj.means2d[vis][:, None, None, :] - torch.stack([xs, ys], -1)[None]
    c = proj.conics[vis][:, None, None, :]
    power = -0.5 * (c[..., 0] * d[..., 0] ** 2 + c[..., 2] * d[..., 1] ** 2)
    power = power - c[..., 1] * d[..., 0] * d[..., 1]
    alpha = op[vis][:, None, None] * torch.exp(power)
    reach = alpha >= ALPHA_MIN * 1.0001  # clear of the float rounding at the threshold
    tx, ty = xs.long() // 16, ys.long() // 16
    r = tight[:, :, None, None]
    in_box = (r[:, 0] <= tx) & (tx < r[:, 2]) & (r[:, 1] <= ty) & (ty < r[:, 3])
    assert not (reach & ~in_box).any()


@pytest.mark.parametrize("log_scale", [20.0, 40.0, 90.0])
def test_huge_gaussians_are_culled_by_every_backend(log_scale):
    scene = mixed_scene(seed=1)
    scene["log_scales"] = scene["log_scales"].clone()
    scene["log_scales"][0] = torch.tensor([log_scale, -2.0, -2.0])  # beyond any image
    outs = {}
    for backend, dtype in (("numba", torch.float32), ("reference", torch.float32)):
        out, p = _render(scene, backend, dtype=dtype)
        assert int(out.radii[0]) == 0, backend
        g = torch.autograd.grad(_loss(out), [p[k] for k in NAMES])
        assert all(torch.isfinite(x).all() for x in g), backend
        assert (g[2][0] == 0).all()
        outs[backend] = out
    ref64, _ = _render(scene, "reference", dtype=torch.float64)
    assert int(ref64.radii[0]) == 0
    assert (outs["numba"].rgb.double() - ref64.rgb).abs().max() <= 1e-4


def test_large_but_sane_and_degenerate_gaussians_agree():
    scene = mixed_scene(seed=4)
    ls = scene["log_scales"].clone()
    ls[0] = torch.tensor([0.5, 0.5, 0.5])  # fills the view: drawn (sigma ~ 100s of px)
    ls[1] = torch.tensor([-30.0, -30.0, -30.0])  # a point: eps2d keeps it a 0.3 px^2 blob
    ls[2] = torch.tensor([-1.0, -40.0, -40.0])  # a needle: rank-1 2D covariance
    scene["log_scales"] = ls
    out_f, _ = _compare({}, scene=scene)
    assert int(out_f.radii[0]) > 100 and int(out_f.radii[1]) > 0
    # without dilation the point and the needle are (nearly) singular: the backends still
    # cull or draw them alike (_compare checks the radii are equal)
    _compare({"eps2d": 0.0}, scene=scene)


def test_opacity_below_cutoff_is_culled():
    scene = mixed_scene(seed=6)
    logits = scene["opacity_logits"].clone()
    logits[:5] = math.log(0.9 * ALPHA_MIN / (1 - 0.9 * ALPHA_MIN))  # opacity < 1/255
    scene["opacity_logits"] = logits
    for backend in ("numba", "reference"):
        out, _ = _render(scene, backend)
        assert (out.radii[:5] == 0).all()
