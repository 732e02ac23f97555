"""Solver registry: a solver maps one replica's :class:`Problem` to a bag per sequence."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from knapformer.planning.solvers.problem import Problem

__all__ = [
    "ALIASES",
    "DEFAULT_SOLVER",
    "KNOWN_OPTIONS",
    "SOLVERS",
    "SolverFn",
    "canonical_solver",
    "register_solver",
]

SolverFn = Callable[["Problem"], tuple[np.ndarray, dict[str, Any]]]
SOLVERS: dict[str, SolverFn] = {}
# the default solver: makespan local search seeded and guarded by the published greedy
DEFAULT_SOLVER = "local-search"
ALIASES = {"ours": DEFAULT_SOLVER}  # the name it had before it got one that says what it is

KNOWN_OPTIONS = frozenset(
    {
        "max_tokens_per_gpu",
        "locality_slack",
        "keep_margin",
        "time_limit",
        "max_variables",
        "guard",
        "max_iters",
        "stop_gap",
        "replica_floor",
    }
)


def register_solver(name: str) -> Callable[[SolverFn], SolverFn]:
    def deco(fn: SolverFn) -> SolverFn:
        SOLVERS[name] = fn
        return fn

    return deco


def canonical_solver(name: str) -> str:
    """Resolve an alias (``ours``) to the registered name."""
    return ALIASES.get(name, name)
