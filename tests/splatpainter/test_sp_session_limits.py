"""Session files are bounded both ways (issue #25, item 13): a save grows with what the session
really holds (a record shared by many entries stays one record), and a read refuses, in one
line and before allocating, a file that claims more than it holds or more than the stated
limits allow. The issue's case: 1.3 MB with 20,000 entries sharing one record re-saved as
566 MB."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

import pytest
import torch

import splatpainter.edit.session as session_mod
from splatpainter.assets.procedural import make_demo_asset
from splatpainter.camera import orbit_cameras
from splatpainter.edit import BackprojectMethod, EditSession, EditView
from splatpainter.edit.session import SessionError, StoredSession, _asset_to_dict
from splatpainter.render import render

SIZE = 48
KiB = 1024


@pytest.fixture(scope="module")
def scene():
    asset = make_demo_asset(1500, seed=0).asset.with_sh_degree(3)
    return asset, orbit_cameras(asset, 4, width=SIZE, height=SIZE, margin=0.8)


def painted(asset, cam, color: tuple[float, float, float]) -> torch.Tensor:
    """An 8-bit edit (what a browser or PNG gives): a square of `color` on the render."""
    img = (render(asset, cam).rgb.clamp(0, 1) * 255).round() / 255
    img[18:26, 18:26] = torch.tensor(color)
    return img


def asset_bytes(asset) -> int:
    return sum(t.numel() * t.element_size() for t in _asset_to_dict(asset).values())


def view_bytes(view: EditView) -> int:
    """A view's images as a session stores them: 1 byte a value when 8-bit, else their own."""
    out = 0
    for t in (view.image, view.mask):
        if t is not None:
            eight_bit = t.is_floating_point() and torch.equal((t * 255).round() / 255, t)
            out += t.numel() * (1 if eight_bit else t.element_size())
    return out


def size(path: Path) -> int:
    return path.stat().st_size


# Fixed costs of the formula: the archive's own records and the pickled method description (C0),
# one entry's pickle, record headers and 64-byte record alignment (C1).
C0, C1 = 16 * KiB, 2 * KiB


def test_save_size_is_bounded_by_the_real_content(scene, tmp_path):
    """size <= B + sum_i (r_i (8 + G) + V_i) + C0 + N C1 for N edits, where B is the asset's
    bytes, G = B / Gaussians its bytes per Gaussian, r_i the Gaussians edit i changed (an int64
    index each, plus at most their whole row) and V_i edit i's view images at 8 bits. A no-op
    session (N = 0) is the asset plus C0."""
    asset, cams = scene
    s = EditSession(asset, BackprojectMethod())
    B = asset_bytes(asset)
    G = B // asset.num_gaussians
    s.save(tmp_path / "noop.sps")
    assert size(tmp_path / "noop.sps") <= B + C0
    bound = B + C0
    for i, color in enumerate([(1.0, 0, 1.0), (0, 1.0, 0), (0, 0, 1.0), (1.0, 1.0, 0)]):
        view = EditView(cams[i], painted(s.asset, cams[i], color))
        s.apply(view)
        r = s.changed_gaussians(s.index)
        assert 0 < r < asset.num_gaussians / 10  # a real, local edit
        bound += r * (8 + G) + view_bytes(view) + C1
        s.save(tmp_path / f"{i}.sps")
        assert size(tmp_path / f"{i}.sps") <= bound, i


def test_one_view_applied_many_times_is_stored_once(scene, tmp_path):
    """The same view object in N entries (an edit that changes nothing, repeated) costs one
    view plus N entries' bookkeeping, not N views."""
    asset, cams = scene
    s = EditSession(asset, BackprojectMethod())
    view = EditView(cams[0], (render(asset, cams[0]).rgb.clamp(0, 1) * 255).round() / 255)
    n = 40
    for _ in range(n):
        s.apply(view)
    assert all(s.changed_gaussians(i) == 0 for i in range(1, n + 1))
    s.save(tmp_path / "same.sps")
    assert view_bytes(view) > 3 * C1  # so that n copies could not pass the bound below
    assert size(tmp_path / "same.sps") <= asset_bytes(asset) + C0 + view_bytes(view) + n * C1
    loaded = EditSession.load(tmp_path / "same.sps", BackprojectMethod())
    assert len({id(e.views[0]) for e in loaded.entries[1:]}) == 1  # one object in memory too
    assert torch.equal(loaded.entries[n].views[0].image, view.image)


def crafted(scene, tmp_path: Path, n: int, *, with_delta: bool, name: str = "c.sps") -> Path:
    """A real one-edit session whose edit entry is repeated n times as ONE shared record (the
    issue's crafted file); with_delta keeps the entry's row delta, else only its view."""
    asset, cams = scene
    s = EditSession(asset, BackprojectMethod())
    s.apply(EditView(cams[1], painted(asset, cams[1], (1.0, 0, 1.0))))
    d = s.to_dict()
    entry = d["entries"][1]
    if not with_delta:
        entry["delta"] = {}
    d["entries"] = [d["entries"][0]] + [entry] * n
    d["index"] = n
    path = tmp_path / name
    torch.save(d, path)
    return path


