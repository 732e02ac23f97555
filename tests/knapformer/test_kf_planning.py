"""Planning core: layouts, cost model, plan invariants and bad input (pure numpy, fast)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import knapformer
from knapformer.planning import (
    BagLayout,
    CostModel,
    CostModelError,
    InfeasibleError,
    LayoutError,
    PlanError,
    max_over_mean,
    plan_step,
)

COST = CostModel.flops(3072, 1.0)
MIXRES = Path(knapformer.__file__).parent / "data" / "mixres_32gpu.json"


# ---------------------------------------------------------------- layout


def test_layout_parse_contiguous_and_replicas():
    lay = BagLayout.parse("g1n2+g2n1+g4n1", 16, num_heads=24)
    assert lay.group_size == 8 and lay.num_replicas == 2
    assert lay.bag_ranks[:4] == ((0,), (1,), (2, 3), (4, 5, 6, 7))
    assert lay.bag_ranks[4:] == ((8,), (9,), (10, 11), (12, 13, 14, 15))
    assert lay.bag_sizes == (1, 1, 2, 4, 1, 1, 2, 4)
    assert lay.replica_of_bag == (0, 0, 0, 0, 1, 1, 1, 1)
    assert lay.bag_of_rank == (0, 1, 2, 2, 3, 3, 3, 3, 4, 5, 6, 6, 7, 7, 7, 7)
    # bags ordered by first rank; every rank in exactly one bag
    firsts = [r[0] for r in lay.bag_ranks]
    assert firsts == sorted(firsts)
    assert sorted(r for b in lay.bag_ranks for r in b) == list(range(16))


def test_layout_spec_normalised():
    assert BagLayout.parse(" G2N2 + g4n1 ", 8).spec == "g2n2+g4n1"


@pytest.mark.parametrize(
    ("spec", "world", "heads", "match"),
    [
        ("g2n3", 8, None, "does not divide world_size"),
        ("g4n1", 8, 6, "do not divide num_heads"),
        ("g1n2+", 4, None, "bad bag layout term"),
        ("x1n2", 4, None, "bad bag layout term"),
        ("g0n2", 4, None, ">= 1"),
        ("", 4, None, "empty"),
        ("g1n2", 0, None, "world_size"),
    ],
)
def test_layout_errors(spec, world, heads, match):
    with pytest.raises(LayoutError, match=match):
        BagLayout.parse(spec, world, num_heads=heads)


# ---------------------------------------------------------------- cost


def test_cost_flops_matches_paper_formula():
    d, gamma = 3072, 0.4
    c = CostModel.flops(d, gamma)
    L = np.array([1, 256, 4096, 16384])
    w = 24 * L * d**2 + gamma * 4 * L**2 * d
    np.testing.assert_allclose(c.t(L, 1), w, rtol=1e-12)
    np.testing.assert_allclose(c.t(L, 4), w / 4, rtol=1e-12)


def test_cost_flops_all_to_all_term():
    c = CostModel.flops(1024, 1.0, a2a_flops_per_byte=100.0)
    assert c.c == pytest.approx(4 * 1024 * 2 * 100.0)
    # a 1-GPU bag pays no all-to-all; a g-GPU bag pays (g-1)/g of it per token
    assert c.t(10, 1) == pytest.approx(CostModel.flops(1024, 1.0).t(10, 1))
    assert c.t(10, 4) - CostModel.flops(1024, 1.0).t(10, 4) == pytest.approx(c.c * 10 * 3 / 4)


def test_cost_general_terms_and_json_roundtrip(tmp_path):
    c = CostModel(a=2.0, b=0.5, c=3.0, e=7.0, name="x")
    L, g = 10.0, 4.0
    assert c.t(L, g) == pytest.approx((2 * L + 0.5 * L * L) / g + 3 * L * (g - 1) / g + 7)
    assert c.work(L, g) == pytest.approx(g * c.t(L, g))
    path = tmp_path / "profile.json"
    c.save(path)
    assert json.loads(path.read_text())["kind"] == "knapformer-cost-profile"
    assert CostModel.load(path) == c
    assert (c + c).t(L, g) == pytest.approx(2 * c.t(L, g))


def test_cost_bad_values(tmp_path):
    with pytest.raises(CostModelError, match=">= 0"):
        CostModel(a=-1.0, b=1.0)
    with pytest.raises(CostModelError, match="a > 0 or b > 0"):
        CostModel(a=0.0, b=0.0)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CostModelError, match="not valid JSON"):
        CostModel.load(bad)
    bad.write_text('{"b": 1.0}')
    with pytest.raises(CostModelError, match="missing coefficient 'a'"):
        CostModel.load(bad)


# ---------------------------------------------------------------- plan


def _lengths():
    return [[100, 3000], [16000], [], [5, 7, 9], [4096, 4096], [1], [300] * 5, [20000]]


@pytest.mark.parametrize("solver", ["ours", "reference"])
def test_plan_invariants(solver):
    lay = BagLayout.parse("g1n2+g2n1+g4n1", 8, 24)
    lengths = _lengths()
    p = plan_step(lengths, lay, COST, solver=solver)
    flat = np.concatenate([np.asarray(r, dtype=np.int64) for r in lengths if r])
    np.testing.assert_array_equal(p.lengths, flat)
    assert p.src_rank.tolist() == [r for r, row in enumerate(lengths) for _ in row]
    assert not p.bag.flags.writeable and not p.load_after.flags.writeable
    for s in range(p.num_sequences):
        cb = p.chunk_bounds(s)
        g = lay.bag_sizes[p.bag[s]]
        assert cb.shape == (g + 1,) and cb[0] == 0 and cb[-1] == p.lengths[s]
        sizes = np.diff(cb)
        assert (sizes >= 0).all() and sizes.max() - sizes.min() <= 1
        assert (np.diff(sizes) <= 0).all()  # np.array_split: the extra tokens go first
    # loads: recomputed from scratch
    after = np.zeros(8)
    for s in range(p.num_sequences):
        b = p.bag[s]
        for r in lay.bag_ranks[b]:
            after[r] += COST.t(p.lengths[s], len(lay.bag_ranks[b]))
    np.testing.assert_allclose(p.load_after, after, rtol=1e-12)
    assert p.load_after.sum() == pytest.approx(p.load_before.sum(), rel=1e-12)
    assert p.lower_bound <= p.makespan * (1 + 1e-9)
    assert p.gap >= -1e-9
    assert p.tokens_per_gpu().sum() == flat.sum()
    assert 0.0 <= p.tokens_moved_fraction <= 1.0 and 0.0 <= p.sp_tokens_fraction <= 1.0
    s = p.summary()
    assert s["balanced_max_over_mean"] == pytest.approx(p.makespan / p.load_before.mean())
    json.dumps(s)


def test_tokens_fractions_by_hand():
    lay = BagLayout.parse("g1n1+g2n1", 3)
    # one sequence on rank 0 (g1 bag), one of 5 tokens on rank 1 (in the g2 bag)
    p = plan_step([[1], [5], []], lay, COST, solver="ours")
    # both stay in their home bags (ties go home); the 5-token sequence is split 3 + 2 over
    # ranks 1, 2, so 2 of its tokens leave rank 1
    assert p.bag.tolist() == [0, 1]
    assert p.chunk_bounds(1).tolist() == [0, 3, 5]
    assert p.tokens_moved_fraction == pytest.approx(2 / 6)
    assert p.sp_tokens_fraction == pytest.approx(5 / 6)
    assert p.tokens_per_gpu().tolist() == [1, 3, 2]


def test_chunks_when_shorter_than_bag():
    lay = BagLayout.parse("g4n1", 4)
    p = plan_step([[2], [], [], []], lay, COST)
    assert p.chunk_bounds(0).tolist() == [0, 1, 2, 2, 2]
    assert p.tokens_per_gpu().tolist() == [1, 1, 0, 0]


def test_empty_world_plan():
    lay = BagLayout.parse("g2n2", 4)
    p = plan_step([[], [], [], []], lay, COST)
    assert p.num_sequences == 0 and p.makespan == 0.0 and p.gap == 0.0
    assert p.balanced_max_over_mean == 1.0 and p.tokens_moved_fraction == 0.0


def test_max_over_mean_helper():
    assert max_over_mean(np.array([1.0, 3.0])) == pytest.approx(1.5)
    assert max_over_mean(np.zeros(3)) == 1.0


@pytest.mark.parametrize(
    ("lengths", "match"),
    [
        ([[1], [0]], "length 0"),
        ([[1], [-5]], "length -5"),
        ([[1]], "2 ranks|world_size=2"),
        ([[1.5], [2]], "integers"),
        (["ab", [2]], "string"),
        ([[[1, 2]], [2]], "flat list"),
    ],
)
def test_plan_bad_lengths(lengths, match):
    lay = BagLayout.parse("g1n2", 2)
    with pytest.raises(PlanError, match=match):
        plan_step(lengths, lay, COST)


def test_plan_bad_solver_and_options():
    lay = BagLayout.parse("g1n2", 2)
    with pytest.raises(PlanError, match="unknown solver"):
        plan_step([[1], [2]], lay, COST, solver="magic")
    with pytest.raises(PlanError, match="unknown planner option"):
        plan_step([[1], [2]], lay, COST, bogus=1)
    with pytest.raises(PlanError, match="max_tokens_per_gpu must be >= 1"):
        plan_step([[1], [2]], lay, COST, max_tokens_per_gpu=0)


def test_memory_budget_infeasible_is_reported():
    lay = BagLayout.parse("g1n2+g2n1", 4)
    with pytest.raises(InfeasibleError, match="max_tokens_per_gpu=100"):
        plan_step([[500], [], [], []], lay, COST, max_tokens_per_gpu=100)
    with pytest.raises(InfeasibleError, match="do not fit"):
        plan_step([[90, 90, 90], [90, 90], [], []], lay, COST, max_tokens_per_gpu=100)


def test_memory_budget_respected_on_paper_mixture():
    lengths = json.loads(MIXRES.read_text())["ranks"]
    lay = BagLayout.parse("g1n16+g2n4+g4n2", 32, 24)
    free = plan_step(lengths, lay, COST)
    t0 = int(free.tokens_per_gpu().max())
    capped = plan_step(lengths, lay, COST, max_tokens_per_gpu=int(0.9 * t0))
    assert capped.tokens_per_gpu().max() <= int(0.9 * t0) < t0
    assert capped.makespan >= capped.lower_bound * (1 - 1e-9)
    # a budget below the average tokens per GPU is provably infeasible
    avg = sum(map(sum, lengths)) / 32
    with pytest.raises(InfeasibleError, match="do not fit"):
        plan_step(lengths, lay, COST, max_tokens_per_gpu=int(avg) - 1)


# ---------------------------------------------------------------- one cost function


def test_cost_table_is_the_formula():
    """``table`` is ``t`` over sequences x bag sizes, and ``t`` is the basis (the one the
    calibration fit uses) dotted with the coefficients."""
    from knapformer.calibration.fit import FitResult, design_matrix
    from knapformer.planning.cost import cost_terms

    cost = CostModel(a=2.0, b=1e-3, c=0.5, e=7.0)
    L = np.array([1, 100, 5000])
    g = np.array([1, 2, 8])
    tab = cost.table(L, g)
    assert tab.shape == (3, 3)
    np.testing.assert_allclose(tab, cost.t(L[:, None], g[None, :]), rtol=1e-15)
    basis = np.stack(cost_terms(L[:, None], g[None, :]), axis=-1)
    np.testing.assert_allclose(tab, basis @ cost.coefficients, rtol=1e-12)
    fit = FitResult(a=2.0, b=1e-3, c=0.5, e=7.0, fit_mape=0.0)
    np.testing.assert_allclose(fit.predict(L, 2), cost.t(L, 2), rtol=1e-12)
    np.testing.assert_allclose(design_matrix(L, 2) @ cost.coefficients, cost.t(L, 2))


@pytest.mark.parametrize("solver", ["ours", "reference"])
def test_cost_model_change_changes_plans(monkeypatch, solver):
    """Every solver plans with ``CostModel.table``: replacing it (here: splitting a sequence
    costs 3x more per GPU, and the order of sequences is reversed) changes the plans, and the
    plan's loads are the new table's."""
    from knapformer.sim.simulator import simulate

    lengths = json.loads(MIXRES.read_text())["ranks"]
    lay = BagLayout.parse("g1n8+g2n4+g4n2+g8n1", 32, 24)
    before = plan_step(lengths, lay, COST, solver=solver)
    sim_before = simulate([lengths], COST, lay.spec, 24, strategies=(solver_strategy(solver),))
    original = CostModel.table

    def table(self, lens, sizes):
        base = original(self, lens, sizes)
        g = np.asarray(sizes, dtype=np.float64).reshape(1, -1)
        flipped = original(self, 40000 - np.asarray(lens), sizes)
        return np.where(g > 1, 3.0 * base, flipped)

    monkeypatch.setattr(CostModel, "table", table)
    after = plan_step(lengths, lay, COST, solver=solver)
    assert not np.array_equal(before.bag, after.bag)
    sizes = np.asarray(lay.bag_sizes)
    per_seq = table(COST, after.lengths, sizes)[np.arange(after.num_sequences), 0]
    per_seq = np.where(sizes[after.bag] > 1, 3.0 * COST.t(after.lengths, sizes[after.bag]), per_seq)
    loads = np.bincount(after.bag, weights=per_seq, minlength=lay.num_bags)
    np.testing.assert_allclose(after.load_after, loads[np.asarray(lay.bag_of_rank)], rtol=1e-12)
    sim_after = simulate([lengths], COST, lay.spec, 24, strategies=(solver_strategy(solver),))
    assert sim_after.summaries() != sim_before.summaries()


def solver_strategy(solver: str) -> str:
    return "reference" if solver == "reference" else "ours"


def test_planning_modules_import_no_circle():
    """Every import inside ``knapformer.planning`` (module level or in a function, not the
    ``TYPE_CHECKING`` ones) forms an acyclic graph: errors live in their own module, and the
    solvers package never imports ``plan`` back."""
    import ast

    root = Path(knapformer.__file__).parent / "planning"
    names = {}
    for f in root.rglob("*.py"):
        rel = f.relative_to(root.parent.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = f

    def targets(node: ast.AST) -> list[str]:
        out = []
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.append(full if full in names else node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        return [t for t in out if t in names]

    graph: dict[str, set[str]] = {}
    for mod, f in names.items():
        tree = ast.parse(f.read_text())
        skip = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip |= {id(n) for n in ast.walk(node)}
        graph[mod] = {
            t for node in ast.walk(tree) if id(node) not in skip for t in targets(node)
        } - {mod}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            assert state.get(t) != 1, f"import circle: {' -> '.join([*path, t])}"
            if t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert "knapformer.planning.plan" not in set().union(
        *(graph[m] for m in graph if m.startswith("knapformer.planning.solvers"))
    )
