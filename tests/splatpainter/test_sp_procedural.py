"""Procedural assets: surface sampling, flattened Gaussians, textures, determinism, demo file."""

import math

import pytest
import torch

from splatpainter.assets import AssetError, Primitive, Texture, build_asset, quat_to_rotmat
from splatpainter.assets.demo import DEMO_NUM_GAUSSIANS, demo_ply_path, load_demo_asset
from splatpainter.assets.procedural import (
    area_proportional_counts,
    box,
    cone,
    cylinder,
    disc,
    make_demo_asset,
    plane,
    random_procedural_asset,
    rotation_from_euler,
    sphere,
    torus,
)


def check_surface_gaussians(pa, n):
    a = pa.asset
    a.validate()
    assert a.num_gaussians == n == len(pa)
    assert torch.equal(pa.points, a.means)
    assert torch.allclose(pa.normals.norm(dim=1), torch.ones(n), atol=1e-5)
    # flattened along the normal: the smallest scale is the local z axis, which is the normal
    s = a.scales()
    assert bool((s[:, 2] < 0.2 * s[:, :2].min(dim=1).values).all())
    r = quat_to_rotmat(a.quats)
    assert torch.allclose(r[:, :, 2], pa.normals, atol=1e-4)
    assert bool(((pa.uv >= 0) & (pa.uv <= 1)).all())
    colors = a.base_colors()
    assert bool(((colors >= 0) & (colors <= 1 + 1e-5)).all())


@pytest.mark.parametrize("n", [1000, 30000])
def test_random_assets_are_valid_and_seeded(n):
    pa = random_procedural_asset(7, n)
    check_surface_gaussians(pa, n)
    again = random_procedural_asset(7, n)
    for name, t in pa.asset.tensors().items():
        assert torch.equal(t, again.asset.tensors()[name]), name
    assert torch.equal(pa.primitive_id, again.primitive_id)
    other = random_procedural_asset(8, n)
    assert not torch.equal(other.asset.means, pa.asset.means)


def test_points_lie_on_their_surfaces_with_outward_normals():
    rot = rotation_from_euler(30, -20, 75)
    centre = torch.tensor([0.1, -0.2, 0.05])
    prims = [
        sphere(0.3, tuple(centre.tolist())),
        torus(0.3, 0.08, tuple(centre.tolist()), rotation=rot),
        box((0.2, 0.3, 0.4), tuple(centre.tolist()), rotation=rot),
        cylinder(0.1, 0.5, tuple(centre.tolist()), rotation=rot),
        cone(0.15, 0.3, tuple(centre.tolist()), rotation=rot),
        disc(0.2, tuple(centre.tolist()), rotation=rot),
        plane((0.4, 0.2), tuple(centre.tolist()), rotation=rot),
    ]
    for i, prim in enumerate(prims):
        pa = build_asset([prim], 3000, seed=i)
        check_surface_gaussians(pa, 3000)
        local = ((pa.points - centre) @ rot.float()).double()  # world -> local (R^T p)
        n_local = (pa.normals @ rot.float()).double()
        if prim.kind == "sphere":
            local = (pa.points - centre).double()
            assert torch.allclose(
                local.norm(dim=1), torch.full((3000,), 0.3, dtype=torch.float64), atol=1e-5
            )
            assert bool(((local / 0.3 * pa.normals.double()).sum(1) > 0.999).all())
        elif prim.kind == "torus":
            ring = torch.sqrt(local[:, 0] ** 2 + local[:, 1] ** 2) - 0.3
            assert torch.allclose(
                ring**2 + local[:, 2] ** 2,
                torch.full((3000,), 0.08**2, dtype=torch.float64),
                atol=1e-5,
            )
        elif prim.kind == "box":
            half = torch.tensor([0.1, 0.15, 0.2], dtype=torch.float64)
            on_face = ((local.abs() - half).abs() < 1e-5).any(dim=1)
            assert bool(on_face.all()) and bool((local.abs() <= half + 1e-5).all())
            # normals point away from the centre
            assert bool(((local * n_local).sum(1) > 0).all())
        elif prim.kind in ("cylinder", "cone"):
            assert bool((local[:, 2].abs() <= 0.5 * prim.dims[1] + 1e-5).all())
            assert bool(((local * n_local).sum(1) > -1e-6).all())
        else:
            assert torch.allclose(local[:, 2], torch.zeros(3000, dtype=torch.float64), atol=1e-5)
            assert torch.allclose(n_local[:, 2], torch.ones(3000, dtype=torch.float64), atol=1e-5)


