"""What the command-line shells of both packages share, and nothing system-specific.

- `appshell.inputs`: read user files safely (regular files only, size limits, bounded JSON).
- `appshell.atomic`: the one atomic-write helper (symlinks followed, modes kept, temp files
  cleaned up on errors and SIGTERM, output paths checked before anything is written).
- `appshell.cli`: the CLI layer (error handler, `--json`, progress, shared options, enums).
- `appshell.progress`: progress on stderr, live in a terminal and as occasional lines in logs.
- `appshell.tables`: dataclasses from TOML / JSON tables, with one error style.

It depends on the standard library, typer and rich only (torch is imported lazily for device
checks), so `knapformer` and `splatpainter` can both use it without depending on each other.
"""

from appshell.errors import UserError

__all__ = ["UserError"]
