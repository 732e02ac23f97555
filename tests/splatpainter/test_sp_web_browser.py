"""End to end: `splatpainter serve` in a subprocess, driven by Playwright in Debian's headless
Chromium (never a downloaded browser): orbit, paint, apply, check the pixels, undo, export.

Skips, saying why, only when Playwright or /usr/bin/chromium is missing (scripts/test.sh installs
chromium with apt when it can).  The editor's screenshot is kept under out/test-artifacts/.
Every wait is on the page's own state (`data-ready`, the history entry), never a fixed sleep.
"""

import io
import os
import re
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(1200)]

ARTIFACTS = (
    Path(os.environ.get("SPLATPAINTER_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "out"))
    / "test-artifacts"
)
SIZE = 512
WAIT_MS = 180_000  # the longest any one step may take (an apply on a busy machine)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from splatpainter.web.harness import ServerProcess

    with ServerProcess(tmp_path_factory.mktemp("web-work")) as s:
        # without --host it listens on loopback, and prints the URL it really serves
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", s.url), s.url
        yield s.url


def fetch_render(url: str, sid: str, view: dict) -> np.ndarray:
    from PIL import Image

    q = "&".join(f"{k}={view[k]}" for k in ("az", "el", "zoom", "pan_x", "pan_y"))
    with urllib.request.urlopen(f"{url}api/sessions/{sid}/render?{q}&w={SIZE}&h={SIZE}") as r:
        return np.asarray(Image.open(io.BytesIO(r.read())).convert("RGB")).astype(int)


def decode_data_url(url: str) -> np.ndarray:
    import base64

    from PIL import Image

    data = base64.b64decode(url.partition(",")[2])
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)


def wait_ready(page, extra: str = "true", timeout: float = WAIT_MS) -> None:
    page.wait_for_function(f"document.body.dataset.ready === '1' && ({extra})", timeout=timeout)


def drag(page, points, pause_ms: int = 25) -> None:
    page.mouse.move(*points[0])
    page.mouse.down()
    for p in points[1:]:
        page.mouse.move(*p)
        page.wait_for_timeout(pause_ms)
    page.mouse.up()


def test_orbit_paint_apply_undo_export(playwright_api, server, tmp_path):
    from splatpainter.assets.demo import demo_ply_path
    from splatpainter.io import load_asset
    from splatpainter.web.viewport import vendor_missing

    original = load_asset(demo_ply_path())
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    from splatpainter.web.harness import launch_chromium

    with playwright_api() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1120, "height": 780}, accept_downloads=True)
            page.set_default_timeout(WAIT_MS)  # a loaded 2-core machine: waits, never sleeps
            page.goto(server)
            wait_ready(page)
            sid = page.evaluate("sp.sid")
            assert re.fullmatch(r"[0-9a-f]{32}", sid)

            # 1. orbit by dragging: the view moves, drawn by the page's WebGL viewport (no
            # server frame while dragging; test_sp_web_viewport checks it agrees with the server)
            # or, where the viewport library is not installed, by server frames
            box = page.locator("#screen").bounding_box()
            x0, y0 = box["x"], box["y"]
            cx, cy = x0 + SIZE / 2, y0 + SIZE / 2
            view0 = page.evaluate("({...sp.view})")
            webgl = vendor_missing() is None
            assert page.evaluate("document.body.dataset.viewport") == (
                "webgl" if webgl else "server"
            )
            drag_frames = []  # every server frame asked for while dragging
            page.on("request", lambda r: "/render?" in r.url and drag_frames.append(r.url))
            # the server never hears of this view before the reload below (as when the page is
            # left within the view save's debounce): the unapplied paint must bring it back
            page.route("**/view", lambda route: route.abort())
            drag(page, [(cx - 60 + 12 * i, cy - 20 + 3 * i) for i in range(11)])
            wait_ready(page, f"sp.view.az !== {view0['az']}")
            view = page.evaluate("({...sp.view})")
            assert view["az"] != view0["az"] and view["el"] != view0["el"]
            if webgl:
                assert drag_frames == [] and page.evaluate("sp.gl.frames") > 0
            else:  # frames at the view's full size (no reduced preview)
                assert drag_frames and all("w=512&h=512" in u for u in drag_frames), drag_frames
            before = fetch_render(server, sid, view)
            object_px = before.sum(-1) > 30
            # what Apply sends is built on exactly the server's render of the camera it names
            # (the lossless frame fetched when editing starts; paint goes over it)
            assert page.evaluate("ensureBase()")
            sent = page.evaluate("compose(work, sp.base), work.toDataURL('image/png')")
            assert np.array_equal(decode_data_url(sent), before)
            assert object_px[SIZE // 2 - 10 : SIZE // 2 + 10, SIZE // 2 - 70 : SIZE // 2 + 70].all()

            # 2. paint a stroke across the middle and apply it
            page.check("input[name=tool][value=brush]")
            page.locator("#brush-color").fill("#00ff00")
            page.locator("#brush-size").fill("24")
            page.locator("#brush-hardness").fill("1")
            sx0, sx1, sy = SIZE // 2 - 70, SIZE // 2 + 70, SIZE // 2
            drag(page, [(x0 + x, y0 + sy) for x in range(sx0, sx1 + 1, 10)], pause_ms=5)
            assert page.evaluate("sp.hasPaint")
            # under Kind "auto" (the default) brush strokes alone apply as paint; with a colour
            # adjustment as well the model decides
            assert page.evaluate("$('kind').value") == "auto"
            assert page.evaluate("applyKind()") == "paint"
            page.locator("#hsv-s").fill("1.5")
            assert page.evaluate("applyKind()") == "auto"
            page.locator("#hsv-s").fill("1")
            assert page.evaluate("applyKind()") == "paint"
            # paint not yet applied survives a reload (kept in the browser with its view)
            page.reload()
            wait_ready(page, "sp.hasPaint")
            assert page.evaluate("sp.sid") == sid
            assert page.evaluate("({...sp.view})") == view
            # ... and so do the tool and the brush (the user's settings, kept per browser)
            assert page.evaluate("tool()") == "brush"
            assert page.evaluate("brush()") == {
                "color": "#00ff00", "size": 24, "opacity": 1, "hardness": 1,
            }  # fmt: skip
            page.unroute("**/view")
            page.screenshot(path=str(ARTIFACTS / "web_editor_painted.png"))
            # a progress indicator runs while the edit is computed (the request is held here
            # until the page shows it)
            held = []
            page.route("**/apply", lambda route: held.append(route))
            page.click("#apply")
            page.wait_for_function(
                "!document.getElementById('progress').hidden"
                " && document.getElementById('progress-text').textContent.startsWith('model')"
            )
            assert len(held) == 1 and page.evaluate("document.body.dataset.ready") == "0"
            held[0].continue_()
            page.unroute("**/apply")
            wait_ready(page, "document.body.dataset.entry === '1'")
            assert page.locator("#progress").is_hidden()
            after = fetch_render(server, sid, view)
            page.screenshot(path=str(ARTIFACTS / "web_editor.png"))

            # 3. changed inside the stroke, not elsewhere
            yy, xx = np.mgrid[0:SIZE, 0:SIZE] + 0.5
            dist = np.hypot(np.clip(xx, sx0, sx1) - xx, yy - sy - 0.5)
            diff = np.abs(after - before).max(-1)
            inside = (dist < 8) & object_px
            outside = dist > 12 + 24
            green = (after[..., 1] - after[..., [0, 2]].max(-1))[inside].mean()
            print(
                f"stroke: inside mean |diff| {diff[inside].mean():.1f}, green {green:.1f}; outside "
                f"mean {diff[outside].mean():.3f}, p99.9 {np.percentile(diff[outside], 99.9)}"
            )
            assert diff[inside].mean() > 40 and green > 40
            assert diff[outside].mean() < 1.0
            assert np.percentile(diff[outside], 99.9) <= 40

            # 4. undo restores the view exactly; redo brings the edit back
            page.click("#undo")
            wait_ready(page, "document.body.dataset.entry === '0'")
            assert np.array_equal(fetch_render(server, sid, view), before)
            page.click("#redo")
            wait_ready(page, "document.body.dataset.entry === '1'")
            # the history list: the loaded asset, then the edit (current)
            items = page.locator("#history li")
            assert items.count() == 2 and "model (paint)" in items.nth(1).inner_text()
            assert "current" in (items.nth(1).get_attribute("class") or "")

            # reload continues the same session, at the same view
            page.reload()
            wait_ready(page, "document.body.dataset.entry === '1'")
            assert page.evaluate("sp.sid") == sid
            assert page.evaluate("sp.view.az") == view["az"]

            # a second tab gets its own session, untouched by the first
            other = browser.new_page(viewport={"width": 1120, "height": 780})
            other.set_default_timeout(WAIT_MS)
            other.goto(server)
            wait_ready(other)
            assert other.evaluate("sp.sid") != sid
            assert other.evaluate("document.body.dataset.entry") == "0"
            other_sid = other.evaluate("sp.sid")

            # 5. export downloads a valid asset with the same Gaussian count
            with page.expect_download() as dl:
                page.click("#export-ply")
            saved = tmp_path / "exported.ply"
            dl.value.save_as(saved)
            exported = load_asset(saved)
            assert exported.num_gaussians == original.num_gaussians
            assert not np.array_equal(exported.sh.numpy(), original.sh.numpy())

            # 6. a hue shift of the whole view, applied with back-projection
            page.select_option("#method", "backproject")
            page.locator("#hsv-h").fill("120")
            wait_ready(page)
            page.click("#apply")
            wait_ready(page, "document.body.dataset.entry === '2'")
            shifted = fetch_render(server, sid, view)
            on_object = (after.sum(-1) > 60) & (dist > 12 + 24)
            hue_diff = np.abs(shifted - after).max(-1)[on_object]
            assert hue_diff.mean() > 30, hue_diff.mean()
            # the second tab's session saw none of these edits
            assert other.evaluate("document.body.dataset.entry") == "0"
            assert np.array_equal(fetch_render(server, other_sid, view), before)
            other.close()

            # 7. an edited image of this view made elsewhere, uploaded and applied
            from PIL import Image

            edited = shifted.astype(np.uint8).copy()
            edited[236:276, 300:340] = (255, 0, 0)
            upload = tmp_path / "edited.png"
            Image.fromarray(edited).save(upload)
            page.set_input_files("#upload-edit", str(upload))
            page.wait_for_function("sp.edited !== null")
            wait_ready(page)
            page.click("#apply")
            wait_ready(page, "document.body.dataset.entry === '3'")
            final = fetch_render(server, sid, view)
            square = (final - shifted)[240:272, 304:336]
            assert square[..., 0].mean() > 20 and np.abs(final - shifted)[:200].max() == 0

            # 8. the mask layer (brush, then the eraser) limits a hue change to what stays masked
            page.check("#mask-layer")
            page.check("input[name=tool][value=brush]")
            page.locator("#brush-size").fill("30")
            my = SIZE // 2 + 30
            drag(page, [(x0 + x, y0 + my) for x in range(sx0, sx1 + 1, 10)], pause_ms=5)
            page.check("input[name=tool][value=eraser]")
            page.locator("#brush-size").fill("60")
            ex = SIZE // 2 + 10  # erase the right half of the mask stroke
            drag(page, [(x0 + x, y0 + my) for x in range(ex, sx1 + 40, 8)], pause_ms=5)
            assert page.evaluate("sp.hasMask")
            alpha = "maskLayer.getContext('2d').getImageData({}, {}, 1, 1).data[3]"
            assert page.evaluate(alpha.format(sx0 + 20, my)) == 255
            assert page.evaluate(alpha.format(sx1 - 10, my)) == 0
            page.select_option("#hsv-scope", "mask")
            page.locator("#hsv-h").fill("-150")
            wait_ready(page)
            page.click("#apply")
            wait_ready(page, "document.body.dataset.entry === '4'")
            masked = fetch_render(server, sid, view)
            change = np.abs(masked - final).max(-1)
            kept = np.hypot(np.clip(xx, sx0, ex - 40) - xx, yy - my - 0.5) < 6
            erased = np.hypot(np.clip(xx, ex + 40, sx1) - xx, yy - my - 0.5) < 6
            far = np.abs(yy - my) > 80
            print(
                f"mask: kept {change[kept].mean():.1f}, erased {change[erased].mean():.1f}, "
                f"far {change[far].mean():.3f}"
            )
            assert change[kept].mean() > 20
            assert change[kept].mean() > 3 * change[erased].mean()
            assert change[far].mean() < 1.0

            # 9. open an asset by upload: a new session on it
            page.set_input_files("#open-file", str(saved))
            page.wait_for_function(
                f"sp.sid !== '{sid}' && sp.info && sp.info.name === 'exported.ply'"
            )
            wait_ready(page)
            assert page.evaluate("sp.info.num_gaussians") == original.num_gaussians
            print(f"screenshot: {ARTIFACTS / 'web_editor.png'}")
        finally:
            browser.close()
