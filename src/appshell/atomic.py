"""The one atomic-write helper: readers see the old file or the complete new one.

- Writing through a symlink writes its target (the link stays a link).
- A replaced file keeps its permission bits; a new file gets ``0o666 & ~umask``, like ``open``.
- Missing parent directories are created; the temp file (next to the target, hidden) is
  removed on any exception and on SIGTERM.
- An ``OSError`` while writing (e.g. ENOSPC) names the path that was being written.
- `check_outputs` validates every output path of a command before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from appshell.errors import UserError

_active: set[str] = set()
_lock = threading.Lock()
_previous_handler: Any = None
_installed = False


def _on_sigterm(signum: int, frame: Any) -> None:
    """Remove temp files of writes in progress, then behave as the previous handler would."""
    with _lock:
        temps = list(_active)
    for tmp in temps:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    prev = _previous_handler
    if callable(prev):
        prev(signum, frame)
    elif prev != signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_sigterm_cleanup() -> None:
    global _installed, _previous_handler
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    with contextlib.suppress(ValueError, OSError):
        prev = signal.getsignal(signal.SIGTERM)
        if prev is not _on_sigterm:
            _previous_handler = prev
            signal.signal(signal.SIGTERM, _on_sigterm)
        _installed = True


def _umask() -> int:
    # /proc avoids the os.umask(0) round trip, which races with other threads creating files.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def resolve_output(path: str | os.PathLike[str]) -> Path:
    """The file a write to path really replaces: symlinks (also dangling ones) followed."""
    return Path(os.path.realpath(os.fspath(path)))


def _named(e: OSError, path: str) -> OSError:
    """The error naming the output path: the hidden temp file is ours, not the user's."""
    return type(e)(e.errno, e.strerror or str(e), path)


_TEMP_NAME = re.compile(r"\..+\.[A-Za-z0-9_]{8}\.tmp")  # mkstemp(prefix=".NAME.", suffix=".tmp")


def remove_stale_temps(directory: str | os.PathLike[str], *, recursive: bool = False) -> list[Path]:
    """Delete the temp files interrupted atomic writes left in `directory` (a killed process
    cannot clean up); call it at start-up, for a directory only this program writes to.
    Writes in progress in this process are kept. Returns what was removed."""
    root = Path(directory)
    if not root.is_dir():
        return []
    with _lock:
        active = set(_active)
    found = root.rglob(".*.tmp") if recursive else root.glob(".*.tmp")
    removed = []
    for p in found:
        if _TEMP_NAME.fullmatch(p.name) and os.path.realpath(p) not in active and p.is_file():
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p)
    return removed


@contextlib.contextmanager
def atomic_open(
    path: str | os.PathLike[str], mode: str = "wb", *, encoding: str | None = None
) -> Iterator[IO[Any]]:
    """A file handle on a temp file next to path, renamed over it only if the block succeeds.

    mode is "wb" (default) or "w" (text, UTF-8 unless encoding says otherwise).
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open mode must be 'wb' or 'w', got {mode!r}")
    shown = os.fspath(path)
    target = resolve_output(path)
    if target.is_dir():
        raise IsADirectoryError(21, "Is a directory", shown)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as e:
        raise _named(e, shown) from None
    _install_sigterm_cleanup()
    with _lock:
        _active.add(tmp)
    try:
        try:
            perm = target.stat().st_mode & 0o7777
        except FileNotFoundError:
            perm = 0o666 & ~_umask()
        kwargs = {"encoding": encoding or "utf-8"} if mode == "w" else {}
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, perm)
        os.replace(tmp, target)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _named(e, shown) from e
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        with _lock:
            _active.discard(tmp)
    _fsync_dir(target.parent)


def _fsync_dir(directory: Path) -> None:
    # Persist the rename itself; not supported everywhere, so best effort.
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


def atomic_write_with(path: str | os.PathLike[str], writer: Callable[[IO[bytes]], None]) -> None:
    """Call writer(file) on a temp file, then atomically move it into place."""
    with atomic_open(path) as f:
        writer(f)


def check_outputs(*paths: str | os.PathLike[str] | None) -> None:
    """Raise UserError unless every output path can be written; writes nothing that stays.

    Call it before a command writes the first of several outputs, so a bad second path does
    not leave the first one written. Each directory is probed by creating (and removing) a
    temp file, which also catches read-only file systems.
    """
    seen: dict[Path, str] = {}
    for p in paths:
        if p is None:
            continue
        shown = os.fspath(p)
        target = resolve_output(p)
        if target in seen:
            raise UserError(f"{shown} and {seen[target]} are the same output file")
        seen[target] = shown
        if target.is_dir():
            raise UserError(f"{shown}: is a directory, expected a file path")
        _probe_dir(target.parent, shown)


def check_output_dir(path: str | os.PathLike[str]) -> Path:
    """Create the output directory path (with parents) and check that files can be made in it."""
    shown = os.fspath(path)
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UserError(f"{shown}: exists and is not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"{shown}: cannot create the directory ({e.strerror or e})") from None
    _probe_dir(p, shown)
    return p


def _probe_dir(directory: Path, shown: str) -> None:
    # Missing directories are created by the write; the nearest existing one must take files.
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    if not directory.is_dir():
        raise UserError(f"{shown}: {directory} is not a directory")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".write-check.", dir=directory)
    except OSError as e:
        raise UserError(f"{shown}: cannot write in {directory} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(tmp)


def write_all(outputs: Iterable[tuple[str | os.PathLike[str], Callable[[IO[bytes]], None]]]):
    """Check every output path, then write each one atomically (in order)."""
    outputs = list(outputs)
    check_outputs(*(p for p, _ in outputs))
    for p, writer in outputs:
        atomic_write_with(p, writer)


__all__ = [
    "atomic_open",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_with",
    "check_output_dir",
    "check_outputs",
    "remove_stale_temps",
    "resolve_output",
    "write_all",
]
