"""The error type for bad user input that has no more specific home."""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user (a file, an option value); the CLI prints it as one line."""
