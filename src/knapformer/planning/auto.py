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
Otherwise candidates get a quick makespan in order of their bounds (skipped once a bound rules
them out), and only the few near the best get a full plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from math import inf

import numpy as np

from knapformer.planning import solvers
from knapformer.planning.cost import CostModel
from knapformer.planning.layout import BagLayout, LayoutError, format_spec, parse_terms
from knapformer.planning.plan import plan_step, validate_lengths
from knapformer.planning.solvers import construction, local_search
from knapformer.planning.solvers.problem import CostTable

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
_QUICK_BAND = 0.01  # specs this close to the best quick makespan get a full plan
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
    terms = [(g, n) for g, n in sorted(counts.items()) if n > 0]
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
) -> list[str]:
    """Homogeneous layouts plus data-driven mixes of g1 bags and larger bags.

    ``level`` is the per-GPU load the mixes are sized for (default: perfect balance, or the
    longest sequence's best cost if higher); a second pass at the best makespan found is
    how all-to-all overheads enter the sizing. ``table``: the step's cost table, if built."""
    sizes = allowed_bag_sizes(world_size, num_heads, gpus_per_node)
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
    # (no plan beats the longest sequence in its best bag, so the level is at least that)
    if level is None:
        level = max(float(tg[:, 0].sum()) / world_size, float(tg.min(axis=1).max()))
    fits = tg <= level * (1 + 1e-9)
    big = ~fits[:, 0]
    if not big.any():
        return specs
    gmin_idx = np.where(fits.any(axis=1), np.argmax(fits, axis=1), len(sizes) - 1)

    def bags_needed(items: np.ndarray, k: int) -> int | None:
        loads: list[float] = []
        for x in sorted(tg[items, k].tolist(), reverse=True):
            if x > level * (1 + 1e-9):
                return None
            for i, ld in enumerate(loads):
                if ld + x <= level * (1 + 1e-9):
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
        self.evaluated: dict[str, Candidate] = {}
        self._bounds: dict[tuple[str, bool], float] = {}
        self._size_bounds: dict[tuple[int, ...], float] = {}
        self.planned = 0

    def layout(self, spec: str) -> BagLayout:
        return _parse(spec, self.world_size, self.num_heads)

    def bound(self, spec: str, strong: bool) -> float:
        """Makespan lower bound of ``spec`` (max over replicas): the simple bound (cheap) or
        the restricted-capacity one."""
        key = (spec, strong)
        if key not in self._bounds:
            lb = 0.0
            for p in self.replica_problems(spec):
                lb = max(lb, p.lb if strong else solvers.simple_lower_bound(p))
            self._bounds[key] = lb
        return self._bounds[key]

    def replica_problems(self, spec: str):
        """The planning problem of each replica of ``spec`` (its rows of the cost table)."""
        layout = self.layout(spec)
        cuts = np.searchsorted(self.src, np.arange(0, self.world_size + 1, layout.group_size))
        for r in range(layout.num_replicas):
            a, b = int(cuts[r]), int(cuts[r + 1])
            yield solvers.build_problem(
                self.flat[a:b],
                self.src[a:b] - r * layout.group_size,
                layout,
                self.cost,
                None,
                {},
                self.table.rows(a, b),
            )

    def simple_bound(self, spec: str) -> float:
        """``max(total min-work / N, max_s min_g t(L_s, g))`` straight from the table: for a
        one-replica layout it depends only on its set of bag sizes (cached per set)."""
        layout = self.layout(spec)
        if layout.num_replicas != 1:
            return self.bound(spec, False)
        key = tuple(sorted(set(layout.bag_sizes)))
        if key not in self._size_bounds:
            idx = np.searchsorted(self.table.sizes, key)
            t = self.table.values[:, idx]
            if t.shape[0] == 0:
                self._size_bounds[key] = 0.0
            else:
                work = (t * np.asarray(key, dtype=np.float64)).min(axis=1)
                self._size_bounds[key] = float(
                    max(work.sum() / self.world_size, t.min(axis=1).max())
                )
        return self._size_bounds[key]

    def at_least(self, spec: str, x: float) -> bool:
        """Whether ``spec``'s makespan provably is >= x (tries the cheap bound first)."""
        return self.simple_bound(spec) >= x or self.bound(spec, True) >= x

    def quick_makespan(self, spec: str) -> float:
        """A makespan ``spec`` can reach (an upper bound on its best plan): LPT construction
        and a few local-search rounds, no locality phase and no plan object."""
        ms = 0.0
        for p in self.replica_problems(spec):
            if p.n == 0:
                continue
            bag, load = construction._construct(p, p.by_cost_desc, None, p.lb, 1e-3)
            bag, _, _ = local_search._local_search(p, bag, load, p.lb, 8, 1e-3)
            ms = max(ms, float(p.bag_loads(bag).max()))
        return ms

    def evaluate(self, spec: str) -> Candidate:
        if spec not in self.evaluated:
            plan = plan_step(
                self.lengths,
                self.layout(spec),
                self.cost,
                solvers.DEFAULT_SOLVER,
                table=self.table,
                guard=False,
                stop_gap=1e-3,
                max_iters=20,
            )
            self.planned += 1
            self.evaluated[spec] = Candidate(
                spec=spec,
                makespan=plan.makespan,
                lower_bound=plan.lower_bound,
                sp_tokens_fraction=plan.sp_tokens_fraction,
                tokens_moved_fraction=plan.tokens_moved_fraction,
            )
        return self.evaluated[spec]

    def evaluate_best(self, specs: Sequence[str], max_planned: int = 4) -> list[Candidate]:
        """Plan only the specs that could be picked. First a quick makespan (LPT and a few
        local-search rounds) of every spec whose bound does not already rule it out, in order
        of the bounds; then full plans for the specs within ``_QUICK_BAND`` of the best quick
        makespan (near-ties are decided on full plans: SP share, tokens moved)."""
        order = sorted(specs, key=lambda s: (self.simple_bound(s), s))
        best = min((self.evaluated[s].makespan for s in order if s in self.evaluated), default=inf)
        quick: dict[str, float] = {}
        for spec in order:
            if spec in self.evaluated or self.at_least(spec, best * (1.0 + _QUICK_BAND)):
                continue
            quick[spec] = self.quick_makespan(spec)
            best = min(best, quick[spec])
        near = sorted((q, s) for s, q in quick.items() if q <= best * (1.0 + _QUICK_BAND))
        for _, spec in near[:max_planned]:
            self.evaluate(spec)
        return [self.evaluated[s] for s in order if s in self.evaluated]


