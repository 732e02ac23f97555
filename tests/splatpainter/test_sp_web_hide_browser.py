"""The page's 3D selection tools in Debian's headless Chromium, driven by Playwright against
`splatpainter serve` on a small asset: a box typed into the page limits a painted edit, the
selection is tinted in the WebGL view, hide vanishes it and undo (Ctrl+Z) restores it exactly,
and the selection survives a reload.  Every wait is on the page's own state."""

import io
import urllib.request

import numpy as np
import pytest

from splatpainter.io import load_asset, ply_from_bytes

pytestmark = [pytest.mark.browser, pytest.mark.timeout(1200)]

SIZE = 512
WAIT_MS = 180_000


@pytest.fixture(scope="module")
def server(asset_file, tmp_path_factory):
    from splatpainter.web.harness import ServerProcess

    with ServerProcess(tmp_path_factory.mktemp("web-work"), asset_file) as s:
        yield s.url


@pytest.fixture(scope="module")
def page(playwright_api, server):
    from splatpainter.web.harness import launch_chromium

    with playwright_api() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1120, "height": 900})
            page.set_default_timeout(WAIT_MS)
            page.goto(server)
            wait_ready(page)
            from splatpainter.web.viewport import vendor_missing

            webgl = vendor_missing() is None  # (else the page shows server frames)
            assert page.evaluate("document.body.dataset.viewport") == (
                "webgl" if webgl else "server"
            )
            yield page
        finally:
            browser.close()


def wait_ready(page, extra: str = "true") -> None:
    """The page shows the session's state and, with WebGL, its viewport has settled."""
    page.wait_for_function(
        f"document.body.dataset.ready === '1' && (!sp.gl || sp.gl.settled) && ({extra})"
    )


def ensure_selection(page) -> int:
    """A sphere selection where the view looks, unless the page has one: each test makes its
    own state (pytest-xdist may run a module's tests on different workers, in any order)."""
    if page.evaluate("sp.selected") == 0:
        wait_ready(page)
        page.select_option("#shape-kind", "sphere")
        page.click("#shape-fit")
        page.click("#select-shape")
        page.wait_for_function(
            "sp.selected > 0 && sp.selection && sp.selection.length === sp.selected"
        )
        wait_ready(page)
    return page.evaluate("sp.selected")


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url) as r:
        return r.read()


def exported(server: str, sid: str):
    return ply_from_bytes(fetch(f"{server}api/sessions/{sid}/export?format=ply"))[0]


def server_frame(server: str, page, size: int = 128) -> np.ndarray:
    from PIL import Image

    sid, v = page.evaluate("sp.sid"), page.evaluate("({...sp.view})")
    q = "&".join(f"{k}={v[k]}" for k in ("az", "el", "zoom", "pan_x", "pan_y"))
    data = fetch(f"{server}api/sessions/{sid}/render?{q}&w={size}&h={size}")
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)


def data_url_pixels(url: str) -> np.ndarray:
    import base64

    from PIL import Image

    data = base64.b64decode(url.partition(",")[2])
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)


def gl_pixels(page) -> np.ndarray | None:
    """The WebGL view as the page draws it (None: server frames)."""

    if not page.evaluate("!!sp.gl"):
        return None
    return data_url_pixels(page.evaluate("sp.gl.snapshot()"))


def paint_stroke(page) -> None:
    """A green stroke across the middle of the view."""
    page.check("input[name=tool][value=brush]")
    wait_ready(page)  # (server frames: the plain frame of the view, to paint on)
    page.locator("#brush-color").fill("#00ff00")
    page.locator("#brush-size").fill("30")
    box = page.locator("#screen").bounding_box()
    y = box["y"] + SIZE / 2
    page.mouse.move(box["x"] + SIZE / 2 - 150, y)
    page.mouse.down()
    for dx in range(-150, 151, 15):
        page.mouse.move(box["x"] + SIZE / 2 + dx, y)
    page.mouse.up()
    assert page.evaluate("sp.hasPaint")


def apply_and_wait(page, entry: int) -> None:
    wait_ready(page)
    page.click("#apply")
    wait_ready(page, f"document.body.dataset.entry === '{entry}'")


def test_a_box_typed_in_the_page_limits_an_edit(page, server, asset_file):
    original = load_asset(asset_file)
    means = original.means.double().numpy()
    sid = page.evaluate("sp.sid")
    # the box: the Gaussians on one side of the median y (across the screen at the start view)
    lo, hi = means.min(0) - 0.01, means.max(0) + 0.01
    hi[1] = float(np.median(means[:, 1]))
    inside = ((means >= lo) & (means <= hi)).all(-1)
    centre, half = (lo + hi) / 2, (hi - lo) / 2
    page.select_option("#shape-kind", "box")
    for axis, c, h in zip("xyz", centre, half, strict=True):
        page.fill(f"#shape-c{axis}", repr(float(c)))
        page.fill(f"#shape-s{axis}", repr(float(h)))
    page.select_option("#sel-mode", "replace")
    page.click("#select-shape")
    n = int(inside.sum())
    page.wait_for_function(f"sp.selected === {n}")
    assert page.inner_text("#selected-count") == f"{n} selected"
    if page.evaluate("!!sp.gl"):  # the selection is tinted in the WebGL view
        page.wait_for_function(f"sp.gl.highlighted === {n}")
        wait_ready(page)
        lit = gl_pixels(page)
        page.uncheck("#show-selection")
        wait_ready(page, "sp.gl.highlighted === 0")
        plain = gl_pixels(page)
        page.check("#show-selection")
        wait_ready(page, f"sp.gl.highlighted === {n}")
        tint = np.abs(lit - plain).max(-1)
        assert (tint > 20).sum() > 500, (tint > 20).sum()
        assert np.array_equal(gl_pixels(page), lit)

    # the same stroke applied without and with "Only the selection"
    page.select_option("#method", "backproject")
    paint_stroke(page)
    apply_and_wait(page, 1)
    free = (exported(server, sid).sh.numpy() != original.sh.numpy()).any((1, 2))
    assert free[inside].sum() > 5 and free[~inside].sum() > 5  # the stroke spans both sides
    page.click("#undo")
    wait_ready(page, "document.body.dataset.entry === '0'")
    page.check("#limit-selection")
    paint_stroke(page)
    apply_and_wait(page, 1)
    page.uncheck("#limit-selection")
    limited = (exported(server, sid).sh.numpy() != original.sh.numpy()).any((1, 2))
    assert limited.sum() > 5 and not limited[~inside].any()


