"""The browser editor's HTTP API (FastAPI TestClient, real renderer, real editor model):
sessions, frames, edits, history, autosave, and hostile requests."""

import base64
import io
import threading
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

with warnings.catch_warnings():  # starlette's note on httpx versions is not ours to act on
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from splatpainter.io import load_asset, ply_from_bytes
from splatpainter.io.splat import splat_from_bytes
from splatpainter.web import EditorBackend, ServerConfig, create_app

SIZE = 64
VIEW = {"az": 30.0, "el": 20.0, "zoom": 1.0, "pan_x": 0.0, "pan_y": 0.0}
JSON_TYPE = {"Content-Type": "application/json"}
R0 = {"revision": 0}  # a fresh session's revision


@pytest.fixture(scope="module")
def backend(asset_file, tmp_path_factory):
    cfg = ServerConfig(
        workdir=tmp_path_factory.mktemp("work"),
        asset_path=asset_file,
        max_upload_bytes=200_000,
        optimize_steps=30,
    )
    return EditorBackend(cfg)


@pytest.fixture(scope="module")
def client(backend):
    return TestClient(create_app(backend.config, backend))


def png_url(arr: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def frame(client, sid, **view) -> np.ndarray:
    from PIL import Image

    q = {**VIEW, **view, "w": SIZE, "h": SIZE, "fmt": "png"}
    r = client.get(f"/api/sessions/{sid}/render", params=q)
    assert r.status_code == 200, r.text
    return np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"))


def painted(base: np.ndarray, color=(255, 0, 255)) -> np.ndarray:
    out = base.copy()
    out[24:40, 24:40] = color
    return out


def revision(client, sid) -> int:
    return client.get(f"/api/sessions/{sid}").json()["revision"]


def apply(client, sid, image, method="backproject", **extra):
    """An apply made on the session's current revision (unless `revision` says otherwise)."""
    body = {
        "view": {**VIEW, "width": SIZE, "height": SIZE},
        "image": png_url(image),
        "method": method,
        **extra,
    }
    body.setdefault("revision", revision(client, sid))
    return client.post(f"/api/sessions/{sid}/apply", json=body)


def act(client, sid, action, rev=None):
    """undo, redo, reset, reset_memory or goto/N, made on the current revision by default."""
    rev = revision(client, sid) if rev is None else rev
    return client.post(f"/api/sessions/{sid}/{action}", json={"revision": rev})


def new_session(client) -> str:
    r = client.post("/api/sessions")
    assert r.status_code == 200, r.text
    return r.json()["id"]


def test_health_and_page(client):
    r = client.get("/api/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    page = client.get("/")
    assert page.status_code == 200 and "<canvas" in page.text
    for name in ("app.js", "style.css"):
        assert client.get(f"/static/{name}").status_code == 200
    # the page loads nothing from elsewhere
    assert "http" not in client.get("/static/app.js").text.replace("http://", "")
    assert "://" not in page.text


@pytest.mark.parametrize("method", ["model", "backproject", "optimize"])
def test_apply_changes_the_stroke_and_undo_restores(client, method):
    sid = new_session(client)
    before = frame(client, sid)
    r = apply(client, sid, painted(before), method=method, kind="paint")
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["index"] == 1 and info["history"][1]["method"] == method
    after = frame(client, sid)
    diff = np.abs(after.astype(int) - before.astype(int)).max(-1)
    assert diff[26:38, 26:38].mean() > 20  # the stroke took
    assert act(client, sid, "undo").json()["index"] == 0
    assert np.array_equal(frame(client, sid), before)  # bit-exact restore
    assert act(client, sid, "redo").json()["index"] == 1
    assert np.array_equal(frame(client, sid), after)


def test_the_edit_is_fitted_on_the_exact_pixels_of_the_frame(client):
    """The PNG frame of a view, applied unchanged under that view, changes nothing: the
    server's camera for the edit is the one it rendered the frame with, pixel for pixel; such
    an edit adds no history entry and leaves the revision alone.
    (The frame of a view half a degree away, named as this view, does change Gaussians.)"""
    sid = new_session(client)
    base = frame(client, sid)
    for method in ("backproject", "model"):
        r = apply(client, sid, base, method=method)
        assert r.status_code == 200, r.text
        info = r.json()
        assert not info["changed"] and len(info["history"]) == 1, info
        assert info["index"] == 0 and info["revision"] == 0 and not info["can_undo"]
    assert np.array_equal(frame(client, sid), base)
    r = apply(client, sid, frame(client, sid, az=VIEW["az"] + 0.5))
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["changed"] and info["revision"] == 1
    assert info["history"][1]["changed_gaussians"] > 0


def test_the_frame_painted_on_is_not_rendered_again_for_the_edit(client):
    """The apply fits the edit on the frame the server showed for that view (remembered, see
    edit/signals.py), and the next frame, of the edited asset, is rendered anew."""
    from splatpainter.edit import signals

    sid = new_session(client)
    base = frame(client, sid)
    hits, misses = signals.SHOWN_FRAMES.hits, signals.SHOWN_FRAMES.misses
    r = apply(client, sid, painted(base), method="model")
    assert r.status_code == 200 and r.json()["changed"], r.text
    assert signals.SHOWN_FRAMES.hits == hits + 1
    assert signals.SHOWN_FRAMES.misses == misses
    assert not np.array_equal(frame(client, sid), base)
    assert signals.SHOWN_FRAMES.misses == misses + 1


def test_history_reset_goto_and_export(client, asset_file):
    sid = new_session(client)
    before = frame(client, sid)
    apply(client, sid, painted(before))
    info = act(client, sid, "reset").json()
    assert info["index"] == 2 and [e["label"] for e in info["history"]][-1] == "reset"
    assert np.array_equal(frame(client, sid), before)
    info = act(client, sid, "goto/1").json()
    assert info["index"] == 1 and info["can_redo"]
    edited = frame(client, sid)
    r = client.get(f"/api/sessions/{sid}/export", params={"format": "ply"})
    assert r.status_code == 200 and "attachment" in r.headers["content-disposition"]
    exported = ply_from_bytes(r.content)[0]
    assert exported.num_gaussians == load_asset(asset_file).num_gaussians
    r = client.get(f"/api/sessions/{sid}/export", params={"format": "splat"})
    assert splat_from_bytes(r.content).num_gaussians == exported.num_gaussians
    # an exported .splat opens by upload as a new session
    up = client.post("/api/sessions", params={"name": "edited.splat"}, content=r.content)
    assert up.status_code == 200, up.text
    assert up.json()["num_gaussians"] == exported.num_gaussians and up.json()["index"] == 0
    assert not np.array_equal(edited, before)
    assert act(client, sid, "goto/9").status_code == 409


def test_session_survives_a_server_restart(backend, client):
    sid = new_session(client)
    before = frame(client, sid)
    apply(client, sid, painted(before), method="model")
    r = client.put(
        f"/api/sessions/{sid}/view", json={**VIEW, "az": 75.0, "width": 512, "height": 512}
    )
    assert r.status_code == 200, r.text
    edited = frame(client, sid)
    # the autosave is an ordinary session file (what `splatpainter session show` reads)
    from splatpainter.edit.session import StoredSession

    saved = StoredSession.read(backend.config.workdir / "sessions" / sid / "session.spsession")
    assert saved.summary()["index"] == 1 and saved.summary()["entries"][1]["method"] == "model"
    # A new backend on the same work directory: nothing in memory, everything from disk.
    fresh = EditorBackend(backend.config)
    with TestClient(create_app(backend.config, fresh)) as c2:
        info = c2.get(f"/api/sessions/{sid}").json()
        assert info["index"] == 1 and info["view"]["az"] == 75.0
        assert np.array_equal(frame(c2, sid), edited)
        assert act(c2, sid, "undo").status_code == 200
        assert np.array_equal(frame(c2, sid), before)


def test_uploads_checked_and_limited(client, asset_file):
    data = asset_file.read_bytes()
    assert len(data) < 200_000
    r = client.post("/api/sessions", params={"name": "mine.ply"}, content=data)
    assert r.status_code == 200, r.text
    assert r.json()["name"] == "mine.ply" and r.json()["num_gaussians"] == 1500
    # over the limit: refused before parsing
    big = data + b"\0" * 200_001
    r = client.post("/api/sessions", params={"name": "big.ply"}, content=big)
    assert r.status_code == 413 and "too large" in r.json()["detail"]
    # corrupt bodies: clear 4xx, never a 500
    for name, body in [
        ("bad.ply", b"ply\nformat binary_little_endian 1.0\nelement vertex 99\nend_header\n"),
        ("bad.ply", data[: len(data) // 2]),
        ("bad.splat", b"\1" * 33),
        ("zero.splat", b"\0" * 64),
        ("x.txt", b"hello"),
    ]:
        r = client.post("/api/sessions", params={"name": name}, content=body)
        assert 400 <= r.status_code < 500, (name, r.status_code, r.text)
        assert r.json()["detail"] and "\n" not in r.json()["detail"]
    r = client.post("/api/sessions", content=b"abc")
    assert r.status_code == 400 and "name" in r.json()["detail"]
    assert client.get("/api/health").status_code == 200


@pytest.mark.parametrize(
    "path",
    [
        "/api/sessions/..%2F..%2Fetc%2Fpasswd",
        "/api/sessions/../../etc/passwd",
        "/api/sessions/%2e%2e/render",
        "/api/sessions/" + "0" * 31 + "g",
        "/api/sessions/" + "a" * 32,  # well-formed but unknown
        "/static/..%2F..%2F__init__.py",
        "/static/%2e%2e%2fapp.py",
    ],
)
def test_traversal_gets_4xx(client, path):
    r = client.get(path)
    assert 400 <= r.status_code < 500, (path, r.status_code)
    assert "root:" not in r.text and "import" not in r.text


def test_malformed_requests_get_clear_4xx(client):
    sid = new_session(client)
    base = frame(client, sid)
    url = f"/api/sessions/{sid}/apply"
    cases = [
        (client.post(url, content=b"{not json", headers=JSON_TYPE), "JSON"),
        (client.post(url, content=b"[" * 100_000 + b"]" * 100_000, headers=JSON_TYPE), "JSON"),
        (client.post(url, json=[1, 2]), "object"),
        (apply(client, sid, base, method="magic"), "method"),
        (apply(client, sid, base, kind="sparkle"), "kind"),
        (apply(client, sid, base[:32]), "view is 64x64"),
        (client.post(url, json={"view": {**VIEW, "width": SIZE, "height": SIZE}, **R0}), "image"),
        (client.post(url, json={"view": {**VIEW, "el": 95}, "image": "", **R0}), "view.el"),
        (
            client.post(
                url, json={"view": {**VIEW, "width": SIZE, "height": SIZE}, "image": "%%", **R0}
            ),
            "base64",
        ),
        (
            client.post(
                url,
                json={
                    "view": {**VIEW, "width": SIZE, "height": SIZE},
                    "image": "data:image/png;base64," + base64.b64encode(b"nope").decode(),
                    **R0,
                },
            ),
            "not a readable image",
        ),
        (
            client.post(url, json={"view": VIEW, "image": png_url(base), "extra": 1, **R0}),
            "unknown",
        ),
        (client.post(url, json={"view": VIEW, "image": png_url(base)}), "revision"),
        (
            client.post(url, json={"view": VIEW, "image": png_url(base), "revision": "1"}),
            "revision",
        ),
        (client.get(f"/api/sessions/{sid}/render", params={"az": "nan"}), "az"),
        (client.get(f"/api/sessions/{sid}/render", params={"w": 100_000}), "width"),
        (client.get(f"/api/sessions/{sid}/render", params={"az": "left"}), "az"),
        (client.get(f"/api/sessions/{sid}/render", params={"fmt": "gif"}), "fmt"),
        (client.get(f"/api/sessions/{sid}/export", params={"format": "obj"}), "format"),
        (act(client, sid, "undo"), "nothing to undo"),
        (client.post(f"/api/sessions/{sid}/undo", json={**R0, "index": 1}), "unknown"),
        (client.put(f"/api/sessions/{sid}/view", json={"az": "x"}), "view.az"),
    ]
    for r, words in cases:
        assert 400 <= r.status_code < 500, (words, r.status_code, r.text)
        detail = r.json()["detail"]
        assert isinstance(detail, str) and words in detail, (words, detail)
    # a decompression bomb is refused from its header, before decoding: a PNG that declares
    # 100000 x 100000 pixels (and holds none)
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")
    bomb = "data:image/png;base64," + base64.b64encode(png).decode()
    r = client.post(
        url, json={"view": {**VIEW, "width": SIZE, "height": SIZE}, "image": bomb, **R0}
    )
    assert r.status_code == 400 and r.json()["detail"].startswith("image:")
    assert client.get(f"/api/sessions/{sid}").json()["index"] == 0
    assert client.get("/api/health").status_code == 200


def test_concurrent_sessions_are_independent(client):
    a, b = new_session(client), new_session(client)
    base_a, base_b = frame(client, a), frame(client, b)
    assert np.array_equal(base_a, base_b)
    results = {}

    def work(sid, color):
        for _ in range(2):
            img = frame(client, sid)
            results.setdefault(sid, []).append(apply(client, sid, painted(img, color)).status_code)

    threads = [
        threading.Thread(target=work, args=(a, (255, 0, 0))),
        threading.Thread(target=work, args=(b, (0, 0, 255))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == {a: [200, 200], b: [200, 200]}
    fa, fb = frame(client, a), frame(client, b)
    assert fa[32, 32, 0] > fa[32, 32, 2] and fb[32, 32, 2] > fb[32, 32, 0]
    # undoing one leaves the other alone
    assert act(client, a, "undo").status_code == 200
    assert act(client, a, "undo").status_code == 200
    assert np.array_equal(frame(client, a), base_a)
    assert np.array_equal(frame(client, b), fb)
    assert client.get(f"/api/sessions/{b}").json()["index"] == 2


def test_busy_session_answers_409(client, backend):
    sid = new_session(client)
    live = backend.store.get(sid)
    with live.lock:
        r = act(client, sid, "reset", rev=0)
    assert r.status_code == 409 and "busy" in r.json()["detail"]


def test_mask_limits_the_edit(client):
    sid = new_session(client)
    before = frame(client, sid)
    image = before.copy()
    image[16:48, 16:48] = (0, 255, 0)
    mask = np.zeros((SIZE, SIZE), np.uint8)
    mask[16:48, 16:32] = 255  # only the left half of the painted square counts
    r = apply(client, sid, image, mask=png_url(mask))
    assert r.status_code == 200, r.text
    after = frame(client, sid)
    diff = np.abs(after.astype(int) - before.astype(int)).max(-1)
    assert diff[20:44, 18:30].mean() > 3 * diff[20:44, 36:46].mean() + 1
    assert torch.is_tensor(torch.as_tensor(diff))


def test_serve_refuses_bad_input_in_one_line(tmp_path):
    import socket

    from typer.testing import CliRunner

    from splatpainter.cli import app

    runner = CliRunner()
    work = ["--workdir", str(tmp_path), "--port", "0"]
    r = runner.invoke(app, ["serve", str(tmp_path / "missing.ply"), *work])
    assert r.exit_code == 2 and "error:" in r.output and "missing.ply" in r.output
    (tmp_path / "junk.splat").write_bytes(b"\1" * 33)
    r = runner.invoke(app, ["serve", str(tmp_path / "junk.splat"), *work])
    assert r.exit_code == 2 and "error:" in r.output and r.output.count("\n") == 1
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = runner.invoke(app, ["serve", "--workdir", str(tmp_path), "--port", str(port)])
    assert r.exit_code == 2 and "cannot listen" in r.output
    r = runner.invoke(app, ["serve", "--method", "magic"])
    assert r.exit_code == 2 and "magic" in r.output


def test_serve_defaults_to_loopback_on_7860():
    import typer.main

    from splatpainter.cli import app

    serve = typer.main.get_command(app).commands["serve"]
    defaults = {p.name: p.default for p in serve.params}
    assert defaults["host"] == "127.0.0.1" and defaults["port"] == 7860


@pytest.mark.timeout(900)
def test_serve_opens_the_command_line_asset_and_prints_its_url(asset_file, tmp_path):
    """The real `splatpainter serve ASSET` process: the URL it prints (loopback unless --host
    says otherwise) answers /api/health, and new sessions start from ASSET."""
    import json
    import re
    import urllib.request

    from splatpainter.web.harness import ServerProcess

    with ServerProcess(tmp_path, asset_file, "--method", "backproject") as server:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", server.url), server.url
        with urllib.request.urlopen(server.url + "api/health", timeout=60) as r:
            assert json.load(r)["status"] == "ok"
        with urllib.request.urlopen(server.url + "api/config", timeout=60) as r:
            assert json.load(r)["default_method"] == "backproject"
        req = urllib.request.Request(server.url + "api/sessions", method="POST")
        with urllib.request.urlopen(req, timeout=120) as r:
            info = json.load(r)
        assert info["name"] == "small.ply" and info["num_gaussians"] == 1500


def test_apply_under_auto_answers_how_the_model_read_it(client):
    """The apply answer carries the model's reading under kind "auto" (the kind it took the
    edit for, the shares, what it moved beyond the mask), and none for a given kind or
    another method."""
    sid = new_session(client)
    base = frame(client, sid)
    r = apply(client, sid, base[..., [1, 2, 0]], method="model", kind="auto")
    assert r.status_code == 200, r.text
    reading = r.json()["reading"]
    assert reading["read_as"] in ("paint", "recolor", "relight")
    assert abs(sum(reading["shares"].values()) - 1) < 1e-3
    assert reading["moved_gaussians"] == r.json()["history"][1]["changed_gaussians"]
    for method, kind in (("model", "recolor"), ("backproject", "auto")):
        r = apply(client, sid, painted(frame(client, sid)), method=method, kind=kind)
        assert r.status_code == 200 and r.json()["reading"] is None, r.text
