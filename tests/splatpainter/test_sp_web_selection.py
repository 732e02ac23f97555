"""3D selection in the browser editor, over real HTTP against `splatpainter serve`: box, sphere
and screen-space brush selections, invert, an edit limited to the selection, delete and an exact
colour adjustment of it, both undoable."""

import colorsys

import numpy as np
import pytest

pytest.importorskip("fastapi")

from splatpainter.assets.gaussians import SH_C0
from splatpainter.io import load_asset, ply_from_bytes
from splatpainter.web.harness import TEST_VIEW as VIEW
from splatpainter.web.harness import ServerProcess, new_session
from splatpainter.web.harness import http_call as call
from splatpainter.web.harness import paint_body as edit_body
from splatpainter.web.harness import png_data_url as png
from splatpainter.web.harness import server_frame as frame

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def server(asset_file, tmp_path_factory):
    with ServerProcess(tmp_path_factory.mktemp("work"), asset_file) as s:
        yield s


SIZE = 64


def select(url, sid, **body) -> int:
    status, answer = call(url, "POST", f"/api/sessions/{sid}/selection", body)
    assert status == 200, answer
    return answer["selected"]


def exported(url, sid):
    status, data = call(url, "GET", f"/api/sessions/{sid}/export?format=ply")
    assert status == 200
    return ply_from_bytes(data)[0]


