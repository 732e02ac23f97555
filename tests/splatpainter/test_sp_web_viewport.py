"""The browser editor's client-side WebGL viewport: the asset once as .ply bytes, colour deltas
after edits (HTTP API, TestClient), and in Debian's headless Chromium (SwiftShader WebGL): the
client canvas agrees with the server's render of the same camera, orbiting makes no request,
an apply brings a delta (never the whole asset again) that the canvas shows, and without the
library the page falls back to server frames and says so.

The browser tests skip, saying why, when Playwright or /usr/bin/chromium is missing, or when the
viewport library is not installed (`bash scripts/setup.sh` installs it with npm; here and in CI
node and npm are present, so they run).
"""

import base64
import io
import json
import sys
import urllib.request
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

with warnings.catch_warnings():  # starlette's note on httpx versions is not ours to act on
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from splatpainter.assets.procedural import make_demo_asset
from splatpainter.io import load_asset, ply_from_bytes, save_asset
from splatpainter.web import EditorBackend, ServerConfig, create_app
from splatpainter.web.viewport import (
    DeltaRefused,
    colour_delta,
    read_colour_delta,
    vendor_missing,
)

FORMATS = Path(__file__).resolve().parent / "data" / "formats"
SIZE = 64
VIEW = {"az": 30.0, "el": 20.0, "zoom": 1.0, "pan_x": 0.0, "pan_y": 0.0}
# The client (PlayCanvas) and the server renderer differ in details: PlayCanvas fades each
# Gaussian to exactly zero at 2*sqrt(2) sigma (normalised exp), keeps colours and scales in
# half floats, and does not clamp alpha at 0.99; on the demo asset that costs 34-35 dB. The
# issue's bound (the painted view is what the user saw) is 30 dB.
MIN_PSNR = 30.0


# ---------------------------------------------------------------------- pure helpers
def test_colour_delta_round_trip_and_refusals():
    old = make_demo_asset(300, seed=1).asset
    sh, op = old.sh.clone(), old.opacity_logits.clone()
    sh[[3, 40, 41]] += 0.25
    op[[41, 200]] -= 1.0
    new = type(old)(old.means, old.quats, old.log_scales, op, sh)
    d = read_colour_delta(colour_delta(old, new))
    assert d["num_gaussians"] == 300
    assert d["indices"].tolist() == [3, 40, 41, 200]
    assert np.array_equal(d["sh"], sh[[3, 40, 41, 200]].numpy())
    assert np.array_equal(d["opacity_logits"], op[[3, 40, 41, 200]].numpy())
    assert read_colour_delta(colour_delta(new, new))["indices"].size == 0
    moved = type(old)(old.means + 0.01, old.quats, old.log_scales, op, sh)
    with pytest.raises(DeltaRefused, match="geometry"):
        colour_delta(old, moved)
    with pytest.raises(ValueError, match="expected"):
        read_colour_delta(colour_delta(old, new)[:-4])


# ---------------------------------------------------------------------- HTTP API
@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    path = tmp_path_factory.mktemp("asset") / "small.ply"
    save_asset(make_demo_asset(1500, seed=0).asset, path)
    cfg = ServerConfig(workdir=tmp_path_factory.mktemp("work"), asset_path=path)
    return EditorBackend(cfg)


@pytest.fixture(scope="module")
def client(backend):
    return TestClient(create_app(backend.config, backend))


