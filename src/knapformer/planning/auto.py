"""Automatic bag layout: pick the spec for a step (or a window of steps) from the lengths.

Candidates are bag layouts whose sizes divide the head count and the node size (so no bag
crosses a node): every homogeneous ``g{g}n{W/g}`` plus mixes of 1-GPU bags with just enough
larger bags for the sequences that need them, estimated from the lengths and the cost model
(whose ``c`` term prices the Ulysses all-to-all, so short sequences are not split without
need). The layout with the lowest modelled makespan wins, near-ties going to fewer tokens
through SP. A ``current`` layout is kept unless the winner is better by more than
``hysteresis`` (process groups are then not rebuilt every step).

Cheap by construction (it runs every step): the cost table is computed once per step for every
allowed bag size; with a ``current`` layout, a quick makespan of it and the other candidates'
lower bounds usually prove that none can beat it by the hysteresis, and nothing else is planned.
Otherwise candidates get a quick plan (LPT construction, a few local-search steps, the cheap
locality moves; no guard, no plan object) in order of their bounds and of the tokens they must
split, and a candidate is skipped when its bounds prove it cannot change the pick: its makespan
is above the near-tie band, or it must split more tokens than the SP tie-break allows while its
bound is too high to push a pooled candidate out of the band. Skipped candidates are checked
again against the final set, so the pick is the one over quick plans of every candidate (a test
checks this). The same bags in another node order reuse the winner's plan.

Makespans, bounds and levels here are modelled per-rank step times, exactly as
:meth:`CostModel.rank_time` gives them: a bag's planned load plus ``f`` (every rank) and
``u * (g-1)/g`` (a rank of a g-bag). ``f`` shifts every layout alike, but ``u`` makes layouts with
larger bags cost more than their loads say, so it can change which layout wins. (Within a
layout the quick plans balance the loads alone, as the planner does.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

import numpy as np

from knapformer.planning import solvers
from knapformer.planning.cost import CostModel
from knapformer.planning.layout import BagLayout, LayoutError, format_spec, parse_terms
from knapformer.planning.plan import validate_lengths
from knapformer.planning.solvers import construction, local_search, locality
from knapformer.planning.solvers.problem import CostTable, Problem

__all__ = [
    "Candidate",
    "allowed_bag_sizes",
    "candidate_specs",
    "choose_layout",
    "evaluate_candidates",
    "local_ordering",
    "make_simulator_chooser",
    "spans_nodes",
]

# parsed layouts are immutable: share them (and the solvers' per-layout caches) across steps
_parse = lru_cache(maxsize=512)(BagLayout.parse)
_TIE_TOL = 1e-3  # makespans within this relative distance count as equal
_QUICK_GAP = 5e-4  # quick plans of candidates stop this close to their bound
_QUICK_ITERS = 4  # ... or after this many local-search steps
_SP_TOL = 0.002  # near-tied layouts whose SP token shares differ by less: fewer moves win
_MOVE_TOL = 2e-4  # ... if their makespans are this close (relative)


def allowed_bag_sizes(world_size: int, num_heads: int, gpus_per_node: int) -> list[int]:
    """Bag sizes that divide the head count and the node size (and fit in the world)."""
    if world_size < 1 or num_heads < 1 or gpus_per_node < 1:
        raise LayoutError("world_size, num_heads and gpus_per_node must be >= 1")
    node = min(gpus_per_node, world_size)
    return [g for g in range(1, node + 1) if num_heads % g == 0 and gpus_per_node % g == 0]


def spans_nodes(layout: BagLayout, gpus_per_node: int) -> bool:
    """True if some bag has ranks on two nodes."""
    return any(r[0] // gpus_per_node != r[-1] // gpus_per_node for r in layout.bag_ranks)


def _spec_for(counts: dict[int, int], world: int, gpus_per_node: int) -> str | None:
    """Spec with ``counts[g]`` bags of size g (ascending sizes, else descending) that covers
    ``world`` GPUs with no bag crossing a node; None if impossible."""
    return _spec_for_terms(
        tuple((g, n) for g, n in sorted(counts.items()) if n > 0), world, gpus_per_node
    )


@lru_cache(maxsize=4096)
def _spec_for_terms(
    terms: tuple[tuple[int, int], ...], world: int, gpus_per_node: int
) -> str | None:
    """:func:`_spec_for` on sorted ``(g, n)`` terms (cached: the same few bag counts come up at
    every step)."""
    if not terms or sum(g * n for g, n in terms) != world:
        return None
    for ordered in (terms, terms[::-1]):
        start, ok = 0, True
        for g, n in ordered:
            for _ in range(n):
                if start // gpus_per_node != (start + g - 1) // gpus_per_node:
                    ok = False
                    break
                start += g
            if not ok:
                break
        if ok:
            return format_spec(ordered)
    return None


def candidate_specs(
    lengths: Sequence[Sequence[int]],
    world_size: int,
    num_heads: int,
    gpus_per_node: int,
    cost: CostModel,
    level: float | None = None,
    table: CostTable | None = None,
    flat: np.ndarray | None = None,
) -> list[str]:
    """Homogeneous layouts plus data-driven mixes of g1 bags and larger bags.

    ``level`` is the modelled per-rank step time (:meth:`CostModel.rank_time`) the mixes are
    sized for (default: perfect balance, or the longest sequence's best time if higher): a
    bag of size g holds sequences costing up to ``level - f - u(g-1)/g``; a second pass at the
    best makespan found is how all-to-all overheads enter the sizing. ``table``: the step's
    cost table, if built; ``flat``: the lengths as ``validate_lengths`` flattens them, if
    already done."""
    sizes = allowed_bag_sizes(world_size, num_heads, gpus_per_node)
    if flat is None:
        flat, _ = validate_lengths(lengths, world_size)
    specs: list[str] = []

    def add(counts: dict[int, int]) -> None:
        s = _spec_for(counts, world_size, gpus_per_node)
        if s is not None and s not in specs:
            specs.append(s)

    for g in sizes:
        if world_size % g == 0:
            add({g: world_size // g})
    if flat.size == 0 or len(sizes) == 1:
        return specs
    # Level a perfect balance would reach; a sequence whose 1-GPU cost exceeds it needs a bag
    # that brings its per-GPU cost under the level. Sequences are indivisible, so the bags
    # such sequences need are counted by first-fit-decreasing packing at that level.
    sz = np.asarray(sizes, dtype=np.int64)
    tg = table.columns(sz) if table is not None else None
    if tg is None:
        tg = CostTable.build(cost, flat, sz).values  # [S, K]; sizes start at 1
    off = np.asarray(cost.rank_time(0.0, sz), dtype=np.float64)  # [K] fixed cost of a rank
    # (no plan beats the longest sequence in its best bag, so the level is at least that)
    if level is None:
        level = max(float(tg[:, 0].sum()) / world_size + off[0], float((tg + off).min(1).max()))
    room = level * (1 + 1e-9) - off  # [K] load a bag of each size may hold
    fits = tg <= room
    big = ~fits[:, 0]
    if not big.any():
        return specs
    gmin_idx = np.where(fits.any(axis=1), np.argmax(fits, axis=1), len(sizes) - 1)

    def bags_needed(items: np.ndarray, k: int) -> int | None:
        loads: list[float] = []
        cap = float(room[k])
        for x in sorted(tg[items, k].tolist(), reverse=True):
            if x > cap:
                return None
            for i, ld in enumerate(loads):
                if ld + x <= cap:
                    loads[i] = ld + x
                    break
            else:
                loads.append(x)
        return len(loads)

    big_items = np.flatnonzero(big)
    # (a) one large size for every sequence that does not fit a single GPU
    for k in range(1, len(sizes)):
        n = bags_needed(big_items, k)
        if n is None:
            continue
        for extra in (0, 1, 2):
            m = n + extra
            if 0 < m * sizes[k] < world_size:
                add({sizes[k]: m, 1: world_size - m * sizes[k]})
    # (b) each sequence in bags of its own smallest sufficient size
    counts: dict[int, int] = {}
    for k in range(1, len(sizes)):
        items = big_items[gmin_idx[big_items] == k]
        if items.size:
            n = bags_needed(items, k)
            if n is not None:
                counts[sizes[k]] = n
    used = sum(g * n for g, n in counts.items())
    for extra in (0, 1):
        c2 = {g: n + extra for g, n in counts.items()}
        used = sum(g * n for g, n in c2.items())
        if 0 < used < world_size:
            add({**c2, 1: world_size - used})
    return specs


@dataclass(frozen=True)
class Candidate:
    spec: str
    makespan: float
    lower_bound: float
    sp_tokens_fraction: float
    tokens_moved_fraction: float


class _Step:
    """One step's lengths, validated once, with the cost table over every allowed bag size
    (computed once: every candidate layout is bounded and planned from it) and the
    candidates evaluated so far."""

    def __init__(
        self,
        lengths: Sequence[Sequence[int]],
        world_size: int,
        num_heads: int,
        cost: CostModel,
        sizes: Sequence[int],
    ) -> None:
        self.lengths = lengths
        self.world_size = world_size
        self.num_heads = num_heads
        self.cost = cost
        self.flat, self.src = validate_lengths(lengths, world_size)
        self.table = CostTable.build(cost, self.flat, {1, *sizes})
        self.total_tokens = int(self.flat.sum())
        self.evaluated: dict[str, Candidate] = {}
        self._bounds: dict[tuple[str, bool], float] = {}
        self._size_bounds: dict[tuple[tuple[int, int], ...], float] = {}
        self._by_ratio: tuple[np.ndarray, np.ndarray] | None = None
        self._sp_floors: dict[tuple[int, float], float] = {}
        self._by_level: dict[float, tuple[np.ndarray, ...]] = {}
        self._pools: dict[tuple[str, ...], tuple[float, Candidate, float]] = {}
        self._bag_counts: dict[str, tuple[int, int]] = {}
        self._bags: dict[str, list[np.ndarray]] = {}  # evaluated plans, one per replica
        self._plans: dict[str, list[tuple[int, Problem, np.ndarray, float]]] = {}
        self._offsets: dict[str, np.ndarray] = {}
        self._problems: dict[str, list[Problem]] = {}
        self._sizes_of: dict[str, tuple[tuple[int, int], ...]] = {}
        self._set_bounds: dict[tuple[int, ...], tuple[float, float, dict[int, float]]] = {}
        self._fixed: dict[int, float] = {}  # rank_time(0, g) per bag size g
        self._work_cols: list[np.ndarray] | None = None
        self._time_cols: list[np.ndarray] | None = None
        self._room1 = float(cost.rank_time(0.0, 1))  # a 1-GPU rank's fixed cost, f

    def layout(self, spec: str) -> BagLayout:
        return _parse(spec, self.world_size, self.num_heads)

    def overhead(self, spec: str) -> np.ndarray:
        """[bags per replica] fixed step cost of a rank of each bag of ``spec``:
        ``rank_time(0, g) = f + u(g-1)/g`` (the same in every replica; cached)."""
        got = self._offsets.get(spec)
        if got is None:
            lay = self.layout(spec)
            got = self._offsets[spec] = self._fixed_costs(lay.bag_sizes[: lay.bags_per_replica])
        return got

    def _fixed_costs(self, sizes: Sequence[int]) -> np.ndarray:
        """``rank_time(0, g)`` for every g of ``sizes`` (cached per size: the cost model is
        elementwise, so this is what one call on all of them gives)."""
        fixed = self._fixed
        missing = sorted({int(g) for g in sizes if g not in fixed})
        if missing:
            m = np.asarray(missing, dtype=np.float64)
            fixed.update(
                zip(missing, np.asarray(self.cost.rank_time(0.0, m)).tolist(), strict=True)
            )
        return np.asarray([fixed[g] for g in sizes], dtype=np.float64)

    def _with_overhead(self, spec: str, load_bound: float) -> float:
        """A lower bound on ``spec``'s modelled makespan from one on its bags' loads: some bag
        carries that load plus at least the smallest fixed cost, and every rank pays its own."""
        off = self.overhead(spec)
        return max(load_bound + float(off.min()), float(off.max()))

    def bound(self, spec: str, strong: bool) -> float:
        """Makespan lower bound of ``spec`` (max over replicas): the simple bound (cheap) or
        the restricted-capacity one."""
        if not strong:
            return self.simple_bound(spec)
        key = (spec, True)
        if key not in self._bounds:
            lb = max((p.lb for p in self.replica_problems(spec)), default=0.0)
            self._bounds[key] = self._with_overhead(spec, lb)
        return self._bounds[key]

    def replica_problems(self, spec: str) -> list[Problem]:
        """The planning problem of each replica of ``spec`` (its rows of the cost table;
        cached, so the strong bound computed for a skip test is the one its plan aims at)."""
        got = self._problems.get(spec)
        if got is None:
            layout = self.layout(spec)
            group = layout.group_size
            cuts = np.searchsorted(self.src, np.arange(0, self.world_size + 1, group)).tolist()
            got = self._problems[spec] = [
                solvers.build_problem(
                    self.flat[a:b],
                    self.src[a:b] - r * group,
                    layout,
                    self.cost,
                    None,
                    {},
                    self.table.rows(a, b),
                )
                for r, (a, b) in enumerate(pairwise(cuts))
            ]
        return got

    def simple_bound(self, spec: str) -> float:
        """``max(total min-work / N, max_s min_g t(L_s, g))`` straight from the table, with the
        ranks' fixed costs ``o_g = rank_time(0, g)``: ``max((min-work + sum_r o_r) / N,
        max_s min_g (t(L_s, g) + o_g), max_g o_g)``; for a one-replica layout it depends only
        on its multiset of bag sizes (cached per multiset)."""
        key = (spec, False)
        if key not in self._bounds:
            self._bounds[key] = self._simple_bound(spec)
        return self._bounds[key]

    def _simple_bound(self, spec: str) -> float:
        terms = self._terms(spec)
        if sum(g * n for g, n in terms) != self.world_size:  # several replicas
            lb = max(
                (solvers.simple_lower_bound(p) for p in self.replica_problems(spec)), default=0.0
            )
            return self._with_overhead(spec, lb)
        counts: dict[int, int] = {}
        for g, n in terms:
            counts[g] = counts.get(g, 0) + n
        key = tuple(sorted(counts.items()))  # the multiset of bag sizes
        got = self._size_bounds.get(key)
        if got is None:
            work, peak, o = self._set_bound(tuple(g for g, _ in key))
            fixed = 0.0  # (summed bag by bag, in ascending size)
            for g, n in key:
                for _ in range(n):
                    fixed += o[g] * g
            got = float(max(work / self.world_size + fixed / self.world_size, peak))
            self._size_bounds[key] = got
        return got

    def _terms(self, spec: str) -> tuple[tuple[int, int], ...]:
        """``spec``'s ``(g, n)`` terms (cached: no layout is built for a bound)."""
        got = self._sizes_of.get(spec)
        if got is None:
            got = self._sizes_of[spec] = parse_terms(spec)
        return got

    def _set_bound(self, sizes: tuple[int, ...]) -> tuple[float, float, dict[int, float]]:
        """What the simple bound of a one-replica layout takes from its *set* of bag sizes
        (cached per set; the multiset only adds the fixed costs): the summed min-work over
        the sizes (``-inf`` without sequences: the bound is then ``max_g o_g``), ``max(max_s
        min_g (t(L_s, g) + o_g), max_g o_g)``, and ``o_g = rank_time(0, g)`` per size."""
        got = self._set_bounds.get(sizes)
        if got is None:
            o = self._fixed_costs(sizes)
            if self.flat.size == 0:
                work, peak = -np.inf, float(o.max())
            else:  # (row minima column by column: exact, and cheaper than axis=1)
                cols = np.searchsorted(self.table.sizes, sizes).tolist()
                work = self._columns_min(self._work_columns(), cols).sum()
                peak = max(self._columns_min(self._time_columns(), cols).max(), o.max())
            got = (work, peak, dict(zip(sizes, o.tolist(), strict=True)))
            self._set_bounds[sizes] = got
        return got

    @staticmethod
    def _columns_min(columns: list[np.ndarray], cols: list[int]) -> np.ndarray:
        """The row minima over the given columns (elementwise: exact)."""
        out = columns[cols[0]].copy()
        for k in cols[1:]:
            np.minimum(out, columns[k], out=out)
        return out

    def _work_columns(self) -> list[np.ndarray]:
        """Per size g of the table: every sequence's work in a g-bag, ``g * t(L, g)``."""
        if self._work_cols is None:
            g = self.table.sizes.astype(np.float64)
            self._work_cols = list(np.ascontiguousarray((self.table.values * g).T))
        return self._work_cols

    def _time_columns(self) -> list[np.ndarray]:
        """Per size g of the table: every sequence's rank time in a g-bag, ``t(L, g) + o_g``."""
        if self._time_cols is None:
            o = self._fixed_costs(self.table.sizes.tolist())
            self._time_cols = list(np.ascontiguousarray((self.table.values + o).T))
        return self._time_cols

    def at_least(self, spec: str, x: float) -> bool:
        """Whether ``spec``'s makespan provably is >= x (tries the cheap bound first)."""
        return any(b >= x for b in self._bounds_of(spec))

    def above(self, spec: str, x: float) -> bool:
        """Whether ``spec``'s makespan provably is > x (cheap bound first)."""
        return any(b > x for b in self._bounds_of(spec))

    def sp_floor(self, spec: str, level: float) -> float:
        """A lower bound on ``spec``'s share of tokens in multi-GPU bags for any plan whose
        makespan (modelled rank time) is at most ``level``. Its n1 one-GPU bags hold at most
        ``n1 * (level - f)`` of cost t(L, 1), and only sequences with t(L, 1) <= level - f: the
        most tokens that fit are bounded by the fractional knapsack (sequences by tokens per
        cost, the last one split)."""
        n1, nbags = self._one_gpu_bags(spec)
        if self.total_tokens == 0 or n1 == nbags:
            return 0.0
        if n1 == 0:
            return 1.0
        level -= self._room1  # (a 1-GPU bag's room for load: minus f)
        key = (n1, level)
        if key not in self._sp_floors:
            self._sp_floors[key] = self._sp_floor(n1, level)
        return self._sp_floors[key]

    def _one_gpu_bags(self, spec: str) -> tuple[int, int]:
        """(one-GPU bags, all bags) of ``spec`` (cached: asked for every pending spec at
        every choice of the next candidate)."""
        got = self._bag_counts.get(spec)
        if got is None:
            terms = self._terms(spec)
            n1 = sum(n for g, n in terms if g == 1)
            reps = self.world_size // sum(g * n for g, n in terms)
            got = self._bag_counts[spec] = (n1 * reps, sum(n for _, n in terms) * reps)
        return got

    def _sp_floor(self, n1: int, level: float) -> float:
        tot = self.total_tokens
        t1, ok, cost, tok = self._by_ratio_at(level)
        cap = n1 * level
        k = int(np.searchsorted(cost, cap, side="right"))  # whole items that fit
        g1 = float(tok[:k].sum())
        if k < t1.size:  # the next eligible item, fractionally
            rest = np.flatnonzero(ok[k:])
            if rest.size:
                j = k + int(rest[0])
                room = cap - (float(cost[k - 1]) if k else 0.0)
                g1 += tok[j] * min(1.0, room / t1[j]) if t1[j] > 0 else tok[j]
        return max(0.0, 1.0 - g1 / tot)

    def _by_ratio_at(self, level: float) -> tuple[np.ndarray, ...]:
        """For :meth:`_sp_floor`: the 1-GPU costs of the sequences by tokens per cost (then
        cost), which of them fit a 1-GPU bag at ``level``, the running cost of those, and
        their tokens (0 for the others); cached per level, shared by every count of 1-GPU
        bags."""
        got = self._by_level.get(level)
        if got is None:
            if self._by_ratio is None:
                t1 = self.table.values[:, 0]
                o = np.lexsort((t1, -(self.flat / np.maximum(t1, 1e-300))))
                self._by_ratio = (t1[o], self.flat[o].astype(np.float64))
            t1, tok = self._by_ratio
            ok = t1 <= level
            got = (t1, ok, np.where(ok, t1, 0.0).cumsum(), np.where(ok, tok, 0.0))
            self._by_level[level] = got
        return got

    def quick_makespan(self, spec: str) -> float:
        """A makespan ``spec`` reaches (an upper bound on its best plan): its quick plan
        before the locality steps (enough to keep a current layout)."""
        if spec in self.evaluated:
            return self.evaluated[spec].makespan
        off = self.overhead(spec)
        return max(
            (float((p.bag_loads(bag) + off).max()) for _, p, bag, _ in self._plan(spec)),
            default=float(off.max()),
        )

    def _plan(self, spec: str) -> list[tuple[int, Problem, np.ndarray, float]]:
        """Per non-empty replica: its index, problem, a quick assignment and the bound it aimed
        at:
        LPT construction up to the simple bound, then a few local-search steps towards the
        strong bound only if that is not already within ``_QUICK_GAP`` (cached)."""
        if spec not in self._plans:
            out = []
            for r, p in enumerate(self.replica_problems(spec)):
                if p.n == 0:
                    continue
                target = solvers.simple_lower_bound(p)
                bag, load = construction._construct(p, p.by_cost_desc, None, target, _QUICK_GAP)
                if float(load.max()) > target * (1.0 + _QUICK_GAP):
                    target = p.lb
                    bag, load, _ = local_search._local_search(
                        p, bag, load, target, _QUICK_ITERS, _QUICK_GAP, patience=1
                    )
                out.append((r, p, bag, target))
            self._plans[spec] = out
        return self._plans[spec]

    def evaluate(self, spec: str, like: str | None = None) -> Candidate:
        """A quick plan of ``spec`` (:meth:`_plan`) with the cheap locality steps at its
        makespan (for the tokens-moved tie-break). No guard, no plan object: the balancer
        plans the chosen layout in full afterwards.

        ``like``: an evaluated spec with the same bags in another order; its plan is reused
        (bags of one size are interchangeable), only the locality steps run again."""
        if spec in self.evaluated:
            return self.evaluated[spec]
        seeds = self._seed_from(like, spec) if like is not None else None
        off = self.overhead(spec)  # (the same bags in any order: the same fixed costs)
        if seeds is not None:
            lb0 = self.evaluated[like].lower_bound - float(off.min())  # type: ignore[index]
            replicas = enumerate(self.replica_problems(spec))
            plans = [(r, p, seeds[r], lb0) for r, p in replicas if p.n]
        else:
            plans = [(r, p, bag.copy(), t) for r, p, bag, t in self._plan(spec)]
        ms = float(off.max())  # (every rank pays its fixed cost, even with nothing to do)
        lb = 0.0
        sp = stay = 0
        bags = [np.zeros(0, dtype=np.int64)] * self.layout(spec).num_replicas
        for r, p, bag, target in plans:
            load = p.bag_loads(bag) + off  # modelled rank times
            mk = float(load.max())
            # locality at no makespan cost: move sequences home (and, for a plan taken from
            # another order of the same bags, first relabel same-size bags)
            if seeds is not None:
                locality._relabel_home(p, bag, load)
            locality._locality_pass(p, bag, load, mk)
            load = p.bag_loads(bag) + off
            ms = max(ms, float(load.max()))
            lb = max(lb, target + float(off.min()))
            sp += int(p.lengths[p.sizes[bag] > 1].sum())
            stay += int(p.stay_home[bag == p.home].sum())
            bags[r] = bag
        tot = self.total_tokens
        cand = Candidate(
            spec=spec,
            makespan=ms,
            lower_bound=lb,
            sp_tokens_fraction=sp / tot if tot else 0.0,
            tokens_moved_fraction=1.0 - stay / tot if tot else 0.0,
        )
        self.evaluated[spec] = cand
        self._bags[spec] = bags
        return cand

    def _seed_from(self, like: str, spec: str) -> list[np.ndarray] | None:
        """``like``'s plan mapped onto ``spec``'s bags (the k-th bag of each size to the k-th
        bag of that size), or None if their replicas do not hold the same bags."""
        a, b = self.layout(like), self.layout(spec)
        if like not in self._bags or a.group_size != b.group_size:
            return None
        ka, kb = a.bags_per_replica, b.bags_per_replica
        sa, sb = np.asarray(a.bag_sizes[:ka]), np.asarray(b.bag_sizes[:kb])
        if ka != kb or sorted(sa.tolist()) != sorted(sb.tolist()):
            return None
        to = np.empty(ka, dtype=np.int64)
        to[np.argsort(sa, kind="stable")] = np.argsort(sb, kind="stable")
        return [to[x] for x in self._bags[like]]

    def _cannot_win(self, spec: str, evaluated: Sequence[Candidate]) -> bool:
        """Whether adding ``spec`` to ``evaluated`` provably leaves :func:`_pick`'s choice as
        it is: either its makespan is above the near-tie band of the best so far, or it splits
        more tokens than the pick's SP tie-break allows while its bound is too high to push a
        candidate of the final pool (see :func:`_pool`) out of the band (cheap bound first,
        the strong one only if needed)."""
        if not evaluated:
            return False
        band, first, worst = self._pool_of(evaluated)
        splits_more = self.sp_floor(spec, band) > first.sp_tokens_fraction + _SP_TOL
        for b in self._bounds_of(spec):
            if b > band or (splits_more and b * (1.0 + _TIE_TOL) >= worst):
                return True
        return False

    def _pool_of(self, evaluated: Sequence[Candidate]) -> tuple[float, Candidate, float]:
        """What :meth:`_cannot_win` needs of :func:`_pool` (cached per set of evaluated specs:
        asked for every pending spec): the near-tie band of the best makespan, the pool's
        first, and the pool's worst makespan. A spec that splits more tokens than the first
        could only change the choice by lowering the best makespan so far that a candidate
        of the final pool leaves the band: it needs a makespan below worst / (1 + _TIE_TOL).
        (If none leaves, the pool's first and the pool stay.)"""
        key = tuple(c.spec for c in evaluated)
        got = self._pools.get(key)
        if got is None:
            best, first, pool = _pool(evaluated)
            worst = max(c.makespan for c in pool)
            got = self._pools[key] = (best * (1.0 + _TIE_TOL), first, worst)
        return got

    def _bounds_of(self, spec: str):
        """The cheap bound, then the strong one (computed only if asked for)."""
        yield self.simple_bound(spec)
        yield self.bound(spec, True)

    def evaluate_best(self, specs: Sequence[str]) -> list[Candidate]:
        """Quick plans of the specs that could be picked, the same choice as planning all of
        them: the lowest bound first (it sets the band), then by the fewest tokens that must
        be split; a spec is skipped when :meth:`_cannot_win` shows that it does not change
        :func:`_pick`'s choice, and every skipped spec is checked again at the end."""
        order = list(dict.fromkeys(specs))
        skipped: set[str] = set()
        keys: dict[str, tuple[bool, float, str]] = {}  # the order of pending specs at a band
        keys_band = None
        while True:
            pending = [s for s in order if s not in self.evaluated and s not in skipped]
            if not pending:
                done = [self.evaluated[s] for s in order if s in self.evaluated]
                recheck = [s for s in skipped if not self._cannot_win(s, done)]
                if not recheck:
                    return done
                skipped.difference_update(recheck)
                continue
            done = [self.evaluated[s] for s in order if s in self.evaluated]
            if done:
                band = self._pool_of(done)[0]
            else:  # (no plan yet: the band around the lowest bound)
                band = min(self.simple_bound(s) for s in pending) * (1.0 + _TIE_TOL)
            if band != keys_band:  # (the keys change only with the band)
                keys.clear()
                keys_band = band
            for s in pending:
                if s not in keys:
                    keys[s] = (self.simple_bound(s) > band, self.sp_floor(s, band), s)
            spec = min(pending, key=keys.__getitem__)
            if self._cannot_win(spec, done):
                skipped.add(spec)
            else:
                self.evaluate(spec)


