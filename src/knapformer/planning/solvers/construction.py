"""Construction heuristics for the makespan search: keep home, LPT, water filling, best fit,
and the token-budget variants."""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from knapformer.planning.errors import InfeasibleError
from knapformer.planning.solvers import fast
from knapformer.planning.solvers.problem import _REL_EPS, Problem, _stable_argsort_int

_WF_STOP = 4  # water-fill stages halve until at most this many items per bag remain


def _lpt_into(p: Problem, items: np.ndarray, bag: np.ndarray, load: np.ndarray) -> None:
    """LPT (in place), compiled when available (:func:`_lpt_into_py` is the plain version)."""
    if items.size == 0:
        return
    kern = fast.kernels()
    if kern is None:
        _lpt_into_py(p, items, bag, load)
        return
    K = p.class_sizes.shape[0]
    kern.lpt_into(
        p.tg, fast.writable(items), fast.writable(p.home), fast.writable(p.cls), K, bag, load,
        1.0 + _REL_EPS,
    )  # fmt: skip


def _lpt_into_py(p: Problem, items: np.ndarray, bag: np.ndarray, load: np.ndarray) -> None:
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
            found = _pack_tokens_search(p)
            if found is None:
                raise InfeasibleError(
                    f"found no assignment within max_tokens_per_gpu={budget} (greedy and "
                    f"worst-fit packing failed, and a search of {_PACK_NODES} placements "
                    f"found none; a sequence of {int(p.lengths[s])} tokens did not fit)"
                )
            return found, p.bag_loads(found)
        bag[s] = b
        toks[b] += tokk[s, p.cls[b]]
    return bag, p.bag_loads(bag)


# placements the budget's last-resort search may try (small steps are searched exhaustively)
_PACK_NODES = 200_000


def _pack_tokens_search(p: Problem) -> np.ndarray | None:
    """Depth-first search for any assignment within the token budget, longest sequence first;
    bags of one size with the same tokens are interchangeable, so only one of them is tried.
    Returns None when there is none (or the search ran out of placements)."""
    budget = p.max_tokens
    assert budget is not None
    order = (-p.lengths).argsort(kind="stable").tolist()
    tok = p.tok().tolist()
    cls = p.cls.tolist()
    toks = [0] * p.num_bags
    bag = [-1] * p.n

    def options(s: int) -> list[int]:
        seen: set[tuple[int, int]] = set()
        out = []
        for b in range(p.num_bags):
            key = (cls[b], toks[b])
            if key not in seen and toks[b] + tok[s][cls[b]] <= budget:
                seen.add(key)
                out.append(b)
        return out[::-1]  # popped from the end: bags in index order

    stack = [options(order[0])] if order else []
    nodes = 0
    while stack:
        i = len(stack) - 1
        s = order[i]
        if bag[s] >= 0:  # undo this level's previous choice
            toks[bag[s]] -= tok[s][cls[bag[s]]]
            bag[s] = -1
        if not stack[-1]:
            stack.pop()
            continue
        nodes += 1
        if nodes > _PACK_NODES:
            return None
        b = stack[-1].pop()
        bag[s] = b
        toks[b] += tok[s][cls[b]]
        if i + 1 == len(order):
            break
        stack.append(options(order[i + 1]))
    if any(b < 0 for b in bag):
        return None
    return np.asarray(bag, dtype=np.int64)


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
    """:func:`_best_fit_into_py`, compiled when available."""
    kern = fast.kernels()
    if kern is None:
        return _best_fit_into_py(p, items, bag, load, level)
    K = p.class_sizes.shape[0]
    return kern.best_fit_into(p.tg, fast.writable(items), fast.writable(p.cls), K, bag, load, level)


def _best_fit_into_py(
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