def _painted_apply(client, sid: str, revision: int) -> dict:
    from PIL import Image

    q = {**VIEW, "w": SIZE, "h": SIZE, "fmt": "png"}
    r = client.get(f"/api/sessions/{sid}/render", params=q)
    base = np.asarray(Image.open(io.BytesIO(r.content)).convert("RGB"))
    edited = base.copy()
    edited[20:44, 20:44] = (0, 255, 0)
    buf = io.BytesIO()
    Image.fromarray(edited).save(buf, format="PNG")
    body = {
        "revision": revision,
        "view": {**VIEW, "width": SIZE, "height": SIZE},
        "image": "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode(),
        "method": "backproject",
    }
    r = client.post(f"/api/sessions/{sid}/apply", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_asset_once_then_colour_deltas(client, backend):
    info = client.post("/api/sessions").json()
    sid = info["id"]
    r = client.get(f"/api/sessions/{sid}/asset.ply")
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    token0 = int(r.headers["x-asset-token"])
    orbit = json.loads(r.headers["x-orbit"])
    assert (orbit["fov_y_deg"], orbit["margin"], orbit["background"]) == (40.0, 1.1, [0, 0, 0])
    sent = ply_from_bytes(r.content)[0]
    start = backend.store.get(sid).session.asset
    assert torch.equal(sent.sh, start.sh.float()) and torch.equal(sent.means, start.means.float())
    assert np.allclose(orbit["centre"], backend.store.get(sid).centre.tolist())

    # nothing changed yet: an empty delta naming the same asset
    r = client.get(f"/api/sessions/{sid}/delta", params={"since": token0})
    assert r.status_code == 200 and int(r.headers["x-asset-token"]) == token0
    assert read_colour_delta(r.content)["indices"].size == 0

    after = _painted_apply(client, sid, info["revision"])
    assert after["index"] == 1
    r = client.get(f"/api/sessions/{sid}/delta", params={"since": token0})
    assert r.status_code == 200
    token1 = int(r.headers["x-asset-token"])
    d = read_colour_delta(r.content)
    edited = backend.store.get(sid).session.asset
    changed = (edited.sh != start.sh).flatten(1).any(1) | (
        edited.opacity_logits.reshape(-1) != start.opacity_logits.reshape(-1)
    )
    assert token1 != token0 and 0 < d["indices"].size == int(changed.sum()) < 1500
    assert d["indices"].tolist() == torch.nonzero(changed).reshape(-1).tolist()
    # the delta is small: only the changed Gaussians, not the asset
    assert len(r.content) < len(client.get(f"/api/sessions/{sid}/asset.ply").content) / 2
    # applied to the page's copy it gives the edited asset exactly (float32, as the page has)
    sh = sent.sh.clone()
    sh[torch.as_tensor(d["indices"].astype(np.int64))] = torch.from_numpy(d["sh"].copy())
    assert torch.equal(sh, edited.sh.float())

    # undo: the delta back to the loaded state restores the original colours
    r = client.post(f"/api/sessions/{sid}/undo", json={"revision": after["revision"]})
    assert r.status_code == 200, r.text
    r = client.get(f"/api/sessions/{sid}/delta", params={"since": token1})
    back = read_colour_delta(r.content)
    assert int(r.headers["x-asset-token"]) == token0
    assert back["indices"].tolist() == d["indices"].tolist()
    assert np.array_equal(back["sh"], start.sh.float().numpy()[back["indices"]])

    # a token of another session's asset (or one never handed out) asks for a full load
    other = client.post("/api/sessions").json()["id"]
    r = client.get(f"/api/sessions/{other}/delta", params={"since": token1})
    assert r.status_code == 409 and r.json()["error"] == "reload"
    r = client.get(f"/api/sessions/{sid}/delta", params={"since": 10**9})
    assert r.status_code == 409 and "asset.ply" in r.json()["detail"]


def test_vendor_files_are_served_locally(client):
    why = vendor_missing()
    if why:
        r = client.get("/vendor/playcanvas.mjs")
        assert r.status_code == 404 and "setup.sh" in r.json()["detail"]
        pytest.skip(why)
    r = client.get("/vendor/playcanvas.mjs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    assert b"GSplat" in r.content and len(r.content) > 1_000_000
    assert client.get("/api/config").json()["viewport_missing"] is None
    assert client.get("/vendor/../package.json").status_code == 404
    assert client.get("/vendor/package-lock.json").status_code == 404


def test_spz_upload_opens_a_session(client):
    data = (FORMATS / "ref_sh3.spz").read_bytes()
    r = client.post(
        "/api/sessions",
        params={"name": "guitar.spz"},
        content=data,
        headers={"Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["name"] == "guitar.spz"
    assert info["num_gaussians"] == load_asset(FORMATS / "ref_sh3.spz").num_gaussians
    # ...and its asset reaches the viewport with every SH band
    sent = ply_from_bytes(client.get(f"/api/sessions/{info['id']}/asset.ply").content)[0]
    assert sent.sh_degree == 3


# ---------------------------------------------------------------------- in Chromium
WAIT_MS = 180_000


def _skip(reason: str):
    print(f"viewport browser test skipped: {reason}", file=sys.stderr)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def playwright_api(playwright_api):
    """The shared browser fixture (tests/splatpainter/conftest.py), and the viewport library."""
    why = vendor_missing()
    if why:
        _skip(why)
    return playwright_api


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from splatpainter.web.harness import ServerProcess

    with ServerProcess(tmp_path_factory.mktemp("web-work")) as s:
        yield s.url


def _png(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.float64)


def server_render(url: str, sid: str, view: dict) -> np.ndarray:
    q = "&".join(f"{k}={view[k]}" for k in ("az", "el", "zoom", "pan_x", "pan_y"))
    with urllib.request.urlopen(f"{url}api/sessions/{sid}/render?{q}&w=512&h=512") as r:
        return _png(r.read())


def client_canvas(page) -> np.ndarray:
    return _png(base64.b64decode(page.evaluate("sp.gl.snapshot()").partition(",")[2]))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(255.0**2 / max(((a - b) ** 2).mean(), 1e-12)))


def wait_ready(page, extra: str = "true") -> None:
    page.wait_for_function(f"document.body.dataset.ready === '1' && ({extra})", timeout=WAIT_MS)


def drag(page, points, pause_ms: int = 25) -> None:
    page.mouse.move(*points[0])
    page.mouse.down()
    for p in points[1:]:
        page.mouse.move(*p)
        page.wait_for_timeout(pause_ms)
    page.mouse.up()


def test_viewport_agrees_orbits_silently_and_takes_deltas(playwright_api, server):
    from splatpainter.web.harness import launch_chromium

    with playwright_api() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1120, "height": 780})
            page.set_default_timeout(WAIT_MS)
            requests: list[str] = []  # every request to the server (not blob: workers)
            page.on("request", lambda r: r.url.startswith(server) and requests.append(r.url))
            page.goto(server)
            wait_ready(page)
            assert page.evaluate("document.body.dataset.viewport") == "webgl"
            sid = page.evaluate("sp.sid")
            assert page.evaluate("sp.gl.loads") == 1
            assert [u for u in requests if "/render" in u] == []  # no server frame to show it

            # (a) the client canvas and the server's render of the same camera agree
            view0 = page.evaluate("({...sp.view})")
            first = client_canvas(page)
            ref = server_render(server, sid, view0)
            assert (ref.sum(-1) > 30).mean() > 0.05  # the asset is in view
            print(f"viewport vs server at the first view: {psnr(first, ref):.2f} dB")
            assert psnr(first, ref) >= MIN_PSNR

            # (b) orbiting (drag, pan, zoom) makes no request; the view still moves and agrees
            box = page.locator("#screen").bounding_box()
            x0, y0 = box["x"], box["y"]
            cx, cy = x0 + 256, y0 + 256
            requests.clear()
            drag(page, [(cx - 60 + 12 * i, cy - 20 + 3 * i) for i in range(11)])
            page.keyboard.down("Shift")
            drag(page, [(cx + 4 * i, cy + 2 * i) for i in range(5)])
            page.keyboard.up("Shift")
            page.mouse.move(cx, cy)
            page.mouse.wheel(0, -120)
            wait_ready(page, f"sp.view.az !== {view0['az']} && sp.view.zoom < 1")
            assert requests == [], requests
            view = page.evaluate("({...sp.view})")
            assert view["pan_x"] != 0 and view["el"] != view0["el"]
            moved = client_canvas(page)
            before = server_render(server, sid, view)
            print(f"viewport vs server after orbiting: {psnr(moved, before):.2f} dB")
            assert psnr(moved, before) >= MIN_PSNR
            assert psnr(moved, first) < MIN_PSNR  # the view really changed

            # paint a stroke: the server's frame of this view is fetched once, to compose on
            page.check("input[name=tool][value=brush]")
            page.locator("#brush-color").fill("#00ff00")
            page.locator("#brush-size").fill("24")
            page.locator("#brush-hardness").fill("1")
            sx0, sx1, sy = 256 - 70, 256 + 70, 256
            drag(page, [(x0 + x, y0 + sy) for x in range(sx0, sx1 + 1, 10)], pause_ms=5)
            wait_ready(page, "sp.hasPaint")
            renders = [u for u in requests if "/render" in u]
            assert len(renders) == 1 and "fmt=png" in renders[0], requests
            base = page.evaluate(
                "(() => { const c = document.createElement('canvas'); c.width = c.height = 512;"
                " c.getContext('2d').drawImage(sp.base, 0, 0); return c.toDataURL('image/png') })()"
            )
            assert np.array_equal(_png(base64.b64decode(base.partition(",")[2])), before)

            # (c) apply: the page gets a colour delta, not the asset, and shows the edit
            page.select_option("#method", "backproject")
            requests.clear()
            page.click("#apply")
            wait_ready(page, "document.body.dataset.entry === '1'")
            assert any("/delta?since=" in u for u in requests), requests
            assert not any("asset.ply" in u for u in requests), requests
            assert page.evaluate("[sp.gl.loads, sp.gl.deltas]") == [1, 1]
            after = server_render(server, sid, view)
            shown = client_canvas(page)
            yy, xx = np.mgrid[0:512, 0:512] + 0.5
            stroke = (np.hypot(np.clip(xx, sx0, sx1) - xx, yy - sy - 0.5) < 8) & (
                before.sum(-1) > 30
            )
            server_change = np.abs(after - before).max(-1)[stroke].mean()
            client_change = np.abs(shown - moved).max(-1)[stroke].mean()
            inside = np.abs(shown - after).max(-1)[stroke].mean()
            print(
                f"viewport vs server after the apply: {psnr(shown, after):.2f} dB; in the stroke: "
                f"server changed {server_change:.1f}, client {client_change:.1f}, "
                f"client-server {inside:.1f}"
            )
            assert server_change > 40 and client_change > 40 and inside < 12
            assert psnr(shown, after) >= MIN_PSNR

            # undo: another delta brings the canvas back (still no full load)
            requests.clear()
            page.click("#undo")
            wait_ready(page, "document.body.dataset.entry === '0'")
            assert any("/delta?since=" in u for u in requests), requests
            assert page.evaluate("[sp.gl.loads, sp.gl.deltas]") == [1, 2]
            undone = client_canvas(page)
            assert np.abs(undone - moved).max(-1)[stroke].mean() < 3
            assert psnr(undone, before) >= MIN_PSNR
        finally:
            browser.close()


def test_without_the_library_the_page_uses_server_frames(playwright_api, server):
    from splatpainter.web.harness import launch_chromium

    with playwright_api() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1120, "height": 780})
            page.set_default_timeout(WAIT_MS)
            page.route("**/vendor/**", lambda route: route.fulfill(status=404, body="missing"))
            page.goto(server)
            wait_ready(page)
            assert page.evaluate("document.body.dataset.viewport") == "server"
            assert "server frames" in page.locator("#status").inner_text()
            assert page.locator("#gl").is_hidden()
            frames = []
            page.on("request", lambda r: "/render?" in r.url and frames.append(r.url))
            box = page.locator("#screen").bounding_box()
            cx, cy = box["x"] + 256, box["y"] + 256
            az = page.evaluate("sp.view.az")
            drag(page, [(cx - 40 + 10 * i, cy) for i in range(8)])
            wait_ready(page, f"sp.view.az !== {az}")
            assert any("fmt=jpeg" in u for u in frames)  # frames come from the server
        finally:
            browser.close()