def evaluate_candidates(
    lengths: Sequence[Sequence[int]],
    specs: Sequence[str],
    world_size: int,
    num_heads: int,
    cost: CostModel,
) -> list[Candidate]:
    """Quick plans of the specs that could be picked (see ``_Step.evaluate_best``)."""
    sizes = {g for s in specs for g in _parse(s, world_size, num_heads).bag_sizes}
    return _Step(lengths, world_size, num_heads, cost, sorted(sizes)).evaluate_best(specs)


def _pool(evaluated: Sequence[Candidate]) -> tuple[float, Candidate, list[Candidate]]:
    """The best makespan; among the candidates within ``_TIE_TOL`` of it, the one with the
    fewest SP tokens (then the lowest makespan, then the spec); and the pool the final
    tie-break chooses from: the near-ties as good as that one (makespan within ``_MOVE_TOL``,
    SP share within ``_SP_TOL``)."""
    best = min(c.makespan for c in evaluated)
    near = [c for c in evaluated if c.makespan <= best * (1.0 + _TIE_TOL)]
    first = min(near, key=lambda c: (c.sp_tokens_fraction, c.makespan, c.spec))
    pool = [
        c
        for c in near
        if c.makespan <= first.makespan * (1.0 + _MOVE_TOL)
        and c.sp_tokens_fraction <= first.sp_tokens_fraction + _SP_TOL
    ]
    return best, first, pool


