"""Assignment solvers behind one registry: ``reference`` (the published greedy), ``ours``
(makespan on uniform machines: LPT + local search, locality- and memory-aware) and ``exact``
(HiGHS MILP for small instances). Plus the makespan lower bound every plan carries.

All solvers work on one replica at a time (sequences never leave their replica; replicas only
share the step's bound, see ``Problem.floor``) and are deterministic: stable sorts, ties broken
by index, no wall-clock-dependent decisions, so every rank computes the same plan.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from knapformer.planning.cost import CostModel
from knapformer.planning.layout import BagLayout
from knapformer.planning.plan import InfeasibleError, PlanError

__all__ = [
    "SOLVERS",
    "Problem",
    "SolveResult",
    "lower_bound",
    "register_solver",
    "solve",
]

_REL_EPS = 1e-12  # relative tolerance for "ties" between floating loads
_SWAP_MAX_PER_BAG = 16  # locality swaps only with at most this many sequences per bag
_ALL_PAIRS_MAX = 1024  # pair rounds try every swap up to this many pairs, else a window
_WF_STOP = 4  # water-fill stages halve until at most this many items per bag remain


def _stable_argsort_int(x: np.ndarray) -> np.ndarray:
    """Stable argsort of an int array; keys spanning < 2**16 values are sorted as uint16,
    which numpy radix-sorts (several times faster than its timsort for int64)."""
    if x.size == 0:
        return np.zeros(0, dtype=np.intp)
    lo = int(x.min())
    if int(x.max()) - lo < 1 << 16:
        return (x - lo).astype(np.uint16).argsort(kind="stable")
    return x.argsort(kind="stable")


@dataclass
class Problem:
    """One replica's instance, in local indices (bags 0..B-1, ranks 0..group-1).

    ``floor`` is the makespan other replicas already force (max of their lower bounds):
    balancing this replica below it cannot shorten the step, so the solver may stop there."""

    lengths: np.ndarray  # [n] int64
    home: np.ndarray  # [n] local bag holding the sequence's source rank
    sizes: np.ndarray  # [B] bag sizes
    cls: np.ndarray  # [B] index into class_sizes
    class_sizes: np.ndarray  # [K] sorted distinct bag sizes
    tg: np.ndarray  # [n, K] per-GPU cost t(L, g_k)
    cost: CostModel
    max_tokens: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    floor: float = 0.0
    src: np.ndarray | None = None  # [n] local source rank (exact staying tokens); optional

    @cached_property
    def stay_home(self) -> np.ndarray:
        """[n] tokens that stay on the source rank when the sequence sits in its home bag:
        there its chunk index is the source rank's position j in the bag, so it keeps
        ``L // g`` tokens, plus one if ``j < L % g`` (np.array_split convention)."""
        g = self.sizes[self.home]
        q, rem = np.divmod(self.lengths, g)
        if self.src is None:
            return q
        first = self.sizes.cumsum() - self.sizes
        return q + ((self.src - first[self.home]) < rem)

    @property
    def n(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def num_bags(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def num_gpus(self) -> int:
        return int(self.sizes.sum())

    def tok(self) -> np.ndarray:
        """[n, K] tokens the first (fullest) GPU of a g_k-bag receives: ceil(L / g_k)."""
        return self._tok

    @cached_property
    def _tok(self) -> np.ndarray:
        return -(-self.lengths[:, None] // self.class_sizes[None, :])

    @cached_property
    def tg_home(self) -> np.ndarray:
        """[n] per-GPU cost of every sequence in its home bag."""
        return self.seq_cost(self.home)

    @cached_property
    def by_cost_desc(self) -> np.ndarray:
        """Items by decreasing cost (ties: lowest index first). t(L, g) is strictly increasing
        in L for every g, so this is the stable order of -L, the same in every class."""
        o = _stable_argsort_int(-self.lengths)
        o.setflags(write=False)  # shared by every construction pass
        return o

    @cached_property
    def by_cost_asc(self) -> np.ndarray:
        """Items by increasing cost in every class (ties: lowest index first)."""
        o = _stable_argsort_int(self.lengths)
        o.setflags(write=False)
        return o

    @cached_property
    def tg_ext(self) -> np.ndarray:
        """``tg`` flattened row-major plus one zero row (a dummy item of index ``n``)."""
        return np.concatenate((self.tg.ravel(), np.zeros(self.tg.shape[1])))

    @cached_property
    def tok_ext(self) -> np.ndarray:
        """``tok()`` flattened row-major plus one zero row (a dummy item of index ``n``)."""
        return np.concatenate((self._tok.ravel(), np.zeros(self._tok.shape[1], np.int64)))

    @cached_property
    def w1(self) -> np.ndarray:
        """GPU-time of each sequence in the smallest bag class (a size proxy)."""
        return self.tg[:, 0] * float(self.class_sizes[0])

    @cached_property
    def w1_scale(self) -> float:
        return float(self.w1.max(initial=0.0)) * 1.000001 + 1e-300

    @cached_property
    def lb(self) -> float:
        """Lower bound on this replica's makespan (computed once, shared by the solvers)."""
        return lower_bound(self)

    def bag_loads(self, bag: np.ndarray) -> np.ndarray:
        return np.bincount(bag, weights=self.seq_cost(bag), minlength=self.num_bags)

    def seq_cost(self, bag: np.ndarray) -> np.ndarray:
        """[n] per-GPU cost of every sequence in its bag."""
        if self.n == 0:
            return np.zeros(0)
        return self.tg.ravel()[np.arange(self.n) * self.tg.shape[1] + self.cls[bag]]

    def bag_tokens(self, bag: np.ndarray) -> np.ndarray:
        if self.n == 0:
            return np.zeros(self.num_bags, dtype=np.int64)
        t = self.tok()[np.arange(self.n), self.cls[bag]]
        return np.bincount(bag, weights=t, minlength=self.num_bags).astype(np.int64)


@dataclass
class SolveResult:
    bag: np.ndarray  # [S] global bag index
    lower_bound: float
    info: dict[str, Any]
    # [S] per-GPU cost of every sequence in its bag, and in a 1-GPU bag (None: not computed);
    # plan_step reuses them instead of evaluating the cost model again
    seq_cost: np.ndarray | None = None
    seq_cost1: np.ndarray | None = None


SolverFn = Callable[[Problem], tuple[np.ndarray, dict[str, Any]]]
SOLVERS: dict[str, SolverFn] = {}


def register_solver(name: str) -> Callable[[SolverFn], SolverFn]:
    def deco(fn: SolverFn) -> SolverFn:
        SOLVERS[name] = fn
        return fn

    return deco


_KNOWN_OPTIONS = {
    "max_tokens_per_gpu",
    "locality_slack",
    "keep_margin",
    "time_limit",
    "guard",
    "max_iters",
    "stop_gap",
    "replica_floor",
}


# --------------------------------------------------------------------------------------------
# lower bound
# --------------------------------------------------------------------------------------------


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


def _class_subsets(k: int) -> list[np.ndarray]:
    if k <= 6:
        return [
            np.asarray([(m >> j) & 1 for j in range(k)], dtype=bool) for m in range(1, (1 << k) - 1)
        ]
    # Many classes: only "sizes >= g" and "sizes <= g" sets (still valid, cheaper).
    out = []
    for j in range(1, k):
        mask = np.arange(k) >= j
        out.append(mask)
        out.append(~mask)
    return out


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
    subsets = _class_subsets(K)
    caps = np.asarray([gpus_per_class[q].sum() for q in subsets])
    notq = ~np.stack(subsets)  # [Q, K]
    bags_per_class = np.bincount(p.cls, minlength=K)
    # counting test per class k: candidates sorted by their cost in k
    order_k = [tc[:, k].argsort(kind="stable") for k in range(K)]
    all_q = np.ones(K, dtype=bool)

    def too_many(x: float, members: np.ndarray, q: np.ndarray) -> bool:
        need = int(members.sum())
        room = 0
        for k in q.nonzero()[0].tolist():
            vals = tc[order_k[k], k][members[order_k[k]]]  # ascending
            room += int(bags_per_class[k]) * int(
                vals.cumsum().searchsorted(x * (1 + 1e-12), side="right")
            )
            if room >= need:
                return False
        return True

    def refuted(x: float) -> bool:
        allowed = tc <= x  # [m, K]
        if not allowed.any(axis=1).all():
            return True
        w = np.where(allowed, wc, np.inf).min(axis=1)  # [m]
        # a sequence counts for Q iff none of its allowed classes lies outside Q
        inside_only = ~(allowed[:, None, :] & notq[None, :, :]).any(axis=2)  # [m, Q]
        need = w @ inside_only
        if (need > x * caps * (1 + 1e-12)).any():
            return True
        for qi in inside_only.any(axis=0).nonzero()[0].tolist():
            if too_many(x, inside_only[:, qi], subsets[qi]):
                return True
        return too_many(x, np.ones(tc.shape[0], dtype=bool), all_q)

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


# --------------------------------------------------------------------------------------------
# reference greedy (KnapFormer paper / public code), reproduced for comparison
# --------------------------------------------------------------------------------------------


@register_solver("reference")
def solve_reference(p: Problem) -> tuple[np.ndarray, dict[str, Any]]:
    """Published greedy: capacity C = total/N per GPU, bag capacity g*C; sequences by decreasing
    workload; candidates = bags with remaining capacity >= W and L >= g (else every bag of the
    largest size); pick the lowest occupancy ratio (ties: lowest bag index)."""
    n, B = p.n, p.num_bags
    bag = np.zeros(n, dtype=np.int64)
    if n == 0:
        return bag, {}
    K = p.class_sizes.shape[0]
    w1 = p.cost.t(p.lengths, 1)
    C = float(w1.sum()) / p.num_gpus
    order = (-w1).argsort(kind="stable")
    # Within one size class, lowest occupancy == lowest assigned work; the capacity test is
    # then monotone too, so a heap per class finds the candidate exactly.
    heaps: list[list[tuple[float, int]]] = [[] for _ in range(K)]
    for b in range(B):
        heaps[int(p.cls[b])].append((0.0, b))
    for h in heaps:
        heapq.heapify(h)
    if K == 1:
        # One class: the candidate (if any) and the fallback are both the least-used bag.
        h = heaps[0]
        g0 = float(p.class_sizes[0])
        out = []
        push = out.append
        for ws in (p.tg[order, 0] * g0).tolist():
            used, b = h[0]
            heapq.heapreplace(h, (used + ws, b))
            push(b)
        bag[order] = out
        return bag, {}
    W = p.tg[order] * p.class_sizes[None, :]  # workload accounted in a g_k bag (= W for flops)
    caps = [float(g) * C for g in p.class_sizes.tolist()]
    gs = p.class_sizes.tolist()
    largest = K - 1
    ks = range(K)
    out = []
    push = out.append
    for ws, ln in zip(W.tolist(), p.lengths[order].tolist(), strict=True):
        best_k = -1
        best_ratio = 0.0
        best_b = 0
        for k in ks:
            if ln < gs[k]:
                break  # sizes ascend: no larger class qualifies either
            used, b = heaps[k][0]
            cap = caps[k]
            if cap - used >= ws[k]:
                ratio = used / cap if cap > 0 else 0.0
                if best_k < 0 or ratio < best_ratio or (ratio == best_ratio and b < best_b):
                    best_k, best_ratio, best_b = k, ratio, b
        if best_k < 0:
            best_k = largest
        h = heaps[best_k]
        used, b = h[0]
        heapq.heapreplace(h, (used + ws[best_k], b))
        push(b)
    bag[order] = out
    return bag, {}


# --------------------------------------------------------------------------------------------
# ours: LPT on uniform machines + local search + locality
# --------------------------------------------------------------------------------------------


def _lpt_into(p: Problem, items: np.ndarray, bag: np.ndarray, load: np.ndarray) -> None:
    """LPT (in place): each item, in the given order, goes to the bag minimising its resulting
    per-GPU finish time; ties go to the item's home bag, then to the lowest bag index.

    One heap per bag-size class: within a class the least-loaded bag is the best one, so each
    item costs O(K log B) for K distinct bag sizes."""
    if items.size == 0:
        return
    B, K = p.num_bags, p.class_sizes.shape[0]
    loadl = load.tolist()
    cls = p.cls.tolist()
    heaps: list[list[tuple[float, int]]] = [[] for _ in range(K)]
    for b in range(B):
        heaps[cls[b]].append((loadl[b], b))
    for h in heaps:
        heapq.heapify(h)
    tl = p.tg.take(items, axis=0).tolist()
    homes = p.home[items].tolist()
    out: list[int] = []
    push = out.append
    heappush, heapreplace, heappop = heapq.heappush, heapq.heapreplace, heapq.heappop
    ks = range(K)
    thr = 1.0 + _REL_EPS
    inf = float("inf")
    # Invariant: every heap's top is valid (its load is the bag's current load); stale
    # entries (older, smaller loads of a bag) sit below and are dropped when they surface.
    for ts, hb in zip(tl, homes, strict=True):
        best = inf
        best_k = 0
        for k in ks:  # no class heap is ever empty
            f = heaps[k][0][0] + ts[k]
            if f < best:
                best, best_k = f, k
        hk = cls[hb]
        fh = loadl[hb] + ts[hk]
        if fh <= best * thr:  # home (ties go home)
            h = heaps[hk]
            loadl[hb] = fh
            if h[0][1] == hb:
                heapreplace(h, (fh, hb))
            else:
                heappush(h, (fh, hb))  # its old entry is now stale
            b = hb
        else:
            h = heaps[best_k]
            b = h[0][1]
            loadl[b] = best
            heapreplace(h, (best, b))
        while h[0][0] != loadl[h[0][1]]:  # loads only grow: stale entries are smaller
            heappop(h)
        push(b)
    bag[items] = out
    load[:] = loadl


def _lpt_budget_into(p: Problem, items: np.ndarray, bag: np.ndarray, load: np.ndarray) -> None:
    """LPT restricted to bags whose fullest GPU stays within ``max_tokens`` tokens."""
    budget = p.max_tokens
    assert budget is not None
    tokk = p.tok()
    placed = (bag >= 0).nonzero()[0]
    toks = np.bincount(
        bag[placed], weights=tokk[placed, p.cls[bag[placed]]], minlength=p.num_bags
    ).astype(np.int64)
    idx = np.arange(p.num_bags)
    for s in items.tolist():
        add = p.tg[s, p.cls]
        addt = tokk[s, p.cls]
        ok = toks + addt <= budget
        if not ok.any():
            raise InfeasibleError(
                f"no bag can take a sequence of {int(p.lengths[s])} tokens within "
                f"max_tokens_per_gpu={budget} (greedy placement; try a larger budget or bags)"
            )
        f = np.where(ok, load + add, np.inf)
        best = f.min()
        hb = int(p.home[s])
        b = hb if ok[hb] and f[hb] <= best * (1.0 + _REL_EPS) else int(idx[f == best][0])
        bag[s] = b
        load[b] += add[b]
        toks[b] += addt[b]


def _pack_tokens(p: Problem) -> tuple[np.ndarray, np.ndarray]:
    """Budget fallback: worst-fit decreasing on tokens (each sequence, longest first, to the
    bag with the most token room left on its fullest GPU), ignoring cost; raises if stuck."""
    budget = p.max_tokens
    assert budget is not None
    tokk = p.tok()
    bag = np.full(p.n, -1, dtype=np.int64)
    toks = np.zeros(p.num_bags, dtype=np.int64)
    for s in (-p.lengths).argsort(kind="stable").tolist():
        room = budget - toks - tokk[s, p.cls]
        b = int(np.argmax(room))
        if room[b] < 0:
            raise InfeasibleError(
                f"found no assignment within max_tokens_per_gpu={budget} (greedy and "
                f"worst-fit packing both failed; a sequence of {int(p.lengths[s])} tokens "
                "did not fit)"
            )
        bag[s] = b
        toks[b] += tokk[s, p.cls[b]]
    return bag, p.bag_loads(bag)


def _keep_home(p: Problem, level: float, order: np.ndarray) -> np.ndarray:
    """Locality: per home bag, keep the largest sequences that fit under ``level``.

    Bags whose home work fits keep everything; in the others, sequences (largest first) stay
    while the bag stays at or under ``level`` (two vectorised passes approximate the
    skip-and-continue greedy). Returns a bool mask of kept sequences."""
    n = p.n
    if n == 0:
        return np.zeros(0, dtype=bool)
    w = p.tg_home  # per-GPU cost at home
    # group by home bag, largest first inside each group (order is already largest first)
    perm = order[_stable_argsort_int(p.home[order])]
    hb = p.home[perm]
    wp = w[perm]
    new_grp = np.empty(n, dtype=bool)
    new_grp[0] = True
    np.not_equal(hb[1:], hb[:-1], out=new_grp[1:])
    gid = new_grp.cumsum() - 1  # group index of every position
    starts = new_grp.nonzero()[0]
    keep = np.zeros(n, dtype=bool)
    room = np.full(p.num_bags, level)
    kept_p = np.zeros(n, dtype=bool)
    for it in range(3):
        if it == 0:  # nothing kept yet, every bag has the whole level as room
            roomh = level
            cand = wp <= level
        else:
            roomh = room[hb]
            cand = ~kept_p & (wp <= roomh)
        wc = np.where(cand, wp, 0.0)
        cs = wc.cumsum()
        # cumulative sum inside each group: subtract the sum before the group's start
        within = cs - (cs[starts] - wc[starts])[gid]
        take = cand & (within <= roomh * (1.0 + _REL_EPS))
        if not take.any():
            break
        kept_p |= take
        # (zeros for the others: the same sums as over the taken ones alone)
        room -= np.bincount(hb, weights=np.where(take, wp, 0.0), minlength=p.num_bags)
    keep[perm[kept_p]] = True
    return keep


def _water_fill_into(
    p: Problem,
    items: np.ndarray,
    bag: np.ndarray,
    load: np.ndarray,
    tgi: np.ndarray | None = None,
) -> np.ndarray:
    """Bulk placement of many small items (sorted largest first): raise the least-loaded bags
    to a common water level, giving each bag the consecutive items that fit entirely in its
    share of the cumulative work. Items straddling two shares are returned (deferred)."""
    if items.size == 0:
        return items
    if tgi is None:  # (callers with many stages pass the rows of p.tg, gathered once)
        tgi = p.tg.take(items, axis=0)
    work = tgi * p.class_sizes[None, :]  # [m, K] GPU-time in each class
    w = work[:, 0]
    tot = float(w.sum())
    if tot <= 0:
        return items
    ratio = work.sum(axis=0) / tot  # GPU-time of the items in class k per unit of w
    slope = p.sizes / ratio[p.cls]  # w absorbed per unit level rise
    o = load.argsort(kind="stable")
    ls = load[o]
    cs = slope[o].cumsum()
    cl = (slope[o] * ls).cumsum()
    # absorbed(level) on [ls[j], ls[j+1]] = cs[j]*level - cl[j]
    absorbed_at = cs * ls - cl
    j = max(int(absorbed_at.searchsorted(tot, side="right")) - 1, 0)
    level = (tot + cl[j]) / cs[j]
    ccap = (np.maximum(0.0, level - load) * slope).cumsum()
    end = w.cumsum()
    start = end - w
    dst = ccap.searchsorted(start, side="right")
    np.minimum(dst, p.num_bags - 1, out=dst)
    fits = end <= ccap[dst] * (1.0 + 1e-12)
    sel = fits.nonzero()[0]
    d = dst[sel]
    bag[items[sel]] = d
    K = tgi.shape[1]
    add = np.ascontiguousarray(tgi).ravel()[sel * K + p.cls[d]]
    load += np.bincount(d, weights=add, minlength=p.num_bags)
    return items[~fits]


def _best_fit_into(
    p: Problem, items: np.ndarray, bag: np.ndarray, load: np.ndarray, level: float
) -> np.ndarray:
    """Best-fit decreasing up to ``level``: each item (largest first) goes to the bag whose
    remaining room under ``level`` it fills best; returns the items that fit nowhere."""
    K = p.class_sizes.shape[0]
    rooms: list[list[tuple[float, int]]] = [[] for _ in range(K)]
    loadl = load.tolist()
    cls = p.cls.tolist()
    for b in range(p.num_bags):
        rooms[cls[b]].append((level - loadl[b], b))
    for r in rooms:
        r.sort()
    # per class: rooms ascending (ties: lower bag first) and their bags, as parallel lists
    keys = [[x[0] for x in r] for r in rooms]
    ids = [[x[1] for x in r] for r in rooms]
    tl = p.tg.take(items, axis=0).tolist()
    left = []
    out_s, out_b = [], []
    bisect_left = bisect.bisect_left
    inf = float("inf")
    ks = range(K)
    for s, ts in zip(items.tolist(), tl, strict=True):
        best_k, best_rest, best_pos = -1, inf, -1
        for k in ks:
            kk, t = keys[k], ts[k]
            pos = bisect_left(kk, t)
            if pos < len(kk):
                rest = kk[pos] - t
                if rest < best_rest:
                    best_k, best_rest, best_pos = k, rest, pos
        if best_k < 0:
            left.append(s)
            continue
        kk, ib = keys[best_k], ids[best_k]
        b = ib.pop(best_pos)
        del kk[best_pos]
        q = bisect_left(kk, best_rest)
        kk.insert(q, best_rest)
        ib.insert(q, b)
        loadl[b] += ts[best_k]
        out_s.append(s)
        out_b.append(b)
    if out_s:
        bag[np.asarray(out_s)] = out_b
    load[:] = loadl
    return np.asarray(left, dtype=np.int64)


def _construct(
    p: Problem, order: np.ndarray, keep: np.ndarray | None, lb: float, stop_gap: float = 1e-4
) -> tuple[np.ndarray, np.ndarray]:
    """Keep (optional) -> LPT on the large items -> water-fill the middle -> best fit (then
    LPT) on the smallest items."""
    n, B = p.n, p.num_bags
    bag = np.full(n, -1, dtype=np.int64)
    load = np.zeros(B)
    if keep is not None and keep.any():
        kept = keep.nonzero()[0]
        bag[kept] = p.home[kept]
        load += np.bincount(p.home[kept], weights=p.tg_home[kept], minlength=B)
        pool = order[~keep[order]]
    else:
        pool = order
    if pool.size == 0:
        return bag, load
    if p.max_tokens is not None:
        _lpt_budget_into(p, pool, bag, load)
        return bag, load
    small = p.tg[pool, 0] <= 0.05 * lb  # per-GPU cost even in the smallest bag
    nbig = int(np.argmax(small)) if small.any() else pool.size
    nbig = max(nbig, min(pool.size, B))  # the first B items are always placed one by one
    big, rest = pool[:nbig], pool[nbig:]
    _lpt_into(p, big, bag, load)
    # Water-fill in stages of halving size; items straddling two bags' shares are placed by
    # LPT right after their stage (on top of a bag still below the level, whose gap the
    # later, smaller items fill); the smallest ~2B items by LPT at the end.
    ntail = min(rest.size, 2 * B + 8)
    i = 0
    end = rest.size - ntail
    tgr = p.tg.take(rest[:end], axis=0) if end > 0 else None
    while i < end:
        assert tgr is not None
        j = end if end - i <= _WF_STOP * B else i + (end - i) // 2
        _lpt_into(p, _water_fill_into(p, rest[i:j], bag, load, tgr[i:j]), bag, load)
        i = j
    # the smallest items fill the remaining gaps best-fit up to the target, LPT for the rest
    left = _best_fit_into(p, rest[end:], bag, load, lb * (1.0 + stop_gap))
    _lpt_into(p, left, bag, load)
    return bag, load


def _first_positions(x: np.ndarray) -> np.ndarray:
    """Positions of the first occurrence of every distinct value of ``x``, ordered by value
    (a stable argsort: cheaper than ``np.unique`` and well defined for repeated values)."""
    o = x.argsort(kind="stable")
    xs = x[o]
    new = np.empty(xs.size, dtype=bool)
    new[:1] = True
    np.not_equal(xs[1:], xs[:-1], out=new[1:])
    return o[new]


def _first_index(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(x, return_index=True)`` for a 1-D int array."""
    first = _first_positions(x)
    return x[first], first


def _pair_round(
    p: Problem,
    bag: np.ndarray,
    load: np.ndarray,
    target: float,
    toks: np.ndarray | None,
    tokk: np.ndarray | None,
    nb: int = 4,
) -> int:
    """One batched improvement round: the bags above ``target`` are paired hottest-with-
    coldest and every pair applies its best move or swap at once (pairs share no bag).
    Returns the number of pairs improved."""
    B = p.num_bags
    # bag selection on plain lists (B is small: numpy calls would cost more than the work)
    loadl = load.tolist()
    hotl = sorted([b for b in range(B) if loadl[b] > target], key=lambda b: -loadl[b])
    if not hotl:
        return 0
    coldl = [b for b in sorted(range(B), key=loadl.__getitem__) if loadl[b] < target]
    npair = min(len(hotl), len(coldl))
    if npair == 0:
        return 0
    hot, cold = np.array(hotl[:npair]), np.array(coldl[:npair])
    cls, tg, budget = p.cls, p.tg, p.max_tokens
    pl = [-1] * B
    for j in range(npair):
        pl[hotl[j]] = j
    pair_h = np.array(pl)
    pl = [-1] * B
    for j in range(npair):
        pl[coldl[j]] = j
    pair_c = np.array(pl)
    pb = pair_h[bag]
    items_h = (pb >= 0).nonzero()[0]
    if items_h.size == 0:
        return 0
    jh = pb[items_h]
    h, c = hot[jh], cold[jh]
    K = tg.shape[1]
    tgf = tg.ravel()  # flat takes are cheaper than 2-D fancy indexing
    # moves of an item from its hot bag to the paired cold bag
    mv = np.maximum(load[h] - tgf[items_h * K + cls[h]], load[c] + tgf[items_h * K + cls[c]])
    if budget is not None:
        mv[toks[c] + tokk[items_h, cls[c]] > budget] = np.inf
    best = np.full(npair, np.inf)
    np.minimum.at(best, jh, mv)
    # swaps with an item of the paired cold bag. Small instances: every pair of items. Large
    # ones: with w the GPU-time of a sequence (class-0 proxy), the ideal partner u of i has
    # w_u = w_i - d* where d* equalises the two bags; the ``nb`` cold items nearest that
    # target (binary search) are evaluated exactly.
    # Pairs that a move already improves skip the swap search (cheap early rounds).
    need = best >= load[hot] * (1.0 - 1e-12)
    pb = pair_c[bag]
    items_c = (pb >= 0).nonzero()[0]
    jc = pb[items_c]
    if need.all():
        ih_all, jh_s, h_s, c_s = items_h, jh, h, c
    else:
        if items_c.size:
            sel = need[jc]
            items_c, jc = items_c[sel], jc[sel]
        keep_h = need[jh]
        ih_all, jh_s, h_s, c_s = items_h[keep_h], jh[keep_h], h[keep_h], c[keep_h]
    # Swap candidates as rows (hot item ri of pair rj) x columns (cold partners u2d, valid
    # where ok2d): per-row values are gathered once per row, not once per candidate.
    ri = rj = u2d = ok2d = None
    if items_c.size and ih_all.size:
        nh = np.bincount(jh_s, minlength=npair)
        ncp = np.bincount(jc, minlength=npair)
        if int((nh * ncp).sum()) <= _ALL_PAIRS_MAX:
            # every (hot item, cold item) pair of each bag pair, grouped by pair, hot items
            # in their order, each with all cold partners in order (no Python loop)
            oh = jh_s.argsort(kind="stable")
            ih_sorted, jq = ih_all[oh], jh_s[oh]
            ic_sorted = items_c[jc.argsort(kind="stable")]
            reps = ncp[jq]
            tot = int(reps.sum())
            if tot:
                ri = ih_sorted.repeat(reps)
                rj = jq.repeat(reps)
                off = np.arange(tot) - (reps.cumsum() - reps).repeat(reps)
                u2d = ic_sorted[(ncp.cumsum() - ncp)[rj] + off][:, None]
        else:
            w = p.w1
            scale = p.w1_scale
            keys = jc + w[items_c] / scale
            o = keys.argsort(kind="stable")
            keys, items_c_s = keys[o], items_c[o]
            lo_j = keys.searchsorted(np.arange(npair), side="left")
            hi_j = keys.searchsorted(np.arange(npair) + 1.0, side="left")
            gh = p.sizes[h_s].astype(np.float64)
            gc = p.sizes[c_s].astype(np.float64)
            dstar = (load[h_s] - load[c_s]) / (1.0 / gh + 1.0 / gc)
            useful = w[ih_all] > dstar  # otherwise even the smallest partner overshoots
            ih, jj = ih_all[useful], jh_s[useful]
            want = jj + (w[ih] - dstar[useful]) / scale
            pos = keys.searchsorted(want, side="left")
            offs = np.arange(-(nb // 2), nb - nb // 2)
            cand = pos[:, None] + offs[None, :]  # [m, nb]
            ok = (cand >= lo_j[jj][:, None]) & (cand < hi_j[jj][:, None])
            if ok.any():
                ri, rj, ok2d = ih, jj, ok
                u2d = items_c_s[cand.clip(0, keys.size - 1)]
    sw2d = None
    if ri is not None:
        assert rj is not None and u2d is not None
        hh, cc = hot[rj], cold[rj]
        khh, kcc = cls[hh], cls[cc]
        iK, uK = ri * K, u2d * K
        sw2d = np.maximum(
            (load[hh] - tgf[iK + khh])[:, None] + tgf[uK + khh[:, None]],
            (load[cc][:, None] - tgf[uK + kcc[:, None]]) + tgf[iK + kcc][:, None],
        )
        if budget is not None:
            tkf = tokk.ravel()
            bad = (toks[hh] - tkf[iK + khh])[:, None] + tkf[uK + khh[:, None]] > budget
            bad |= (toks[cc][:, None] - tkf[uK + kcc[:, None]]) + tkf[iK + kcc][:, None] > budget
            sw2d[bad] = np.inf
        if ok2d is not None:
            sw2d[~ok2d] = np.inf  # (never a pair's best: inf does not improve anything)
        np.minimum.at(best, rj, _row_reduce(sw2d, np.minimum))
    improved = best < load[hot] * (1.0 - 1e-12)
    if not improved.any():
        return 0
    # apply (vectorised; pairs share no bag) the first candidate of each improved pair that
    # reaches its best value: moves first (a move is a swap with a zero-cost dummy item n),
    # then swaps row by row
    n = p.n
    hit = (improved[jh] & (mv <= best[jh])).nonzero()[0]
    cand_j, cand_i, cand_u = jh[hit], items_h[hit], np.full(hit.size, n)
    if sw2d is not None:
        assert ri is not None and rj is not None and u2d is not None
        f = (improved[rj][:, None] & (sw2d <= best[rj][:, None])).ravel().nonzero()[0]
        if f.size:
            row = f // u2d.shape[1]
            cand_j = np.concatenate((cand_j, rj[row]))
            cand_i = np.concatenate((cand_i, ri[row]))
            cand_u = np.concatenate((cand_u, u2d.ravel()[f]))
    js, first = _first_index(cand_j)
    i, u = cand_i[first], cand_u[first]
    src, dst = hot[js], cold[js]
    ks, kd = cls[src], cls[dst]
    tgx = p.tg_ext
    load[src] += tgx[u * K + ks] - tgx[i * K + ks]
    load[dst] += tgx[i * K + kd] - tgx[u * K + kd]
    if toks is not None:
        tkx = p.tok_ext
        toks[src] += tkx[u * K + ks] - tkx[i * K + ks]
        toks[dst] += tkx[i * K + kd] - tkx[u * K + kd]
    bag[i] = dst
    real = u < n
    bag[u[real]] = src[real]
    return int(js.size)


class _State:
    """Mutable assignment state shared by the local-search steps."""

    def __init__(self, p: Problem, bag: np.ndarray, load: np.ndarray) -> None:
        self.p = p
        self.bag = bag.copy()
        self.load = load.copy()
        self.tokk = p.tok() if p.max_tokens is not None else None
        self.toks = p.bag_tokens(self.bag) if p.max_tokens is not None else None
        self._sorted: dict[int, np.ndarray] = {}

    def sorted_by(self, k: int) -> np.ndarray:
        """Item indices sorted by their cost in class k (computed on first use)."""
        if k not in self._sorted:
            self._sorted[k] = self.p.by_cost_asc
        return self._sorted[k]

    def move(self, s: int, dst: int) -> None:
        p, src = self.p, int(self.bag[s])
        ks, kd = p.cls[src], p.cls[dst]
        self.load[src] -= p.tg[s, ks]
        self.load[dst] += p.tg[s, kd]
        if self.toks is not None:
            self.toks[src] -= self.tokk[s, ks]
            self.toks[dst] += self.tokk[s, kd]
        self.bag[s] = dst

    def swap(self, s: int, u: int) -> None:
        bs, bu = int(self.bag[s]), int(self.bag[u])
        self.move(s, bu)
        self.move(u, bs)

    def swap_values(self, sv: np.ndarray, uv: np.ndarray, bm: int) -> np.ndarray:
        """max(new load of bm, new load of u's bag) for swapping sv (in bm) with uv."""
        p, load, bag = self.p, self.load, self.bag
        km = p.cls[bm]
        bu = bag[uv]
        ku = p.cls[bu]
        tg = p.tg
        val = np.maximum(load[bm] - tg[sv, km] + tg[uv, km], load[bu] - tg[uv, ku] + tg[sv, ku])
        if self.toks is not None:
            tk, toks, budget = self.tokk, self.toks, p.max_tokens
            tm = toks[bm] - tk[sv, km] + tk[uv, km]
            tu = toks[bu] - tk[uv, ku] + tk[sv, ku]
            val[(tm > budget) | (tu > budget)] = np.inf
        return val


def _bottleneck_step(st: _State) -> bool:
    """Best move, else best swap, out of the most loaded bag that lowers it without creating
    a bag at or above the old maximum. Swap partners: a window of items sorted by their cost
    in the bottleneck's class (exact for c = e = 0), or every pair on small instances."""
    p, load, bag = st.p, st.load, st.bag
    cls, tg = p.cls, p.tg
    mk = float(load.max())
    bm = int(np.argmax(load))
    km = int(cls[bm])
    inside = (bag == bm).nonzero()[0]
    if inside.size == 0:
        return False
    thr = mk * (1.0 - 1e-12)
    ti = tg.take(inside, axis=0)
    val = np.maximum(load[None, :] + ti[:, cls], (load[bm] - ti[:, km])[:, None])
    val[:, bm] = np.inf
    if st.toks is not None:
        val[st.toks[None, :] + st.tokk[inside][:, cls] > p.max_tokens] = np.inf
    j = int(np.argmin(val))
    if val.flat[j] < thr:
        i, b = divmod(j, p.num_bags)
        s = int(inside[i])
        hb = int(p.home[s])
        if val[i, hb] <= val[i, b] * (1 + _REL_EPS):
            b = hb  # equally good: go home
        st.move(s, b)
        return True
    osorted = st.sorted_by(km)
    osorted = osorted[bag[osorted] != bm]  # items outside bm, by cost in bm's class
    if osorted.size == 0:
        return False
    small = inside.size * osorted.size <= 100_000
    ks = tg[osorted, km]
    room = (mk - load) * p.sizes
    room[bm] = 0.0
    dmax = float(room.max()) / float(p.sizes[bm]) * (1.0 + 1e-9)
    ts = ti[:, km]
    lo = ks.searchsorted(ts - dmax, side="left")
    hi = ks.searchsorted(ts, side="left")
    cap = max(16, 4096 // inside.size)
    if (hi - lo > cap).any():
        centre = ks.searchsorted(ts - 0.5 * dmax, side="left")
        lo = np.maximum(lo, centre - cap // 2)
        hi = np.minimum(hi, lo + cap)
    cnt = np.maximum(hi - lo, 0)
    tot = int(cnt.sum())
    tries = []
    if tot:
        si = np.arange(inside.size).repeat(cnt)
        off = np.arange(tot) - (cnt.cumsum() - cnt).repeat(cnt)
        tries.append((si, osorted[lo[si] + off]))
    if small:  # the window is exact only for c = e = 0: then try every pair
        tries.append((np.arange(inside.size).repeat(osorted.size), np.tile(osorted, inside.size)))
    for si, u_all in tries:
        sv = inside[si]
        val = st.swap_values(sv, u_all, bm)
        j = int(np.argmin(val))
        if val[j] < thr:
            st.swap(int(sv[j]), int(u_all[j]))
            return True
    return False


def _local_search(
    p: Problem,
    bag: np.ndarray,
    load: np.ndarray,
    lb: float,
    max_iters: int,
    stop_gap: float = 1e-4,
    patience: int = 5,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Lower the makespan until within ``stop_gap`` of ``lb``, ``max_iters`` steps, or stuck.

    Each step: a batched round pairing every bag above the target with a cold one; if none
    improves, the best move/swap out of the bottleneck bag; if stuck there, a flattening
    round pairing the bags above the median with those below (each applied change lowers its
    pair's maximum, so the makespan never grows and the sum of squares shrinks), which often
    unlocks the bottleneck."""
    st = _State(p, bag, load)
    it = 0
    target = lb * (1.0 + stop_gap)
    flatten_left = 8
    best_ms, stale = float(st.load.max(initial=0.0)), 0
    while it < max_iters and p.n:
        it += 1
        ms = float(st.load.max())
        if ms <= target:
            break
        # give up after `patience` steps that moved load around without lowering the max
        stale = 0 if ms < best_ms * (1.0 - 1e-12) else stale + 1
        best_ms = min(best_ms, ms)
        if stale > patience:
            break
        if _pair_round(p, st.bag, st.load, target, st.toks, st.tokk):
            continue
        if _bottleneck_step(st):
            continue
        med = float(np.median(st.load))
        if flatten_left > 0 and _pair_round(p, st.bag, st.load, med, st.toks, st.tokk):
            flatten_left -= 1
            continue
        break
    return st.bag, st.load, it


def _locality_pass(p: Problem, bag: np.ndarray, load: np.ndarray, limit: float) -> int:
    """Bring sequences back to their home bag where that bag stays within ``limit``, the most
    staying tokens first. Returns the number of sequences moved."""
    away = (bag != p.home).nonzero()[0]
    if away.size == 0:
        return 0
    hb = p.home[away]
    fits = load[hb] + p.tg_home[away] <= limit
    if not fits.any():
        return 0
    away = away[fits]
    stay = p.stay_home
    away = away[np.lexsort((away, -stay[away]))]
    away = away[stay[away] > 0]
    budget = p.max_tokens
    tokk = p.tok() if budget is not None else None
    toks = p.bag_tokens(bag) if budget is not None else None
    moved = 0
    loadl = load.tolist()
    tgl = p.tg.take(away, axis=0).tolist()
    cls = p.cls.tolist()
    homes = p.home[away].tolist()
    bags = bag[away].tolist()
    for i, s in enumerate(away.tolist()):
        h = homes[i]
        kh = cls[h]
        a = tgl[i][kh]
        if loadl[h] + a > limit:
            continue
        b = bags[i]
        kb = cls[b]
        if toks is not None:
            if toks[h] + tokk[s, kh] > budget:
                continue
            toks[b] -= tokk[s, kb]
            toks[h] += tokk[s, kh]
        loadl[b] -= tgl[i][kb]
        loadl[h] += a
        bag[s] = h
        moved += 1
    if moved:
        load[:] = loadl
    return moved


def _greedy_assignment(
    rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, group: np.ndarray
) -> np.ndarray:
    """Heavy-first matching on a sparse ``m x m`` gain matrix (entries rows/cols/vals > 0, each
    inside one ``group``): repeatedly take every entry that is the largest of both its row and
    its column among the unmatched ones (ties: lowest entry index); unmatched rows then map to
    themselves where possible, else to the free columns of their group in order. Returns
    ``perm`` (row -> column), a permutation within every group."""
    m = group.shape[0]
    perm = np.full(m, -1, dtype=np.int64)
    col_used = np.zeros(m, dtype=bool)
    o = np.lexsort((np.arange(vals.size), -vals))
    r, c = rows[o], cols[o]
    for _ in range(8):  # vectorised rounds; a short tail is finished one by one below
        if not r.size:
            break
        # entries that are the first (= heaviest) of both their row and their column
        is_first = np.zeros(r.size, dtype=np.int8)
        is_first[_first_positions(r)] += 1
        is_first[_first_positions(c)] += 1
        take = (is_first == 2).nonzero()[0]
        perm[r[take]] = c[take]
        col_used[c[take]] = True
        alive = (perm[r] < 0) & ~col_used[c]
        r, c = r[alive], c[alive]
    for i, j in zip(r.tolist(), c.tolist(), strict=True):
        if perm[i] < 0 and not col_used[j]:
            perm[i] = j
            col_used[j] = True
    free_r = (perm < 0).nonzero()[0]
    if free_r.size:
        ident = free_r[~col_used[free_r]]
        perm[ident] = ident
        col_used[ident] = True
        free_r = (perm < 0).nonzero()[0]
        free_c = (~col_used).nonzero()[0]
        # every group has as many free rows as free columns: pair them group by group
        perm[free_r[group[free_r].argsort(kind="stable")]] = free_c[
            group[free_c].argsort(kind="stable")
        ]
    return perm


def _relabel_home(p: Problem, bag: np.ndarray, load: np.ndarray) -> int:
    """Bags of one size are interchangeable: permute whole bag contents among them so that
    more tokens sit in their home bag. Loads (and token counts) are only permuted, so the
    makespan is unchanged. Returns the number of sequences that changed bag."""
    if p.n == 0:
        return 0
    stay = p.stay_home
    B = p.num_bags
    home, cls = p.home, p.cls
    sel = (cls[bag] == cls[home]) & (stay > 0)
    off = sel & (bag != home)
    if not off.any():
        return 0
    same = sel & ~off
    # gain matrix G[b, h]: home tokens of bag b's sequences whose home is h (same class)
    diag = np.bincount(bag[same], weights=stay[same], minlength=B)
    keys = bag[off] * B + home[off]
    if B * B <= 1 << 18:  # dense aggregation is cheaper than a sort
        dense = np.bincount(keys, weights=stay[off], minlength=B * B)
        uk = dense.nonzero()[0]
        vals = dense[uk]
    else:
        uk, inv = np.unique(keys, return_inverse=True)
        vals = np.bincount(inv.ravel(), weights=stay[off])
    r, c = uk // B, uk % B
    if not ((vals > diag[r]) | (vals > diag[c])).any():
        return 0  # every bag's own home tokens dominate: the greedy keeps the identity
    dn = diag.nonzero()[0]
    # (diagonal entries first: on equal gains the greedy keeps a bag where it is)
    rows, cols = np.concatenate([dn, r]), np.concatenate([dn, c])
    allv = np.concatenate([diag[dn], vals])
    perm = _greedy_assignment(rows, cols, allv, cls)
    if allv[perm[rows] == cols].sum() <= diag.sum():
        return 0
    new_bag = perm[bag]
    changed = int((new_bag != bag).sum())
    bag[:] = new_bag
    newload = np.empty_like(load)
    newload[perm] = load
    load[:] = newload
    return changed


def _home_swaps(
    p: Problem, bag: np.ndarray, load: np.ndarray, limit: float, max_apply: int = 2048
) -> int:
    """Swap an away sequence s (in bag b, home h) with an away sequence u of bag h when both
    bags stay within ``limit``: s goes home, and u too if its home is b. Partners are the
    ``nb`` away items of h nearest (by GPU-time) to the middle of the window that keeps both
    bags under the limit (exact for c = e = 0); every candidate is checked exactly, then
    applied best gain first, re-checking loads. Returns the number of swaps."""
    away = (bag != p.home).nonzero()[0]
    if away.size < 2:
        return 0
    stay = p.stay_home
    tgf = p.tg.ravel()
    K = p.tg.shape[1]
    cls, home, sizes = p.cls, p.home, p.sizes
    w, scale = p.w1, p.w1_scale
    keys = bag[away] + w[away] / scale
    o = keys.argsort(kind="stable")
    keys, part = keys[o], away[o]
    s = away[stay[away] > 0]
    h, b = home[s], bag[s]
    lo = keys.searchsorted(h, side="left")
    hi = keys.searchsorted(h + 1.0, side="left")
    has = hi > lo
    s, h, b, lo, hi = s[has], h[has], b[has], lo[has], hi[has]
    if s.size == 0:
        return 0
    room_h = np.maximum(limit - load[h], 0.0) * sizes[h]
    room_b = np.maximum(limit - load[b], 0.0) * sizes[b]
    centre = w[s] + 0.5 * (room_b - room_h)
    pos = keys.searchsorted(h + np.clip(centre, 0.0, None) / scale, side="left")
    nb = 4
    offs = np.arange(-(nb // 2), nb - nb // 2)
    cand = (pos[:, None] + offs[None, :]).ravel()
    rep = np.arange(s.size).repeat(nb)
    valid = (cand >= lo[rep]) & (cand < hi[rep])
    rep, cand = rep[valid], cand[valid]
    si, ui, hh, bb = s[rep], part[cand], h[rep], b[rep]
    kh, kb = cls[hh], cls[bb]
    d_h = tgf[si * K + kh] - tgf[ui * K + kh]
    d_b = tgf[ui * K + kb] - tgf[si * K + kb]
    ok = (load[hh] + d_h <= limit) & (load[bb] + d_b <= limit)
    if p.max_tokens is not None:
        tokk, toks = p.tok(), p.bag_tokens(bag)
        ok &= toks[hh] - tokk[ui, kh] + tokk[si, kh] <= p.max_tokens
        ok &= toks[bb] - tokk[si, kb] + tokk[ui, kb] <= p.max_tokens
    if not ok.any():
        return 0
    si, ui, hh, bb, d_h, d_b = si[ok], ui[ok], hh[ok], bb[ok], d_h[ok], d_b[ok]
    gain = stay[si] + np.where(home[ui] == bb, stay[ui], 0)
    o = np.lexsort((ui, si, -gain))[:max_apply]
    loadl = load.tolist()
    used = np.zeros(p.n, dtype=bool).tolist()
    done_s, done_u = [], []
    tokl = toks.tolist() if p.max_tokens is not None else None
    for i, u, hb, bg, dh, db in zip(
        si[o].tolist(),
        ui[o].tolist(),
        hh[o].tolist(),
        bb[o].tolist(),
        d_h[o].tolist(),
        d_b[o].tolist(),
        strict=True,
    ):
        if used[i] or used[u] or loadl[hb] + dh > limit or loadl[bg] + db > limit:
            continue
        if tokl is not None:
            th = tokl[hb] - int(tokk[u, cls[hb]]) + int(tokk[i, cls[hb]])
            tb = tokl[bg] - int(tokk[i, cls[bg]]) + int(tokk[u, cls[bg]])
            if th > p.max_tokens or tb > p.max_tokens:
                continue
            tokl[hb], tokl[bg] = th, tb
        loadl[hb] += dh
        loadl[bg] += db
        used[i] = used[u] = True
        done_s.append(i)
        done_u.append(u)
    if done_s:
        ds, du = np.asarray(done_s), np.asarray(done_u)
        bs = bag[ds]
        bag[ds] = bag[du]
        bag[du] = bs
        load[:] = loadl
    return len(done_s)


def _makespan(load: np.ndarray) -> float:
    return float(load.max()) if load.size else 0.0


def _home_tokens(p: Problem, bag: np.ndarray) -> int:
    return int(p.lengths[bag == p.home].sum())


@register_solver("ours")
def solve_ours(p: Problem) -> tuple[np.ndarray, dict[str, Any]]:
    """Makespan on uniform machines (a g-bag runs a sequence at per-GPU cost t(L, g)),
    locality-aware.

    Construction (A): keep each bag's home sequences up to the target (the lower bound, or the
    step's bound set by a heavier replica), then place the rest: large ones by LPT (ties go
    home), the bulk by staged water filling, the smallest best-fit up to the target. Then local
    search (batched hot/cold pair rounds, bottleneck moves/swaps, flattening), stopping within
    ``stop_gap`` of the target. If A ends more than 0.1% above it, (B) the same without keeping
    is tried; if still above, the published greedy (+ local search) too, keeping the best, so
    ours is never worse than the reference (always on replicas of <= 4096 sequences; larger
    ones only when 0.5% off). Last, locality at no makespan cost (``locality_slack`` allows
    more): interchangeable bags are relabelled so their contents sit where they came from,
    then sequences go home by moves and, with few sequences per bag, by pairwise swaps. With
    a token budget, placement only uses bags with token room (worst-fit packing as fallback)."""
    n = p.n
    if n == 0:
        return np.zeros(0, dtype=np.int64), {}
    opts = p.options
    slack = float(opts.get("locality_slack", 0.0))
    keep_margin = float(opts.get("keep_margin", 0.01))
    max_iters = int(opts.get("max_iters", 150))
    stop_gap = float(opts.get("stop_gap", 1e-4))
    order = p.by_cost_desc
    # Target: this replica's bound, or the step's if another replica forces a longer step.
    lb = max(p.lb, p.floor)
    info: dict[str, Any] = {"guard_used": False}
    if p.max_tokens is None:
        keep = _keep_home(p, lb * (1.0 - keep_margin), order)
        bag, load = _construct(p, order, keep, lb, stop_gap)
    else:  # token budget: LPT over feasible bags (home ties), else pure token packing
        try:
            bag, load = _construct(p, order, None, lb, stop_gap)
        except InfeasibleError:
            bag, load = _pack_tokens(p)
    bag, load, iters = _local_search(p, bag, load, lb, max_iters, stop_gap)
    if p.max_tokens is None and _makespan(load) > lb * (1.0 + max(1e-3, stop_gap)):
        # Keeping sequences home constrained the packing too much: try plain LPT order.
        bag2, load2 = _construct(p, order, None, lb, stop_gap)
        bag2, load2, it2 = _local_search(p, bag2, load2, lb, max_iters, stop_gap)
        iters += it2
        if _makespan(load2) < _makespan(load) * (1.0 - 1e-12):
            bag, load = bag2, load2
            info["construction"] = "lpt"
    # Guard: the published greedy, kept when better. Always on small/medium instances; on
    # large ones only when we are far from the bound (the greedy costs O(n) Python there).
    guard = opts.get("guard", True)
    gap = _makespan(load) / lb - 1.0 if lb > 0 else 0.0
    if guard and gap > stop_gap and (n <= 4096 or gap > 5e-3):
        try:
            rbag, _ = solve_reference(p)
        except InfeasibleError:
            rbag = None
        if rbag is not None:
            ok = p.max_tokens is None or bool((p.bag_tokens(rbag) <= p.max_tokens).all())
            rload = p.bag_loads(rbag)
            if ok and _makespan(rload) < _makespan(load):
                rbag, rload, it3 = _local_search(p, rbag, rload, lb, max_iters, stop_gap)
                iters += it3
                bag, load = rbag, rload
                info["guard_used"] = True
    info["ls_iters"] = iters
    homed = p.max_tokens is None and "construction" not in info and not info["guard_used"]
    _improve_locality(
        p, bag, load, max(_makespan(load), p.floor) * (1.0 + slack), relabel=not homed
    )
    return bag, info


def _improve_locality(
    p: Problem, bag: np.ndarray, load: np.ndarray, limit: float, relabel: bool = True
) -> None:
    """Keep tokens on their source rank without any bag going above ``limit``: relabel
    interchangeable bags (free), move sequences home, swap pairs so one or both go home,
    then move home again into the room the swaps left.

    With many sequences per bag, an assignment built around kept home sequences gains
    nothing from relabelling or swaps (plain moves fill the gaps; < 0.3% in our
    measurements), so those run only on plans from other constructions or on few
    sequences per bag."""
    few = p.n <= _SWAP_MAX_PER_BAG * p.num_bags
    if relabel or few:
        _relabel_home(p, bag, load)
    _locality_pass(p, bag, load, limit)
    if few and _home_swaps(p, bag, load, limit):
        _locality_pass(p, bag, load, limit)


# --------------------------------------------------------------------------------------------
# exact: HiGHS MILP
# --------------------------------------------------------------------------------------------


@register_solver("exact")
def solve_exact(p: Problem) -> tuple[np.ndarray, dict[str, Any]]:
    """min M s.t. each sequence in one bag, per-GPU load of every bag <= M (and token budget).

    Symmetry breaking: bags of one size are interchangeable, so the i-th sequence (in a fixed
    order) may only use the first i+1 bags of each size class.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    n, B = p.n, p.num_bags
    if n == 0:
        return np.zeros(0, dtype=np.int64), {"optimal": True}
    time_limit = float(p.options.get("time_limit", 10.0))
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
    res = milp(
        c,
        constraints=LinearConstraint(A, np.concatenate(lo_r), np.concatenate(hi_r)),
        integrality=integrality,
        bounds=Bounds(lb_x, ub_x),
        options={"time_limit": time_limit, "disp": False, "mip_rel_gap": 1e-9},
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


# --------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------


def _replica_arrays(
    layout: BagLayout,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Bag sizes, distinct sizes (ascending), size class of every bag and bag of every rank,
    for one replica (all replicas share them; cached per layout object)."""
    cached = _REPLICA_CACHE.get(id(layout))
    if cached is not None and cached[0] is layout:
        return cached[1]
    k = layout.bags_per_replica
    sizes = np.asarray(layout.bag_sizes[:k], dtype=np.int64)
    class_sizes = np.asarray(sorted(set(sizes.tolist())), dtype=np.int64)
    cls = class_sizes.searchsorted(sizes).astype(np.int64)
    bag_of_rank = np.asarray(layout.bag_of_rank[: layout.group_size], dtype=np.int64)
    arrays = (sizes, class_sizes, cls, bag_of_rank)
    for a in arrays:
        a.setflags(write=False)
    if len(_REPLICA_CACHE) >= 64:
        _REPLICA_CACHE.clear()
    _REPLICA_CACHE[id(layout)] = (layout, arrays)
    return arrays


# id(layout) -> (layout, arrays): the layout is kept alive with its entry, so ids stay unique
_REPLICA_CACHE: dict[int, tuple[BagLayout, tuple[np.ndarray, ...]]] = {}


def build_problem(
    lengths: np.ndarray,
    src_local: np.ndarray,
    layout: BagLayout,
    cost: CostModel,
    max_tokens: int | None,
    options: Mapping[str, Any],
) -> Problem:
    """Replica-local instance for sequences ``lengths`` whose source ranks are ``src_local``."""
    sizes, class_sizes, cls, bag_of_rank = _replica_arrays(layout)
    home = bag_of_rank[src_local] if src_local.size else np.zeros(0, dtype=np.int64)
    if type(cost) is CostModel and cost.c == 0.0 and cost.e == 0.0:
        # compute-only model: cost.t's remaining terms add +0.0, so these are the same values
        L = lengths.astype(np.float64)[:, None]
        tg = (cost.a * L + cost.b * L * L) / class_sizes.astype(np.float64)[None, :]
    else:
        tg = np.asarray(cost.t(lengths[:, None], class_sizes[None, :]), dtype=np.float64)
    tg = tg.reshape(lengths.shape[0], class_sizes.shape[0])
    return Problem(
        lengths=lengths,
        home=home,
        sizes=sizes,
        cls=cls,
        class_sizes=class_sizes,
        tg=tg,
        cost=cost,
        max_tokens=max_tokens,
        options=options,
        src=src_local,
    )


def solve(
    lengths: np.ndarray,
    src: np.ndarray,
    layout: BagLayout,
    cost: CostModel,
    solver: str,
    options: Mapping[str, Any],
) -> SolveResult:
    """Solve every replica independently; returns global bag indices and the lower bound."""
    if solver not in SOLVERS:
        raise PlanError(f"unknown solver {solver!r}; choose one of {sorted(SOLVERS)}")
    unknown = sorted(set(options) - _KNOWN_OPTIONS)
    if unknown:
        raise PlanError(f"unknown planner option(s) {unknown}; known: {sorted(_KNOWN_OPTIONS)}")
    max_tokens = options.get("max_tokens_per_gpu")
    if max_tokens is not None:
        if not isinstance(max_tokens, (int, np.integer)) or isinstance(max_tokens, bool):
            raise PlanError(f"max_tokens_per_gpu must be an integer, got {max_tokens!r}")
        if max_tokens < 1:
            raise PlanError(f"max_tokens_per_gpu must be >= 1, got {max_tokens}")
        max_tokens = int(max_tokens)
    fn = SOLVERS[solver]
    group = layout.group_size
    kb = layout.bags_per_replica
    bag = np.zeros(lengths.shape[0], dtype=np.int64)
    seq_cost = np.zeros(lengths.shape[0])
    seq_cost1: np.ndarray | None = np.zeros(lengths.shape[0])
    lb = 0.0
    infos: list[dict[str, Any]] = []
    bounds = src.searchsorted(np.arange(0, layout.world_size + 1, group))
    problems = []
    for r in range(layout.num_replicas):
        a, b = int(bounds[r]), int(bounds[r + 1])
        p = build_problem(lengths[a:b], src[a:b] - r * group, layout, cost, max_tokens, options)
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
            if int(p.class_sizes[0]) == 1:
                seq_cost1[a:b] = p.tg[:, 0]
            else:
                seq_cost1 = None
        ms = _makespan(np.bincount(local, weights=w, minlength=p.num_bags))
        rlb = p.lb
        dual = info.get("mip_dual_bound")
        if info.get("optimal") and p.n:
            rlb = max(rlb, ms * (1.0 - 1e-9))
        elif dual is not None and np.isfinite(dual):
            rlb = max(rlb, float(dual) * (1.0 - 1e-9))
        lb = max(lb, rlb)
        infos.append(info)
    merged: dict[str, Any] = {}
    if infos:
        for key in sorted({k for i in infos for k in i}):
            vals = [i[key] for i in infos if key in i]
            if all(isinstance(v, bool) for v in vals):
                merged[key] = all(vals) if key == "optimal" else any(vals)
            elif all(isinstance(v, (int, float)) for v in vals):
                merged[key] = max(vals)
    return SolveResult(bag, lb, merged, seq_cost, seq_cost1)


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
