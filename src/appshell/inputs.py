"""Reading user files safely: regular files only, bounded sizes, bounded JSON nesting.

A path given on the command line can name a FIFO (``open`` blocks forever), a device such as
``/dev/zero`` (``read`` never ends) or a symlink to one; a JSON file can nest deeply enough to
overflow the parser's recursion. Every reader of user input goes through here so each of
these is one clear error instead of a hang, a ``MemoryError`` or a ``RecursionError``.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from appshell.errors import UserError, first_line

MiB = 1 << 20
MAX_JSON_BYTES = 64 * MiB
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


class InputFileError(UserError):
    """A user file that cannot be read, is not a regular file, or is too large or malformed."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _check_stat(path: str, st: os.stat_result, max_bytes: int | None, what: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{path}: is {_kind(st.st_mode)}, not a regular {what}")
    if max_bytes is not None and st.st_size > max_bytes:
        raise InputFileError(
            f"{path}: {st.st_size:,} bytes is over the {max_bytes:,}-byte limit for a {what}"
        )


def check_regular_file(
    path: str | os.PathLike[str], *, max_bytes: int | None = None, what: str = "file"
) -> Path:
    """Raise InputFileError unless path (symlinks followed) is a readable-size regular file.

    For readers that open the path themselves (PIL, torch.load, safetensors); the stat never
    opens the file, so a FIFO cannot block it.
    """
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise InputFileError(f"cannot read {p}: {e.strerror or e}") from None
    _check_stat(p, st, max_bytes, what)
    return Path(p)


def read_bytes(
    path: str | os.PathLike[str], *, max_bytes: int | None = None, what: str = "file"
) -> bytes:
    """The contents of a regular file of at most max_bytes bytes (InputFileError otherwise)."""
    p = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)  # O_NONBLOCK: opening a FIFO returns at once instead of blocking
    except OSError as e:
        raise InputFileError(f"cannot read {p}: {e.strerror or e}") from None
    try:
        _check_stat(p, os.fstat(fd), max_bytes, what)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    except OSError as e:
        raise InputFileError(f"cannot read {p}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if max_bytes is not None and len(data) > max_bytes:  # the file grew while we read it
        raise InputFileError(f"{p}: over the {max_bytes:,}-byte limit for a {what}")
    return data


def read_text(
    path: str | os.PathLike[str], *, max_bytes: int | None = None, what: str = "file"
) -> str:
    """read_bytes decoded as UTF-8 (InputFileError on invalid UTF-8)."""
    data = read_bytes(path, max_bytes=max_bytes, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(
            f"{os.fspath(path)}: not UTF-8 text ({e.reason} at byte {e.start})"
        ) from None


def json_depth(data: bytes | str) -> int:
    """Deepest nesting of [ and { in JSON text, strings ignored (no recursion, linear time)."""
    import numpy as np

    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    stripped = _JSON_STRING.sub(b"", raw)
    arr = np.frombuffer(stripped, dtype=np.uint8)
    step = np.zeros(len(arr), dtype=np.int64)
    step[(arr == ord("[")) | (arr == ord("{"))] = 1
    step[(arr == ord("]")) | (arr == ord("}"))] = -1
    return int(np.cumsum(step).max()) if len(step) else 0


def loads_json(
    text: str | bytes,
    *,
    source: str = "<json>",
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """json.loads with a size and nesting limit; every failure is one InputFileError line."""
    size = len(text.encode("utf-8") if isinstance(text, str) else text)
    if size > max_bytes:
        raise InputFileError(f"{source}: {size:,} bytes of JSON is over the {max_bytes:,} limit")
    depth = json_depth(text)
    if depth > max_depth:
        raise InputFileError(f"{source}: JSON nested {depth} levels deep; the limit is {max_depth}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputFileError(f"{source}: not valid JSON ({e})") from None
    except UnicodeDecodeError as e:
        raise InputFileError(f"{source}: JSON is not UTF-8 ({e.reason})") from None
    except RecursionError:  # belt and braces: the depth scan should have caught it
        raise InputFileError(f"{source}: JSON nested too deeply") from None


def load_json(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
    what: str = "JSON file",
) -> Any:
    """Parse a JSON file read through read_bytes, with loads_json's limits."""
    data = read_bytes(path, max_bytes=max_bytes, what=what)
    return loads_json(data, source=os.fspath(path), max_bytes=max_bytes, max_depth=max_depth)


__all__ = [
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
    "InputFileError",
    "check_regular_file",
    "json_depth",
    "load_json",
    "loads_json",
    "read_bytes",
    "read_text",
]


def load_torch(path: str | os.PathLike[str], *, what: str = "torch file") -> Any:
    """``torch.load(path, weights_only=True)`` of a user file, every failure one line.

    A FIFO or device is refused without opening it, and anything that is not a torch archive
    (zip) or legacy pickle is named as such before torch's unpickler gives a misleading reason
    (an index error, or advice to load it unsafely).
    """
    import torch

    check_regular_file(path, what=what)
    with open(path, "rb") as f:
        head = f.read(4)
    if not head.startswith((b"PK\x03\x04", b"\x80")):
        kind = "an empty file" if not head else "not a torch archive"
        raise InputFileError(f"{path}: not a readable {what} ({kind})")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        why = first_line(e)
        if "Weights only load failed" in why:  # torch's advice to unpickle it unsafely
            why = "it holds objects a safe load refuses"
        raise InputFileError(f"{path}: not a readable {what} ({why})") from None


def env_megabytes(name: str, default_mb: float) -> int:
    """A size limit in bytes from the environment variable `name` (megabytes; 0 turns a cache
    off); unset: the default; not a number: the default, with a warning naming the variable."""
    import warnings

    raw = os.environ.get(name, "")
    try:
        mb = float(raw) if raw else default_mb
    except ValueError:
        warnings.warn(f"{name}={raw!r} is not a number; using {default_mb}", stacklevel=3)
        mb = default_mb
    return max(0, int(mb * 1024 * 1024))