def _pick(evaluated: Sequence[Candidate]) -> Candidate:
    """Lowest makespan; among near-ties (``_TIE_TOL``) the fewest SP tokens. Then, among the
    layouts as good as that one, the fewest moved tokens (SP traffic recurs in every attention
    layer, routing once); see :func:`_pool`."""
    return min(_pool(evaluated)[2], key=lambda c: (c.tokens_moved_fraction, c.makespan, c.spec))


def _kept_tokens(
    lengths: Sequence[Sequence[int]], ranks: range, g: int, cost: CostModel, level: float
) -> float:
    """Tokens a g-bag on ``ranks`` could keep on their source ranks: its own sequences, largest
    first, while the bag stays under ``level`` (each keeps about L/g tokens at home)."""
    own = sorted((x for r in ranks for x in lengths[r]), reverse=True)
    if not own:
        return 0.0
    t = cost.table(np.asarray(own, dtype=np.int64), [g])[:, 0].tolist()
    used, kept = 0.0, 0
    for x, tx in zip(own, t, strict=True):
        if used + tx <= level:
            used += tx
            kept += x
    return kept / g


class _KeptTokens:
    """``_kept_tokens`` for every bag of one step from the step's cost table (cached per bag)."""

    def __init__(self, flat: np.ndarray, src: np.ndarray, table: CostTable, world: int) -> None:
        self.cuts = np.searchsorted(src, np.arange(world + 1)).tolist()
        self.lens = flat.tolist()
        self.tl = table.values.tolist()
        self.col = {int(g): k for k, g in enumerate(table.sizes.tolist())}
        self.cache: dict[tuple[int, int, float], float] = {}

    def __call__(self, start: int, g: int, level: float) -> float:
        key = (start, g, level)
        if key not in self.cache:
            a, b = self.cuts[start], self.cuts[start + g]
            k = self.col[g]
            rows = sorted(zip(self.lens[a:b], self.tl[a:b], strict=True), reverse=True)
            used, kept = 0.0, 0
            for x, t in rows:
                tx = t[k]
                if used + tx <= level:
                    used += tx
                    kept += x
            self.cache[key] = kept / g
        return self.cache[key]


