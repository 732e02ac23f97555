"""The browser editor's guards over real HTTP, against `splatpainter serve` in a child process:
Host (DNS rebinding) and Origin checks, JSON-only endpoints, stale revisions from another tab,
cancel, the session list, the session count and disk quota, and unfinished saves removed at
start."""

import json
import os
import signal
import subprocess
import sys
import threading
from urllib.parse import urlsplit

import numpy as np
import pytest

pytest.importorskip("fastapi")

from splatpainter.assets.procedural import make_demo_asset
from splatpainter.io import save_asset
from splatpainter.web.app import check_request
from splatpainter.web.harness import TEST_VIEW as VIEW
from splatpainter.web.harness import ServerProcess, new_session
from splatpainter.web.harness import http_call as call
from splatpainter.web.harness import paint_body as edit_body
from splatpainter.web.harness import server_frame as frame

pytestmark = pytest.mark.timeout(900)
SIZE = 64
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(asset_file, tmp_path_factory):
    with ServerProcess(tmp_path_factory.mktemp("work"), asset_file) as s:
        yield s


def own(url: str) -> str:
    return urlsplit(url).netloc


def session_ids(url: str) -> list[str]:
    status, listing = call(url, "GET", "/api/sessions")
    assert status == 200, listing
    return [s["id"] for s in listing["sessions"]]


# ---------------------------------------------------------------------- Host and Origin
def test_a_foreign_host_is_refused_with_421(server):
    """A DNS-rebound name (the attacker's domain resolving to 127.0.0.1) is not served, nor is
    the right address at another port; the bound address and localhost are."""
    port = urlsplit(server.url).port
    before = session_ids(server.url)
    for host in (f"evil.example:{port}", "evil.example", "127.0.0.1", f"127.0.0.1:{port + 1}"):
        for method, path in (("GET", "/api/health"), ("POST", "/api/sessions"), ("GET", "/")):
            status, body = call(server.url, method, path, headers={"Host": host})
            assert status == 421, (host, path, status)
            assert host in body["detail"] and "localhost" in body["detail"], body
    assert session_ids(server.url) == before  # the refused POSTs created nothing
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"):
        status, body = call(server.url, "GET", "/api/health", headers={"Host": host})
        assert status == 200 and body["status"] == "ok", (host, body)


