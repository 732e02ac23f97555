"""Renderer maths pinned to outside references, not to the project's own reference backend.

- SH constants and signs: the published INRIA 3DGS / gsplat values, and their closed forms.
- Compositing: single and overlapping Gaussians computed analytically here, the 0.99 clamp,
  the 1/255 cut-off.
- A committed fixture image rendered by an independent implementation written from the
  specification (``data/make_render_fixture.py``, no splatpainter import).
- The maths' constants reach the compiled (numba) kernels as arguments, so editing one takes
  effect there at once (numba would freeze imported globals into its on-disk cache).
"""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from splatpainter.assets import gaussians
from splatpainter.render import project, rasterize

DATA = Path(__file__).parent / "data"
BACKENDS = ("numba", "reference")

# INRIA gaussian-splatting utils/sh_utils.py (and gsplat's spherical-harmonics kernel).
INRIA_C0 = 0.28209479177387814
INRIA_C1 = 0.4886025119029199
INRIA_C2 = [
    1.0925484305920792,
    -1.0925484305920792,
    0.31539156525252005,
    -1.0925484305920792,
    0.5462742152960396,
]
INRIA_C3 = [
    -0.5900435899266435,
    2.890611442640554,
    -0.4570457994644658,
    0.3731763325901154,
    -0.4570457994644658,
    1.445305721320277,
    -0.5900435899266435,
]


def test_sh_constants_are_the_published_values():
    assert gaussians.SH_C0 == INRIA_C0
    assert gaussians.SH_C1 == INRIA_C1
    assert list(gaussians.SH_C2) == INRIA_C2
    assert list(gaussians.SH_C3) == INRIA_C3
    # and the published values are the real-SH normalisations (with INRIA's signs)
    pi = math.pi
    closed = [
        1 / (2 * math.sqrt(pi)),
        math.sqrt(3 / (4 * pi)),
        math.sqrt(15 / pi) / 2,
        -math.sqrt(15 / pi) / 2,
        math.sqrt(5 / pi) / 4,
        -math.sqrt(15 / pi) / 2,
        math.sqrt(15 / pi) / 4,
        -math.sqrt(35 / (2 * pi)) / 4,
        math.sqrt(105 / pi) / 2,
        -math.sqrt(21 / (2 * pi)) / 4,
        math.sqrt(7 / pi) / 4,
        -math.sqrt(21 / (2 * pi)) / 4,
        math.sqrt(105 / pi) / 4,
        -math.sqrt(35 / (2 * pi)) / 4,
    ]
    got = [INRIA_C0, INRIA_C1, *INRIA_C2, *INRIA_C3]
    assert np.allclose(got, closed, rtol=1e-15, atol=0)


def _inria_eval_sh(sh: np.ndarray, d: np.ndarray) -> np.ndarray:
    """INRIA's eval_sh for degree 3, written out: sh [16, 3], unit direction d [3]."""
    x, y, z = d
    xx, yy, zz = x * x, y * y, z * z
    c2, c3 = INRIA_C2, INRIA_C3
    r = INRIA_C0 * sh[0]
    r = r - INRIA_C1 * y * sh[1] + INRIA_C1 * z * sh[2] - INRIA_C1 * x * sh[3]
    r = r + c2[0] * x * y * sh[4] + c2[1] * y * z * sh[5] + c2[2] * (2 * zz - xx - yy) * sh[6]
    r = r + c2[3] * x * z * sh[7] + c2[4] * (xx - yy) * sh[8]
    r = r + c3[0] * y * (3 * xx - yy) * sh[9] + c3[1] * x * y * z * sh[10]
    r = r + c3[2] * y * (4 * zz - xx - yy) * sh[11]
    r = r + c3[3] * z * (2 * zz - 3 * xx - 3 * yy) * sh[12]
    r = r + c3[4] * x * (4 * zz - xx - yy) * sh[13] + c3[5] * z * (xx - yy) * sh[14]
    return r + c3[6] * x * (xx - 3 * yy) * sh[15]


