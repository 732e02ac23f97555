"""Editing: sessions (apply/undo/redo/export/save), the model method and the baselines."""

from splatpainter.edit.baselines import BackprojectMethod, OptimizeMethod
from splatpainter.edit.methods import EditMethod, ModelMethod
from splatpainter.edit.session import EditSession, HistoryEntry, SessionError
from splatpainter.edit.views import MASK_THRESHOLD, EditInputError, EditView, default_mask

__all__ = [
    "MASK_THRESHOLD",
    "BackprojectMethod",
    "EditInputError",
    "EditMethod",
    "EditSession",
    "EditView",
    "HistoryEntry",
    "ModelMethod",
    "OptimizeMethod",
    "SessionError",
    "default_mask",
]
