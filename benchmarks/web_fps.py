"""Frames per second of the browser editor's view, through its real HTTP server.

Starts `splatpainter serve --port 0` (a separate process, as for a user), opens a session on the
demo asset (or ASSET) and requests frames the way the page does while the user drags: up to two
requests in flight, each for the next orbit step.  Reports, per frame kind:

- drag:  JPEG at --drag-size with two requests in flight, as the page does while dragging (shown
  scaled to 512x512); drag_1_in_flight: the same, one at a time;
- drag512: JPEG at 512x512, two in flight (dragging without the reduced size);
- rest:  PNG at 512x512 (the frame the page shows, and paints on, when the view rests);
- render512: the renderer alone at 512x512 (no HTTP, no encoding), for the ratio.

    python benchmarks/web_fps.py [--frames 40] [--drag-size 256] [--json] [ASSET]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def start_server(work: str, asset: Path | None) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, "-m", "splatpainter.cli", "serve", "--port", "0", "--workdir", work]
    if asset is not None:
        cmd.append(str(asset))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        m = re.search(r"serving SplatPainter on http://127\.0\.0\.1:(\d+)/", line)
        if m:
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining
            return proc, int(m.group(1))
    raise SystemExit(f"the server did not start:\n{''.join(seen)}")


def measure(port: int, sid: str, frames: int, size: int, fmt: str, inflight: int) -> dict:
    """Frames per second with `inflight` requests outstanding (the page keeps up to 2)."""
    counter = iter(range(10**9))
    lock = threading.Lock()
    latencies: list[float] = []
    server_ms: list[float] = []

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        while True:
            with lock:
                i = next(counter)
            if i >= frames:
                break
            az, el = 30.0 + 3.0 * i, 20.0 + 0.5 * (i % 10)
            t0 = time.perf_counter()
            conn.request(
                "GET", f"/api/sessions/{sid}/render?az={az}&el={el}&w={size}&h={size}&fmt={fmt}"
            )
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                raise SystemExit(f"render failed: {r.status} {body[:200]!r}")
            with lock:
                latencies.append(time.perf_counter() - t0)
                timing = r.getheader("Server-Timing") or ""
                server_ms.append(sum(float(x) for x in re.findall(r"dur=([\d.]+)", timing)))
        conn.close()

    for _ in range(2):  # warm: connections, caches, the OpenMP pools of the server's threads
        worker_conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        worker_conn.request("GET", f"/api/sessions/{sid}/render?w={size}&h={size}&fmt={fmt}")
        worker_conn.getresponse().read()
        worker_conn.close()
    threads = [threading.Thread(target=worker) for _ in range(inflight)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "size": size,
        "format": fmt,
        "in_flight": inflight,
        "frames": frames,
        "fps": round(frames / wall, 2),
        "latency_ms_median": round(statistics.median(latencies) * 1e3, 1),
        "server_ms_median": round(statistics.median(server_ms), 1),
    }


def render_only(asset, frames: int) -> dict:
    """The renderer alone, in this process, at the same views and size as the page at rest."""
    import torch

    from splatpainter.render import render
    from splatpainter.web.views import OrbitView, orbit_camera

    centre, radius = asset.bounding_sphere(sigma=3.0)
    times = []
    for i in range(frames + 2):
        cam = orbit_camera(OrbitView(az=30.0 + 3.0 * i, width=512, height=512), centre, radius)
        t0 = time.perf_counter()
        with torch.no_grad():
            render(asset, cam)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    mean = statistics.fmean(times)
    return {
        "size": 512,
        "frames": frames,
        "ms_mean": round(mean * 1e3, 2),
        "fps": round(1 / mean, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("asset", nargs="?", type=Path, help=".ply/.splat (default: the demo asset)")
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--drag-size", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    from splatpainter.assets.demo import demo_ply_path
    from splatpainter.io import load_asset

    with tempfile.TemporaryDirectory() as work:
        proc, port = start_server(work, args.asset)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            conn.request("POST", "/api/sessions")
            info = json.loads(conn.getresponse().read())
            conn.close()
            sid = info["id"]
            n, d = args.frames, args.drag_size
            results = {
                "asset": info["name"],
                "num_gaussians": info["num_gaussians"],
                "cpu_count": os.cpu_count(),
                "load_average_1m": round(os.getloadavg()[0], 2),
                "drag": measure(port, sid, n, d, "jpeg", 2),
                "drag_1_in_flight": measure(port, sid, n, d, "jpeg", 1),
                "drag512": measure(port, sid, n, 512, "jpeg", 2),
                "rest": measure(port, sid, n, 512, "png", 1),
            }
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    results["render512"] = render_only(load_asset(args.asset or demo_ply_path()), n)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"{results['asset']}: {results['num_gaussians']} Gaussians, {results['cpu_count']} CPUs, "
        f"load average {results['load_average_1m']}"
    )
    for key in ("drag", "drag_1_in_flight", "drag512", "rest", "render512"):
        r = results[key]
        fmt = f"{r['format']} x{r['in_flight']}" if "format" in r else "(renderer)"
        print(
            f"  {key:<17} {r['size']:>4}px {fmt:<10} {r['fps']:6.1f} fps"
            f"  (server {r.get('server_ms_median', r.get('ms_mean'))} ms per frame)"
        )


if __name__ == "__main__":
    sys.exit(main())
