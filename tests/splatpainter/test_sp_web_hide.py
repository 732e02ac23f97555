"""Hide and unhide of the 3D selection, the selection's highlight in server frames, and the
selection kept across a server restart, over real HTTP against `splatpainter serve`; plus the
clear 4xx answers to bad requests of these endpoints."""

import urllib.request

import numpy as np
import pytest

pytest.importorskip("fastapi")

from splatpainter.io import load_asset
from splatpainter.web.harness import TEST_VIEW as VIEW
from splatpainter.web.harness import ServerProcess, new_session
from splatpainter.web.harness import http_call as call
from splatpainter.web.harness import paint_body as edit_body
from splatpainter.web.harness import server_frame as frame

SIZE = 64


def select(url: str, sid: str, **body) -> int:
    status, answer = call(url, "POST", f"/api/sessions/{sid}/selection", body)
    assert status == 200, answer
    return answer["selected"]


pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def server(asset_file, tmp_path_factory):
    with ServerProcess(tmp_path_factory.mktemp("work"), asset_file) as s:
        yield s


def export(url: str, sid: str, hidden: str = "keep"):
    """The exported asset and the X-Hidden-Gaussians count."""
    from splatpainter.io import ply_from_bytes

    with urllib.request.urlopen(f"{url}api/sessions/{sid}/export?format=ply&hidden={hidden}") as r:
        return ply_from_bytes(r.read())[0], int(r.headers["X-Hidden-Gaussians"])


def post(url: str, sid: str, path: str, body: dict):
    return call(url, "POST", f"/api/sessions/{sid}/{path}", body)


def test_hide_is_undoable_unhide_is_bit_exact_and_edits_skip_hidden(server, asset_file):
    original = load_asset(asset_file)
    means = original.means.double().numpy()
    sid = new_session(server.url)["id"]
    status, answer = post(server.url, sid, "selection/hide", {"revision": 0})
    assert status == 400 and "nothing is selected" in answer["detail"]
    before = frame(server.url, sid)
    centre = means.mean(0)
    radius = float(np.linalg.norm(means.std(0))) * 0.6
    chosen = ((means - centre) ** 2).sum(-1) <= radius**2
    assert 0 < chosen.sum() < len(means)
    select(server.url, sid, sphere={"centre": centre.tolist(), "radius": radius})

    status, info = post(server.url, sid, "selection/hide", {"revision": 0})
    assert status == 200 and info["changed"] and info["hidden"] == chosen.sum(), info
    assert info["history"][1]["label"] == f"hide {chosen.sum()}"
    assert np.abs(frame(server.url, sid).astype(int) - before).max() > 30
    # the export keeps hidden Gaussians as they were (default) or writes them as deleted
    kept, n = export(server.url, sid)
    assert n == chosen.sum()
    for name in ("means", "quats", "log_scales", "opacity_logits", "sh"):
        assert np.array_equal(getattr(kept, name).numpy(), getattr(original, name).numpy()), name
    gone, _ = export(server.url, sid, "delete")
    assert (gone.opacities().numpy()[chosen] < 1e-9).all()
    assert np.array_equal(gone.opacity_logits.numpy()[~chosen], original.opacity_logits[~chosen])
    # hiding what is hidden adds nothing; hidden Gaussians are not deleted or adjusted
    status, info = post(server.url, sid, "selection/hide", {"revision": 1})
    assert status == 200 and not info["changed"] and info["revision"] == 1
    status, answer = post(server.url, sid, "selection/adjust", {"revision": 1, "hue": 90})
    assert status == 400 and "every selected Gaussian is hidden" in answer["detail"]
    select(server.url, sid, op="all")
    status, info = post(server.url, sid, "selection/adjust", {"revision": 1, "hue": 120})
    assert status == 200 and info["history"][2]["changed_gaussians"] == (~chosen).sum()
    # nor edited by an applied edit (the model changes unseen Gaussians too, so without the
    # guard it would change hidden ones)
    status, info = post(server.url, sid, "apply", edit_body(server.url, sid, 2, "model"))
    assert status == 200 and info["changed"], info
    edited, _ = export(server.url, sid)
    assert np.array_equal(edited.sh.numpy()[chosen], original.sh.numpy()[chosen])
    assert (edited.sh.numpy()[~chosen] != original.sh.numpy()[~chosen]).any()

    # unhide: every hidden Gaussian back with its own opacity, bit for bit; undoable
    status, info = post(server.url, sid, "unhide", {"revision": 3})
    assert status == 200 and info["changed"] and info["hidden"] == 0
    assert info["history"][4]["changed_gaussians"] == chosen.sum()
    shown, n = export(server.url, sid, "delete")
    assert n == 0
    assert np.array_equal(shown.opacity_logits.numpy(), original.opacity_logits.numpy())
    status, info = post(server.url, sid, "unhide", {"revision": 4})
    assert status == 200 and not info["changed"] and info["revision"] == 4
    status, info = post(server.url, sid, "undo", {"revision": 4})
    assert status == 200 and info["hidden"] == chosen.sum()
    status, info = post(server.url, sid, "goto/0", {"revision": 5})
    assert status == 200 and info["hidden"] == 0
    assert np.array_equal(frame(server.url, sid), before)

    # a part of the hidden ones shown again: only those in the selection
    select(server.url, sid, sphere={"centre": centre.tolist(), "radius": radius})
    post(server.url, sid, "selection/hide", {"revision": 6})
    half = means[:, 0] <= float(np.median(means[chosen, 0]))
    big = 1e6
    select(
        server.url,
        sid,
        box={"min": [-big, -big, -big], "max": [float(np.median(means[chosen, 0])), big, big]},
    )
    status, info = post(server.url, sid, "unhide", {"revision": 7, "selection_only": True})
    assert status == 200 and info["hidden"] == (chosen & ~half).sum()
    part, _ = export(server.url, sid, "delete")
    visible = ~(chosen & ~half)
    assert np.array_equal(part.opacity_logits.numpy()[visible], original.opacity_logits[visible])


