"""Planner errors, in a module of their own so that every planning module can raise them
without importing another (no import circles)."""

from __future__ import annotations

__all__ = ["InfeasibleError", "PlanError"]


class PlanError(ValueError):
    """Invalid planner input (lengths, layout/world mismatch, unknown solver or option)."""


class InfeasibleError(PlanError):
    """No plan satisfies the constraints (e.g. the per-GPU token budget)."""
