"""Issue 13 defects, one test each: assets that overflow once activated, files that do not
match their header, writes that would not load back, and hostile CLI inputs (one line, exit 2).
"""

import io
import os

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from splatpainter.assets.gaussians import GaussianAsset
from splatpainter.camera import orbit_cameras, save_camera
from splatpainter.cli import app
from splatpainter.io import (
    AssetFormatError,
    load_asset,
    ply_from_bytes,
    ply_to_bytes,
    save_asset,
    splat_from_bytes,
    write_ply,
)
from splatpainter.io.images import ImageInputError, load_image

runner = CliRunner()


def asset(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return GaussianAsset(
        means=torch.rand(n, 3, generator=g) - 0.5,
        quats=torch.randn(n, 4, generator=g),
        log_scales=torch.rand(n, 3, generator=g) * 2 - 5,
        opacity_logits=torch.randn(n, generator=g),
        sh=torch.rand(n, 1, 3, generator=g),
    )


def cli(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in r.output
    return r


def one_line_error(r, needle):
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr


# ---------------------------------------------------------------- values after activation
def ply_with_value(column, row, value):
    """A float32 PLY of asset() whose `column` of Gaussian `row` holds value (as another
    program could write it)."""
    head, body = ply_to_bytes(asset()).split(b"end_header\n", 1)
    cols = [ln.split()[-1] for ln in head.decode().splitlines() if ln.startswith("property")]
    table = np.frombuffer(body, dtype="<f4").reshape(6, len(cols)).copy()
    table[row, cols.index(column)] = value
    return head + b"end_header\n" + table.tobytes()


@pytest.mark.parametrize(
    ("field", "index", "column", "value", "needle"),
    [
        ("log_scales", (0, 1), "scale_1", 1e6, "log-scale of Gaussian 0"),  # exp -> inf
        ("log_scales", (2, 0), "scale_0", -1e3, "log-scale of Gaussian 2"),  # exp -> 0
        ("means", (3, 2), "z", 3e38, "position of Gaussian 3"),  # squares overflow
        ("quats", (1, 0), "rot_0", 3e38, "quaternion of Gaussian 1"),  # norm overflows
        ("sh", (4, 0, 1), "f_dc_1", 3e38, "SH coefficient of Gaussian 4"),
    ],
)
def test_finite_values_that_overflow_are_refused_at_load_and_write(
    tmp_path, field, index, column, value, needle
):
    a = asset()
    getattr(a, field)[index] = value
    for name in ("x.ply", "x.splat"):
        with pytest.raises(AssetFormatError, match=needle):
            save_asset(a, tmp_path / name)  # refused before anything is written
        assert not (tmp_path / name).exists()
    bad = tmp_path / "bad.ply"
    bad.write_bytes(ply_with_value(column, index[0], value))
    with pytest.raises(AssetFormatError, match=needle):
        load_asset(bad)
    r = cli("info", bad)
    one_line_error(r, needle)


def test_zero_quaternion_refused(tmp_path):
    a = asset()
    a.quats[2] = 0.0
    with pytest.raises(AssetFormatError, match="Gaussian 2"):
        save_asset(a, tmp_path / "z.splat")
    assert not (tmp_path / "z.splat").exists()


def test_empty_splat_is_never_written(tmp_path):
    empty = asset().subset(slice(0, 0))
    with pytest.raises(AssetFormatError, match="no Gaussians"):
        save_asset(empty, tmp_path / "e.splat")
    assert not (tmp_path / "e.splat").exists()
    save_asset(empty, tmp_path / "e.ply")  # an empty .ply is valid and loads back
    assert load_asset(tmp_path / "e.ply").num_gaussians == 0


# ---------------------------------------------------------------- declared count == data
def test_binary_ply_trailing_bytes_and_short_counts_refused():
    raw = ply_to_bytes(asset())
    with pytest.raises(AssetFormatError, match="4 bytes after the declared elements"):
        ply_from_bytes(raw + b"\0\0\0\0")
    short = raw.replace(b"element vertex 6\n", b"element vertex 5\n")
    with pytest.raises(AssetFormatError, match="after the declared elements"):
        ply_from_bytes(short)
    long = raw.replace(b"element vertex 6\n", b"element vertex 7\n")
    with pytest.raises(AssetFormatError, match="truncated"):
        ply_from_bytes(long)


def test_ascii_ply_extra_lines_refused():
    raw = ply_to_bytes(asset(), fmt="ascii")
    last = raw.rstrip(b"\n").rsplit(b"\n", 1)[1]
    with pytest.raises(AssetFormatError, match="1 lines after the declared elements"):
        ply_from_bytes(raw + last + b"\n")
    short = raw.replace(b"element vertex 6\n", b"element vertex 5\n")
    with pytest.raises(AssetFormatError, match="after the declared elements"):
        ply_from_bytes(short)
    assert ply_from_bytes(raw + b"\n\n")[0].num_gaussians == 6  # blank lines are not data


def test_binary_ply_with_a_list_element_after_vertices():
    a = asset()
    raw = ply_to_bytes(a)
    head, body = raw.split(b"end_header\n", 1)
    head += b"element face 2\nproperty list uchar int vertex_indices\n"
    faces = bytes([3]) + np.array([0, 1, 2], "<i4").tobytes()
    faces += bytes([4]) + np.array([2, 3, 4, 5], "<i4").tobytes()
    ok = head + b"end_header\n" + body + faces
    assert ply_from_bytes(ok)[0].num_gaussians == 6
    with pytest.raises(AssetFormatError, match="after the declared elements"):
        ply_from_bytes(ok + b"\0")
    with pytest.raises(AssetFormatError, match="truncated"):
        ply_from_bytes(ok[:-1])


def test_splat_that_loads_is_what_convert_writes(tmp_path):
    """convert never writes a file load rejects: extreme but accepted values round-trip."""
    a = asset()
    a.log_scales[0] = torch.tensor([40.0, -40.0, 0.0])
    a.means[1] = torch.tensor([1e15, -1e15, 0.0])
    a.opacity_logits[2] = 80.0
    for name in ("a.ply", "a.splat"):
        save_asset(a, tmp_path / name)
        load_asset(tmp_path / name)
    src = tmp_path / "a.ply"
    for dst in ("b.splat", "c.ply"):
        r = cli("convert", src, tmp_path / dst)
        assert r.exit_code == 0, r.output
        load_asset(tmp_path / dst)
    splat_from_bytes((tmp_path / "b.splat").read_bytes())


# ---------------------------------------------------------------- hostile CLI inputs
@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    a = asset(50)
    write_ply(a, d / "a.ply")
    cam = orbit_cameras(a, 1, width=32, height=32)[0]
    save_camera(cam, d / "cam.json")
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(d / "img.png")
    return d


def test_render_size_limit_is_immediate(scene):
    r = cli("render", scene / "a.ply", "--orbit", "1", "--size", "60000x60000", "--out", scene)
    one_line_error(r, "the limit is 16,777,216 pixels")
    r = cli("render", scene / "a.ply", "--orbit", "1", "--size", "0x10", "--out", scene)
    one_line_error(r, "must be >= 1")
    # a camera JSON of that size, given to render or to edit, is refused alike
    import json

    cam = json.loads((scene / "cam.json").read_text())
    cam.update(width=60000, height=60000, cx=30000.0, cy=30000.0)
    (scene / "huge_cam.json").write_text(json.dumps(cam))
    r = cli("render", scene / "a.ply", "--camera", scene / "huge_cam.json", "--out", scene / "h")
    one_line_error(r, "the limit is 16,777,216 pixels")
    r = cli(
        "edit", scene / "a.ply", "--view", scene / "huge_cam.json", "--image", scene / "img.png",
        "--method", "backproject", "--out", scene / "h.ply",
    )  # fmt: skip
    one_line_error(r, "huge_cam.json: camera size 60000x60000 is 3,600,000,000 pixels")


def test_render_deep_camera_json(scene):
    deep = scene / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    r = cli("render", scene / "a.ply", "--camera", deep, "--out", scene / "o")
    one_line_error(r, "JSON nested 100000 levels deep")


@pytest.mark.timeout(60)  # a FIFO opened the plain way would block forever
def test_fifo_and_device_assets_do_not_hang(tmp_path):
    fifo = tmp_path / "pipe.ply"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.splat"
    zero.symlink_to("/dev/zero")  # read whole, it would fill the memory
    for path, needle in ((fifo, "is a FIFO"), (zero, "is a character device")):
        one_line_error(cli("info", path), needle)
    out = tmp_path / "o.ply"
    one_line_error(cli("convert", zero, out), "character device")
    assert not out.exists()


@pytest.mark.parametrize(("device", "needle"), [("bogus", "unknown device"), ("cuda", "CUDA")])
def test_device_validation(scene, device, needle):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    r = cli("render", scene / "a.ply", "--orbit", "1", "--out", scene / "o", "--device", device)
    one_line_error(r, needle)


def test_decompression_bomb_png_refused(tmp_path):
    # A 9000x9000 1-bit PNG: tiny on disk, 81M pixels (243 MB as float RGB) once decoded.
    buf = io.BytesIO()
    Image.new("1", (9000, 9000)).save(buf, format="PNG")
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(buf.getvalue())
    assert bomb.stat().st_size < 200_000
    with pytest.raises(ImageInputError, match="9000x9000 is 81,000,000 pixels; the limit"):
        load_image(bomb)


def test_garbage_weights_and_session_files_are_one_line(scene, tmp_path):
    garbage = tmp_path / "w.pt"
    garbage.write_bytes(os.urandom(4096))
    common = ["edit", scene / "a.ply", "--view", scene / "cam.json", "--image", scene / "img.png"]
    r = cli(*common, "--weights", garbage, "--out", tmp_path / "o.ply")
    one_line_error(r, "w.pt")
    st = tmp_path / "w.safetensors"
    st.write_bytes(os.urandom(4096))
    r = cli(*common, "--weights", st, "--out", tmp_path / "o.ply")
    one_line_error(r, "w.safetensors")
    sess = tmp_path / "s.session"
    sess.write_bytes(os.urandom(4096))
    r = cli(*common, "--method", "backproject", "--session", sess, "--out", tmp_path / "o.ply")
    one_line_error(r, "s.session")
    assert not (tmp_path / "o.ply").exists()


def test_edit_session_path_checked_before_out_is_written(scene, tmp_path):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    out = tmp_path / "edited.ply"
    r = cli(
        "edit", scene / "a.ply", "--view", scene / "cam.json", "--image", scene / "img.png",
        "--method", "backproject", "--session", blocker / "s.session", "--out", out,
    )  # fmt: skip
    one_line_error(r, "is not a directory")
    assert not out.exists()


def test_help_shows_choices_and_no_python_types():
    for cmd in ("edit", "render", "evaluate", "convert", "info", "train"):
        r = cli(cmd, "--help")
        assert r.exit_code == 0 and "list[" not in r.stdout and "--json" in r.stdout, cmd
    assert "<model|backproject|optimize>" in cli("edit", "--help").stdout
    assert "<auto|numba|reference|gsplat>" in cli("render", "--help").stdout


@pytest.mark.timeout(60)  # a FIFO opened the plain way would block forever
def test_hostile_session_files_are_one_line_and_honest(tmp_path):
    cases = {
        "garbage.session": (b"\x00garbage" * 512, "not a torch archive"),
        "empty.session": (b"", "an empty file"),
    }
    for name, (data, _) in cases.items():
        (tmp_path / name).write_bytes(data)
    torch.save({"x": io.BytesIO}, tmp_path / "objects.session")
    cases["objects.session"] = (None, "a safe load refuses")
    os.mkfifo(tmp_path / "fifo.session")
    cases["fifo.session"] = (None, "is a FIFO")
    (tmp_path / "zero.session").symlink_to("/dev/zero")
    cases["zero.session"] = (None, "is a character device")
    for name, (_, needle) in cases.items():
        for cmd in (["show"], ["undo"], ["export", tmp_path / "o.ply"]):
            r = cli("session", cmd[0], tmp_path / name, *cmd[1:])
            one_line_error(r, needle)
            assert "weights_only" not in r.stderr  # never torch's advice to unpickle unsafely
    assert not (tmp_path / "o.ply").exists()
    from splatpainter.model.editor import CheckpointError, load_weights

    for name, (_, needle) in cases.items():  # torch-format weights are read the same way
        with pytest.raises(CheckpointError, match=needle) as err:
            load_weights(tmp_path / name)
        assert "weights_only" not in str(err.value) and "\n" not in str(err.value)


def test_edit_session_in_an_unwritable_directory_writes_nothing(scene, tmp_path):
    """/proc refuses new files even to root, so this holds whoever runs the tests."""
    out = tmp_path / "edited.ply"
    r = cli(
        "edit", scene / "a.ply", "--view", scene / "cam.json", "--image", scene / "img.png",
        "--method", "backproject", "--session", "/proc/edit.session", "--out", out,
    )  # fmt: skip
    one_line_error(r, "cannot write in /proc")
    assert not out.exists()
