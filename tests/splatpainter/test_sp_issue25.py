"""Issue 25 (splatpainter half), one test per defect: refuse what does not fit, convert
what can be converted with its real scale, and run no code from files."""

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from splatpainter.io.images import ImageInputError, load_image, load_mask


# ---------------------------------------------------------------- 1. image pixel formats
def png_rgb16(rgb: np.ndarray) -> bytes:
    """A 16-bit RGB PNG written by hand (PIL cannot write one)."""
    h, w, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[y].astype(">u2").tobytes() for y in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    ihdr = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def test_16bit_grayscale_mask_and_image_are_scaled_not_clipped(tmp_path):
    levels = np.array([[0, 300, 16384, 32768, 65535]], dtype=np.uint16)
    path = tmp_path / "m16.png"
    Image.fromarray(levels).save(path)
    assert Image.open(path).mode.startswith("I")
    want = levels.astype(np.float32) / 65535
    np.testing.assert_allclose(load_mask(path).numpy(), want, atol=1e-6)
    img = load_image(path).numpy()
    assert img.shape == (1, 5, 3)
    np.testing.assert_allclose(img[..., 1], want, atol=1e-6)


def test_16bit_rgb_png_keeps_its_levels(tmp_path):
    path = tmp_path / "rgb16.png"
    path.write_bytes(png_rgb16(np.array([[[65535, 32768, 0], [16384, 0, 65535]]], np.uint16)))
    img = load_image(path).numpy()
    np.testing.assert_allclose(img[0, 0], [1.0, 0.5, 0.0], atol=1 / 255)
    np.testing.assert_allclose(img[0, 1], [0.25, 0.0, 1.0], atol=1 / 255)


def test_palette_image_reads_its_colours(tmp_path):
    im = Image.new("P", (2, 1))
    im.putpalette([255, 0, 0, 0, 128, 255] + [0] * 762)
    im.putdata([0, 1])
    im.save(tmp_path / "p.png")
    np.testing.assert_allclose(
        load_image(tmp_path / "p.png").numpy()[0], [[1, 0, 0], [0, 128 / 255, 1]], atol=1e-6
    )


def test_alpha_is_composited_over_black(tmp_path):
    rgba = np.array([[[255, 0, 0, 255], [255, 255, 255, 0], [0, 255, 0, 51]]], np.uint8)
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    img = load_image(tmp_path / "a.png").numpy()[0]
    np.testing.assert_allclose(img, [[1, 0, 0], [0, 0, 0], [0, 0.2, 0]], atol=1e-6)
    la = np.array([[[255, 255], [255, 0], [200, 128]]], np.uint8)
    Image.fromarray(la, "LA").save(tmp_path / "la.png")
    np.testing.assert_allclose(
        load_mask(tmp_path / "la.png").numpy()[0], [1, 0, 200 / 255 * 128 / 255], atol=1e-6
    )


def test_grayscale_and_jpeg_still_read(tmp_path):
    Image.fromarray(np.array([[0, 128, 255]], np.uint8), "L").save(tmp_path / "g.png")
    np.testing.assert_allclose(load_mask(tmp_path / "g.png").numpy()[0], [0, 128 / 255, 1])
    Image.new("RGB", (4, 4), (200, 100, 50)).save(tmp_path / "c.jpg", quality=95)
    np.testing.assert_allclose(
        load_image(tmp_path / "c.jpg").numpy()[0, 0], [200 / 255, 100 / 255, 50 / 255], atol=0.02
    )


def test_float_image_is_refused_in_one_line(tmp_path):
    Image.fromarray(np.full((2, 2), 3.5, np.float32), "F").save(tmp_path / "f.tiff")
    with pytest.raises(ImageInputError, match=r"no defined 0\.\.1 range") as e:
        load_image(tmp_path / "f.tiff")
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- 2. weights memory bomb
def tampered_weights(path, **stage2):
    """A small editor weights file whose metadata config is changed (tensors left as they are)."""
    import json

    from safetensors import safe_open
    from safetensors.torch import save

    from splatpainter.model.editor import (
        EditorConfig,
        EditorModel,
        save_weights,
    )
    from splatpainter.model.stage1 import Stage1Config
    from splatpainter.model.stage2 import Stage2Config

    cfg = EditorConfig(
        Stage1Config(grid_size=4, dim=8, latent_dim=8, gauss_feat_dim=8, num_heads=2,
                     num_layers=1, image_feat_dim=4, num_views=1, view_size=8),
        Stage2Config(dim=8, num_blocks=1, num_heads=2, ttt_heads=2, head_hidden=8,
                     gauss_feat_dim=8),
    )  # fmt: skip
    save_weights(EditorModel.initial(cfg), path)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    config = json.loads(meta["config"])
    config["stage2"].update(stage2)
    path.write_bytes(save(tensors, metadata={**meta, "config": json.dumps(config)}))
    return path


