"""Compiled (numba) inner loops of the planner: the same decisions as the pure-Python/numpy
versions they replace, which stay as the plain references (``fast.py`` picks one; tests
compare them on random and tie-heavy inputs).

Every kernel does the same floating-point operations in the same order as its reference
(no fastmath, no reassociation), keeps the same tie-breaks, and so returns the same plan bit
for bit. Imported only through :func:`knapformer.planning.solvers.fast.kernels`: importing
the planner does not import numba; the first use of a kernel compiles it (then numba's
on-disk cache makes later processes load it in milliseconds).
"""

from __future__ import annotations

import numpy as np
from numba import njit

# ---------------------------------------------------------------------------------------------
# Per-class indexed min-heaps of bags, keyed (key[b], b): one segment heap[off[k]:off[k + 1]]
# per bag-size class, pos[b] the position of bag b in ``heap``. The min of a class is
# heap[off[k]]; the key of a bag only grows, so an update is one sift-down.


@njit(cache=True)
def _less(key, a, b):
    return key[a] < key[b] or (key[a] == key[b] and a < b)


@njit(cache=True)
def _sift_down(heap, pos, start, size, i, key):
    """Restore the heap below local position ``i`` of the segment starting at ``start``."""
    while True:
        c = 2 * i + 1
        if c >= size:
            return
        if c + 1 < size and _less(key, heap[start + c + 1], heap[start + c]):
            c += 1
        a, b = heap[start + i], heap[start + c]
        if not _less(key, b, a):
            return
        heap[start + i], heap[start + c] = b, a
        pos[b], pos[a] = start + i, start + c
        i = c


@njit(cache=True)
def _class_offsets(cls, num_classes):
    """Start of every class's segment when bags are grouped by class (a counting sort)."""
    off = np.zeros(num_classes + 1, dtype=np.int64)
    for b in range(cls.shape[0]):
        off[cls[b] + 1] += 1
    for k in range(num_classes):
        off[k + 1] += off[k]
    return off


