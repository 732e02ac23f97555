"""The typer application that every `splatpainter` sub-command registers on."""

from __future__ import annotations

from appshell.cli import App
from splatpainter import __version__

app = App(help="SplatPainter: edit 3D Gaussian Splatting assets from 2D edits.")


@app.callback()
def main() -> None:
    """Run `COMMAND --help` for the options of each command."""


app.add_version_command(__version__)
