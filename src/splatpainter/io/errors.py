"""Errors raised by asset readers and writers."""

from __future__ import annotations

from splatpainter.assets.gaussians import AssetError


class AssetFormatError(AssetError):
    """A file that is not a valid asset of the expected format (a ValueError subclass)."""
