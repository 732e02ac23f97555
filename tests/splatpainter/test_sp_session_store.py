"""Session files store per-step appearance deltas; `splatpainter session show|undo|redo|export`."""

import json

import pytest
import torch
from typer.testing import CliRunner

from splatpainter.assets.procedural import make_demo_asset
from splatpainter.camera import orbit_cameras
from splatpainter.cli import app
from splatpainter.edit import BackprojectMethod, EditSession, EditView, ModelMethod
from splatpainter.edit.session import SESSION_FORMAT, StoredSession, _asset_to_dict
from splatpainter.io import load_asset
from splatpainter.model import EditorConfig, EditorModel, Stage1Config, Stage2Config
from splatpainter.render import render

SIZE = 48


@pytest.fixture(scope="module")
def scene():
    asset = make_demo_asset(1500, seed=0).asset.with_sh_degree(3)
    cams = orbit_cameras(asset, 4, width=SIZE, height=SIZE, margin=0.8)
    return asset, cams


@pytest.fixture(scope="module")
def model():
    cfg = EditorConfig(
        stage1=Stage1Config(
            grid_size=8, dim=32, latent_dim=64, num_layers=1, num_views=2, view_size=32
        ),
        stage2=Stage2Config(dim=64, num_blocks=2, head_hidden=32),
    )
    return EditorModel.initial(cfg, seed=0)


def painted(asset, cam, color=(1.0, 0.0, 1.0)):
    img = render(asset, cam).rgb.clamp(0, 1)
    img = (img * 255).round() / 255  # what a browser or a PNG gives: 8-bit
    img[18:26, 18:26] = torch.tensor(color)
    return img


def assert_same(a, b):
    for (ka, ta), (kb, tb) in zip(a.tensors().items(), b.tensors().items(), strict=True):
        assert ka == kb and torch.equal(ta, tb), ka


def three_edits(scene, method):
    asset, cams = scene
    s = EditSession(asset, method)
    for i, color in enumerate([(1.0, 0, 1.0), (0, 1.0, 0), (0, 0, 1.0)]):
        s.apply(EditView(cams[i], painted(s.asset, cams[i], color)))
    return s


def test_file_holds_deltas_not_snapshots(scene, tmp_path):
    asset, _ = scene
    s = three_edits(scene, BackprojectMethod())
    path = tmp_path / "s.spsession"
    s.save(path)
    d = torch.load(path, weights_only=True)
    assert d["format"] == SESSION_FORMAT and d["version"] == 2
    snapshot = sum(t.numel() * t.element_size() for t in _asset_to_dict(asset).values())
    for i, e in enumerate(d["entries"][1:], start=1):
        # only appearance (SH) rows of the Gaussians this edit changed
        assert set(e["delta"]) == {"sh"}
        rows = e["delta"]["sh"]["rows"]
        assert rows.numel() == s.changed_gaussians(i) < asset.num_gaussians / 3
        # ... and of those rows only the DC colour: 3 of the 48 SH values of degree 3
        assert tuple(e["delta"]["sh"]["values"].shape) == (rows.numel(), 3)
        assert "asset" not in e
    # whole file: the base once, plus far less than a snapshot per step (views are 8-bit)
    assert path.stat().st_size < snapshot * 1.5
    loaded = EditSession.load(path, BackprojectMethod())
    for a, b in zip(loaded.entries, s.entries, strict=True):
        assert_same(a.asset, b.asset)
        for va, vb in zip(a.views, b.views, strict=True):
            assert torch.equal(va.image, vb.image)  # 8-bit storage is lossless here


def test_model_state_and_redo_branch_round_trip(scene, model, tmp_path):
    s = three_edits(scene, ModelMethod(model))
    s.undo()
    path = tmp_path / "m.spsession"
    s.save(path)
    d = torch.load(path, weights_only=True)
    # the Stage I latent is the same in every entry: stored once, then as a marker
    assert torch.is_tensor(d["entries"][0]["state"]["latent"]["voxel_latent"])
    assert not torch.is_tensor(d["entries"][2]["state"]["latent"]["voxel_latent"])
    loaded = EditSession.load(path, ModelMethod(model))
    assert loaded.index == 2 and loaded.can_redo
    for a, b in zip(loaded.entries, s.entries, strict=True):
        assert_same(a.asset, b.asset)
        for fa, fb in zip(a.state["fast"], b.state["fast"], strict=True):
            assert torch.equal(fa.w0, fb.w0) and torch.equal(fa.w2, fb.w2)
    assert_same(loaded.redo(), s.redo())


