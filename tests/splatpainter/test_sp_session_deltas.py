"""Session memory at capture scale (#22): entries other than the first and the current one keep
only the rows their edit changed; undo, redo, goto, rollback, saving and replacing an entry's
asset give back the very assets the edits made, bit for bit."""

from __future__ import annotations

import gc

import torch

from splatpainter.assets.procedural import make_demo_asset
from splatpainter.camera import orbit_cameras
from splatpainter.edit import BackprojectMethod, EditSession, EditView
from splatpainter.edit.methods import EditMethod, write_back
from splatpainter.edit.session import _RowDelta
from splatpainter.render import render

SIZE = 48


class Recolour(EditMethod):
    """Every Gaussian's SH DC changes (a whole-asset edit: not worth a delta)."""

    name = "recolour"

    def apply(self, asset, views, state):
        sh = asset.sh.clone()
        sh[:, 0] = sh[:, 0] * 0.5 + 0.1
        return asset.replace(sh=sh), state


def scene():
    asset = make_demo_asset(1500, seed=0).asset.with_sh_degree(1)
    cams = orbit_cameras(asset, 4, width=SIZE, height=SIZE, margin=0.8)
    return asset, cams


def stroke(asset, cam, color, box) -> EditView:
    img = render(asset, cam).rgb.clamp(0, 1).clone()
    y0, y1, x0, x1 = box
    img[y0:y1, x0:x1] = torch.tensor(color)
    return EditView(cam, img)


def bits(asset) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in asset.tensors().items()}


def assert_bits(asset, want: dict[str, torch.Tensor]) -> None:
    for k, v in asset.tensors().items():
        assert torch.equal(v.view(torch.int32), want[k].view(torch.int32)), k


def strokes(session, cams, n: int) -> list[dict[str, torch.Tensor]]:
    """n small strokes; the bits of every asset the session went through (the loaded one
    first)."""
    seen = [bits(session.asset)]
    for i in range(n):
        cam = cams[i % len(cams)]
        color = (1.0, 0.2 * i, 1.0 - 0.2 * i)
        session.apply(stroke(session.asset, cam, color, (10 + 3 * i, 22 + 3 * i, 12, 26)))
        seen.append(bits(session.asset))
    return seen


def test_entries_keep_only_changed_rows_and_undo_redo_goto_give_the_same_bits():
    asset, cams = scene()
    session = EditSession(asset, BackprojectMethod())
    seen = strokes(session, cams, 4)
    gc.collect()
    entries = session.entries
    assert entries[0]._asset is not None and entries[-1]._asset is not None
    for e in entries[1:-1]:  # released: a delta of a few rows, no asset
        assert e._asset is None and e._ref() is None
        rows = e._delta.rows["sh"][0]
        assert 0 < rows.numel() < asset.num_gaussians // 5
        assert set(e._delta.rows) == {"sh"}  # geometry is shared, never stored
    for i in range(4, -1, -1):  # undo all the way
        assert_bits(session.asset, seen[i])
        if i:
            session.undo()
    for i in range(1, 5):  # redo all the way
        session.redo()
        assert_bits(session.asset, seen[i])
    for i in (2, 0, 4, 1, 3):  # jumps
        session.goto(i)
        assert_bits(session.asset, seen[i])
        assert session.changed_gaussians(i) == (
            0 if i == 0 else int((seen[i]["sh"] != seen[i - 1]["sh"]).flatten(1).any(1).sum())
        )
    for i, e in enumerate(session.entries):  # any entry, held or not
        assert_bits(e.asset, seen[i])


def test_a_held_asset_keeps_its_identity_and_a_branch_drops_the_redo_entries():
    asset, cams = scene()
    session = EditSession(asset, BackprojectMethod())
    strokes(session, cams, 2)
    first = session.entries[1].asset  # rebuilt, and now held here
    session.apply(stroke(session.asset, cams[2], (0.0, 1.0, 0.0), (5, 15, 5, 15)))
    assert session.entries[1].asset is first  # held: the same object, not a new rebuild
    session.undo()
    session.undo()
    mark = session.mark()
    seen = bits(session.asset)
    session.apply(stroke(session.asset, cams[3], (0.0, 0.0, 1.0), (30, 40, 30, 40)))
    assert len(session.entries) == 3
    session.rollback(mark)
    assert_bits(session.asset, seen)
    session.redo()
    session.redo()
    assert session.index == 3


def test_whole_asset_edits_keep_their_asset_and_mix_with_deltas():
    asset, cams = scene()
    session = EditSession(asset, BackprojectMethod())
    seen = strokes(session, cams, 1)
    session.apply(stroke(session.asset, cams[0], (1, 1, 0), (0, 1, 0, 1)), method=Recolour())
    seen.append(bits(session.asset))
    seen += strokes(session, cams, 2)[1:]
    gc.collect()
    recoloured = session.entries[2]
    assert recoloured._delta is None and recoloured._asset is not None  # kept whole
    assert session.entries[1]._asset is None and session.entries[3]._asset is None
    session.goto(0)
    for i, want in enumerate(seen):
        session.goto(i)
        assert_bits(session.asset, want)


def test_replacing_an_entry_s_asset_keeps_the_entries_after_it_right():
    """The web editor replaces the current entry's asset after an edit (a selection-only
    edit): deltas are taken from the asset the entry ends with, and entries that followed a
    replaced asset are rebuilt from the asset they were made from."""
    asset, cams = scene()
    session = EditSession(asset, BackprojectMethod())
    strokes(session, cams, 1)
    keep = torch.zeros(asset.num_gaussians, dtype=torch.bool)
    keep[: asset.num_gaussians // 2] = True
    before = session.entries[0].asset
    session.entries[1].asset = write_back(before, keep, sh=session.asset.sh)
    seen = [bits(before), bits(session.asset)]
    seen += strokes(session, cams, 2)[1:]
    middle = session.entries[2]
    gc.collect()
    assert middle._asset is None
    session.entries[1].asset = session.entries[1].asset.replace(sh=seen[0]["sh"].clone())
    assert middle._asset is not None  # rebuilt from the asset it was made from, and held
    assert_bits(middle.asset, seen[2])
    assert_bits(session.entries[3].asset, seen[3])
    session.goto(1)
    assert_bits(session.asset, seen[0])
    session.goto(2)
    assert_bits(session.asset, seen[2])


def test_a_saved_session_with_released_entries_loads_the_same(tmp_path):
    asset, cams = scene()
    method = BackprojectMethod()
    session = EditSession(asset, method)
    seen = strokes(session, cams, 3)
    session.undo()
    path = tmp_path / "s.pt"
    session.save(path)
    back = EditSession.load(path, method)
    assert back.index == 2 and len(back.entries) == 4
    gc.collect()
    assert back.entries[1]._asset is None and back.entries[3]._asset is None
    for i, e in enumerate(back.entries):
        assert_bits(e.asset, seen[i])
    back.redo()
    assert_bits(back.asset, seen[3])


def test_row_deltas_are_bitwise():
    asset, _ = scene()
    sh = asset.sh.clone()
    sh[3, 0, 0] = -0.0 if float(sh[3, 0, 0]) == 0.0 else sh[3, 0, 0] * 2
    sh[5, 1, 2] = float("nan")
    new = asset.replace(sh=sh)
    delta = _RowDelta.between(asset, new)
    assert delta.rows["sh"][0].tolist() == [3, 5]
    assert_bits(delta.apply(asset, forward=True), bits(new))
    assert_bits(delta.apply(new, forward=False), bits(asset))
    assert _RowDelta.between(asset, asset.subset(slice(0, 10))) is None
