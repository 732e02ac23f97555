"""Renderer tests: compiled (numba) kernels vs. the PyTorch reference, FD checks, semantics.

The reference runs in float64 when it serves as ground truth: the float32 fast path computes
its per-Gaussian stages in float64 internally, and on strongly anisotropic Gaussians a float32
reference is itself ~1e-4 off (cancellation in the 2D covariance determinant).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from splatpainter.render import ColorRender, RenderError, rasterize, render, splat_weights
from splatpainter.render.gsplat_backend import gsplat_available

W, H = 61, 45  # not multiples of the 16 px tile: partial edge tiles
K = torch.tensor([[70.0, 0.0, 32.0], [0.0, 66.0, 24.0], [0.0, 0.0, 1.0]])


def _w2c(tz: float = 3.0, angle: float = 0.2) -> torch.Tensor:
    c, s = math.cos(angle), math.sin(angle)
    m = torch.eye(4)
    m[:3, :3] = torch.tensor([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])
    m[:3, 3] = torch.tensor([0.1, -0.05, tz])
    return m


def mixed_scene(seed: int = 0, sh_degree: int = 3) -> dict[str, torch.Tensor]:
    """~300 Gaussians covering the hard cases (see the module docstring of the renderer)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.rand(*shape, generator=g)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    parts = []

    def add(means, log_scales, logits):
        n = means.shape[0]
        parts.append((means, randn(n, 4), log_scales, logits))

    add(randn(140, 3) * 0.5, rand(140, 3) * -1.5 - 1.5, randn(140) * 2)  # generic
    add(randn(20, 3) * 0.5, torch.tensor([-1.0, -5.0, -5.5]).repeat(20, 1), randn(20) + 1)
    add(randn(20, 3) * 0.5, torch.full((20, 3), -7.0), randn(20) + 2)  # tiny: 2 px radius
    behind = randn(10, 3) * 0.3
    behind[:, 2] = -4.0 - rand(10)  # camera z < 0
    add(behind, torch.full((10, 3), -1.0), torch.full((10,), 3.0))
    off = randn(10, 3) * 0.2
    off[:, 0] += torch.where(rand(10) > 0.5, 6.0, -6.0)  # far outside the frustum
    add(off, torch.full((10, 3), -2.0), torch.full((10,), 3.0))
    # big Gaussians centred outside the 1.3x FOV clamp but reaching into the image: exercises
    # the clamped branch of the projection Jacobian
    edge = torch.tensor(
        [[2.3, 0.0, 0.0], [-2.3, 0.3, 0.0], [0.2, 1.9, 0.0], [0.0, -1.9, 0.2], [2.2, 1.8, 0.0]]
    )
    add(edge, torch.full((5, 3), -0.7) + rand(5, 3) * 0.3, torch.full((5,), 1.0))
    for z, logit in ((-0.6, 0.0), (0.0, -0.5), (0.6, 0.3)):  # overlapping translucent layers
        m = (rand(30, 3) - 0.5) * torch.tensor([2.0, 1.6, 0.05])
        m[:, 2] += z
        add(m, torch.tensor([-1.2, -1.2, -4.0]) + rand(30, 3) * 0.3, torch.full((30,), logit))
    stack = torch.zeros(6, 3)  # near-opaque stack: exercises early termination
    stack[:, 0] = -0.3
    stack[:, 2] = torch.linspace(-1.0, 1.0, 6)
    add(stack, torch.full((6, 3), -1.3), torch.full((6,), 6.0))
    means, quats, log_scales, logits = (torch.cat(x) for x in zip(*parts, strict=True))
    n = means.shape[0]
    sh = randn(n, (sh_degree + 1) ** 2, 3) * 0.4
    return {
        "means": means,
        "quats": quats,
        "log_scales": log_scales,
        "opacity_logits": logits,
        "sh": sh,
    }


NAMES = ("means", "quats", "log_scales", "opacity_logits", "sh")


@pytest.fixture(scope="module", autouse=True)
def _compiled_kernels():
    """Compile the numba kernels once (about a minute on a fresh checkout on 2 cores, ~1 s
    when numba's on-disk cache is warm) so that no single test carries that cost."""
    scene = {k: v[:40] for k, v in mixed_scene().items()}
    out, params = _render(scene, "numba")
    torch.autograd.grad(out.rgb.sum() + out.depth.sum(), list(params.values()))