def evaluate_candidates(
    lengths: Sequence[Sequence[int]],
    specs: Sequence[str],
    world_size: int,
    num_heads: int,
    cost: CostModel,
    max_planned: int = 8,
) -> list[Candidate]:
    """Candidates for the specs that could be picked (see ``_Step.evaluate_best``): full plans
    (default solver, quick settings) of at most ``max_planned`` specs near the best."""
    sizes = {g for s in specs for g in _parse(s, world_size, num_heads).bag_sizes}
    return _Step(lengths, world_size, num_heads, cost, sorted(sizes)).evaluate_best(
        specs, max_planned
    )


def _pick(evaluated: Sequence[Candidate]) -> Candidate:
    """Lowest makespan; among near-ties (``_TIE_TOL``) the fewest SP tokens. Then, among the
    layouts as good as that one (makespan within ``_MOVE_TOL``, SP share within ``_SP_TOL``),
    the fewest moved tokens (SP traffic recurs in every attention layer, routing once)."""
    best = min(c.makespan for c in evaluated)
    near = [c for c in evaluated if c.makespan <= best * (1.0 + _TIE_TOL)]
    first = min(near, key=lambda c: (c.sp_tokens_fraction, c.makespan, c.spec))
    pool = [
        c
        for c in near
        if c.makespan <= first.makespan * (1.0 + _MOVE_TOL)
        and c.sp_tokens_fraction <= first.sp_tokens_fraction + _SP_TOL
    ]
    return min(pool, key=lambda c: (c.tokens_moved_fraction, c.makespan, c.spec))


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


