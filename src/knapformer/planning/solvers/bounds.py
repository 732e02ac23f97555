"""Makespan lower bounds: every plan carries one (its certificate), and the search stops at it."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from knapformer.planning.solvers.problem import Problem

__all__ = ["lower_bound", "simple_lower_bound"]


def _row_reduce(a: np.ndarray, op: np.ufunc) -> np.ndarray:
    """``op`` over the columns of a narrow ``[n, K]`` array (one pass per column: numpy's
    ``axis=1`` reductions are several times slower for K of 2-4)."""
    out = a[:, 0].copy()
    for k in range(1, a.shape[1]):
        op(out, a[:, k], out=out)
    return out


def simple_lower_bound(p: Problem) -> float:
    """``max(sum_s min_g g*t(L_s,g) / N, max_s min_g t(L_s,g))``: valid for any t >= 0."""
    if p.n == 0:
        return 0.0
    work = _row_reduce(p.tg * p.class_sizes[None, :], np.minimum)
    return float(max(work.sum() / p.num_gpus, _row_reduce(p.tg, np.minimum).max()))


@lru_cache(maxsize=16)
def _class_subsets(k: int) -> tuple[np.ndarray, ...]:
    """The proper non-empty class subsets the bound tests, as bool masks (read-only: cached)."""
    if k <= 6:
        out = [
            np.asarray([(m >> j) & 1 for j in range(k)], dtype=bool) for m in range(1, (1 << k) - 1)
        ]
    else:
        # Many classes: only "sizes >= g" and "sizes <= g" sets (still valid, cheaper).
        out = []
        for j in range(1, k):
            mask = np.arange(k) >= j
            out.append(mask)
            out.append(~mask)
    for m in out:
        m.setflags(write=False)
    return tuple(out)


@lru_cache(maxsize=16)
def _subset_arrays(k: int) -> tuple[np.ndarray, np.ndarray, tuple[tuple[int, ...], ...]]:
    """``_class_subsets(k)`` as a ``[Q, k]`` bool matrix, the ``[k, Q]`` 0/1 matrix of the
    classes outside each subset, and each subset's classes (read-only: cached)."""
    inq = np.stack(_class_subsets(k))
    outside = (~inq).T.astype(np.int64)
    inq.setflags(write=False)
    outside.setflags(write=False)
    return inq, outside, tuple(tuple(q.nonzero()[0].tolist()) for q in inq)


class _Pattern:
    """What the restricted-capacity test needs for one set of allowed (sequence, class) pairs:
    the work each class subset must take, the subsets with members, and the members (with
    their per-class cost prefix sums, filled in on first use)."""

    __slots__ = ("inside_only", "need", "qs", "sums")

    def __init__(self, need: np.ndarray, qs: list[int], inside_only: np.ndarray) -> None:
        self.need = need
        self.qs = qs
        self.inside_only = inside_only
        self.sums: dict[int, dict[int, np.ndarray]] = {}


def lower_bound(p: Problem, rel_tol: float = 1e-6) -> float:
    """Restricted-capacity bound, at least the simple bound.

    For a target makespan x, a sequence may only use bag classes where ``t(L, g) <= x``. For
    every set Q of classes, the sequences R_Q that may only use classes in Q must fit in Q's
    bags: by work, ``sum_{R_Q} min_{k allowed} g_k t(L, g_k) <= x * gpus(Q)``, and by count
    (sequences are indivisible), ``|R_Q| <= sum_{k in Q} n_k m_k`` where a k-bag holds at most
    m_k of them (the most whose smallest costs t(L, g_k) still sum to <= x). Both tests are
    monotone in x, so bisection finds (to ``rel_tol``) the largest x they refute: a valid
    lower bound.
    """
    lb0 = simple_lower_bound(p)
    if p.n == 0 or p.class_sizes.shape[0] == 1:
        return lb0
    gpus_per_class = np.bincount(p.cls, weights=p.sizes, minlength=p.class_sizes.shape[0])
    # Only sequences not allowed everywhere at lb0 can matter for a proper subset Q.
    cand = _row_reduce(p.tg, np.maximum) > lb0
    if not cand.any():
        return lb0
    tc = p.tg[cand]
    wc = tc * p.class_sizes[None, :]
    K = p.class_sizes.shape[0]
    inq, outside, subset_classes = _subset_arrays(K)  # the class subsets Q tested
    # (GPU counts are whole numbers: their sums are exact in any order)
    caps = (inq * gpus_per_class).sum(axis=1)
    bags_per_class = np.bincount(p.cls, minlength=K).tolist()
    # counting test per class k: candidates sorted by their cost in k (on first use)
    order_k: dict[int, np.ndarray] = {}
    all_members = None
    all_q = range(K)
    # Everything but the comparisons with x depends only on which (sequence, class) pairs x
    # allows: the bisection keeps it per such pattern (its later steps mostly repeat one).
    patterns: dict[bytes, _Pattern | None] = {}

    def pattern(x: float) -> _Pattern | None:
        allowed = tc <= x  # [m, K]
        key = allowed.tobytes()
        if key not in patterns:
            if not _row_reduce(allowed, np.logical_or).all():
                patterns[key] = None  # some sequence fits nowhere: refuted
            else:
                w = _row_reduce(np.where(allowed, wc, np.inf), np.minimum)  # [m]
                # a sequence counts for Q iff none of its allowed classes lies outside Q
                # (counted exactly in integers)
                inside_only = (allowed.astype(np.int64) @ outside) == 0  # [m, Q]
                qs = inside_only.any(axis=0).nonzero()[0].tolist()
                patterns[key] = _Pattern(w @ inside_only, qs, inside_only)
        return patterns[key]

    def too_many(x: float, members: np.ndarray | None, q: Sequence[int], sums: dict) -> bool:
        """Whether ``members`` (None: all candidates) are more than the bags of classes ``q``
        can hold at makespan x (counting, smallest first)."""
        need = tc.shape[0] if members is None else int(members.sum())
        room = 0
        for k in q:
            cs = sums.get(k)
            if cs is None:
                o = order_k.get(k)
                if o is None:
                    o = order_k[k] = tc[:, k].argsort(kind="stable")
                vals = tc[o, k] if members is None else tc[o, k][members[o]]  # ascending
                cs = sums[k] = vals.cumsum()
            room += bags_per_class[k] * int(cs.searchsorted(x * (1 + 1e-12), side="right"))
            if room >= need:
                return False
        return True

    sums_all: dict[int, np.ndarray] = {}

    def refuted(x: float) -> bool:
        pat = pattern(x)
        if pat is None:
            return True
        if (pat.need > x * caps * (1 + 1e-12)).any():
            return True
        for qi in pat.qs:
            sums = pat.sums.setdefault(qi, {})
            if too_many(x, pat.inside_only[:, qi], subset_classes[qi], sums):
                return True
        return too_many(x, all_members, all_q, sums_all)

    lo = lb0
    if not refuted(lo):
        return lb0
    hi = 2.0 * lo
    while refuted(hi):  # any real makespan passes the test, so this ends
        lo, hi = hi, 2.0 * hi
    while hi - lo > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if refuted(mid):
            lo = mid
        else:
            hi = mid
    return float(lo)
