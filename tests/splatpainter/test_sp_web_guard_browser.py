"""The browser editor's Origin and Host guards driven from Chromium, the way an attacker's page
reaches them: a page of another origin posting to the editor (a `no-cors` text/plain POST,
which browsers send without asking first, and a JSON POST), and the editor's own port under a
DNS name rebound to 127.0.0.1 (Chromium's --host-resolver-rules). The editor's own page, same
origin, still works."""

import functools
import http.server
import threading
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi")

from splatpainter.web.harness import ServerProcess, launch_chromium
from splatpainter.web.harness import http_call as call

pytestmark = [pytest.mark.timeout(900), pytest.mark.browser]


@pytest.fixture(scope="module")
def server(asset_file, tmp_path_factory):
    with ServerProcess(tmp_path_factory.mktemp("work"), asset_file) as s:
        yield s.url


@pytest.fixture
def elsewhere(tmp_path):
    """A page on another origin (a plain HTTP server on another port)."""
    (tmp_path / "index.html").write_text("<!doctype html><title>elsewhere</title><p>hello")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


def session_ids(url: str) -> set[str]:
    status, listing = call(url, "GET", "/api/sessions")
    assert status == 200, listing
    return {s["id"] for s in listing["sessions"]}


POST = """([url, mode, type]) => fetch(url + 'api/sessions', {method: 'POST', mode,
    headers: {'Content-Type': type}, body: ''}).then(r => r.type === 'opaque' ? 'opaque'
    : r.status, () => 'blocked')"""


def test_another_origin_cannot_create_sessions_and_the_own_page_can(
    playwright_api, server, elsewhere
):
    before = session_ids(server)
    with playwright_api() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page()
            page.goto(elsewhere)
            # (an empty POST creates a session) sent by the browser, its answer hidden from the
            # page: the server must refuse it
            assert page.evaluate(POST, [server, "no-cors", "text/plain"]) == "opaque"
            assert page.evaluate(POST, [server, "cors", "application/json"]) == "blocked"
            assert session_ids(server) == before
            page.goto(server)  # the editor's own page opens a session for the tab
            page.wait_for_function("document.body.dataset.ready === '1'")
            sid = page.evaluate("sp.sid")
            assert sid not in before and session_ids(server) == before | {sid}
            assert page.evaluate(POST, [server, "same-origin", "application/json"]) == 200
            assert len(session_ids(server)) == len(before) + 2
        finally:
            browser.close()


def test_a_rebound_dns_name_gets_421_and_localhost_is_served(playwright_api, server):
    port = urlsplit(server).port
    with playwright_api() as p:
        browser = launch_chromium(p, "--host-resolver-rules=MAP rebound.test 127.0.0.1")
        try:
            page = browser.new_page()
            answer = page.goto(f"http://rebound.test:{port}/")
            assert answer is not None and answer.status == 421
            assert "rebound.test" in page.content()  # the refusal names the Host it refused
            answer = page.goto(f"http://localhost:{port}/")
            assert answer is not None and answer.status == 200
        finally:
            browser.close()
