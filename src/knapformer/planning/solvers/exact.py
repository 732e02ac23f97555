"""``exact``: the makespan MILP solved by HiGHS, for small instances."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from knapformer.planning.errors import InfeasibleError, PlanError
from knapformer.planning.solvers.bounds import simple_lower_bound
from knapformer.planning.solvers.problem import Problem
from knapformer.planning.solvers.registry import register_solver

__all__ = ["DEFAULT_MAX_VARIABLES", "DEFAULT_TIME_LIMIT", "solve_exact"]


DEFAULT_TIME_LIMIT = 10.0  # seconds, model building included
DEFAULT_MAX_VARIABLES = 200_000  # sequences x bags of one replica


@register_solver("exact")
def solve_exact(p: Problem) -> tuple[np.ndarray, dict[str, Any]]:
    """min M s.t. each sequence in one bag, per-GPU load of every bag <= M (and token budget).

    Symmetry breaking: bags of one size are interchangeable, so the i-th sequence (in a fixed
    order) may only use the first i+1 bags of each size class.

    Limits: ``max_variables`` (default 200,000 sequence x bag variables per replica) is
    checked before anything is built, with a one-line error. ``time_limit`` (default 10 s)
    counts from the start of the step's planning, model building included: what is left goes
    to HiGHS; if nothing is left, or HiGHS finds no solution in time, a :class:`PlanError`
    says so. A solution found within the limit but not proved optimal is returned with
    ``optimal=False`` and its dual bound.
    """
    n, B = p.n, p.num_bags
    if n == 0:
        return np.zeros(0, dtype=np.int64), {"optimal": True}
    time_limit = float(p.options.get("time_limit", DEFAULT_TIME_LIMIT))
    max_vars = int(p.options.get("max_variables", DEFAULT_MAX_VARIABLES))
    if n * B > max_vars:
        raise PlanError(
            f"exact solver: {n} sequences x {B} bags = {n * B} variables exceed "
            f"max_variables={max_vars}; use the default solver for instances this large"
        )
    started = p.started if p.started is not None else time.perf_counter()

    def left(stage: str) -> float:
        remaining = time_limit - (time.perf_counter() - started)
        if remaining <= 0:
            raise PlanError(
                f"exact solver: time limit of {time_limit:g}s reached while {stage} "
                f"({n} sequences x {B} bags); raise time_limit or use the default solver"
            )
        return remaining

    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    left("importing HiGHS")
    nv = n * B + 1  # x[s, b] then M
    c = np.zeros(nv)
    c[-1] = 1.0
    lb_x = np.zeros(nv)
    ub_x = np.ones(nv)
    ub_x[-1] = np.inf
    # symmetry breaking: rank of each bag within its class
    rank_in_class = np.zeros(B, dtype=np.int64)
    seen: dict[int, int] = {}
    for b in range(B):
        k = int(p.cls[b])
        rank_in_class[b] = seen.get(k, 0)
        seen[k] = rank_in_class[b] + 1
    order = (-p.tg[:, 0]).argsort(kind="stable")
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    forbid = rank_in_class[None, :] > pos[:, None]  # [n, B]
    ub_x[: n * B][forbid.ravel()] = 0.0
    rows, cols, vals = [], [], []
    # assignment rows
    s_idx = np.arange(n).repeat(B)
    rows.append(s_idx)
    cols.append(np.arange(n * B))
    vals.append(np.ones(n * B))
    # load rows: sum_s tg[s, cls[b]] x[s,b] - M <= 0
    scale = simple_lower_bound(p) or 1.0  # HiGHS tolerances are absolute: work near 1
    Tsb = p.tg[:, p.cls] / scale  # [n, B]
    b_idx = np.tile(np.arange(B), n)
    rows.append(n + b_idx)
    cols.append(np.arange(n * B))
    vals.append(Tsb.ravel())
    rows.append(n + np.arange(B))
    cols.append(np.full(B, nv - 1))
    vals.append(np.full(B, -1.0))
    nrows = n + B
    lo_r = [np.ones(n), np.full(B, -np.inf)]
    hi_r = [np.ones(n), np.zeros(B)]
    if p.max_tokens is not None:
        tokb = p.tok()[:, p.cls]
        rows.append(nrows + b_idx)
        cols.append(np.arange(n * B))
        vals.append(tokb.ravel().astype(np.float64))
        nrows += B
        lo_r.append(np.full(B, -np.inf))
        hi_r.append(np.full(B, float(p.max_tokens)))
    A = coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(nrows, nv)
    ).tocsr()
    integrality = np.ones(nv)
    integrality[-1] = 0
    remaining = left("building the model")
    res = milp(
        c,
        constraints=LinearConstraint(A, np.concatenate(lo_r), np.concatenate(hi_r)),
        integrality=integrality,
        bounds=Bounds(lb_x, ub_x),
        options={"time_limit": remaining, "disp": False, "mip_rel_gap": 1e-9},
    )
    if res.x is None:
        if res.status == 2 or (p.max_tokens is not None and res.status != 1):
            raise InfeasibleError(
                f"exact solver: no assignment fits max_tokens_per_gpu={p.max_tokens}"
            )
        raise PlanError(f"exact solver found no solution within {time_limit:g}s ({res.message})")
    x = res.x[: n * B].reshape(n, B)
    bag = np.argmax(x, axis=1).astype(np.int64)
    info = {
        "optimal": bool(res.status == 0),
        "mip_dual_bound": float(getattr(res, "mip_dual_bound", np.nan) or np.nan) * scale,
        "status": int(res.status),
    }
    return bag, info
