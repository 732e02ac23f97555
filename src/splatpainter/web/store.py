"""Sessions of the browser editor: one `EditSession` per id, autosaved to a work directory.

Layout: `<workdir>/sessions/<id>/session.spsession` (the `EditSession` file, rewritten atomically
after every change), `meta.json` (name, creation time, the last view) and `selection.bin` (the
3D selection, written atomically whenever it changes, so it outlives a reload and a restart).
Ids are 32 random hex digits and are the only thing the client names; anything else is refused
before it can reach the file system.  Live sessions are kept in memory (least recently used
ones are dropped; they are on disk) and each has a lock, so one session runs one edit at a time
while other sessions and renders go on.

Several tabs may show one session: every change to its history bumps the session's `revision`,
and a change requested on an older revision is refused (`Stale`, answered with 409) instead of
silently undoing what another tab did.  The work directory is bounded: at most `max_sessions`
sessions and `max_disk_bytes` bytes, the least recently used idle sessions deleted first.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from appshell.atomic import remove_stale_temps
from splatpainter.edit import EditSession, SessionError
from splatpainter.web.selection import hidden_mask
from splatpainter.web.views import OrbitView, WebInputError, orbit_frame

SESSION_ID = re.compile(r"[0-9a-f]{32}")
SESSION_FILE = "session.spsession"
META_FILE = "meta.json"
SELECTION_FILE = "selection.bin"
SELECTION_MAGIC = b"SPSEL1\0\0"  # then num_gaussians (uint64 LE), then the bits (np.packbits)
METHODS = ("model", "backproject", "optimize")


class NotFound(LookupError):
    """No session with this id (answered with 404)."""


class Busy(RuntimeError):
    """The session is running an edit (answered with 409)."""


class Stale(RuntimeError):
    """A change made on an older revision of the session (answered with 409): another tab
    changed the history since this request's page last saw it."""

    def __init__(self, revision: int, sent: int) -> None:
        super().__init__(
            f"this session changed in another tab or window (it is at revision {revision}, the "
            f"request was made on revision {sent}); reload its state and try again"
        )
        self.revision = revision


class Cancelled(RuntimeError):
    """The user cancelled the running edit; its result was dropped (answered with 409)."""


class Full(RuntimeError):
    """No room for another session: every other one is busy (answered with 503)."""


@dataclass
class LiveSession:
    """An open session: the edit session, its lock and what the page needs to show it."""

    sid: str
    session: EditSession
    name: str
    created: float
    view: OrbitView
    centre: torch.Tensor
    radius: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    busy: dict[str, Any] | None = None
    revision: int = 0  # bumped by every change to the history (the tabs' common clock)
    used: float = field(default_factory=time.time)  # last request; the least recent is evicted
    cancel: threading.Event = field(default_factory=threading.Event)
    running: Any = None  # the method of the edit that runs now (a cancel may stop it early)
    selection: torch.Tensor | None = None  # bool [N]: the Gaussians selected in 3D (not history)
    tint_cache: Any = None  # (asset, selection, the asset with the selection tinted)

    def info(self) -> dict[str, Any]:
        s = self.session
        base = s.entries[0].asset
        entries = []
        for i, e in enumerate(s.entries):
            entries.append(
                {
                    "index": i,
                    "label": e.label or e.method or "edit",
                    "method": e.method,
                    "seconds": round(float(e.seconds), 3),
                    "changed_gaussians": s.changed_gaussians(i),
                }
            )
        return {
            "id": self.sid,
            "name": self.name,
            "num_gaussians": base.num_gaussians,
            "index": s.index,
            "can_undo": s.can_undo,
            "can_redo": s.can_redo,
            "history": entries,
            "view": self.view.to_dict(),
            "busy": self.busy,
            "revision": self.revision,
            "selected": 0 if self.selection is None else int(self.selection.sum()),
            "hidden": int(hidden_mask(s.asset).sum()),
            # what the page needs to project 3D points (its box and sphere tools) into a view
            "orbit": orbit_frame(self.centre, self.radius, s.method.background),
        }

    def record(self, asset, label: str, method: str) -> bool:
        """Add `asset` (made by a direct edit, not an edit method) to the history, the method
        state carried over; False (nothing added) when no Gaussian changed."""
        s = self.session
        if asset is s.asset:
            return False
        s.record(asset, label, method)
        return s.changed_gaussians(s.index) > 0

    def meta(self) -> dict[str, Any]:
        """What meta.json keeps: enough to list the session without loading it."""
        return {
            "name": self.name,
            "created": self.created,
            "used": self.used,
            "view": self.view.to_dict(),
            "revision": self.revision,
            "index": self.session.index,
            "entries": len(self.session.entries),
            "num_gaussians": self.session.entries[0].asset.num_gaussians,
        }