def local_ordering(
    spec: str,
    lengths: Sequence[Sequence[int]],
    gpus_per_node: int,
    cost: CostModel,
    level: float,
) -> str:
    """The same bags in a node-respecting order that keeps more tokens home.

    The spec's bags are cut into node-sized chunks; chunks are assigned to nodes (greedy on
    the largest gain over the worst node for that chunk type) to maximise the tokens each
    node's bags could keep from their own ranks under ``level``. A trailing partial node stays
    last. Returns ``spec`` itself when nothing better is found."""
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
    score = np.zeros((len(types), nodes))
    for i, ch in enumerate(types):
        for j in range(nodes):
            start = j * gpus_per_node
            for g in ch:
                score[i, j] += _kept_tokens(lengths, range(start, start + g), g, cost, level)
                start += g
    need = {t: chunks.count(t) for t in types}
    free = np.ones(nodes, dtype=bool)
    placed: list[tuple[int, ...] | None] = [None] * nodes
    for _ in range(nodes):
        best = None
        for i, t in enumerate(types):
            if need[t] == 0:
                continue
            row = np.where(free, score[i], -np.inf)
            j = int(np.argmax(row))
            # regret: how much this type loses if it does not get its best free node
            others = np.where(free, score, -np.inf)
            gain = row[j] - float(np.max(np.delete(others[:, j], i), initial=-np.inf))
            key = (gain, row[j], -i)
            if best is None or key > best[0]:
                best = (key, i, j)
        assert best is not None
        _, i, j = best
        placed[j] = types[i]
        need[types[i]] -= 1
        free[j] = False
    order = [g for ch in placed if ch is not None for g in ch] + list(tail)
    if order == bags:
        return spec
    ident = sum(score[types.index(ch), j] for j, ch in enumerate(chunks))
    new = sum(score[types.index(ch), j] for j, ch in enumerate(placed) if ch is not None)
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
    if hysteresis < 0:
        raise LayoutError("hysteresis must be >= 0")
    sizes = set(allowed_bag_sizes(world_size, num_heads, gpus_per_node))
    if candidates is None:
        specs = candidate_specs(lengths, world_size, num_heads, gpus_per_node, cost)
    else:
        specs = []
        for s in candidates:
            layout = BagLayout.parse(s, world_size, num_heads)
            if spans_nodes(layout, gpus_per_node):
                raise LayoutError(f"candidate {s!r} has a bag spanning two nodes")
            specs.append(layout.spec)
    cur = None
    if current is not None:
        layout = BagLayout.parse(current, world_size, num_heads)
        if not spans_nodes(layout, gpus_per_node) and set(layout.bag_sizes) <= sizes | {1}:
            cur = layout.spec
            if cur not in specs:
                specs.append(cur)
    if not specs:
        raise LayoutError(
            f"no bag layout for world_size={world_size}, heads={num_heads}, "
            f"gpus_per_node={gpus_per_node}"
        )
    used = {g for s in specs for g in _parse(s, world_size, num_heads).bag_sizes}
    step = _Step(lengths, world_size, num_heads, cost, sorted(sizes | used))
    if cur is not None:
        # Keep the current layout without planning the others when their bounds already show
        # that none can beat it by more than the hysteresis (the common, steady case). The
        # test uses a quickly reached makespan of the current layout: its full plan can only
        # be better, which makes keeping it only more justified.
        reached = step.quick_makespan(cur)
        if candidates is None:
            more = candidate_specs(
                lengths, world_size, num_heads, gpus_per_node, cost, reached * 1.000001, step.table
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
                lengths, world_size, num_heads, gpus_per_node, cost, reached, step.table
            )
            if s not in specs
        ]
        if more:
            specs += more
            evaluated = step.evaluate_best(specs)
    winner = _pick(evaluated)
    # the same bags in another node order may keep more tokens on their source ranks
    local = local_ordering(winner.spec, lengths, gpus_per_node, cost, winner.makespan)
    if local != winner.spec and all(c.spec != local for c in evaluated):
        evaluated.append(step.evaluate(local))
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