def local_ordering(
    spec: str,
    lengths: Sequence[Sequence[int]],
    gpus_per_node: int,
    cost: CostModel,
    level: float,
    table: CostTable | None = None,
    validated: tuple[np.ndarray, np.ndarray] | None = None,
) -> str:
    """The same bags in a node-respecting order that keeps more tokens home.

    The spec's bags are cut into node-sized chunks; chunks are assigned to nodes (greedy on
    the largest gain over the worst node for that chunk type) to maximise the tokens each
    node's bags could keep from their own ranks under ``level`` (a modelled rank time: a g-bag
    holds up to ``level - rank_time(0, g)`` of load). A trailing partial node stays
    last. Returns ``spec`` itself when nothing better is found. ``table``: the step's cost
    table over (at least) the spec's bag sizes, if already built; ``validated``: ``(flat,
    src)`` from ``validate_lengths``, if already done."""
    world = len(lengths)
    bags = [g for g, n in parse_terms(spec) for _ in range(n)]
    chunks: list[tuple[int, ...]] = []
    cur: list[int] = []
    fill = 0
    for g in bags:
        cur.append(g)
        fill += g
        if fill == gpus_per_node:
            chunks.append(tuple(cur))
            cur, fill = [], 0
        elif fill > gpus_per_node:
            return spec  # a bag crossing a node: not ours to reorder
    tail = tuple(cur)
    types = sorted(set(chunks))
    if len(types) < 2:
        return spec
    nodes = len(chunks)
    flat, src = validated if validated is not None else validate_lengths(lengths, world)
    if table is None or table.columns(np.asarray(sorted(set(bags)), dtype=np.int64)) is None:
        table = CostTable.build(cost, flat, set(bags))
    kept = _KeptTokens(flat, src, table, world)
    room = {g: level - float(cost.rank_time(0.0, g)) for g in set(bags)}  # load a g-bag may hold
    # (plain lists: a handful of types and nodes, where numpy calls cost more than the work)
    score = [[0.0] * nodes for _ in types]
    for i, ch in enumerate(types):
        for j in range(nodes):
            start = j * gpus_per_node
            for g in ch:
                score[i][j] += kept(start, g, room[g])
                start += g
    need = {t: chunks.count(t) for t in types}
    free = list(range(nodes))  # ascending: the first best node wins ties
    placed: list[tuple[int, ...] | None] = [None] * nodes
    for _ in range(nodes):
        best = None
        for i, t in enumerate(types):
            if need[t] == 0:
                continue
            row = score[i]
            j = max(free, key=row.__getitem__)
            # regret: how much this type loses if it does not get its best free node
            other = max((score[o][j] for o in range(len(types)) if o != i), default=-np.inf)
            key = (row[j] - other, row[j], -i)
            if best is None or key > best[0]:
                best = (key, i, j)
        assert best is not None
        _, i, j = best
        placed[j] = types[i]
        need[types[i]] -= 1
        free.remove(j)
    order = [g for ch in placed if ch is not None for g in ch] + list(tail)
    if order == bags:
        return spec
    ident = sum(score[types.index(ch)][j] for j, ch in enumerate(chunks))
    new = sum(score[types.index(ch)][j] for j, ch in enumerate(placed) if ch is not None)
    if new <= ident:
        return spec
    terms: list[tuple[int, int]] = []
    for g in order:
        if terms and terms[-1][0] == g:
            terms[-1] = (g, terms[-1][1] + 1)
        else:
            terms.append((g, 1))
    out = format_spec(terms)
    return out if world % sum(g * n for g, n in terms) == 0 else spec