@pytest.mark.parametrize("backend", BACKENDS)
def test_rendered_sh_colour_is_inria_eval_sh(backend):
    """One small opaque Gaussian per view direction; its centre pixel shows its SH colour."""
    rng = np.random.default_rng(0)
    sh = rng.normal(size=(16, 3)) * 0.25
    sh[0] = 0.3
    for mean in ([0.31, -0.22, 2.0], [-0.4, 0.35, 1.5], [0.05, 0.5, 3.0]):
        m = np.array(mean)
        k = np.array([[40.0, 0, 20.0], [0, 40.0, 20.0], [0, 0, 1]])
        u, v = k[0, 0] * m[0] / m[2] + k[0, 2], k[1, 1] * m[1] / m[2] + k[1, 2]
        px, py = int(u), int(v)
        k[0, 2] += px + 0.5 - u  # put the mean exactly on a pixel centre
        k[1, 2] += py + 0.5 - v
        d = m / np.linalg.norm(m)  # camera at the origin
        want = np.maximum(0.5 + _inria_eval_sh(sh, d), 0.0)
        out = rasterize(
            torch.tensor([mean], dtype=torch.float64),
            torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64),
            torch.full((1, 3), -4.0, dtype=torch.float64),
            torch.tensor([20.0], dtype=torch.float64),  # opacity ~1: alpha clamps at 0.99
            torch.tensor(sh[None], dtype=torch.float64),
            torch.eye(4, dtype=torch.float64),
            torch.tensor(k),
            40,
            40,
            backend=backend,
        )
        got = out.rgb[py, px].numpy()
        assert np.allclose(got, 0.99 * want, atol=2e-6), (backend, got, 0.99 * want)


