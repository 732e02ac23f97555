"""`knapformer` command line: thin shells over the library.

Each sub-command lives in its own module and registers itself on `app`;
heavy imports (torch, scipy) happen inside the commands so `--help` is fast.
"""

from knapformer.cli.app import app

__all__ = ["app"]
