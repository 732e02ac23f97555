"""Balanced multi-block transformer == single-process reference (outputs and gradients, float64).

The negative checks break the head order (post-attention head merge) or the chunk order inside
whole sequences (causal attention makes order matter) on purpose: the comparison must then fail,
which shows the positive checks have teeth.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _dist_utils import run_workers
from _reference_model import PackedTransformer, local_attention

IN_DIM, D_MODEL, HEADS, BLOCKS = 6, 16, 4, 2


def _model() -> PackedTransformer:
    torch.manual_seed(0)
    return PackedTransformer(IN_DIM, D_MODEL, HEADS, BLOCKS).double()


def _packed(lengths: list[int]):
    pos = torch.cat([torch.arange(L) for L in lengths])
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    return pos, cu


# ---------------------------------------------------------------------------------------------
# single process
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_packing_does_not_leak_between_sequences(causal):
    model = _model()
    lengths = [4, 1, 7]
    x = torch.randn(sum(lengths), IN_DIM, dtype=torch.float64)
    pos, cu = _packed(lengths)
    out = model(x, pos, local_attention(cu, max(lengths), causal))
    start = 0
    for L in lengths:
        p1, c1 = _packed([L])
        alone = model(x[start : start + L], p1, local_attention(c1, L, causal))
        torch.testing.assert_close(out[start : start + L], alone, rtol=1e-12, atol=1e-12)
        start += L
    # RoPE is relative: a common shift changes nothing, stretching the positions does.
    attn = local_attention(cu, max(lengths), causal)
    torch.testing.assert_close(model(x, pos + 5, attn), out, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(model(x, pos * 2, attn), out)


# ---------------------------------------------------------------------------------------------
# distributed worker
# ---------------------------------------------------------------------------------------------


def _reverse_chunk_order(bal) -> None:
    """Test-only sabotage: whole sequences are assembled with their chunks in reverse order."""
    import dataclasses

    import numpy as np

    t = bal.tables
    if t.attn_gather is None:
        return
    gather = t.attn_gather.copy()
    cu = t.cu_seqlens
    for i, s in enumerate(t.seq_ids.tolist()):
        seg = gather[cu[i] : cu[i + 1]]
        pieces = np.split(seg, np.cumsum(np.diff(bal.plan.chunk_bounds(s)))[:-1])
        gather[cu[i] : cu[i + 1]] = np.concatenate(pieces[::-1])
    scatter = np.empty_like(gather)
    scatter[gather] = np.arange(gather.size)
    bal.tables = dataclasses.replace(t, attn_gather=gather, attn_scatter=scatter)


def block_worker(rank: int, world: int, cases: list[tuple[str, list[list[int]], list[str]]]):
    import torch.distributed as dist
    from _reference_model import balanced_forward

    import knapformer.distributed.balancer as balancer_mod
    from knapformer.distributed import Balancer
    from knapformer.planning.cost import CostModel

    results = []
    for spec, lengths, modes in cases:
        model = _model()
        flat = [L for r in lengths for L in r]
        T_all = sum(flat)
        gen = torch.Generator().manual_seed(1)
        X = torch.randn(T_all, IN_DIM, generator=gen, dtype=torch.float64)
        W = torch.randn(T_all, IN_DIM, generator=gen, dtype=torch.float64)
        pos_all, cu_all = _packed(flat)
        off = sum(sum(r) for r in lengths[:rank])
        T = sum(lengths[rank])
        bal = Balancer(spec, CostModel.flops(D_MODEL), num_heads=HEADS)
        orig_merge = balancer_mod._merge_head_groups
        for mode in modes:
            causal = mode in ("causal", "break_chunks")
            # single-process reference on the whole global batch
            model.zero_grad()
            Xr = X.clone().requires_grad_()
            ref = model(Xr, pos_all, local_attention(cu_all, max(flat), causal))
            (ref * W).sum().backward()
            ref_grads = [p.grad.clone() for p in model.parameters()]
            # balanced
            model.zero_grad()
            bal.plan_step(lengths[rank])
            if mode == "break_chunks":
                _reverse_chunk_order(bal)
            if mode == "break_heads":
                balancer_mod._merge_head_groups = lambda y, g, m=orig_merge: m(y, g).flip(1)
            try:
                x = X[off : off + T].clone().requires_grad_()
                out = balanced_forward(model, bal, x, pos_all[off : off + T], causal=causal)
                (out * W[off : off + T]).sum().backward()
            finally:
                balancer_mod._merge_head_groups = orig_merge
            grad_err = 0.0
            for p, rg in zip(model.parameters(), ref_grads, strict=True):
                gsum = p.grad.clone()
                dist.all_reduce(gsum)
                grad_err = max(grad_err, float((gsum - rg).abs().max() / rg.abs().max()))
            out_err = float((out - ref[off : off + T]).abs().max()) if T else 0.0
            xg_err = float((x.grad - Xr.grad[off : off + T]).abs().max()) if T else 0.0
            results.append(
                {"spec": spec, "mode": mode, "out": out_err, "grad": grad_err, "xgrad": xg_err}
            )
    return results


def _check(per_rank: list[list[dict]]) -> None:
    n = len(per_rank[0])
    assert n > 0
    for i in range(n):
        rows = [r[i] for r in per_rank]
        spec, mode = rows[0]["spec"], rows[0]["mode"]
        out = max(r["out"] for r in rows)
        grad = max(r["grad"] for r in rows)
        xgrad = max(r["xgrad"] for r in rows)
        if mode.startswith("break"):
            # The sabotaged run must be caught by the very same comparison.
            assert out > 1e-6 and grad > 1e-6, (spec, mode, out, grad)
        else:
            # float64: only summation-order differences remain (~1e-16 relative).
            assert out < 1e-10 and grad < 1e-10 and xgrad < 1e-10, (spec, mode, out, grad, xgrad)


ALL = ["plain", "causal", "break_heads", "break_chunks"]
CASES_1 = [("g1n1", [[5, 3, 1]], ["plain", "causal"])]  # degenerate world: no-op balancing
CASES_2 = [("g2n1", [[5, 3], [7, 1]], ALL)]
CASES_4 = [
    ("g2n2", [[9, 2], [], [6, 1, 3], [12]], ALL),
    ("g4n1", [[3, 10], [1], [], [7, 2]], ALL),
    ("g1n2", [[20, 1], [], [4, 5], [6]], ["plain", "causal"]),  # two replicas
]
CASES_8 = [
    ("g1n2+g2n1+g4n1", [[40], [], [1, 1, 2], [5, 13], [3], [], [7, 2, 9], [1]], ALL),
]


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "world,cases",
    [
        pytest.param(1, CASES_1, id="w1"),
        pytest.param(2, CASES_2, id="w2"),
        pytest.param(4, CASES_4, id="w4"),
        pytest.param(8, CASES_8, id="w8"),
    ],
)
def test_balanced_model_matches_single_process(tmp_path, world, cases):
    _check(run_workers(__file__, "block_worker", world, tmp_path, args=(cases,), timeout=230))
