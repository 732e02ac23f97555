"""Sessions of the browser editor: one `EditSession` per id, autosaved to a work directory.

Layout: `<workdir>/sessions/<id>/session.spsession` (the `EditSession` file, rewritten atomically
after every change) and `meta.json` (name, creation time, the last view).  Ids are 32 random hex
digits and are the only thing the client names; anything else is refused before it can reach
the file system.  Live sessions are kept in memory (least recently used ones are dropped; they
are on disk) and each has a lock, so one session runs one edit at a time while other sessions
and renders go on.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from appshell.atomic import remove_stale_temps
from splatpainter.edit import EditSession, SessionError
from splatpainter.web.views import OrbitView, WebInputError

SESSION_ID = re.compile(r"[0-9a-f]{32}")
SESSION_FILE = "session.spsession"
META_FILE = "meta.json"
METHODS = ("model", "backproject", "optimize")


class NotFound(LookupError):
    """No session with this id (answered with 404)."""


class Busy(RuntimeError):
    """The session is running an edit (answered with 409)."""


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
        }


def default_workdir() -> Path:
    """`$XDG_DATA_HOME/splatpainter` (or ~/.local/share/splatpainter)."""
    import os

    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "splatpainter"


class SessionStore:
    """Creates, finds, saves and evicts sessions; `make_method()` builds a session's method."""

    def __init__(self, workdir: Path, make_method, *, max_live: int = 8) -> None:
        self.root = Path(workdir) / "sessions"
        self.root.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(self.root, recursive=True)  # saves a killed server left unfinished
        self.make_method = make_method
        self.max_live = max_live
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
        self.save(live)
        self._remember(live)
        return live

    def get(self, sid: str) -> LiveSession:
        d = self._dir(sid)
        with self._guard:
            live = self._live.get(sid)
            if live is not None:
                self._live.move_to_end(sid)
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
        )
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

    def save(self, live: LiveSession, *, meta_only: bool = False) -> None:
        """Autosave (atomic writes): the session file after a change, the meta always."""
        from splatpainter.io import atomic_write_text

        d = self._dir(live.sid)
        if not meta_only:
            live.session.save(d / SESSION_FILE)
        meta = {"name": live.name, "created": live.created, "view": live.view.to_dict()}
        atomic_write_text(d / META_FILE, json.dumps(meta))

    # ------------------------------------------------------------------ edits under the lock
    def mutate(self, sid: str, what: str, fn) -> dict[str, Any]:
        """Run fn(live) holding the session's lock (409 if another edit runs), then autosave."""
        live = self.get(sid)
        if not live.lock.acquire(blocking=False):
            raise Busy(f"this session is busy ({(live.busy or {}).get('what', 'an edit')})")
        try:
            live.busy = {"what": what, "since": time.time()}
            fn(live)
            self.save(live)
        finally:
            live.busy = None
            live.lock.release()
        return live.info()


__all__ = [
    "METHODS",
    "SESSION_ID",
    "Busy",
    "LiveSession",
    "NotFound",
    "SessionError",
    "SessionStore",
    "default_workdir",
]