def test_a_cross_origin_request_is_refused_with_403(server):
    """Another page in the user's browser cannot create sessions or edit: its Origin (or the
    browser's Sec-Fetch-Site) gives it away; the page's own requests still work."""
    sid = new_session(server.url)["id"]
    before = session_ids(server.url)
    text = {"Content-Type": "text/plain"}
    for origin in ("http://evil.example", "null", f"http://localhost:{urlsplit(server.url).port}"):
        status, body = call(
            server.url, "POST", "/api/sessions", b"", headers={**text, "Origin": origin}
        )
        assert status == 403 and origin in body["detail"], (origin, status, body)
        status, body = call(
            server.url,
            "POST",
            f"/api/sessions/{sid}/apply",
            json.dumps(edit_body(server.url, sid, 0)).encode(),
            headers={**text, "Origin": origin},
        )
        assert status == 403, (origin, status, body)
    status, body = call(
        server.url, "POST", "/api/sessions", b"", headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert status == 403 and "cross-site" in body["detail"]
    assert session_ids(server.url) == before
    status, info = call(server.url, "GET", f"/api/sessions/{sid}")
    assert info["revision"] == 0 and len(info["history"]) == 1  # no edit got through
    # the same origin: served (a link from elsewhere may still open the page itself)
    mine = {"Origin": f"http://{own(server.url)}", "Sec-Fetch-Site": "same-origin"}
    status, created = call(server.url, "POST", "/api/sessions", b"", headers=mine)
    assert status == 200, created
    status, applied = call(
        server.url,
        "POST",
        f"/api/sessions/{sid}/apply",
        edit_body(server.url, sid, 0),
        headers=mine,
    )
    assert status == 200 and applied["revision"] == 1, applied
    nav = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    status, page = call(server.url, "GET", "/", headers=nav)
    assert status == 200 and b"<canvas" in page
    lh = {"Host": f"localhost:{urlsplit(server.url).port}"}
    status, _ = call(
        server.url, "GET", "/api/health", headers={**lh, "Origin": f"http://{lh['Host']}"}
    )
    assert status == 200


def test_json_endpoints_take_only_application_json(server):
    sid = new_session(server.url)["id"]
    body = json.dumps({"revision": 0}).encode()
    view = json.dumps({**VIEW, "width": SIZE, "height": SIZE}).encode()
    apply = json.dumps(edit_body(server.url, sid, 0)).encode()
    for method, path, data, ctype in [
        ("POST", f"/api/sessions/{sid}/reset", body, "text/plain"),
        ("POST", f"/api/sessions/{sid}/reset", body, None),
        ("PUT", f"/api/sessions/{sid}/view", view, "application/x-www-form-urlencoded"),
        ("POST", f"/api/sessions/{sid}/apply", apply, "multipart/form-data; boundary=x"),
    ]:
        headers = {"Content-Type": ctype} if ctype else {}
        status, answer = call(server.url, method, path, data, headers=headers)
        assert status == 415, (path, ctype, status, answer)
        assert "application/json" in answer["detail"], answer
    status, info = call(server.url, "GET", f"/api/sessions/{sid}")
    assert len(info["history"]) == 1 and info["revision"] == 0
    status, info = call(
        server.url,
        "POST",
        f"/api/sessions/{sid}/reset",
        body,
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert status == 200 and info["revision"] == 1


def test_check_request_parses_hosts_strictly():
    """IPv6 literals, default ports and malformed Host values (no server needed)."""
    v6 = ("::1", 7860)
    assert check_request("GET", {"host": "[::1]:7860"}, v6) is None
    assert check_request("GET", {"host": "localhost:7860"}, v6) is None
    for bad in ("[::1]:7861", "[::1", "::1:7860", "", "localhost:78x0", "localhost:7860:1"):
        assert check_request("GET", {"host": bad}, v6)[0] == 421, bad
    assert check_request("GET", {"host": "testserver"}, ("testserver", 80)) is None
    assert (
        check_request("GET", {"host": "editor.lan:80"}, ("10.0.0.2", 80), ("editor.lan",)) is None
    )
    assert check_request("GET", {"host": "editor.lan"}, ("10.0.0.2", 80))[0] == 421
    ok = {"host": "127.0.0.1:7860", "origin": "http://127.0.0.1:7860"}
    assert check_request("POST", ok, ("127.0.0.1", 7860)) is None
    assert check_request("POST", {**ok, "origin": "http://127.0.0.1:7861"}, None)[0] == 403


# ---------------------------------------------------------------------- one session, many tabs
def test_a_stale_revision_gets_409_and_changes_nothing(server):
    """Tab A applies; tab B, still on revision 0, cannot undo, apply or jump over A's edit."""
    sid = new_session(server.url)["id"]
    status, a = call(
        server.url, "POST", f"/api/sessions/{sid}/apply", edit_body(server.url, sid, 0)
    )
    assert status == 200 and a["revision"] == 1 and a["index"] == 1 and a["changed"], a
    after_a = frame(server.url, sid)
    for action, body in [
        ("undo", {"revision": 0}),
        ("reset", {"revision": 0}),
        ("goto/0", {"revision": 0}),
        ("apply", edit_body(server.url, sid, 0)),
        ("undo", {"revision": 7}),
    ]:
        status, answer = call(server.url, "POST", f"/api/sessions/{sid}/{action}", body)
        assert status == 409, (action, status, answer)
        assert answer["error"] == "stale" and answer["revision"] == 1, answer
        assert "another tab" in answer["detail"], answer
    status, info = call(server.url, "GET", f"/api/sessions/{sid}")
    assert info["revision"] == 1 and info["index"] == 1 and len(info["history"]) == 2
    assert np.array_equal(frame(server.url, sid), after_a)  # A's edit stands
    # made on the current revision, the same requests go through, each bumping it
    status, info = call(server.url, "POST", f"/api/sessions/{sid}/undo", {"revision": 1})
    assert status == 200 and info["revision"] == 2 and info["index"] == 0
    status, answer = call(server.url, "POST", f"/api/sessions/{sid}/redo", {"revision": 1})
    assert status == 409 and answer["error"] == "stale"
    status, info = call(server.url, "POST", f"/api/sessions/{sid}/redo", {"revision": 2})
    assert status == 200 and info["revision"] == 3 and info["index"] == 1


def test_cancel_stops_a_running_apply_and_leaves_no_trace(server):
    sid = new_session(server.url)["id"]
    body = edit_body(server.url, sid, 0, method="optimize", size=512)
    result = {}

    def run():
        result["answer"] = call(server.url, "POST", f"/api/sessions/{sid}/apply", body)

    status, answer = call(server.url, "POST", f"/api/sessions/{sid}/cancel")
    assert status == 200 and answer == {"cancelled": False}  # nothing runs yet
    worker = threading.Thread(target=run)
    worker.start()
    try:
        while True:  # until the server reports the edit running (or it ended: then fail)
            status, info = call(server.url, "GET", f"/api/sessions/{sid}")
            if info["busy"] or "answer" in result:
                break
        assert info["busy"] and info["busy"]["what"] == "applying (optimize)", (info, result)
        status, answer = call(server.url, "POST", f"/api/sessions/{sid}/cancel")
        assert status == 200 and answer == {"cancelled": True}
    finally:
        worker.join(timeout=600)
    status, answer = result["answer"]
    assert status == 409 and answer["error"] == "cancelled", answer
    status, info = call(server.url, "GET", f"/api/sessions/{sid}")
    assert info["busy"] is None and info["revision"] == 0 and len(info["history"]) == 1
    # the session works on: the same edit, not cancelled, goes through
    status, info = call(
        server.url, "POST", f"/api/sessions/{sid}/apply", edit_body(server.url, sid, 0)
    )
    assert status == 200 and info["revision"] == 1


def test_session_list_and_delete(server):
    a = new_session(server.url)["id"]
    b = new_session(server.url)["id"]
    call(server.url, "POST", f"/api/sessions/{a}/apply", edit_body(server.url, a, 0))
    status, listing = call(server.url, "GET", "/api/sessions")
    assert status == 200 and listing["max_sessions"] == 100
    by_id = {s["id"]: s for s in listing["sessions"]}
    assert by_id[a]["entries"] == 2 and by_id[a]["revision"] == 1 and by_id[b]["entries"] == 1
    assert by_id[a]["name"] == "small.ply" and by_id[a]["bytes"] > 0
    ids = [s["id"] for s in listing["sessions"]]
    assert ids.index(a) < ids.index(b)  # a was used last: listed first
    status, answer = call(server.url, "DELETE", f"/api/sessions/{b}")
    assert status == 200 and answer == {"deleted": b}
    assert b not in session_ids(server.url)
    assert call(server.url, "GET", f"/api/sessions/{b}")[0] == 404


# ---------------------------------------------------------------------- quota and temp files
def test_the_least_recently_used_sessions_are_evicted(asset_file, tmp_path):
    """At most 3 sessions and 4 MiB: a fourth session deletes the least recently used one;
    a large upload deletes as many more as the disk quota needs.  Never the one in use."""
    work = tmp_path / "work"
    limits = ("--max-sessions", "3", "--max-disk-mb", "4", "--allow-host", "editor.lan")
    with ServerProcess(work, asset_file, *limits) as s:
        # (--allow-host: a name of the user's choosing is served, others still are not)
        port = urlsplit(s.url).port
        for host, want in ((f"editor.lan:{port}", 200), (f"editor.lan.evil:{port}", 421)):
            assert call(s.url, "GET", "/api/health", headers={"Host": host})[0] == want, host
        a, b, c = (new_session(s.url)["id"] for _ in range(3))
        assert call(s.url, "GET", f"/api/sessions/{a}")[0] == 200  # a is used: b is oldest
        d = new_session(s.url)["id"]
        assert sorted(session_ids(s.url)) == sorted([a, c, d])
        status, _ = call(s.url, "GET", f"/api/sessions/{b}")
        assert status == 404 and not (work / "sessions" / b).exists()
        sizes = {i["id"]: i["bytes"] for i in call(s.url, "GET", "/api/sessions")[1]["sessions"]}
        print("session bytes:", sizes)
        assert sum(sizes.values()) <= 4 << 20 < sum(sizes.values()) + sizes[a]
        # an upload about twice a session's size: c goes for the count, then a for the bytes
        big = tmp_path / "big.ply"
        save_asset(make_demo_asset(6000, seed=1).asset, big)
        status, up = call(
            s.url,
            "POST",
            "/api/sessions?name=big.ply",
            big.read_bytes(),
            headers={"Content-Type": "application/octet-stream"},
        )
        assert status == 200, up
        status, listing = call(s.url, "GET", "/api/sessions")
        print("after the upload:", [(i["name"], i["bytes"]) for i in listing["sessions"]])
        assert [i["id"] for i in listing["sessions"]] == [up["id"], d]
        assert sum(i["bytes"] for i in listing["sessions"]) <= 4 << 20
        assert sorted(p.name for p in (work / "sessions").iterdir()) == sorted([up["id"], d])


def test_an_interrupted_save_leaves_no_temp_file_after_a_restart(asset_file, tmp_path):
    """A process killed (SIGKILL) in the middle of a session save leaves its temp file; the
    next start removes it, keeps the session as last saved, and keeps unrelated files."""
    work = tmp_path / "work"
    with ServerProcess(work, asset_file) as s:
        sid = new_session(s.url)["id"]
        status, info = call(s.url, "POST", f"/api/sessions/{sid}/apply", edit_body(s.url, sid, 0))
        assert status == 200
        saved = frame(s.url, sid)
    target = work / "sessions" / sid / "session.spsession"
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal, sys\n"
            "from appshell.atomic import atomic_open\n"
            "with atomic_open(sys.argv[1]) as f:\n"
            "    f.write(b'x' * (8 << 20)); f.flush()\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n",
            str(target),
        ],
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL
    temps = sorted(p.name for p in target.parent.glob(".*.tmp"))
    assert len(temps) == 1 and temps[0].startswith(".session.spsession."), temps
    keep = target.parent / "notes.tmp"
    keep.write_text("mine")
    with ServerProcess(work, asset_file) as s:
        assert any("unfinished save" in line for line in s.output), s.output
        assert not list((work / "sessions").rglob(".*.tmp"))
        assert keep.read_text() == "mine"
        status, info = call(s.url, "GET", f"/api/sessions/{sid}")
        assert status == 200 and info["revision"] == 1 and info["index"] == 1
        assert np.array_equal(frame(s.url, sid), saved)
    assert os.path.getsize(target) > 0
