"""`splatpainter convert IN OUT`: between INRIA .ply, .splat and .spz (any .ply reads, also
PlayCanvas compressed; the output format follows OUT's extension)."""

from __future__ import annotations

from pathlib import Path

import torch
import typer

from appshell.cli import JsonFlag, UserError, note, print_json
from splatpainter.cli.app import app
from splatpainter.cli.options import read_asset, write_asset

_OUTPUTS = (".ply", ".splat", ".spz")


@app.command()
def convert(
    src: Path = typer.Argument(..., metavar="IN", help="input .ply, .splat or .spz"),
    dst: Path = typer.Argument(..., metavar="OUT", help="output .ply, .splat or .spz"),
    sort: bool = typer.Option(False, help=".splat output: order by size x opacity (viewers)"),
    json_out: JsonFlag = False,
) -> None:
    """Convert an asset between .ply, .splat and .spz (the output is written atomically)."""
    from splatpainter.io.ply import read_ply_with_extras

    out_ext = dst.suffix.lower()
    if out_ext not in _OUTPUTS:
        raise UserError(
            f"{dst}: unknown output format {out_ext or '(none)'!r}; use .ply, .splat or .spz"
        )
    notes: list[str] = []
    if src.suffix.lower() == ".splat" and out_ext == ".splat":
        # float64 holds the log of every stored float32 scale exactly: the bytes come back
        asset = read_asset(src, dtype=torch.float64, notes=notes)
    else:
        asset = read_asset(src, notes=notes)
    if out_ext == ".splat":
        if asset.sh_degree > 0:
            notes.append(f".splat keeps only the DC colour; SH degree {asset.sh_degree} dropped")
        write_asset(asset, dst, sort=sort)
    elif out_ext == ".spz":
        write_asset(asset, dst, notes=notes)
    else:
        extras = {}
        if src.suffix.lower() == ".ply":
            extras = read_ply_with_extras(src, notes=[])[1]  # its notes were given above
        write_asset(asset, dst, extras=extras)
    for line in notes:
        note(f"note: {line}")
    if json_out:
        print_json(
            {"in": str(src), "out": str(dst), "num_gaussians": asset.num_gaussians, "notes": notes}
        )
        return
    typer.echo(f"wrote {dst} ({asset.num_gaussians} Gaussians)")
