"""`splatpainter render ASSET (--camera CAM.json | --orbit N) --size WxH --out DIR`."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from splatpainter.cli.app import app
from splatpainter.cli.info import user_errors


def parse_size(text: str) -> tuple[int, int]:
    """'WxH' -> (width, height)."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not m or int(m.group(1)) <= 0 or int(m.group(2)) <= 0:
        raise ValueError(f"--size must look like WIDTHxHEIGHT (e.g. 256x256), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def parse_color(text: str) -> tuple[float, float, float]:
    parts = text.split(",")
    try:
        vals = tuple(float(p) for p in parts)
    except ValueError:
        vals = ()
    if len(vals) != 3 or not all(0.0 <= v <= 1.0 for v in vals):
        raise ValueError(f"--background must be three numbers in [0,1] like 1,1,1, got {text!r}")
    return vals  # type: ignore[return-value]


@app.command()
def render(
    asset_path: Path = typer.Argument(..., metavar="ASSET", help=".ply or .splat file"),
    camera: Path | None = typer.Option(
        None, help="camera JSON: one camera, a list, or INRIA cameras.json"
    ),
    orbit: int | None = typer.Option(None, help="render N turntable views framing the asset"),
    size: str | None = typer.Option(
        None, help="WxH (default: the camera's own size, or 256x256 for --orbit)"
    ),
    out: Path = typer.Option(..., help="output directory (PNG + camera JSON per view)"),
    backend: str = typer.Option("auto", help="renderer backend: auto, numba, reference, gsplat"),
    elevation: float = typer.Option(20.0, help="--orbit elevation in degrees"),
    fov: float = typer.Option(40.0, help="--orbit vertical field of view in degrees"),
    up: str = typer.Option("+z", help="--orbit up axis (+z, +y, ...)"),
    background: str = typer.Option("0,0,0", help="background colour r,g,b in [0,1]"),
    sh_degree: int | None = typer.Option(None, help="limit the SH degree used"),
    device: str = typer.Option("cpu", help="torch device"),
) -> None:
    """Render an asset to PNG files, saving the camera JSON used for each view."""
    with user_errors():
        if (camera is None) == (orbit is None):
            raise ValueError("give exactly one of --camera CAM.json or --orbit N")
        wh = parse_size(size) if size is not None else None
        bg = parse_color(background)

        import torch

        from splatpainter.assets.gaussians import up_axis_rotation
        from splatpainter.camera import load_cameras, orbit_cameras, save_camera, save_cameras
        from splatpainter.io import load_asset
        from splatpainter.render import render as render_fn

        asset = load_asset(asset_path)
        if camera is not None:
            cams = load_cameras(camera)
            if wh is not None:
                cams = [c.resized(*wh) for c in cams]
        else:
            if orbit is None or orbit < 1:
                raise ValueError(f"--orbit must be a positive count, got {orbit}")
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

        out.mkdir(parents=True, exist_ok=True)
        dev = torch.device(device)
        asset = asset.to(dev)
        used = []
        with torch.no_grad():
            for i, cam in enumerate(cams):
                res = render_fn(
                    asset, cam.to(dev), background=bg, sh_degree=sh_degree, backend=backend
                )
                stem = f"view_{i:03d}"
                save_png(res.rgb, out / f"{stem}.png")
                save_camera(cam, out / f"{stem}.json")
                used.append(cam)
        save_cameras(used, out / "cameras.json")
    typer.echo(f"wrote {len(used)} view(s) to {out}")
