"""The immutable per-step plan and the ``plan_step`` entry point (pure numpy, no torch).

Every rank calls ``plan_step`` on the same all-gathered lengths and gets the same plan, so no
plan is ever broadcast: everything here is a deterministic function of its inputs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from knapformer.planning.cost import CostModel
from knapformer.planning.errors import InfeasibleError, PlanError
from knapformer.planning.layout import BagLayout
from knapformer.planning.solvers import DEFAULT_SOLVER, solve
from knapformer.planning.solvers.problem import CostTable

__all__ = [
    "InfeasibleError",
    "Plan",
    "PlanError",
    "chunk_sizes",
    "max_over_mean",
    "plan_step",
    "validate_lengths",
]


def max_over_mean(loads: np.ndarray, mean: float | None = None) -> float:
    """``max(loads) / mean``; 1.0 for an all-zero load vector (nothing to balance)."""
    loads = np.asarray(loads, dtype=np.float64)
    m = float(loads.mean()) if mean is None else float(mean)
    if loads.size == 0 or m <= 0.0:
        return 1.0
    return float(loads.max()) / m


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


def chunk_sizes(length: int, g: int) -> np.ndarray:
    """``np.array_split`` convention: the first ``L % g`` chunks get one extra token."""
    q, r = divmod(int(length), int(g))
    out = np.full(g, q, dtype=np.int64)
    out[:r] += 1
    return out


@dataclass(frozen=True, eq=False)
class Plan:
    """Sequence -> bag assignment of one step, with modelled loads and a makespan certificate."""

    layout: BagLayout
    lengths: np.ndarray  # [S] int64, global rank-major order
    src_rank: np.ndarray  # [S] int64
    bag: np.ndarray  # [S] int64, global bag index
    load_before: np.ndarray  # [world] float64, modelled per-GPU cost without balancing
    load_after: np.ndarray  # [world] float64, modelled per-GPU cost of this plan
    lower_bound: float
    solver: str
    plan_ms: float
    cost: CostModel | None = None
    info: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def num_sequences(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def makespan(self) -> float:
        return float(self.load_after.max()) if self.load_after.size else 0.0

    @property
    def gap(self) -> float:
        """Relative distance to the lower bound (0 = provably optimal)."""
        if self.lower_bound <= 0.0:
            return 0.0
        return self.makespan / self.lower_bound - 1.0

    @property
    def mean_load(self) -> float:
        """Mean per-GPU load without balancing: the common denominator of all ``*_over_mean``."""
        return float(self.load_before.mean()) if self.load_before.size else 0.0

    @property
    def unbalanced_max_over_mean(self) -> float:
        return max_over_mean(self.load_before, self.mean_load)

    @property
    def balanced_max_over_mean(self) -> float:
        return max_over_mean(self.load_after, self.mean_load)

    @property
    def lower_bound_over_mean(self) -> float:
        m = self.mean_load
        return self.lower_bound / m if m > 0 else 1.0

    @property
    def seq_bag_size(self) -> np.ndarray:
        """Bag size ``g`` of every sequence."""
        sizes = np.asarray(self.layout.bag_sizes, dtype=np.int64)
        return sizes[self.bag]

    def chunk_bounds(self, s: int) -> np.ndarray:
        """Token offsets ``0..L`` of sequence ``s``'s ``g`` chunks; chunk j -> bag_ranks[bag][j]."""
        g = len(self.layout.bag_ranks[int(self.bag[s])])
        out = np.zeros(g + 1, dtype=np.int64)
        np.cumsum(chunk_sizes(int(self.lengths[s]), g), out=out[1:])
        return out

    def tokens_per_gpu(self) -> np.ndarray:
        """Tokens each GPU holds after routing (exact, with the uneven-chunk convention)."""
        world = self.layout.world_size
        out = np.zeros(world, dtype=np.int64)
        first = np.asarray([r[0] for r in self.layout.bag_ranks], dtype=np.int64)
        g = self.seq_bag_size
        q, rem = np.divmod(self.lengths, g)
        # Every GPU of the bag gets q tokens; GPUs j < rem get one more.
        base = np.bincount(self.bag, weights=q, minlength=self.layout.num_bags)
        out += base.astype(np.int64)[np.asarray(self.layout.bag_of_rank, dtype=np.int64)]
        if rem.any():
            # Add +1 on ranks first..first+rem-1 via a difference array.
            diff = np.zeros(world + 1, dtype=np.int64)
            start = first[self.bag]
            np.add.at(diff, start, (rem > 0).astype(np.int64))
            np.add.at(diff, start + rem, -(rem > 0).astype(np.int64))
            out += np.cumsum(diff[:-1])
        return out

    def tokens_staying(self) -> np.ndarray:
        """Per sequence, tokens whose chunk lands on the sequence's source rank."""
        first = np.asarray([r[0] for r in self.layout.bag_ranks], dtype=np.int64)[self.bag]
        g = self.seq_bag_size
        j = self.src_rank - first
        inside = (j >= 0) & (j < g)
        q, rem = np.divmod(self.lengths, g)
        stay = q + (j < rem)
        return np.where(inside, stay, 0)

    @property
    def tokens_moved_fraction(self) -> float:
        """Share of tokens whose chunk lands on a rank other than their source rank."""
        total = int(self.lengths.sum())
        if total == 0:
            return 0.0
        return 1.0 - float(self.tokens_staying().sum()) / total

    @property
    def sp_tokens_fraction(self) -> float:
        """Share of tokens in bags with g > 1 (they go through Ulysses all-to-alls)."""
        total = int(self.lengths.sum())
        if total == 0:
            return 0.0
        return float(self.lengths[self.seq_bag_size > 1].sum()) / total

    def summary(self) -> dict[str, Any]:
        """The metrics printed by ``knapformer plan --json`` (plain JSON types)."""
        return {
            "spec": self.layout.spec,
            "solver": self.solver,
            "world_size": self.layout.world_size,
            "num_sequences": self.num_sequences,
            "unbalanced_max_over_mean": self.unbalanced_max_over_mean,
            "balanced_max_over_mean": self.balanced_max_over_mean,
            "lower_bound_over_mean": self.lower_bound_over_mean,
            "gap": self.gap,
            "plan_ms": self.plan_ms,
            "tokens_moved_fraction": self.tokens_moved_fraction,
            "sp_tokens_fraction": self.sp_tokens_fraction,
        }