def test_viewport_shows_view_dependent_colour(playwright_api, server, tmp_path):
    """An asset with SH degree 3 (as real captures have), uploaded as .spz: the client evaluates
    the higher bands as the server does, from several sides."""
    from splatpainter.assets.demo import demo_ply_path
    from splatpainter.render import render
    from splatpainter.web.harness import launch_chromium
    from splatpainter.web.views import OrbitView, orbit_camera, to_uint8

    asset = load_asset(demo_ply_path()).with_sh_degree(3)
    sh = asset.sh.clone()
    sh[:, 1:] = 0.15 * torch.randn(sh[:, 1:].shape, generator=torch.Generator().manual_seed(0))
    path = tmp_path / "shiny.spz"
    save_asset(asset.replace(sh=sh), path)
    req = urllib.request.Request(
        f"{server}api/sessions?name=shiny.spz",
        data=path.read_bytes(),
        headers={"Content-Type": "application/octet-stream"},
        method="POST",
    )
    with urllib.request.urlopen(req) as r:
        sid = json.loads(r.read())["id"]
    with playwright_api() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1120, "height": 780})
            page.set_default_timeout(WAIT_MS)
            page.goto(f"{server}#s={sid}")
            wait_ready(page, f"sp.sid === '{sid}'")
            assert page.evaluate("sp.info.name") == "shiny.spz"
            # the same asset without its higher bands, rendered here: what a client that
            # ignored them would show
            loaded = load_asset(path)
            flat = loaded.replace(sh=torch.cat([loaded.sh[:, :1], 0 * loaded.sh[:, 1:]], 1))
            centre, radius = loaded.bounding_sphere(sigma=3.0)
            for az in (30.0, 150.0, 260.0):
                page.evaluate(f"sp.view.az = {az}, requestFrame(false)")
                wait_ready(page, f"sp.view.az === {az}")
                view = page.evaluate("({...sp.view})")
                shown, ref = client_canvas(page), server_render(server, sid, view)
                cam = orbit_camera(OrbitView(**view, width=512, height=512), centre, radius)
                with torch.no_grad():
                    dc_only = to_uint8(render(flat, cam).rgb).astype(np.float64)
                print(
                    f"SH degree 3, azimuth {az}: {psnr(shown, ref):.2f} dB "
                    f"(vs the frame without the bands: {psnr(shown, dc_only):.2f} dB)"
                )
                assert psnr(shown, ref) >= MIN_PSNR
                assert psnr(shown, dc_only) < psnr(shown, ref) - 3
        finally:
            browser.close()