def test_hide_vanishes_the_selection_and_undo_restores_it(page, server, asset_file):
    old = page.evaluate("sp.sid")
    page.click("#new-session")
    page.wait_for_function(f"sp.sid !== '{old}' && sp.info && sp.info.id === sp.sid")
    wait_ready(page)
    page.select_option("#shape-kind", "sphere")
    page.click("#shape-fit")  # where the view looks, a quarter of the asset
    assert float(page.input_value("#shape-sx")) > 0
    page.click("#select-shape")
    page.wait_for_function("sp.selected > 0 && sp.selection && sp.selection.length === sp.selected")
    n = page.evaluate("sp.selected")
    wait_ready(page)
    before, gl_before = server_frame(server, page), gl_pixels(page)

    page.click("#hide-selection")
    wait_ready(page, "document.body.dataset.entry === '1'")
    assert page.inner_text("#hidden-count") == f"{n} hidden"
    assert np.abs(server_frame(server, page) - before).max() > 30
    webgl = gl_before is not None
    op = "sp.gl.asset.resource.gsplatData.getProp('opacity')[sp.selection[0]]"
    if webgl:  # gone from the page's own view too
        assert page.evaluate(op) == -31.0
        assert np.abs(gl_pixels(page) - gl_before).max() > 30
    page.keyboard.press("Control+z")
    wait_ready(page, "document.body.dataset.entry === '0'")
    assert page.inner_text("#hidden-count") == "0 hidden"
    assert np.array_equal(server_frame(server, page), before)
    original = load_asset(asset_file)
    if webgl:
        first = page.evaluate("sp.selection[0]")
        assert page.evaluate(op) == pytest.approx(float(original.opacity_logits[first]), abs=0)
        assert np.abs(gl_pixels(page) - gl_before).mean() < 0.5
    # redo, then Unhide all: shown again, exactly
    page.keyboard.press("Control+Shift+z")
    wait_ready(page, "document.body.dataset.entry === '1'")
    page.click("#unhide-all")
    wait_ready(page, "document.body.dataset.entry === '2'")
    assert page.inner_text("#hidden-count") == "0 hidden"
    assert np.array_equal(server_frame(server, page), before)


def test_the_selection_survives_a_reload(page):
    n = ensure_selection(page)
    assert n > 0
    indices = page.evaluate("Array.from(sp.selection)")
    page.reload()
    wait_ready(page, f"sp.selection !== null && sp.selection.length === {n}")
    assert page.evaluate("Array.from(sp.selection)") == indices
    assert page.inner_text("#selected-count") == f"{n} selected"
    if page.evaluate("!!sp.gl"):
        page.wait_for_function(f"sp.gl.highlighted === {n}")


def test_server_frames_tint_the_selection_but_edits_paint_on_the_plain_frame(server, page):
    """Without the WebGL library: the frames shown while orbiting have the selection tinted;
    a painting tool gets the plain frame, which is what an edit is composed on."""
    assert ensure_selection(page) > 0
    sid = page.evaluate("sp.sid")
    other = page.context.browser.new_page(viewport={"width": 1120, "height": 900})
    try:
        other.set_default_timeout(WAIT_MS)
        other.route("**/vendor/**", lambda route: route.fulfill(status=404, body="missing"))
        frames = []
        other.on("request", lambda r: "/render?" in r.url and frames.append(r.url))
        other.goto(f"{server}#s={sid}")
        wait_ready(other, f"sp.sid === '{sid}' && sp.lit !== null")
        assert other.evaluate("document.body.dataset.viewport") == "server"
        assert any("highlight=true" in u for u in frames)
        shown = data_url_pixels(other.evaluate("compose(work, sp.frame), work.toDataURL()"))
        plain = server_frame(server, other, SIZE)
        assert (np.abs(shown - plain).max(-1) > 20).sum() > 500
        entry = int(other.evaluate("sp.info.index"))
        other.select_option("#method", "backproject")
        paint_stroke(other)  # the brush: the plain frame
        wait_ready(other)
        base = data_url_pixels(
            other.evaluate(
                "(() => { const c = work.getContext('2d'); c.clearRect(0, 0, 512, 512);"
                " c.drawImage(sp.base, 0, 0); return work.toDataURL(); })()"
            )
        )
        assert np.array_equal(base, plain)
        apply_and_wait(other, entry + 1)
    finally:
        other.close()