def test_shared_records_stay_shared_when_resaved(scene, tmp_path):
    """Load + save (the editor, `splatpainter edit --session`) and read + write (`session
    undo|redo`) of a file whose 200 entries share one record: the new file is the old one plus
    at most C1 an entry, where unsharing the view would add ~7 KB an entry."""
    n = 200
    path = crafted(scene, tmp_path, n, with_delta=True)
    s = EditSession.load(path, BackprojectMethod())
    assert s.index == n
    s.save(tmp_path / "resaved.sps")
    assert size(tmp_path / "resaved.sps") <= size(path) + n * C1
    stored = StoredSession.read(path)
    stored.move(-1)
    stored.write(tmp_path / "rewritten.sps")
    assert size(tmp_path / "rewritten.sps") <= size(path) + C1
    assert StoredSession.read(tmp_path / "rewritten.sps").index == n - 1


def one_line(excinfo: pytest.ExceptionInfo) -> str:
    msg = str(excinfo.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def test_too_many_entries_are_refused_before_any_is_rebuilt(scene, tmp_path):
    """The issue's file: 20,000 entries sharing one record, a small file, refused by every
    reader (show/undo/export and the editor) with the count and the limit."""
    path = crafted(scene, tmp_path, 20_000, with_delta=False)
    assert size(path) < 2 << 20
    with pytest.raises(SessionError) as e:
        StoredSession.read(path)
    assert "20,001 history entries is over the 10,000-entry limit" in one_line(e)
    with pytest.raises(SessionError, match="10,000-entry limit"):
        EditSession.load(path, BackprojectMethod())


def test_rebuild_over_the_memory_limit_is_refused(scene, tmp_path, monkeypatch):
    """Entries sharing one row delta each rebuild a copy of the tensor it patches: the read
    adds those copies up from the shapes (100 x the SH tensor here) and refuses a total over
    MAX_SESSION_REBUILD_BYTES before rebuilding anything; under the limit the file loads."""
    asset, _ = scene
    path = crafted(scene, tmp_path, 100, with_delta=True)
    sh = asset_bytes(asset) - sum(
        t.numel() * t.element_size() for k, t in _asset_to_dict(asset).items() if k != "sh"
    )
    need = 100 * sh + 4 * SIZE * SIZE * 3  # the copies, and the one view's image as float32
    monkeypatch.setattr(session_mod, "MAX_SESSION_REBUILD_BYTES", need - 1)
    with pytest.raises(SessionError) as e:
        StoredSession.read(path)
    assert f"would allocate {need:,} bytes, over the {need - 1:,}-byte limit" in one_line(e)
    monkeypatch.setattr(session_mod, "MAX_SESSION_REBUILD_BYTES", need)
    assert EditSession.load(path, BackprojectMethod()).index == 100


def _rewrite_zip(src: Path, dst: Path, compression: int) -> None:
    with zipfile.ZipFile(src) as z:
        records = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(dst, "w", compression=compression) as out:
        for name, data in records:
            out.writestr(name, data)


def _claim_size(src: Path, dst: Path, record_suffix: str, claimed: int) -> None:
    """Copy src with the central directory claiming `claimed` bytes for one record."""
    data = bytearray(src.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        name_len = struct.unpack_from("<H", data, at + 28)[0]
        if bytes(data[at + 46 : at + 46 + name_len]).decode().endswith(record_suffix):
            struct.pack_into("<II", data, at + 20, claimed, claimed)  # compressed, uncompressed
            dst.write_bytes(bytes(data))
            return
        at = data.find(b"PK\x01\x02", at + 4)
    raise AssertionError(f"no record {record_suffix} in {src}")


def test_archives_claiming_more_than_they_hold_are_refused(scene, tmp_path, monkeypatch):
    """Checked from the zip directory before torch reads a record: a compressed record (a
    zip bomb torch would inflate; torch.save never compresses), a record claiming more bytes
    than the file has, a legacy pickle (whose storages torch allocates at their claimed size),
    and files over the size and record-count limits."""
    good = crafted(scene, tmp_path, 1, with_delta=True, name="good.sps")
    assert StoredSession.read(good).index == 1

    bomb = tmp_path / "bomb.sps"
    _rewrite_zip(good, bomb, zipfile.ZIP_DEFLATED)
    with pytest.raises(SessionError) as e:
        StoredSession.read(bomb)
    assert "damaged session file (record" in one_line(e) and "is compressed" in str(e.value)

    liar = tmp_path / "liar.sps"
    _claim_size(good, liar, "data.pkl", 2_000_000_000)
    with pytest.raises(SessionError) as e:
        StoredSession.read(liar)
    assert "claims 2,000,000,000 bytes, more than the" in one_line(e)

    legacy = tmp_path / "legacy.sps"
    torch.save(torch.load(good, weights_only=True), legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(SessionError) as e:
        StoredSession.read(legacy)
    assert "a legacy torch pickle" in one_line(e)

    monkeypatch.setattr(session_mod, "MAX_SESSION_RECORDS", 3)
    with pytest.raises(SessionError) as e:
        StoredSession.read(good)
    assert "records is over the 3-record limit" in one_line(e)
    monkeypatch.setattr(session_mod, "MAX_SESSION_BYTES", 1000)
    with pytest.raises(SessionError) as e:
        EditSession.load(good, BackprojectMethod())
    assert "is over the 1,000-byte limit for a session file" in one_line(e)
