"""The typer application that every `splatpainter` sub-command registers on."""

from __future__ import annotations

import typer

from splatpainter import __version__

app = typer.Typer(
    help="SplatPainter: edit 3D Gaussian Splatting assets from 2D edits.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def main() -> None:
    """Run `COMMAND --help` for the options of each command."""


@app.command()
def version() -> None:
    """Print the installed version."""
    typer.echo(__version__)
