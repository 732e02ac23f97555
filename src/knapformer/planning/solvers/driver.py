"""The driver: validate options, build one :class:`Problem` per replica, run the solver, and
enforce the default solver's never-worse guarantee over the whole step."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from knapformer.planning.cost import CostModel
from knapformer.planning.errors import InfeasibleError, PlanError
from knapformer.planning.layout import BagLayout
from knapformer.planning.solvers.problem import (
    CostTable,
    Problem,
    SolveResult,
    _makespan,
    build_problem,
)
from knapformer.planning.solvers.registry import (
    ALIASES,
    DEFAULT_SOLVER,
    KNOWN_OPTIONS,
    SOLVERS,
    canonical_solver,
)
from knapformer.planning.solvers.search import reference_plan

__all__ = ["solve", "solver_names"]


def solve(
    lengths: np.ndarray,
    src: np.ndarray,
    layout: BagLayout,
    cost: CostModel,
    solver: str,
    options: Mapping[str, Any],
    table: CostTable | None = None,
) -> SolveResult:
    """Solve every replica independently; returns global bag indices and the lower bound.

    ``table``: ``cost``'s table for ``lengths``, when the caller already has it."""
    name = canonical_solver(solver)
    if name not in SOLVERS:
        raise PlanError(f"unknown solver {solver!r}; choose one of {solver_names()}")
    unknown = sorted(set(options) - KNOWN_OPTIONS)
    if unknown:
        raise PlanError(f"unknown planner option(s) {unknown}; known: {sorted(KNOWN_OPTIONS)}")
    started = time.perf_counter()
    _check_options(options)
    max_tokens = options.get("max_tokens_per_gpu")
    if max_tokens is not None:
        if not isinstance(max_tokens, (int, np.integer)) or isinstance(max_tokens, bool):
            raise PlanError(f"max_tokens_per_gpu must be an integer, got {max_tokens!r}")
        if max_tokens < 1:
            raise PlanError(f"max_tokens_per_gpu must be >= 1, got {max_tokens}")
        max_tokens = int(max_tokens)
    fn = SOLVERS[name]
    group = layout.group_size
    kb = layout.bags_per_replica
    bag = np.zeros(lengths.shape[0], dtype=np.int64)
    seq_cost = np.zeros(lengths.shape[0])
    seq_cost1: np.ndarray | None = np.zeros(lengths.shape[0])
    lb = 0.0
    infos: list[dict[str, Any]] = []
    spans: list[float] = []  # every replica's makespan (exact loads, as plan_step sums them)
    bounds = src.searchsorted(np.arange(0, layout.world_size + 1, group))
    problems = []
    for r in range(layout.num_replicas):
        a, b = int(bounds[r]), int(bounds[r + 1])
        tab = table.rows(a, b) if table is not None else None
        p = build_problem(
            lengths[a:b], src[a:b] - r * group, layout, cost, max_tokens, options, tab
        )
        p.started = started
        if max_tokens is not None and p.n:
            _check_budget(p, r)
        problems.append(p)
    # The step lasts as long as its slowest replica: no replica needs balancing below the
    # largest replica lower bound (every rank sees all lengths, so this stays deterministic).
    use_floor = bool(options.get("replica_floor", True))
    floor = max((p.lb for p in problems), default=0.0) if use_floor else 0.0
    for r, p in enumerate(problems):
        a, b = int(bounds[r]), int(bounds[r + 1])
        p.floor = floor
        local, info = fn(p)
        if max_tokens is not None and p.n and (p.bag_tokens(local) > max_tokens).any():
            raise InfeasibleError(
                f"solver {solver!r} could not keep replica {r} within "
                f"max_tokens_per_gpu={max_tokens}"
            )
        bag[a:b] = local + r * kb
        w = p.seq_cost(local)
        seq_cost[a:b] = w
        if seq_cost1 is not None:
            if int(p.class_sizes[0]) == 1 or "work1" in p.__dict__:  # (computed already)
                seq_cost1[a:b] = p.work1
            else:
                seq_cost1 = None
        ms = _makespan(np.bincount(local, weights=w, minlength=p.num_bags))
        spans.append(ms)
        rlb = p.lb
        dual = info.get("mip_dual_bound")
        if info.get("optimal") and p.n:
            rlb = max(rlb, ms * (1.0 - 1e-9))
        elif dual is not None and np.isfinite(dual):
            rlb = max(rlb, float(dual) * (1.0 - 1e-9))
        lb = max(lb, rlb)
        infos.append(info)
    if name == DEFAULT_SOLVER and options.get("guard", True):
        _enforce_guarantee(problems, spans, bag, seq_cost, bounds, kb, options)
    merged: dict[str, Any] = {}
    if infos:
        for key in sorted({k for i in infos for k in i}):
            vals = [i[key] for i in infos if key in i]
            if all(isinstance(v, bool) for v in vals):
                merged[key] = all(vals) if key == "optimal" else any(vals)
            elif all(isinstance(v, (int, float)) for v in vals):
                merged[key] = max(vals)
    return SolveResult(bag, lb, merged, seq_cost, seq_cost1)


