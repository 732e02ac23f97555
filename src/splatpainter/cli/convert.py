"""`splatpainter convert IN OUT`: between INRIA .ply and antimatter15 .splat."""

from __future__ import annotations

from pathlib import Path

import torch
import typer

from appshell.cli import JsonFlag, UserError, note, print_json
from splatpainter.cli.app import app
from splatpainter.cli.options import read_asset, write_asset


@app.command()
def convert(
    src: Path = typer.Argument(..., metavar="IN", help="input .ply or .splat"),
    dst: Path = typer.Argument(..., metavar="OUT", help="output .ply or .splat"),
    sort: bool = typer.Option(False, help=".splat output: order by size x opacity (viewers)"),
    json_out: JsonFlag = False,
) -> None:
    """Convert an asset between .ply and .splat (the output is written atomically)."""
    from splatpainter.io.ply import read_ply_with_extras

    out_ext = dst.suffix.lower()
    if out_ext not in (".ply", ".splat"):
        raise UserError(f"{dst}: unknown output format {out_ext or '(none)'!r}; use .ply or .splat")
    if src.suffix.lower() == ".splat" and out_ext == ".splat":
        # float64 holds the log of every stored float32 scale exactly: the bytes come back
        asset = read_asset(src, dtype=torch.float64)
    else:
        asset = read_asset(src)
    if out_ext == ".splat":
        if asset.sh_degree > 0:
            note(f"note: .splat keeps only the DC colour; SH degree {asset.sh_degree} dropped")
        write_asset(asset, dst, sort=sort)
    else:
        extras = {}
        if src.suffix.lower() == ".ply":
            extras = read_ply_with_extras(src)[1]
        write_asset(asset, dst, extras=extras)
    if json_out:
        print_json({"in": str(src), "out": str(dst), "num_gaussians": asset.num_gaussians})
        return
    typer.echo(f"wrote {dst} ({asset.num_gaussians} Gaussians)")
