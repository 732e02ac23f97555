"""`splatpainter` command line: thin shells over the library.

Each sub-command lives in its own module and registers itself on `app`;
heavy imports (torch, numba) happen inside the commands so `--help` is fast.
"""

from splatpainter.cli import (
    convert,  # noqa: F401
    edit,  # noqa: F401
    evaluate,  # noqa: F401
    info,  # noqa: F401
    render,  # noqa: F401
    serve,  # noqa: F401
    session,  # noqa: F401
    train,  # noqa: F401
)
from splatpainter.cli.app import app

__all__ = ["app"]
