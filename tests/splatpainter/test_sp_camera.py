"""Cameras: conventions, JSON, orbit framing, Plücker rays, INRIA cameras.json."""

import itertools
import json
import math

import pytest
import torch

from splatpainter.assets import GaussianAsset
from splatpainter.camera import (
    Camera,
    CameraError,
    load_camera,
    load_cameras,
    load_inria_cameras,
    look_at,
    orbit_cameras,
    save_camera,
    save_cameras,
)


def make_camera(**kw):
    w2c = look_at((2.0, -3.0, 1.5), (0.1, 0.2, -0.1), (0, 0, 1))
    args = dict(width=64, height=48, fx=50.0, fy=55.0, cx=31.0, cy=25.0, world_to_cam=w2c)
    args.update(kw)
    return Camera(**args)


def test_intrinsics_and_pixel_convention():
    cam = Camera(8, 6, 10.0, 12.0, 4.0, 3.0, torch.eye(4))
    assert torch.equal(cam.K(), torch.tensor([[10.0, 0, 4], [0, 12, 3], [0, 0, 1]]))
    # identity extrinsics: x right, y down, z forward; the principal point is the image centre
    uv, z = cam.project(torch.tensor([[0.0, 0.0, 2.0], [0.2, -0.1, 1.0]]))
    assert torch.allclose(uv, torch.tensor([[4.0, 3.0], [6.0, 1.8]]))
    assert torch.equal(z, torch.tensor([2.0, 1.0]))
    # the ray through pixel (row 0, col 0) passes through its centre (0.5, 0.5)
    origins, dirs = cam.pixel_rays()
    assert dirs.shape == (6, 8, 3)
    uv0, _ = cam.project((origins[0, 0] + dirs[0, 0])[None])
    assert torch.allclose(uv0, torch.tensor([[0.5, 0.5]]), atol=1e-5)


def test_extrinsics_helpers():
    cam = make_camera()
    c2w = cam.cam_to_world()
    assert torch.allclose(c2w @ cam.world_to_cam, torch.eye(4), atol=1e-6)
    assert torch.allclose(cam.camera_center(), torch.tensor([2.0, -3.0, 1.5]), atol=1e-5)
    target = torch.tensor([0.1, 0.2, -0.1])
    fwd = (target - cam.camera_center()) / (target - cam.camera_center()).norm()
    assert torch.allclose(cam.forward(), fwd, atol=1e-6)
    # image "up" (-y) points along world +z as much as possible
    up_img = -cam.R[1]
    assert float(up_img @ torch.tensor([0.0, 0, 1])) > 0
    half = cam.resized(32, 24)
    assert (half.fx, half.cx, half.height) == (25.0, 15.5, 24)


def test_json_round_trip(tmp_path):
    cam = make_camera(name="front")
    again = Camera.from_json(cam.to_json())
    assert again == cam
    assert again != make_camera(name="other")
    assert again.to_dict() == cam.to_dict()
    save_camera(cam, tmp_path / "c.json")
    assert load_camera(tmp_path / "c.json").to_dict() == cam.to_dict()
    save_cameras([cam, make_camera(width=10, height=10)], tmp_path / "cs.json")
    loaded = load_cameras(tmp_path / "cs.json")
    assert [c.width for c in loaded] == [64, 10]


@pytest.mark.parametrize("missing", ["width", "fx", "cy", "world_to_cam"])
def test_json_missing_field(missing):
    d = make_camera().to_dict()
    del d[missing]
    with pytest.raises(CameraError, match=f"missing field.*{missing}"):
        Camera.from_dict(d)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("width", "64", "width"),
        ("width", 0, "width"),
        ("height", 2.5, "height"),
        ("fx", "fast", "fx"),
        ("fy", -1.0, "focal"),
        ("cx", float("nan"), "cx"),
        ("world_to_cam", [[1, 0, 0], [0, 1, 0]], "world_to_cam"),
        ("world_to_cam", "eye", "world_to_cam"),
        ("world_to_cam", [[2, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], "rotation"),
        ("world_to_cam", [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]], "last row"),
        ("convention", "opengl", "convention"),
    ],
)
def test_json_invalid_field(field, value, match):
    d = make_camera().to_dict()
    d[field] = value
    with pytest.raises(CameraError, match=match):
        Camera.from_dict(d)


