"""Property tests of the pure routing tables: simulate every rank's all-to-alls in NumPy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knapformer.planning.cost import CostModel
from knapformer.planning.layout import BagLayout
from knapformer.planning.plan import plan_step
from knapformer.planning.routing import (
    RoutingError,
    RoutingTables,
    build_routing,
    chunk_length_matrix,
    concat_ranges,
    routing_from_plan,
)

SPECS = [("g1n2+g2n1+g4n1", 8), ("g2n2", 4), ("g4n1", 4), ("g1n2", 4), ("g2n1", 2), ("g1n1", 1)]


def _array_split_lengths(L: int, g: int) -> np.ndarray:
    return np.array([len(c) for c in np.array_split(np.arange(L), g)], dtype=np.int64)


@st.composite
def routing_cases(draw):
    spec, world = draw(st.sampled_from(SPECS))
    layout = BagLayout.parse(spec, world)
    per_rank = [draw(st.lists(st.integers(1, 9), min_size=0, max_size=4)) for _ in range(world)]
    lengths = np.array([x for r in per_rank for x in r], dtype=np.int64)
    src = np.array([r for r, xs in enumerate(per_rank) for _ in xs], dtype=np.int64)
    # Sequences may only go to bags of their own replica (replicas are independent).
    bag = np.array(
        [
            draw(st.sampled_from(list(layout.replica_bags(layout.replica_of_rank(int(r))))))
            for r in src
        ],
        dtype=np.int64,
    )
    g_max = max(layout.bag_sizes)
    chunks = np.zeros((lengths.size, g_max), dtype=np.int64)
    for s in range(lengths.size):
        g = layout.bag_sizes[bag[s]]
        chunks[s, :g] = _array_split_lengths(int(lengths[s]), g)
    return layout, per_rank, lengths, src, bag, chunks


def _tables(layout, lengths, src, bag, chunks) -> list[RoutingTables]:
    return [
        build_routing(lengths, src, bag, chunks, layout.bag_ranks, layout.world_size, r)
        for r in range(layout.world_size)
    ]


def _simulate_a2a(blocks: list[np.ndarray], send: list[np.ndarray], recv: list[np.ndarray]):
    """blocks[r] split by send[r]; returns what each rank receives (concat by source)."""
    n = len(blocks)
    pieces = [np.split(blocks[r], np.cumsum(send[r])[:-1]) for r in range(n)]
    out = []
    for d in range(n):
        got = [pieces[s][d] for s in range(n)]
        assert [len(x) for x in got] == list(recv[d])
        out.append(np.concatenate(got) if got else np.zeros(0, dtype=np.int64))
    return out


@settings(max_examples=60, deadline=None)
@given(routing_cases())
def test_routing_tables_route_and_attention_layout(case):
    layout, per_rank, lengths, src, bag, chunks = case
    _verify(layout, per_rank, lengths, bag, chunks, _tables(layout, lengths, src, bag, chunks))


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(SPECS),
    st.sampled_from(["ours", "reference"]),
    st.data(),
)
def test_routing_from_real_plans(spec_world, solver, data):
    spec, world = spec_world
    layout = BagLayout.parse(spec, world, num_heads=4)
    per_rank = [
        data.draw(st.lists(st.integers(1, 300), min_size=0, max_size=4)) for _ in range(world)
    ]
    plan = plan_step(per_rank, layout, CostModel.flops(64, gamma=1.0), solver)
    chunks = chunk_length_matrix(plan)
    for s in range(plan.num_sequences):  # the vectorised matrix follows Plan.chunk_bounds
        b = plan.chunk_bounds(s)
        assert np.array_equal(chunks[s, : b.size - 1], np.diff(b))
        assert not chunks[s, b.size - 1 :].any()
    tabs = [routing_from_plan(plan, r) for r in range(world)]
    _verify(layout, per_rank, np.asarray(plan.lengths), np.asarray(plan.bag), chunks, tabs)
    # Tokens per GPU after routing agree with the planner's own accounting.
    assert [t.num_balanced_tokens for t in tabs] == plan.tokens_per_gpu().tolist()


def _verify(layout, per_rank, lengths, bag, chunks, tabs):
    world = layout.world_size
    # Token identity = (sequence id, position): encode as one integer.
    code = 1000
    local = []
    for r, t in enumerate(tabs):
        assert t.num_local_tokens == sum(per_rank[r])
        assert sorted(t.send_perm.tolist()) == list(range(t.num_local_tokens))  # permutation
        assert t.send_splits.sum() == t.num_local_tokens
        assert t.recv_splits.sum() == t.num_balanced_tokens
        local.append(t.local_seq_ids * code + t.local_positions)
    # Source-layout ids are the packed, rank-major order.
    glob = np.concatenate(local)
    expect = np.concatenate([np.arange(L) + s * code for s, L in enumerate(lengths)] or [[]])
    assert np.array_equal(glob, expect.astype(np.int64))

    # route
    recv = _simulate_a2a(
        [local[r][tabs[r].send_perm] for r in range(world)],
        [t.send_splits for t in tabs],
        [t.recv_splits for t in tabs],
    )
    all_tokens = []
    for r, t in enumerate(tabs):
        assert np.array_equal(recv[r], t.token_seq_ids * code + t.token_positions)
        # Every held chunk is chunk `peer` of a sequence of this rank's bag.
        assert np.all(bag[t.seq_ids] == t.bag)
        assert np.all(np.diff(t.seq_ids) > 0)  # ascending ids: same order on all bag ranks
        assert np.array_equal(t.chunk_lengths, chunks[t.seq_ids, t.peer])
        all_tokens.append(recv[r])
    # every token assigned exactly once
    assert np.array_equal(np.sort(np.concatenate(all_tokens)), np.sort(glob))

    # reverse route == identity
    back = _simulate_a2a(recv, [t.recv_splits for t in tabs], [t.send_splits for t in tabs])
    for r, t in enumerate(tabs):
        restored = np.empty_like(back[r])
        restored[t.send_perm] = back[r]
        assert np.array_equal(restored, local[r])

    # Ulysses: within every bag, peer blocks -> whole contiguous sequences in id order.
    for b, ranks in enumerate(layout.bag_ranks):
        bt = [tabs[r] for r in ranks]
        for t in bt:
            assert np.array_equal(t.seq_ids, bt[0].seq_ids)
            assert np.array_equal(t.peer_splits, [x.num_balanced_tokens for x in bt])
            assert np.array_equal(np.diff(t.cu_seqlens), lengths[t.seq_ids])
        concat = np.concatenate([recv[r] for r in ranks])
        for t in bt:
            if len(ranks) == 1:
                assert t.attn_gather is None
                whole = concat
            else:
                assert sorted(t.attn_gather.tolist()) == list(range(concat.size))
                assert np.array_equal(t.attn_gather[t.attn_scatter], np.arange(concat.size))
                whole = concat[t.attn_gather]
                assert np.array_equal(whole[t.attn_scatter], concat)
            ids = np.concatenate(
                [np.arange(lengths[s]) + s * code for s in t.seq_ids] or [np.zeros(0)]
            )
            assert np.array_equal(whole, ids.astype(np.int64))
            assert t.max_seqlen == (int(lengths[t.seq_ids].max()) if t.seq_ids.size else 0)
        assert all(b == t.bag for t in bt)


def test_concat_ranges():
    assert concat_ranges(np.array([5, 0, 2]), np.array([2, 0, 3])).tolist() == [5, 6, 2, 3, 4]
    assert concat_ranges(np.array([], np.int64), np.array([], np.int64)).size == 0


def test_tables_are_read_only():
    layout = BagLayout.parse("g2n1", 2)
    t = build_routing(
        np.array([3]), np.array([0]), np.array([0]), np.array([[2, 1]]), layout.bag_ranks, 2, 1
    )
    with pytest.raises(ValueError):
        t.send_perm[0] = 1
    assert t.token_positions.tolist() == [2] and t.peer == 1


def test_inconsistent_arrays_rejected():
    layout = BagLayout.parse("g2n1", 2)
    with pytest.raises(RoutingError, match="sum to each sequence"):
        build_routing(
            np.array([3]), np.array([0]), np.array([0]), np.array([[1, 1]]), layout.bag_ranks, 2, 0
        )
    with pytest.raises(RoutingError, match="rank-major"):
        build_routing(
            np.array([1, 1]),
            np.array([1, 0]),
            np.array([0, 0]),
            np.array([[1, 0], [1, 0]]),
            layout.bag_ranks,
            2,
            0,
        )
    with pytest.raises(RoutingError, match=">= 1"):
        build_routing(
            np.array([0]), np.array([0]), np.array([0]), np.array([[0, 0]]), layout.bag_ranks, 2, 0
        )


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["g1n2+g2n1", "g2n2", "g1n1+g4n1+g1n3"]),
    st.integers(2, 3),
    st.data(),
)
def test_replica_tables_offset_equal_whole_world_tables(spec, replicas, data):
    """Planning one replica and offsetting its tables gives the tables of the whole-world plan
    (replicas planned independently: ``replica_floor=False``) for every rank."""
    from knapformer.planning.routing import offset_tables

    cost = CostModel.flops(64, 1.0)
    lay = BagLayout.parse(spec, _group(spec) * replicas)
    group = lay.group_size
    lengths = [data.draw(st.lists(st.integers(1, 300), max_size=4)) for _ in range(lay.world_size)]
    whole = plan_step(lengths, lay, cost, replica_floor=False)
    one = BagLayout.parse(spec, group)
    seq_offset = 0
    for r in range(replicas):
        rows = lengths[r * group : (r + 1) * group]
        part = plan_step(rows, one, cost)
        np.testing.assert_array_equal(
            part.bag + r * one.num_bags, whole.bag[seq_offset : seq_offset + part.num_sequences]
        )
        for local in range(group):
            got = offset_tables(
                routing_from_plan(part, local),
                r * group,
                r * one.num_bags,
                seq_offset,
                lay.world_size,
            )
            want = routing_from_plan(whole, r * group + local)
            for f in want.__dataclass_fields__:
                a, b = getattr(got, f), getattr(want, f)
                if isinstance(b, np.ndarray):
                    np.testing.assert_array_equal(a, b, err_msg=f)
                else:
                    assert a == b, f
        seq_offset += part.num_sequences


def _group(spec: str) -> int:
    from knapformer.planning.layout import parse_terms

    return sum(g * n for g, n in parse_terms(spec))