def test_weights_metadata_over_the_limits_is_refused_before_allocating(tmp_path):
    from splatpainter.model.editor import CheckpointError, load_weights

    path = tampered_weights(tmp_path / "bomb.safetensors", dim=65536)
    with pytest.raises(CheckpointError, match=r"stage2\.dim: must be in \[1, 4096\]") as e:
        load_weights(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_weights_config_is_checked_against_declared_shapes_before_building(tmp_path, monkeypatch):
    from splatpainter.model import editor

    path = tampered_weights(tmp_path / "big.safetensors", dim=4096, head_hidden=4096)
    built = []
    real_init = editor.EditorModel.__init__

    def init(self, config=None):
        built.append(torch_default_device())
        real_init(self, config)

    monkeypatch.setattr(editor.EditorModel, "__init__", init)
    with pytest.raises(editor.CheckpointError, match="weights do not fit the architecture: shape"):
        editor.load_weights(path)
    assert built == ["meta"]  # the shapes were compared on the meta device only


def torch_default_device() -> str:
    import torch

    return torch.empty(0).device.type


# ---------------------------------------------------------------- 3. corrupt caches, checkpoints
TINY = Path(__file__).resolve().parents[2] / "configs" / "splatpainter" / "tiny.toml"


def train_cli(*args):
    from typer.testing import CliRunner

    from splatpainter.cli import app

    r = CliRunner().invoke(app, ["train", "--config", str(TINY), *map(str, args)])
    assert "Traceback" not in r.output, r.output
    return r


def test_corrupt_cache_entries_are_rebuilt_with_a_warning(tmp_path):
    import torch

    from splatpainter.train.config import load_config
    from splatpainter.train.examples import CacheRebuiltWarning
    from splatpainter.train.loop import train

    cfg = load_config(TINY)
    cfg.data.cache_dir = str(tmp_path / "cache")
    cfg.optim.steps = 3  # one epoch of the 3 sequences: every cache entry is read
    train(cfg, tmp_path / "a")
    files = sorted((tmp_path / "cache").rglob("*.pt"))
    assert len(files) == 3
    truncated, foreign = files[0], files[1]
    truncated.write_bytes(truncated.read_bytes()[:1000])  # an interrupted write
    torch.save({"not": "an example"}, foreign)  # a readable archive of something else
    with pytest.warns(CacheRebuiltWarning) as caught:
        train(cfg, tmp_path / "b")
    said = " ".join(str(w.message) for w in caught)
    assert str(truncated) in said and str(foreign) in said
    for f in (truncated, foreign):
        assert isinstance(torch.load(f, weights_only=True)["steps"], list)


def test_corrupt_resume_checkpoint_is_one_line_naming_it(tmp_path):
    from splatpainter.train.loop import CHECKPOINT

    out, cache = tmp_path / "run", tmp_path / "cache"
    r = train_cli("--out", out, "--steps", 2, "--cache-dir", cache)
    assert r.exit_code == 0, r.output
    ck = out / CHECKPOINT
    ck.write_bytes(ck.read_bytes()[:2000])
    r = train_cli("--out", out, "--steps", 2, "--cache-dir", cache, "--resume")
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(ck) in lines[0] and "training checkpoint" in lines[0], lines


# ---------------------------------------------------------------- 4. config values
@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[optim]\nlr = nan", "optim.lr: must be a finite number > 0, got nan"),
        ("[optim]\nlr = inf", "optim.lr: must be a finite number > 0, got inf"),
        ("[optim]\nweight_decay = -1", "optim.weight_decay: must be a finite number >= 0"),
        ("[model.stage2]\ndim = 0", "model.stage2.dim: must be in [1, 4096], got 0"),
        ("[model.stage2]\nnum_heads = 0", "model.stage2.num_heads: must be in [1, 64], got 0"),
        ("[model.stage1]\ngrid_size = 100000", "model.stage1.grid_size: must be in [1, 256]"),
        ("[loss]\ngauss_changed = -0.5", "loss.gauss_changed: must be a finite number >= 0"),
        ("[data]\nfuzzy_prob = 1.5", "data.fuzzy_prob: must be in [0, 1], got 1.5"),
    ],
)
def test_bad_config_values_are_refused_naming_the_key(tmp_path, toml, message):
    from splatpainter.train.config import ConfigError, load_config

    path = tmp_path / "bad.toml"
    path.write_text(toml + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_nan_learning_rate_is_one_line_on_the_command_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(TINY.read_text().replace("lr = 3e-3", "lr = nan"))
    assert "lr = nan" in path.read_text()
    from typer.testing import CliRunner

    from splatpainter.cli import app

    r = CliRunner().invoke(app, ["train", "--config", str(path), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "optim.lr: must be a finite number > 0, got nan" in lines[0], lines


# ---------------------------------------------------------------- 5. extra PLY columns
def test_noop_edit_and_session_export_give_back_the_same_ply(tmp_path):
    from typer.testing import CliRunner

    from splatpainter.assets.procedural import make_demo_asset
    from splatpainter.camera import orbit_cameras, save_camera
    from splatpainter.cli import app
    from splatpainter.io import write_ply
    from splatpainter.io.images import save_png
    from splatpainter.render import render

    asset = make_demo_asset(300, seed=1).asset
    g = np.random.default_rng(0)
    extras = {
        "nx": g.standard_normal(300).astype(np.float32),
        "ny": g.standard_normal(300).astype(np.float32),
        "nz": g.standard_normal(300).astype(np.float32),
        "confidence": g.random(300).astype(np.float32),
    }
    src = tmp_path / "in.ply"
    write_ply(asset, src, extras=extras)
    cam = orbit_cameras(asset, 2, width=32, height=32)[0]
    save_camera(cam, tmp_path / "cam.json")
    save_png(render(asset, cam).rgb, tmp_path / "render.png")  # paints nothing new
    out, sess = tmp_path / "out.ply", tmp_path / "s.session"
    r = CliRunner().invoke(app, [
        "edit", str(src), "--view", str(tmp_path / "cam.json"), "--image",
        str(tmp_path / "render.png"), "--method", "backproject", "--out", str(out),
        "--session", str(sess),
    ])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == src.read_bytes()
    exported = tmp_path / "exported.ply"
    r = CliRunner().invoke(app, ["session", "export", str(sess), str(exported)])
    assert r.exit_code == 0, r.output
    assert exported.read_bytes() == src.read_bytes()


# ---------------------------------------------------------------- 6. temp files
def test_stale_temps_are_removed_at_the_next_start(tmp_path):
    from splatpainter.train.config import load_config
    from splatpainter.train.loop import CHECKPOINT, train
    from splatpainter.web.store import SessionStore

    out = tmp_path / "run"
    out.mkdir()
    stale = out / f".{CHECKPOINT}.k3j_x9a2.tmp"  # what a run killed mid-save leaves
    stale.write_bytes(b"half a checkpoint")
    keep = out / "notes.tmp"  # not one of ours
    keep.write_text("mine")
    cfg = load_config(TINY)
    cfg.data.cache_dir = str(tmp_path / "cache")
    cfg.optim.steps = 1
    train(cfg, out)
    assert not stale.exists() and keep.exists()

    sid = "0" * 32
    (tmp_path / "web" / "sessions" / sid).mkdir(parents=True)
    stale = tmp_path / "web" / "sessions" / sid / ".session.pt.abcd1234.tmp"
    stale.write_bytes(b"half a session")
    SessionStore(tmp_path / "web", make_method=lambda: None)
    assert not stale.exists()


def test_convert_into_an_unwritable_folder_names_the_output(tmp_path, monkeypatch):
    import tempfile

    from typer.testing import CliRunner

    from splatpainter.cli import app

    src = Path(__file__).resolve().parents[2] / "src" / "splatpainter" / "data" / "demo.ply"
    dst = tmp_path / "ro" / "out.ply"
    dst.parent.mkdir()

    def refuse(prefix="", suffix="", dir=None, **_):  # as mkstemp fails in a read-only folder
        raise PermissionError(13, "Permission denied", f"{dir}/{prefix}x1y2z3w4{suffix}")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    r = CliRunner().invoke(app, ["convert", str(src), str(dst)])
    assert r.exit_code == 2, r.output
    assert str(dst) in r.stderr and ".tmp" not in r.stderr, r.stderr
