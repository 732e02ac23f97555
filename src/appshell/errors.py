"""The error type for bad user input that has no more specific home."""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user (a file, an option value); the CLI prints it as one line."""


def first_line(exc: BaseException) -> str:
    """The first non-blank line of an exception's message (its type name if it has none): a
    library's multi-line message shown inside our one-line errors."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__