def _render(scene, backend, w2c=None, background=(0.0, 0.0, 0.0), dtype=torch.float32, **kw):
    params = {k: v.detach().to(dtype).requires_grad_(True) for k, v in scene.items()}
    out = rasterize(
        *(params[k] for k in NAMES),
        (_w2c() if w2c is None else w2c).to(dtype),
        K.to(dtype),
        W,
        H,
        background=background,
        backend=backend,
        **kw,
    )
    return out, params


def _loss(out, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (
        (out.rgb * torch.randn(H, W, 3, generator=g)).sum()
        + (out.alpha * torch.randn(H, W, generator=g)).sum()
        + 0.3 * (out.depth * torch.randn(H, W, generator=g)).sum()
    )


def _assert_grads_close(ga: torch.Tensor, gr: torch.Tensor, name: str) -> None:
    assert torch.isfinite(ga).all(), name
    rel = (ga - gr).norm() / gr.norm().clamp_min(1e-12)
    assert rel < 1e-3, f"{name}: relative gradient error {rel:.2e}"
    tol = 1e-4 * gr.abs().max() + 1e-3 * gr.abs()
    bad = (ga - gr).abs() > tol
    assert not bad.any(), f"{name}: {int(bad.sum())} elements differ, max {(ga - gr).abs().max()}"


@pytest.mark.parametrize("background", [(0.0, 0.0, 0.0), (0.2, 0.5, 0.9)])
def test_numba_matches_reference_images_and_grads(background):
    scene = mixed_scene()
    out_f, pf = _render(scene, "numba", background=background)
    out_r, pr = _render(scene, "reference", background=background, dtype=torch.float64)
    assert out_r.alpha.max() > 0.99 and (out_r.alpha < 0.5).any()  # non-trivial coverage
    vis = out_r.radii > 0
    assert vis.sum() > 200 and (~vis).sum() >= 20  # behind / off-screen ones are culled
    for name in ("rgb", "alpha", "depth"):
        a, r = getattr(out_f, name), getattr(out_r, name)
        assert a.shape == r.shape and a.dtype == torch.float32
        err = (a.double() - r).abs().max()
        scale = 1.0 if name != "depth" else float(r.detach().abs().max())  # depth is in scene units
        assert err <= 1e-4 * scale, f"{name}: max abs diff {err:.2e}"
    assert torch.equal(out_f.radii, out_r.radii)
    gf = torch.autograd.grad(_loss(out_f), [pf[k] for k in NAMES])
    gr = torch.autograd.grad(_loss(out_r), [pr[k] for k in NAMES])
    for name, a, r in zip(NAMES, gf, gr, strict=True):
        assert r.abs().sum() > 0, name
        _assert_grads_close(a.double(), r, name)
    # culled Gaussians receive exactly zero gradient
    assert (gf[0][~vis] == 0).all() and (gf[4][~vis] == 0).all()


def test_colors_override_matches_reference_and_sh_degree_selection():
    scene = mixed_scene(seed=3)
    colors = torch.rand(scene["means"].shape[0], 3, generator=torch.Generator().manual_seed(2))
    grads = {}
    for backend, dtype in (("numba", torch.float32), ("reference", torch.float64)):
        c = colors.to(dtype).requires_grad_(True)
        out, _ = _render(scene, backend, colors=c, dtype=dtype)
        grads[backend] = (out, torch.autograd.grad(_loss(out), c)[0])
    (of, gf), (orf, gr) = grads["numba"], grads["reference"]
    assert (of.rgb.double() - orf.rgb).abs().max() <= 1e-4
    _assert_grads_close(gf.double(), gr, "colors")
    # sh_degree=0 uses only the DC band
    dc = dict(scene, sh=scene["sh"][:, :1].clone())
    a, _ = _render(scene, "numba", sh_degree=0)
    b, _ = _render(dc, "numba")
    assert torch.equal(a.rgb, b.rgb)


def test_early_termination_and_background_semantics():
    # Five concentric Gaussians with alpha 0.95 at the centre pixel: T = .05, .0025, 1.25e-4,
    # then 6.25e-6 < 1e-4, so the 4th and 5th are not drawn; the background gets T = 1.25e-4.
    n = 5
    a = 0.95
    cols = torch.tensor(
        [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    )
    u, v = 20.5, 12.5  # a pixel centre
    z = torch.arange(1, n + 1, dtype=torch.float32) + 1.0
    means = torch.stack([(u - 32.0) / 70.0 * z, (v - 24.0) / 66.0 * z, z], dim=-1)
    quats = torch.tensor([[1.0, 0.0, 0.0, 0.0]]).repeat(n, 1)
    log_scales = torch.log(0.05 * z)[:, None].repeat(1, 3)
    logits = torch.full((n,), math.log(a / (1 - a)))
    bg = torch.tensor([0.1, 0.2, 0.3])
    T = [1.0, 0.05, 0.0025, 0.000125]
    want = sum(cols[i] * a * T[i] for i in range(3)) + T[3] * bg
    for backend in ("numba", "reference"):
        out = rasterize(
            means, quats, log_scales, logits, None, torch.eye(4), K, W, H,
            background=bg, backend=backend, colors=cols,
        )  # fmt: skip
        got = out.rgb[12, 20]
        assert torch.allclose(got, want, atol=2e-6), (backend, got, want)
        assert abs(float(out.alpha[12, 20]) - (1 - T[3])) < 1e-6
        assert torch.allclose(out.rgb[0, W - 1], bg)  # far corner: background only
        assert float(out.alpha[0, W - 1]) == 0.0 and float(out.depth[0, W - 1]) == 0.0
        d = float(out.depth[12, 20])
        want_d = sum(float(z[i]) * a * T[i] for i in range(3)) / (1 - T[3])
        assert abs(d - want_d) < 1e-5  # normalised expected depth


def test_background_blend_and_empty_scene():
    scene = mixed_scene(seed=5)
    black, _ = _render(scene, "numba")
    bg = (0.3, 0.6, 0.9)
    col, _ = _render(scene, "numba", background=bg)
    expect = black.rgb + (1 - black.alpha)[..., None] * torch.tensor(bg)
    assert (col.rgb - expect).abs().max() < 1e-6
    empty = {k: v[:0] for k, v in scene.items()}
    for backend in ("numba", "reference"):
        out, _ = _render(empty, backend, background=bg)
        assert torch.allclose(out.rgb, torch.tensor(bg).expand(H, W, 3))
        assert (out.alpha == 0).all() and (out.depth == 0).all()


def test_numba_is_deterministic():
    scene = mixed_scene(seed=7)
    runs = []
    for _ in range(2):
        out, p = _render(scene, "numba", background=(0.1, 0.1, 0.1))
        grads = torch.autograd.grad(_loss(out), [p[k] for k in NAMES])
        runs.append((out.rgb, out.alpha, out.depth, *grads))
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.skipif(
    __import__("numba").config.NUMBA_NUM_THREADS < 2, reason="needs two numba threads"
)
def test_numba_is_bit_identical_with_one_and_two_threads():
    """Tiles are dealt to threads interleaved, and every tile is computed by one thread in a
    fixed order, so the thread count changes the work split, never a bit of the result."""
    import numba

    scene = mixed_scene(seed=17)
    before = numba.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            numba.set_num_threads(threads)
            out, p = _render(scene, "numba", background=(0.3, 0.2, 0.1))
            grads = torch.autograd.grad(_loss(out), [p[k] for k in NAMES])
            runs.append((out.rgb, out.alpha, out.depth, *grads))
    finally:
        numba.set_num_threads(before)
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_depth_order_is_a_stable_sort_carrying_the_rectangles():
    """Binning deals Gaussians to tiles in the order of this radix sort: it must be exactly
    numpy's stable argsort (ties keep index order), over keys that use all 32 bits."""
    import numpy as np

    from splatpainter.render._kernels import depth_order

    rng = np.random.default_rng(0)
    keys = rng.integers(0, 2**32, size=5000, dtype=np.uint64).astype(np.uint32)
    keys[::7] = keys[3]  # many ties
    keys[1::11] = np.uint32(2**32 - 1)
    rects = rng.integers(0, 100, size=(5000, 4)).astype(np.int32)
    order, moved = depth_order(keys, rects)
    assert np.array_equal(order, np.argsort(keys, kind="stable"))
    assert np.array_equal(moved, rects[order])


@pytest.mark.parametrize("tile", [8, 32])
def test_numba_result_does_not_depend_on_the_tile_size(monkeypatch, tile):
    """The compositing kernels process each tile row as runs of 16 lanes: an 8 px tile uses
    half a run, a 32 px tile two. Per pixel the same Gaussians composite in the same order
    whatever the tiling, so the images are bit-identical to the 16 px tiles'; a Gaussian's
    gradient sums its per-tile parts, so only the grouping of that sum (rounding) changes."""
    from splatpainter.render import project

    scene = mixed_scene(seed=13)
    runs = []
    for t in (project.TILE, tile):
        monkeypatch.setattr(project, "TILE", t)
        out, p = _render(scene, "numba", background=(0.2, 0.4, 0.6))
        grads = torch.autograd.grad(_loss(out), [p[k] for k in NAMES])
        runs.append((out, grads))
    (a, ga), (b, gb) = runs
    for name in ("rgb", "alpha", "depth"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for name, x, y in zip(NAMES, ga, gb, strict=True):
        assert (x - y).abs().max() <= 1e-5 * y.abs().max(), name


def test_reference_finite_differences_float64():
    # One tile, Gaussians well inside it and opacities moderate, so no threshold (1/255 skip,
    # tile membership, termination) is crossed by the FD perturbation.
    torch.manual_seed(0)
    n = 4
    means = torch.cat([torch.rand(n, 2) * 0.6 - 0.3, torch.rand(n, 1) * 1.0], dim=1).double()
    quats = torch.randn(n, 4, dtype=torch.float64)
    log_scales = (torch.rand(n, 3, dtype=torch.float64) * 0.5 - 1.6).requires_grad_()
    logits = torch.randn(n, dtype=torch.float64)
    sh = torch.randn(n, 16, 3, dtype=torch.float64) * 0.2
    w2c = _w2c(3.0).double()
    Ks = torch.tensor([[14.0, 0.0, 6.0], [0.0, 14.0, 5.0], [0.0, 0.0, 1.0]], dtype=torch.float64)

    def f(m, q, s, o, c):
        out = rasterize(m, q, s, o, c, w2c, Ks, 12, 10, background=(0.1, 0.2, 0.3),
                        backend="reference")  # fmt: skip
        assert (out.radii > 0).all()
        return out.rgb, out.alpha, out.depth

    inputs = tuple(x.detach().requires_grad_() for x in (means, quats, log_scales, logits, sh))
    # fast_mode: compares random directional derivatives v^T J u (FD) with autograd, per
    # input/output pair, instead of the full Jacobian (236 columns) -- the same check, cheaper.
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=True)
    # and the full Jacobian for the geometry of one Gaussian through the depth/alpha maps
    assert torch.autograd.gradcheck(
        lambda m, s: f(m, inputs[1], s, inputs[3], inputs[4])[1:],
        (inputs[0], inputs[2]),
        eps=1e-6,
        atol=1e-5,
        rtol=1e-3,
    )


def test_float64_input_and_render_entry_point():
    from splatpainter.assets import GaussianAsset
    from splatpainter.camera import Camera

    scene = mixed_scene(seed=11, sh_degree=1)
    w2c = _w2c()
    cam = Camera(width=W, height=H, fx=70.0, fy=66.0, cx=32.0, cy=24.0, world_to_cam=w2c)
    asset = GaussianAsset(**scene)
    out = render(asset, cam, background=(1.0, 1.0, 1.0))
    ref, _ = _render(scene, "reference", background=(1.0, 1.0, 1.0), dtype=torch.float64)
    assert (out.rgb.double() - ref.rgb).abs().max() <= 1e-4
    out64 = render(asset.to(torch.float64), cam, backend="numba")
    assert out64.rgb.dtype == torch.float64
    ref64 = render(asset.to(torch.float64), cam, backend="reference")
    assert (out64.rgb - ref64.rgb).abs().max() <= 1e-4
    # compositing weights of a pixel sum to its alpha
    w = splat_weights(asset, cam)
    assert w.shape == (asset.num_gaussians,) and (w >= 0).all()
    assert abs(float(w.sum()) - float(out.alpha.sum())) < 1e-3 * float(out.alpha.sum())
    assert (w[out.radii == 0] == 0).all()


def test_color_render_is_render_with_colors_bit_for_bit():
    """ColorRender (projection and binning once, colours per call: the solve's steps) gives
    render(colors=)'s image and colour gradient exactly, call after call."""
    from splatpainter.assets import GaussianAsset
    from splatpainter.camera import Camera

    asset = GaussianAsset(**mixed_scene(seed=5, sh_degree=1))
    cam = Camera(width=W, height=H, fx=70.0, fy=66.0, cx=32.0, cy=24.0, world_to_cam=_w2c())
    n = asset.num_gaussians
    staged = ColorRender(asset, cam)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        c = torch.rand(n, 3, generator=gen).requires_grad_()
        w = torch.rand(H, W, 3, generator=gen)
        a = staged(c)
        (ga,) = torch.autograd.grad((a * w).sum(), c)
        c2 = c.detach().clone().requires_grad_()
        b = render(asset, cam, colors=c2).rgb
        (gb,) = torch.autograd.grad((b * w).sum(), c2)
        assert a.abs().sum() > 0 and torch.equal(a, b) and torch.equal(ga, gb)
    with pytest.raises(RenderError, match="colors must be"):
        staged(torch.zeros(n, 4))


def test_compositing_weights_are_the_raster_s_weights_bit_for_bit():
    """Each Gaussian's entries are exactly the render of that Gaussian alone in colour 1 (the
    others 0, black background: the render's column of A); apply, adjoint and the solve's
    residual step are render(colors=), splat_sums and A^T (A x - t) to float rounding; above
    the limit there are none."""
    from splatpainter.assets import GaussianAsset
    from splatpainter.camera import Camera
    from splatpainter.render import compositing_weights, splat_sums

    asset = GaussianAsset(**mixed_scene(seed=5, sh_degree=1))
    cam = Camera(width=W, height=H, fx=70.0, fy=66.0, cx=32.0, cy=24.0, world_to_cam=_w2c())
    n = asset.num_gaussians
    a = compositing_weights(asset, cam)
    assert a is not None and a.pixel.numel() > n
    pairs = a.pixel * n + a.gaussian
    assert torch.unique(pairs).numel() == pairs.numel()  # one entry per (pixel, Gaussian)
    drawn = 0
    for g in range(n):
        one = torch.zeros(n, 3)
        one[g, 0] = 1.0
        column = render(asset, cam, colors=one, background=torch.zeros(3)).rgb[..., 0]
        mine = torch.zeros(H * W)
        at = a.gaussian == g
        mine[a.pixel[at]] = a.weight[at]
        assert torch.equal(mine.view(H, W), column), g
        drawn += int(bool(at.any()))
    assert drawn > n // 2
    gen = torch.Generator().manual_seed(1)
    c = torch.rand(n, 3, generator=gen)
    t = torch.rand(H, W, 3, generator=gen)
    rgb = render(asset, cam, colors=c, background=torch.zeros(3)).rgb
    torch.testing.assert_close(a.apply(c), rgb, rtol=0, atol=1e-6)
    torch.testing.assert_close(a.adjoint(t), splat_sums(asset, cam, t), rtol=1e-5, atol=1e-6)
    step = a.residual_step(t)
    torch.testing.assert_close(step(c), a.adjoint(a.apply(c) - t), rtol=1e-5, atol=1e-6)
    keep = torch.arange(n) % 3 == 0
    index = torch.where(keep, torch.cumsum(keep, 0) - 1, -1)
    sub = a.remapped(index, int(keep.sum()))
    torch.testing.assert_close(sub.adjoint(t), a.adjoint(t)[keep], rtol=0, atol=0)
    assert compositing_weights(asset, cam, limit=a.pixel.numel() - 1) is None
    assert compositing_weights(asset, cam, limit=a.pixel.numel()) is not None


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"means": torch.zeros(5, 2)}, "means"),
        ({"quats": torch.zeros(4, 4)}, "quats"),
        ({"sh": torch.zeros(5, 5, 3)}, "coefficients"),
        ({"K": torch.eye(4)}, "K must be"),
        ({"K": torch.zeros(3, 3)}, "focal"),
        ({"width": 0}, "width"),
        ({"height": 2.5}, "height"),
        ({"backend": "cuda-magic"}, "backend"),
        ({"sh_degree": 2}, "sh_degree"),
        ({"background": (0.0, 0.0)}, "background"),
        ({"world_to_cam": torch.eye(3)}, "world_to_cam"),
        (
            {"log_scales": torch.tensor([[0.0] * 3] * 3 + [[0.0, float("nan"), 0.0]] * 2)},
            "Gaussian 3",
        ),
    ],
)
def test_invalid_input_raises_clear_error(change, match):
    args = {
        "means": torch.zeros(5, 3),
        "quats": torch.ones(5, 4),
        "log_scales": torch.zeros(5, 3),
        "opacity_logits": torch.zeros(5),
        "sh": torch.zeros(5, 4, 3),
        "world_to_cam": torch.eye(4),
        "K": K,
        "width": W,
        "height": H,
    }
    args.update(change)
    with pytest.raises(RenderError, match=match):
        rasterize(**args)


