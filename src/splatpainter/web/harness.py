"""The editor run the way a user runs it, for the browser tests and `benchmarks/web_fps.py`:
`splatpainter serve` as a child process (its printed URL read back, so port 0 works) and
Debian's headless Chromium driven by Playwright (never a browser Playwright downloads).
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
)
URL_LINE = re.compile(r"serving SplatPainter on (http://\S+)")


class ServerProcess:
    """`splatpainter serve --port 0 --workdir WORK [ASSET] [ARGS...]` in a child process.

    A context manager: entering waits (up to `timeout` s) for the URL it prints; leaving stops
    it (terminate, then kill). `output` keeps what it printed.
    """

    def __init__(
        self, workdir: Path, asset: Path | None = None, *args: str, timeout: float = 600.0
    ) -> None:
        self.cmd = [sys.executable, "-m", "splatpainter.cli", "serve", "--port", "0"]
        self.cmd += ["--workdir", str(workdir), *args]
        if asset is not None:
            self.cmd.append(str(asset))
        self.timeout = timeout
        self.output: list[str] = []
        self.url = ""
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        lines: queue.Queue = queue.Queue()

        def drain() -> None:  # keeps reading, so the server never blocks on a full pipe
            for line in self.proc.stdout:
                lines.put(line)

        threading.Thread(target=drain, daemon=True).start()
        deadline = time.monotonic() + self.timeout
        try:
            while not self.url and time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    line = lines.get(timeout=1)
                except queue.Empty:
                    continue
                self.output.append(line)
                m = URL_LINE.search(line)
                self.url = m.group(1) if m else ""
            if not self.url:
                raise RuntimeError(f"the server did not start: {''.join(self.output)[-2000:]}")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=20)


def http_call(url: str, method: str, path: str, body=None, headers=None, timeout=600.0):
    """(status, JSON or bytes) of one real HTTP request to the server at `url`; a dict body is
    sent as JSON; `headers` may set Host itself (http.client then sends no other)."""
    import http.client
    import json
    from urllib.parse import urlsplit

    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        if isinstance(body, dict):
            body = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        if r.headers.get_content_type() == "application/json":
            return r.status, json.loads(data)
        return r.status, data
    finally:
        conn.close()


def chromium_missing() -> str | None:
    """Why the browser cannot be driven here (None: it can)."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as e:
        return f"the playwright package is missing ({e}); bash scripts/setup.sh installs it"
    if not os.access(CHROMIUM, os.X_OK):
        return (
            f"{CHROMIUM} is missing: scripts/test.sh installs Debian's chromium with apt when apt "
            "is there and permitted (root or sudo); it was not installed here"
        )
    return None


def launch_chromium(playwright, *extra_args: str):
    """Headless Debian Chromium from a started `sync_playwright()` (extra command-line flags
    after ours, e.g. a --host-resolver-rules for a rebound DNS name)."""
    return playwright.chromium.launch(
        executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, *extra_args], headless=True
    )


# The view the HTTP tests draw and paint on (the server's render query parameters).
TEST_VIEW = {"az": 30.0, "el": 20.0, "zoom": 1.0, "pan_x": 0.0, "pan_y": 0.0}


def new_session(url: str) -> dict:
    """A new session on the server at `url` (its JSON)."""
    status, info = http_call(url, "POST", "/api/sessions")
    if status != 200:
        raise RuntimeError(f"POST /api/sessions answered {status}: {info}")
    return info


def server_frame(url: str, sid: str, size: int = 64, view: dict | None = None):
    """The server's lossless frame [size, size, 3] uint8 of session `sid` at `view`."""
    import io

    import numpy as np
    from PIL import Image

    q = "&".join(f"{k}={v}" for k, v in (view or TEST_VIEW).items())
    status, data = http_call(url, "GET", f"/api/sessions/{sid}/render?{q}&w={size}&h={size}")
    if status != 200:
        raise RuntimeError(f"render answered {status}: {data}")
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def png_data_url(img) -> str:
    """A uint8 image as the PNG data URL the page sends."""
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def paint_body(url: str, sid: str, revision: int, method="backproject", size: int = 64) -> dict:
    """An apply body: the session's frame at TEST_VIEW with a magenta square over its centre
    quarter (on the object)."""
    img = server_frame(url, sid, size).copy()
    c, h = size // 2, size // 8
    img[c - h : c + h, c - h : c + h] = (255, 0, 255)
    return {
        "view": {**TEST_VIEW, "width": size, "height": size},
        "image": png_data_url(img),
        "method": method,
        "revision": revision,
    }
