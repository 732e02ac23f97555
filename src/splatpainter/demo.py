"""The editing demos on the shipped asset: a paint-over and a one-view recolour of a part.

Run as `python -m splatpainter.demo --out DIR`.

1. Paint-over: paint a disc onto the surface in one view, apply the edit through an
   `EditSession`, show the result from the edit view and from a view that was never an edit
   input, and report how much of the image outside the painted region stayed as it was (PSNR).
2. Recolour: the torus is recoloured in 3D (the ground truth); the editor gets one rendered view
   of it, and the result is compared with the ground truth from the back (held-out views), for
   the trained model and for back-projection, which cannot reach what the view does not see.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from splatpainter.assets.demo import load_demo_asset
from splatpainter.camera import orbit_cameras
from splatpainter.edit import (
    BackprojectMethod,
    EditSession,
    EditView,
    ModelMethod,
    OptimizeMethod,
)
from splatpainter.io import save_asset
from splatpainter.io.images import save_png
from splatpainter.render import render

PAINT = torch.tensor([0.95, 0.1, 0.6])


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a - b) ** 2).mean())
    return float("inf") if mse == 0.0 else -10.0 * torch.log10(torch.tensor(mse)).item()


def painted_disc(alpha: torch.Tensor, radius_frac: float = 0.12) -> torch.Tensor:
    """A disc mask centred on the most-covered pixel region, kept on the opaque surface."""
    h, w = alpha.shape
    solid = alpha > 0.99
    ys, xs = solid.nonzero(as_tuple=True)
    if len(ys) == 0:
        raise RuntimeError("the demo view does not see the asset")
    cy, cx = ys.float().median(), xs.float().median()
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    r = radius_frac * min(h, w)
    return (((yy - cy) ** 2 + (xx - cx) ** 2) <= r * r) & solid


def make_method(method: str):
    if method == "backproject":
        return BackprojectMethod()
    if method == "optimize":
        return OptimizeMethod(steps=60)
    from splatpainter.model.editor import load_editor

    return ModelMethod(load_editor(), kind="paint")


def run(out: Path, size: int = 256, method: str = "model") -> dict[str, float]:
    asset = load_demo_asset()
    cams = orbit_cameras(asset, 4, width=size, height=size, fit="points")
    edit_cam, held_out = cams[0], cams[1]
    before = render(asset, edit_cam)
    mask = painted_disc(before.alpha)
    edited = before.rgb.clamp(0, 1).clone()
    edited[mask] = PAINT

    meth = make_method(method)
    EditSession(asset, meth).apply(EditView(edit_cam, edited))  # warm-up: one-time JIT compile
    session = EditSession(asset, meth)
    t0 = time.perf_counter()
    new = session.apply(EditView(edit_cam, edited))
    seconds = time.perf_counter() - t0

    after = render(new, edit_cam).rgb
    out.mkdir(parents=True, exist_ok=True)
    save_png(edited, out / "edit_input.png")
    save_png(before.rgb, out / "edit_view_before.png")
    save_png(after, out / "edit_view_after.png")
    save_png(render(asset, held_out).rgb, out / "held_out_view_before.png")
    save_png(render(new, held_out).rgb, out / "held_out_view_after.png")
    session.export(out / "edited.ply")
    save_asset(asset, out / "original.ply")
    err_before = float((before.rgb[mask] - PAINT).abs().mean())
    err_after = float((after[mask] - PAINT).abs().mean())
    changed = int((new.sh != asset.sh).any(dim=(1, 2)).sum())
    return {
        "method": method,
        "gaussians": asset.num_gaussians,
        "gaussians_changed": changed,
        "seconds_per_edit": seconds,
        "paint_error_before": err_before,
        "paint_error_after": err_after,
        "outside_psnr_db": psnr(after[~mask], before.rgb[~mask]),
    }


def run_recolor(out: Path, size: int = 128) -> dict[str, float]:
    """Recolour the demo torus from one view; held-out PSNR on the changed pixels per method."""
    from splatpainter.assets.procedural import make_demo_asset
    from splatpainter.eval.metrics import SquaredError, changed_mask
    from splatpainter.model.editor import load_editor
    from splatpainter.train.data import (
        apply_color_transform,
        base_colors,
        heldout_cameras,
        view_camera,
        with_base_colors,
    )

    demo = make_demo_asset(20000, seed=0)
    asset = demo.asset
    colors = base_colors(asset)
    torus = demo.primitive_id == 2
    target = colors.clone()
    target[torus] = apply_color_transform(colors[torus], "hsv", torch.tensor([0.45, 1.2, 1.0]))
    truth = with_base_colors(asset, target)
    cam = view_camera(asset, 30.0, 30.0, size)
    view = EditView(cam, render(truth, cam).rgb.clamp(0, 1))
    held = heldout_cameras(asset, 30.0, 4, size, torch.Generator().manual_seed(0))
    methods = {
        "model": ModelMethod(load_editor(), kind="recolor"),
        "backproject": BackprojectMethod(),
    }
    out.mkdir(parents=True, exist_ok=True)
    save_png(view.image, out / "recolor_edit_input.png")
    save_png(render(truth, held[0]).rgb, out / "recolor_back_truth.png")
    truths = [render(truth, c).rgb for c in held]
    changed = [changed_mask(gt, render(asset, c).rgb) for gt, c in zip(truths, held, strict=True)]
    result = {}
    for name, meth in methods.items():
        new = EditSession(asset, meth).apply(view)
        err = SquaredError()
        for c, gt, m in zip(held, truths, changed, strict=True):
            err.add(render(new, c).rgb, gt, m)
        result[name] = err.psnr()
        save_png(render(new, held[0]).rgb, out / f"recolor_back_{name}.png")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("out/demo/splatpainter/edit"))
    p.add_argument("--size", type=int, default=256)
    p.add_argument("--method", choices=("model", "backproject", "optimize"), default="model")
    a = p.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    r = run(a.out, a.size, a.method)
    print(
        f"paint-over with {r['method']}: {r['gaussians_changed']} of {r['gaussians']} Gaussians "
        f"changed in {r['seconds_per_edit']:.2f} s; mean |render - paint| inside the stroke "
        f"{r['paint_error_before']:.3f} -> {r['paint_error_after']:.3f}; outside the stroke "
        f"PSNR {r['outside_psnr_db']:.1f} dB vs. before"
    )
    print(f"wrote {a.out}/edit_input.png, edit_view_*.png, held_out_view_*.png, edited.ply")
    rec = run_recolor(a.out)
    print(
        "recolour of the torus from one view, held-out PSNR on the changed pixels (back and "
        "below included): " + ", ".join(f"{k} {v:.1f} dB" for k, v in rec.items())
    )
    print(f"wrote {a.out}/recolor_edit_input.png, recolor_back_*.png")


if __name__ == "__main__":
    main()
