"""Balancer on real gloo process groups: routing is exact, Ulysses layout is right, errors agree.

Each test spawns one set of processes (see ``_dist_utils``) and runs several layouts / checks in
it, so the suite stays fast on small machines.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _dist_utils import run_workers

pytestmark = pytest.mark.distributed

HEADS = 4


# ---------------------------------------------------------------------------------------------
# workers (run inside the spawned ranks)
# ---------------------------------------------------------------------------------------------


def _expected_x(seq, pos):
    import torch

    base = (seq * 1000 + pos).to(torch.float64)
    return torch.stack([base + 1 / 3, -base, base * 0.5 + 1 / 7], dim=1)


def route_worker(
    rank: int,
    world: int,
    cases: list[tuple[str, list[list[list[int]]]]],
    sub_cases: list[tuple[str, list[list[list[int]]]]] = (),  # type: ignore[assignment]
) -> dict:
    """For each (spec, steps): plan every step, route + reverse + Ulysses round trips.

    ``sub_cases`` run on balancers over two halves of the world (``group=`` sub-groups), with
    lengths given per group-local rank.
    """
    import torch.distributed as dist

    from knapformer.distributed import Balancer
    from knapformer.planning.cost import CostModel

    stats = {"max_chunks_in_bag": 0, "steps": 0, "ulysses_tokens": 0}
    cost = CostModel.flops(64, gamma=1.0)
    if sub_cases:  # first, so that WORLD balancers later meet locally created bag groups
        half = world // 2
        halves = [dist.new_group(list(range(i, i + half))) for i in (0, half)]
        mine = halves[rank // half]
        for spec, steps in sub_cases:
            bal = Balancer(spec, cost, num_heads=HEADS, group=mine)
            assert bal.world_size == half and bal.rank == rank % half
            _check_balancer(bal, spec, steps, stats)
    for spec, steps in cases:
        _check_balancer(Balancer(spec, cost, num_heads=HEADS), spec, steps, stats)
    return stats


def _check_balancer(bal, spec: str, steps: list[list[list[int]]], stats: dict) -> None:
    import torch

    rank = bal.rank
    for step, lengths in enumerate(steps):
        # Step 2 passes a tensor (as a data loader would); an empty one comes out float32.
        plan = bal.plan_step(torch.tensor(lengths[rank]) if step else lengths[rank])
        t = bal.tables
        assert plan.layout.spec == spec and t.num_local_tokens == sum(lengths[rank])
        # each rank planned only its own replica: the plan holds that replica's sequences
        group = bal.layout.group_size
        first = rank - rank % group
        assert plan.layout.world_size == group
        assert plan.num_sequences == sum(len(r) for r in lengths[first : first + group])
        assert bal.seq_offset == sum(len(r) for r in lengths[:first])
        seq = torch.from_numpy(t.local_seq_ids.copy())
        pos = torch.from_numpy(t.local_positions.copy())
        big = (seq << 40) + pos + 1023  # not representable in bf16/fp32
        x = _expected_x(seq, pos).requires_grad_()
        gen = torch.Generator().manual_seed(1000 * rank + step)
        noise = torch.randn(t.num_local_tokens, 2, 2, generator=gen, dtype=torch.float32)
        bf = torch.randn(t.num_local_tokens, generator=gen).to(torch.bfloat16)
        tag = pos % 3 == 0
        i32 = (pos + 2**31 - 1000).to(torch.int32)
        # integers whose bytes read as float NaNs (quiet and signalling): integer features
        # ride in the tokens' float buffer by their bytes, which must come through unchanged
        nan_bits = torch.stack((-1 - seq, seq + 0x7FF0000000000001), dim=1)
        inputs = (x, seq, pos, big, noise, bf, tag, i32, nan_bits)
        routed = bal.route(*inputs)
        rx, rseq, rpos, rbig, _, _, rtag, ri32, rnan = routed
        assert torch.equal(rnan, torch.stack((-1 - rseq, rseq + 0x7FF0000000000001), dim=1))
        assert torch.equal(rseq, torch.from_numpy(t.token_seq_ids.copy()))
        assert torch.equal(rpos, torch.from_numpy(t.token_positions.copy()))
        assert torch.equal(rpos, bal.balanced_positions())
        assert torch.equal(rbig, (rseq << 40) + rpos + 1023)
        assert torch.equal(rtag, rpos % 3 == 0) and rtag.dtype == torch.bool
        assert torch.equal(ri32, (rpos + 2**31 - 1000).to(torch.int32))
        assert torch.equal(rx, _expected_x(rseq, rpos))
        assert all(r.dtype == i.dtype for r, i in zip(routed, inputs, strict=True))
        back = bal.reverse_route(*(r.detach() for r in routed))
        for b, i in zip(back, inputs, strict=True):
            assert b.dtype == i.dtype and torch.equal(b, i.detach())
        # backward of route == reverse route of the upstream gradient
        w = torch.randn(rx.shape, generator=gen, dtype=torch.float64)
        (rx * w).sum().backward()
        assert torch.equal(x.grad, bal.reverse_route(w))

        # Ulysses: [T, H, D] chunks -> whole sequences with H/g heads, and back.
        g = bal.bag_size
        T = t.num_balanced_tokens
        head = torch.arange(HEADS, dtype=torch.float64)
        q = torch.stack(
            [
                (rseq * 1000 + rpos).to(torch.float64)[:, None].expand(T, HEADS),
                head[None, :].expand(T, HEADS),
            ],
            dim=-1,
        ).requires_grad_()
        a = bal.pre_attn(q, 2 * q, 3 * q)
        hg = HEADS // g
        cu = a.cu_seqlens.tolist()
        assert a.q.shape == (cu[-1], hg, 2)
        for i, s in enumerate(t.seq_ids.tolist()):
            L = cu[i + 1] - cu[i]
            assert plan.lengths[s - bal.seq_offset] == L  # (the plan covers this replica)
            rows = a.q[cu[i] : cu[i + 1]].detach()
            want0 = (s * 1000 + torch.arange(L, dtype=torch.float64))[:, None]
            assert torch.equal(rows[..., 0], want0.expand(L, hg))
            want1 = (t.peer * hg + torch.arange(hg, dtype=torch.float64))[None, :]
            assert torch.equal(rows[..., 1], want1.expand(L, hg))
        assert torch.equal(a.k, 2 * a.q) and torch.equal(a.v, 3 * a.q)
        assert a.max_seqlen == (max(cu[i + 1] - cu[i] for i in range(len(cu) - 1)) if T else 0)
        assert torch.equal(bal.post_attn(a.q.detach()), q.detach())
        w2 = torch.randn(a.q.shape, generator=gen, dtype=torch.float64)
        (a.q * w2).sum().backward()
        assert torch.equal(q.grad, bal.post_attn(w2))
        if g > 1:
            stats["ulysses_tokens"] += cu[-1]
            nonempty = (plan.chunk_bounds(s - bal.seq_offset) for s in t.seq_ids.tolist())
            stats["max_chunks_in_bag"] = max(
                [stats["max_chunks_in_bag"]] + [int((b[1:] > b[:-1]).sum()) for b in nonempty]
            )
        stats["steps"] += 1


def bad_input_worker(rank: int, world: int) -> dict:
    """Every check must raise BalancerError on every rank; afterwards the group still works."""
    import torch

    from knapformer.distributed import Balancer, BalancerError
    from knapformer.planning.cost import CostModel

    cost = CostModel.flops(64)
    msgs: dict[str, str] = {}

    def expect_error(name, fn):
        try:
            fn()
        except BalancerError as exc:
            msgs[name] = str(exc)
            return
        raise AssertionError(f"{name}: no error raised on rank {rank}")

    expect_error("heads", lambda: Balancer("g2n2", cost, num_heads=3))
    expect_error("world", lambda: Balancer("g3n1", cost, num_heads=3))
    expect_error(
        "disagree_spec", lambda: Balancer("g2n2" if rank == 0 else "g4n1", cost, num_heads=4)
    )
    expect_error("disagree_heads", lambda: Balancer("g2n2", cost, num_heads=4 if rank != 2 else 8))
    bal = Balancer("g2n2", cost, num_heads=4)
    assert bal._ctrl_device.type == "cpu"  # agreement tensors never wait for a device
    expect_error("zero_length", lambda: bal.plan_step([3, 0] if rank == 1 else [2]))
    expect_error("negative_length", lambda: bal.plan_step([-4] if rank == 3 else [2, 2]))
    expect_error("float_length", lambda: bal.plan_step([2.5] if rank == 0 else [2]))
    lengths = [[3, 2], [], [5], [1, 1, 1]][rank]
    bal.plan_step(lengths)
    T = sum(lengths)
    x = torch.randn(T, 4, dtype=torch.float64)
    pos = torch.arange(T)
    bad_pos = torch.arange(T + 1) if rank == 2 else pos
    expect_error("feature_rows", lambda: bal.route(x, bad_pos))
    bad_x = torch.randn(T + 2, 4, dtype=torch.float64) if rank == 0 else x
    expect_error("token_rows", lambda: bal.route(bad_x, pos[: bad_x.shape[0]]))
    expect_error("dtype_disagree", lambda: bal.route(x.float() if rank == 1 else x, pos))
    seqs = len(lengths) + (1 if rank == 2 else 0)  # e.g. conditioning of another batch
    expect_error("sequences", lambda: bal.route(x, pos, sequences=seqs))
    y = bal.route(x, sequences=len(lengths))
    expect_error("reverse_rows", lambda: bal.reverse_route(y[:-1] if rank == 3 else y))
    q = torch.randn(bal.tables.num_balanced_tokens, 3, 2)
    expect_error("attn_heads", lambda: bal.pre_attn(q, q, q))
    # Bag-level checks are agreed inside the bag: rank 1's bad k fails its whole bag (0, 1)
    # with the same message, while bag (2, 3) runs its all-to-all undisturbed.
    good = torch.randn(bal.tables.num_balanced_tokens, 4, 2)
    bad_k = torch.randn(good.shape[0] + 1, 4, 2) if rank == 1 else good
    if rank in (0, 1):
        expect_error("attn_rows_in_bag", lambda: bal.pre_attn(good, bad_k, good))
    else:
        a = bal.pre_attn(good, good, good)
        # ... and rank 2's bad attention output fails bag (2, 3) alike in post_attn
        out = a.q[:-1] if rank == 2 else a.q
        expect_error("attn_out_in_bag", lambda: bal.post_attn(out))
    # The communicator is still in sync after all the refused calls.
    assert torch.equal(bal.reverse_route(bal.route(x)), x)
    a = bal.pre_attn(good, good, good)
    assert torch.equal(bal.post_attn(a.q), good)
    # agree=False (the parallelized model's path): no gather, the check still runs, locally.
    expect_error("attn_heads_local", lambda: bal.pre_attn(q, q, q, agree=False))
    a = bal.pre_attn(good, good, good, agree=False)
    assert torch.equal(bal.post_attn(a.q, agree=False), good)
    return msgs


def bag_timeout_worker(rank: int, world: int, ctimeout: float) -> dict:
    """Rank 1 fails before pre_attn and stays alive; its bag peer (rank 0) must fail within
    the process group's timeout, not torch's 30-minute default for new groups."""
    import time

    import torch

    from knapformer.distributed import Balancer
    from knapformer.distributed.groups import group_timeout
    from knapformer.planning.cost import CostModel

    bal = Balancer("g2n2", CostModel.flops(64), num_heads=4)
    out: dict = {"bag_timeout_s": group_timeout(bal.bag_group).total_seconds()}
    bal.plan_step([[3, 2], [4], [5], [1, 1, 1]][rank])
    q = torch.randn(bal.tables.num_balanced_tokens, 4, 2)
    if rank == 1:
        time.sleep(ctimeout + 4)  # "failed" (e.g. caught an error) and stays alive
        return out
    t0 = time.monotonic()
    try:
        bal.pre_attn(q, q, q)
        out["raised"] = None
    except Exception as exc:  # the bag group's timeout fires
        out["raised"] = type(exc).__name__
    out["elapsed_s"] = time.monotonic() - t0
    return out


# ---------------------------------------------------------------------------------------------
# tests (run in the pytest process)
# ---------------------------------------------------------------------------------------------


def _steps(first: list[list[int]]) -> list[list[list[int]]]:
    """Two steps: the given lengths and a re-shuffled variant (re-planning, cache reset)."""
    second = [list(reversed(r)) for r in reversed(first)]
    return [first, second]


CASES_2 = [
    ("g2n1", _steps([[1, 5, 7], []])),
    ("g1n2", _steps([[30, 1], [2]])),  # 30 exceeds every bag's capacity
    # fewer sequences than the widest step (the lengths ride with the check), then more
    ("g2n1", [[[1, 5, 7], []], [[2], [3]], [[], []], [[4, 1, 1, 2], [6]]]),
]
CASES_4 = [
    ("g2n2", _steps([[3, 1], [], [9, 2, 4], [1]])),
    ("g4n1", _steps([[1, 2, 3], [7], [], [10, 1]])),  # lengths < 4: empty chunks
    ("g1n2", _steps([[40, 1], [], [5, 6, 7], [3]])),  # two replicas of g1n2
]
SUB_CASES_4 = [("g2n1", _steps([[3, 1], [5]])), ("g1n2", _steps([[], [4, 4, 1]]))]
CASES_8 = [
    ("g1n2+g2n1+g4n1", _steps([[200], [], [1, 1, 1], [5, 13], [3], [], [7, 2, 9], [1]])),
    ("g2n2", _steps([[3], [11, 1], [], [6], [2, 2], [], [17], [1, 5]])),  # two replicas
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "world,cases,sub_cases",
    [
        pytest.param(2, CASES_2, [], id="w2"),
        pytest.param(4, CASES_4, SUB_CASES_4, id="w4+subgroups"),
        pytest.param(8, CASES_8, [], id="w8"),
    ],
)
def test_route_reverse_and_ulysses_are_exact(tmp_path, world, cases, sub_cases):
    stats = run_workers(
        __file__, "route_worker", world, tmp_path, args=(cases, sub_cases), timeout=170
    )
    assert all(s["steps"] == sum(len(c[1]) for c in cases + sub_cases) for s in stats)
    # The Ulysses checks really exercised multi-chunk sequences.
    assert max(s["max_chunks_in_bag"] for s in stats) >= 2
    assert sum(s["ulysses_tokens"] for s in stats) > 0


@pytest.mark.timeout(120)
def test_bad_input_errors_on_every_rank(tmp_path):
    msgs = run_workers(
        __file__, "bad_input_worker", 4, tmp_path, timeout=110, collective_timeout=20
    )
    expect = {
        "heads": "num_heads=3",
        "world": "does not divide world_size=4",
        "disagree_spec": "disagree",
        "disagree_heads": "num_heads",
        "zero_length": "rank 1: sequence #1 has length 0",
        "negative_length": "rank 3: sequence #0 has length -4",
        "float_length": "rank 0: lengths must be integers",
        "feature_rows": "rank 2: route: features[0] has first dimension",
        "token_rows": "rank 0: route: tokens have",
        "dtype_disagree": "different dtypes",
        "reverse_rows": "rank 3: reverse_route",
        "sequences": "rank 2: route: 2 sequences given, this rank's plan has 1",
        "attn_heads": "not divisible by the bag size 2",
        "attn_heads_local": "not divisible by the bag size 2",
    }
    in_bag = {
        "attn_rows_in_bag": ("rank 1: pre_attn: tensor #1 has", (0, 1)),
        "attn_out_in_bag": ("rank 2: post_attn: expected", (2, 3)),
    }
    for rank, m in enumerate(msgs):
        mine = {n for n, (_, ranks) in in_bag.items() if rank in ranks}
        assert set(m) == set(expect) | mine, rank
        for name, needle in expect.items():
            assert needle in m[name], (rank, name, m[name])
        for name in mine:
            assert in_bag[name][0] in m[name], (rank, name, m[name])
        assert m["attn_heads_local"].startswith("bad input in the bag of ranks"), rank
        assert f"rank {rank}: pre_attn" in m["attn_heads_local"], (rank, m["attn_heads_local"])
    # Collective errors carry the same message on every rank (bag checks: of the bag).
    for name in expect:
        if name not in ("dtype_disagree", "attn_heads", "attn_heads_local"):
            assert len({m[name] for m in msgs}) == 1, name
    same_in = [("attn_heads", (0, 1)), ("attn_heads", (2, 3))]
    same_in += [(name, ranks) for name, (_, ranks) in in_bag.items()]
    for name, bag in same_in:
        assert len({msgs[r][name] for r in bag}) == 1, (name, bag)


@pytest.mark.timeout(90)
def test_bag_group_uses_the_process_group_timeout(tmp_path):
    ctimeout = 5.0
    res = run_workers(
        __file__,
        "bag_timeout_worker",
        4,
        tmp_path,
        args=(ctimeout,),
        timeout=80,
        collective_timeout=ctimeout,
    )
    assert all(r["bag_timeout_s"] == ctimeout for r in res)
    assert res[0]["raised"] is not None, "the peer of a stuck rank did not fail"
    assert res[0]["elapsed_s"] < ctimeout + 5.0
    assert res[2]["raised"] is None and res[3]["raised"] is None  # the other bag is fine


def test_varlen_reads_host_offsets_not_the_device_tensor():
    """With the host offsets the balancer's tables hold, varlen attention never reads the
    ``cu_seqlens`` tensor (on CUDA that copy would wait for every queued kernel): a meta
    tensor, which cannot be read at all, stands in for it."""
    import torch

    from knapformer.attention.varlen import VarlenAttentionError, varlen_attention

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(7, 2, 4, generator=gen) for _ in range(3))
    host = [0, 3, 7]
    ref = varlen_attention(q, k, v, torch.tensor(host), 4)
    meta = torch.empty(3, dtype=torch.int32, device="meta")
    out = varlen_attention(q, k, v, meta, 4, cu_seqlens_host=host)
    assert torch.equal(out, ref)
    with pytest.raises(VarlenAttentionError, match="end at T=7"):
        varlen_attention(q, k, v, meta, 4, cu_seqlens_host=[0, 3, 6])
    with pytest.raises(VarlenAttentionError, match="shape"):
        varlen_attention(q, k, v, meta, 4, cu_seqlens_host=[0, 7])