def _number(value: Any, default: float) -> float:
    """A finite number read from meta.json, else `default` (the file is ours, but old or cut)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value) if abs(value) < 1e18 else default


def default_workdir() -> Path:
    """`$XDG_DATA_HOME/splatpainter` (or ~/.local/share/splatpainter)."""
    import os

    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "splatpainter"


class SessionStore:
    """Creates, finds, saves and evicts sessions; `make_method()` builds a session's method.

    `max_live` bounds the sessions kept in memory; `max_sessions` and `max_disk_bytes` bound
    the work directory (the least recently used idle sessions are deleted to stay within).
    """

    def __init__(
        self,
        workdir: Path,
        make_method,
        *,
        max_live: int = 8,
        max_sessions: int = 100,
        max_disk_bytes: int = 10 << 30,
    ) -> None:
        if max_sessions < 1 or max_disk_bytes < 1:
            raise WebInputError("the session limits must be at least 1 session and 1 byte")
        self.root = Path(workdir) / "sessions"
        self.root.mkdir(parents=True, exist_ok=True)
        # saves a killed server left unfinished (a session file's temp can be hundreds of MB)
        self.removed_temps = remove_stale_temps(self.root, recursive=True)
        self.make_method = make_method
        self.max_live = max_live
        self.max_sessions = max_sessions
        self.max_disk_bytes = max_disk_bytes
        self._live: OrderedDict[str, LiveSession] = OrderedDict()
        self._guard = threading.Lock()

    # ------------------------------------------------------------------ ids and paths
    def _dir(self, sid: str) -> Path:
        if not isinstance(sid, str) or not SESSION_ID.fullmatch(sid):
            raise NotFound("no such session (ids are 32 hex digits)")
        return self.root / sid

    def __len__(self) -> int:
        return len(self._live)

    # ------------------------------------------------------------------ lifecycle
    def create(self, asset, name: str) -> LiveSession:
        sid = secrets.token_hex(16)
        session = EditSession(asset, self.make_method())
        centre, radius = asset.bounding_sphere(sigma=3.0)
        live = LiveSession(
            sid, session, name, time.time(), OrbitView(), centre.detach().cpu(), float(radius)
        )
        self._dir(sid).mkdir(parents=True)
        self._remember(live)
        try:
            self.save(live)
            self.enforce_quota(keep=sid)
        except BaseException:
            self.delete(sid)
            raise
        return live

    def get(self, sid: str) -> LiveSession:
        d = self._dir(sid)
        with self._guard:
            live = self._live.get(sid)
            if live is not None:
                self._live.move_to_end(sid)
                live.used = time.time()
                return live
        if not (d / SESSION_FILE).is_file():
            raise NotFound("no such session")
        meta = self._read_meta(d)
        session = EditSession.load(d / SESSION_FILE, self.make_method())
        base = session.entries[0].asset
        centre, radius = base.bounding_sphere(sigma=3.0)
        try:
            view = OrbitView.from_dict(meta.get("view", {}))
        except (WebInputError, TypeError):
            view = OrbitView()
        live = LiveSession(
            sid,
            session,
            str(meta.get("name", "asset")),
            float(meta.get("created", 0.0)),
            view,
            centre.detach().cpu(),
            float(radius),
            revision=int(_number(meta.get("revision"), 0)),
        )
        live.selection = self._read_selection(d, base.num_gaussians)
        return self._remember(live)

    def _remember(self, live: LiveSession) -> LiveSession:
        with self._guard:
            live = self._live.setdefault(live.sid, live)
            self._live.move_to_end(live.sid)
            while len(self._live) > self.max_live:
                old_sid, old = next(iter(self._live.items()))
                if old.lock.locked():
                    break  # never drop a session mid-edit
                del self._live[old_sid]
            return live

    @staticmethod
    def _read_meta(d: Path) -> dict[str, Any]:
        try:
            meta = json.loads((d / META_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return meta if isinstance(meta, dict) else {}

    @staticmethod
    def _read_selection(d: Path, n: int) -> torch.Tensor | None:
        """The saved selection, or None (none saved, or a file that does not fit this asset)."""
        try:
            data = (d / SELECTION_FILE).read_bytes()
        except OSError:
            return None
        head = len(SELECTION_MAGIC) + 8
        if len(data) != head + (n + 7) // 8 or not data.startswith(SELECTION_MAGIC):
            return None
        if int.from_bytes(data[len(SELECTION_MAGIC) : head], "little") != n:
            return None
        bits = np.unpackbits(np.frombuffer(data, np.uint8, offset=head), count=n)
        return torch.from_numpy(bits.astype(bool))

    def save_selection(self, live: LiveSession) -> None:
        """Write the session's selection atomically (none: the file is removed)."""
        from splatpainter.io import atomic_write_bytes

        path = self._dir(live.sid) / SELECTION_FILE
        sel = live.selection
        if sel is None or not bool(sel.any()):
            path.unlink(missing_ok=True)
            return
        bits = np.packbits(sel.cpu().numpy().astype(np.uint8))
        n = int(sel.numel()).to_bytes(8, "little")
        atomic_write_bytes(path, SELECTION_MAGIC + n + bits.tobytes())

    def save(self, live: LiveSession, *, meta_only: bool = False) -> None:
        """Autosave (atomic writes): the session file after a change, the meta always."""
        from splatpainter.io import atomic_write_text

        d = self._dir(live.sid)
        if not meta_only:
            live.session.save(d / SESSION_FILE)
        atomic_write_text(d / META_FILE, json.dumps(live.meta()))

    # ------------------------------------------------------------------ listing and quota
    def _on_disk(self) -> list[tuple[str, Path]]:
        return [
            (d.name, d)
            for d in self.root.iterdir()
            if SESSION_ID.fullmatch(d.name) and (d / SESSION_FILE).is_file()
        ]

    @staticmethod
    def _size(d: Path) -> int:
        total = 0
        for p in d.iterdir():
            with contextlib.suppress(OSError):  # removed meanwhile
                total += p.stat().st_size
        return total

    def listing(self) -> list[dict[str, Any]]:
        """Every session on disk, most recently used first (read from meta.json: cheap)."""
        with self._guard:
            live = dict(self._live)
        out = []
        for sid, d in self._on_disk():
            if sid in live:
                item = {**live[sid].meta(), "busy": live[sid].busy}
            else:
                meta = self._read_meta(d)
                created = _number(meta.get("created"), 0.0)
                item = {
                    "name": str(meta.get("name", "asset")),
                    "created": created,
                    "used": _number(meta.get("used"), created),
                    "revision": int(_number(meta.get("revision"), 0)),
                    "index": meta.get("index"),
                    "entries": meta.get("entries"),
                    "num_gaussians": meta.get("num_gaussians"),
                    "busy": None,
                }
            item.pop("view", None)
            out.append({"id": sid, **item, "bytes": self._size(d)})
        return sorted(out, key=lambda i: -i["used"])

    def delete(self, sid: str) -> None:
        """Remove a session from memory and disk (refused while it runs an edit)."""
        import shutil

        d = self._dir(sid)
        with self._guard:
            live = self._live.get(sid)
            if live is not None and live.lock.locked():
                raise Busy("this session is busy; cancel or wait for its edit first")
            self._live.pop(sid, None)
        shutil.rmtree(d, ignore_errors=True)

    def enforce_quota(self, keep: str, *, strict: bool = True) -> list[str]:
        """Delete the least recently used idle sessions (never `keep`, never a busy one) until
        the count and the bytes are within the limits; returns the deleted ids.  `strict`:
        raise `Full` when the count cannot be met (a new session is then refused)."""
        items = [(i["used"], i["id"], i["bytes"]) for i in self.listing()]
        count, total = len(items), sum(b for _, _, b in items)
        evicted = []
        for _, sid, size in sorted(items):
            if count <= self.max_sessions and total <= self.max_disk_bytes:
                break
            if sid == keep:
                continue
            try:
                self.delete(sid)
            except Busy:
                continue
            evicted.append(sid)
            count, total = count - 1, total - size
        if strict and count > self.max_sessions:
            raise Full(
                f"the server keeps at most {self.max_sessions} sessions and the others are busy; "
                "try again when an edit finishes"
            )
        return evicted

    def cancel(self, sid: str) -> bool:
        """Ask the session's running edit to stop; its result is dropped. False: none runs."""
        live = self.get(sid)
        if not live.lock.locked():
            return False
        live.cancel.set()
        method = live.running
        if method is not None and getattr(method, "time_budget", None) is not None:
            method.time_budget = 0.0  # an optimisation stops at its next step
        return True

    # ------------------------------------------------------------------ edits under the lock
    def mutate(self, sid: str, what: str, fn, revision: int) -> dict[str, Any]:
        """Run fn(live) holding the session's lock, then autosave and bump the revision.

        Refused (409) while another edit runs, and when `revision` is not the session's (the
        request was made on a state another tab has changed since).  fn returning False means
        it changed nothing: its history entry is dropped, so nothing is saved or bumped.  A
        cancel (or an error) while fn runs drops what it did the same way.  The answer is the
        session's info with `changed` saying whether the history changed.
        """
        live = self.get(sid)
        if not live.lock.acquire(blocking=False):
            raise Busy(f"this session is busy ({(live.busy or {}).get('what', 'an edit')})")
        s = live.session
        before = s.mark()
        try:
            if revision != live.revision:
                raise Stale(live.revision, revision)
            live.cancel.clear()
            live.busy = {"what": what, "since": time.time()}
            try:
                changed = fn(live) is not False
                if live.cancel.is_set():
                    raise Cancelled(f"cancelled: {what} was stopped and left no trace")
            except BaseException:
                s.rollback(before)
                raise
            if not changed:
                s.rollback(before)
            else:
                live.revision += 1
                self.save(live)
                self.enforce_quota(keep=sid, strict=False)  # the edit is done and kept
        finally:
            live.busy = None
            live.running = None
            live.lock.release()
        return {**live.info(), "changed": changed}


__all__ = [
    "METHODS",
    "SESSION_ID",
    "Busy",
    "Cancelled",
    "Full",
    "LiveSession",
    "NotFound",
    "SessionError",
    "SessionStore",
    "Stale",
    "default_workdir",
]
