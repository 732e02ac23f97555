"""Frames per second of the browser editor's 512x512 view while dragging, through its real server.

Starts `splatpainter serve --port 0` (a separate process, as for a user) on the demo asset (or
ASSET; the 37,843-Gaussian chair of issue #22 is not in the repository: pass it, or any asset,
as ASSET) and measures:

- webgl: Debian's headless Chromium (Playwright) opens the page, presses the mouse on the view
  and moves it every 16 ms (as a mouse reports moves) for --seconds: frames the page's WebGL
  viewport (the PlayCanvas engine) *drew* per second, and the requests it made meanwhile (0:
  orbiting never asks the server). Chromium here has no GPU: its WebGL is SwiftShader, software
  GL on the CPU, which bounds this figure; a GPU draws these frames at the display's rate;
- server_frames: the same drag with the viewport library withheld, the page's fallback: every
  frame a 512x512 JPEG rendered by the server (the page's own counter, checked for size);
- http_drag: the server's frames without a browser, two in flight as the fallback keeps them;
  http_drag_1: one at a time; rest: the 512x512 PNG an edit is composed on;
- render512: the renderer alone in this process (no HTTP, no encoding), for the ratio;
- with --tile N (default 10; 0: off): the webgl drag again on the asset tiled N times side by
  side (N x the Gaussians; 50 tiles of the demo is the 1M asset of issue #22), and the time the
  page took to load it: the first page with an empty latent cache (the server opens the asset
  cold: Stage I), the second (server frames) on the latent the server keeps in memory.

The machine may be shared: each figure comes with the CPU seconds the server (and the browser)
spent per frame, measured from /proc, and the load average, so runs can be compared.

    python benchmarks/web_fps.py [--seconds 8] [--frames 40] [--tile 10] [--no-browser] [--json]
                                 [ASSET]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

SIZE = 512


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of process `root` and its live descendants (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()  # fields from the 3rd (state) on
        parents[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += [p for p, pp in parents.items() if pp == pid]
    return total


def measure_http(port: int, sid: str, server_pid: int, frames: int, fmt: str, inflight: int):
    """Frames per second with `inflight` requests outstanding (the page keeps up to 2)."""
    counter = iter(range(10**9))
    lock = threading.Lock()
    latencies: list[float] = []
    server_ms: list[float] = []
    errors: list[str] = []

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while True:
            with lock:
                i = next(counter)
            if i >= frames or errors:
                break
            az, el = 30.0 + 3.0 * i, 20.0 + 0.5 * (i % 10)
            q = f"az={az}&el={el}&w={SIZE}&h={SIZE}&fmt={fmt}"
            t0 = time.perf_counter()
            conn.request("GET", f"/api/sessions/{sid}/render?{q}")
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                errors.append(f"render failed: {r.status} {body[:200]!r}")
                break
            with lock:
                latencies.append(time.perf_counter() - t0)
                timing = r.getheader("Server-Timing") or ""
                server_ms.append(sum(float(x) for x in re.findall(r"dur=([\d.]+)", timing)))
        conn.close()

    warm = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    for _ in range(2):  # warm: the connection, the OpenMP pools of the server's threads
        warm.request("GET", f"/api/sessions/{sid}/render?w={SIZE}&h={SIZE}&fmt={fmt}")
        warm.getresponse().read()
    warm.close()
    threads = [threading.Thread(target=worker) for _ in range(inflight)]
    cpu0, t0 = tree_cpu_seconds(server_pid), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - t0, tree_cpu_seconds(server_pid) - cpu0
    if errors:
        raise SystemExit(errors[0])
    return {
        "size": SIZE,
        "format": fmt,
        "in_flight": inflight,
        "frames": frames,
        "fps": round(frames / wall, 2),
        "latency_ms_median": round(statistics.median(latencies) * 1e3, 1),
        "server_render_encode_ms_median": round(statistics.median(server_ms), 1),
        "server_cpu_ms_per_frame": round(cpu / frames * 1e3, 1),
    }


# Moves the pointer across the view every 16 ms for `seconds` (the mouse button is already down,
# pressed by Playwright): pointer events made in the page, so the driver's own per-event cost
# (a round trip per move) is not counted as the editor's. Counts the frames drawn: the WebGL
# viewport's, or the server frames the fallback showed.
DRIVE = """async ([cx, cy, seconds]) => {
  const screen = document.getElementById("screen");
  const count = () => (sp.gl ? sp.gl.frames : sp.dragFrames);
  const n0 = count(), t0 = performance.now();
  let i = 0;
  await new Promise((done) => {
    const step = () => {
      if (performance.now() - t0 >= seconds * 1000) return done();
      i += 1;  // back and forth across the view, a little up and down
      const x = cx + 150 * (1 - Math.abs((i % 80) / 40 - 1)) - 75;
      const y = cy + 20 * (Math.floor(i / 80) % 2);
      const init = { clientX: x, clientY: y, pointerId: 1, buttons: 1, bubbles: true };
      screen.dispatchEvent(new PointerEvent("pointermove", init));
      setTimeout(step, 16);
    };
    step();
  });
  const size = sp.gl ? [sp.gl.canvas.width, sp.gl.canvas.height] : sp.dragSize;
  return { frames: count() - n0, ms: performance.now() - t0, moves: i, size };
}"""


def measure_browser(url: str, server_pid: int, seconds: float, mode: str) -> dict:
    """Orbit by mouse in headless Chromium for `seconds`; the frames the page drew.

    mode "webgl": the page's WebGL viewport; "server": the viewport library withheld, so the
    page shows server frames (its fallback)."""
    from playwright.sync_api import sync_playwright

    from splatpainter.web.harness import launch_chromium

    with sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": 1120, "height": 780})
            if mode == "server":
                page.route("**/vendor/**", lambda route: route.fulfill(status=404, body="-"))
            t0 = time.perf_counter()
            page.goto(url)
            page.wait_for_function("document.body.dataset.ready === '1'", timeout=600_000)
            load_s = time.perf_counter() - t0
            shown = page.evaluate("document.body.dataset.viewport")
            if shown != mode:
                why = page.evaluate("sp.glWhy")
                raise SystemExit(f"the page shows {shown} frames, not {mode} ({why})")
            box = page.locator("#screen").bounding_box()
            cx, cy = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
            page.mouse.move(cx, cy)
            page.mouse.down()
            page.evaluate(DRIVE, [cx, cy, 1.0])  # warm: connections, the server's threads
            requests: list[str] = []
            page.on("request", lambda r: r.url.startswith(url) and requests.append(r.url))
            # CPU of our process tree (Chromium and Playwright's driver are in it) and the server's
            own0, srv0 = tree_cpu_seconds(os.getpid()), tree_cpu_seconds(server_pid)
            run = page.evaluate(DRIVE, [cx, cy, seconds])
            own1, srv1 = tree_cpu_seconds(os.getpid()), tree_cpu_seconds(server_pid)
            page.mouse.up()
            renderer = page.evaluate(
                "(() => { const gl = document.createElement('canvas').getContext('webgl2');"
                " const e = gl && gl.getExtension('WEBGL_debug_renderer_info');"
                " return e ? gl.getParameter(e.UNMASKED_RENDERER_WEBGL) : 'unknown' })()"
            )
        finally:
            browser.close()
    frames = run["frames"]
    if run["size"] != [SIZE, SIZE]:
        raise SystemExit(f"the page showed {run['size']} frames while dragging, not {SIZE}x{SIZE}")
    per_frame = 1e3 / max(frames, 1)
    return {
        "size": SIZE,
        "frames_from": "WebGL viewport" if mode == "webgl" else "server JPEG",
        "gl_renderer": renderer,
        "page_load_s": round(load_s, 2),
        "seconds": round(run["ms"] / 1e3, 2),
        "pointer_moves": run["moves"],
        "frames": frames,
        "fps": round(frames / (run["ms"] / 1e3), 2),
        "server_requests_while_dragging": len(requests),
        "server_cpu_ms_per_frame": round((srv1 - srv0) * per_frame, 1),
        # Chromium, Playwright's driver and this process (the server, also our child, left out)
        "browser_cpu_ms_per_frame": round(((own1 - own0) - (srv1 - srv0)) * per_frame, 1),
    }


def tiled_asset(asset, tiles: int):
    """`tiles` copies of the asset side by side on a square grid (a larger asset, same kind)."""
    import math

    import torch

    from splatpainter.assets.gaussians import GaussianAsset

    centre, radius = asset.bounding_sphere(sigma=3.0)
    side = math.ceil(math.sqrt(tiles))
    copies = []
    for t in range(tiles):
        offset = torch.tensor([t % side, t // side, 0.0], dtype=asset.means.dtype) * 2.2 * radius
        copies.append(asset.replace(means=asset.means + offset - centre))
    return GaussianAsset.concat(copies)


def render_only(asset, frames: int) -> dict:
    """The renderer alone, in this process, at the same views and size."""
    import torch

    from splatpainter.render import render
    from splatpainter.web.views import OrbitView, orbit_camera

    centre, radius = asset.bounding_sphere(sigma=3.0)
    times, cpus = [], []
    for i in range(frames + 2):
        cam = orbit_camera(OrbitView(az=30.0 + 3.0 * i, width=SIZE, height=SIZE), centre, radius)
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.no_grad():
            render(asset, cam)
        if i >= 2:
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    return {
        "size": SIZE,
        "frames": frames,
        "ms_mean": round(statistics.fmean(times) * 1e3, 2),
        "fps": round(1 / statistics.fmean(times), 2),
        "cpu_ms_per_frame": round(statistics.fmean(cpus) * 1e3, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("asset", nargs="?", type=Path, help=".ply/.splat/.spz (default: the demo)")
    ap.add_argument("--frames", type=int, default=40, help="frames per HTTP measurement")
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each browser drag")
    ap.add_argument("--tile", type=int, default=10, help="also drag on N tiles of it (0: off)")
    ap.add_argument("--no-browser", action="store_true", help="skip the Chromium measurements")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    from splatpainter.assets.demo import demo_ply_path
    from splatpainter.io import load_asset, save_asset
    from splatpainter.model.latent_cache import DIR_ENV
    from splatpainter.web.harness import ServerProcess, chromium_missing
    from splatpainter.web.viewport import vendor_missing

    why_not = "--no-browser" if args.no_browser else chromium_missing()
    why_no_gl = why_not or vendor_missing()
    results: dict = {"cpu_count": os.cpu_count(), "load_average_1m_before": os.getloadavg()[0]}
    asset_path = args.asset or demo_ply_path()
    with tempfile.TemporaryDirectory() as work:
        with ServerProcess(Path(work) / "one", asset_path) as server:
            port = urlsplit(server.url).port
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            conn.request("POST", "/api/sessions")
            info = json.loads(conn.getresponse().read())
            conn.close()
            sid, n = info["id"], args.frames
            results.update(asset=info["name"], num_gaussians=info["num_gaussians"])
            results["webgl"] = (
                {"skipped": why_no_gl}
                if why_no_gl
                else measure_browser(server.url, server.pid, args.seconds, "webgl")
            )
            results["server_frames"] = (
                {"skipped": why_not}
                if why_not
                else measure_browser(server.url, server.pid, args.seconds, "server")
            )
            results["http_drag"] = measure_http(port, sid, server.pid, n, "jpeg", 2)
            results["http_drag_1"] = measure_http(port, sid, server.pid, n, "jpeg", 1)
            results["rest"] = measure_http(port, sid, server.pid, n, "png", 1)
        asset = load_asset(asset_path)
        results["render512"] = render_only(asset, n)
        if args.tile > 1 and not why_no_gl:
            big = tiled_asset(asset, args.tile)
            big_path = Path(work) / f"tiled-{args.tile}.ply"
            save_asset(big, big_path)
            del big
            # an empty latent cache: the first page opens the asset cold (Stage I), as a user's
            # first visit does; the second page's session reuses the server's latent in memory
            os.environ[DIR_ENV] = str(Path(work) / "latents")
            with ServerProcess(Path(work) / "tiled", big_path) as server:
                r = measure_browser(server.url, server.pid, args.seconds, "webgl")
                results["webgl_tiled"] = {"tiles": args.tile, "stage1": "cold", **r}
                r = measure_browser(server.url, server.pid, args.seconds, "server")
                results["server_frames_tiled"] = {"tiles": args.tile, "stage1": "in memory", **r}
        elif args.tile > 1:
            results["webgl_tiled"] = {"skipped": why_no_gl}
    results["num_gaussians_tiled"] = results["num_gaussians"] * max(args.tile, 1)
    results["load_average_1m_after"] = os.getloadavg()[0]
    results["note"] = (
        "Chromium here has no GPU: its WebGL is SwiftShader (software GL on the CPU), which "
        "bounds the webgl figures; on a GPU the viewport draws at the display's rate"
    )
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"{results['asset']}: {results['num_gaussians']} Gaussians, {results['cpu_count']} CPUs, "
        f"load average {results['load_average_1m_before']:.1f} -> "
        f"{results['load_average_1m_after']:.1f}"
    )
    rows = [
        ("webgl", "Chromium drag, WebGL view"),
        ("webgl_tiled", f"  same, {results['num_gaussians_tiled']} tiled"),
        ("server_frames", "Chromium drag, server JPEG"),
        ("server_frames_tiled", f"  same, {results['num_gaussians_tiled']} tiled"),
        ("http_drag", "HTTP, 512 JPEG x2"),
        ("http_drag_1", "HTTP, 512 JPEG x1"),
        ("rest", "HTTP, 512 PNG x1"),
        ("render512", "renderer alone, 512"),
    ]
    for key, what in rows:
        r = results.get(key)
        if r is None:
            continue
        if "skipped" in r:
            print(f"  {what:<28} skipped: {r['skipped']}")
            continue
        cpu = r.get("server_cpu_ms_per_frame", r.get("cpu_ms_per_frame"))
        extra = ""
        if "browser_cpu_ms_per_frame" in r:
            extra = (
                f", browser {r['browser_cpu_ms_per_frame']} ms; "
                f"{r['server_requests_while_dragging']} server requests while dragging; "
                f"page ready in {r['page_load_s']} s"
            )
        print(f"  {what:<28} {r['fps']:6.1f} fps   CPU per frame: server {cpu} ms{extra}")
    gl = results["webgl"].get("gl_renderer")
    print(f"WebGL renderer: {gl}" if gl else "", end="\n" if gl else "")
    print(results["note"])


if __name__ == "__main__":
    sys.exit(main())
