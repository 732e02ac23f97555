"""The typer application that every `knapformer` sub-command registers on."""

from __future__ import annotations

from appshell.cli import App
from knapformer import __version__

app = App(help="KnapFormer: per-step load balancing and sequence parallelism for DiT training.")


@app.callback()
def main() -> None:
    """Run `COMMAND --help` for the options of each command."""


app.add_version_command(__version__)
