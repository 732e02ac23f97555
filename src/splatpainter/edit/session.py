"""A stateful editing session: apply edits, undo/redo, reset the state, export, save/load.

History is a list of snapshots (asset, method state, the edit that produced it); `index` points at
the current one.  Applying an edit drops any redo branch.  Undo/redo move the pointer, so they
restore the asset *and* the state bit-exactly.  A session file (torch.save of plain tensors and
dicts, written atomically) holds the whole history, so a user can continue tomorrow; loading it
checks that the method (and, for the model, its config and weights) is the one it was made with.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from splatpainter.edit.methods import EditMethod
from splatpainter.edit.views import EditInputError, EditView

SESSION_FORMAT = "splatpainter-session"
SESSION_VERSION = 1


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


def _asset_to_dict(asset) -> dict[str, Any]:
    return {k: v.detach().cpu() for k, v in asset.tensors().items()}


def _asset_from_dict(d: dict[str, Any], device):
    from splatpainter.assets import GaussianAsset

    return GaussianAsset(**{k: v.to(device) for k, v in d.items()})


class EditSession:
    """`EditSession(asset, method)`; `apply(views)` -> the updated asset."""

    def __init__(self, asset, method: EditMethod) -> None:
        asset.validate()
        self.method = method
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
    def can_undo(self) -> bool:
        return self._index > 0

    @property
    def can_redo(self) -> bool:
        return self._index < len(self._entries) - 1

    # ------------------------------------------------------------------ editing
    def apply(self, views: EditView | list[EditView], label: str = ""):
        """Apply one edit (one or several views at once); returns the new asset."""
        views = [views] if isinstance(views, EditView) else list(views)
        if not views:
            raise EditInputError("an edit needs at least one view")
        for v in views:
            v.validate()
        t0 = time.perf_counter()
        new_asset, new_state = self.method.apply(self.asset, views, self.state)
        entry = HistoryEntry(new_asset, new_state, views, label, time.perf_counter() - t0)
        self._entries = [*self._entries[: self._index + 1], entry]
        self._index += 1
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

    def reset_state(self) -> None:
        """Forget what earlier edits taught the method (the asset stays); undoable like an edit."""
        state = self.method.reset_state(self.asset, self.state)
        entry = HistoryEntry(self.asset, state, [], "reset_state")
        self._entries = [*self._entries[: self._index + 1], entry]
        self._index += 1

    def render(self, camera) -> torch.Tensor:
        """The current asset from `camera` [H, W, 3] on the method's background (to paint on)."""
        from splatpainter.render import render

        with torch.no_grad():
            return render(self.asset, camera, background=self.method.background).rgb

    def export(self, path: str | os.PathLike[str]) -> None:
        """Write the current asset (.ply or .splat, atomically)."""
        from splatpainter.io import save_asset

        save_asset(self.asset.detach().to("cpu"), path)

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        m = self.method
        return {
            "format": SESSION_FORMAT,
            "version": SESSION_VERSION,
            "method": m.describe(),
            "index": self._index,
            "entries": [
                {
                    "asset": _asset_to_dict(e.asset),
                    "state": m.state_to_dict(e.state),
                    "views": [v.to_dict() for v in e.views],
                    "label": e.label,
                    "seconds": float(e.seconds),
                }
                for e in self._entries
            ],
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        from splatpainter.model.editor import atomic_torch_save

        atomic_torch_save(self.to_dict(), path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], method: EditMethod, device="cpu") -> EditSession:
        """Continue a saved session with `method` (which must match the one it was saved with)."""
        try:
            d = torch.load(path, map_location="cpu", weights_only=True)
        except FileNotFoundError:
            raise SessionError(f"{path}: no such file") from None
        except Exception as e:
            raise SessionError(f"{path}: not a readable session file ({e})") from None
        if not isinstance(d, dict) or d.get("format") != SESSION_FORMAT:
            raise SessionError(f"{path}: not a {SESSION_FORMAT} file")
        if int(d.get("version", -1)) > SESSION_VERSION:
            raise SessionError(f"{path}: session version {d.get('version')} is too new")
        saved, ours = d["method"], method.describe()
        if saved != ours:
            keys = sorted(k for k in set(saved) | set(ours) if saved.get(k) != ours.get(k))
            raise SessionError(
                f"{path}: session was made with method {saved.get('name')!r} and different "
                f"settings ({', '.join(keys)}); pass the same method/weights"
            )
        self = cls.__new__(cls)
        self.method = method
        self._entries = [
            HistoryEntry(
                _asset_from_dict(e["asset"], device),
                method.state_from_dict(e["state"], device),
                [EditView.from_dict(v) for v in e["views"]],
                e.get("label", ""),
                float(e.get("seconds", 0.0)),
            )
            for e in d["entries"]
        ]
        self._index = int(d["index"])
        return self
