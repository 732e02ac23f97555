"""A disk cache of Stage I latents (with their k-NN graphs), keyed by asset content and weights.

Opening a 1M-Gaussian asset (preprocessing renders, the Stage I encoder, normals, the k-NN
graph) takes tens of seconds; reading its latent back takes well under one.  Entries are
torch files named by their key (a sha256 of the asset's tensors, the editor's weights and
config, and `CACHE_VERSION`), written atomically, read weights-only.  The directory is held
under a size limit by evicting the least recently used entries (a hit refreshes an entry's
modification time).  An unreadable or inconsistent entry is deleted with a
`LatentCacheWarning` and rebuilt by the caller.

Where: ``SPLATPAINTER_CACHE_DIR`` (default ``$XDG_CACHE_HOME/splatpainter``, else
``~/.cache/splatpainter``), in its ``latents/`` folder; size limit ``SPLATPAINTER_CACHE_MB``
(default 4096; 0 turns the cache off).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import warnings
from pathlib import Path
from typing import Any

import torch

from appshell.atomic import atomic_write_with, remove_stale_temps
from appshell.inputs import InputFileError, env_megabytes, load_torch

CACHE_VERSION = 3  # bump when what Stage I or the graph computes changes (2: normals' vote;
# 3: bulky Gaussians' normals fitted to their neighbours)
ENTRY_FORMAT = "splatpainter-latent"
DIR_ENV = "SPLATPAINTER_CACHE_DIR"
SIZE_ENV = "SPLATPAINTER_CACHE_MB"
DEFAULT_MB = 4096
SUFFIX = ".latent.pt"


class LatentCacheWarning(UserWarning):
    """A cache entry could not be used (corrupt, foreign, or for another asset): rebuilt."""


def default_cache_dir() -> Path:
    """The latent cache folder the environment names (see the module doc)."""
    root = os.environ.get(DIR_ENV)
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = os.path.join(xdg, "splatpainter") if xdg else "~/.cache/splatpainter"
    return Path(root).expanduser() / "latents"


def default_max_bytes() -> int:
    """The size limit the environment names; an unreadable value is the default."""
    return env_megabytes(SIZE_ENV, DEFAULT_MB)


def cache_key(*parts: str) -> str:
    """One file-name-safe key from the parts that decide an entry's content."""
    h = hashlib.sha256(f"v{CACHE_VERSION}".encode())
    for p in parts:
        h.update(b"\0" + p.encode())
    return h.hexdigest()


class LatentCache:
    """Entries (plain dicts of tensors) in one folder, at most `max_bytes` in all, LRU."""

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int) -> None:
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        self.hits = self.misses = self.evictions = self.rebuilds = 0
        self._writes: list[threading.Thread] = []  # `put(..., wait=False)` still writing
        self._lock = threading.Lock()
        remove_stale_temps(self.directory)  # of writes a killed process left

    @classmethod
    def from_env(cls) -> LatentCache:
        return cls(default_cache_dir(), default_max_bytes())

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def path(self, key: str) -> Path:
        return self.directory / f"{key}{SUFFIX}"

    def get(self, key: str) -> dict[str, Any] | None:
        """The entry stored under key, or None (a miss; a corrupt entry is a warned miss)."""
        if not self.enabled:
            return None
        self.flush()
        p = self.path(key)
        if not p.exists():
            self.misses += 1
            return None
        try:
            payload = load_torch(p, what="latent cache entry")
            if not isinstance(payload, dict) or payload.get("format") != ENTRY_FORMAT:
                raise InputFileError(f"{p}: not a {ENTRY_FORMAT} entry")
            if payload.get("key") != key or not isinstance(payload.get("data"), dict):
                raise InputFileError(f"{p}: entry for another key")
        except InputFileError as e:
            self.discard(key, str(e).removeprefix(f"{p}: "))
            return None
        with contextlib.suppress(OSError):
            os.utime(p)  # most recently used
        self.hits += 1
        return payload["data"]

    def discard(self, key: str, why: str) -> None:
        """Delete an entry that cannot be used, saying why (the caller rebuilds it)."""
        p = self.path(key)
        warnings.warn(f"{p}: unusable latent cache entry ({why}); rebuilding it",
                      LatentCacheWarning, stacklevel=3)  # fmt: skip
        with contextlib.suppress(OSError):
            p.unlink()
        self.rebuilds += 1
        self.misses += 1

    def put(self, key: str, data: dict[str, Any], *, wait: bool = True) -> None:
        """Store an entry (atomically), then evict least recently used ones over the limit.

        wait=False writes in a background thread (not a daemon: the interpreter finishes it
        before exiting), so that opening a large asset does not wait for ~300 MB to reach the
        disk; every other method of the cache waits for it first.  `data` must not change
        in place meanwhile.  A failed write (full disk, read-only folder) is a warning: the
        cache is an optimisation, never a reason for an edit to fail."""
        if not self.enabled:
            return
        if wait:
            self._write(key, data)
            return
        t = threading.Thread(target=self._write, args=(key, data), name="latent-cache-write")
        with self._lock:
            self._writes.append(t)
        t.start()

    def flush(self) -> None:
        """Wait for the background writes of `put(..., wait=False)`."""
        with self._lock:
            writes, self._writes = self._writes, []
        for t in writes:
            t.join()

    def _write(self, key: str, data: dict[str, Any]) -> None:
        payload = {"format": ENTRY_FORMAT, "version": CACHE_VERSION, "key": key, "data": data}
        try:
            atomic_write_with(self.path(key), lambda f: torch.save(payload, f))
        except OSError as e:
            warnings.warn(f"latent cache not written ({e})", LatentCacheWarning, stacklevel=2)
            return
        self.evict(keep=key, flush=False)

    def entries(self) -> list[tuple[float, int, Path]]:
        """(last use, size, path) of every entry, least recently used first."""
        self.flush()
        return self._entries()

    def _entries(self) -> list[tuple[float, int, Path]]:
        out = []
        for p in self.directory.glob(f"*{SUFFIX}"):
            with contextlib.suppress(OSError):
                st = p.stat()
                out.append((st.st_mtime, st.st_size, p))
        return sorted(out)

    def size_bytes(self) -> int:
        return sum(size for _, size, _ in self.entries())

    def evict(self, keep: str | None = None, *, flush: bool = True) -> None:
        """Delete least recently used entries until the folder is within the limit (`keep`
        goes last: only when it alone is over the limit)."""
        entries = self.entries() if flush else self._entries()
        total = sum(size for _, size, _ in entries)
        kept = self.path(keep) if keep is not None else None
        order = [e for e in entries if e[2] != kept] + [e for e in entries if e[2] == kept]
        for _, size, p in order:
            if total <= self.max_bytes:
                break
            with contextlib.suppress(OSError):
                p.unlink()
                total -= size
                self.evictions += 1
