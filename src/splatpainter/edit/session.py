"""A stateful editing session: apply edits, undo/redo/goto/reset, export, save/load.

History is a list of entries (asset, method state, the edit that produced it); `index` points at
the current one.  Applying an edit drops any redo branch.  Undo/redo move the pointer, so they
restore the asset *and* the state bit-exactly.  In memory each entry holds its asset, but
methods replace only the tensors they change, so unchanged geometry is shared between entries.

A session file (torch.save of plain tensors and dicts, written atomically) holds the whole
history as *deltas*: the first asset in full, then per step only the rows (Gaussians) of each
tensor that changed, the method state with tensors equal to the previous step's stored as a
marker, and edit images as 8-bit when that is lossless.  So a step that recolours 500 of 1M
Gaussians costs kilobytes, not a full snapshot.  Loading checks that the method (and, for the
model, its config and weights) is the one it was made with.  `StoredSession` reads and rewrites
the file without any method (what `splatpainter session show|undo|redo|export` use).

A save holds what the session really holds: a view shared by several entries (as the records of
a loaded file may be) is one record on disk and one object in memory.  A read checks the stated
limits below before allocating from what the file claims: the file's size, its zip directory
(torch.save writes records uncompressed, so a compressed record or one larger than the file is
refused before torch inflates it), the number of entries, and what rebuilding them would take.
"""

from __future__ import annotations

import os
import struct
import time
import weakref
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from appshell.errors import first_line
from appshell.inputs import InputFileError, check_regular_file, load_torch
from splatpainter.edit.methods import EditMethod
from splatpainter.edit.views import EditInputError, EditView

SESSION_FORMAT = "splatpainter-session"
SESSION_VERSION = 2  # 1: a full asset snapshot per entry (still read)
_SAME = "__same_as_previous_entry__"

# Read limits, checked before anything is allocated from a file's claims: its zip directory
# before torch reads it, its history before any entry is rebuilt (issue #25).
MAX_SESSION_BYTES = 16 << 30  # the file: a base asset (PLY limit 8 GiB) plus its history
MAX_SESSION_RECORDS = 1 << 20  # tensors in the archive (each costs torch and zipfile memory)
MAX_SESSION_ENTRIES = 10_000  # history entries: far beyond any editing session
MAX_SESSION_REBUILD_BYTES = 16 << 30  # what rebuilding every entry's asset and views allocates


class SessionError(ValueError):
    """A session file that cannot be used with this method, or an impossible undo/redo."""


_BITS = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}
_BITS[torch.float64] = torch.int64


def _changed_row_mask(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """[N] bool: the rows of two same-shaped tensors that differ in any bit (-0.0 vs 0.0 and
    NaN payloads included: a rebuilt row must be the very value)."""
    if old.dtype in _BITS:
        old, new = old.view(_BITS[old.dtype]), new.view(_BITS[new.dtype])
    return (old != new).reshape(old.shape[0], -1).any(1)


@dataclass
class _RowDelta:
    """What turns one asset into the next: per changed tensor its changed rows, with their
    old and new values (both: the session steps either way, undo and redo)."""

    rows: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]

    @classmethod
    def between(cls, prev: Any, cur: Any) -> _RowDelta | None:
        """The delta from asset prev to cur; None when it is no smaller than cur's changed
        tensors (a recolour changes every row) or shapes differ (a delete)."""
        a, b = prev.tensors(), cur.tensors()
        if a.keys() != b.keys():
            return None
        out, stored, whole = {}, 0, 0
        for name, new in b.items():
            old = a[name]
            if old is new:
                continue
            if old.shape != new.shape or old.dtype != new.dtype or old.device != new.device:
                return None
            idx = _changed_row_mask(old, new).nonzero().squeeze(1)
            if idx.numel():
                out[name] = (idx, old[idx].clone(), new[idx].clone())
                stored += 2 * out[name][1].numel() * new.element_size() + 8 * idx.numel()
            whole += new.numel() * new.element_size()
        return cls(out) if 2 * stored <= whole else None

    def apply(self, asset: Any, forward: bool) -> Any:
        """The next asset from the previous one (forward) or the previous from the next."""
        if not self.rows:
            return asset.replace()
        changes = {}
        for name, (idx, old, new) in self.rows.items():
            t = getattr(asset, name).clone()
            t[idx] = new if forward else old
            changes[name] = t
        return asset.replace(**changes)

    def count(self) -> int:
        """Gaussians whose values changed (as `asset_delta` counts them: by value, so a
        -0.0 that became 0.0 is no change there)."""
        moved = [
            idx[(old != new).reshape(idx.numel(), -1).any(1)]
            for idx, old, new in self.rows.values()
        ]
        return int(torch.unique(torch.cat(moved)).numel()) if moved else 0


