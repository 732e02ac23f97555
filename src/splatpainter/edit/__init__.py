"""Editing: sessions (apply/undo/redo/export/save), the model method and the baselines
(back-projection, optimisation, and the no-learning rules)."""

from splatpainter.edit.baselines import BackprojectMethod, OptimizeMethod
from splatpainter.edit.methods import EditMethod, ModelMethod
from splatpainter.edit.rules import DiffusionMethod, RuleMethod
from splatpainter.edit.session import EditSession, HistoryEntry, SessionError
from splatpainter.edit.views import MASK_THRESHOLD, EditInputError, EditView, default_mask

__all__ = [
    "MASK_THRESHOLD",
    "BackprojectMethod",
    "DiffusionMethod",
    "EditInputError",
    "EditMethod",
    "EditSession",
    "EditView",
    "HistoryEntry",
    "ModelMethod",
    "OptimizeMethod",
    "RuleMethod",
    "SessionError",
    "default_mask",
]
