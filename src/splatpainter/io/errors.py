"""Errors raised by asset readers and writers, and the notes they report."""

from __future__ import annotations

import warnings

from splatpainter.assets.gaussians import AssetError


class AssetFormatError(AssetError):
    """A file that is not a valid asset of the expected format (a ValueError subclass)."""


class AssetNoteWarning(UserWarning):
    """Something a reader or writer changed or ignored that the user should hear about."""


def add_note(notes: list[str] | None, message: str) -> None:
    """Append a one-line note for the caller to show, or warn when it passed no list.

    Readers and writers that take ``notes=`` report this way, so a CLI prints each note as
    one line while library callers still see it (as an AssetNoteWarning).
    """
    if notes is None:
        warnings.warn(message, AssetNoteWarning, stacklevel=3)
    else:
        notes.append(message)
