"""``reference``: the published KnapFormer greedy, reproduced decision for decision.

As in the public code (``SequenceBalancer.plan_routing``): every sequence has one workload
``W = t(L, 1)``; the per-GPU capacity is ``C = sum(W) / N`` and a g-bag's capacity ``g * C``.
Sequences are visited by decreasing ``W`` (a stable sort: equal workloads keep their order).
A bag is a candidate when its *total* capacity is at least ``W`` (the capacity never shrinks:
this is not a remaining-room test) and ``L >= g``; with no candidate, every bag of the largest
size is. The candidate with the lowest occupancy ``sum(W / capacity)`` wins; ties go to the
first bag in the published bag order, which lists bags by increasing size (then in spec order).

Only the plan is taken from it: its loads are then evaluated with the full cost model, like
every other solver's, so its all-to-all and overhead terms count too.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from knapformer.planning.solvers import fast
from knapformer.planning.solvers.problem import Problem
from knapformer.planning.solvers.registry import register_solver

__all__ = ["solve_reference"]


@register_solver("reference")
def solve_reference(p: Problem) -> tuple[np.ndarray, dict[str, Any]]:
    n = p.n
    bag = np.zeros(n, dtype=np.int64)
    if n == 0:
        return bag, {}
    w = p.work1
    wl = w.tolist()
    C = sum(wl) / p.num_gpus  # (left-to-right, as the published Python sum)
    order = _by_workload_desc(p, w)
    gs = p.class_sizes.tolist()
    K = len(gs)
    caps = [C * g for g in gs]
    wo = w[order]
    # candidate classes form a range: capacity grows with g, and L >= g holds for small g
    lo = np.searchsorted(np.asarray(caps), wo, side="left")
    hi = np.searchsorted(p.class_sizes, p.lengths[order], side="right") - 1
    none = lo > hi
    lo[none] = hi[none] = K - 1  # no candidate: every bag of the largest size
    kern = fast.kernels()
    if kern is not None:  # the same loop, compiled
        div = np.asarray(_divisors(caps))
        bag[order] = kern.reference_assign(wo, lo, hi, fast.writable(p.cls), K, div)
        return bag, {}
    # One heap per size class, keyed (occupancy, bag): within a class, bags in spec order are
    # in the published order, and classes are compared in increasing size, so the first
    # minimum found is the published tie-break.
    heaps: list[list[tuple[float, int]]] = [[] for _ in range(K)]
    for b, k in enumerate(p.cls.tolist()):
        heaps[k].append((0.0, b))
    # Runs of sequences for which every class is a candidate (the bulk) use one heap over all
    # bags keyed (occupancy, class, bag): the same order as the published tie-break.
    full = (lo == 0) & (hi == K - 1)
    out: list[int] = []
    wl_o = wo.tolist()
    i, n_o = 0, len(wl_o)
    edges = np.flatnonzero(np.diff(full.astype(np.int8))) + 1
    for j in [*edges.tolist(), n_o]:
        if full[i] and (j - i >= p.num_bags or K == 1):
            _run_all(heaps, caps, wl_o[i:j], out)
        else:
            _run_ranges(heaps, caps, wl_o[i:j], lo[i:j].tolist(), hi[i:j].tolist(), out)
        i = j
    bag[order] = out
    return bag, {}


def _by_workload_desc(p: Problem, w: np.ndarray) -> np.ndarray:
    """The stable order of decreasing ``w``. When ``w`` is strictly increasing in the length
    on these sequences (the usual case, checked: any cost model may be plugged in), it is the
    problem's order of decreasing length, already sorted (by a radix sort on the lengths,
    cheaper than sorting floats)."""
    order = p.by_cost_desc
    ws, ls = w[order], p.lengths[order]
    tie = ws[1:] == ws[:-1]
    if bool(((ws[1:] < ws[:-1]) | (tie & (ls[1:] == ls[:-1]))).all()):
        return order
    return (-w).argsort(kind="stable")


def _run_all(
    heaps: list[list[tuple[float, int]]], caps: list[float], ws: list[float], out: list[int]
) -> None:
    """Every bag is a candidate: one heap over all bags (then split back per class)."""
    if len(heaps) == 1:  # one size class: its own heap, one capacity
        h1, cap = heaps[0], _divisors(caps)[0]
        heapreplace = heapq.heapreplace
        push = out.append
        for w in ws:
            occ, b = h1[0]
            heapreplace(h1, (occ + w / cap, b))
            push(b)
        return
    h = [(occ, k, b) for k, hk in enumerate(heaps) for occ, b in hk]
    heapq.heapify(h)
    heapreplace = heapq.heapreplace
    push = out.append
    div = _divisors(caps)
    for w in ws:
        occ, k, b = h[0]
        heapreplace(h, (occ + w / div[k], k, b))
        push(b)
    for hk in heaps:
        hk.clear()
    for occ, k, b in h:
        heaps[k].append((occ, b))
    for hk in heaps:
        heapq.heapify(hk)


def _run_ranges(
    heaps: list[list[tuple[float, int]]],
    caps: list[float],
    ws: list[float],
    lo: list[int],
    hi: list[int],
    out: list[int],
) -> None:
    """Candidates are the classes lo..hi: the lowest occupancy over their heap tops."""
    heapreplace = heapq.heapreplace
    push = out.append
    div = _divisors(caps)
    for w, k0, k1 in zip(ws, lo, hi, strict=True):
        bk = k0
        occ, b = heaps[k0][0]
        for k in range(k0 + 1, k1 + 1):
            top = heaps[k][0]
            if top[0] < occ:
                (occ, b), bk = top, k
        heapreplace(heaps[bk], (occ + w / div[bk], b))
        push(b)


def _divisors(caps: list[float]) -> list[float]:
    """Occupancy adds ``W / capacity``; a zero capacity (all workloads zero) adds nothing."""
    return [c if c > 0 else float("inf") for c in caps]
