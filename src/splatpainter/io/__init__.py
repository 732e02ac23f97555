"""Asset file formats (.ply, .splat) and atomic writes; load/save dispatch on the extension."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from appshell.atomic import atomic_open, atomic_write_bytes, atomic_write_text
from splatpainter.assets.gaussians import GaussianAsset
from splatpainter.io.errors import AssetFormatError
from splatpainter.io.ply import (
    ply_from_bytes,
    ply_to_bytes,
    read_ply,
    read_ply_with_extras,
    write_ply,
)
from splatpainter.io.splat import read_splat, splat_from_bytes, splat_to_bytes, write_splat
from splatpainter.io.validate import check_asset_values

SUPPORTED_EXTENSIONS = (".ply", ".splat")


def _ext(path: str | os.PathLike[str]) -> str:
    ext = Path(path).suffix.lower()
    if ext not in SUPPORTED_EXTENSIONS:
        raise AssetFormatError(
            f"{path}: unknown asset format {ext or '(no extension)'!r}; "
            f"supported: {', '.join(SUPPORTED_EXTENSIONS)}"
        )
    return ext


def load_asset(
    path: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32
) -> GaussianAsset:
    """Read a .ply or .splat file into a validated CPU asset (float64 reads a .splat so that
    writing it back as .splat is byte-exact)."""
    ext = _ext(path)
    asset = read_ply(path).to(dtype) if ext == ".ply" else read_splat(path, dtype=dtype)
    return check_asset_values(asset, str(path))


def save_asset(asset: GaussianAsset, path: str | os.PathLike[str], **kwargs: Any) -> None:
    """Atomically write a .ply or .splat file that `load_asset` accepts (checked before writing).

    Keyword options go to write_ply / write_splat.
    """
    ext = _ext(path)
    if ext == ".ply":
        write_ply(asset, path, **kwargs)
    else:
        write_splat(asset, path, **kwargs)


__all__ = [
    "SUPPORTED_EXTENSIONS",
    "AssetFormatError",
    "atomic_open",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_asset_values",
    "load_asset",
    "ply_from_bytes",
    "ply_to_bytes",
    "read_ply",
    "read_ply_with_extras",
    "read_splat",
    "save_asset",
    "splat_from_bytes",
    "splat_to_bytes",
    "write_ply",
    "write_splat",
]
