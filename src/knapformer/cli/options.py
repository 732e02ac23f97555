"""Options several `knapformer` commands share, declared once (defaults stay per command)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DModel = Annotated[int, typer.Option(help="Model width of the FLOP cost model.")]
Gamma = Annotated[float, typer.Option(help="Attention weight of the FLOP cost model.")]
Heads = Annotated[int, typer.Option(help="Attention heads (every bag size must divide it).")]
GpusPerNode = Annotated[int, typer.Option(help="Bags never span nodes.")]
Profile = Annotated[
    Path | None, typer.Option(help="Cost profile JSON (from `knapformer calibrate`).")
]

__all__ = ["DModel", "Gamma", "GpusPerNode", "Heads", "Profile"]
