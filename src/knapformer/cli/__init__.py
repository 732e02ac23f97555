"""`knapformer` command line: thin shells over the library.

Each sub-command lives in its own module and registers itself on `app`;
heavy imports (torch, scipy) happen inside the commands so `--help` is fast.
"""

from knapformer.cli import (
    calibrate,  # noqa: F401
    plan,  # noqa: F401
    simulate,  # noqa: F401
    train,  # noqa: F401
)
from knapformer.cli.app import app

__all__ = ["app"]