class HistoryEntry:
    """One state of the session: the asset after an edit, the method state, and the edit.

    Memory at capture scale: the session keeps its first and its current entry's assets;
    every other entry keeps only the rows that changed from the entry before it (`_RowDelta`),
    not a whole asset (a 500-Gaussian stroke on a 1M asset: kilobytes, not the ~48 MB of its
    SH).  `asset` rebuilds it when asked; while anyone holds a rebuilt (or the original) asset
    the entry returns that very object (a weak reference), so `entry.asset is x` still works.
    An entry whose change is not worth a delta (a recolour, a delete) keeps its asset."""

    def __init__(
        self,
        asset: Any,
        state: Any,
        views: list[EditView] | None = None,
        label: str = "",
        seconds: float = 0.0,
        method: str = "",  # the method that made this entry ("" for load/reset entries)
    ) -> None:
        self.state = state
        self.views = [] if views is None else views
        self.label = label
        self.seconds = seconds
        self.method = method
        self._asset: Any = asset  # None while kept as a delta
        self._ref = weakref.ref(asset)
        self._prev: HistoryEntry | None = None  # the entry the delta starts from
        self._delta: _RowDelta | None = None
        self._tried = False  # the delta was computed (None: not worth one)
        self._next: weakref.WeakSet[HistoryEntry] = weakref.WeakSet()  # entries that follow

    def __repr__(self) -> str:
        kept = "asset" if self._asset is not None else "delta"
        return f"HistoryEntry(label={self.label!r}, method={self.method!r}, {kept})"

    @property
    def asset(self) -> Any:
        """The entry's asset (rebuilt from the nearest held entry before it if need be)."""
        a = self._held()
        if a is not None:
            return a
        chain, e = [], self
        while a is None:  # back to an entry someone holds
            if e._prev is None or e._delta is None:
                raise RuntimeError("history entry lost its asset")  # (never: see _release)
            chain.append(e)
            e = e._prev
            a = e._held()
        for e in reversed(chain):
            a = e._delta.apply(a, forward=True)
            e._ref = weakref.ref(a)
        return a

    @asset.setter
    def asset(self, value: Any) -> None:
        for nxt in list(self._next):  # their deltas start from the asset replaced here
            if nxt._prev is self:
                nxt._hold()
                nxt._delta, nxt._tried = None, False
        self._asset = value
        self._ref = weakref.ref(value)
        self._delta, self._tried = None, False  # recomputed when the entry is released

    def _held(self) -> Any:
        """The asset if someone holds it (no rebuild), else None."""
        return self._asset if self._asset is not None else self._ref()

    def holds(self, asset: Any) -> bool:
        """Whether `asset` is this entry's very asset object (no rebuild: cheap at 1M)."""
        return self._held() is asset

    def _link(self, prev: HistoryEntry | None) -> None:
        """Follow `prev` (whose asset is at hand): the delta from it, for later release."""
        self._prev = prev
        self._delta = None if prev is None else _RowDelta.between(prev.asset, self.asset)
        self._tried = prev is not None
        if prev is not None:
            prev._next.add(self)

    def _hold(self) -> None:
        """Keep the asset (the session's current and first entries)."""
        if self._asset is None:
            self._asset = self.asset

    def _release(self) -> None:
        """Keep only the delta, where there is one."""
        if self._asset is None or self._prev is None:
            return
        if not self._tried:  # the asset was replaced after the edit
            self._delta = _RowDelta.between(self._prev.asset, self._asset)
            self._tried = True
        if self._delta is not None:
            self._ref = weakref.ref(self._asset)
            self._asset = None


# ---------------------------------------------------------------------- deltas (pure helpers)
def _asset_to_dict(asset) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in asset.tensors().items()}


def _asset_from_dict(d: dict[str, Any], device="cpu"):
    from splatpainter.assets import GaussianAsset

    return GaussianAsset(**{k: v.to(device) for k, v in d.items()})


