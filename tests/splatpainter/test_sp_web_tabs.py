"""One session in several tabs, in Debian's headless Chromium against `splatpainter serve`:
a stale tab's change gets 409 and the tab reloads the session and says so; Ctrl+Z and
Ctrl+Shift+Z; a new session, a reload and a cancel while an edit runs; the session list.

Skips, saying why, only when Playwright or /usr/bin/chromium is missing.  Every wait is on the
page's or the server's own state, never a fixed sleep.
"""

import io
import json
import time
import urllib.request

import numpy as np
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(1200)]

SIZE = 512
WAIT_MS = 180_000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A small asset (fast edits); an optimize edit runs 30 s unless cancelled (long enough to
    reload the page while it runs, even on a loaded machine)."""
    from splatpainter.assets.procedural import make_demo_asset
    from splatpainter.io import save_asset
    from splatpainter.web.harness import ServerProcess

    asset = tmp_path_factory.mktemp("asset") / "small.ply"
    save_asset(make_demo_asset(1500, seed=0).asset, asset)
    args = ("--optimize-steps", "1000000", "--optimize-seconds", "30")
    with ServerProcess(tmp_path_factory.mktemp("work"), asset, *args) as s:
        yield s.url


@pytest.fixture()
def browser(playwright_api):
    from splatpainter.web.harness import launch_chromium

    with playwright_api() as p:
        b = launch_chromium(p)
        try:
            yield b
        finally:
            b.close()


def info_of(url: str, sid: str) -> dict:
    with urllib.request.urlopen(f"{url}api/sessions/{sid}", timeout=300) as r:
        return json.load(r)


def render(url: str, sid: str, view: dict) -> np.ndarray:
    from PIL import Image

    q = "&".join(f"{k}={view[k]}" for k in ("az", "el", "zoom", "pan_x", "pan_y"))
    with urllib.request.urlopen(f"{url}api/sessions/{sid}/render?{q}&w={SIZE}&h={SIZE}") as r:
        return np.asarray(Image.open(io.BytesIO(r.read())).convert("RGB"))


def until_busy(url: str, sid: str) -> dict:
    """Poll the server until the session runs an edit (the page's click has reached it)."""
    for _ in range(20_000):
        info = info_of(url, sid)
        if info["busy"]:
            return info
        time.sleep(0.02)
    raise AssertionError("the edit never started on the server")


def open_page(browser, url: str):
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    page.set_default_timeout(WAIT_MS)
    page.goto(url)
    wait_ready(page)
    return page


def wait_ready(page, extra: str = "true") -> None:
    page.wait_for_function(f"document.body.dataset.ready === '1' && ({extra})", timeout=WAIT_MS)


def paint(page, color: str, method: str) -> None:
    """A thick stroke across the middle of the view (on the object; on the mask layer when
    that is checked), and the method to apply."""
    page.check("input[name=tool][value=brush]")
    page.locator("#brush-color").fill(color)
    page.locator("#brush-size").fill("40")
    page.locator("#brush-hardness").fill("1")
    page.select_option("#method", method)
    box = page.locator("#screen").bounding_box()
    y = box["y"] + SIZE / 2
    page.mouse.move(box["x"] + SIZE / 2 - 60, y)
    page.mouse.down()
    for i in range(13):
        page.mouse.move(box["x"] + SIZE / 2 - 60 + 10 * i, y)
    page.mouse.up()
    assert page.evaluate("sp.hasPaint || sp.hasMask")
    wait_ready(page)


def status_text(page) -> str:
    return page.locator("#status").inner_text()


def test_two_tabs_stale_tab_reloads_and_ctrl_shift_z_redoes(browser, server):
    a = open_page(browser, server)
    sid = a.evaluate("sp.sid")
    b = open_page(browser, f"{server}#s={sid}")
    assert b.evaluate("sp.sid") == sid and b.evaluate("sp.info.revision") == 0
    view = a.evaluate("({...sp.view})")
    before = render(server, sid, view)

    # tab A applies an edit; tab B still shows revision 0
    paint(a, "#00ff00", "backproject")
    a.click("#apply")
    wait_ready(a, "document.body.dataset.entry === '1'")
    after_a = render(server, sid, view)
    assert np.abs(after_a.astype(int) - before).max() > 40
    assert b.evaluate("sp.info.revision") == 0

    # B applies its own paint made on the old state: 409, B reloads and says so, the paint
    # stays for another try, and A's edit is intact on the server
    paint(b, "#0000ff", "backproject")
    b.click("#apply")
    wait_ready(b, "sp.notice === 'stale' && document.body.dataset.entry === '1'")
    assert "another tab" in status_text(b), status_text(b)
    assert b.evaluate("sp.info.revision") == 1 and b.evaluate("sp.info.history.length") == 2
    assert b.evaluate("sp.hasPaint")
    info = info_of(server, sid)
    assert info["revision"] == 1 and info["index"] == 1 and len(info["history"]) == 2
    assert np.array_equal(render(server, sid, view), after_a)

    # applied again, now on the current state, B's edit goes on top of A's
    b.click("#apply")
    wait_ready(b, "document.body.dataset.entry === '2'")
    assert info_of(server, sid)["revision"] == 2

    # A is stale now: its Ctrl+Z is refused and A reloads (nothing undone)
    a.keyboard.press("Control+z")
    a.wait_for_function("sp.notice === 'stale' && document.body.dataset.entry === '2'")
    assert "another tab" in status_text(a)
    assert info_of(server, sid)["index"] == 2
    # on the current revision, Ctrl+Z undoes and Ctrl+Shift+Z redoes
    wait_ready(a)
    a.keyboard.press("Control+z")
    wait_ready(a, "document.body.dataset.entry === '1'")
    a.keyboard.press("Control+Shift+Z")
    wait_ready(a, "document.body.dataset.entry === '2'")
    info = info_of(server, sid)
    assert info["index"] == 2 and info["revision"] == 4 and len(info["history"]) == 3

    # while A runs an edit, B's apply is refused as busy: B shows A's edit running until it
    # ends (here: A cancels it), then takes the session's state, its own paint kept
    paint(a, "#ff0000", "optimize")
    paint(b, "#ffff00", "backproject")
    a.click("#apply")
    until_busy(server, sid)
    b.click("#apply")
    b.wait_for_function("sp.remoteBusy === true && !document.getElementById('progress').hidden")
    assert "an edit is running" in status_text(b), status_text(b)
    a.click("#cancel-apply")
    wait_ready(a, "document.getElementById('status').textContent.includes('cancelled')")
    wait_ready(b, "!sp.remoteBusy && sp.info.revision === 4")
    assert b.evaluate("sp.hasPaint") and b.evaluate("document.body.dataset.entry") == "2"
    assert info_of(server, sid)["revision"] == 4


def test_new_session_reload_and_cancel_while_an_edit_runs(browser, server):
    page = open_page(browser, server)
    first = page.evaluate("sp.sid")

    # 1. "New session" while an apply is on its way: the new session is shown, untouched;
    #    the edit lands in the first session only
    held = []
    page.route("**/apply", lambda route: held.append(route))
    paint(page, "#00ff00", "backproject")
    page.click("#apply")
    page.wait_for_function("!document.getElementById('progress').hidden")
    assert len(held) == 1
    page.click("#new-session")
    wait_ready(page, f"sp.sid !== '{first}'")
    second = page.evaluate("sp.sid")
    held[0].continue_()
    page.unroute("**/apply")
    page.wait_for_function("document.getElementById('status').textContent.includes('left behind')")
    assert info_of(server, first)["index"] == 1
    wait_ready(page, f"sp.sid === '{second}' && document.body.dataset.entry === '0'")
    assert page.evaluate("sp.info.history.length") == 1 and not page.evaluate("sp.hasPaint")
    assert info_of(server, second)["revision"] == 0

    # 2. the session list shows both; a click opens the first one again
    page.click("#refresh-sessions")
    page.wait_for_function(f"!!document.querySelector('#sessions li[data-id=\"{first}\"]')")
    assert page.locator(f'#sessions li[data-id="{second}"]').get_attribute("class") == "current"
    page.click(f'#sessions li[data-id="{first}"]')
    wait_ready(page, f"sp.sid === '{first}' && document.body.dataset.entry === '1'")

    # 3. cancel a running optimisation: nothing changes
    paint(page, "#ff0000", "optimize")
    page.click("#apply")
    until_busy(server, first)
    page.wait_for_function("!document.getElementById('cancel-apply').hidden")
    page.click("#cancel-apply")
    wait_ready(page, "document.getElementById('status').textContent.includes('cancelled')")
    info = info_of(server, first)
    assert info["busy"] is None and info["revision"] == 1 and len(info["history"]) == 2
    assert page.evaluate("document.body.dataset.entry") == "1"
    assert page.locator("#cancel-apply").is_hidden() and page.locator("#progress").is_hidden()

    # 4. reload while an edit runs: the page shows it running, then its result
    page.click("#apply")  # the paint is still there (the cancelled edit kept it)
    until_busy(server, first)
    page.reload()
    page.wait_for_function(
        "sp.remoteBusy === true && !document.getElementById('progress').hidden"
        " && document.body.dataset.ready === '0'"
    )
    assert "an edit is running" in status_text(page), status_text(page)
    wait_ready(page, "document.body.dataset.entry === '2' && !sp.remoteBusy")
    assert not page.evaluate("sp.hasPaint")  # the restored paint was the edit just applied
    info = info_of(server, first)
    assert info["index"] == 2 and info["history"][2]["method"] == "optimize"


def exported(url: str, sid: str):
    from splatpainter.io import ply_from_bytes

    with urllib.request.urlopen(f"{url}api/sessions/{sid}/export?format=ply", timeout=300) as r:
        return ply_from_bytes(r.read())[0]


def test_select_under_the_mask_limit_an_edit_delete_and_undo(browser, server):
    """The mask layer selects the Gaussians under it; an edit with "Only the selection" changes
    none outside it; Delete is undone by Ctrl+Z bit for bit; Adjust colour changes only it."""
    page = open_page(browser, server)
    sid = page.evaluate("sp.sid")
    view = page.evaluate("({...sp.view})")
    original = exported(server, sid)

    # the mask over the left part of the object, then "Select under mask"
    page.check("#mask-layer")
    paint(page, "#ffffff", "backproject")
    page.click("#select-mask")
    page.wait_for_function("sp.selected > 0 && !sp.hasMask")
    with urllib.request.urlopen(f"{server}api/sessions/{sid}/selection", timeout=300) as r:
        chosen = np.array(json.load(r)["indices"])
    assert len(chosen) == page.evaluate("sp.selected")
    assert 0 < len(chosen) < original.num_gaussians
    inside = np.zeros(original.num_gaussians, bool)
    inside[chosen] = True
    page.uncheck("#mask-layer")

    # a hue shift of the whole view, applied to the selection only
    page.check("#limit-selection")
    page.locator("#hsv-h").fill("120")
    wait_ready(page)
    page.click("#apply")
    wait_ready(page, "document.body.dataset.entry === '1'")
    edited = exported(server, sid)
    changed = (edited.sh.numpy() != original.sh.numpy()).any((1, 2))
    assert changed.sum() > 10 and not changed[~inside].any()
    after_edit = render(server, sid, view)

    # delete the selection, then Ctrl+Z: back bit for bit
    page.click("#delete-selection")
    wait_ready(page, "document.body.dataset.entry === '2'")
    gone = exported(server, sid)
    assert (gone.opacities().numpy()[inside] < 1e-9).all()
    assert np.array_equal(
        gone.opacity_logits.numpy()[~inside], original.opacity_logits.numpy()[~inside]
    )
    assert np.abs(render(server, sid, view).astype(int) - after_edit).max() > 30
    page.keyboard.press("Control+z")
    wait_ready(page, "document.body.dataset.entry === '1'")
    assert np.array_equal(render(server, sid, view), after_edit)

    # invert, then an exact colour adjustment (grey) of the rest
    page.click("#select-invert")
    page.wait_for_function(f"sp.selected === {original.num_gaussians - len(chosen)}")
    page.locator("#hsv-s").fill("0")
    page.click("#adjust-selection")
    wait_ready(page, "document.body.dataset.entry === '2'")
    grey = exported(server, sid)
    same = (grey.sh.numpy() == edited.sh.numpy()).all((1, 2))
    assert same[inside].all() and not same[~inside].all()
    dc = grey.sh.numpy()[~inside, 0]
    assert np.abs(dc - dc.mean(-1, keepdims=True)).max() < 1e-5  # grey: r = g = b
    assert page.evaluate("document.getElementById('hsv-s').value") == "1"  # sliders reset