def choose_layout(
    lengths: Sequence[Sequence[int]],
    world_size: int,
    num_heads: int,
    gpus_per_node: int,
    cost: CostModel,
    candidates: Sequence[str] | None = None,
    current: str | None = None,
    hysteresis: float = 0.02,
) -> str:
    """The spec with the lowest modelled makespan (near-ties: fewer SP tokens); ``current``
    stays unless the winner's makespan is lower by more than ``hysteresis`` (relative)."""
    if len(lengths) != world_size:
        raise LayoutError(f"got lengths for {len(lengths)} ranks, world_size={world_size}")
    if not 0 <= hysteresis <= 1:  # also refuses NaN (1: never switch, as AutoLayout allows)
        raise LayoutError(f"hysteresis must be a number in [0, 1], got {hysteresis}")
    sizes = set(allowed_bag_sizes(world_size, num_heads, gpus_per_node))
    specs = []
    for s in candidates or ():
        layout = BagLayout.parse(s, world_size, num_heads)
        if spans_nodes(layout, gpus_per_node):
            raise LayoutError(f"candidate {s!r} has a bag spanning two nodes")
        specs.append(layout.spec)
    cur = None
    if current is not None:
        layout = BagLayout.parse(current, world_size, num_heads)
        if not spans_nodes(layout, gpus_per_node) and set(layout.bag_sizes) <= sizes | {1}:
            cur = layout.spec
    used = {
        g
        for s in [*specs, *([cur] if cur else [])]
        for g in _parse(s, world_size, num_heads).bag_sizes
    }
    # the step's cost table, over every size any candidate may use, is built once
    step = _Step(lengths, world_size, num_heads, cost, sorted(sizes | used))
    if candidates is None:
        specs = candidate_specs(
            lengths, world_size, num_heads, gpus_per_node, cost, table=step.table, flat=step.flat
        )
    if cur is not None and cur not in specs:
        specs.append(cur)
    if not specs:
        raise LayoutError(
            f"no bag layout for world_size={world_size}, heads={num_heads}, "
            f"gpus_per_node={gpus_per_node}"
        )
    if cur is not None:
        # Keep the current layout without planning the others when their bounds already show
        # that none can beat it by more than the hysteresis (the common, steady case). The
        # test uses a quickly reached makespan of the current layout: its full plan can only
        # be better, which makes keeping it only more justified.
        reached = step.quick_makespan(cur)
        if candidates is None:
            more = candidate_specs(
                lengths,
                world_size,
                num_heads,
                gpus_per_node,
                cost,
                reached * 1.000001,
                step.table,
                step.flat,
            )
            specs += [s for s in more if s not in specs]
        threshold = reached * (1.0 - hysteresis)
        if all(step.at_least(s, threshold) for s in specs if s != cur):
            return cur
    evaluated = step.evaluate_best(specs)
    if candidates is None:
        # second pass: size the mixes for the makespan actually reached (includes overheads)
        reached = min(c.makespan for c in evaluated) * (1.0 + 1e-6)
        more = [
            s
            for s in candidate_specs(
                lengths, world_size, num_heads, gpus_per_node, cost, reached, step.table, step.flat
            )
            if s not in specs
        ]
        if more:
            specs += more
            evaluated = step.evaluate_best(specs)
    winner = _pick(evaluated)
    # the same bags in another node order may keep more tokens on their source ranks
    local = local_ordering(
        winner.spec,
        lengths,
        gpus_per_node,
        cost,
        winner.makespan,
        table=step.table,
        validated=(step.flat, step.src),
    )
    if local != winner.spec and all(c.spec != local for c in evaluated):
        evaluated.append(step.evaluate(local, like=winner.spec))
        winner = _pick(evaluated)
    if cur is not None and winner.spec != cur:
        cur_c = step.evaluate(cur)
        if winner.makespan >= cur_c.makespan * (1.0 - hysteresis):
            return cur
    return winner.spec


def make_simulator_chooser(
    cost: CostModel,
    world_size: int,
    num_heads: int | None,
    gpus_per_node: int | None,
    hysteresis: float = 0.02,
) -> Callable[[Sequence[Sequence[int]]], BagLayout]:
    """Stateful per-step chooser (keeps the previous layout under hysteresis)."""
    heads = 24 if num_heads is None else num_heads
    node = 8 if gpus_per_node is None else gpus_per_node
    state: dict[str, str | None] = {"current": None}

    def choose(step: Sequence[Sequence[int]]) -> BagLayout:
        spec = choose_layout(
            step, world_size, heads, node, cost, current=state["current"], hysteresis=hysteresis
        )
        state["current"] = spec
        return BagLayout.parse(spec, world_size, heads)

    return choose