@pytest.mark.skipif(gsplat_available(), reason="checks the error on machines without gsplat")
def test_gsplat_backend_unavailable_is_a_clear_error():
    scene = mixed_scene()
    with pytest.raises(RenderError, match="gsplat"):
        _render(scene, "gsplat")


@pytest.mark.skipif(not gsplat_available(), reason="needs CUDA and gsplat")
@pytest.mark.parametrize("mode", ["classic", "antialiased"])
def test_gsplat_matches_reference_on_cuda(mode):
    """gsplat follows the same rules except the ones ``gsplat_backend`` documents; the test
    tolerates exactly those: the alpha clamp (0.999 in gsplat, 0.99 here) and float32."""
    from splatpainter.render.project import project_gaussians
    from splatpainter.render.reference import rasterize_reference

    scene = {k: v.cuda() for k, v in mixed_scene().items()}
    scene["log_scales"][0] = torch.tensor([40.0, -2.0, -2.0])  # overflow guard: culled by all
    w2c, k = _w2c().cuda(), K.cuda()
    out_g, _ = _render(scene, "gsplat", w2c=w2c, rasterize_mode=mode)
    out_r, _ = _render(scene, "reference", w2c=w2c, rasterize_mode=mode)
    assert int(out_g.radii[0]) == 0 and torch.equal(out_g.radii > 0, out_r.radii > 0)
    assert (out_g.radii_xy - out_r.radii_xy).abs().max() <= 1  # ceil of float32 sums
    # the reference with gsplat's clamp: the same image up to float32 rounding
    s = {n: v.detach() for n, v in scene.items()}
    op = torch.sigmoid(s["opacity_logits"])
    proj = project_gaussians(s["means"], s["quats"], s["log_scales"], w2c, k, W, H, opacities=op,
                             antialiased=mode == "antialiased")  # fmt: skip
    if proj.compensations is not None:
        op = op * proj.compensations
    from splatpainter.render.project import sh_to_color

    colors = sh_to_color(s["means"], s["sh"], w2c, 3)
    rgb999, alpha999, _ = rasterize_reference(
        proj.means2d, proj.conics, colors, op, proj.depths, proj.extents, W, H,
        torch.zeros(3, device="cuda"), alpha_max=0.999,
    )  # fmt: skip
    assert (out_g.rgb - rgb999).abs().max() < 1e-4
    assert (out_g.alpha - alpha999).abs().max() < 1e-4
    # and with ours (0.99): differences only at pixels where some raw alpha exceeds 0.99
    diff = (out_g.rgb - out_r.rgb).abs().amax(dim=-1) > 1e-4
    ys, xs = torch.meshgrid(
        torch.arange(H, device="cuda") + 0.5, torch.arange(W, device="cuda") + 0.5, indexing="ij"
    )
    vis = proj.radii > 0
    d = proj.means2d[vis][:, None, None] - torch.stack([xs, ys], -1)[None]
    c = proj.conics[vis][:, None, None]
    power = -0.5 * (c[..., 0] * d[..., 0] ** 2 + c[..., 2] * d[..., 1] ** 2)
    power = power - c[..., 1] * d[..., 0] * d[..., 1]
    clamped = ((op[vis][:, None, None] * torch.exp(power)) > 0.99).any(dim=0)
    assert diff.any() and not (diff & ~clamped).any()