def test_box_sphere_brush_and_invert_select_what_they_say(server, asset_file):
    means = load_asset(asset_file).means.double().numpy()
    sid = new_session(server.url)["id"]
    lo, hi = np.percentile(means, 20, 0), np.percentile(means, 70, 0)
    in_box = ((means >= lo) & (means <= hi)).all(-1)
    assert 0 < in_box.sum() < len(means)
    assert select(server.url, sid, box={"min": lo.tolist(), "max": hi.tolist()}) == in_box.sum()
    centre, radius = means.mean(0), float(np.linalg.norm(means.std(0)))
    in_ball = ((means - centre) ** 2).sum(-1) <= radius**2
    ball = {"centre": centre.tolist(), "radius": radius}
    assert select(server.url, sid, sphere=ball, mode="add") == (in_box | in_ball).sum()
    assert select(server.url, sid, sphere=ball, mode="subtract") == (in_box & ~in_ball).sum()
    assert select(server.url, sid, op="invert") == (~(in_box & ~in_ball)).sum()
    assert (
        call(server.url, "GET", f"/api/sessions/{sid}")[1]["selected"]
        == (~(in_box & ~in_ball)).sum()
    )
    assert select(server.url, sid, op="none") == 0
    # the brush: the halves of the view add up to the whole view, and nothing is nothing
    view = {**VIEW, "width": SIZE, "height": SIZE}
    left = np.zeros((SIZE, SIZE), np.uint8)
    left[:, : SIZE // 2] = 255
    whole = select(server.url, sid, brush={"view": view, "mask": png(np.full_like(left, 255))})
    assert 0 < whole <= len(means)
    n_left = select(server.url, sid, brush={"view": view, "mask": png(left)})
    n_right = select(server.url, sid, brush={"view": view, "mask": png(255 - left)})
    assert 0 < n_left < whole and 0 < n_right < whole and n_left + n_right == whole
    assert select(server.url, sid, brush={"view": view, "mask": png(left)}, mode="add") == whole
    assert select(server.url, sid, brush={"view": view, "mask": png(0 * left)}) == 0
    for body, words in [
        ({"box": {"min": [0, 0], "max": [1, 1, 1]}}, "box.min"),
        ({"box": {"min": [1, 1, 1], "max": [0, 0, 0]}}, "exceed"),
        ({"sphere": {"centre": [0, 0, 0], "radius": -1}}, "radius"),
        ({"op": "everything"}, "op must be"),
        ({"op": "all", "box": {}}, "exactly one"),
        ({"op": "all", "mode": "xor"}, None),  # op ignores mode
        ({"brush": {"view": view}}, "brush.mask"),
        ({"sphere": {"centre": [0, 0, 0], "radius": 1}, "mode": "xor"}, "mode"),
    ]:
        status, answer = call(server.url, "POST", f"/api/sessions/{sid}/selection", body)
        if words is None:
            assert status == 200, answer
        else:
            assert status == 400 and words in answer["detail"], (body, status, answer)


def test_an_edit_limited_to_the_selection_changes_only_it(server, asset_file):
    original = load_asset(asset_file)
    means = original.means.double().numpy()
    sid = new_session(server.url)["id"]
    body = edit_body(server.url, sid, 0)
    status, answer = call(
        server.url, "POST", f"/api/sessions/{sid}/apply", {**body, "selection_only": True}
    )
    assert status == 400 and "nothing is selected" in answer["detail"]
    # the same edit unrestricted, then undone: which Gaussians it changes
    status, info = call(server.url, "POST", f"/api/sessions/{sid}/apply", body)
    assert status == 200 and info["changed"]
    free = exported(server.url, sid)
    touched = (free.sh.numpy() != original.sh.numpy()).any((1, 2))
    assert touched.sum() > 20
    call(server.url, "POST", f"/api/sessions/{sid}/undo", {"revision": 1})
    # select the touched Gaussians on one side of their median x only
    x = means[:, 0]
    split = float(np.median(x[touched]))
    big = 1e6
    box = {"min": [-big, -big, -big], "max": [split, big, big]}
    chosen = x <= split
    select(server.url, sid, box=box)
    status, info = call(
        server.url,
        "POST",
        f"/api/sessions/{sid}/apply",
        {**edit_body(server.url, sid, 2), "selection_only": True},
    )
    assert status == 200 and info["changed"], info
    limited = exported(server.url, sid)
    changed = (limited.sh.numpy() != original.sh.numpy()).any((1, 2))
    assert changed.any() and not changed[~chosen].any()  # nothing outside the selection
    assert (changed == (touched & chosen)).all()  # inside, what the edit touched
    np.testing.assert_array_equal(limited.sh.numpy()[changed], free.sh.numpy()[changed])


def test_delete_and_adjust_the_selection_exactly_and_undo_them(server, asset_file):
    original = load_asset(asset_file)
    means = original.means.double().numpy()
    sid = new_session(server.url)["id"]
    status, answer = call(
        server.url, "POST", f"/api/sessions/{sid}/selection/delete", {"revision": 0}
    )
    assert status == 400 and "nothing is selected" in answer["detail"]
    before = frame(server.url, sid)
    centre = means.mean(0)
    radius = float(np.linalg.norm(means.std(0))) * 0.6
    chosen = ((means - centre) ** 2).sum(-1) <= radius**2
    select(server.url, sid, sphere={"centre": centre.tolist(), "radius": radius})

    # an exact colour adjustment: HSV of the base colour, by colorsys, on the selection only
    adj = {"revision": 0, "hue": 120, "saturation": 0.5, "brightness": 1.25}
    status, info = call(server.url, "POST", f"/api/sessions/{sid}/selection/adjust", adj)
    assert (
        status == 200
        and info["revision"] == 1
        and info["history"][1]["label"].startswith(f"adjust {chosen.sum()}")
    )
    got = exported(server.url, sid)
    dc0, dc1 = original.sh.numpy()[:, 0].astype(np.float64), got.sh.numpy()[:, 0]
    np.testing.assert_array_equal(got.sh.numpy()[~chosen], original.sh.numpy()[~chosen])
    for i in np.flatnonzero(chosen):
        r, g, b = np.maximum(0.5 + SH_C0 * dc0[i], 0.0)
        h, s, v = colorsys.rgb_to_hsv(r, g, b)
        want = colorsys.hsv_to_rgb((h + 120 / 360) % 1.0, min(s * 0.5, 1.0), v * 1.25)
        np.testing.assert_allclose(0.5 + SH_C0 * dc1[i], want, atol=1e-5)
    adjusted = frame(server.url, sid)
    assert np.abs(adjusted.astype(int) - before).max() > 30

    # delete: the selection vanishes from the render, undo brings it back bit for bit
    status, info = call(
        server.url, "POST", f"/api/sessions/{sid}/selection/delete", {"revision": 1}
    )
    assert (
        status == 200
        and info["revision"] == 2
        and info["history"][2]["changed_gaussians"] == (chosen.sum())
    )
    gone = exported(server.url, sid)
    assert (gone.opacities().numpy()[chosen] < 1e-9).all()
    np.testing.assert_array_equal(
        gone.opacity_logits.numpy()[~chosen], original.opacity_logits.numpy()[~chosen]
    )
    deleted = frame(server.url, sid)
    assert np.abs(deleted.astype(int) - adjusted).max() > 30
    status, info = call(server.url, "POST", f"/api/sessions/{sid}/undo", {"revision": 2})
    assert status == 200 and info["index"] == 1
    assert np.array_equal(frame(server.url, sid), adjusted)
    status, info = call(server.url, "POST", f"/api/sessions/{sid}/undo", {"revision": 3})
    assert np.array_equal(frame(server.url, sid), before)
    # the selection outlives undo (it names Gaussians, whose order never changes)
    assert info["selected"] == chosen.sum()
    status, answer = call(
        server.url, "POST", f"/api/sessions/{sid}/selection/adjust", {"revision": 4, "hue": 999}
    )
    assert status == 400 and "hue" in answer["detail"]
    # an adjustment that changes nothing, and deleting what is already deleted, add no entry
    status, info = call(
        server.url, "POST", f"/api/sessions/{sid}/selection/adjust", {"revision": 4, "hue": 0}
    )
    assert status == 200 and not info["changed"] and info["revision"] == 4
    assert len(info["history"]) == 3 and info["index"] == 0
    status, info = call(server.url, "POST", f"/api/sessions/{sid}/goto/2", {"revision": 4})
    assert status == 200 and info["revision"] == 5
    status, info = call(
        server.url, "POST", f"/api/sessions/{sid}/selection/delete", {"revision": 5}
    )
    assert status == 200 and not info["changed"] and info["revision"] == 5
    assert len(info["history"]) == 3 and info["index"] == 2