def test_area_proportional_sampling():
    assert area_proportional_counts([1.0, 1.0, 2.0], 10) == [3, 2, 5]
    counts = area_proportional_counts([0.3, 0.5, 0.2], 1001)
    assert sum(counts) == 1001 and all(
        abs(c - 1001 * a) <= 1 for c, a in zip(counts, [0.3, 0.5, 0.2], strict=True)
    )
    big, small = sphere(0.4), sphere(0.1, (1.0, 0.0, 0.0))
    pa = build_asset([big, small], 1700)
    assert pa.primitive_id.bincount().tolist() == [1600, 100]  # areas 16 : 1
    # uniform density on the sphere: each octant gets about 1/8
    pa = build_asset([sphere(0.5)], 80000, seed=3)
    octant = ((pa.points > 0).long() * torch.tensor([1, 2, 4])).sum(1)
    frac = octant.bincount(minlength=8).double() / 80000
    assert torch.allclose(frac, torch.full((8,), 0.125, dtype=torch.float64), atol=0.01)
    # torus: the outer half carries more area; its share is (R + 2r/π) / 2R
    pa = build_asset([torus(0.3, 0.1)], 40000, seed=1)
    rho = pa.points[:, :2].norm(dim=1)
    outer = float((rho > 0.3).double().mean())
    expect = (0.3 + 0.1 * 2 / math.pi) / (2 * 0.3)
    assert outer == pytest.approx(expect, abs=0.01)


def test_textures():
    uv = torch.tensor([[0.05, 0.05], [0.15, 0.05], [0.05, 0.15], [0.15, 0.15]], dtype=torch.float64)
    local = torch.zeros(4, 3, dtype=torch.float64)
    a, b = (1.0, 0.0, 0.0), (0.0, 0.0, 1.0)
    checker = Texture("checker", a, b, frequency=10).sample(uv, local)
    assert checker.tolist() == [list(a), list(b), list(b), list(a)]
    stripes = Texture("stripes", a, b, frequency=10, axis=0).sample(uv, local)
    assert stripes.tolist() == [list(a), list(b), list(a), list(b)]
    grad = Texture("gradient", a, b, axis=1).sample(uv, local)
    assert torch.allclose(grad[:, 2], uv[:, 1])
    pts = torch.rand(2000, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    noise = Texture("noise", a, b, frequency=4, space="object", seed=5)
    n1 = noise.sample(uv[:1].expand(2000, 2), pts)
    assert torch.equal(n1, noise.sample(uv[:1].expand(2000, 2), pts))  # deterministic
    assert float(n1[:, 2].std()) > 0.05  # actually varies
    near = noise.sample(uv[:1].expand(2000, 2), pts + 1e-4)
    assert float((near - n1).abs().max()) < 0.01  # and is smooth
    other_seed = Texture("noise", a, b, frequency=4, space="object", seed=6).sample(
        uv[:1].expand(2000, 2), pts
    )
    assert not torch.equal(other_seed, n1)
    with pytest.raises(AssetError, match="texture kind"):
        Texture("marble")


def test_primitive_validation():
    with pytest.raises(AssetError, match="unknown"):
        Primitive("blob", (1.0,))
    with pytest.raises(AssetError, match="positive dims"):
        Primitive("box", (1.0, -1.0, 1.0))
    with pytest.raises(AssetError, match="minor radius"):
        torus(0.1, 0.2)
    with pytest.raises(AssetError, match="rotation"):
        build_asset([box((1, 1, 1), rotation=torch.ones(3, 3))], 10)
    with pytest.raises(AssetError, match="at least one"):
        build_asset([], 10)


def test_sh_degree_and_large_counts():
    pa = make_demo_asset(2000, sh_degree=2)
    assert pa.asset.sh_degree == 2 and bool((pa.asset.sh[:, 1:] == 0).all())
    big = make_demo_asset(200_000, seed=1)
    assert big.asset.num_gaussians == 200_000
    # denser sampling -> smaller splats
    assert float(big.asset.scales().max()) < float(pa.asset.scales().max())


def test_shipped_demo_asset():
    path = demo_ply_path()
    assert path.is_file() and path.stat().st_size < 2_000_000
    a = load_demo_asset()
    assert a.num_gaussians == DEMO_NUM_GAUSSIANS and a.sh_degree == 0
    lo, hi = a.bounds()
    assert bool((lo >= -0.5).all() and (hi <= 0.5).all())
    fresh = make_demo_asset(DEMO_NUM_GAUSSIANS).asset
    # the file is the recipe's output (same scene; bit-exact on the torch that wrote it)
    assert torch.allclose(fresh.bounds()[0], lo, atol=0.02)
    assert torch.allclose(fresh.base_colors().mean(0), a.base_colors().mean(0), atol=0.02)