def test_procedural_asset_orbit_render_is_nontrivial_and_deterministic():
    from splatpainter.assets.procedural import make_demo_asset
    from splatpainter.camera import orbit_cameras

    asset = make_demo_asset(3000, seed=1, sh_degree=1).asset
    cams = orbit_cameras(asset, 3, width=56, height=40)
    for cam in cams:
        a = render(asset, cam, background=(1.0, 1.0, 1.0))
        b = render(asset, cam, background=(1.0, 1.0, 1.0))
        assert torch.equal(a.rgb, b.rgb) and torch.equal(a.depth, b.depth)
        covered = a.alpha > 0.5
        assert 0.1 < float(covered.float().mean()) < 0.95
        assert float(a.rgb[covered].std(dim=0).mean()) > 0.05  # textured, not flat
        d = a.depth[covered]
        dist = float(torch.linalg.norm(cam.camera_center()))
        assert float(d.min()) > 0.2 * dist and float(d.max()) < 2.0 * dist
        ref = render(asset.to(torch.float64), cam, background=(1.0, 1.0, 1.0), backend="reference")
        assert (a.rgb.double() - ref.rgb).abs().max() <= 1e-4


def _occluded_scene(seed: int) -> dict[str, torch.Tensor]:
    """mixed_scene's hard cases behind and among ~3,000 more Gaussians: near-opaque sheets
    with holes in front, translucent layers, elongated and sub-pixel splats, exact depth ties
    (copies of one Gaussian) and background pixels nothing ends."""
    g = torch.Generator().manual_seed(seed)
    base = mixed_scene(seed, sh_degree=1)
    n = 3000
    means = (torch.rand(n, 3, generator=g) - 0.5) * torch.tensor([3.2, 2.4, 2.0])
    means[:1000, 2] = -0.9 + 0.02 * torch.randn(1000, generator=g)  # a sheet in front
    means[:1000, 0] *= 0.6  # ... leaving the sides open
    log_scales = torch.rand(n, 3, generator=g) * -2.5 - 2.0
    log_scales[:1000, :2] = -1.6  # broad enough to close the sheet
    log_scales[1000:1200, 0] = -0.5  # elongated
    logits = torch.randn(n, generator=g) * 2 + 1.5
    logits[:1000] = 4.0
    quats = torch.randn(n, 4, generator=g)
    means[2900:] = means[2800:2900]  # exact copies: equal depths, the index decides
    quats[2900:], log_scales[2900:] = quats[2800:2900], log_scales[2800:2900]
    sh = torch.randn(n, 4, 3, generator=g) * 0.4
    extra = {"means": means, "quats": quats, "log_scales": log_scales,
             "opacity_logits": logits, "sh": sh}  # fmt: skip
    return {k: torch.cat([base[k], extra[k]]) for k in NAMES}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("sample_per_pixel", [0.05, 0.3, 2.0])
