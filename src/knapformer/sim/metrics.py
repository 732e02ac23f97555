"""Per-step metrics of a plan: imbalance, gap to the lower bound, SP and moved token shares.

Pure numpy over a :class:`knapformer.planning.plan.Plan` (only its documented fields are read).
The flow matrix (for the routing plot) uses the contract's ``np.array_split`` chunk convention
(the first ``L % g`` chunks get one extra token) for all sequences at once instead of calling
``chunk_bounds`` per sequence; a test checks the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "StepMetrics",
    "chunk_sizes",
    "flow_matrix",
    "plan_metrics",
    "unbalanced_metrics",
]


@dataclass(frozen=True)
class StepMetrics:
    """One step of one strategy; loads are relative to the mean unbalanced per-GPU load."""

    unbalanced_max_over_mean: float
    balanced_max_over_mean: float
    lower_bound_over_mean: float
    gap: float  # balanced makespan / lower bound - 1
    plan_ms: float
    tokens_moved_fraction: float
    sp_tokens_fraction: float
    spec: str
    layout_ms: float = 0.0  # time to choose the layout (auto only)


def chunk_sizes(lengths: np.ndarray, g: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Size of chunk ``j`` of a length-``L`` sequence cut into ``g`` contiguous chunks."""
    lengths = np.asarray(lengths, dtype=np.int64)
    g = np.asarray(g, dtype=np.int64)
    j = np.asarray(j, dtype=np.int64)
    return lengths // g + (j < lengths % g)


def flow_matrix(plan: Any) -> np.ndarray:
    """``[world, world]`` tokens sent from source rank (row) to destination GPU (column)."""
    lengths = np.asarray(plan.lengths, dtype=np.int64)
    src = np.asarray(plan.src_rank, dtype=np.int64)
    layout = plan.layout
    bag = np.asarray(plan.bag, dtype=np.int64)
    g = np.asarray(layout.bag_sizes, dtype=np.int64)[bag]
    first = np.asarray([r[0] for r in layout.bag_ranks], dtype=np.int64)[bag]
    world = plan.layout.world_size
    out = np.zeros((world, world), dtype=np.int64)
    for size in np.unique(g):
        sel = g == size
        for j in range(int(size)):
            np.add.at(out, (src[sel], first[sel] + j), chunk_sizes(lengths[sel], size, j))
    return out


def plan_metrics(plan: Any, layout_ms: float = 0.0) -> StepMetrics:
    s = plan.summary()
    return StepMetrics(
        unbalanced_max_over_mean=s["unbalanced_max_over_mean"],
        balanced_max_over_mean=s["balanced_max_over_mean"],
        lower_bound_over_mean=s["lower_bound_over_mean"],
        gap=s["gap"],
        plan_ms=s["plan_ms"],
        tokens_moved_fraction=s["tokens_moved_fraction"],
        sp_tokens_fraction=s["sp_tokens_fraction"],
        spec=s["spec"],
        layout_ms=layout_ms,
    )


def unbalanced_metrics(plan: Any) -> StepMetrics:
    """'No balancing' on the same step: loads as placed, judged against the same lower bound."""
    ratio = plan.unbalanced_max_over_mean
    lb = float(plan.lower_bound)
    return StepMetrics(
        unbalanced_max_over_mean=ratio,
        balanced_max_over_mean=ratio,
        lower_bound_over_mean=plan.lower_bound_over_mean,
        gap=float(np.max(plan.load_before)) / lb - 1.0 if lb > 0 else 0.0,
        plan_ms=0.0,
        tokens_moved_fraction=0.0,
        sp_tokens_fraction=0.0,
        spec="none",
    )
