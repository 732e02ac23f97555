"""Editing-model speed: parameters, Stage I per asset, Stage II per edit, peak memory.

Scene: the procedural demo asset with --gaussians Gaussians (default 20k), the shipped editor
weights (or --weights), one edit view of --size x --size pixels (default 128): a painted square
(--kind paint, the default), or the whole asset recoloured (--kind recolor) or relit (--kind
relight), which with weights trained for it also fit the colour maps to the view's pixels.
Stage I is timed cold (cache cleared) per asset; a Stage II edit is `ModelMethod.apply` end to
end (current render, compositing-weight signals, least-squares solve, network, write back).
Baselines are timed on the same edit.  Medians over --repeats after one warm-up (plus the best
run and the process CPU seconds per Stage II edit: on a shared machine the wall-clock median
includes other load, CPU seconds / threads is what an idle machine would take).

    python benchmarks/edit_speed.py [--json] [--threads 2] [--gaussians 20000] [--size 128]
                                    [--kind paint|recolor|relight]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time


def _times_s(fn, repeats: int) -> list[float]:
    fn()  # warm-up (numba kernels, allocator)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _median_s(fn, repeats: int) -> float:
    return statistics.median(_times_s(fn, repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gaussians", type=int, default=20000)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--optimize-steps", type=int, default=50)
    ap.add_argument("--weights", default=None, help="editor weights (default: shipped)")
    ap.add_argument("--kind", choices=("paint", "recolor", "relight"), default="paint")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    try:
        import numba

        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    except ImportError:
        pass

    from splatpainter.assets.procedural import make_demo_asset
    from splatpainter.camera import orbit_cameras
    from splatpainter.edit import BackprojectMethod, EditView, ModelMethod, OptimizeMethod
    from splatpainter.model.editor import load_editor
    from splatpainter.render import render
    from splatpainter.train.data import base_colors, with_base_colors

    demo = make_demo_asset(args.gaussians, seed=0)
    asset = demo.asset
    cam = orbit_cameras(asset, 4, width=args.size, height=args.size)[0]
    s = args.size
    colors = base_colors(asset)
    if args.kind == "paint":
        img = render(asset, cam).rgb.clamp(0, 1).clone()
        img[s // 3 : s // 2, s // 3 : s // 2] = torch.tensor([1.0, 0.0, 1.0])
    else:
        if args.kind == "recolor":
            new = colors[:, [1, 2, 0]] * 0.9 + 0.05
        else:
            light = torch.nn.functional.normalize(torch.tensor([0.3, -0.5, 0.8]), dim=0)
            new = colors * (0.3 + 0.8 * (demo.normals @ light).clamp_min(0))[:, None]
        img = render(with_base_colors(asset, new.clamp(0, 1)), cam).rgb.clamp(0, 1)
    view = EditView(cam, img)

    model = load_editor(args.weights)
    method = ModelMethod(model, kind=args.kind)

    def stage1() -> None:
        model._cache.clear()
        model.encode_asset(asset)

    t_stage1 = _median_s(stage1, args.repeats)
    state = method.initial_state(asset)
    cpu0 = time.process_time()
    edit_times = _times_s(lambda: method.apply(asset, [view], state), args.repeats)
    cpu_edit = (time.process_time() - cpu0) / (args.repeats + 1)
    t_edit = statistics.median(edit_times)
    new, _ = method.apply(asset, [view], state)
    changed = int((new.sh != asset.sh).flatten(1).any(1).sum())

    # Network-only share of an edit (signals/renders excluded).
    from splatpainter.edit.methods import build_edit_sample
    from splatpainter.edit.signals import gather_signals

    lat = state["latent"]
    settings = model.stage2.config.signal_settings()
    iters = settings.solve_iters
    sample = build_edit_sample(asset, [view], lat, hint=args.kind, settings=settings)

    def net() -> None:
        with torch.no_grad():
            model.stage2([sample], state["fast"])

    t_net = _median_s(net, args.repeats)
    t_signals = _median_s(lambda: gather_signals(asset, [view]), args.repeats)
    t_solve = _median_s(lambda: gather_signals(asset, [view], solve_iters=iters), args.repeats)
    bp = BackprojectMethod()
    t_bp = _median_s(lambda: bp.apply(asset, [view], None), args.repeats)
    opt = OptimizeMethod(steps=args.optimize_steps)
    t_opt = _median_s(lambda: opt.apply(asset, [view], None), 1)

    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    result = {
        "gaussians": asset.num_gaussians,
        "weights": "trained" if model.trained else "untrained",
        "edit_view": f"{s}x{s}",
        "kind": args.kind,
        "threads": args.threads,
        "parameters": model.num_parameters(),
        "occupied_voxels": int(lat.vox.num_voxels),
        "stage1_s_per_asset": round(t_stage1, 3),
        "stage2_s_per_edit": round(t_edit, 3),
        "stage2_s_per_edit_best": round(min(edit_times), 3),
        "stage2_cpu_s_per_edit": round(cpu_edit, 3),
        "stage2_network_s": round(t_net, 3),
        "stage2_signals_s": round(t_signals, 3),
        f"stage2_least_squares_{iters}_steps_s": round(t_solve - t_signals, 3),
        "gaussians_changed": changed,
        "backproject_s_per_edit": round(t_bp, 3),
        f"optimize_{args.optimize_steps}_steps_s": round(t_opt, 3),
        "peak_rss_mb": round(peak_mb, 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>28}: {v}")


if __name__ == "__main__":
    main()