def test_bad_hide_unhide_render_and_export_requests_say_what_is_wrong(server):
    sid = new_session(server.url)["id"]
    select(server.url, sid, op="all")
    q = "&".join(f"{k}={v}" for k, v in VIEW.items())
    for method, path, body, code, words in [
        ("POST", "unhide", {}, 400, "missing field: revision"),
        ("POST", "unhide", {"revision": 0, "selection_only": "yes"}, 400, "selection_only must"),
        ("POST", "unhide", {"revision": 0, "what": 1}, 400, "unknown field(s): what"),
        ("POST", "selection/hide", {"revision": 0, "all": True}, 400, "unknown field(s): all"),
        ("POST", "selection/hide", {"revision": "0"}, 400, "revision"),
        ("POST", "selection/hide", {"revision": 5}, 409, "revision 0"),
        ("GET", "export?format=ply&hidden=drop", None, 400, "hidden must be one of keep, delete"),
        ("GET", f"render?{q}&highlight=maybe", None, 422, "highlight"),
    ]:
        status, answer = call(server.url, method, f"/api/sessions/{sid}/{path}", body)
        assert status == code and words in answer["detail"], (path, body, status, answer)
    status, answer = call(
        server.url,
        "POST",
        f"/api/sessions/{sid}/selection/hide",
        b'{"revision": 0}',
        {"Content-Type": "text/plain"},
    )
    assert status == 415 and "application/json" in answer["detail"]
    status, answer = call(server.url, "POST", f"/api/sessions/{'0' * 32}/unhide", {"revision": 0})
    assert status == 404
    select(server.url, sid, op="none")
    status, answer = post(server.url, sid, "unhide", {"revision": 0, "selection_only": True})
    assert status == 400 and "nothing is selected" in answer["detail"]


def test_the_selection_is_highlighted_and_outlives_a_restart(asset_file, tmp_path):
    means = load_asset(asset_file).means.double().numpy()
    lo, hi = np.percentile(means, 30, 0), np.percentile(means, 80, 0)
    inside = np.flatnonzero(((means >= lo) & (means <= hi)).all(-1))
    q = "&".join(f"{k}={v}" for k, v in VIEW.items()) + "&w=64&h=64"
    with ServerProcess(tmp_path, asset_file) as s:
        sid = new_session(s.url)["id"]
        plain = call(s.url, "GET", f"/api/sessions/{sid}/render?{q}")[1]
        assert call(s.url, "GET", f"/api/sessions/{sid}/render?{q}&highlight=true")[1] == plain
        assert select(s.url, sid, box={"min": lo.tolist(), "max": hi.tolist()}) == len(inside)
        lit = call(s.url, "GET", f"/api/sessions/{sid}/render?{q}&highlight=true")[1]
        assert lit != plain  # the tint shows
        assert call(s.url, "GET", f"/api/sessions/{sid}/render?{q}")[1] == plain
        assert (tmp_path / "sessions" / sid / "selection.bin").is_file()
    with ServerProcess(tmp_path, asset_file) as s:
        status, info = call(s.url, "GET", f"/api/sessions/{sid}")
        assert status == 200 and info["selected"] == len(inside)
        status, answer = call(s.url, "GET", f"/api/sessions/{sid}/selection")
        assert answer["indices"] == inside.tolist()
        assert call(s.url, "GET", f"/api/sessions/{sid}/render?{q}&highlight=true")[1] == lit
        select(s.url, sid, op="none")  # nothing selected: no file
        assert not (tmp_path / "sessions" / sid / "selection.bin").exists()


def test_a_damaged_or_foreign_selection_file_is_ignored(tmp_path):
    import torch

    from splatpainter.web.store import SELECTION_FILE, LiveSession, SessionStore
    from splatpainter.web.views import OrbitView

    store = SessionStore(tmp_path, lambda: None)
    d = store.root / ("a" * 32)
    d.mkdir()
    live = LiveSession("a" * 32, None, "x", 0.0, OrbitView(), torch.zeros(3), 1.0)
    live.selection = torch.tensor([True, False, True, True, False, False, False, False, True])
    store.save_selection(live)
    assert torch.equal(store._read_selection(d, 9), live.selection)
    assert store._read_selection(d, 10) is None  # another asset's size
    data = (d / SELECTION_FILE).read_bytes()
    (d / SELECTION_FILE).write_bytes(data[:-1])
    assert store._read_selection(d, 9) is None
    (d / SELECTION_FILE).write_bytes(b"XXXXXXXX" + data[8:])
    assert store._read_selection(d, 9) is None
