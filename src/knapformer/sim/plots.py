"""PNG figures of the simulator (matplotlib Agg, atomic writes)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from appshell.atomic import atomic_open
from knapformer.sim.metrics import flow_matrix

__all__ = ["atomic_savefig", "plot_loads", "plot_routing"]


def atomic_savefig(fig: Any, path: str | os.PathLike[str]) -> Path:
    """Save a figure as PNG via a temp file in the same directory + os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path) as f:
        fig.savefig(f, format="png", dpi=110, bbox_inches="tight")
    return path


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_loads(plans: Mapping[str, Any], path: str | os.PathLike[str], title: str = "") -> Path:
    """Per-GPU modelled load before balancing and after each strategy, relative to the mean."""
    plt = _pyplot()
    first = next(iter(plans.values()))
    mean = float(np.mean(first.load_before))
    world = len(first.load_before)
    x = np.arange(world)
    fig, ax = plt.subplots(figsize=(max(6.0, world * 0.22), 3.6))
    ax.bar(x, np.asarray(first.load_before) / mean, color="0.8", label="no balancing")
    for name, plan in plans.items():
        loads = np.asarray(plan.load_after) / mean
        ax.step(
            np.append(x, world) - 0.5,
            np.append(loads, loads[-1]),
            where="post",
            label=f"{name} ({plan.layout.spec}): max/mean {loads.max():.3f}",
        )
    ax.axhline(1.0, color="k", lw=0.6, ls="--")
    ax.set_xlabel("GPU (global rank)")
    ax.set_ylabel("modelled load / mean")
    ax.set_xlim(-0.5, world - 0.5)
    ax.set_title(title or "per-GPU load, one step")
    ax.legend(fontsize=7, loc="upper left")
    try:
        return atomic_savefig(fig, path)
    finally:
        plt.close(fig)


def plot_routing(plan: Any, path: str | os.PathLike[str], title: str = "") -> Path:
    """Tokens sent from each source rank (rows) to each GPU (columns); bags outlined."""
    plt = _pyplot()
    from matplotlib.colors import LogNorm

    flow = flow_matrix(plan).astype(np.float64)
    world = flow.shape[0]
    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    shown = np.where(flow > 0, flow, np.nan)
    vmax = max(float(np.nanmax(shown)) if np.isfinite(shown).any() else 1.0, 1.0)
    im = ax.imshow(shown, cmap="viridis", norm=LogNorm(vmin=1.0, vmax=vmax), interpolation="none")
    fig.colorbar(im, ax=ax, label="tokens")
    for ranks in plan.layout.bag_ranks:
        lo, hi = ranks[0] - 0.5, ranks[-1] + 0.5
        ax.axvline(lo, color="0.6", lw=0.5)
        if len(ranks) > 1:
            ax.axvspan(lo, hi, color="tab:red", alpha=0.08)
    ax.axvline(world - 0.5, color="0.6", lw=0.5)
    ax.set_xlabel("destination GPU (bags separated by lines, multi-GPU bags shaded)")
    ax.set_ylabel("source rank")
    ax.set_title(title or f"routing plan ({plan.layout.spec}, solver {plan.solver})")
    try:
        return atomic_savefig(fig, path)
    finally:
        plt.close(fig)
