"""`splatpainter convert IN OUT`: between INRIA .ply and antimatter15 .splat."""

from __future__ import annotations

from pathlib import Path

import typer

from splatpainter.cli.app import app
from splatpainter.cli.info import user_errors


@app.command()
def convert(
    src: Path = typer.Argument(..., metavar="IN", help="input .ply or .splat"),
    dst: Path = typer.Argument(..., metavar="OUT", help="output .ply or .splat"),
    sort: bool = typer.Option(False, help=".splat output: order by size x opacity (viewers)"),
) -> None:
    """Convert an asset between .ply and .splat (the output is written atomically)."""
    with user_errors():
        from splatpainter.io import load_asset, save_asset
        from splatpainter.io.ply import read_ply_with_extras

        out_ext = dst.suffix.lower()
        if out_ext not in (".ply", ".splat"):
            raise ValueError(
                f"{dst}: unknown output format {out_ext or '(none)'!r}; use .ply or .splat"
            )
        asset = load_asset(src)
        if out_ext == ".splat":
            if asset.sh_degree > 0:
                typer.echo(
                    f"note: .splat keeps only the DC colour; SH degree {asset.sh_degree} dropped",
                    err=True,
                )
            save_asset(asset, dst, sort=sort)
        else:
            extras = {}
            if src.suffix.lower() == ".ply":
                extras = read_ply_with_extras(src)[1]
            save_asset(asset, dst, extras=extras)
    typer.echo(f"wrote {dst} ({asset.num_gaussians} Gaussians)")
