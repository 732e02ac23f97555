"""Local search on an assignment: batched hot/cold pair rounds, bottleneck moves and swaps,
flattening rounds. The makespan never grows."""

from __future__ import annotations

from functools import cached_property

import numpy as np

from knapformer.planning.solvers import fast
from knapformer.planning.solvers.bounds import _row_reduce
from knapformer.planning.solvers.problem import _REL_EPS, Problem

_ALL_PAIRS_MAX = 1024  # pair rounds try every swap up to this many pairs, else a window


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
    """:func:`_pair_round_np`, compiled when available."""
    kern = fast.kernels()
    if kern is None:
        return _pair_round_np(p, bag, load, target, toks, tokk, nb)
    budget = -1 if p.max_tokens is None else int(p.max_tokens)
    return int(
        kern.pair_round(
            p.tg, p.w1, p.w1_scale, fast.writable(p.sizes), fast.writable(p.cls), bag, load,
            target, budget, fast.NO_TOKS if toks is None else toks,
            fast.NO_TOKK if tokk is None else tokk, nb, _ALL_PAIRS_MAX, 1e-12,
        )
    )  # fmt: skip


def _pair_round_np(
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
    # per-pair values, gathered per item below (the same numbers as gathering per item)
    load_h, load_c = load[hot], load[cold]
    cls_h, cls_c = cls[hot], cls[cold]
    K = tg.shape[1]
    tgf = tg.ravel()  # flat takes are cheaper than 2-D fancy indexing
    # moves of an item from its hot bag to the paired cold bag
    iK = items_h * K
    mv = np.maximum(load_h[jh] - tgf[iK + cls_h[jh]], load_c[jh] + tgf[iK + cls_c[jh]])
    if budget is not None:
        mv[toks[cold[jh]] + tokk[items_h, cls_c[jh]] > budget] = np.inf
    best = np.full(npair, np.inf)
    np.minimum.at(best, jh, mv)
    # swaps with an item of the paired cold bag. Small instances: every pair of items. Large
    # ones: with w the GPU-time of a sequence (class-0 proxy), the ideal partner u of i has
    # w_u = w_i - d* where d* equalises the two bags; the ``nb`` cold items nearest that
    # target (binary search) are evaluated exactly.
    # Pairs that a move already improves skip the swap search (cheap early rounds).
    need = best >= load_h * (1.0 - 1e-12)
    pb = pair_c[bag]
    items_c = (pb >= 0).nonzero()[0]
    jc = pb[items_c]
    if need.all():
        ih_all, jh_s = items_h, jh
    else:
        if items_c.size:
            sel = need[jc]
            items_c, jc = items_c[sel], jc[sel]
        keep_h = need[jh]
        ih_all, jh_s = items_h[keep_h], jh[keep_h]
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
            gh = p.sizes[hot].astype(np.float64)
            gc = p.sizes[cold].astype(np.float64)
            dstar = ((load_h - load_c) / (1.0 / gh + 1.0 / gc))[jh_s]
            useful = w[ih_all] > dstar  # otherwise even the smallest partner overshoots
            ih, jj = ih_all[useful], jh_s[useful]
            want = jj + (w[ih] - dstar[useful]) / scale
            pos = keys.searchsorted(want, side="left")
            offs = np.arange(-(nb // 2), nb - nb // 2)
            cand = pos[:, None] + offs[None, :]  # [m, nb]
            ok = (cand >= lo_j[jj][:, None]) & (cand < hi_j[jj][:, None])
            if ok.any():
                ri, rj, ok2d = ih, jj, ok
                # (minimum/maximum: the same as clip, without its wrapper's overhead)
                u2d = items_c_s[np.minimum(np.maximum(cand, 0), keys.size - 1)]
    sw2d = None
    if ri is not None:
        assert rj is not None and u2d is not None
        khh, kcc = cls_h[rj], cls_c[rj]
        iK, uK = ri * K, u2d * K
        sw2d = np.maximum(
            (load_h[rj] - tgf[iK + khh])[:, None] + tgf[uK + khh[:, None]],
            (load_c[rj][:, None] - tgf[uK + kcc[:, None]]) + tgf[iK + kcc][:, None],
        )
        if budget is not None:
            hh, cc = hot[rj], cold[rj]
            tkf = tokk.ravel()
            bad = (toks[hh] - tkf[iK + khh])[:, None] + tkf[uK + khh[:, None]] > budget
            bad |= (toks[cc][:, None] - tkf[uK + kcc[:, None]]) + tkf[iK + kcc][:, None] > budget
            sw2d[bad] = np.inf
        if ok2d is not None:
            sw2d[~ok2d] = np.inf  # (never a pair's best: inf does not improve anything)
        np.minimum.at(best, rj, _row_reduce(sw2d, np.minimum))
    improved = best < load_h * (1.0 - 1e-12)
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

    # writable copies of the problem's read-only arrays for the compiled bottleneck step
    # (numba compiles read-only arrays as a type of their own), made once per search
    @cached_property
    def cls(self) -> np.ndarray:
        return fast.writable(self.p.cls)

    @cached_property
    def sizes(self) -> np.ndarray:
        return fast.writable(self.p.sizes)

    @cached_property
    def by_cost_asc(self) -> np.ndarray:
        return fast.writable(self.p.by_cost_asc)

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
    """:func:`_bottleneck_step_np`, compiled when available."""
    k = fast.kernels()
    if k is None:
        return _bottleneck_step_np(st)
    p = st.p
    all_pairs = not (p.cost.c == 0.0 and p.cost.e == 0.0)  # (the window is exact otherwise)
    kind, s, x = k.bottleneck_pick(
        p.tg, st.load, st.bag, st.cls, st.sizes, p.home, st.by_cost_asc, all_pairs,
        -1 if p.max_tokens is None else int(p.max_tokens),
        fast.NO_TOKS if st.toks is None else st.toks, fast.NO_TOKK if st.tokk is None else st.tokk,
        _REL_EPS,
    )  # fmt: skip
    if kind == 1:
        st.move(int(s), int(x))
    elif kind == 2:
        st.swap(int(s), int(x))
    return kind != 0


def _bottleneck_step_np(st: _State) -> bool:
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
    # the window below is exact when costs keep one order in every class (c = e = 0): only
    # otherwise are all pairs tried, on small instances
    exact_window = p.cost.c == 0.0 and p.cost.e == 0.0
    small = not exact_window and inside.size * osorted.size <= 100_000
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
