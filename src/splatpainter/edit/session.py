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
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from appshell.errors import first_line
from appshell.inputs import InputFileError, load_torch
from splatpainter.edit.methods import EditMethod
from splatpainter.edit.views import EditInputError, EditView

SESSION_FORMAT = "splatpainter-session"
SESSION_VERSION = 2  # 1: a full asset snapshot per entry (still read)
_SAME = "__same_as_previous_entry__"


class SessionError(ValueError):
    """A session file that cannot be used with this method, or an impossible undo/redo."""


@dataclass
class HistoryEntry:
    """One state of the session: the asset after an edit, the method state, and the edit."""

    asset: Any
    state: Any
    views: list[EditView] = field(default_factory=list)
    label: str = ""
    seconds: float = 0.0
    method: str = ""  # the method that made this entry ("" for load/reset entries)


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


def _unpack_view(d: dict[str, Any]) -> EditView:
    return EditView.from_dict(
        {**d, "image": _unpack_image(d["image"]), "mask": _unpack_image(d.get("mask"))}
    )


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
        try:  # FIFOs, devices, foreign files: one line, before torch's unpickler
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
        except (KeyError, TypeError, SessionError) as e:
            raise SessionError(f"{path}: damaged session file ({first_line(e)})") from None
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
    for e in entries:
        asset = e["asset"]
        delta = asset_delta(prev, asset) if prev is not None else {}
        views = [_pack_view(EditView.from_dict(v)) for v in e.get("views", [])]
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
        self._entries = [*self._entries[: self._index + 1], entry]
        self._index += 1

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
        return self.asset

    def redo(self):
        if not self.can_redo:
            raise SessionError("nothing to redo")
        self._index += 1
        return self.asset

    def goto(self, index: int):
        """Make entry `index` (0 = as loaded; redo entries count) the current one."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise SessionError(f"history index must be an int, got {index!r}")
        if not 0 <= index < len(self._entries):
            raise SessionError(f"no history entry {index}; there are {len(self._entries)}")
        self._index = index
        return self.asset

    def changed_gaussians(self, index: int) -> int:
        """How many Gaussians entry `index` changed relative to the entry before it."""
        if index == 0:
            return 0
        prev, cur = self._entries[index - 1].asset, self._entries[index].asset
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

    def export(self, path: str | os.PathLike[str]) -> None:
        """Write the current asset (.ply or .splat, atomically)."""
        from splatpainter.io import save_asset

        save_asset(self.asset.detach().to("cpu"), path, **ply_extras(path, self.extras))

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        m = self.method
        entries = []
        prev_asset: dict[str, torch.Tensor] | None = None
        prev_state: Any = None
        for e in self._entries:
            asset = _asset_to_dict(e.asset)
            state = m.state_to_dict(e.state)
            entries.append(
                {
                    "delta": {} if prev_asset is None else asset_delta(prev_asset, asset),
                    "state": _dedupe(state, prev_state),
                    "views": [_pack_view(v) for v in e.views],
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
        try:
            for e, asset in zip(stored.data["entries"], stored.asset_dicts(), strict=True):
                state_dict = _restore(e["state"], prev_state)
                prev_state = state_dict
                self._entries.append(
                    HistoryEntry(
                        _asset_from_dict(asset, device),
                        method.state_from_dict(state_dict, device),
                        [_unpack_view(v) for v in e.get("views", [])],
                        str(e.get("label", "")),
                        float(e.get("seconds", 0.0)),
                        str(e.get("method", "")),
                    )
                )
        except (KeyError, TypeError, IndexError, RuntimeError, ValueError) as e:
            raise SessionError(f"{path}: damaged session file ({first_line(e)})") from None
        self._index = stored.index
        return self
