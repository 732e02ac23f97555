"""Renderer speed: compiled (numba) CPU rasteriser vs. the pure-PyTorch reference.

Scenes: the procedural demo asset (splatpainter.assets.procedural) seen from an orbit camera;
20k Gaussians at 256x256 (forward, forward+backward, per-stage profile, peak memory, speedup
over the reference) and 200k Gaussians at 512x512 (forward). Runs on --threads cores.
Timings are medians over --repeats runs after one warm-up (which also loads/compiles kernels);
``*_cpu_ms`` is the process CPU time (all threads), a contention-free estimate is cpu/threads.

    python benchmarks/render_speed.py [--json] [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import time
import tracemalloc

# libgomp threads (numba's "omp" layer and torch) spin while waiting at barriers; on a shared,
# oversubscribed machine that burns the cores other threads need. Must be set before import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _ms(fn, repeats: int) -> float:
    return _wall_cpu_ms(fn, repeats)[0]


def _wall_cpu_ms(fn, repeats: int) -> tuple[float, float]:
    """Median wall and process-CPU milliseconds (CPU sums all threads of this process).

    On a shared machine wall time includes waiting for cores; CPU time does not.
    """
    fn()  # warm-up
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(1e3 * (time.perf_counter() - t0))
        cpu.append(1e3 * (time.process_time() - c0))
    return statistics.median(wall), statistics.median(cpu)


def _scene(n: int, size: int, sh_degree: int, seed: int = 0):
    import torch

    from splatpainter.assets.procedural import make_demo_asset
    from splatpainter.camera import orbit_cameras

    asset = make_demo_asset(n, seed=seed, sh_degree=sh_degree).asset
    if sh_degree > 0:  # give the higher bands some energy so SH evaluation is not trivial
        g = torch.Generator().manual_seed(seed)
        rest = torch.randn(asset.sh[:, 1:].shape, generator=g) * 0.05
        asset = asset.replace(sh=torch.cat([asset.sh[:, :1], rest], dim=1))
    cam = orbit_cameras(asset, 1, width=size, height=size, elevation_deg=25.0)[0]
    return asset, cam


def _params(asset):
    names = ("means", "quats", "log_scales", "opacity_logits", "sh")
    return [getattr(asset, k).detach().clone().requires_grad_(True) for k in names]


def _forward(params, cam, backend):
    from splatpainter.render import rasterize

    return rasterize(*params, cam.world_to_cam, cam.K(), cam.width, cam.height, backend=backend)


def _fwd_bwd(params, cam, backend):
    out = _forward(params, cam, backend)
    (out.rgb.sum() + out.alpha.sum() + 0.1 * out.depth.sum()).backward()
    for p in params:
        p.grad = None
    return out


def profile_stages(params, cam, repeats: int, with_torch: bool = True) -> dict[str, float]:
    """Median wall milliseconds of each stage of the numba path (forward and backward)."""
    import numpy as np
    import torch

    from splatpainter.render import _kernels as kern
    from splatpainter.render import _kernels_proj as kproj
    from splatpainter.render.fast import _intrinsics, _np32, _np64, bin_tiles
    from splatpainter.render.project import camera_center, project_gaussians, sh_to_color

    means, quats, log_scales, logits, sh = params
    w2c, K, w, h = cam.world_to_cam, cam.K(), cam.width, cam.height
    deg = math.isqrt(sh.shape[1]) - 1
    n = means.shape[0]
    st: dict[str, float] = {}
    geo = (_np32(means), _np32(quats), _np32(log_scales))
    camargs = (_np64(w2c), _intrinsics(K), w, h)
    campos = _np64(camera_center(w2c.double()))
    sh32 = _np32(sh)
    st["project_fwd"] = _ms(lambda: kproj.project_forward(*geo, *camargs), repeats)
    st["sh_fwd"] = _ms(lambda: kproj.sh_forward(geo[0], sh32, campos, deg), repeats)
    means2d, conics, depths, radii = kproj.project_forward(*geo, *camargs)
    col = kproj.sh_forward(geo[0], sh32, campos, deg)
    t2d = [torch.from_numpy(x) for x in (means2d, depths, radii)]
    st["bin_and_sort"] = _ms(lambda: bin_tiles(t2d[0], t2d[2], t2d[1], w, h), repeats)
    off, ids, tx = bin_tiles(t2d[0], t2d[2], t2d[1], w, h)
    opac = _np32(torch.sigmoid(logits))
    st["pack"] = _ms(lambda: kern.pack_rows(ids, means2d, conics, col, opac, depths), repeats)
    packed = kern.pack_rows(ids, means2d, conics, col, opac, depths)
    bg = np.zeros(3, np.float32)
    st["raster_fwd"] = _ms(lambda: kern.raster_forward(packed, off, w, h, tx, bg), repeats)
    res = kern.raster_forward(packed, off, w, h, tx, bg)
    g3, g1 = np.ones((h, w, 3), np.float32), np.ones((h, w), np.float32)
    args = (packed, off, w, h, tx, bg, res[3], res[4], g3, g1, g1)
    st["raster_bwd"] = _ms(lambda: kern.raster_backward(*args), repeats)
    rows = kern.raster_backward(*args)
    st["reduce_grads"] = _ms(lambda: kern.reduce_grads(ids, rows, n), repeats)
    per_g = kern.reduce_grads(ids, rows, n)
    v2d, vcon, vcol, vdep = (
        per_g[:, 0:2].copy(),
        per_g[:, 2:5].copy(),
        per_g[:, 5:8].copy(),
        per_g[:, 9].copy(),
    )
    st["project_bwd"] = _ms(
        lambda: kproj.project_backward(*geo, *camargs, radii, v2d, vcon, vdep), repeats
    )
    st["sh_bwd"] = _ms(lambda: kproj.sh_backward(geo[0], sh32, campos, deg, vcol), repeats)

    def torch_stages_fwd_bwd():  # the vectorised-PyTorch alternative for the same two stages
        proj = project_gaussians(means, quats, log_scales, w2c, K, w, h)
        colors = sh_to_color(means, sh, w2c, deg)
        loss = proj.means2d.sum() + proj.conics.sum() + proj.depths.sum() + colors.sum()
        loss.backward()
        for p in params:
            p.grad = None

    if with_torch:
        st["torch_autograd_project_sh_fwd_bwd"] = _ms(torch_stages_fwd_bwd, repeats)
    st["intersections"] = float(len(ids))
    st["visible_gaussians"] = float((radii > 0).sum())
    return st


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sh-degree", type=int, default=3)
    ap.add_argument("--skip-large", action="store_true", help="skip the 200k / 512x512 scene")
    ap.add_argument("--skip-reference", action="store_true")
    args = ap.parse_args()

    import numba
    import torch

    torch.set_num_threads(args.threads)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res: dict = {"threads": args.threads, "sh_degree": args.sh_degree, "repeats": args.repeats}
    res["omp_wait_policy"] = os.environ.get("OMP_WAIT_POLICY", "")
    res["numba_threading_layer"] = ""

    asset, cam = _scene(20_000, 256, args.sh_degree)
    params = _params(asset)
    res["loadavg_1min_at_start"] = os.getloadavg()[0]
    with torch.no_grad():
        wall, cpu = _wall_cpu_ms(lambda: _forward(params, cam, "numba"), args.repeats)
    res["fwd_ms_20k_256"], res["fwd_cpu_ms_20k_256"] = wall, cpu
    wall, cpu = _wall_cpu_ms(lambda: _fwd_bwd(params, cam, "numba"), args.repeats)
    res["fwd_bwd_ms_20k_256"], res["fwd_bwd_cpu_ms_20k_256"] = wall, cpu
    out = _forward(params, cam, "numba")
    res["coverage_20k_256"] = float((out.alpha > 0.5).float().mean())
    res["numba_threading_layer"] = numba.threading_layer()
    tracemalloc.start()
    _fwd_bwd(params, cam, "numba")
    # tracemalloc sees numpy/Python allocations only (not torch's or numba's runtime);
    # ru_maxrss is the process peak (includes the ~270 MB of imported torch/numba).
    res["tracemalloc_peak_mb_fwd_bwd_20k"] = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    res["maxrss_mb_after_20k"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    res["maxrss_mb_before_scene"] = rss0
    res["stages_ms_20k_256"] = profile_stages(params, cam, args.repeats)

    if not args.skip_large:
        big_asset, big_cam = _scene(200_000, 512, args.sh_degree)
        big = _params(big_asset)
        with torch.no_grad():
            wall, cpu = _wall_cpu_ms(lambda: _forward(big, big_cam, "numba"), args.repeats)
        res["fwd_ms_200k_512"], res["fwd_cpu_ms_200k_512"] = wall, cpu
        res["fwd_bwd_ms_200k_512"] = _ms(lambda: _fwd_bwd(big, big_cam, "numba"), 2)
        res["maxrss_mb_after_200k"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        res["stages_ms_200k_512"] = profile_stages(big, big_cam, 2, with_torch=False)

        del big, big_asset
    if not args.skip_reference:
        t0 = time.perf_counter()
        with torch.no_grad():
            _forward(params, cam, "reference")
        ref_f = 1e3 * (time.perf_counter() - t0)
        t0 = time.perf_counter()
        _fwd_bwd(params, cam, "reference")
        ref_fb = 1e3 * (time.perf_counter() - t0)
        res["reference_fwd_ms_20k_256"] = ref_f
        res["reference_fwd_bwd_ms_20k_256"] = ref_fb
        res["speedup_fwd"] = ref_f / res["fwd_ms_20k_256"]
        res["speedup_fwd_bwd"] = ref_fb / res["fwd_bwd_ms_20k_256"]
        res["maxrss_mb_after_reference"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    res["loadavg_1min_at_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(res, indent=2))
        return
    for k, v in res.items():
        if isinstance(v, dict):
            print(k)
            for kk, vv in v.items():
                print(f"    {kk:40s} {vv:10.2f}")
        else:
            print(f"{k:40s} {v:10.2f}" if isinstance(v, float) else f"{k:40s} {v}")


if __name__ == "__main__":
    main()
