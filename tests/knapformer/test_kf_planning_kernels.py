"""The compiled planner kernels (numba) make exactly the decisions of the plain Python/numpy
versions they replace: the same bags, loads and token counts, bit for bit, on random and
tie-heavy inputs, with and without a token budget; and so whole plans are identical."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from knapformer.planning import BagLayout, CostModel, InfeasibleError, plan_step
from knapformer.planning import solvers as S
from knapformer.planning.auto import choose_layout
from knapformer.planning.solvers import construction, fast, local_search

pytestmark = pytest.mark.skipif(not fast.available(), reason="numba is not installed")

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
COSTS = [
    CostModel.flops(3072, 1.0),
    CostModel.flops(1024, 0.4),
    CostModel(a=1.0, b=1e-3, c=0.5, e=20.0, name="general"),
    CostModel(a=1.0, b=0.0, name="linear"),  # integer costs: many exact ties
]
SPECS = [
    ("g1n16+g2n4+g4n2", 32),
    ("g1n8+g2n4+g4n2+g8n1", 32),
    ("g4n8", 32),
    ("g1n4+g2n1+g2n1", 8),
    ("g1n2", 2),
]


def _lengths(rng: np.random.Generator, n: int, ties: bool) -> np.ndarray:
    if ties:  # a few distinct lengths: equal costs, equal loads
        return rng.choice([64, 256, 1024, 4096], size=n).astype(np.int64)
    return np.exp(rng.uniform(np.log(16), np.log(60000), size=n)).astype(np.int64)


def _problem(seed: int, spec_world, cost, n: int, ties: bool, budget: bool) -> S.Problem:
    spec, world = spec_world
    rng = np.random.default_rng(seed)
    lay = BagLayout.parse(spec, world)
    L = _lengths(rng, n, ties)
    src = np.sort(rng.integers(0, world, size=n))
    mt = None
    if budget:  # loose enough to be feasible, tight enough to bind sometimes
        mt = int(max(L.sum() / world * 1.2, -(-L.max() // max(lay.bag_sizes))))
    return S.build_problem(L, src, lay, cost, mt, {})


instances = st.tuples(
    st.integers(0, 2**31 - 1),
    st.sampled_from(SPECS),
    st.sampled_from(COSTS),
    st.integers(1, 400),
    st.booleans(),
)


@FAST
@given(instances)
def test_lpt_and_best_fit_kernels_match_plain(inst):
    seed, spec_world, cost, n, ties = inst
    p = _problem(seed, spec_world, cost, n, ties, False)
    rng = np.random.default_rng(seed + 1)
    pre = rng.random(p.num_bags) < 0.3  # some bags start loaded
    load0 = np.where(pre, rng.random(p.num_bags) * float(p.tg[:, 0].max()), 0.0)
    if ties:
        load0 = np.round(load0)
    items = p.by_cost_desc[rng.permutation(p.n)[: max(1, p.n // 2)]]
    with fast.use_kernels(True):
        b1, l1 = np.full(p.n, -1, dtype=np.int64), load0.copy()
        construction._lpt_into(p, items, b1, l1)
    b2, l2 = np.full(p.n, -1, dtype=np.int64), load0.copy()
    construction._lpt_into_py(p, items, b2, l2)
    np.testing.assert_array_equal(b1, b2)
    np.testing.assert_array_equal(l1, l2)
    level = float(np.quantile(l1, 0.7)) + float(p.tg[:, 0].mean())
    rest = np.setdiff1d(np.arange(p.n), items)
    rest = rest[np.argsort(-p.lengths[rest], kind="stable")]
    with fast.use_kernels(True):
        left1 = construction._best_fit_into(p, rest, b1, l1, level)
    left2 = construction._best_fit_into_py(p, rest, b2, l2, level)
    np.testing.assert_array_equal(left1, left2)
    np.testing.assert_array_equal(b1, b2)
    np.testing.assert_array_equal(l1, l2)


@FAST
@given(instances, st.booleans(), st.sampled_from([2, 4]), st.floats(0.0, 1.0))
def test_pair_round_kernel_matches_plain(inst, budget, nb, where):
    """Random assignments, targets anywhere between the lightest and the heaviest bag: both
    the all-pairs and the windowed swap search, moves, budgets."""
    seed, spec_world, cost, n, ties = inst
    p = _problem(seed, spec_world, cost, n, ties, budget)
    rng = np.random.default_rng(seed + 2)
    bag = rng.integers(0, p.num_bags, size=p.n)
    load = p.bag_loads(bag)
    target = float(load.min() + where * (load.max() - load.min()))
    tokk = p.tok() if budget else None
    out = []
    for kern in (True, False):
        b, ld = bag.copy(), load.copy()
        toks = p.bag_tokens(b) if budget else None
        with fast.use_kernels(kern):
            got = local_search._pair_round(p, b, ld, target, toks, tokk, nb)
        out.append((got, b, ld, toks))
    assert out[0][0] == out[1][0]
    for a, b in zip(out[0][1:], out[1][1:], strict=True):
        np.testing.assert_array_equal(a, b)


@FAST
@given(instances, st.booleans(), st.booleans())
def test_bottleneck_step_kernel_matches_plain(inst, budget, balanced):
    """Several bottleneck steps in a row from random or LPT-built assignments (moves, the
    swap window, all pairs under a general cost, budgets): the same changes, bit for bit."""
    seed, spec_world, cost, n, ties = inst
    p = _problem(seed, spec_world, cost, n, ties, budget)
    rng = np.random.default_rng(seed + 3)
    bag = rng.integers(0, p.num_bags, size=p.n)
    if balanced and not budget:  # near-balanced: few moves help, swaps do
        bag, _ = construction._construct(p, p.by_cost_desc, None, S.simple_lower_bound(p))
    load = p.bag_loads(bag)
    out = []
    for kern in (True, False):
        state = local_search._State(p, bag, load)
        with fast.use_kernels(kern):
            steps = [local_search._bottleneck_step(state) for _ in range(6)]
        out.append((steps, state.bag, state.load, state.toks))
    assert out[0][0] == out[1][0]
    for a, b in zip(out[0][1:], out[1][1:], strict=True):
        np.testing.assert_array_equal(a, b)


def _random_step(rng: np.random.Generator, world: int, ties: bool) -> list[list[int]]:
    n = int(rng.integers(0, 40 * world))
    L = _lengths(rng, n, ties)
    src = rng.integers(0, world, size=n)
    return [L[src == r].tolist() for r in range(world)]


@FAST
@given(
    st.integers(0, 2**31 - 1),
    st.sampled_from(SPECS),
    st.sampled_from(COSTS),
    st.sampled_from(["local-search", "reference"]),
    st.booleans(),
    st.booleans(),
)
def test_plans_identical_with_and_without_kernels(seed, spec_world, cost, solver, ties, budget):
    spec, world = spec_world
    rng = np.random.default_rng(seed)
    lengths = _random_step(rng, world, ties)
    lay = BagLayout.parse(spec, world)
    opts = {}
    flat = [x for r in lengths for x in r]
    if budget and flat:
        opts["max_tokens_per_gpu"] = int(max(sum(flat) / world * 1.3, max(flat)))
    plans = []
    for kern in (True, False):
        with fast.use_kernels(kern):
            try:
                plans.append(plan_step(lengths, lay, cost, solver=solver, **opts))
            except InfeasibleError as exc:
                plans.append(str(exc))
    if isinstance(plans[0], str) or isinstance(plans[1], str):
        assert plans[0] == plans[1]
        return
    np.testing.assert_array_equal(plans[0].bag, plans[1].bag)
    assert plans[0].makespan == plans[1].makespan


def test_auto_picks_identical_with_and_without_kernels():
    from knapformer.sim.datacodes import resolve_mixture, sample_steps

    cost = CostModel.flops(3072, 1.0).scaled(57)
    for mixture in ("mixres", "joint"):
        for step in sample_steps(resolve_mixture(mixture), 32, 4, seed=3):
            picks = []
            for kern in (True, False):
                with fast.use_kernels(kern):
                    picks.append(choose_layout(step, 32, 24, 8, cost))
            assert picks[0] == picks[1]


def test_switch_and_warm_up():
    assert fast.warm_up() is True
    assert fast.kernels() is not None
    with fast.use_kernels(False):
        assert fast.kernels() is None
        assert fast.warm_up() is False
    assert fast.kernels() is not None
