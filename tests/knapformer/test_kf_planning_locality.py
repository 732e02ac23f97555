"""Locality (tokens kept on their source rank): the locality phase of the default solver
(relabel interchangeable bags, moves and swaps home) never raises the makespan above its limit
and never loses staying tokens. (The published greedy is pinned in test_kf_planning_reference.)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import knapformer
from knapformer.planning import BagLayout, CostModel, plan_step
from knapformer.planning import solvers as S
from knapformer.planning.plan import validate_lengths
from knapformer.planning.solvers import locality as SL

COST = CostModel.flops(3072, 1.0)
COSTS = [
    COST,
    CostModel.flops(1024, 0.4),
    CostModel(a=1.0, b=1e-3, c=0.5, e=20.0, name="general"),
    CostModel(a=1.0, b=0.0, c=2.0, e=0.0, name="comm-heavy"),
]
SPECS = ["g1n4", "g2n2", "g4n1", "g1n2+g2n1", "g1n2+g2n1+g4n1", "g1n4+g4n1", "g2n2+g4n1", "g8n1"]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MIXRES = Path(knapformer.__file__).parent / "data" / "mixres_32gpu.json"


def _group(spec: str) -> int:
    return BagLayout.parse(spec, 1024).group_size


def _problem(spec, lengths, cost, world=None):
    world = len(lengths) if world is None else world
    lay = BagLayout.parse(spec, world)
    flat, src = validate_lengths(lengths, world)
    return S.build_problem(flat, src, lay, cost, None, {})


length = st.one_of(st.integers(1, 8), st.integers(1, 4096), st.integers(4096, 40000))


@st.composite
def instances(draw, max_per_rank=8):
    spec = draw(st.sampled_from(SPECS))
    world = _group(spec)
    lengths = [draw(st.lists(length, max_size=max_per_rank)) for _ in range(world)]
    return spec, lengths, draw(st.sampled_from(COSTS))


def _staying(p: S.Problem, bag: np.ndarray) -> int:
    return int(p.stay_home[bag == p.home].sum())


def test_stay_home_matches_plan_tokens_staying():
    rng = np.random.default_rng(1)
    lengths = [[int(x) for x in rng.integers(1, 50, rng.integers(0, 4))] for _ in range(16)]
    lay = BagLayout.parse("g1n2+g2n1+g4n1+g8n1", 16)
    plan = plan_step(lengths, lay, COST)
    p = _problem(lay.spec, lengths, COST)
    home = plan.bag == p.home
    np.testing.assert_array_equal(plan.tokens_staying()[home], p.stay_home[home])
    assert (plan.tokens_staying()[~home] == 0).all()


@FAST
@given(instances(), st.integers(0, 2**32 - 1), st.sampled_from([0.0, 1e-3]))
def test_locality_phase_keeps_limit_and_never_loses_tokens(inst, seed, slack):
    """From any assignment: the makespan stays within the limit, loads stay consistent and no
    staying token is lost (relabel, moves and swaps only ever add staying tokens)."""
    spec, lengths, cost = inst
    p = _problem(spec, lengths, cost)
    rng = np.random.default_rng(seed)
    bag = rng.integers(0, p.num_bags, p.n).astype(np.int64)
    load = p.bag_loads(bag)
    before = _staying(p, bag)
    limit = float(load.max(initial=0.0)) * (1.0 + slack)
    sorted_before = np.sort(load)
    assert SL._relabel_home(p, bag, load) >= 0
    np.testing.assert_allclose(np.sort(load), sorted_before, rtol=1e-12)  # a permutation
    mid = _staying(p, bag)
    assert mid >= before
    SL._improve_locality(p, bag, load, limit)
    # (incremental updates: float drift relative to the largest load only)
    np.testing.assert_allclose(load, p.bag_loads(bag), rtol=1e-9, atol=1e-9 * (limit + 1.0))
    assert float(load.max(initial=0.0)) <= limit * (1 + 1e-12) + 1e-12
    assert _staying(p, bag) >= mid


def test_relabel_puts_whole_bags_home():
    """Bag contents in the wrong one of two identical bags: relabeling sends both home."""
    p = _problem("g2n2", [[10], [20], [30], [40]], COST)
    bag = np.asarray([1, 1, 0, 0])
    load = p.bag_loads(bag)
    assert SL._relabel_home(p, bag, load) == 4
    assert bag.tolist() == [0, 0, 1, 1]
    np.testing.assert_allclose(load, p.bag_loads(bag))


def test_swap_sends_both_home():
    """Two g1 bags at the makespan, each holding the other's sequence: neither move fits, the
    swap does (equal costs), and everything ends at home."""
    p = _problem("g1n2", [[100, 7], [100, 7]], COST)
    bag = np.asarray([1, 0, 0, 1])  # the 100s are swapped
    load = p.bag_loads(bag)
    limit = float(load.max())
    assert SL._locality_pass(p, bag, load, limit) == 0
    assert SL._home_swaps(p, bag, load, limit) == 1
    assert (bag == p.home).all()


def test_identical_ranks_keep_everything_home():
    """Nothing to balance: every sequence stays in its home bag, so exactly (g-1)/g of the
    tokens move (the floor for g-bags)."""
    lengths = [[800, 1600, 2400] for _ in range(32)]
    for spec, g in (("g1n32", 1), ("g4n8", 4), ("g8n4", 8)):
        plan = plan_step(lengths, BagLayout.parse(spec, 32, 24), COST)
        assert plan.tokens_moved_fraction == pytest.approx((g - 1) / g)
        assert plan.gap == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("spec", ["g4n8", "g8n4", "g1n16+g2n4+g4n2"])
def test_ours_moves_fewer_tokens_than_reference_on_paper_mixture(spec):
    lengths = json.loads(MIXRES.read_text())["ranks"]
    lay = BagLayout.parse(spec, 32, 24)
    ours = plan_step(lengths, lay, COST)
    ref = plan_step(lengths, lay, COST, solver="reference")
    assert ours.makespan <= ref.makespan * (1 + 1e-9)
    assert ours.tokens_moved_fraction < ref.tokens_moved_fraction
    assert ours.tokens_moved_fraction >= (min(lay.bag_sizes) - 1) / min(lay.bag_sizes) - 1e-12
    print(
        f"{spec}: moved ours {ours.tokens_moved_fraction:.3f} ref {ref.tokens_moved_fraction:.3f}"
    )
