"""One replica's planning instance (``Problem``), built from the cost model's table.

All solvers work on one replica at a time (sequences never leave their replica; replicas only
share the step's bound, see ``Problem.floor``) and are deterministic: stable sorts, ties broken
by index, no wall-clock-dependent decisions, so every rank computes the same plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from knapformer.planning.cost import CostModel
from knapformer.planning.errors import PlanError
from knapformer.planning.layout import BagLayout
from knapformer.planning.solvers.bounds import lower_bound

__all__ = ["CostTable", "Problem", "SolveResult", "build_problem", "cost_table"]

_REL_EPS = 1e-12  # relative tolerance for "ties" between floating loads


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
    # the published greedy's (bags, exact bag loads), set once by whoever computes it first
    reference: tuple[np.ndarray | None, np.ndarray | None] | None = None
    started: float | None = None  # time.perf_counter() when the step's planning began

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
    def work1(self) -> np.ndarray:
        """[n] cost of every sequence on one GPU, t(L, 1): the published greedy's workload."""
        if int(self.class_sizes[0]) == 1:
            return self.tg[:, 0]
        return cost_table(self.cost, self.lengths, np.ones(1, dtype=np.int64))[:, 0]

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
        return self.tg.ravel()[self._row_starts + self.cls[bag]]

    @cached_property
    def _row_starts(self) -> np.ndarray:
        """[n] flat index of every row of ``tg`` (``tg.ravel()[_row_starts + k]`` is column k)."""
        return np.arange(self.n) * self.tg.shape[1]

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


def _makespan(load: np.ndarray) -> float:
    return float(load.max()) if load.size else 0.0


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


@dataclass(frozen=True)
class CostTable:
    """``cost.table(lengths, sizes)`` computed once for a step and shared by every layout
    evaluated on it (the auto-layout chooser plans many layouts on the same lengths)."""

    sizes: np.ndarray  # [K] ascending bag sizes
    values: np.ndarray  # [n, K]

    @classmethod
    def build(cls, cost: CostModel, lengths: np.ndarray, sizes: Any) -> CostTable:
        sz = np.asarray(sorted(set(int(g) for g in sizes)), dtype=np.int64)
        return cls(sz, cost_table(cost, lengths, sz))

    def rows(self, a: int, b: int) -> CostTable:
        return CostTable(self.sizes, self.values[a:b])

    def columns(self, sizes: np.ndarray) -> np.ndarray | None:
        """The ``[n, len(sizes)]`` sub-table, or None if a size is not in the table."""
        idx = np.searchsorted(self.sizes, sizes)
        if (idx >= self.sizes.shape[0]).any() or (self.sizes[idx] != sizes).any():
            return None
        return self.values[:, idx]


def cost_table(cost: CostModel, lengths: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``cost.table`` checked: the solvers' lower bounds need finite costs >= 0."""
    tg = np.asarray(cost.table(lengths, sizes), dtype=np.float64)
    if tg.shape != (lengths.shape[0], sizes.shape[0]):
        raise PlanError(
            f"cost table has shape {tg.shape}, expected {(lengths.shape[0], sizes.shape[0])}"
        )
    if tg.size and not (np.isfinite(tg).all() and tg.min() >= 0.0):
        raise PlanError("the cost model gave a negative or non-finite cost")
    return tg


def build_problem(
    lengths: np.ndarray,
    src_local: np.ndarray,
    layout: BagLayout,
    cost: CostModel,
    max_tokens: int | None,
    options: Mapping[str, Any],
    table: CostTable | None = None,
) -> Problem:
    """Replica-local instance for sequences ``lengths`` whose source ranks are ``src_local``
    (``table``: the cost model's table for exactly these lengths, if already computed)."""
    sizes, class_sizes, cls, bag_of_rank = _replica_arrays(layout)
    home = bag_of_rank[src_local] if src_local.size else np.zeros(0, dtype=np.int64)
    tg = table.columns(class_sizes) if table is not None else None
    if tg is None:
        tg = cost_table(cost, lengths, class_sizes)
    # row-major: the solvers read it through flat views (``ravel`` would copy every time)
    tg = np.ascontiguousarray(tg)
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
