"""`splatpainter render`: --alpha, --depth, --near/--far, --antialiased and --json."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from splatpainter.assets.procedural import make_demo_asset
from splatpainter.camera import load_camera
from splatpainter.cli import app
from splatpainter.io import load_asset, write_ply
from splatpainter.render import render

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny_ply(tmp_path_factory):
    path = tmp_path_factory.mktemp("render_cli") / "tiny.ply"
    write_ply(make_demo_asset(400, seed=2, sh_degree=1).asset, path)
    return path


def _render_cli(*args):
    res = runner.invoke(app, ["render", *map(str, args)])
    assert "Traceback" not in res.output, res.output
    return res


def test_alpha_depth_outputs_and_json(tiny_ply, tmp_path):
    out = tmp_path / "views"
    res = _render_cli(
        tiny_ply, "--orbit", "2", "--size", "32x24", "--out", out, "--backend", "numba",
        "--alpha", "--depth", "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["near_plane"] == 0.2 and info["rasterize_mode"] == "classic"
    assert len(info["views"]) == 2
    view = info["views"][0]
    assert set(view) == {"rgb", "camera", "alpha", "depth", "depth_png", "depth_range"}
    for key in ("rgb", "camera", "alpha", "depth", "depth_png"):
        assert (out / view[key].split("/")[-1]).exists()
    # the files hold what the renderer computes for that camera
    asset, cam = load_asset(tiny_ply), load_camera(view["camera"])
    ref = render(asset, cam, backend="numba")
    alpha = np.asarray(Image.open(view["alpha"]))
    assert alpha.shape == (24, 32)
    assert np.abs(alpha / 255.0 - ref.alpha.numpy()).max() <= 0.5 / 255 + 1e-6
    depth = np.load(view["depth"])
    assert depth.dtype == np.float32 and np.array_equal(depth, ref.depth.numpy())
    drawn = ref.alpha > 0
    assert view["depth_range"] == pytest.approx(
        [float(ref.depth[drawn].min()), float(ref.depth[drawn].max())]
    )
    assert np.asarray(Image.open(view["depth_png"])).shape == (24, 32)


def test_near_far_and_antialiased_change_the_render(tiny_ply, tmp_path):
    base = _render_cli(tiny_ply, "--orbit", "1", "--size", "32x24", "--out", tmp_path / "a",
                       "--json")  # fmt: skip
    cam = load_camera(json.loads(base.stdout)["views"][0]["camera"])
    dist = float(torch.linalg.norm(cam.camera_center()))
    img = {}
    for name, extra in (
        ("base", []),
        ("far", ["--far", f"{dist:.3f}"]),  # drops the far half of the asset
        ("near", ["--near", f"{dist:.3f}"]),  # drops the near half
        ("aa", ["--antialiased"]),
    ):
        out = tmp_path / name
        res = _render_cli(tiny_ply, "--orbit", "1", "--size", "32x24", "--out", out, *extra)
        assert res.exit_code == 0, res.output
        img[name] = np.asarray(Image.open(out / "view_000.png")).astype(int)
    for name in ("far", "near", "aa"):
        assert np.abs(img[name] - img["base"]).max() > 10, name


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--near", "0"], "--near"),
        (["--near", "5", "--far", "1"], "--far"),
        (["--near", "nan"], "--near"),
    ],
)
def test_bad_planes_are_one_line_errors(tiny_ply, tmp_path, args, match):
    res = _render_cli(tiny_ply, "--orbit", "1", "--out", tmp_path / "x", *args)
    assert res.exit_code == 2
    assert match in res.output
