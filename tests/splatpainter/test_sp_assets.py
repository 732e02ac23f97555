"""GaussianAsset: validation, tensor plumbing and geometric transforms."""

import dataclasses
import math

import pytest
import torch

from splatpainter.assets import (
    AssetError,
    GaussianAsset,
    convert_axes,
    normalize_to_unit_cube,
    quat_to_rotmat,
    rotmat_to_quat,
    transform_asset,
    up_axis_rotation,
)


def random_asset(n: int = 50, degree: int = 3, seed: int = 0, features: int = 0) -> GaussianAsset:
    g = torch.Generator().manual_seed(seed)
    k = (degree + 1) ** 2
    return GaussianAsset(
        means=torch.randn(n, 3, generator=g),
        quats=torch.randn(n, 4, generator=g),
        log_scales=torch.randn(n, 3, generator=g) * 0.5 - 3,
        opacity_logits=torch.randn(n, generator=g),
        sh=torch.randn(n, k, 3, generator=g) * 0.3,
        features=torch.randn(n, features, generator=g) if features else None,
    )


def random_dirs(n: int, seed: int = 1) -> torch.Tensor:
    d = torch.randn(n, 3, generator=torch.Generator().manual_seed(seed))
    return d / d.norm(dim=1, keepdim=True)


def test_basic_properties():
    a = random_asset(10, degree=2, features=4)
    assert len(a) == a.num_gaussians == 10
    assert a.sh_degree == 2
    assert a.validate() is a
    b = a.clone()
    b.means[0, 0] = 123.0
    assert a.means[0, 0] != 123.0
    d = a.to(torch.float64)
    assert d.dtype == torch.float64 and d.features.dtype == torch.float64
    assert a.subset(torch.tensor([1, 3])).num_gaussians == 2
    assert a.with_sh_degree(0).sh.shape == (10, 1, 3)
    padded = a.with_sh_degree(3)
    assert padded.sh.shape == (10, 16, 3) and torch.equal(padded.sh[:, :9], a.sh)
    cat = GaussianAsset.concat([a, random_asset(5, degree=0, features=4)])
    assert cat.num_gaussians == 15 and cat.sh_degree == 2 and cat.features.shape == (15, 4)


def test_from_colors_reproduces_colour():
    rgb = torch.rand(20, 3)
    a = GaussianAsset.from_colors(torch.randn(20, 3), rgb, scales=0.02, opacities=0.7)
    a.validate()
    assert torch.allclose(a.base_colors(), rgb, atol=1e-6)
    assert torch.allclose(a.opacities(), torch.full((20,), 0.7), atol=1e-6)
    assert torch.allclose(a.scales(), torch.full((20, 3), 0.02), atol=1e-7)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("means", torch.zeros(10, 2), r"means: expected shape \[10, 3\]"),
        ("quats", torch.zeros(9, 4), r"quats: expected shape"),
        ("log_scales", torch.zeros(10, 3, dtype=torch.int64), "floating-point"),
        ("opacity_logits", torch.zeros(10, 1), "opacity_logits"),
        ("sh", torch.zeros(10, 5, 3), "5 coefficients"),
        ("sh", torch.zeros(10, 4, 2), r"sh: expected shape"),
        ("features", torch.zeros(9, 2), "features"),
        ("means", torch.zeros(10, 3, dtype=torch.float64), "mixed dtypes"),
    ],
)
def test_validate_shapes_and_dtypes(field, value, match):
    a = random_asset(10, degree=1).replace(**{field: value})
    with pytest.raises(AssetError, match=match):
        a.validate()