def test_version_1_files_still_load(scene, tmp_path):
    s = three_edits(scene, BackprojectMethod())
    v1 = {
        "format": SESSION_FORMAT,
        "version": 1,
        "method": s.method.describe(),
        "index": 3,
        "entries": [
            {
                "asset": _asset_to_dict(e.asset),
                "state": None,
                "views": [v.to_dict() for v in e.views],
                "label": e.label,
                "seconds": e.seconds,
            }
            for e in s.entries
        ],
    }
    path = tmp_path / "old.session"
    torch.save(v1, path)
    loaded = EditSession.load(path, BackprojectMethod())
    for a, b in zip(loaded.entries, s.entries, strict=True):
        assert_same(a.asset, b.asset)


def test_goto_and_reset(scene):
    asset, _ = scene
    s = three_edits(scene, BackprojectMethod())
    assert_same(s.goto(1), s.entries[1].asset)
    assert s.can_redo
    assert_same(s.reset(), asset)
    assert s.index == 2 and not s.can_redo and s.history[-1].label == "reset"
    assert_same(s.undo(), s.entries[1].asset)
    with pytest.raises(ValueError, match="no history entry 7"):
        s.goto(7)


def test_damaged_files_are_one_line_errors(scene, tmp_path):
    s = three_edits(scene, BackprojectMethod())
    good = tmp_path / "g.spsession"
    s.save(good)
    d = torch.load(good, weights_only=True)
    bad_cases = {
        "junk": b"not a zip",
        "empty": b"",
    }
    for name, data in bad_cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match="not a readable session file") as e:
            StoredSession.read(tmp_path / name)
        assert "\n" not in str(e.value)
    d["entries"][2]["delta"]["sh"]["rows"] = torch.tensor([10**9])
    torch.save(d, tmp_path / "rows")
    with pytest.raises(ValueError, match="damaged session file"):
        EditSession.load(tmp_path / "rows", BackprojectMethod())
    d2 = torch.load(good, weights_only=True)
    d2["index"] = 99
    torch.save(d2, tmp_path / "index")
    with pytest.raises(ValueError, match="index 99"):
        StoredSession.read(tmp_path / "index")
    with pytest.raises(ValueError, match="is a directory, not a regular session file"):
        StoredSession.read(tmp_path)


# ---------------------------------------------------------------------- the CLI
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_cli_session_show_undo_redo_export(scene, tmp_path):
    asset, _ = scene
    s = three_edits(scene, BackprojectMethod())
    path = tmp_path / "s.spsession"
    s.save(path)

    r = invoke("session", "show", path, "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["index"] == 3 and len(summary["entries"]) == 4
    assert summary["entries"][1]["changed_gaussians"] == s.changed_gaussians(1)
    r = invoke("session", "show", path)
    assert r.exit_code == 0 and "current" in r.output

    assert invoke("session", "undo", path).exit_code == 0
    r = invoke("session", "undo", path, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["index"] == 1
    assert invoke("session", "redo", path).exit_code == 0
    # the live session sees the moved pointer, and keeps the redo entry
    loaded = EditSession.load(path, BackprojectMethod())
    assert loaded.index == 2 and loaded.can_redo
    assert_same(loaded.asset, s.entries[2].asset)

    out = tmp_path / "e.ply"
    r = invoke("session", "export", path, out)
    assert r.exit_code == 0, r.output
    assert torch.equal(load_asset(out).sh, s.entries[2].asset.sh)
    r = invoke("session", "export", path, tmp_path / "first.splat", "--index", "0", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["num_gaussians"] == asset.num_gaussians

    for _ in range(2):
        invoke("session", "undo", path)
    r = invoke("session", "undo", path)
    assert r.exit_code == 2 and "nothing to undo" in r.output
    r = invoke("session", "export", path, tmp_path / "x.ply", "--index", "9")
    assert r.exit_code == 2 and "no entry 9" in r.output
    (tmp_path / "junk").write_bytes(b"\x00" * 10)
    r = invoke("session", "show", tmp_path / "junk")
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "error:" in r.output