_POSITIVE = ("time_limit",)
_NON_NEGATIVE = ("locality_slack", "keep_margin", "stop_gap")
_COUNTS = ("max_iters", "max_variables")


def _check_options(options: Mapping[str, Any]) -> None:
    """One-line errors for option values that would otherwise be silently misused."""
    for key in (*_POSITIVE, *_NON_NEGATIVE):
        if key not in options:
            continue
        v = options[key]
        ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
        if not ok or not math.isfinite(float(v)) or float(v) < 0 or (key in _POSITIVE and v == 0):
            need = "> 0" if key in _POSITIVE else ">= 0"
            raise PlanError(f"{key} must be a finite number {need}, got {v!r}")
    for key in _COUNTS:
        if key in options:
            v = options[key]
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise PlanError(f"{key} must be an integer >= 1, got {v!r}")


def solver_names() -> list[str]:
    """Registered solvers and aliases, for messages and CLI choices."""
    return sorted({*SOLVERS, *ALIASES})


def _enforce_guarantee(
    problems: list[Problem],
    spans: list[float],
    bag: np.ndarray,
    seq_cost: np.ndarray,
    bounds: np.ndarray,
    kb: int,
    options: Mapping[str, Any],
) -> None:
    """Never worse than ``reference``, over the whole step and with no tolerance: a replica
    whose makespan (exact loads, as ``plan_step`` sums them) is above the reference step's
    makespan gets its reference plan. (Replicas may be balanced only down to the heaviest
    replica's bound, so the comparison is with the reference step, not replica by replica.)
    ``spans``: every replica's makespan, from the same exact loads."""
    if float(options.get("locality_slack", 0.0)) != 0.0:
        return  # the caller asked to trade makespan for locality
    refs = [reference_plan(p) if p.n else None for p in problems]
    if any(r is None for r, p in zip(refs, problems, strict=True) if p.n):
        return  # the reference breaks the token budget: it has no plan to compare with
    step_ref = max((_makespan(r[1]) for r in refs if r is not None), default=0.0)
    for r, (p, ref) in enumerate(zip(problems, refs, strict=True)):
        if ref is None:
            continue
        if spans[r] > step_ref:
            a, b = int(bounds[r]), int(bounds[r + 1])
            bag[a:b] = ref[0] + r * kb
            seq_cost[a:b] = p.seq_cost(ref[0])


def _check_budget(p: Problem, replica: int) -> None:
    """Cheap proofs of infeasibility for the token budget (clear error, no solver run)."""
    mk = p.max_tokens
    assert mk is not None
    gmax = int(p.class_sizes[-1])
    need = -(-p.lengths // gmax)
    if (need > mk).any():
        L = int(p.lengths[need > mk][0])
        raise InfeasibleError(
            f"replica {replica}: a sequence of {L} tokens needs {-(-L // gmax)} tokens per GPU "
            f"even in the largest bag (g={gmax}) > max_tokens_per_gpu={mk}"
        )
    if int(p.lengths.sum()) > mk * p.num_gpus:
        raise InfeasibleError(
            f"replica {replica}: {int(p.lengths.sum())} tokens do not fit in {p.num_gpus} GPUs x "
            f"max_tokens_per_gpu={mk}"
        )
