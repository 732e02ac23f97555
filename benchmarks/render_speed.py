"""Renderer speed: the compiled (numba) CPU rasteriser, against the code of a baseline commit.

Scenes (each rendered by this checkout's renderer, "new", and by the renderer of the baseline
git revision, "old", loaded from ``git show REV:src/splatpainter/render/*.py`` into a temporary
package, so the ratios come from one run on the same machine state):

- ``20k_256``: the procedural demo asset, 20k Gaussians, orbit camera, 256x256: forward,
  forward+backward, tile intersections, per-stage profile (new), speedup over the reference.
- ``inside_512``: a camera inside a real-scale scene (a synthetic 10 x 8 x 4 m room with 1M
  fuzzy, anisotropic, semi-transparent Gaussians on its walls and furniture, floaters
  everywhere, some within 0.2 m of the camera; INRIA-like statistics), 512x512, forward.
- ``1m_1024``: the demo asset with 1M Gaussians, orbit camera, 1024x1024, forward.

Each large scene is built once, in a process of its own, and saved to a temporary file. Each
implementation then renders it in a child process that only loads the file, so that its peak
resident memory (``ru_maxrss``; ``peak_bytes``, ``maxrss_mb`` in MiB) is the whole process:
the interpreter with torch and numba (~300 MB), the scene's tensors and everything the render
allocates (``maxrss_mb_before_render`` is the part before the first render). A third child
("ab") runs old and new alternately for the timing ratio. Timings are the best and the median
of --repeats runs after one warm-up (which also compiles), in wall and process-CPU time (all
threads); on a shared CPU compare the interleaved old/new ratios, not the absolute figures.

    python benchmarks/render_speed.py [--json] [--repeats 5] [--threads 2] [--baseline REV]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# libgomp threads (numba's "omp" layer and torch) spin while waiting at barriers; on a shared,
# oversubscribed machine that burns the cores other threads need. Must be set before import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parent.parent
BASELINE_REV = "23ed0fb"  # the renderer before issue 12 (square 3-sigma boxes, near 0.01)


def baseline_dir(rev: str) -> Path:
    """A per-revision folder outside the repository, kept so numba's cache is reused."""
    return Path(tempfile.gettempdir()) / f"splatpainter_render_baseline_{rev}"


