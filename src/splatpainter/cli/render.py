"""`splatpainter render ASSET (--camera CAM.json | --orbit N) --size WxH --out DIR`.

Per view it writes ``view_NNN.png`` (colour) and ``view_NNN.json`` (the camera), with
``--alpha`` also ``view_NNN_alpha.png`` (8-bit accumulated opacity) and with ``--depth``
``view_NNN_depth.npy`` (float32 [H, W] expected view-space depth, 0 where nothing was drawn)
plus ``view_NNN_depth.png`` (8-bit, near = bright, scaled to the view's depth range).
"""

from __future__ import annotations

from pathlib import Path

import typer

from appshell.atomic import check_output_dir
from appshell.cli import DeviceOption, JsonFlag, UserError, parse_device, print_json, progress
from splatpainter.cli.app import app
from splatpainter.cli.options import (
    Backend,
    check_render_size,
    kernel_warmup,
    parse_size,
    read_asset,
)

__all__ = ["parse_color", "parse_size", "render"]


def parse_color(text: str) -> tuple[float, float, float]:
    parts = text.split(",")
    try:
        vals = tuple(float(p) for p in parts)
    except ValueError:
        vals = ()
    if len(vals) != 3 or not all(0.0 <= v <= 1.0 for v in vals):
        raise UserError(f"--background must be three numbers in [0,1] like 1,1,1, got {text!r}")
    return vals  # type: ignore[return-value]


@app.command()
def render(
    asset_path: Path = typer.Argument(..., metavar="ASSET", help=".ply, .splat or .spz file"),
    camera: Path | None = typer.Option(
        None, help="camera JSON: one camera, a list, or INRIA cameras.json"
    ),
    orbit: int | None = typer.Option(None, help="render N turntable views framing the asset"),
    size: str | None = typer.Option(
        None, metavar="WxH", help="WxH (default: the camera's own size, or 256x256 for --orbit)"
    ),
    out: Path = typer.Option(..., help="output directory (PNG + camera JSON per view)"),
    backend: Backend = typer.Option("auto", help="renderer backend"),
    elevation: float = typer.Option(20.0, help="--orbit elevation in degrees"),
    fov: float = typer.Option(40.0, help="--orbit vertical field of view in degrees"),
    up: str = typer.Option("+z", metavar="AXIS", help="--orbit up axis (+z, +y, ...)"),
    background: str = typer.Option(
        "0,0,0", metavar="R,G,B", help="background colour r,g,b in [0,1]"
    ),
    sh_degree: int | None = typer.Option(None, help="limit the SH degree used"),
    alpha: bool = typer.Option(False, "--alpha", help="also write view_NNN_alpha.png"),
    depth: bool = typer.Option(
        False, "--depth", help="also write view_NNN_depth.npy (float32) and view_NNN_depth.png"
    ),
    near: float | None = typer.Option(
        None, help="cull Gaussians closer than this view-space depth [default: 0.2, as INRIA]"
    ),
    far: float | None = typer.Option(
        None, help="cull Gaussians farther than this view-space depth [default: 1e10]"
    ),
    antialiased: bool = typer.Option(
        False, "--antialiased", help="antialiased rasterisation (opacity compensation)"
    ),
    device: DeviceOption = "cpu",
    json_out: JsonFlag = False,
) -> None:
    """Render an asset to PNG files, saving the camera JSON used for each view."""
    backend = backend.value
    if (camera is None) == (orbit is None):
        raise UserError("give exactly one of --camera CAM.json or --orbit N")
    wh = parse_size(size) if size is not None else None
    bg = parse_color(background)
    mode = "antialiased" if antialiased else "classic"
    dev = parse_device(device)

    import torch

    from splatpainter.render.project import EPS2D, FAR_PLANE, NEAR_PLANE, check_options

    near = NEAR_PLANE if near is None else near
    far = FAR_PLANE if far is None else far
    problem = check_options(near, far, EPS2D, 0.0, mode)
    if problem is not None:
        raise UserError(problem.replace("near_plane", "--near").replace("far_plane", "--far"))

    from splatpainter.assets.gaussians import up_axis_rotation
    from splatpainter.camera import load_cameras, orbit_cameras, save_camera, save_cameras
    from splatpainter.render import render as render_fn

    asset = read_asset(asset_path)
    if camera is not None:
        cams = load_cameras(camera)
        if wh is not None:
            cams = [c.resized(*wh) for c in cams]
    else:
        if orbit is None or not 1 <= orbit <= 10000:
            raise UserError(f"--orbit must be a positive count (at most 10000), got {orbit}")
        w, h = wh or (256, 256)
        up_vec = up_axis_rotation("+z", up)[:, 2].tolist()
        cams = orbit_cameras(
            asset,
            orbit,
            width=w,
            height=h,
            fov_y_deg=fov,
            elevation_deg=elevation,
            up=up_vec,
            fit="points",
        )
    from splatpainter.io.images import save_png

    for c in cams:
        check_render_size(c.width, c.height, "camera size")
    check_output_dir(out)
    kernel_warmup(backend, dev)
    asset = asset.to(dev)
    used = []
    views = []
    opts = {"near_plane": near, "far_plane": far, "rasterize_mode": mode}
    with torch.no_grad(), progress("rendering views", total=len(cams)) as bar:
        for i, cam in enumerate(cams):
            res = render_fn(
                asset, cam.to(dev), background=bg, sh_degree=sh_degree, backend=backend, **opts
            )
            stem = out / f"view_{i:03d}"
            view = {"rgb": f"{stem}.png", "camera": f"{stem}.json"}
            save_png(res.rgb, view["rgb"])
            save_camera(cam, view["camera"])
            if alpha:
                view["alpha"] = f"{stem}_alpha.png"
                save_png(res.alpha, view["alpha"])
            if depth:
                view["depth"] = f"{stem}_depth.npy"
                view["depth_png"] = f"{stem}_depth.png"
                view["depth_range"] = save_depth(res.depth, res.alpha, view["depth"])
                save_png(depth_preview(res.depth, res.alpha), view["depth_png"])
            views.append(view)
            used.append(cam)
            bar.advance()
    save_cameras(used, out / "cameras.json")
    if json_out:
        print_json(
            {
                "out": str(out),
                "views": views,
                "cameras": str(out / "cameras.json"),
                "width": [c.width for c in used],
                "height": [c.height for c in used],
                "backend": backend,
                **opts,
            }
        )
        return
    typer.echo(f"wrote {len(used)} view(s) to {out}")


def save_depth(depth, alpha, path: str) -> list[float | None]:
    """Atomically write the expected depth as float32 .npy; returns its [min, max] where drawn."""
    import io

    import numpy as np

    from appshell.atomic import atomic_write_bytes

    d = depth.detach().cpu().float().numpy()
    buf = io.BytesIO()
    np.save(buf, d)
    atomic_write_bytes(path, buf.getvalue())
    drawn = alpha.detach().cpu().numpy() > 0
    return [float(d[drawn].min()), float(d[drawn].max())] if drawn.any() else [None, None]


def depth_preview(depth, alpha):
    """[H, W] in [0, 1] for a PNG: near = 1, far = 0 over the drawn pixels, 0 elsewhere."""
    import torch

    drawn = alpha > 0
    if not bool(drawn.any()):
        return torch.zeros_like(depth)
    lo, hi = depth[drawn].min(), depth[drawn].max()
    scaled = 1.0 - (depth - lo) / (hi - lo).clamp_min(1e-12)
    return torch.where(drawn, scaled, torch.zeros_like(depth))
