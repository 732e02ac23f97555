"""`splatpainter edit`: end to end through the CLI, and its bad-input errors."""

import json

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from splatpainter.assets.procedural import make_demo_asset
from splatpainter.camera import orbit_cameras, save_camera
from splatpainter.cli import app
from splatpainter.io import load_asset, save_asset
from splatpainter.model import (
    EditorConfig,
    EditorModel,
    Stage1Config,
    Stage2Config,
    save_checkpoint,
)
from splatpainter.render import render

SIZE = 48


def small_config(blocks: int = 1) -> EditorConfig:
    return EditorConfig(
        stage1=Stage1Config(
            grid_size=8, dim=32, latent_dim=64, num_layers=1, num_views=2, view_size=32
        ),
        stage2=Stage2Config(dim=64, num_blocks=blocks, head_hidden=32),
    )


def write_png(arr, path):
    a = (np.clip(arr, 0, 1) * 255 + 0.5).astype(np.uint8)
    Image.fromarray(a).save(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_edit")
    asset = make_demo_asset(1200, seed=0).asset
    save_asset(asset, d / "asset.ply")
    cam = orbit_cameras(asset, 4, width=SIZE, height=SIZE, margin=0.8)[0]
    save_camera(cam, d / "cam.json")
    img = render(asset, cam).rgb.clamp(0, 1).numpy().copy()
    write_png(img, d / "render.png")
    img[14:30, 14:30] = [1.0, 0.0, 1.0]
    write_png(img, d / "edited.png")
    mask = np.zeros((SIZE, SIZE), np.uint8)
    mask[14:30, 14:30] = 255
    Image.fromarray(mask).save(d / "mask.png")
    Image.fromarray(np.zeros((SIZE, 10), np.uint8)).save(d / "badmask.png")
    write_png(np.zeros((32, 32, 3)), d / "small.png")
    bad = cam.to_dict()
    del bad["fx"]
    (d / "badcam.json").write_text(json.dumps(bad))
    return d, asset, cam


def run(*args):
    return CliRunner().invoke(app, ["edit", *map(str, args)])


@pytest.mark.parametrize("method", ["backproject", "optimize"])
def test_edit_writes_an_edited_asset(files, method):
    d, asset, cam = files
    out = d / f"out_{method}.ply"
    r = run(d / "asset.ply", "--view", d / "cam.json", "--image", d / "edited.png",
            "--method", method, "--steps", 10, "--out", out)  # fmt: skip
    assert r.exit_code == 0, r.output
    new = load_asset(out)
    assert torch.equal(new.means, asset.means)
    before = render(asset, cam).rgb[14:30, 14:30]
    after = render(new, cam).rgb[14:30, 14:30]
    paint = torch.tensor([1.0, 0.0, 1.0])
    assert (after - paint).abs().mean() < (before - paint).abs().mean()


def test_edit_writes_spz_as_the_ply_within_its_quantisation(files, tmp_path):
    """--out .spz holds the same edit as --out .ply, within .spz's 8-bit colours."""
    d, asset, _ = files
    args = [d / "asset.ply", "--view", d / "cam.json", "--image", d / "edited.png",
            "--method", "backproject"]  # fmt: skip
    r = run(*args, "--out", tmp_path / "out.ply")
    assert r.exit_code == 0, r.output
    r = run(*args, "--out", tmp_path / "out.spz", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["out"] == str(tmp_path / "out.spz")
    ply, spz = load_asset(tmp_path / "out.ply"), load_asset(tmp_path / "out.spz")
    assert spz.num_gaussians == asset.num_gaussians
    dc = lambda a: 0.5 + 0.28209479177387814 * a.sh[:, 0]  # noqa: E731
    assert float((dc(spz) - dc(ply)).abs().max()) < 2.0 / 255.0  # one 8-bit step and rounding
    assert float((dc(ply) - dc(asset)).abs().max()) > 0.1  # and the edit is in both


def test_unchanged_png_render_changes_nothing(files):
    d, asset, _ = files
    out = d / "same.ply"
    r = run(d / "asset.ply", "--view", d / "cam.json", "--image", d / "render.png",
            "--method", "backproject", "--out", out)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert torch.equal(load_asset(out).sh, asset.sh)


def test_model_uses_shipped_weights_and_session_continues(files, tmp_path):
    d, _, _ = files
    sess = tmp_path / "s.session"
    args = ["--view", d / "cam.json", "--image", d / "edited.png", "--mask", d / "mask.png"]
    r = run(
        d / "asset.ply", *args, "--session", sess, "--kind", "paint", "--out", tmp_path / "a.ply"
    )
    assert r.exit_code == 0, r.output
    assert "warning:" not in r.output  # the package ships trained weights
    assert sess.exists()
    r = run(d / "asset.ply", *args, "--session", sess, "--out", tmp_path / "b.ply")
    assert r.exit_code == 0, r.output
    assert "edit 2 applied" in r.output


def test_model_with_untrained_weights_warns(files, tmp_path):
    d, _, _ = files
    w = tmp_path / "w.pt"
    save_checkpoint(EditorModel.initial(small_config()), w)
    r = run(d / "asset.ply", "--view", d / "cam.json", "--image", d / "edited.png",
            "--weights", w, "--out", tmp_path / "o.ply")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "warning: --method model is using untrained" in r.output
    save_checkpoint(EditorModel.initial(small_config()), w, trained=True)
    r = run(d / "asset.ply", "--view", d / "cam.json", "--image", d / "edited.png",
            "--weights", w, "--out", tmp_path / "o.ply")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "warning:" not in r.output


def test_bad_kind_is_named(files, tmp_path):
    d, _, _ = files
    r = run(d / "asset.ply", "--view", d / "cam.json", "--image", d / "edited.png",
            "--kind", "sharpen", "--out", tmp_path / "o.ply")  # fmt: skip
    assert r.exit_code == 2
    assert "'--kind'" in r.output and "is not one of" in r.output


def _bad_weights(tmp_path):
    w = tmp_path / "bad.pt"
    save_checkpoint(EditorModel.initial(small_config()), w)
    payload = torch.load(w, weights_only=True)
    payload["config"]["stage2"]["num_blocks"] = 2  # claims 2 blocks, carries weights for 1
    torch.save(payload, w)
    return w


@pytest.mark.parametrize(
    "case,expect",
    [
        ("size", "camera is 48x48"),
        ("mask", "mask must be [48, 48]"),
        ("camera", "missing field(s): fx"),
        ("weights", "weights do not fit the architecture"),
        ("count", "give one per view"),
        ("method", "is not one of"),
        ("missing", "No such file"),
    ],
)
def test_bad_input_is_a_one_line_error(files, tmp_path, case, expect):
    d, _, _ = files
    cam, img, extra = d / "cam.json", d / "edited.png", []
    if case == "size":
        img = d / "small.png"
    elif case == "mask":
        extra = ["--mask", d / "badmask.png"]
    elif case == "camera":
        cam = d / "badcam.json"
    elif case == "weights":
        extra = ["--weights", _bad_weights(tmp_path)]
    elif case == "count":
        extra = ["--view", d / "cam.json"]
    elif case == "method":
        extra = ["--method", "magic"]
    elif case == "missing":
        img = d / "nope.png"
    r = run(d / "asset.ply", "--view", cam, "--image", img, *extra, "--out", tmp_path / "o.ply")
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and expect in lines[0], r.output
    assert "Traceback" not in r.output
    assert not (tmp_path / "o.ply").exists()


def test_auto_says_how_it_read_the_edit(files, tmp_path):
    """Under --kind auto the report names the kind the model took the edit for, with the
    hypotheses' shares and how many moved Gaussians the edited pixels do not show: a whole
    view recoloured reads as a recolour that reaches the unseen side; a given kind has no
    reading."""
    d, asset, cam = files
    img = render(asset, cam).rgb.clamp(0, 1).numpy()
    write_png(img[..., [1, 2, 0]] * 0.9 + 0.05, tmp_path / "recoloured.png")
    args = [d / "asset.ply", "--view", d / "cam.json", "--image", tmp_path / "recoloured.png"]
    r = run(*args, "--out", tmp_path / "auto.ply", "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    reading = got["reading"]
    assert reading["read_as"] == "recolor" and reading["shares"]["recolor"] > 0.5
    assert abs(sum(reading["shares"].values()) - 1) < 1e-3
    assert reading["moved_gaussians"] == got["changed_gaussians"]
    assert 0 < reading["moved_beyond_the_mask"] < reading["moved_gaussians"]
    r = run(*args, "--out", tmp_path / "auto.ply")
    assert r.exit_code == 0, r.output
    assert "read as recolor (paint " in r.output and "pass --kind paint" in r.output
    r = run(*args, "--kind", "recolor", "--out", tmp_path / "told.ply", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["reading"] is None
