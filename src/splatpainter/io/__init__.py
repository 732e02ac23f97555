"""Asset file formats (.ply, .splat, .spz) and atomic writes; load/save dispatch on the extension.

A ``.ply`` may be INRIA 3DGS or PlayCanvas compressed (recognised from its header).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from appshell.atomic import atomic_open, atomic_write_bytes, atomic_write_text
from appshell.inputs import InputFileError, check_regular_file
from splatpainter.assets.gaussians import GaussianAsset
from splatpainter.io.errors import AssetFormatError, AssetNoteWarning
from splatpainter.io.ply import (
    MAX_HEADER_BYTES,
    ply_from_bytes,
    ply_kind,
    ply_to_bytes,
    read_ply,
    read_ply_with_extras,
    write_ply,
)
from splatpainter.io.splat import read_splat, splat_from_bytes, splat_to_bytes, write_splat
from splatpainter.io.spz import read_spz, spz_from_bytes, spz_to_bytes, spz_version, write_spz
from splatpainter.io.validate import check_asset_values

SUPPORTED_EXTENSIONS = (".ply", ".splat", ".spz")


def _ext(path: str | os.PathLike[str]) -> str:
    ext = Path(path).suffix.lower()
    if ext not in SUPPORTED_EXTENSIONS:
        raise AssetFormatError(
            f"{path}: unknown asset format {ext or '(no extension)'!r}; "
            f"supported: {', '.join(SUPPORTED_EXTENSIONS)}"
        )
    return ext


def load_asset(
    path: str | os.PathLike[str],
    *,
    dtype: torch.dtype = torch.float32,
    notes: list[str] | None = None,
) -> GaussianAsset:
    """Read a .ply, .splat or .spz file into a validated CPU asset (float64 reads a .splat so
    that writing it back as .splat is byte-exact).

    What the reader changed or ignored (e.g. infinite opacities clamped) is appended to
    ``notes``, one line each; without a list it is an AssetNoteWarning.
    """
    ext = _ext(path)
    if ext == ".ply":
        asset = read_ply(path, notes=notes).to(dtype)
    elif ext == ".spz":
        asset = read_spz(path, notes=notes).to(dtype)
    else:
        asset = read_splat(path, dtype=dtype)
    return check_asset_values(asset, str(path))


def save_asset(asset: GaussianAsset, path: str | os.PathLike[str], **kwargs: Any) -> None:
    """Atomically write a .ply, .splat or .spz file that `load_asset` accepts.

    Keyword options go to write_ply / write_splat / write_spz.
    """
    ext = _ext(path)
    if ext == ".ply":
        write_ply(asset, path, **kwargs)
    elif ext == ".spz":
        write_spz(asset, path, **kwargs)
    else:
        write_splat(asset, path, **kwargs)


def describe_format(path: str | os.PathLike[str]) -> str:
    """The file's format in words: 'ply (INRIA)', 'ply (PlayCanvas compressed)', 'spz v3',
    'splat'. Reads only the header (AssetFormatError if it is not one of these)."""
    ext = _ext(path)
    if ext == ".splat":
        return "splat"
    try:
        check_regular_file(path, what="asset file")
        with open(path, "rb") as f:
            # A PLY header, or an .spz header (its gzip member header plus 16 bytes) fits.
            head = f.read(MAX_HEADER_BYTES)
    except (InputFileError, OSError) as e:
        raise AssetFormatError(str(e)) from None
    if ext == ".ply":
        return ply_kind(head, str(path))
    size = os.path.getsize(path)
    return f"spz v{spz_version(head, str(path), compressed_size=size)}"


__all__ = [
    "SUPPORTED_EXTENSIONS",
    "AssetFormatError",
    "AssetNoteWarning",
    "atomic_open",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_asset_values",
    "describe_format",
    "load_asset",
    "ply_from_bytes",
    "ply_to_bytes",
    "read_ply",
    "read_ply_with_extras",
    "read_splat",
    "read_spz",
    "save_asset",
    "splat_from_bytes",
    "splat_to_bytes",
    "spz_from_bytes",
    "spz_to_bytes",
    "write_ply",
    "write_splat",
    "write_spz",
]
