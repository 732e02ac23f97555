"""``Balancer("auto", ...)``: the bag layout adapts at run time on real gloo processes.

One spawn per world size runs every distributed check. The expected layout of every step comes
from an independent oracle in this process (the pure chooser called step by step, with the
hysteresis and window rules written out here), so the workers check that every rank makes that
very decision; route/Ulysses exactness reuses ``test_kf_dist._check_balancer`` and the model
comparison reuses ``test_kf_block``'s model and tolerance check.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knapformer.distributed.autolayout import AutoLayout, node_local_bags
from knapformer.distributed.groups import GroupSetupError, local_creation_schedule
from knapformer.planning import BagLayout, CostModel, LayoutError
from knapformer.planning.auto import allowed_bag_sizes, candidate_specs, choose_layout, spans_nodes

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _dist_utils import run_workers

# a = projections/MLP, b = attention, c = the Ulysses all-to-all: splitting is not free
COST = CostModel(a=1.0, b=1e-3, c=0.5, name="test")
HEADS, GPN, HYST = 8, 4, 0.02
MODEL_HEADS = 4  # test_kf_block's model


def _huge(world: int, rank: int, L: int, short: int = 64, n: int = 3) -> list[list[int]]:
    """One sequence of ``L`` tokens on ``rank``, ``n`` short ones everywhere else."""
    return [[L] if r == rank else [short] * n for r in range(world)]


def _short(world: int, short: int = 64, n: int = 4) -> list[list[int]]:
    return [[short] * n for _ in range(world)]


def _oracle(steps, world, heads, window=1, hysteresis=HYST) -> list[str]:
    """Expected spec per step: decide on step 0 and every ``window`` steps, else keep."""
    out: list[str] = []
    cur = None
    for i, lengths in enumerate(steps):
        if cur is None or i % window == 0:
            cur = choose_layout(
                lengths, world, heads, GPN, COST, current=cur, hysteresis=hysteresis
            )
        out.append(cur)
    return out


def _max_bag(spec: str, world: int) -> int:
    return max(BagLayout.parse(spec, world).bag_sizes)


# ---------------------------------------------------------------------------------------------
# pure checks (no processes)
# ---------------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    world=st.sampled_from([4, 8, 12, 16]),
    heads=st.sampled_from([8, 6, 24, 3]),
    gpn=st.sampled_from([2, 4, 6, 8]),
    seed=st.integers(0, 10_000),
)
def test_group_universe_covers_every_layout_the_chooser_can_return(world, heads, gpn, seed):
    """Creating the groups of all node-local windows up front is enough, whatever the data."""
    if world % gpn:
        gpn = world
    rng = np.random.default_rng(seed)
    lengths = [
        [int(x) for x in np.exp(rng.uniform(np.log(8), np.log(40000), rng.integers(0, 5)))]
        for _ in range(world)
    ]
    cost = CostModel(a=1.0, b=rng.uniform(0, 1e-3), c=rng.uniform(0, 2), name="rnd")
    bags = set(node_local_bags(world, allowed_bag_sizes(world, heads, gpn), gpn))
    for spec in candidate_specs(lengths, world, heads, gpn, cost):
        lay = BagLayout.parse(spec, world, heads)
        assert {b for b in lay.bag_ranks if len(b) > 1} <= bags, spec
    sched = AutoLayout(world, heads, gpn, cost)
    layout, changed = sched.decide(lengths)  # raises if a bag has no group
    assert changed and not spans_nodes(layout, gpn)
    assert all(heads % g == 0 and gpn % g == 0 for g in layout.bag_sizes)


def test_node_local_bags():
    assert node_local_bags(8, [1, 2, 4], 4) == [
        (0, 1), (1, 2), (2, 3), (4, 5), (5, 6), (6, 7), (0, 1, 2, 3), (4, 5, 6, 7),
    ]  # fmt: skip
    assert node_local_bags(4, [1], 4) == []
    assert node_local_bags(4, [2], 8) == [(0, 1), (1, 2), (2, 3)]  # group smaller than a node


def test_schedule_window_hysteresis_and_state():
    steps = [_short(4), _huge(4, 2, 3000), _huge(4, 2, 3000), _short(4), _short(4)]
    sched = AutoLayout(4, HEADS, GPN, COST, window=2)
    got = [sched.decide(s) for s in steps]
    assert [lay.spec for lay, _ in got] == _oracle(steps, 4, HEADS, window=2)
    assert [lay.spec for lay, _ in got] == ["g1n4", "g1n4", "g4n1", "g4n1", "g1n4"]
    assert [c for _, c in got] == [True, False, True, False, True]
    assert sched.state_dict() == {"layout": "g1n4", "step": 5}
    other = AutoLayout(4, HEADS, GPN, COST, window=2)
    other.load_state_dict(sched.state_dict())
    assert other.decide(_huge(4, 2, 3000)) == sched.decide(_huge(4, 2, 3000))


def test_schedule_errors():
    for kwargs, needle in [
        ({"window": 0}, "window"),
        ({"hysteresis": -0.1}, "hysteresis"),
        ({"candidates": ["g2n1+g4n1+g2n1"]}, "spanning two nodes"),
        ({"candidates": ["g1n4"]}, "must cover all 8 ranks"),
        ({"candidates": "g1n8"}, "non-empty list"),
        ({"current": "g8n1"}, "spanning two nodes"),
    ]:
        with pytest.raises(LayoutError, match=needle):
            AutoLayout(8, HEADS, GPN, COST, **kwargs)
    with pytest.raises(LayoutError, match="whole number of nodes"):
        AutoLayout(6, HEADS, GPN, COST)
    sched = AutoLayout(8, HEADS, GPN, COST, candidates=["g1n8", "g1n4+g4n1"])
    assert sched.bags == ((4, 5, 6, 7),)
    with pytest.raises(LayoutError, match="none of the candidate layouts has"):
        sched.load_state_dict({"layout": "g4n2", "step": 0})
    with pytest.raises(LayoutError, match="step"):
        sched.load_state_dict({"layout": "g1n8", "step": -1})


def test_auto_creates_few_process_groups_at_1024_gpus():
    """Pure planning at a simulated 1,024-GPU world (no processes): the groups auto needs are
    the distinct multi-GPU bags of the layouts it chooses, far fewer than every node-local bag
    it might use (1,664 with bags of 2, 4 and 8 GPUs on 8-GPU nodes), which the eager scheme
    created at construction."""
    from knapformer.sim.datacodes import resolve_mixture, sample_steps

    cost = CostModel.flops(3072, 1.0)
    counts = {}
    for mix in ("mixres", "joint"):
        sched = AutoLayout(1024, 24, 8, cost)
        assert len(sched.bags) == 1664
        chosen: set[tuple[int, ...]] = set()
        for step in sample_steps(resolve_mixture(mix), 1024, 4, seed=0):
            lay, _ = sched.decide(step)
            assert lay.world_size == 1024 and not spans_nodes(lay, 8)
            chosen |= {b for b in lay.bag_ranks if len(b) > 1}
        assert sched.num_groups == len(chosen) == len(sched.used_bags) > 0
        counts[mix] = sched.num_groups
    assert max(counts.values()) < 1664 // 4, counts
    print(f"process groups auto needs at 1024 GPUs: {counts} (eager: 1664)")


def test_local_group_schedule_pads_members_that_are_behind():
    """torch names a locally synchronised group by ranks and the caller's group count."""
    bags = [(0, 1), (1, 2), (2, 3), (0, 1, 2, 3)]
    pending = {r: [b for b in bags if r in b] for r in range(4)}
    sched = local_creation_schedule({0: 2, 1: 2, 2: 2, 3: 5}, pending)
    # every rank walks the same sorted order; counts are equal when a bag is created
    assert sched[0] == [(0, (0, 1)), (2, (0, 1, 2, 3))]
    assert sched[1] == [(0, (0, 1)), (2, (0, 1, 2, 3)), (0, (1, 2))]
    assert sched[2] == [(3, (0, 1, 2, 3)), (0, (1, 2)), (0, (2, 3))]
    assert sched[3] == [(0, (0, 1, 2, 3)), (1, (2, 3))]
    count = {0: 2, 1: 2, 2: 2, 3: 5}
    for bag in sorted(bags):
        at = set()
        for r in bag:
            pad = next(p for p, b in sched[r] if b == bag)
            count[r] += pad
            at.add(count[r])
            count[r] += 1
        assert len(at) == 1, bag
    with pytest.raises(GroupSetupError, match="already hold"):
        local_creation_schedule({0: 1, 1: 1}, {0: [(0, 1)], 1: []})


