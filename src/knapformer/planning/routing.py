"""Routing tables: what one rank sends, receives and gathers for a :class:`Plan`.

Pure NumPy, built once per step; the per-layer path (Ulysses all-to-alls) only indexes with the
arrays computed here, so no Python loop over sequences or chunks runs per layer.

Conventions (shared by every rank, so no table is ever communicated):

* Source layout: rank ``r`` holds its sequences packed in the order it passed their lengths;
  global sequence ids are rank-major (rank 0's first).
* Send order: local tokens grouped by destination rank, source order inside a destination.
* Balanced layout: the received order, i.e. by source rank then source order. Because ids are
  rank-major this is ascending global sequence id, so every rank of a bag holds chunk ``p`` of the
  same sequences in the same order (``p`` = the rank's index in its bag).
* Ulysses (bag of size ``g > 1``): peer ``p`` sends its chunk-``p`` tokens (one head group each);
  the concatenation of the ``g`` peer blocks is turned into whole contiguous sequences by
  ``attn_gather`` and back by ``attn_scatter``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

__all__ = [
    "RoutingError",
    "RoutingTables",
    "build_routing",
    "chunk_length_matrix",
    "concat_ranges",
    "offset_tables",
    "routing_from_plan",
]


class RoutingError(ValueError):
    """A plan (or the arrays describing one) is inconsistent, so no routing can be built."""


def concat_ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])`` without a loop."""
    starts = np.asarray(starts, dtype=np.int64).ravel()
    lengths = np.asarray(lengths, dtype=np.int64).ravel()
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    # Per token: start of its range minus the output offset where that range begins.
    shift = np.repeat(starts - (ends - lengths), lengths)
    return shift + np.arange(total, dtype=np.int64)


def _exclusive_cumsum(x: np.ndarray, axis: int = 0) -> np.ndarray:
    c = np.cumsum(x, axis=axis)
    return c - x


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.int64)
    a.setflags(write=False)
    return a


@dataclass(frozen=True)
class RoutingTables:
    """Everything rank ``rank`` needs for one step. All arrays are read-only ``int64``."""

    rank: int
    world_size: int
    bag: int  # global bag index of this rank
    bag_ranks: tuple[int, ...]  # global ranks of this rank's bag
    peer: int  # this rank's index inside its bag (= which chunk it holds)

    # Source layout (what the user passes to route / gets back from reverse_route).
    num_local_tokens: int
    local_seq_ids: np.ndarray  # [T_in] global sequence id of each local token
    local_positions: np.ndarray  # [T_in] position of each local token inside its sequence

    # route: x[send_perm] -> all_to_all_single(send_splits -> recv_splits) -> balanced layout.
    send_perm: np.ndarray  # [T_in]
    send_splits: np.ndarray  # [world]
    recv_splits: np.ndarray  # [world]

    # Balanced layout: one entry per sequence of this rank's bag (ascending id), chunk `peer`.
    num_balanced_tokens: int
    seq_ids: np.ndarray  # [n]
    seq_lengths: np.ndarray  # [n] whole-sequence lengths
    chunk_starts: np.ndarray  # [n] offset of the held chunk inside its sequence
    chunk_lengths: np.ndarray  # [n] may be 0 when a sequence is shorter than the bag
    token_seq_ids: np.ndarray  # [T_out]
    token_positions: np.ndarray  # [T_out]

    # Attention layout (whole sequences, heads/g heads each).
    peer_splits: np.ndarray  # [g] tokens held by each bag peer (= Ulysses receive splits)
    attn_gather: np.ndarray | None  # [N] concat-of-peer-blocks -> whole sequences (None: g == 1)
    attn_scatter: np.ndarray | None  # [N] inverse of attn_gather
    cu_seqlens: np.ndarray  # [n + 1] of the whole sequences
    max_seqlen: int

    @property
    def bag_size(self) -> int:
        return len(self.bag_ranks)

    @property
    def num_attn_tokens(self) -> int:
        return int(self.cu_seqlens[-1])


