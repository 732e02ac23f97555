"""`splatpainter info | convert | render`: smoke tests via subprocess, bad input -> exit 2."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from splatpainter.assets.procedural import make_demo_asset
from splatpainter.camera import Camera, load_camera
from splatpainter.cli import app
from splatpainter.io import load_asset, read_ply, write_ply


def run_cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "splatpainter.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
    )


runner = CliRunner()


def invoke(*args):
    res = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in res.output
    return res


@pytest.fixture(scope="module")
def tiny_ply(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "tiny.ply"
    write_ply(make_demo_asset(400, seed=2, sh_degree=1).asset, path)
    return path


@pytest.mark.slow
def test_info_convert_render_subprocess(tiny_ply, tmp_path):
    out = run_cli("info", tiny_ply, "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["num_gaussians"] == 400 and summary["sh_degree"] == 1
    assert summary["opacity"]["max"] == pytest.approx(0.95, abs=1e-4)
    text = invoke("info", tiny_ply)
    assert text.exit_code == 0 and "gaussians     400" in text.output

    splat = tmp_path / "t.splat"
    conv = run_cli("convert", tiny_ply, splat)
    assert conv.returncode == 0, conv.stderr
    assert "SH degree 1 dropped" in conv.stderr
    assert splat.stat().st_size == 400 * 32
    back = tmp_path / "back.ply"
    assert invoke("convert", splat, back).exit_code == 0
    a, b = read_ply(tiny_ply), read_ply(back)
    assert torch.equal(a.means, b.means) and b.sh_degree == 0

    views = tmp_path / "views"
    ren = run_cli(
        "render", tiny_ply, "--orbit", "2", "--size", "24x16", "--out", views,
        "--backend", "reference",
    )  # fmt: skip
    assert ren.returncode == 0, ren.stderr
    names = sorted(p.name for p in views.iterdir())
    assert names == [
        "cameras.json",
        "view_000.json",
        "view_000.png",
        "view_001.json",
        "view_001.png",
    ]
    img = np.asarray(Image.open(views / "view_000.png"))
    assert img.shape == (16, 24, 3)
    assert (img.sum(-1) > 0).mean() > 0.05  # something was drawn on the black background
    cam = load_camera(views / "view_000.json")
    assert (cam.width, cam.height) == (24, 16)

    # re-render from the saved camera (at another size): same view, scaled intrinsics
    again = tmp_path / "again"
    ren2 = invoke(
        "render", tiny_ply, "--camera", views / "view_001.json", "--size", "12x8", "--out", again,
        "--backend", "reference",
    )  # fmt: skip
    assert ren2.exit_code == 0, ren2.output
    c2 = load_camera(again / "view_000.json")
    assert torch.equal(c2.world_to_cam, load_camera(views / "view_001.json").world_to_cam)
    assert np.asarray(Image.open(again / "view_000.png")).shape == (8, 12, 3)


def test_bad_input_subprocess_exits_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.ply"
    bad.write_bytes(b"ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nend_header\n1\n")
    out = run_cli("info", bad)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "error:" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("make_args", "message"),
    [
        (lambda p, t: ["info", t / "missing.ply"], "cannot read"),
        (lambda p, t: ["info", t / "x.obj"], "unknown asset format"),
        (lambda p, t: ["convert", p, t / "out.obj"], "unknown output format"),
        (lambda p, t: ["render", p, "--out", t / "o"], "exactly one of"),
        (lambda p, t: ["render", p, "--orbit", "1", "--camera", p, "--out", t], "exactly one"),
        (lambda p, t: ["render", p, "--orbit", "2", "--size", "big", "--out", t], "--size"),
        (lambda p, t: ["render", p, "--orbit", "0", "--out", t / "o"], "positive"),
        (lambda p, t: ["render", p, "--camera", t / "cam.json", "--out", t / "o"], "missing"),
        (
            lambda p, t: ["render", p, "--orbit", "1", "--background", "red", "--out", t],
            "background",
        ),
        (
            lambda p, t: ["render", p, "--orbit", "1", "--backend", "magic", "--out", t / "o"],
            "magic",
        ),
    ],
)
def test_bad_input_exit_code(tiny_ply, tmp_path, make_args, message):
    cam = Camera.from_fov(8, 8, 40.0, torch.eye(4)).to_dict()
    del cam["fy"]
    (tmp_path / "cam.json").write_text(json.dumps(cam))
    res = invoke(*make_args(tiny_ply, tmp_path))
    assert res.exit_code == 2, res.output
    assert message in res.output


def test_convert_ply_keeps_extras(tmp_path):
    pa = make_demo_asset(300, seed=4)
    extras = {
        "nx": pa.normals[:, 0].numpy(),
        "ny": pa.normals[:, 1].numpy(),
        "nz": pa.normals[:, 2].numpy(),
    }
    src = tmp_path / "a.ply"
    write_ply(pa.asset, src, extras=extras)
    res = invoke("convert", src, tmp_path / "b.ply")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "b.ply").read_bytes() == src.read_bytes()
    assert load_asset(tmp_path / "b.ply").num_gaussians == 300


def test_cli_choices_match_the_library():
    """The enums --help lists are the names the library accepts (declared once per concept)."""
    from splatpainter.cli.options import EditKind, EditMethod, EvalHint
    from splatpainter.eval.suite import ABLATIONS, HINT_MODES, METHODS
    from splatpainter.model.stage2 import EDIT_HINTS

    assert [k.value for k in EditKind] == list(EDIT_HINTS)
    # evaluate also names its ablations and the no-learning rules, which `edit` does not offer
    eval_only = {*ABLATIONS, "rule", "diffusion", "diffusion_centred"}
    assert {m.value for m in EditMethod} == set(METHODS) - eval_only
    assert [h.value for h in EvalHint] == list(HINT_MODES)
