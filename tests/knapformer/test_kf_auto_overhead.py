"""The auto-layout chooser weighs the fixed per-rank costs ``f`` and ``u`` as
``CostModel.rank_time`` does (issue 10): makespans, bounds and the pick are over modelled rank
times, so a large enough ``u`` (the fixed cost of a rank in a g > 1 bag) turns a split down."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knapformer.planning import CostModel
from knapformer.planning.auto import (
    _pick,
    _Step,
    allowed_bag_sizes,
    candidate_specs,
    choose_layout,
)


def test_u_decides_whether_a_long_sequence_is_split():
    # one rank holds a sequence ten times the other's: a 2-bag halves the makespan (1000 -> 550)
    # unless the fixed cost of its ranks, u/2, eats the gain
    lengths = [[100], [1000]]
    base = CostModel(a=1.0, b=0.0, name="linear")
    assert choose_layout(lengths, 2, 4, 2, base) == "g2n1"
    assert choose_layout(lengths, 2, 4, 2, dataclasses.replace(base, u=800.0)) == "g2n1"  # 950
    assert choose_layout(lengths, 2, 4, 2, dataclasses.replace(base, u=1000.0)) == "g1n2"  # 1050
    # f is paid by every rank of every layout alike: it does not turn the split down
    assert choose_layout(lengths, 2, 4, 2, dataclasses.replace(base, f=5000.0)) == "g2n1"


def test_u_moves_the_choice_to_a_smaller_bag():
    # 4 ranks, one long sequence and three short: g4n1 gives 475 + 3u/4 per rank; one 2-bag for
    # the long sequence and 1-GPU bags for the rest max(500 + u/2, 600); g1n4 1000
    lengths = [[1000], [300], [300], [300]]
    base = CostModel(a=1.0, b=0.0, name="linear")
    picks = [
        choose_layout(lengths, 4, 4, 4, dataclasses.replace(base, u=u))
        for u in (0.0, 400.0, 2000.0)
    ]
    assert [max(int(t[1]) for t in p.split("+")) for p in picks] == [4, 2, 1], picks


def _lengths(seed: int, world: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(world):
        n = int(rng.integers(0, 6))
        img = (rng.choice([256, 512, 1024, 2048], n) // 16) ** 2
        vid = rng.random(n) < 0.2
        out.append([int(v) for v in np.where(vid, img * rng.integers(4, 30, n), img)])
    return out


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    world=st.sampled_from([4, 8, 16]),
    f=st.sampled_from([0.0, 0.05, 0.3]),
    u=st.sampled_from([0.0, 0.1, 1.0, 5.0]),
)
def test_makespans_and_bounds_are_rank_times(seed, world, f, u):
    """Every candidate's makespan is the max over ranks of ``rank_time(bag load, g)`` of its
    plan, its bounds are below it, and the pruned pick is the pick over every candidate."""
    cost = CostModel.flops(3072, 1.0).scaled(57 / 1e15)  # ~seconds
    cost = dataclasses.replace(cost, f=f, u=u)
    lengths = _lengths(seed, world)
    sizes = allowed_bag_sizes(world, 24, 8)
    pruned_step = _Step(lengths, world, 24, cost, sizes)
    specs = candidate_specs(lengths, world, 24, 8, cost, table=pruned_step.table)
    pruned = _pick(pruned_step.evaluate_best(specs))
    step = _Step(lengths, world, 24, cost, sizes)
    every = [step.evaluate(s) for s in specs]
    assert pruned.spec == _pick(every).spec
    flat = np.asarray([x for r in lengths for x in r], dtype=np.int64)
    for c in every:
        lay = step.layout(c.spec)
        (bag,) = step._bags[c.spec]  # one replica
        g = np.asarray(lay.bag_sizes, dtype=np.float64)
        load = np.zeros(len(g))
        if flat.size:
            np.add.at(load, bag, cost.t(flat, g[bag]))
        times = [cost.rank_time(load[lay.bag_of_rank[r]], g[lay.bag_of_rank[r]]) for r in
                 range(world)]  # fmt: skip
        assert c.makespan == pytest.approx(max(times), rel=1e-9)
        assert step.simple_bound(c.spec) <= c.makespan * (1 + 1e-9)
        assert step.bound(c.spec, True) <= c.makespan * (1 + 1e-9)
        assert c.sp_tokens_fraction >= step.sp_floor(c.spec, c.makespan) - 1e-12


def test_kept_current_layout_respects_u():
    # the current layout is kept only while no candidate beats its rank time by the hysteresis
    lengths = [[100], [1000]]
    cost = CostModel(a=1.0, b=0.0, u=1000.0, name="linear")
    assert choose_layout(lengths, 2, 4, 2, cost, current="g2n1", hysteresis=0.02) == "g1n2"
    assert choose_layout(lengths, 2, 4, 2, cost, current="g2n1", hysteresis=0.1) == "g2n1"