def chunk_length_matrix(plan: Any) -> np.ndarray:
    """``[S, g_max]`` chunk lengths of every sequence (columns past its bag size are 0).

    Vectorised form of the contract's ``Plan.chunk_bounds`` convention (``np.array_split``: the
    first ``L % g`` chunks get one extra token); a property test keeps the two in agreement.
    """
    lengths = np.asarray(plan.lengths, dtype=np.int64)
    sizes = np.asarray(plan.layout.bag_sizes, dtype=np.int64)
    g = sizes[np.asarray(plan.bag, dtype=np.int64)] if lengths.size else np.zeros(0, np.int64)
    g_max = int(sizes.max()) if sizes.size else 1
    q, rem = np.divmod(lengths, np.maximum(g, 1))
    j = np.arange(g_max, dtype=np.int64)[None, :]
    out = q[:, None] + (j < rem[:, None])
    out[j >= g[:, None]] = 0
    return out.astype(np.int64)


def routing_from_plan(plan: Any, rank: int) -> RoutingTables:
    """Tables for ``rank`` from a :class:`knapformer.planning.plan.Plan`."""
    layout = plan.layout
    return build_routing(
        lengths=plan.lengths,
        src_rank=plan.src_rank,
        bag=plan.bag,
        chunk_lengths=chunk_length_matrix(plan),
        bag_ranks=layout.bag_ranks,
        world_size=layout.world_size,
        rank=rank,
    )