def asset_delta(prev: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What turns tensor dict `prev` into `new`: per changed tensor, its changed rows (only their
    changed columns when that is fewer), or the whole tensor when its shape changed."""
    out: dict[str, Any] = {}
    for name in prev.keys() - new.keys():
        out[name] = {"removed": True}
    for name, t in new.items():
        old = prev.get(name)
        if old is t:
            continue
        if old is None or old.shape != t.shape or old.dtype != t.dtype:
            out[name] = {"full": t}
            continue
        rows = (old != t).reshape(t.shape[0], -1).any(dim=1) if t.dim() else (old != t)
        if t.dim() == 0:
            if bool(rows):
                out[name] = {"full": t}
            continue
        idx = torch.nonzero(rows).flatten()
        if idx.numel():
            # Only the changed columns of those rows (an edit of SH DC leaves the other bands).
            flat_new = t[idx].reshape(idx.numel(), -1)
            cols = (old[idx].reshape(idx.numel(), -1) != flat_new).any(dim=0)
            if bool(cols.all()):
                out[name] = {"rows": idx, "values": t[idx].clone()}
            else:
                out[name] = {"rows": idx, "cols": cols, "values": flat_new[:, cols].clone()}
    return out


def apply_asset_delta(prev: dict[str, torch.Tensor], delta: dict[str, Any]) -> dict[str, Any]:
    """Inverse of `asset_delta`: unchanged tensors are shared with `prev`, not copied."""
    out = dict(prev)
    for name, d in delta.items():
        if d.get("removed"):
            out.pop(name, None)
        elif "full" in d:
            out[name] = d["full"]
        else:
            t = prev[name].clone()
            if "cols" in d:
                block = t[d["rows"]].reshape(d["rows"].numel(), -1)
                block[:, d["cols"]] = d["values"].to(t.dtype)
                t[d["rows"]] = block.reshape(t[d["rows"]].shape)
            else:
                t[d["rows"]] = d["values"].to(t.dtype)
            out[name] = t
    return out


def _changed_rows(delta: dict[str, Any], n: int) -> int:
    """Gaussians touched by a delta (every one if some tensor was replaced whole)."""
    rows = None
    for d in delta.values():
        if "rows" not in d:
            return n
        rows = d["rows"] if rows is None else torch.cat([rows, d["rows"]])
    return 0 if rows is None else int(torch.unique(rows).numel())


def _dedupe(cur: Any, prev: Any) -> Any:
    """`cur` with every tensor equal to its counterpart in `prev` replaced by a marker."""
    if isinstance(cur, torch.Tensor):
        same = (
            isinstance(prev, torch.Tensor)
            and prev.shape == cur.shape
            and prev.dtype == cur.dtype
            and torch.equal(prev, cur)
        )
        return {_SAME: True} if same else cur
    if isinstance(cur, dict):
        p = prev if isinstance(prev, dict) else {}
        return {k: _dedupe(v, p.get(k)) for k, v in cur.items()}
    if isinstance(cur, (list, tuple)):
        p = prev if isinstance(prev, (list, tuple)) else ()
        items = [_dedupe(v, p[i] if i < len(p) else None) for i, v in enumerate(cur)]
        return type(cur)(items)
    return cur


def _restore(stored: Any, prev: Any) -> Any:
    """Inverse of `_dedupe`."""
    if isinstance(stored, dict):
        if stored.get(_SAME) is True and len(stored) == 1:
            if not isinstance(prev, torch.Tensor):
                raise SessionError("state refers to a missing previous value")
            return prev
        p = prev if isinstance(prev, dict) else {}
        return {k: _restore(v, p.get(k)) for k, v in stored.items()}
    if isinstance(stored, (list, tuple)):
        p = prev if isinstance(prev, (list, tuple)) else ()
        return type(stored)(_restore(v, p[i] if i < len(p) else None) for i, v in enumerate(stored))
    return stored


def _pack_image(t: torch.Tensor | None) -> Any:
    """An [0, 1] float image as uint8 when that is lossless (browser and PNG edits are)."""
    if t is None or not t.is_floating_point():
        return t
    q = (t.float() * 255.0).round().clamp(0, 255).to(torch.uint8)
    if t.dtype == torch.float32 and torch.equal(q.float() / 255.0, t):
        return {"u8": q}
    return t


def _unpack_image(v: Any) -> Any:
    if isinstance(v, dict) and "u8" in v:
        return v["u8"].float() / 255.0
    return v


def _pack_view(view: EditView) -> dict[str, Any]:
    d = view.to_dict()
    return {**d, "image": _pack_image(d["image"]), "mask": _pack_image(d["mask"])}


def _once(cache: dict[int, Any], obj: Any, make: Callable[[Any], Any]) -> Any:
    """make(obj) once per object (by identity, while the caller keeps obj and cache alive):
    a record shared by many entries stays one object in memory and one record on disk."""
    if id(obj) not in cache:
        cache[id(obj)] = make(obj)
    return cache[id(obj)]


def _pack_view_dict(d: dict[str, Any]) -> dict[str, Any]:
    return _pack_view(EditView.from_dict(d))


def _unpack_view(d: dict[str, Any]) -> EditView:
    return EditView.from_dict(
        {**d, "image": _unpack_image(d["image"]), "mask": _unpack_image(d.get("mask"))}
    )


# ---------------------------------------------------------------------- read limits
def _zip_record_count(f: Any, size: int) -> int | None:
    """The record count a zip's end-of-central-directory claims (zip64 too), read before
    zipfile parses the directory (None: no such record; zipfile then names the damage)."""
    tail_len = min(size, 22 + 0xFFFF)  # the record, then a comment of at most 64 KiB
    f.seek(size - tail_len)
    tail = f.read(tail_len)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + 22 > len(tail):
        return None
    count = struct.unpack_from("<H", tail, at + 10)[0]
    if at >= 20 and tail[at - 20 : at - 16] == b"PK\x06\x07":  # zipfile reads zip64's too
        (offset,) = struct.unpack_from("<Q", tail, at - 12)
        if offset + 56 <= size:
            f.seek(offset)
            rec = f.read(56)
            if rec[:4] == b"PK\x06\x06":
                count = max(count, struct.unpack_from("<Q", rec, 32)[0])
    return count


def _check_archive(path: str | os.PathLike[str]) -> None:
    """Refuse a session file whose size or zip directory claims more than it can hold, before
    torch reads it: torch allocates each record at the size the directory claims, and inflates
    compressed records (~1000x), although torch.save only ever writes them stored."""
    p = os.fspath(path)
    try:  # FIFOs, devices, foreign files: one line, before anything opens them
        check_regular_file(p, max_bytes=MAX_SESSION_BYTES, what="session file")
    except InputFileError as e:
        raise SessionError(str(e)) from None
    size = os.path.getsize(p)
    with open(p, "rb") as f:
        head = f.read(4)
        if head.startswith(b"\x80"):
            raise SessionError(
                f"{p}: not a readable session file (a legacy torch pickle, whose tensor sizes "
                "are allocated before they can be checked; sessions are zip archives)"
            )
        if not head.startswith(b"PK\x03\x04"):
            return  # load_torch names what it is instead
        count = _zip_record_count(f, size)
    if count is not None and count > MAX_SESSION_RECORDS:
        raise SessionError(
            f"{p}: {count:,} records is over the {MAX_SESSION_RECORDS:,}-record limit for a "
            "session file"
        )
    try:
        with zipfile.ZipFile(p) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise SessionError(f"{p}: not a readable session file ({first_line(e)})") from None
    if len(infos) > MAX_SESSION_RECORDS:  # a directory holding more than its end record says
        raise SessionError(
            f"{p}: {len(infos):,} records is over the {MAX_SESSION_RECORDS:,}-record limit for "
            "a session file"
        )
    total = 0
    for i in infos:
        if i.compress_type != zipfile.ZIP_STORED or i.file_size != i.compress_size:
            raise SessionError(
                f"{p}: damaged session file (record {i.filename!r} is compressed, "
                f"{i.compress_size:,} bytes claiming {i.file_size:,}; torch.save stores records)"
            )
        total += i.file_size
        if i.header_offset + i.file_size > size or total > size:
            raise SessionError(
                f"{p}: damaged session file (record {i.filename!r} claims {i.file_size:,} "
                f"bytes, more than the {size:,}-byte file holds)"
            )


def _nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _rebuild_bytes(d: dict[str, Any]) -> int:
    """What rebuilding every entry allocates beyond the file's own tensors: a copy of each
    tensor a row delta touches (deltas apply entry after entry), and each distinct stored
    view's 8-bit images as float32. A record shared by many entries is unpacked once, but its
    row delta is applied once per entry, so it counts once per entry."""
    nbytes = {k: _nbytes(v) for k, v in d["base"].items()}
    total, seen = 0, set()
    for e in d["entries"]:
        for name, dd in e["delta"].items():
            if not isinstance(dd, dict):
                continue  # damaged: the rebuild names it
            if "full" in dd:
                nbytes[name] = _nbytes(dd["full"])
            elif "rows" in dd:
                total += nbytes.get(name, 0)
        for v in e.get("views", []):
            if id(v) not in seen:
                seen.add(id(v))
                for x in (v.get("image"), v.get("mask")):
                    total += 4 * _nbytes(x["u8"]) if isinstance(x, dict) and "u8" in x else 0
    return total


# ---------------------------------------------------------------------- the file, method-free
class StoredSession:
    """A session file as plain data (version 2 layout in memory, whatever was on disk).

    Needs no method: `show`, `undo`/`redo` (moving the pointer) and `export` work on any session
    file, so the CLI can inspect and rewind sessions without loading the editor model.
    """

    def __init__(self, data: dict[str, Any], path: str | os.PathLike[str] | None = None) -> None:
        self.data = data
        self.path = path

    @classmethod
    def read(cls, path: str | os.PathLike[str]) -> StoredSession:
        if not os.path.exists(path):
            raise SessionError(f"{path}: no such file")
        _check_archive(path)
        try:
            d = load_torch(path, what="session file")
        except InputFileError as e:
            raise SessionError(str(e)) from None
        if not isinstance(d, dict) or d.get("format") != SESSION_FORMAT:
            raise SessionError(f"{path}: not a {SESSION_FORMAT} file")
        version = d.get("version")
        if not isinstance(version, int) or version < 1:
            raise SessionError(f"{path}: bad session version {version!r}")
        if version > SESSION_VERSION:
            raise SessionError(f"{path}: session version {version} is too new")
        entries = d.get("entries")
        if isinstance(entries, list) and len(entries) > MAX_SESSION_ENTRIES:
            raise SessionError(
                f"{path}: {len(entries):,} history entries is over the "
                f"{MAX_SESSION_ENTRIES:,}-entry limit for a session"
            )
        try:
            if version == 1:
                d = _upgrade_v1(d)
            entries, index = d["entries"], d["index"]
            if not isinstance(entries, list) or not entries or not isinstance(d["base"], dict):
                raise SessionError("no entries")
            if not isinstance(index, int) or not 0 <= index < len(entries):
                raise SessionError(f"index {index!r} out of range")
            if not isinstance(d["method"], dict):
                raise SessionError("no method description")
            rebuild = _rebuild_bytes(d)
        except (KeyError, TypeError, AttributeError, SessionError) as e:
            raise SessionError(f"{path}: damaged session file ({first_line(e)})") from None
        if rebuild > MAX_SESSION_REBUILD_BYTES:
            raise SessionError(
                f"{path}: rebuilding its {len(d['entries']):,} entries would allocate "
                f"{rebuild:,} bytes, over the {MAX_SESSION_REBUILD_BYTES:,}-byte limit for a "
                "session"
            )
        return cls(d, path)

    @property
    def index(self) -> int:
        return int(self.data["index"])

    @property
    def num_entries(self) -> int:
        return len(self.data["entries"])

    @property
    def method(self) -> dict[str, Any]:
        return self.data["method"]

    @property
    def extras(self) -> dict[str, np.ndarray]:
        """The source .ply's extra vertex columns the session carries (empty: none)."""
        raw = self.data.get("extras", {})
        n = int(self.data["base"]["means"].shape[0])
        if not isinstance(raw, dict) or not all(isinstance(v, torch.Tensor) for v in raw.values()):
            raise SessionError(f"{self.path or 'session'}: damaged session file (extras)")
        arrays = {str(k): v.numpy() for k, v in raw.items()}
        try:
            return _check_extras(arrays, n, "extras")
        except SessionError as e:
            raise SessionError(f"{self.path or 'session'}: damaged session file ({e})") from None

    def asset_dicts(self) -> list[dict[str, torch.Tensor]]:
        """Every entry's asset tensors, rebuilt from the deltas (shared where unchanged)."""
        try:
            cur = dict(self.data["base"])
            out = []
            for e in self.data["entries"]:
                cur = apply_asset_delta(cur, e["delta"])
                out.append(cur)
            return out
        except (KeyError, TypeError, IndexError, RuntimeError, AttributeError) as e:
            raise SessionError(
                f"{self.path or 'session'}: damaged session file ({first_line(e)})"
            ) from None

    def asset_at(self, index: int | None = None):
        """The asset of entry `index` (default: the current one), validated."""
        i = self.index if index is None else index
        if not 0 <= i < self.num_entries:
            raise SessionError(f"no entry {i}; the session has {self.num_entries}")
        return _asset_from_dict(self.asset_dicts()[i]).validate()

    def summary(self) -> dict[str, Any]:
        """Plain-data description of the history (what `session show --json` prints)."""
        dicts = self.asset_dicts()
        n = int(dicts[0]["means"].shape[0])
        entries = []
        for i, e in enumerate(self.data["entries"]):
            entries.append(
                {
                    "index": i,
                    "label": str(e.get("label", "")),
                    "method": str(e.get("method", "")),
                    "views": len(e.get("views", [])),
                    "seconds": float(e.get("seconds", 0.0)),
                    "changed_gaussians": _changed_rows(e["delta"], n) if i else 0,
                    "current": i == self.index,
                    "undone": i > self.index,
                }
            )
        return {
            "method": self.method.get("name"),
            "version": SESSION_VERSION,
            "num_gaussians": int(dicts[self.index]["means"].shape[0]),
            "index": self.index,
            "can_undo": self.index > 0,
            "can_redo": self.index < self.num_entries - 1,
            "entries": entries,
        }

    def move(self, step: int) -> int:
        """Move the pointer by `step` (-1 undo, +1 redo); returns the new index."""
        i = self.index + step
        if i < 0:
            raise SessionError("nothing to undo")
        if i >= self.num_entries:
            raise SessionError("nothing to redo")
        self.data["index"] = i
        return i

    def write(self, path: str | os.PathLike[str] | None = None) -> None:
        from splatpainter.model.editor import atomic_torch_save

        target = path or self.path
        if target is None:
            raise SessionError("no path to write the session to")
        atomic_torch_save(self.data, target)


def _check_extras(extras: dict[str, Any], n: int, what: str) -> dict[str, np.ndarray]:
    """extras as 1-D numpy columns of length n (SessionError naming the first that is not)."""
    out = {}
    for k, v in extras.items():
        arr = np.asarray(v)
        if arr.shape != (n,):
            raise SessionError(f"{what} column {k!r}: shape {list(arr.shape)}, expected [{n}]")
        out[k] = arr
    return out


def ply_extras(path: str | os.PathLike[str], extras: dict[str, np.ndarray]) -> dict[str, Any]:
    """save_asset's keyword for carrying `extras` into `path`: only a .ply has room for them."""
    return {"extras": extras} if extras and str(path).lower().endswith(".ply") else {}


def _upgrade_v1(d: dict[str, Any]) -> dict[str, Any]:
    """Full snapshots per entry -> base + per-step deltas."""
    entries, prev, out = d["entries"], None, []
    packed: dict[int, dict[str, Any]] = {}  # a view shared by entries stays one record
    for e in entries:
        asset = e["asset"]
        delta = asset_delta(prev, asset) if prev is not None else {}
        views = [_once(packed, v, _pack_view_dict) for v in e.get("views", [])]
        out.append({**{k: v for k, v in e.items() if k != "asset"}, "delta": delta, "views": views})
        prev = asset
    return {**d, "version": SESSION_VERSION, "base": entries[0]["asset"], "entries": out}


# ---------------------------------------------------------------------- the live session
class EditSession:
    """`EditSession(asset, method)`; `apply(views)` -> the updated asset."""

    def __init__(self, asset, method: EditMethod, extras: dict[str, Any] | None = None) -> None:
        """extras: the source .ply's other vertex columns (normals, ...), one value per
        Gaussian; edits keep the Gaussians and their order, so these are written back as read."""
        asset.validate()
        self.method = method
        self.extras = _check_extras(extras or {}, asset.num_gaussians, "extras")
        self._entries = [HistoryEntry(asset, method.initial_state(asset), [], "load")]
        self._index = 0

    def _settle(self) -> None:
        """Hold the first and the current entry's assets; the others keep deltas (memory at
        capture scale: see HistoryEntry).  A step of undo or redo rebuilds the new current
        asset from its neighbour, which was current a moment ago."""
        cur = self._entries[self._index]
        if cur._asset is None:
            nxt = self._entries[self._index + 1] if self._index + 1 < len(self._entries) else None
            held = None if nxt is None else nxt._held()
            if held is not None and nxt._prev is cur and nxt._delta is not None:
                cur._asset = nxt._delta.apply(held, forward=False)  # one step back
                cur._ref = weakref.ref(cur._asset)
            else:
                cur._hold()
        self._entries[0]._hold()
        for i, e in enumerate(self._entries):
            if i and i != self._index:
                e._release()

    # ------------------------------------------------------------------ properties
    @property
    def asset(self):
        return self._entries[self._index].asset

    @property
    def state(self) -> Any:
        return self._entries[self._index].state

    @property
    def history(self) -> list[HistoryEntry]:
        """Entries up to and including the current one (redo entries excluded)."""
        return self._entries[: self._index + 1]

    @property
    def entries(self) -> list[HistoryEntry]:
        """Every entry, redo branch included (`index` says which is current)."""
        return list(self._entries)

    @property
    def index(self) -> int:
        return self._index

    @property
    def can_undo(self) -> bool:
        return self._index > 0

    @property
    def can_redo(self) -> bool:
        return self._index < len(self._entries) - 1

    # ------------------------------------------------------------------ editing
    def _push(self, entry: HistoryEntry) -> None:
        entry._link(self._entries[self._index])
        self._entries = [*self._entries[: self._index + 1], entry]
        self._index += 1
        self._settle()

    def record(self, asset, label: str = "", method: str = "direct") -> None:
        """Add an asset made outside the edit methods (a selection's delete or exact colour
        adjustment) to the history; the method state carries over."""
        self._push(HistoryEntry(asset, self.state, [], label, 0.0, method))

    def mark(self) -> tuple[list[HistoryEntry], int]:
        """The history as it is now, for `rollback` (the list is replaced, never changed in
        place, so the mark stays valid)."""
        return self._entries, self._index

    def rollback(self, mark: tuple[list[HistoryEntry], int]) -> None:
        """Back to a `mark`: an edit dropped after the fact (cancelled, failed, or a no-op)."""
        self._entries, self._index = mark
        self._settle()

    def apply(
        self,
        views: EditView | list[EditView],
        label: str = "",
        *,
        method: EditMethod | None = None,
    ):
        """Apply one edit (one or several views at once); returns the new asset.

        `method` applies this one edit with another method (e.g. a baseline in a model
        session); the session's own method state is then carried over unchanged.
        """
        views = [views] if isinstance(views, EditView) else list(views)
        if not views:
            raise EditInputError("an edit needs at least one view")
        for v in views:
            v.validate()
        t0 = time.perf_counter()
        if method is None or method is self.method:
            new_asset, new_state = self.method.apply(self.asset, views, self.state)
            name = self.method.name
        else:
            new_asset, _ = method.apply(self.asset, views, method.initial_state(self.asset))
            new_state, name = self.state, method.name
        self._push(HistoryEntry(new_asset, new_state, views, label, time.perf_counter() - t0, name))
        return new_asset

    def undo(self):
        if not self.can_undo:
            raise SessionError("nothing to undo")
        self._index -= 1
        self._settle()
        return self.asset

    def redo(self):
        if not self.can_redo:
            raise SessionError("nothing to redo")
        self._index += 1
        self._settle()
        return self.asset

    def goto(self, index: int):
        """Make entry `index` (0 = as loaded; redo entries count) the current one."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise SessionError(f"history index must be an int, got {index!r}")
        if not 0 <= index < len(self._entries):
            raise SessionError(f"no history entry {index}; there are {len(self._entries)}")
        self._index = index
        self._settle()
        return self.asset

    def changed_gaussians(self, index: int) -> int:
        """How many Gaussians entry `index` changed relative to the entry before it."""
        if index == 0:
            return 0
        entry = self._entries[index]
        if entry._delta is not None and entry._prev is self._entries[index - 1]:
            return entry._delta.count()
        prev, cur = self._entries[index - 1].asset, entry.asset
        if prev is cur:
            return 0
        delta = asset_delta(_asset_to_dict(prev), _asset_to_dict(cur))
        return _changed_rows(delta, cur.num_gaussians)

    def reset(self):
        """Back to the asset (and method state) as loaded; undoable like an edit."""
        first = self._entries[0]
        self._push(HistoryEntry(first.asset, first.state, [], "reset"))
        return self.asset

    def reset_state(self) -> None:
        """Forget what earlier edits taught the method (the asset stays); undoable like an edit."""
        state = self.method.reset_state(self.asset, self.state)
        self._push(HistoryEntry(self.asset, state, [], "reset_state"))

    def render(self, camera) -> torch.Tensor:
        """The current asset from `camera` [H, W, 3] on the method's background (to paint on)."""
        from splatpainter.render import render

        with torch.no_grad():
            return render(self.asset, camera, background=self.method.background).rgb

    def export(self, path: str | os.PathLike[str], notes: list[str] | None = None) -> None:
        """Write the current asset (.ply, .splat or .spz, atomically); notes: where the .spz
        quantisation says what it clipped."""
        from splatpainter.io import save_asset

        kwargs = ply_extras(path, self.extras)
        if str(path).lower().endswith(".spz") and notes is not None:
            kwargs["notes"] = notes
        save_asset(self.asset.detach().to("cpu"), path, **kwargs)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        m = self.method
        entries = []
        prev_asset: dict[str, torch.Tensor] | None = None
        prev_state: Any = None
        # One packed record per view object: entries that share a view (a loaded file's shared
        # record) keep sharing it, so a save never outgrows what the session really holds.
        packed: dict[int, dict[str, Any]] = {}
        held = None  # the asset before: the next entry's delta rebuilds from it
        for e in self._entries:
            held = e.asset
            asset = _asset_to_dict(held)
            state = m.state_to_dict(e.state)
            entries.append(
                {
                    "delta": {} if prev_asset is None else asset_delta(prev_asset, asset),
                    "state": _dedupe(state, prev_state),
                    "views": [_once(packed, v, _pack_view) for v in e.views],
                    "label": e.label,
                    "seconds": float(e.seconds),
                    "method": e.method,
                }
            )
            prev_asset, prev_state = asset, state
        out = {
            "format": SESSION_FORMAT,
            "version": SESSION_VERSION,
            "method": m.describe(),
            "index": self._index,
            "base": _asset_to_dict(self._entries[0].asset),
            "entries": entries,
        }
        if self.extras:  # (an optional key: older readers ignore it)
            out["extras"] = {
                k: torch.from_numpy(np.ascontiguousarray(v, v.dtype.newbyteorder("=")))
                for k, v in self.extras.items()
            }
        return out

    def save(self, path: str | os.PathLike[str]) -> None:
        from splatpainter.model.editor import atomic_torch_save

        atomic_torch_save(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], method: EditMethod, device="cpu") -> EditSession:
        """Continue a saved session with `method` (which must match the one it was saved with)."""
        stored = StoredSession.read(path)
        saved, ours = stored.method, method.describe()
        if saved != ours:
            keys = sorted(k for k in set(saved) | set(ours) if saved.get(k) != ours.get(k))
            raise SessionError(
                f"{path}: session was made with method {saved.get('name')!r} and different "
                f"settings ({', '.join(keys)}); pass the same method/weights"
            )
        self = cls.__new__(cls)
        self.method = method
        self.extras = stored.extras
        self._entries = []
        prev_state: Any = None
        views: dict[int, EditView] = {}  # a stored record shared by entries: one view object
        try:
            for e, asset in zip(stored.data["entries"], stored.asset_dicts(), strict=True):
                state_dict = _restore(e["state"], prev_state)
                prev_state = state_dict
                self._entries.append(
                    HistoryEntry(
                        _asset_from_dict(asset, device),
                        method.state_from_dict(state_dict, device),
                        [_once(views, v, _unpack_view) for v in e.get("views", [])],
                        str(e.get("label", "")),
                        float(e.get("seconds", 0.0)),
                        str(e.get("method", "")),
                    )
                )
        except (KeyError, TypeError, IndexError, RuntimeError, ValueError) as e:
            raise SessionError(f"{path}: damaged session file ({first_line(e)})") from None
        for prev, e in zip(self._entries, self._entries[1:], strict=False):
            e._link(prev)
        self._index = stored.index
        self._settle()
        return self