def _fast_flatten(
    lengths: Sequence[Sequence[int]], world_size: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """One numpy conversion for the common case (lists of positive ints); None -> slow path
    with per-rank error messages."""
    if not all(type(row) is list for row in lengths):
        return None
    counts = np.fromiter(map(len, lengths), dtype=np.int64, count=world_size)
    items = list(chain.from_iterable(lengths))
    # fromiter casts floats/bools silently: only accept if every element is an int
    if items and set(map(type, items)) != {int}:
        return None
    try:
        flat = np.fromiter(items, dtype=np.int64, count=len(items))
    except (TypeError, ValueError, OverflowError):
        return None
    if flat.size and flat.min() <= 0:
        return None
    src = np.arange(world_size, dtype=np.int64).repeat(counts)
    return flat, src


# Token counts must stay exact in int64 sums and float64 loads: at most 2^40 tokens per
# sequence and 2^53 per step (far above any real step), so sums never wrap around.
MAX_SEQUENCE_LENGTH = 1 << 40
MAX_STEP_TOKENS = 1 << 53


def _check_magnitudes(flat: np.ndarray) -> None:
    if flat.size == 0:
        return
    longest = int(flat.max())
    if longest > MAX_SEQUENCE_LENGTH:
        raise PlanError(
            f"a sequence of {longest} tokens is longer than the limit of 2^40 "
            f"({MAX_SEQUENCE_LENGTH}) tokens"
        )
    total = int(flat.sum())  # cannot wrap: <= 2^40 * count, and count < 2^23 in any real step
    if longest * flat.size >= 1 << 62 or total > MAX_STEP_TOKENS:
        raise PlanError(f"the step has more than 2^53 ({MAX_STEP_TOKENS}) tokens in total")


def validate_lengths(
    lengths: Sequence[Sequence[int]], world_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """Flatten per-rank lengths to (lengths[S], src_rank[S]) int64, rank-major; raise PlanError."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, (Sequence, np.ndarray)):
        raise PlanError("lengths must be a sequence of per-rank sequences of token counts")
    if len(lengths) != world_size:
        raise PlanError(
            f"got lengths for {len(lengths)} ranks but the layout has world_size={world_size}"
        )
    fast = _fast_flatten(lengths, world_size)
    if fast is not None:
        _check_magnitudes(fast[0])
        return fast
    arrs: list[np.ndarray] = []
    counts = np.zeros(world_size, dtype=np.int64)
    for r, row in enumerate(lengths):
        if isinstance(row, (str, bytes)):
            raise PlanError(f"lengths of rank {r} must be a list of integers, got a string")
        try:
            a = np.asarray(row)
        except (TypeError, ValueError) as exc:
            raise PlanError(f"lengths of rank {r} are not a list of integers: {exc}") from None
        if a.size == 0:
            continue
        if a.ndim != 1:
            raise PlanError(f"lengths of rank {r} must be a flat list of integers")
        if a.dtype.kind not in "iu":
            if a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.all(a == np.floor(a)):
                a = a.astype(np.int64)
            else:
                raise PlanError(
                    f"lengths of rank {r} must be integers (token counts), got dtype {a.dtype}"
                )
        a = a.astype(np.int64, copy=False)
        if (a <= 0).any():
            bad = int(a[a <= 0][0])
            raise PlanError(f"rank {r} has a sequence of length {bad}: every length must be >= 1")
        arrs.append(a)
        counts[r] = a.size
    flat = np.concatenate(arrs) if arrs else np.zeros(0, dtype=np.int64)
    _check_magnitudes(flat)
    src = np.arange(world_size, dtype=np.int64).repeat(counts)
    return flat, src


def plan_step(
    lengths: Sequence[Sequence[int]],
    layout: BagLayout,
    cost: CostModel,
    solver: str = DEFAULT_SOLVER,
    *,
    table: CostTable | None = None,
    **options: Any,
) -> Plan:
    """Balance one step: assign every sequence to a bag of its own replica.

    The default solver, ``local-search`` (alias ``ours``), never returns a plan whose
    makespan is above the ``reference`` plan's for the same inputs (with the default
    ``guard=True`` and ``locality_slack=0``; with a token budget, whenever the reference plan
    fits it).

    Options (solver-dependent): ``max_tokens_per_gpu`` (per-GPU token budget after routing),
    ``locality_slack`` (local-search: relative makespan slack allowed to keep sequences home),
    ``time_limit`` (exact: seconds, model building included), ``max_variables`` (exact: size
    guard), ``guard`` (local-search: also run the reference and keep the better plan; default
    True), ``stop_gap`` (local-search: stop within this relative gap of the bound, default
    1e-4), ``max_iters`` (local-search steps), ``keep_margin`` (home sequences are kept up to
    (1 - margin) x bound), ``replica_floor`` (with several replicas, stop balancing a replica
    once below the largest replica lower bound, since the step cannot end earlier; default
    True). ``table``: ``CostTable.build(cost, flat lengths, sizes)`` when the caller plans
    several layouts on the same lengths (computed once instead of per plan).
    """
    t0 = time.perf_counter()
    if not isinstance(layout, BagLayout):
        raise PlanError(f"layout must be a BagLayout, got {type(layout).__name__}")
    if not isinstance(cost, CostModel):
        raise PlanError(f"cost must be a CostModel, got {type(cost).__name__}")
    flat, src = validate_lengths(lengths, layout.world_size)
    if table is not None and table.values.shape[0] != flat.shape[0]:
        rows = table.values.shape[0]
        raise PlanError(f"cost table has {rows} rows for {flat.shape[0]} sequences")
    result = solve(flat, src, layout, cost, solver, options, table)
    bag = result.bag
    bag_of_rank = np.asarray(layout.bag_of_rank, dtype=np.int64)
    world = layout.world_size
    # (the solver's per-sequence costs when it has them: the same values, computed once)
    t1 = result.seq_cost1
    if t1 is None:
        t1 = cost.table(flat, [1])[:, 0] if flat.size else np.zeros(0)
    load_before = np.bincount(src, weights=t1, minlength=world).astype(np.float64, copy=False)
    tg = result.seq_cost
    assert tg is not None  # (every solver path returns the costs it planned with)
    bag_load = np.bincount(bag, weights=tg, minlength=layout.num_bags)
    bag_load = bag_load.astype(np.float64, copy=False)
    load_after = bag_load[bag_of_rank]
    plan_ms = (time.perf_counter() - t0) * 1e3
    return Plan(
        layout=layout,
        lengths=_readonly(flat),
        src_rank=_readonly(src),
        bag=_readonly(bag.astype(np.int64, copy=False)),
        load_before=_readonly(load_before),
        load_after=_readonly(load_after),
        lower_bound=float(result.lower_bound),
        solver=solver,
        plan_ms=plan_ms,
        cost=cost,
        info=dict(result.info),
    )
