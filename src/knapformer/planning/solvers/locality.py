"""Locality at no makespan cost: relabel interchangeable bags, move and swap sequences home."""

from __future__ import annotations

import numpy as np

from knapformer.planning.solvers.local_search import _first_positions
from knapformer.planning.solvers.problem import Problem

_SWAP_MAX_PER_BAG = 16  # locality swaps only with at most this many sequences per bag


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


def _home_tokens(p: Problem, bag: np.ndarray) -> int:
    return int(p.lengths[bag == p.home].sum())
