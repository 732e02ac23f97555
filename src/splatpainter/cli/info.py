"""`splatpainter info ASSET`: count, SH degree, bounds and attribute statistics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from appshell.cli import JsonFlag, note, print_json
from splatpainter.cli.app import app
from splatpainter.cli.options import read_asset


def asset_summary(asset: Any) -> dict[str, Any]:
    """Plain-data statistics of a GaussianAsset (what `info` prints)."""
    import torch

    a = asset.detach().to(device="cpu", dtype=torch.float32)
    n = a.num_gaussians
    out: dict[str, Any] = {
        "num_gaussians": n,
        "sh_degree": a.sh_degree,
        "feature_dim": None if a.features is None else int(a.features.shape[1]),
    }
    if n == 0:
        return out

    def stats(t: torch.Tensor) -> dict[str, float]:
        t = t.reshape(-1).double()
        return {
            "min": float(t.min()),
            "median": float(t.median()),
            "mean": float(t.mean()),
            "max": float(t.max()),
        }

    lo, hi = a.bounds()
    out["bounds_min"] = [float(v) for v in lo]
    out["bounds_max"] = [float(v) for v in hi]
    out["extent"] = [float(v) for v in hi - lo]
    out["center"] = [float(v) for v in (lo + hi) / 2]
    out["scale"] = stats(a.scales())
    out["anisotropy"] = stats(a.scales().max(dim=1).values / a.scales().min(dim=1).values)
    out["opacity"] = stats(a.opacities())
    out["quat_norm"] = stats(a.quats.norm(dim=1))
    colors = a.base_colors()
    out["base_color_mean"] = [float(v) for v in colors.mean(dim=0)]
    if a.sh_degree > 0:
        out["sh_rest_abs_mean"] = float(a.sh[:, 1:].abs().mean())
    return out


def _fmt_stats(s: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.4g}" for k, v in s.items())


@app.command()
def info(
    asset_path: Path = typer.Argument(..., metavar="ASSET", help=".ply, .splat or .spz file"),
    as_json: JsonFlag = False,
) -> None:
    """Print format, Gaussian count, SH degree, bounds and attribute statistics of an asset."""
    from splatpainter.io import describe_format

    notes: list[str] = []
    asset = read_asset(asset_path, notes=notes)
    summary = {
        "path": str(asset_path),
        "format": describe_format(asset_path),
        **asset_summary(asset),
        "notes": notes,
    }
    for line in notes:
        note(f"note: {line}")
    if as_json:
        print_json(summary)
        return
    lines = [
        f"file          {summary['path']}",
        f"format        {summary['format']}",
        f"gaussians     {summary['num_gaussians']}",
        f"sh degree     {summary['sh_degree']}",
        f"features      {summary['feature_dim'] or 'none'}",
    ]
    if summary["num_gaussians"]:
        vec = lambda v: "(" + ", ".join(f"{x:.4g}" for x in v) + ")"  # noqa: E731
        lines += [
            f"bounds min    {vec(summary['bounds_min'])}",
            f"bounds max    {vec(summary['bounds_max'])}",
            f"extent        {vec(summary['extent'])}",
            f"centre        {vec(summary['center'])}",
            f"scale         {_fmt_stats(summary['scale'])}",
            f"anisotropy    {_fmt_stats(summary['anisotropy'])}",
            f"opacity       {_fmt_stats(summary['opacity'])}",
            f"|quat|        {_fmt_stats(summary['quat_norm'])}",
            f"mean colour   {vec(summary['base_color_mean'])}",
        ]
        if "sh_rest_abs_mean" in summary:
            lines.append(f"|sh rest|     mean {summary['sh_rest_abs_mean']:.4g}")
    typer.echo("\n".join(lines))