# ---------------------------------------------------------------------------------------------
# distributed worker (runs inside the spawned ranks)
# ---------------------------------------------------------------------------------------------


def _counters() -> dict[str, int]:
    """Groups this process created: torch's own counter of new_group calls plus our cache."""
    import torch.distributed as dist

    from knapformer.distributed import group_cache_size

    world = dist.distributed_c10d._world
    return {
        "new_group_calls": int(world.group_count),
        "member_groups": len(world.pg_map),
        "cache": group_cache_size(),
    }


def _diff(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: b[k] - a[k] for k in a}


def _expect_error(name: str, fn, msgs: dict[str, str]) -> None:
    from knapformer.distributed import BalancerError

    try:
        fn()
    except BalancerError as exc:
        msgs[name] = str(exc)
        return
    raise AssertionError(f"{name}: no BalancerError")


def auto_worker(rank: int, world: int, case: dict) -> dict:
    import os

    import torch
    import torch.distributed as dist
    from _reference_model import balanced_forward, local_attention
    from test_kf_block import _model, _packed
    from test_kf_dist import _check_balancer

    from knapformer.distributed import Balancer

    os.environ.pop("LOCAL_WORLD_SIZE", None)  # gpus_per_node from the arguments only
    out: dict = {"errors": {}, "counters": {}}
    stats = {"max_chunks_in_bag": 0, "steps": 0, "ulysses_tokens": 0}

    def auto(**kw):
        kw.setdefault("num_heads", HEADS)
        kw.setdefault("gpus_per_node", GPN)
        return Balancer("auto", COST, **kw)

    def run_steps(bal, steps, expected) -> list[tuple[str, bool]]:
        log = []
        for lengths, spec in zip(steps, expected, strict=True):
            # plan_step + route/reverse_route bit-exact + Ulysses round trip + gradients
            _check_balancer(bal, spec, [lengths], stats)
            assert bal.layout_spec == spec == bal.plan.layout.spec
            lay = bal.layout
            assert not spans_nodes(lay, GPN) and all(HEADS % g == 0 for g in lay.bag_sizes)
            assert bal.bag_size == len(bal.bag_ranks) and bal.rank in bal.bag_ranks
            log.append((bal.layout_spec, bal.layout_changed))
        return log

    c0 = _counters()
    bal = auto(hysteresis=HYST)
    c1 = _counters()
    out["counters"]["construction"] = _diff(c0, c1)
    out["main"] = run_steps(bal, case["steps"], case["expected"])
    c2 = _counters()
    out["counters"]["main_steps"] = _diff(c1, c2)
    out["state"] = bal.state_dict()
    out["created_main"] = bal.process_groups_created

    win = auto(window=2)
    out["window"] = run_steps(win, case["window_steps"], case["window_expected"])
    h6 = auto(num_heads=6)
    out["heads6"] = run_steps(h6, case["h6_steps"], case["h6_expected"])
    c3 = _counters()
    out["counters"]["other_balancers"] = _diff(c2, c3)

    # Ranks holding different state decide differently: refused before any token moves.
    dis = auto(hysteresis=1.0)  # 1.0: always keep the current layout
    a, b = case["disagree_specs"]
    dis.load_state_dict({"layout": a if rank == 1 else b, "step": 3})
    lengths = case["steps"][0][rank]
    dis.plan_step(lengths)
    x = torch.randn(sum(lengths), 3, dtype=torch.float64)
    _expect_error("disagree", lambda: dis.route(x), out["errors"])
    dis.load_state_dict({"layout": b, "step": 3})
    dis.plan_step(lengths)
    assert torch.equal(dis.reverse_route(dis.route(x)), x)

    # Configuration errors agree on every rank and create no group.
    c4 = _counters()
    _expect_error("no_heads", lambda: Balancer("auto", COST, gpus_per_node=GPN), out["errors"])
    _expect_error("window", lambda: auto(window=0), out["errors"])
    _expect_error(
        "fixed_hyst", lambda: Balancer(f"g1n{world}", COST, hysteresis=0.1), out["errors"]
    )
    _expect_error(
        "disagree_gpn", lambda: auto(gpus_per_node=GPN if rank else GPN // 2), out["errors"]
    )
    _expect_error(
        "state", lambda: dis.load_state_dict({"layout": "g3n1", "step": 0}), out["errors"]
    )

    out["counters"]["refused_configs"] = _diff(c4, _counters())

    # Model: outputs and summed gradients equal the single-process reference while the layout
    # changes between two micro-batches whose backward runs only after both forwards.
    rows = []
    mbal = auto(num_heads=MODEL_HEADS)
    model = _model()
    for mode in ("plain", "causal"):
        causal = mode == "causal"
        model.zero_grad()
        ref_outs, ref_xgrads, total = [], [], 0.0
        data = []
        for step, lengths in enumerate(case["model_steps"]):
            flat = [L for r in lengths for L in r]
            gen = torch.Generator().manual_seed(7 + step)
            X = torch.randn(sum(flat), 6, generator=gen, dtype=torch.float64)
            W = torch.randn(sum(flat), 6, generator=gen, dtype=torch.float64)
            pos, cu = _packed(flat)
            Xr = X.clone().requires_grad_()
            ref = model(Xr, pos, local_attention(cu, max(flat), causal))
            total = total + (ref * W).sum()
            off = sum(sum(r) for r in lengths[:rank])
            T = sum(lengths[rank])
            data.append((X, W, pos, off, T, Xr))
            ref_outs.append(ref.detach())
        total.backward()
        ref_grads = [p.grad.clone() for p in model.parameters()]
        ref_xgrads = [d[5].grad for d in data]
        model.zero_grad()
        total, outs, xs, specs = 0.0, [], [], []
        for lengths, (X, W, pos, off, T, _) in zip(case["model_steps"], data, strict=True):
            mbal.plan_step(lengths[rank])
            specs.append((mbal.layout_spec, mbal.layout_changed))
            x = X[off : off + T].clone().requires_grad_()
            y = balanced_forward(model, mbal, x, pos[off : off + T], causal=causal)
            total = total + (y * W[off : off + T]).sum()
            outs.append(y.detach())
            xs.append(x)
        total.backward()  # both micro-batches, after the layout changed
        grad_err = 0.0
        for p, rg in zip(model.parameters(), ref_grads, strict=True):
            gsum = p.grad.clone()
            dist.all_reduce(gsum)
            grad_err = max(grad_err, float((gsum - rg).abs().max() / rg.abs().max()))
        for i, (_, _, _, off, T, _) in enumerate(data):
            o = float((outs[i] - ref_outs[i][off : off + T]).abs().max()) if T else 0.0
            xg = float((xs[i].grad - ref_xgrads[i][off : off + T]).abs().max()) if T else 0.0
            rows.append({"spec": specs[i], "mode": mode, "out": o, "grad": grad_err, "xgrad": xg})
    out["model"] = rows
    out["counters"]["all_steps"] = _diff(c1, _counters())
    out["groups_total"] = _counters()["cache"]

    if case.get("sub_steps"):
        # Auto over each half of the world (one node each): bag groups are created with local
        # synchronisation by their members only, when a layout first needs them.
        half = world // 2
        halves = [dist.new_group(list(range(i, i + half))) for i in (0, half)]
        s0 = _counters()
        sub = auto(group=halves[rank // half])
        s1 = _counters()
        out["sub"] = run_steps(sub, case["sub_steps"], case["sub_expected"])
        out["counters"]["sub_construction"] = _diff(s0, s1)
        out["counters"]["sub_steps"] = _diff(s1, _counters())
    out["stats"] = stats
    return out


# ---------------------------------------------------------------------------------------------
# distributed test (one spawn per world size)
# ---------------------------------------------------------------------------------------------


def _case(world: int) -> dict:
    if world == 4:
        steps = [_short(4), _huge(4, 2, 800), _hysteresis_step(4, 2, 800), _huge(4, 2, 3000)]
        steps.append(_short(4))
        hyst_step = 2
        sub_steps = []
    else:
        steps = [_short(8), _huge(8, 5, 500), _huge(8, 5, 3000), _short(8)]
        hyst_step = None
        sub_steps = [_short(4), _huge(4, 2, 3000), _huge(4, 0, 600)]
    expected = _oracle(steps, world, HEADS)
    # The oracle's decisions have the properties the test is about (teeth for the workers).
    assert all(_max_bag(expected[i], world) == 1 for i in (0, len(steps) - 1)), expected
    assert all(_max_bag(s, world) > 1 for s in expected[1:-1]), expected
    if hyst_step is not None:
        free = choose_layout(steps[hyst_step], world, HEADS, GPN, COST)
        assert free != expected[hyst_step] == expected[hyst_step - 1], (free, expected)
    window_steps = [_short(world), _huge(world, 1, 3000), _huge(world, 1, 3000), _short(world)]
    window_expected = _oracle(window_steps, world, HEADS, window=2)
    assert window_expected[1] == window_expected[0] != window_expected[2], window_expected
    h6_steps = [_huge(world, world - 1, 3000)]
    h6_expected = _oracle(h6_steps, world, 6)
    assert _max_bag(h6_expected[0], world) == 2  # 4 does not divide 6 heads
    model_steps = [_short(world, 8, 2), _huge(world, 1, 600, 8, 2)]
    model_expected = _oracle(model_steps, world, MODEL_HEADS)
    assert _max_bag(model_expected[0], world) == 1 < _max_bag(model_expected[1], world)
    return {
        "steps": steps,
        "expected": expected,
        "window_steps": window_steps,
        "window_expected": window_expected,
        "h6_steps": h6_steps,
        "h6_expected": h6_expected,
        "model_steps": model_steps,
        "model_expected": model_expected,
        "disagree_specs": (expected[1], expected[0]),
        "sub_steps": sub_steps,
        "sub_expected": _oracle(sub_steps, world // 2, HEADS),
    }


def _hysteresis_step(world: int, rank: int, L: int) -> list[list[int]]:
    """A slightly longer huge sequence whose free choice differs from the layout chosen for
    ``L``, while that layout is within the hysteresis: found by a short scan, so the test does
    not depend on the chooser's exact break-even points."""
    prev = choose_layout(_huge(world, rank, L), world, HEADS, GPN, COST)
    for L2 in range(L + 10, 2 * L, 10):
        step = _huge(world, rank, L2)
        free = choose_layout(step, world, HEADS, GPN, COST)
        kept = choose_layout(step, world, HEADS, GPN, COST, current=prev, hysteresis=HYST)
        if free != prev == kept:
            return step
    raise AssertionError(f"no length after {L} where hysteresis keeps {prev!r}")


def _bags(specs: list[str], world: int) -> set[tuple[int, ...]]:
    """Multi-GPU bags of the given layouts: the process groups they need."""
    return {b for s in specs for b in BagLayout.parse(s, world).bag_ranks if len(b) > 1}


def _changes(specs: list[str]) -> list[bool]:
    return [i == 0 or s != specs[i - 1] for i, s in enumerate(specs)]


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [4, 8])
def test_auto_layout_adapts_and_stays_exact(tmp_path, world):
    from test_kf_block import _check

    case = _case(world)
    res = run_workers(__file__, "auto_worker", world, tmp_path, args=(case,), timeout=230)
    universe = node_local_bags(world, allowed_bag_sizes(world, HEADS, GPN), GPN)
    used_main = _bags(case["expected"], world)
    used_other = _bags(case["window_expected"] + case["h6_expected"], world) - used_main
    used_all = used_main | used_other | _bags(case["model_expected"], world)
    for rank, r in enumerate(res):
        assert r["main"] == list(zip(case["expected"], _changes(case["expected"]), strict=True))
        assert r["window"] == list(
            zip(case["window_expected"], _changes(case["window_expected"]), strict=True)
        )
        assert [s for s, _ in r["heads6"]] == case["h6_expected"]
        assert r["state"] == {"layout": case["expected"][-1], "step": len(case["steps"])}
        # Groups: none at construction; each bag of a chosen layout once, when first chosen
        # (every rank creates the WORLD groups of every bag, member or not); later balancers
        # create only the bags not there yet, refused configs none.
        c = r["counters"]
        assert set(c["construction"].values()) == {0}, (rank, c)
        assert c["main_steps"]["new_group_calls"] == len(used_main) == r["created_main"], c
        assert c["main_steps"]["cache"] == len(used_main), (rank, c)
        assert c["main_steps"]["member_groups"] == sum(rank in b for b in used_main), c
        assert c["other_balancers"]["cache"] == len(used_other), (rank, c)
        assert set(c["refused_configs"].values()) == {0}, (rank, c)
        assert r["groups_total"] == len(used_all) < len(universe)
        assert [row["spec"] for row in r["model"]] == [
            (s, True) for s in case["model_expected"]
        ] * 2
        if case["sub_steps"]:
            assert [s for s, _ in r["sub"]] == case["sub_expected"]
            half = world // 2
            sub_universe = node_local_bags(half, allowed_bag_sizes(half, HEADS, GPN), GPN)
            used_sub = _bags(case["sub_expected"], half) & set(sub_universe)
            mine = sum(rank % half in b for b in used_sub)
            assert set(c["sub_construction"].values()) == {0}, (rank, c)
            assert c["sub_steps"]["cache"] == mine > 0, (rank, c)
    _check([r["model"] for r in res])
    assert max(r["stats"]["max_chunks_in_bag"] for r in res) >= 2
    errors = [r["errors"] for r in res]
    expect = {
        "disagree": "ranks computed different plans",
        "no_heads": "needs num_heads",
        "window": "window must be a positive integer",
        "fixed_hyst": "only apply to layout 'auto'",
        "disagree_gpn": "disagree on the balancer's gpus_per_node",
        "state": "invalid balancer state",
    }
    for rank, e in enumerate(errors):
        assert set(e) == set(expect), rank
        for name, needle in expect.items():
            assert needle in e[name], (rank, name, e[name])
    a, b = case["disagree_specs"]
    assert f"rank 1: {a}" in errors[0]["disagree"] and f"rank 0: {b}" in errors[0]["disagree"]
    for name in expect:
        if name != "state":  # a local check: nothing to agree on
            assert len({e[name] for e in errors}) == 1, name