def build_routing(
    lengths: np.ndarray,
    src_rank: np.ndarray,
    bag: np.ndarray,
    chunk_lengths: np.ndarray,
    bag_ranks: tuple[tuple[int, ...], ...],
    world_size: int,
    rank: int,
) -> RoutingTables:
    """Tables for ``rank`` from plain arrays (``chunk_lengths``: ``[S, >= g_max]``)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    src_rank = np.asarray(src_rank, dtype=np.int64)
    bag = np.asarray(bag, dtype=np.int64)
    chunk_len = np.asarray(chunk_lengths, dtype=np.int64)
    S = lengths.size
    if not 0 <= rank < world_size:
        raise RoutingError(f"rank {rank} outside world of size {world_size}")
    if src_rank.shape != (S,) or bag.shape != (S,) or chunk_len.ndim != 2 or len(chunk_len) != S:
        raise RoutingError(
            "lengths, src_rank, bag and chunk_lengths disagree on the sequence count"
        )
    if S and (np.any(np.diff(src_rank) < 0) or src_rank.min() < 0 or src_rank.max() >= world_size):
        raise RoutingError("sequence ids must be rank-major (src_rank non-decreasing, in range)")
    if S and (bag.min() < 0 or bag.max() >= len(bag_ranks)):
        raise RoutingError("bag index out of range")
    if np.any(lengths < 1):
        raise RoutingError("sequence lengths must be >= 1")
    if np.any(chunk_len < 0) or np.any(chunk_len.sum(axis=1) != lengths):
        raise RoutingError("chunk lengths must be non-negative and sum to each sequence's length")

    sizes = np.array([len(r) for r in bag_ranks], dtype=np.int64)
    g_max = max(int(sizes.max()) if sizes.size else 1, chunk_len.shape[1])
    if chunk_len.shape[1] < g_max:
        chunk_len = np.pad(chunk_len, ((0, 0), (0, g_max - chunk_len.shape[1])))
    # dest[b, j]: global rank holding chunk j of a sequence in bag b (-1 past the bag size).
    bag_dest = np.full((len(bag_ranks), g_max), -1, dtype=np.int64)
    for b, ranks in enumerate(bag_ranks):  # once per step, over bags
        bag_dest[b, : len(ranks)] = ranks
    dest = bag_dest[bag] if S else np.zeros((0, g_max), dtype=np.int64)  # [S, g_max]
    if np.any((dest < 0) & (chunk_len > 0)):
        raise RoutingError("a sequence has tokens in a chunk past its bag size")
    chunk_start = _exclusive_cumsum(chunk_len, axis=1)

    # ---- source side -----------------------------------------------------------------------
    mine = np.flatnonzero(src_rank == rank)
    my_len = lengths[mine]
    local_off = _exclusive_cumsum(my_len)
    T_in = int(my_len.sum())
    local_seq_ids = np.repeat(mine, my_len)
    local_positions = np.arange(T_in, dtype=np.int64) - np.repeat(local_off, my_len)

    p_len = chunk_len[mine]  # [n_mine, g_max]
    p_dest = dest[mine]
    p_start = local_off[:, None] + chunk_start[mine]
    p_seq = np.broadcast_to(mine[:, None], p_len.shape)
    keep = p_len > 0
    p_len, p_dest, p_start, p_seq = p_len[keep], p_dest[keep], p_start[keep], p_seq[keep]
    order = np.lexsort((p_seq, p_dest))  # by destination, then source order
    send_perm = concat_ranges(p_start[order], p_len[order])
    send_splits = np.bincount(p_dest, weights=p_len, minlength=world_size).astype(np.int64)

    # ---- destination side ------------------------------------------------------------------
    rows, cols = np.nonzero(dest == rank)  # row-major: ascending sequence id
    r_len = chunk_len[rows, cols]
    recv_splits = np.bincount(src_rank[rows], weights=r_len, minlength=world_size).astype(np.int64)
    T_out = int(r_len.sum())
    r_start = chunk_start[rows, cols]
    token_seq_ids = np.repeat(rows, r_len)
    token_positions = concat_ranges(r_start, r_len)

    # ---- Ulysses attention layout ----------------------------------------------------------
    my_bag = next(b for b, rs in enumerate(bag_ranks) if rank in rs)
    ranks_b = tuple(int(x) for x in bag_ranks[my_bag])
    g = len(ranks_b)
    peer = ranks_b.index(rank)
    in_bag = np.flatnonzero(bag == my_bag)
    if not np.array_equal(in_bag, rows):
        raise RoutingError("balanced layout disagrees with the bag's sequence list")
    seq_len_b = lengths[in_bag]
    cu = np.concatenate([[0], np.cumsum(seq_len_b)]).astype(np.int64)
    max_seqlen = int(seq_len_b.max()) if seq_len_b.size else 0
    C = chunk_len[in_bag, :g]  # [n, g]
    peer_splits = C.sum(axis=0).astype(np.int64)
    if g > 1:
        starts = _exclusive_cumsum(peer_splits)[None, :] + _exclusive_cumsum(C, axis=0)
        gather = concat_ranges(starts.ravel(), C.ravel())  # row-major: seq by seq, chunk order
        scatter = np.empty_like(gather)
        scatter[gather] = np.arange(gather.size, dtype=np.int64)
        attn_gather, attn_scatter = _readonly(gather), _readonly(scatter)
    else:
        attn_gather = attn_scatter = None

    return RoutingTables(
        rank=rank,
        world_size=world_size,
        bag=my_bag,
        bag_ranks=ranks_b,
        peer=peer,
        num_local_tokens=T_in,
        local_seq_ids=_readonly(local_seq_ids),
        local_positions=_readonly(local_positions),
        send_perm=_readonly(send_perm),
        send_splits=_readonly(send_splits),
        recv_splits=_readonly(recv_splits),
        num_balanced_tokens=T_out,
        seq_ids=_readonly(rows),
        seq_lengths=_readonly(lengths[rows]),
        chunk_starts=_readonly(r_start),
        chunk_lengths=_readonly(r_len),
        token_seq_ids=_readonly(token_seq_ids),
        token_positions=_readonly(token_positions),
        peer_splits=_readonly(peer_splits),
        attn_gather=attn_gather,
        attn_scatter=attn_scatter,
        cu_seqlens=_readonly(cu),
        max_seqlen=max_seqlen,
    )


def offset_tables(
    tables: RoutingTables, rank_offset: int, bag_offset: int, seq_offset: int, world_size: int
) -> RoutingTables:
    """Tables built on one replica (ranks ``0..group-1``, its own sequence ids) placed in the
    whole world: ranks shift by ``rank_offset``, bags by ``bag_offset``, sequence ids by
    ``seq_offset`` (the sequences of earlier replicas), and the per-rank splits get zeros for
    every rank outside the replica. Lets each rank plan only its own replica."""
    group = tables.world_size
    if rank_offset < 0 or rank_offset + group > world_size:
        raise RoutingError(f"replica ranks {rank_offset}..{rank_offset + group - 1} outside world")

    def pad(splits: np.ndarray) -> np.ndarray:
        out = np.zeros(world_size, dtype=np.int64)
        out[rank_offset : rank_offset + group] = splits
        return _readonly(out)

    def shift(ids: np.ndarray) -> np.ndarray:
        return _readonly(ids + seq_offset)

    return replace(
        tables,
        rank=tables.rank + rank_offset,
        world_size=world_size,
        bag=tables.bag + bag_offset,
        bag_ranks=tuple(r + rank_offset for r in tables.bag_ranks),
        local_seq_ids=shift(tables.local_seq_ids),
        send_splits=pad(tables.send_splits),
        recv_splits=pad(tables.recv_splits),
        seq_ids=shift(tables.seq_ids),
        token_seq_ids=shift(tables.token_seq_ids),
    )