def _axis_scene(zs, sigmas, opacities, colors, f=50.0, size=(41, 33), c=(20.3, 16.1)):
    """Isotropic Gaussians on the optical axis: their 2D covariance is exactly
    ((f sigma / z)^2 + 0.3) I, centred on the principal point."""
    n = len(zs)
    means = torch.tensor([[0.0, 0.0, z] for z in zs], dtype=torch.float64)
    log_scales = torch.log(torch.tensor(sigmas, dtype=torch.float64))[:, None].repeat(1, 3)
    op = torch.tensor(opacities, dtype=torch.float64)
    K = torch.tensor([[f, 0, c[0]], [0, f, c[1]], [0, 0, 1]], dtype=torch.float64)
    args = (
        means,
        torch.tensor([[1.0, 0.0, 0.0, 0.0]] * n, dtype=torch.float64),
        log_scales,
        torch.logit(op),
        None,
        torch.eye(4, dtype=torch.float64),
        K,
        *size,
    )
    ys, xs = torch.meshgrid(
        torch.arange(size[1], dtype=torch.float64) + 0.5,
        torch.arange(size[0], dtype=torch.float64) + 0.5,
        indexing="ij",
    )
    r2 = (xs - c[0]) ** 2 + (ys - c[1]) ** 2
    raw = [
        o * torch.exp(-0.5 * r2 / ((f * s / z) ** 2 + 0.3))
        for z, s, o in zip(zs, sigmas, opacities, strict=True)
    ]
    return args, torch.tensor(colors, dtype=torch.float64), raw


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_gaussian_closed_form_with_clamp_and_cutoff(backend):
    args, col, (raw,) = _axis_scene([2.0], [0.06], [0.997], [[0.9, 0.4, 0.1]], c=(20.5, 16.5))
    bg = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    out = rasterize(*args, background=bg, colors=col, backend=backend)
    alpha = torch.where(raw >= 1 / 255, raw.clamp_max(0.99), torch.zeros_like(raw))
    near_cut = (raw - 1 / 255).abs() < 1e-5  # float32 kernels: leave the exact edge alone
    assert raw.max() > 0.99 and (raw < 1 / 255).any()  # the clamp and the cut-off both bite
    assert float(out.alpha.max()) == pytest.approx(0.99, abs=1e-6)
    err = (out.alpha.double() - alpha).abs()[~near_cut]
    assert float(err.max()) < 2e-6
    want = alpha[..., None] * col + (1 - alpha)[..., None] * bg
    assert float((out.rgb.double() - want).abs()[~near_cut].max()) < 2e-6
    assert (out.alpha[raw < (1 / 255) * 0.999] == 0).all()  # below the cut-off: nothing at all


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_overlapping_gaussians_composite_front_to_back(backend):
    # listed back first: the renderer must order by depth, not by index
    args, col, (raw_back, raw_front) = _axis_scene(
        [4.0, 1.5], [0.2, 0.04], [0.8, 0.6], [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    )
    bg = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    out = rasterize(*args, background=bg, colors=col, backend=backend)

    def alpha(raw):
        return torch.where(raw >= 1 / 255, raw.clamp_max(0.99), torch.zeros_like(raw))

    a1, a2 = alpha(raw_front), alpha(raw_back)
    want = (
        a1[..., None] * col[1]
        + ((1 - a1) * a2)[..., None] * col[0]
        + ((1 - a1) * (1 - a2))[..., None] * bg
    )
    edge = ((raw_front - 1 / 255).abs() < 1e-5) | ((raw_back - 1 / 255).abs() < 1e-5)
    assert float((out.rgb.double() - want).abs()[~edge].max()) < 2e-6
    w1, w2 = a1, (1 - a1) * a2
    depth = (w1 * 1.5 + w2 * 4.0) / (w1 + w2)
    drawn = (w1 + w2) > 0
    # depths ~4 composited in float32 by the numba kernels: 5e-5 absolute
    assert float((out.depth.double() - depth).abs()[drawn & ~edge].max()) < 5e-5
    assert float((out.depth_accum.double() - (w1 * 1.5 + w2 * 4.0)).abs()[~edge].max()) < 5e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_fixture_rendered_from_the_specification(backend):
    fx = np.load(DATA / "render_fixture.npz")
    t = {k: torch.from_numpy(fx[k]) for k in fx.files}
    out = rasterize(
        t["means"], t["quats"], t["log_scales"], t["opacity_logits"], t["sh"],
        t["world_to_cam"], t["K"], 48, 40, background=t["background"], backend=backend,
    )  # fmt: skip
    want = t["expected_rgb"]
    assert float(t["expected_alpha"].max()) > 0.99 and float(t["expected_alpha"].min()) < 0.01
    diff = (out.rgb - want).abs().max(dim=-1).values
    # float32 kernels vs the float64 specification: a pixel where some Gaussian's alpha sits
    # right at the 1/255 cut-off may include or skip it (a change below 1/255 * colour)
    assert float((diff > 1e-4).float().mean()) < 0.01, float(diff.max())
    assert float(diff.max()) < 5e-3
    assert float((out.alpha - t["expected_alpha"]).abs().max()) < 5e-3
    drawn = t["expected_alpha"] > 0.5
    assert float((out.depth - t["expected_depth"]).abs()[drawn].max()) < 5e-3


def test_numba_kernels_take_every_constant_as_an_argument():
    """numba caches compiled code keyed on the kernel's own source file: a constant imported
    from elsewhere would stay frozen in that cache when edited. The kernel modules therefore
    import nothing from the package."""
    render_dir = Path(project.__file__).parent
    for name in ("_kernels.py", "_kernels_proj.py", "_kernels_lanes.py"):
        tree = ast.parse((render_dir / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom | ast.Import):
                mods = [node.module] if isinstance(node, ast.ImportFrom) else []
                mods += [a.name for a in node.names] if isinstance(node, ast.Import) else []
                assert not any(m and m.startswith("splatpainter") for m in mods), (name, mods)


def test_edited_constants_take_effect_in_the_compiled_path(monkeypatch):
    """Flip the sign of one degree-2 SH constant and change the alpha clamp: the numba
    render follows at once and still equals the reference render with the same edits."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_sp_render import _render, mixed_scene

    scene = mixed_scene(seed=9, sh_degree=2)
    before, _ = _render(scene, "numba")
    flipped = list(gaussians.SH_C2)
    flipped[2] = -flipped[2]
    monkeypatch.setattr(gaussians, "SH_C2", tuple(flipped))
    monkeypatch.setattr(project, "ALPHA_MAX", 0.999)
    after, _ = _render(scene, "numba")
    ref, _ = _render(scene, "reference", dtype=torch.float64)
    assert float((after.rgb - before.rgb).detach().abs().max()) > 0.05
    assert float((after.rgb.double() - ref.rgb).detach().abs().max()) < 1e-4
    assert float(after.alpha.detach().max()) > 0.995  # the new clamp


def test_compiled_exp_is_within_two_float32_ulp():
    """The compositing kernels evaluate exp inline (vectorisable) instead of calling libm:
    over the whole range alpha can take (power in [-80, 0]) it stays within 2 float32 ulp
    (relative error 2^-23) of the exact value, so it cannot move a result by more than
    float32 rounding does; positive powers count as 0 (never composited anyway)."""
    from splatpainter.render._kernels_lanes import exp_neg_array

    x = np.concatenate([-np.linspace(0.0, 80.0, 400_001), -np.geomspace(1e-30, 1.0, 2_001)])
    x32 = x.astype(np.float32)
    got = exp_neg_array(x32).astype(np.float64)
    want = np.exp(x32.astype(np.float64))
    assert float(np.max(np.abs(got - want) / want)) < 2.0**-23
    assert exp_neg_array(np.array([0.0, 3.0], np.float32)).tolist() == [1.0, 1.0]
