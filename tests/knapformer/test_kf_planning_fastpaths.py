"""The planner's shortcuts must give exactly what the plain computation gives: radix argsort,
orders by length instead of by cost, the compute-only cost table, and the per-sequence costs
the solver hands to plan_step instead of evaluating the cost model again."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from knapformer.planning import BagLayout, CostModel, plan_step
from knapformer.planning import solvers as S
from knapformer.planning.solvers.problem import _stable_argsort_int

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
COSTS = [
    CostModel.flops(3072, 1.0),
    CostModel.flops(1024, 0.4),
    CostModel(a=1.0, b=1e-3, c=0.5, e=20.0, name="general"),
    CostModel(a=0.0, b=2.0, name="quadratic-only"),
]
# specs with and without 1-GPU bags (the 1-GPU cost then comes from the solver or not)
SPECS = [("g1n2+g2n1+g4n1", 8), ("g2n2", 4), ("g4n1", 4), ("g1n4", 4), ("g2n1+g4n1", 6)]


@pytest.mark.parametrize("span", [1, 7, 1 << 16, (1 << 16) + 1, 1 << 40])
@pytest.mark.parametrize("size", [0, 1, 5, 1000])
def test_stable_argsort_int_matches_numpy(span, size):
    rng = np.random.default_rng(size + span % 97)
    x = rng.integers(-span // 2, span - span // 2, size=size, dtype=np.int64)
    if size > 3:
        x[: size // 3] = x[size // 3]  # plenty of ties: stability matters
    np.testing.assert_array_equal(_stable_argsort_int(x), np.argsort(x, kind="stable"))


@FAST
@given(
    st.lists(st.integers(1, 70000), min_size=1, max_size=200),
    st.sampled_from(COSTS),
    st.sampled_from(SPECS),
)
def test_length_orders_equal_cost_orders(lengths, cost, spec_world):
    """t(L, g) is strictly increasing in L, so sorting by length is sorting by cost."""
    spec, world = spec_world
    lay = BagLayout.parse(spec, world)
    L = np.asarray(lengths, dtype=np.int64)
    src = np.sort(np.arange(L.size) % world)
    p = S.build_problem(L, src, lay, cost, None, {})
    for k in range(p.tg.shape[1]):
        np.testing.assert_array_equal(p.by_cost_asc, np.argsort(p.tg[:, k], kind="stable"))
        np.testing.assert_array_equal(p.by_cost_desc, np.argsort(-p.tg[:, k], kind="stable"))
    # the cost table is the cost model's own values, bit for bit
    sizes = p.class_sizes.astype(np.float64)
    np.testing.assert_array_equal(p.tg, cost.t(L[:, None].astype(np.float64), sizes[None, :]))
    np.testing.assert_array_equal(p.tg_home, cost.t(L, p.sizes[p.home]))


@FAST
@given(
    st.sampled_from(SPECS),
    st.sampled_from(COSTS),
    st.sampled_from(["ours", "reference"]),
    st.integers(0, 2**31 - 1),
)
def test_plan_loads_are_the_cost_models_exactly(spec_world, cost, solver, seed):
    spec, world = spec_world
    rng = np.random.default_rng(seed)
    lengths = [rng.integers(1, 9000, size=rng.integers(0, 12)).tolist() for _ in range(world)]
    lay = BagLayout.parse(spec, world)
    p = plan_step(lengths, lay, cost, solver=solver)
    sizes = np.asarray(lay.bag_sizes)
    if p.num_sequences == 0:
        assert not p.load_before.any() and not p.load_after.any()
        return
    before = np.bincount(p.src_rank, weights=cost.t(p.lengths, 1), minlength=world)
    bag_load = np.bincount(p.bag, weights=cost.t(p.lengths, sizes[p.bag]), minlength=len(sizes))
    np.testing.assert_array_equal(p.load_before, before)
    np.testing.assert_array_equal(p.load_after, bag_load[np.asarray(lay.bag_of_rank)])
    assert not p.load_before.flags.writeable and not p.load_after.flags.writeable
