"""Atomic file writes: readers see the old file or the complete new one, never a partial one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


def _default_mode() -> int:
    # mkstemp creates 0600 files; new files should get the usual 0666 & ~umask instead.
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


_DEFAULT_MODE = _default_mode()


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Binary file handle on a temp file next to path; renamed over path only on success.

    On any exception the temp file is removed and path is left untouched.
    """
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        mode = target.stat().st_mode & 0o7777 if target.exists() else _DEFAULT_MODE
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    # Persist the rename itself; not supported everywhere (e.g. Windows), so best effort.
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_open(path) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_with(path: str | os.PathLike[str], writer: Callable[[BinaryIO], None]) -> None:
    """Call writer(file) on a temp file, then atomically move it into place."""
    with atomic_open(path) as f:
        writer(f)