def test_json_not_json(tmp_path):
    with pytest.raises(CameraError, match="not valid JSON"):
        Camera.from_json("{width: 3")
    p = tmp_path / "x.json"
    p.write_text("[]")
    with pytest.raises(CameraError, match="empty"):
        load_cameras(p)
    with pytest.raises(CameraError, match="cannot read"):
        load_cameras(tmp_path / "nope.json")


def toy_asset():
    g = torch.Generator().manual_seed(0)
    means = torch.rand(500, 3, generator=g) * torch.tensor([2.0, 1.0, 0.5]) + torch.tensor(
        [3.0, -1.0, 0.2]
    )
    return GaussianAsset.from_colors(means, torch.rand(500, 3, generator=g), scales=0.01)


@pytest.mark.parametrize("fit", ["sphere", "points"])
@pytest.mark.parametrize("elevation", [-30.0, 0.0, 20.0, 60.0])
def test_orbit_cameras_frame_the_asset(elevation, fit):
    asset = toy_asset()
    cams = orbit_cameras(
        asset, 6, width=80, height=60, fov_y_deg=45, elevation_deg=elevation, fit=fit
    )
    assert len(cams) == 6
    centre, _ = asset.bounding_sphere()
    dists = {round(float((c.camera_center() - centre).norm()), 4) for c in cams}
    assert len(dists) == 1  # all on one circle
    for cam in cams:
        uv, z = cam.project(centre[None])
        assert torch.allclose(uv, torch.tensor([[40.0, 30.0]]), atol=1e-3)
        uv, z = cam.project(asset.means)
        assert bool((z > 0).all())
        assert bool((uv[:, 0] >= 0).all() and (uv[:, 0] <= 80).all())
        assert bool((uv[:, 1] >= 0).all() and (uv[:, 1] <= 60).all())
        # elevation: angle above the ground plane
        d = cam.camera_center() - centre
        assert math.degrees(math.asin(float(d[2] / d.norm()))) == pytest.approx(elevation, abs=1e-3)
    azimuths = [
        math.atan2(float(c.camera_center()[1] - centre[1]), float(c.camera_center()[0] - centre[0]))
        for c in cams
    ]
    steps = [(b - a) % (2 * math.pi) for a, b in itertools.pairwise(azimuths)]
    assert steps == pytest.approx([2 * math.pi / 6] * 5, abs=1e-4)


def test_orbit_other_up_and_errors():
    cams = orbit_cameras(((0.0, 0.0, 0.0), 1.0), 3, up=(0, 1, 0), elevation_deg=30)
    for c in cams:
        assert float(c.camera_center()[1]) == pytest.approx(
            float(c.camera_center().norm()) * 0.5, abs=1e-4
        )
    with pytest.raises(CameraError, match="at least one"):
        orbit_cameras(toy_asset(), 0)
    with pytest.raises(CameraError, match="elevation"):
        orbit_cameras(toy_asset(), 2, elevation_deg=90)
    with pytest.raises(CameraError, match="fit"):
        orbit_cameras(toy_asset(), 2, fit="tight")