@pytest.mark.parametrize("field", ["means", "quats", "log_scales", "opacity_logits", "sh"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_validate_names_first_nonfinite_gaussian(field, bad):
    a = random_asset(10, degree=1)
    t = getattr(a, field)
    t.view(10, -1)[7, 0] = bad
    t.view(10, -1)[9, 0] = bad
    with pytest.raises(AssetError, match=rf"{field}: non-finite value at Gaussian 7"):
        a.validate()
    assert isinstance(AssetError("x"), ValueError)


def test_validate_zero_quaternion():
    a = random_asset(5, degree=0)
    a.quats[3] = 0
    with pytest.raises(AssetError, match="zero-length quaternion at Gaussian 3"):
        a.validate()


def test_quaternion_matrix_round_trip():
    q = torch.randn(500, 4, dtype=torch.float64)
    q = q / q.norm(dim=1, keepdim=True)
    q = torch.where(q[:, :1] < 0, -q, q)
    r = quat_to_rotmat(q)
    assert torch.allclose(r @ r.transpose(1, 2), torch.eye(3, dtype=q.dtype).expand(500, 3, 3))
    assert torch.allclose(torch.linalg.det(r), torch.ones(500, dtype=q.dtype))
    assert torch.allclose(rotmat_to_quat(r), q, atol=1e-10)
    # 180-degree rotations (w = 0) are the hard case for naive conversions
    flip = torch.diag(torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64))
    assert torch.allclose(quat_to_rotmat(rotmat_to_quat(flip)), flip, atol=1e-12)


def test_up_axis_rotation():
    r = up_axis_rotation("+y", "+z")
    assert torch.allclose(
        r @ torch.tensor([0.0, 1.0, 0.0], dtype=r.dtype), torch.tensor([0.0, 0, 1], dtype=r.dtype)
    )
    assert torch.allclose(torch.linalg.det(r), torch.tensor(1.0, dtype=r.dtype))
    r2 = up_axis_rotation("z", "-z")
    assert torch.allclose(
        r2 @ torch.tensor([0.0, 0, 1], dtype=r2.dtype), torch.tensor([0.0, 0, -1], dtype=r2.dtype)
    )
    with pytest.raises(AssetError, match="unknown axis"):
        up_axis_rotation("+w", "+z")


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
@pytest.mark.parametrize("mirror", [False, True])
def test_transform_is_consistent(degree, mirror):
    """Rotating the asset rotates positions, covariances and view-dependent colour together."""
    a = random_asset(40, degree=degree).to(torch.float64)
    r = up_axis_rotation("+y", "+z") @ torch.tensor(
        [[0.6, -0.8, 0.0], [0.8, 0.6, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64
    )
    if mirror:
        r = r @ torch.diag(torch.tensor([-1.0, 1.0, 1.0], dtype=torch.float64))
    t = torch.tensor([0.3, -1.0, 2.0], dtype=torch.float64)
    b = transform_asset(a, r, 2.5, t)
    b.validate()
    assert torch.allclose(b.means, 2.5 * a.means @ r.T + t)
    assert torch.allclose(b.covariances(), 6.25 * r @ a.covariances() @ r.T, atol=1e-9)
    d = random_dirs(40).double()
    # colour of the new asset seen along R d equals that of the old one along d
    assert torch.allclose(b.colors(d @ r.T), a.colors(d), atol=1e-9)


def test_convert_axes_and_drop_flag():
    a = random_asset(30, degree=3)
    b = convert_axes(a, "+y", "+z")
    assert b.sh_degree == 3
    assert torch.allclose(b.means[:, 2], a.means[:, 1])
    c = convert_axes(a, "+y", "+z", drop_higher_sh=True)
    assert c.sh_degree == 0 and torch.equal(c.sh[:, 0], a.sh[:, 0])
    back = convert_axes(b, "+z", "+y")
    assert torch.allclose(back.means, a.means, atol=1e-6)
    assert torch.allclose(back.sh, a.sh, atol=1e-5)


def test_normalize_to_unit_cube():
    a = random_asset(100, degree=1)
    a.means.mul_(torch.tensor([5.0, 2.0, 1.0])).add_(torch.tensor([10.0, -3.0, 7.0]))
    b, tf = normalize_to_unit_cube(a)
    lo, hi = b.bounds()
    assert torch.allclose((lo + hi) / 2, torch.zeros(3), atol=1e-5)
    assert float((hi - lo).max()) == pytest.approx(1.0, abs=1e-5)
    assert torch.allclose(tf.apply_points(a.means.double()).float(), b.means, atol=1e-5)
    assert torch.allclose(tf.inverse().apply_points(b.means.double()).float(), a.means, atol=1e-4)
    assert torch.allclose(
        b.log_scales - a.log_scales, torch.full_like(a.log_scales, math.log(tf.scale))
    )
    assert torch.equal(b.sh, a.sh)  # no rotation: appearance untouched


def test_transform_rejects_bad_input():
    a = random_asset(5)
    with pytest.raises(AssetError, match="orthogonal"):
        transform_asset(a, torch.ones(3, 3))
    with pytest.raises(AssetError, match="scale"):
        transform_asset(a, None, -1.0)
    with pytest.raises(AssetError, match="empty"):
        GaussianAsset.empty().bounds()


def test_axis_conversion_renders_identically_from_the_moved_camera():
    """Converting Y-up -> Z-up and moving the camera with it leaves the image unchanged."""
    from splatpainter.camera import Camera, look_at
    from splatpainter.render import render

    g = torch.Generator().manual_seed(3)
    a = random_asset(30, degree=3, seed=3)
    a = a.replace(
        means=torch.randn(30, 3, generator=g) * 0.3,
        log_scales=torch.randn(30, 3, generator=g) * 0.4 - 2.5,
    )
    cam = Camera.from_fov(24, 20, 50.0, look_at((0.4, 0.3, 2.0), (0, 0, 0), (0, 1, 0)))
    r = up_axis_rotation("+y", "+z").float()
    moved = torch.eye(4)
    moved[:3, :3] = r.T  # world_to_cam' = world_to_cam @ [R^T 0; 0 1]
    cam2 = dataclasses.replace(cam, world_to_cam=cam.world_to_cam @ moved)
    before = render(a, cam, backend="reference")
    after = render(convert_axes(a, "+y", "+z"), cam2, backend="reference")
    assert float(before.alpha.mean()) > 0.05
    assert torch.allclose(before.rgb, after.rgb, atol=1e-4)
    assert torch.allclose(before.alpha, after.alpha, atol=1e-4)