def test_occlusion_cull_changes_no_bit(monkeypatch, seed, sample_per_pixel):
    """The passes without gradients drop the Gaussians no pixel's compositing reaches before
    binning (`numba_backend._front_bins`); weights, sums, the preprocessing render and the
    compositing entries are those of the plain pass bit for bit, whatever the occluder
    sample's density, and the cull does drop Gaussians."""
    from splatpainter.assets import GaussianAsset
    from splatpainter.camera import Camera
    from splatpainter.render import compositing_weights, numba_backend, splat_sums
    from splatpainter.render.api import _numba_projection, render_and_weights

    asset = GaussianAsset(**_occluded_scene(seed))
    cam = Camera(width=W, height=H, fx=70.0, fy=66.0, cx=32.0, cy=24.0, world_to_cam=_w2c())
    t = torch.rand(H, W, 4, generator=torch.Generator().manual_seed(seed))

    def passes():
        (out, w), s = render_and_weights(asset, cam), splat_sums(asset, cam, t)
        e = compositing_weights(asset, cam)
        return [out.rgb, out.alpha, out.depth, w, s, e.pixel, e.gaussian, e.weight]

    monkeypatch.setattr(numba_backend, "CULL_MIN_PER_PIXEL", 10**9)
    plain = passes()
    monkeypatch.setattr(numba_backend, "CULL_MIN_PER_PIXEL", 1)
    monkeypatch.setattr(numba_backend, "CULL_SAMPLE_PER_PIXEL", sample_per_pixel)
    culled = passes()
    for a, b in zip(plain, culled, strict=True):
        assert torch.equal(a, b)
    assert plain[3].count_nonzero() > 100  # weights: much is drawn ...
    proj, op = _numba_projection(asset, cam)
    z = np.zeros((asset.num_gaussians, 3), np.float32)
    args = (proj.means2d, proj.conics, z, op, proj.depths, proj.extents, W, H)
    plain_hit = numba_backend._bins_and_rows(*args)[2]
    front_hit = numba_backend._bins_and_rows(*args, cull=True)[2]
    assert np.isin(front_hit, plain_hit).all()
    if sample_per_pixel >= 0.3:
        assert len(front_hit) < 0.7 * len(plain_hit)  # ... and much is dropped
