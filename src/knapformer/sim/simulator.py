"""Compare balancing strategies side by side on the same sampled steps.

Strategies:

* ``none``: loads as placed (no routing), judged against the same lower bound as ``ours``.
* ``reference``: the published greedy on the given spec (skipped for ``--spec auto``: the
  greedy has no layout choice of its own).
* ``reference-best-homogeneous``: the published greedy on the best homogeneous spec
  ``g{g}n{W/g}`` for ``g`` in 1, 2, 4, 8, ... (dividing the head count and the world, at most
  the GPUs of a node), chosen by mean modelled max/mean over the steps; within 1e-4 of the best,
  the smaller ``g`` wins (fewer tokens through all-to-alls: the choice most favourable to it).
* ``ours``: our solver on the given spec, or on the layout `planning.auto` picks for ``auto``.

Pure: lengths and a cost model in, metrics out (timings are the planner's own ``plan_ms``).
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from knapformer.planning.cost import CostModel
from knapformer.planning.layout import BagLayout
from knapformer.planning.plan import Plan, plan_step
from knapformer.planning.solvers.registry import DEFAULT_SOLVER
from knapformer.sim.metrics import StepMetrics, plan_metrics, unbalanced_metrics

__all__ = [
    "STRATEGIES",
    "SimulationError",
    "SimulationResult",
    "StrategyResult",
    "homogeneous_specs",
    "simulate",
]

STRATEGIES = ("none", "reference", "reference-best-homogeneous", "ours")
TIE_TOLERANCE = 1e-4

Steps = Sequence[Sequence[Sequence[int]]]


class SimulationError(ValueError):
    """Simulator input that cannot be used (no steps, no valid homogeneous spec, ...)."""


@dataclass(frozen=True)
class StrategyResult:
    strategy: str
    spec: str
    steps: tuple[StepMetrics, ...]
    note: str = ""

    def summary(self) -> dict[str, Any]:
        """Means over steps (median for gap and planner time); same keys as `plan --json`."""
        m = self.steps

        def mean(key: str) -> float:
            return float(np.mean([getattr(s, key) for s in m]))

        specs = Counter(s.spec for s in m)
        out: dict[str, Any] = {
            "strategy": self.strategy,
            "spec": self.spec,
            "steps": len(m),
            "unbalanced_max_over_mean": mean("unbalanced_max_over_mean"),
            "balanced_max_over_mean": mean("balanced_max_over_mean"),
            "balanced_max_over_mean_worst": float(max(s.balanced_max_over_mean for s in m)),
            "lower_bound_over_mean": mean("lower_bound_over_mean"),
            "median_gap": float(statistics.median(s.gap for s in m)),
            "plan_ms": float(statistics.median(s.plan_ms for s in m)),
            "layout_ms": float(statistics.median(s.layout_ms for s in m)),
            "tokens_moved_fraction": mean("tokens_moved_fraction"),
            "sp_tokens_fraction": mean("sp_tokens_fraction"),
        }
        if len(specs) > 1 or (self.spec == "auto" and specs):
            out["specs_used"] = dict(specs.most_common())
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class SimulationResult:
    results: tuple[StrategyResult, ...]
    homogeneous_scores: dict[str, float] = field(default_factory=dict)
    example_plans: dict[str, Plan] = field(default_factory=dict)  # first step, per strategy

    def summaries(self) -> list[dict[str, Any]]:
        return [r.summary() for r in self.results]


def homogeneous_specs(
    world_size: int, num_heads: int | None = None, gpus_per_node: int | None = None
) -> list[str]:
    """`g{g}n{W/g}` for powers of two g valid for the head count, the world and the node."""
    specs = []
    g = 1
    while g <= world_size:
        ok = world_size % g == 0
        ok = ok and (num_heads is None or num_heads % g == 0)
        ok = ok and (gpus_per_node is None or g <= gpus_per_node)
        if ok:
            specs.append(f"g{g}n{world_size // g}")
        g *= 2
    return specs


def _auto_chooser(
    cost: CostModel,
    world_size: int,
    num_heads: int | None,
    gpus_per_node: int | None,
    hysteresis: float,
) -> Callable[[Sequence[Sequence[int]]], BagLayout]:
    """Per-step layout choice from `knapformer.planning.auto` (the planner helper's module)."""
    try:
        auto = importlib.import_module("knapformer.planning.auto")
    except ImportError:
        raise SimulationError(
            "--spec auto needs knapformer.planning.auto, which is not available"
        ) from None
    return auto.make_simulator_chooser(
        cost, world_size, num_heads, gpus_per_node, hysteresis=hysteresis
    )


def _run(
    steps: Steps,
    layout: BagLayout,
    cost: CostModel,
    solver: str,
    options: dict[str, Any],
    tick: Callable[[], None] = lambda: None,
) -> list[Plan]:
    plans = []
    for step in steps:
        plans.append(plan_step(step, layout, cost, solver=solver, **options))
        tick()
    return plans


def simulate(
    steps: Steps,
    cost: CostModel,
    spec: str,
    num_heads: int | None = None,
    gpus_per_node: int | None = None,
    strategies: Sequence[str] = STRATEGIES,
    options: dict[str, Any] | None = None,
    hysteresis: float = 0.02,
    on_plan: Callable[[int, int], None] | None = None,
) -> SimulationResult:
    """Run every requested strategy on the same steps (`steps[i][rank]` = lengths).

    ``on_plan(done, total)`` is called after every planned step (for a progress bar).

    With ``spec="auto"`` the layout is chosen every step, keeping the previous one unless the
    best is better by more than ``hysteresis`` (relative makespan); the choice time is
    reported as ``layout_ms``, separately from the planner's ``plan_ms``.
    """
    if not steps:
        raise SimulationError("no steps to simulate")
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise SimulationError(f"unknown strategies {unknown}: choose from {list(STRATEGIES)}")
    world = len(steps[0])
    if any(len(s) != world for s in steps):
        raise SimulationError("all steps must have the same number of ranks")
    options = dict(options or {})
    auto = spec.strip().lower() == "auto"
    fixed = None if auto else BagLayout.parse(spec, world, num_heads)
    if fixed is not None and gpus_per_node is not None:
        big = sorted({g for g in fixed.bag_sizes if g > gpus_per_node})
        if big:
            raise SimulationError(
                f"spec {spec!r} has bags of size {big} larger than a node "
                f"(--gpus-per-node {gpus_per_node})"
            )
        across = [r for r in fixed.bag_ranks if r[0] // gpus_per_node != r[-1] // gpus_per_node]
        if across:
            raise SimulationError(
                f"spec {spec!r}: the bag on ranks {across[0][0]}-{across[0][-1]} spans two nodes "
                f"(--gpus-per-node {gpus_per_node}); order the terms so bags stay inside a node"
            )

    cands: list[str] = []
    if "reference-best-homogeneous" in strategies:
        cands = list(homogeneous_specs(world, num_heads, gpus_per_node))
    passes = int("ours" in strategies or "none" in strategies)
    passes += int("reference" in strategies and fixed is not None) + len(cands)
    done = [0]

    def tick() -> None:
        done[0] += 1
        if on_plan is not None:
            on_plan(done[0], passes * len(steps))

    results: list[StrategyResult] = []
    examples: dict[str, Plan] = {}
    scores: dict[str, float] = {}

    ours_plans: list[Plan] | None = None
    layout_ms: list[float] = [0.0] * len(steps)
    if "ours" in strategies or "none" in strategies:
        if auto:
            choose = _auto_chooser(cost, world, num_heads, gpus_per_node, hysteresis)
            ours_plans = []
            for i, step in enumerate(steps):
                t0 = time.perf_counter()
                layout = choose(step)
                layout_ms[i] = (time.perf_counter() - t0) * 1e3
                ours_plans.append(plan_step(step, layout, cost, solver=DEFAULT_SOLVER, **options))
                tick()
        else:
            assert fixed is not None
            ours_plans = _run(steps, fixed, cost, DEFAULT_SOLVER, options, tick)

    if "none" in strategies:
        assert ours_plans is not None
        results.append(
            StrategyResult("none", "none", tuple(unbalanced_metrics(p) for p in ours_plans))
        )
    ref_fixed: list[Plan] | None = None
    if "reference" in strategies and fixed is not None:
        ref_fixed = _run(steps, fixed, cost, "reference", {}, tick)
        results.append(
            StrategyResult("reference", fixed.spec, tuple(plan_metrics(p) for p in ref_fixed))
        )
        examples["reference"] = ref_fixed[0]
    if "reference-best-homogeneous" in strategies:
        if not cands:
            raise SimulationError(
                f"no homogeneous spec fits world={world}, heads={num_heads}, "
                f"gpus_per_node={gpus_per_node}"
            )
        runs: dict[str, list[Plan]] = {}
        for cand in cands:
            layout = BagLayout.parse(cand, world, num_heads)
            if ref_fixed is not None and layout.spec == fixed.spec:  # type: ignore[union-attr]
                runs[cand] = ref_fixed
                for _ in steps:
                    tick()
            else:
                runs[cand] = _run(steps, layout, cost, "reference", {}, tick)
            scores[cand] = float(np.mean([p.balanced_max_over_mean for p in runs[cand]]))
        best_score = min(scores.values())
        best = next(c for c in cands if scores[c] <= best_score * (1 + TIE_TOLERANCE))
        results.append(
            StrategyResult(
                "reference-best-homogeneous",
                best,
                tuple(plan_metrics(p) for p in runs[best]),
                note="chosen among " + ", ".join(f"{c}={scores[c]:.4f}" for c in cands),
            )
        )
        examples["reference-best-homogeneous"] = runs[best][0]
    if "ours" in strategies:
        assert ours_plans is not None
        results.append(
            StrategyResult(
                "ours",
                "auto" if auto else fixed.spec,  # type: ignore[union-attr]
                tuple(plan_metrics(p, ms) for p, ms in zip(ours_plans, layout_ms, strict=True)),
            )
        )
        examples["ours"] = ours_plans[0]
    return SimulationResult(tuple(results), scores, examples)
