"""Atomic writes for splatpainter: the repository's one helper, `appshell.atomic`, re-exported."""

from appshell.atomic import (
    atomic_open,
    atomic_write_bytes,
    atomic_write_text,
    atomic_write_with,
    check_output_dir,
    check_outputs,
)

__all__ = [
    "atomic_open",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_with",
    "check_output_dir",
    "check_outputs",
]