def load_baseline(rev: str, dest: Path):
    """Import the renderer package of git revision ``rev`` as ``sp_render_baseline``."""
    pkg = dest / "sp_render_baseline"
    pkg.mkdir(parents=True, exist_ok=True)
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", rev, "src/splatpainter/render/"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in (Path(n).name for n in names if n.endswith(".py")):
        src = subprocess.run(
            ["git", "show", f"{rev}:src/splatpainter/render/{name}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        text = src.replace("splatpainter.render", "sp_render_baseline")
        path = pkg / name
        if not path.exists() or path.read_text() != text:  # unchanged files keep numba's cache
            path.write_text(text)
    sys.path.insert(0, str(dest))
    return importlib.import_module("sp_render_baseline")


def _times(fn, repeats: int) -> dict[str, float]:
    """Best and median wall ms, and median process-CPU ms (all threads), after a warm-up."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(1e3 * (time.perf_counter() - t0))
        cpu.append(1e3 * (time.process_time() - c0))
    return {
        "best_ms": min(wall),
        "median_ms": statistics.median(wall),
        "cpu_ms": statistics.median(cpu),
    }


def interleaved(fns: dict, repeats: int) -> dict[str, dict[str, float]]:
    """Time several functions alternately (one warm-up each), so that a shared machine's
    varying load hits them alike; best/median wall ms and best/median process-CPU ms."""
    for fn in fns.values():
        fn()
    wall: dict = {k: [] for k in fns}
    cpu: dict = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[k].append(1e3 * (time.perf_counter() - t0))
            cpu[k].append(1e3 * (time.process_time() - c0))
    return {
        k: {
            "best_ms": min(wall[k]),
            "median_ms": statistics.median(wall[k]),
            "best_cpu_ms": min(cpu[k]),
            "median_cpu_ms": statistics.median(cpu[k]),
        }
        for k in fns
    }


def demo_scene(n: int, size: int, sh_degree: int, seed: int = 0):
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


def room_scene(n: int, size: int, sh_degree: int, seed: int = 0):
    """A camera inside a synthetic real-scale room (metres), INRIA-like Gaussian statistics."""
    import torch

    from splatpainter.assets.gaussians import GaussianAsset
    from splatpainter.camera import Camera

    g = torch.Generator().manual_seed(seed)
    lo = torch.tensor([-5.0, -4.0, 0.0])
    hi = torch.tensor([5.0, 4.0, 4.0])
    n_float = n // 20
    n_furn = n // 5
    n_wall = n - n_float - n_furn
    # walls, floor, ceiling: pick a face, a uniform point on it
    pts = lo + (hi - lo) * torch.rand(n_wall, 3, generator=g)
    face = torch.randint(0, 6, (n_wall,), generator=g)
    axis, side = face // 2, face % 2
    pts[torch.arange(n_wall), axis] = torch.where(side == 0, lo[axis], hi[axis])
    # furniture: boxes on the floor, points on their surfaces
    centers = torch.rand(12, 3, generator=g) * torch.tensor([8.0, 6.0, 0.0]) - torch.tensor(
        [4.0, 3.0, 0.0]
    )
    half = torch.rand(12, 3, generator=g) * torch.tensor([0.6, 0.6, 0.5]) + 0.2
    centers[:, 2] = half[:, 2]
    which = torch.randint(0, 12, (n_furn,), generator=g)
    u = torch.rand(n_furn, 3, generator=g) * 2 - 1
    ax = torch.randint(0, 3, (n_furn,), generator=g)
    u[torch.arange(n_furn), ax] = torch.sign(u[torch.arange(n_furn), ax])
    furn = centers[which] + u * half[which]
    floaters = lo + (hi - lo) * torch.rand(n_float, 3, generator=g)
    eye = torch.tensor([0.3, -0.5, 1.6])
    near = eye + torch.randn(200, 3, generator=g) * 0.3  # floaters around the camera
    means = torch.cat([pts, furn, floaters[: n_float - 200], near])
    log_scales = torch.log(torch.tensor(0.015)) + 0.8 * torch.randn(n, 3, generator=g)
    log_scales[:, 2] -= 1.0  # flattish splats
    logits = torch.randn(n, generator=g) * 2.5
    k = (sh_degree + 1) ** 2
    sh = torch.randn(n, k, 3, generator=g) * 0.1
    sh[:, 0] = (torch.rand(n, 3, generator=g) - 0.5) * 3.0
    asset = GaussianAsset(
        means=means,
        quats=torch.randn(n, 4, generator=g),
        log_scales=log_scales,
        opacity_logits=logits,
        sh=sh,
    )
    cam = Camera.look_at(eye, (4.0, 2.0, 1.2), width=size, height=size, fov_y_deg=60.0)
    return asset, cam


def _params(asset):
    names = ("means", "quats", "log_scales", "opacity_logits", "sh")
    return [getattr(asset, k).detach().clone().requires_grad_(True) for k in names]


def _forward(mod, params, cam, backend="numba"):
    return mod.rasterize(*params, cam.world_to_cam, cam.K(), cam.width, cam.height, backend=backend)


def _fwd_bwd(mod, params, cam, backend="numba"):
    out = _forward(mod, params, cam, backend)
    (out.rgb.sum() + out.alpha.sum() + 0.1 * out.depth.sum()).backward()
    for p in params:
        p.grad = None
    return out


def intersections(mod, params, cam) -> int:
    """Tile intersections (Gaussian, tile) pairs of a renderer package's binning."""
    import torch

    w, h = cam.width, cam.height
    with torch.no_grad():
        means, quats, log_scales, logits, _ = params
        try:  # the compiled backend's module (named fast.py in older revisions)
            fast = importlib.import_module(mod.__name__ + ".numba_backend")
        except ModuleNotFoundError:
            fast = importlib.import_module(mod.__name__ + ".fast")
        if hasattr(fast, "proj_opts"):  # the new renderer: opacity-aware, per-axis boxes
            proj = fast.project_numba(
                means, quats, log_scales, cam.world_to_cam, cam.K(), w, h,
                opacities=torch.sigmoid(logits),
            )  # fmt: skip
            ids = fast.bin_tiles(proj.means2d, proj.extents, proj.depths, w, h)[1]
        else:
            proj = fast.project_numba(means, quats, log_scales, cam.world_to_cam, cam.K(), w, h)
            _, ids, _ = fast.bin_tiles(proj.means2d, proj.radii, proj.depths, w, h)
    return len(ids)


def profile_stages(params, cam, repeats: int) -> dict[str, float]:
    """Median wall milliseconds of each stage of this checkout's numba path."""
    import numba
    import numpy as np
    import torch

    from splatpainter.render import _kernels as kern
    from splatpainter.render import _kernels_lanes as klanes
    from splatpainter.render import _kernels_proj as kproj
    from splatpainter.render import numba_backend as fast
    from splatpainter.render import project
    from splatpainter.render.numba_backend import _intrinsics, _np32, _np64, bin_tiles

    means, quats, log_scales, logits, sh = params
    w2c, K, w, h = cam.world_to_cam, cam.K(), cam.width, cam.height
    deg = round(sh.shape[1] ** 0.5) - 1
    n = means.shape[0]
    st: dict[str, float] = {}

    def ms(fn):
        return _times(fn, repeats)["median_ms"]

    geo = (_np32(means), _np32(quats), _np32(log_scales))
    opac = _np32(torch.sigmoid(logits))
    camargs = (_np64(w2c), _intrinsics(K), w, h, fast.proj_opts())
    campos = _np64(project.camera_center(w2c.double()))
    sh32, shc = _np32(sh), fast.sh_consts()
    st["project_fwd"] = ms(lambda: kproj.project_forward(*geo, opac, *camargs))
    means2d, conics, depths, ext, _ = kproj.project_forward(*geo, opac, *camargs)
    vis = ext[:, 0] > 0
    st["sh_fwd"] = ms(lambda: kproj.sh_forward(geo[0], sh32, campos, deg, shc, vis))
    col = kproj.sh_forward(geo[0], sh32, campos, deg, shc, vis)
    t2d = [torch.from_numpy(x) for x in (means2d, depths, ext)]
    st["bin_and_sort"] = ms(lambda: bin_tiles(t2d[0], t2d[2], t2d[1], w, h))
    off, ids, hit, tx = bin_tiles(t2d[0], t2d[2], t2d[1], w, h)
    amin = float(project.ALPHA_MIN)
    st["rows"] = ms(lambda: kern.gaussian_rows(hit, means2d, conics, col, opac, depths, amin))
    grows = kern.gaussian_rows(hit, means2d, conics, col, opac, depths, amin)
    bg, thr, tile = np.zeros(3, np.float32), fast.raster_thresholds(), project.TILE
    nt = numba.get_num_threads()
    st["raster_fwd"] = ms(
        lambda: klanes.raster_forward(grows, ids, off, w, h, tile, tx, bg, thr, nt)
    )
    res = klanes.raster_forward(grows, ids, off, w, h, tile, tx, bg, thr, nt)
    g3, g1 = np.ones((h, w, 3), np.float32), np.ones((h, w), np.float32)
    args = (grows, ids, off, w, h, tile, tx, bg, thr, res[3], res[4], g3, g1, g1, nt)
    st["raster_bwd"] = ms(lambda: klanes.raster_backward(*args))
    rows = klanes.raster_backward(*args)
    st["reduce_grads"] = ms(lambda: kern.reduce_grads(ids, hit, rows, n))
    per_g = kern.reduce_grads(ids, hit, rows, n)
    v2d, vcon, vcol = per_g[:, 0:2].copy(), per_g[:, 2:5].copy(), per_g[:, 5:8].copy()
    vdep, vcomp = per_g[:, 9].copy(), np.zeros(n, np.float32)
    st["project_bwd"] = ms(
        lambda: kproj.project_backward(*geo, *camargs, ext, v2d, vcon, vdep, vcomp, False)
    )
    st["sh_bwd"] = ms(lambda: kproj.sh_backward(geo[0], sh32, campos, deg, shc, vis, vcol))
    st["visible_gaussians"] = float((ext[:, 0] > 0).sum())
    return st


def build_scene(scene: str, sh_degree: int, path: str) -> None:
    """Build a large scene and save it (``--build-scene``: in a process of its own, so that
    the temporaries of building it are not part of the renderers' peak memory)."""
    import dataclasses

    import torch

    if scene == "inside_512":
        asset, cam = room_scene(1_000_000, 512, sh_degree)
    else:
        asset, cam = demo_scene(1_000_000, 1024, sh_degree)
    names = ("means", "quats", "log_scales", "opacity_logits", "sh")
    cam_fields = {f.name: getattr(cam, f.name) for f in dataclasses.fields(cam)}
    torch.save(
        {"params": {k: getattr(asset, k).detach() for k in names}, "camera": cam_fields}, path
    )


def load_scene(path: str):
    """The saved scene's parameters (requiring grad, no copies) and camera."""
    import torch

    from splatpainter.camera import Camera

    saved = torch.load(path, weights_only=True)
    params = [t.requires_grad_(True) for t in saved["params"].values()]
    return params, Camera(**saved["camera"])


def child(scene_file: str, impl: str, rev: str, repeats: int, threads: int) -> dict:
    """One large scene with one implementation (run in its own process for its peak RSS)."""
    import numba
    import torch

    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    params, cam = load_scene(scene_file)
    new = importlib.import_module("splatpainter.render")
    if impl == "ab":  # both renderers in one process, alternately: the timing ratio
        old = load_baseline(rev, baseline_dir(rev))
        with torch.no_grad():
            t = interleaved(
                {
                    "old": lambda: _forward(old, params, cam),
                    "new": lambda: _forward(new, params, cam),
                },
                repeats,
            )
        return t
    mod = load_baseline(rev, baseline_dir(rev)) if impl == "old" else new
    res: dict = {
        "rss_mb_before_render": _rss_now_mb(),
        # the high-water mark so far: the interpreter, torch and numba, the loaded scene
        "maxrss_mb_before_render": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    with torch.no_grad():
        res["fwd"] = _times(lambda: _forward(mod, params, cam), repeats)
    res["intersections"] = intersections(mod, params, cam)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    res["maxrss_mb"] = peak / 2**20
    res["peak_bytes"] = peak
    if impl == "new":  # after the peak was read: the profile keeps extra buffers alive
        res["stages_ms"] = profile_stages(params, cam, 1)
    return res


def _rss_now_mb() -> float:
    """Current resident memory (Linux /proc), to tell the scene's share of the peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--large-repeats", type=int, default=2, help="repeats of the 1M scenes")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sh-degree", type=int, default=3)
    ap.add_argument("--baseline", default=BASELINE_REV, help="git revision to compare against")
    ap.add_argument("--skip-large", action="store_true", help="skip the two 1M scenes")
    ap.add_argument("--skip-reference", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("SCENE_FILE", "IMPL"), help=argparse.SUPPRESS)
    ap.add_argument("--build-scene", nargs=2, metavar=("SCENE", "FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.build_scene:
        build_scene(args.build_scene[0], args.sh_degree, args.build_scene[1])
        return
    if args.child:
        r = child(*args.child, args.baseline, args.large_repeats, args.threads)
        print(json.dumps(r))
        return

    import numba
    import torch

    torch.set_num_threads(args.threads)
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    res: dict = {"threads": args.threads, "sh_degree": args.sh_degree, "repeats": args.repeats}
    res["baseline_rev"] = args.baseline
    res["loadavg_1min_at_start"] = os.getloadavg()[0]
    res["cpu_count"] = os.cpu_count()
    new = importlib.import_module("splatpainter.render")
    old = load_baseline(args.baseline, baseline_dir(args.baseline))
    asset, cam = demo_scene(20_000, 256, args.sh_degree)
    params = _params(asset)
    small: dict = {}
    with torch.no_grad():
        t = interleaved(
            {"old": lambda: _forward(old, params, cam), "new": lambda: _forward(new, params, cam)},
            args.repeats,
        )
    small["old_fwd"], small["new_fwd"] = t["old"], t["new"]
    t = interleaved(
        {"old": lambda: _fwd_bwd(old, params, cam), "new": lambda: _fwd_bwd(new, params, cam)},
        args.repeats,
    )
    small["old_fwd_bwd"], small["new_fwd_bwd"] = t["old"], t["new"]
    for name, mod in (("old", old), ("new", new)):
        small[f"{name}_intersections"] = intersections(mod, params, cam)
    for k in ("fwd", "fwd_bwd"):
        for m in ("best_ms", "best_cpu_ms"):
            small[f"ratio_{k}_{m}_new_over_old"] = small[f"new_{k}"][m] / small[f"old_{k}"][m]
    small["intersections_ratio_new_over_old"] = (
        small["new_intersections"] / small["old_intersections"]
    )
    res["numba_threading_layer"] = numba.threading_layer()
    small["stages_ms_new"] = profile_stages(params, cam, args.repeats)
    if not args.skip_reference:
        t0 = time.perf_counter()
        with torch.no_grad():
            _forward(new, params, cam, "reference")
        small["reference_fwd_ms"] = 1e3 * (time.perf_counter() - t0)
        small["speedup_fwd_over_reference"] = (
            small["reference_fwd_ms"] / small["new_fwd"]["best_ms"]
        )
    res["20k_256"] = small

    for scene in () if args.skip_large else ("inside_512", "1m_1024"):
        entry: dict = {}
        with tempfile.TemporaryDirectory() as tmp:
            scene_file = str(Path(tmp) / f"{scene}.pt")
            build = [sys.executable, __file__, "--build-scene", scene, scene_file]
            subprocess.run([*build, "--sh-degree", str(args.sh_degree)], check=True, cwd=ROOT)
            for impl in ("old", "new", "ab"):
                cmd = [sys.executable, __file__, "--child", scene_file, impl]
                cmd += ["--baseline", args.baseline, "--large-repeats", str(args.large_repeats)]
                cmd += ["--threads", str(args.threads)]
                out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
                if out.returncode != 0:
                    entry[impl] = {"error": out.stderr.strip().splitlines()[-1:]}
                    continue
                entry[impl] = json.loads(out.stdout.strip().splitlines()[-1])
        ab = entry.get("ab", {})
        if "old" in ab and "new" in ab:  # from the interleaved run
            for m in ("best_ms", "best_cpu_ms"):
                entry[f"ratio_fwd_{m}_new_over_old"] = ab["new"][m] / ab["old"][m]
        if "intersections" in entry.get("old", {}) and "intersections" in entry.get("new", {}):
            entry["intersections_ratio_new_over_old"] = (
                entry["new"]["intersections"] / entry["old"]["intersections"]
            )
        res[scene] = entry

    res["loadavg_1min_at_end"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(res, indent=2))
        return
    _print(res)


def _print(d: dict, indent: int = 0) -> None:
    for k, v in d.items():
        if isinstance(v, dict):
            print(" " * indent + str(k))
            _print(v, indent + 4)
        elif isinstance(v, float):
            print(" " * indent + f"{k:40s} {v:12.3f}")
        else:
            print(" " * indent + f"{k:40s} {v}")


if __name__ == "__main__":
    main()