def test_plucker_rays_consistent_with_projection():
    cam = make_camera()
    rays = cam.plucker_rays()
    assert rays.shape == (48, 64, 6)
    d, m = rays[..., :3], rays[..., 3:]
    assert torch.allclose(d.norm(dim=-1), torch.ones(48, 64), atol=1e-5)
    assert torch.allclose((d * m).sum(-1), torch.zeros(48, 64), atol=1e-4)  # d . m = 0
    o = cam.camera_center()
    assert torch.allclose(m, torch.linalg.cross(o.expand_as(d), d, dim=-1), atol=1e-5)
    # points along each ray project back to its pixel centre, in front of the camera
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 48, (50,), generator=g)
    cols = torch.randint(0, 64, (50,), generator=g)
    t = torch.rand(50, generator=g) * 5 + 0.5
    # recover a point on the ray from Plücker coordinates alone: p = d x m + t d
    pts = torch.linalg.cross(d[rows, cols], m[rows, cols], dim=-1) + t[:, None] * d[rows, cols]
    uv, z = cam.project(pts)
    assert bool((z > 0).all())
    expect = torch.stack([cols + 0.5, rows + 0.5], dim=1).float()
    assert torch.allclose(uv, expect, atol=2e-3)


def test_inria_cameras_json(tmp_path):
    # Build the entry the way the INRIA code does: rotation = cam-to-world 3x3, position = centre
    w2c = look_at((1.0, 2.0, 3.0), (0.0, 0.0, 0.0), (0, 1, 0))
    c2w = torch.linalg.inv(w2c)
    entries = [
        {
            "id": 0,
            "img_name": "00001",
            "width": 100,
            "height": 80,
            "position": c2w[:3, 3].tolist(),
            "rotation": [row.tolist() for row in c2w[:3, :3]],
            "fx": 90.0,
            "fy": 91.0,
        }
    ]
    p = tmp_path / "cameras.json"
    p.write_text(json.dumps(entries))
    (cam,) = load_inria_cameras(p)
    assert torch.allclose(cam.world_to_cam, w2c, atol=1e-5)
    assert (cam.cx, cam.cy, cam.fx, cam.name) == (50.0, 40.0, 90.0, "00001")
    assert torch.allclose(load_cameras(p)[0].world_to_cam, w2c, atol=1e-5)  # auto-detected
    del entries[0]["rotation"]
    p.write_text(json.dumps(entries))
    with pytest.raises(CameraError, match=r"camera 0: .*missing field.*rotation"):
        load_inria_cameras(p)


def test_look_at_straight_down_is_well_defined():
    w2c = look_at((0, 0, 5), (0, 0, 0), (0, 0, 1))
    cam = Camera.from_fov(32, 32, 60.0, w2c)
    uv, z = cam.project(torch.zeros(1, 3))
    assert torch.allclose(uv, torch.tensor([[16.0, 16.0]])) and float(z) == pytest.approx(5.0)
    with pytest.raises(CameraError, match="coincide"):
        look_at((1, 1, 1), (1, 1, 1))


def test_orbit_framing_is_tight_and_distance_override():
    asset = toy_asset()
    loose = orbit_cameras(asset, 8, width=64, height=64, fov_y_deg=40)
    cams = orbit_cameras(asset, 8, width=64, height=64, fov_y_deg=40, margin=1.1, fit="points")
    assert float(cams[0].camera_center().norm()) < float(loose[0].camera_center().norm())
    reach = 0.0
    for cam in cams:
        uv, _ = cam.project(asset.means)
        reach = max(reach, float(((uv - 32.0).abs() / 32.0).max()))
    assert 0.7 < reach < 1.0 / 1.1 + 1e-6  # fills the view, inside the margin
    far = orbit_cameras(asset, 2, distance=50.0)
    centre, _ = asset.bounding_sphere()
    assert float((far[0].camera_center() - centre).norm()) == pytest.approx(50.0, rel=1e-5)


def test_numpy_and_tensor_scalars_are_accepted():
    import numpy as np

    cam = Camera(np.int64(4), 4, torch.tensor(3.0), np.float32(3.5), 2.0, 2.0, np.eye(4))
    assert isinstance(cam.width, int) and cam.fx == 3.0 and cam.fy == 3.5
    assert cam.world_to_cam.dtype == torch.float32
    assert json.loads(cam.to_json())["fx"] == 3.0
    with pytest.raises(CameraError, match="fx"):
        Camera(4, 4, torch.ones(2), 3.0, 2.0, 2.0, torch.eye(4))