@njit(cache=True)
def _class_heaps(cls, num_classes, key):
    """Heaps of the bags of every class (bags in index order, then heapified on ``key``)."""
    nb = cls.shape[0]
    off = _class_offsets(cls, num_classes)
    heap = np.empty(nb, dtype=np.int64)
    pos = np.empty(nb, dtype=np.int64)
    fill = off[:-1].copy()
    for b in range(nb):
        k = cls[b]
        heap[fill[k]] = b
        pos[b] = fill[k]
        fill[k] += 1
    for k in range(num_classes):
        size = off[k + 1] - off[k]
        for i in range(size // 2 - 1, -1, -1):
            _sift_down(heap, pos, off[k], size, i, key)
    return heap, pos, off


# ---------------------------------------------------------------------------------------------
# reference: the published greedy's placement loop


@njit(cache=True)
def reference_assign(wo, lo, hi, cls, num_classes, div):
    """Sequences by decreasing workload ``wo``; each goes to the bag of lowest occupancy among
    the classes ``lo..hi`` (ties: lower class, then lower bag), which then grows by
    ``w / div[class]``. Returns the bag of every sequence, in the given order."""
    occ = np.zeros(cls.shape[0])
    heap, pos, off = _class_heaps(cls, num_classes, occ)
    out = np.empty(wo.shape[0], dtype=np.int64)
    for i in range(wo.shape[0]):
        bk = lo[i]
        b = heap[off[bk]]
        best = occ[b]
        for k in range(lo[i] + 1, hi[i] + 1):
            t = heap[off[k]]
            if occ[t] < best:
                best, b, bk = occ[t], t, k
        occ[b] = best + wo[i] / div[bk]
        _sift_down(heap, pos, off[bk], off[bk + 1] - off[bk], 0, occ)
        out[i] = b
    return out


# ---------------------------------------------------------------------------------------------
# construction


@njit(cache=True)
def lpt_into(tg, items, home, cls, num_classes, bag, load, thr):
    """LPT: each item to the bag minimising its finish time (ties: home, then lowest class,
    then lowest bag); ``bag`` and ``load`` are updated in place."""
    heap, pos, off = _class_heaps(cls, num_classes, load)
    for i in range(items.shape[0]):
        s = items[i]
        best = np.inf
        best_k = 0
        for k in range(num_classes):
            f = load[heap[off[k]]] + tg[s, k]
            if f < best:
                best, best_k = f, k
        hb = home[s]
        hk = cls[hb]
        fh = load[hb] + tg[s, hk]
        if fh <= best * thr:
            load[hb] = fh
            _sift_down(heap, pos, off[hk], off[hk + 1] - off[hk], pos[hb] - off[hk], load)
            b = hb
        else:
            b = heap[off[best_k]]
            load[b] = best
            _sift_down(heap, pos, off[best_k], off[best_k + 1] - off[best_k], 0, load)
        bag[s] = b


@njit(cache=True)
def _bisect_left(keys, start, size, x):
    lo, hi = 0, size
    while lo < hi:
        mid = (lo + hi) // 2
        if keys[start + mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def best_fit_into(tg, items, cls, num_classes, bag, load, level):
    """Best fit up to ``level`` (see ``construction._best_fit_into``): per class, rooms kept
    in a sorted list (ties: lower bag first initially; a room re-inserted goes before equal
    ones, as ``bisect.insort_left``). Returns the items that fit nowhere."""
    nbags = cls.shape[0]
    off = _class_offsets(cls, num_classes)
    cnt = np.zeros(num_classes, dtype=np.int64)
    keys = np.empty(nbags)
    ids = np.empty(nbags, dtype=np.int64)
    for b in range(nbags):
        k = cls[b]
        j = off[k] + cnt[k]
        keys[j] = level - load[b]
        ids[j] = b
        cnt[k] += 1
    for k in range(num_classes):
        a, e = off[k], off[k + 1]
        o = np.argsort(keys[a:e], kind="mergesort")  # stable: equal rooms by bag index
        keys[a:e] = keys[a:e][o]
        ids[a:e] = ids[a:e][o]
    left = np.empty(items.shape[0], dtype=np.int64)
    nleft = 0
    for i in range(items.shape[0]):
        s = items[i]
        best_k, best_rest, best_pos = -1, np.inf, -1
        for k in range(num_classes):
            t = tg[s, k]
            p = _bisect_left(keys, off[k], cnt[k], t)
            if p < cnt[k]:
                rest = keys[off[k] + p] - t
                if rest < best_rest:
                    best_k, best_rest, best_pos = k, rest, p
        if best_k < 0:
            left[nleft] = s
            nleft += 1
            continue
        a = off[best_k]
        b = ids[a + best_pos]
        for j in range(a + best_pos, a + cnt[best_k] - 1):  # delete
            keys[j] = keys[j + 1]
            ids[j] = ids[j + 1]
        q = _bisect_left(keys, a, cnt[best_k] - 1, best_rest)
        for j in range(a + cnt[best_k] - 1, a + q, -1):  # insert at q
            keys[j] = keys[j - 1]
            ids[j] = ids[j - 1]
        keys[a + q] = best_rest
        ids[a + q] = b
        load[b] += tg[s, best_k]
        bag[s] = b
    return left[:nleft]


# ---------------------------------------------------------------------------------------------
# local search: one batched hot/cold pair round


@njit(cache=True)
def _fmax(a, b):
    """``np.maximum`` of two floats (numba's builtin ``max`` is several times slower)."""
    return a if a >= b else b


@njit(cache=True)
def _searchsorted_left(a, x):
    lo, hi = 0, a.shape[0]
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def pair_round(
    tg,
    w,
    scale,
    sizes,
    cls,
    bag,
    load,
    target,
    budget,
    toks,
    tokk,
    nb,
    all_pairs_max,
    eps,
):
    """``local_search._pair_round`` (see there): hot bags (above ``target``, hottest first)
    paired with cold ones (coldest first); every pair applies its best move or swap, the
    first candidate reaching it (moves by item index, then swaps in the reference's row
    order). ``budget < 0``: no token budget (``toks``/``tokk`` unused). Returns the number of
    pairs improved."""
    nbags = load.shape[0]
    n = bag.shape[0]
    has_budget = budget >= 0
    # hot: load > target, by decreasing load (ties: lower bag); cold: < target, increasing
    hc = np.empty(nbags, dtype=np.int64)
    nh = 0
    for b in range(nbags):
        if load[b] > target:
            hc[nh] = b
            nh += 1
    if nh == 0:
        return 0
    hot_all = hc[:nh][np.argsort(-load[hc[:nh]], kind="mergesort")]
    by_load = np.argsort(load, kind="mergesort")
    cold_all = np.empty(nbags, dtype=np.int64)
    nc = 0
    for j in range(nbags):
        b = by_load[j]
        if load[b] < target:
            cold_all[nc] = b
            nc += 1
    npair = nh if nh < nc else nc
    if npair == 0:
        return 0
    hot, cold = hot_all[:npair], cold_all[:npair]
    pair_h = np.full(nbags, -1, dtype=np.int64)
    pair_c = np.full(nbags, -1, dtype=np.int64)
    for j in range(npair):
        pair_h[hot[j]] = j
        pair_c[cold[j]] = j
    load_h = np.empty(npair)
    load_c = np.empty(npair)
    for j in range(npair):
        load_h[j] = load[hot[j]]
        load_c[j] = load[cold[j]]
    # moves out of every hot bag into its cold partner
    items_h = np.empty(n, dtype=np.int64)
    nih = 0
    for s in range(n):
        if pair_h[bag[s]] >= 0:
            items_h[nih] = s
            nih += 1
    if nih == 0:
        return 0
    items_h = items_h[:nih]
    mv = np.empty(nih)
    best = np.full(npair, np.inf)
    for t in range(nih):
        s = items_h[t]
        j = pair_h[bag[s]]
        kh, kc = cls[hot[j]], cls[cold[j]]
        v = _fmax(load_h[j] - tg[s, kh], load_c[j] + tg[s, kc])
        if has_budget and toks[cold[j]] + tokk[s, kc] > budget:
            v = np.inf
        mv[t] = v
        if v < best[j]:
            best[j] = v
    need = np.empty(npair, dtype=np.bool_)
    for j in range(npair):
        need[j] = best[j] >= load_h[j] * (1.0 - eps)
    # swap candidates of the pairs no move improves: hot items (index order) x cold partners
    ih = np.empty(nih, dtype=np.int64)
    nhi = 0
    nh_p = np.zeros(npair, dtype=np.int64)
    for t in range(nih):
        s = items_h[t]
        j = pair_h[bag[s]]
        if need[j]:
            ih[nhi] = s
            nhi += 1
            nh_p[j] += 1
    ic = np.empty(n, dtype=np.int64)
    nci = 0
    nc_p = np.zeros(npair, dtype=np.int64)
    for s in range(n):
        j = pair_c[bag[s]]
        if j >= 0 and need[j]:
            ic[nci] = s
            nci += 1
            nc_p[j] += 1
    # candidates (pair, hot item, cold item, value), grouped by pair in the reference's order
    cj = np.empty(0, dtype=np.int64)
    ci = np.empty(0, dtype=np.int64)
    cu = np.empty(0, dtype=np.int64)
    cv = np.empty(0)
    ncand = 0
    if nci and nhi:
        tot = 0
        for j in range(npair):
            tot += nh_p[j] * nc_p[j]
        if tot <= all_pairs_max:
            cstart = np.zeros(npair + 1, dtype=np.int64)
            for j in range(npair):
                cstart[j + 1] = cstart[j] + nc_p[j]
            cold_sorted = np.empty(nci, dtype=np.int64)
            fill = cstart[:-1].copy()
            for t in range(nci):
                s = ic[t]
                j = pair_c[bag[s]]
                cold_sorted[fill[j]] = s
                fill[j] += 1
            cj = np.empty(tot, dtype=np.int64)
            ci = np.empty(tot, dtype=np.int64)
            cu = np.empty(tot, dtype=np.int64)
            cv = np.empty(tot)
            for t in range(nhi):
                i = ih[t]
                j = pair_h[bag[i]]
                for q in range(cstart[j], cstart[j + 1]):
                    cj[ncand] = j
                    ci[ncand] = i
                    cu[ncand] = cold_sorted[q]
                    ncand += 1
        else:
            keys = np.empty(nci)
            for t in range(nci):
                s = ic[t]
                keys[t] = pair_c[bag[s]] + w[s] / scale
            o = np.argsort(keys, kind="mergesort")
            keys = keys[o]
            ic_s = ic[:nci][o]
            lo_j = np.empty(npair, dtype=np.int64)
            hi_j = np.empty(npair, dtype=np.int64)
            dstar = np.empty(npair)
            for j in range(npair):
                lo_j[j] = _searchsorted_left(keys, float(j))
                hi_j[j] = _searchsorted_left(keys, j + 1.0)
                gh = float(sizes[hot[j]])
                gc = float(sizes[cold[j]])
                dstar[j] = (load_h[j] - load_c[j]) / (1.0 / gh + 1.0 / gc)
            cj = np.empty(nhi * nb, dtype=np.int64)
            ci = np.empty(nhi * nb, dtype=np.int64)
            cu = np.empty(nhi * nb, dtype=np.int64)
            cv = np.empty(nhi * nb)
            half = nb // 2
            for t in range(nhi):
                i = ih[t]
                j = pair_h[bag[i]]
                if not w[i] > dstar[j]:
                    continue
                want = j + (w[i] - dstar[j]) / scale
                p0 = _searchsorted_left(keys, want)
                for off in range(-half, nb - half):
                    c = p0 + off
                    if c >= lo_j[j] and c < hi_j[j]:
                        cj[ncand] = j
                        ci[ncand] = i
                        cu[ncand] = ic_s[c]
                        ncand += 1
        for q in range(ncand):
            j, i, u = cj[q], ci[q], cu[q]
            kh, kc = cls[hot[j]], cls[cold[j]]
            v = _fmax((load_h[j] - tg[i, kh]) + tg[u, kh], (load_c[j] - tg[u, kc]) + tg[i, kc])
            if has_budget and (
                (toks[hot[j]] - tokk[i, kh]) + tokk[u, kh] > budget
                or (toks[cold[j]] - tokk[u, kc]) + tokk[i, kc] > budget
            ):
                v = np.inf
            cv[q] = v
            if v < best[j]:
                best[j] = v
    # apply the first candidate of every improved pair that reaches the pair's best value
    chosen_i = np.full(npair, -1, dtype=np.int64)
    chosen_u = np.full(npair, n, dtype=np.int64)
    any_improved = False
    improved = np.empty(npair, dtype=np.bool_)
    for j in range(npair):
        improved[j] = best[j] < load_h[j] * (1.0 - eps)
        any_improved = any_improved or improved[j]
    if not any_improved:
        return 0
    for t in range(nih):
        s = items_h[t]
        j = pair_h[bag[s]]
        if improved[j] and chosen_i[j] < 0 and mv[t] <= best[j]:
            chosen_i[j] = s
    for q in range(ncand):
        j = cj[q]
        if improved[j] and chosen_i[j] < 0 and cv[q] <= best[j]:
            chosen_i[j] = ci[q]
            chosen_u[j] = cu[q]
    count = 0
    for j in range(npair):
        if not improved[j]:
            continue
        i, u = chosen_i[j], chosen_u[j]
        src, dst = hot[j], cold[j]
        ks, kd = cls[src], cls[dst]
        tu_s = tg[u, ks] if u < n else 0.0
        tu_d = tg[u, kd] if u < n else 0.0
        load[src] += tu_s - tg[i, ks]
        load[dst] += tg[i, kd] - tu_d
        if has_budget:
            ku_s = tokk[u, ks] if u < n else 0
            ku_d = tokk[u, kd] if u < n else 0
            toks[src] += ku_s - tokk[i, ks]
            toks[dst] += tokk[i, kd] - ku_d
        bag[i] = dst
        if u < n:
            bag[u] = src
        count += 1
    return count


# ---------------------------------------------------------------------------------------------
# The bottleneck step of the local search (local_search._bottleneck_step_np).


@njit(cache=True)
def _swap_value(tg, load, bag, cls, bm, km, s, u, budget, toks, tokk):
    """max(new load of bm, new load of u's bag) for swapping s (in bm) with u; inf if a bag
    would exceed the token budget (``budget < 0``: none)."""
    bu = bag[u]
    ku = cls[bu]
    if budget >= 0:
        tm = toks[bm] - tokk[s, km] + tokk[u, km]
        tu = toks[bu] - tokk[u, ku] + tokk[s, ku]
        if tm > budget or tu > budget:
            return np.inf
    return _fmax(load[bm] - tg[s, km] + tg[u, km], load[bu] - tg[u, ku] + tg[s, ku])


@njit(cache=True)
def bottleneck_pick(
    tg, load, bag, cls, sizes, home, by_cost_asc, all_pairs, budget, toks, tokk, rel_eps
):
    """The change ``_bottleneck_step_np`` makes, as ``(kind, s, x)``: kind 0 none, 1 move
    item s to bag x, 2 swap item s (in the bottleneck bag) with item x. ``all_pairs``: also
    try every pair when the window finds nothing (the reference's ``small`` case)."""
    n, B = bag.shape[0], load.shape[0]
    bm = 0
    for b in range(1, B):  # (the first maximum, as np.argmax)
        if load[b] > load[bm]:
            bm = b
    mk = load[bm]
    km = cls[bm]
    ni = 0
    for s in range(n):
        if bag[s] == bm:
            ni += 1
    if ni == 0:
        return 0, -1, -1
    inside = np.empty(ni, dtype=np.int64)
    j = 0
    for s in range(n):
        if bag[s] == bm:
            inside[j] = s
            j += 1
    thr = mk * (1.0 - 1e-12)
    # best move out of bm: the first minimum in (item, bag) order
    best, bi, bb = np.inf, -1, -1
    for i in range(ni):
        s = inside[i]
        rest = load[bm] - tg[s, km]
        for b in range(B):
            if b == bm or (budget >= 0 and toks[b] + tokk[s, cls[b]] > budget):
                continue
            v = _fmax(load[b] + tg[s, cls[b]], rest)
            if v < best:
                best, bi, bb = v, i, b
    if bi >= 0 and best < thr:
        s = inside[bi]
        hb = home[s]
        if hb != bm and not (budget >= 0 and toks[hb] + tokk[s, cls[hb]] > budget):
            vh = _fmax(load[hb] + tg[s, cls[hb]], load[bm] - tg[s, km])
            if vh <= best * (1.0 + rel_eps):
                bb = hb  # equally good: go home
        return 1, s, bb
    # swaps: partners outside bm, by their cost in bm's class
    no = 0
    for u in by_cost_asc:
        if bag[u] != bm:
            no += 1
    if no == 0:
        return 0, -1, -1
    osorted = np.empty(no, dtype=np.int64)
    ks = np.empty(no)
    j = 0
    for u in by_cost_asc:
        if bag[u] != bm:
            osorted[j] = u
            ks[j] = tg[u, km]
            j += 1
    rmax = 0.0
    for b in range(B):
        r = 0.0 if b == bm else (mk - load[b]) * sizes[b]
        if b == 0 or r > rmax:
            rmax = r
    dmax = rmax / float(sizes[bm]) * (1.0 + 1e-9)
    lo = np.empty(ni, dtype=np.int64)
    hi = np.empty(ni, dtype=np.int64)
    cap = max(16, 4096 // ni)
    wide = False
    for i in range(ni):
        ts = tg[inside[i], km]
        lo[i] = _searchsorted_left(ks, ts - dmax)
        hi[i] = _searchsorted_left(ks, ts)
        wide |= hi[i] - lo[i] > cap
    if wide:
        for i in range(ni):
            centre = _searchsorted_left(ks, tg[inside[i], km] - 0.5 * dmax)
            lo[i] = max(lo[i], centre - cap // 2)
            hi[i] = min(hi[i], lo[i] + cap)
    best, bs, bu = _best_swap(tg, load, bag, cls, bm, km, inside, osorted, budget, toks, tokk,
                              lo, hi)  # fmt: skip
    if bs >= 0 and best < thr:
        return 2, bs, bu
    if all_pairs and ni * no <= 100_000:
        lo[:] = 0
        hi[:] = no
        best, bs, bu = _best_swap(tg, load, bag, cls, bm, km, inside, osorted, budget, toks,
                                  tokk, lo, hi)  # fmt: skip
        if bs >= 0 and best < thr:
            return 2, bs, bu
    return 0, -1, -1


@njit(cache=True)
def _best_swap(tg, load, bag, cls, bm, km, inside, osorted, budget, toks, tokk, lo, hi):
    """The first smallest swap value of inside[i] with osorted[lo[i]:hi[i]], over i."""
    best, bs, bu = np.inf, -1, -1
    for i in range(inside.shape[0]):
        s = inside[i]
        for q in range(lo[i], hi[i]):
            u = osorted[q]
            v = _swap_value(tg, load, bag, cls, bm, km, s, u, budget, toks, tokk)
            if v < best:
                best, bs, bu = v, s, u
    return best, bs, bu
