"""varlen_attention against a naive per-sequence softmax reference (values and gradients)."""

from __future__ import annotations

import math

import pytest
import torch

from knapformer.attention.varlen import VarlenAttentionError, varlen_attention


def _naive(q, k, v, lengths, causal):
    outs, start = [], 0
    for L in lengths:
        qs, ks, vs = q[start : start + L], k[start : start + L], v[start : start + L]
        scores = torch.einsum("thd,shd->hts", qs, ks) / math.sqrt(q.shape[-1])
        if causal:
            mask = torch.ones(L, L, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        outs.append(torch.einsum("hts,shd->thd", scores.softmax(-1), vs))
        start += L
    return torch.cat(outs)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_naive_with_grads(causal):
    g = torch.Generator().manual_seed(0)
    lengths = [1, 5, 3, 8]
    T, H, D = sum(lengths), 3, 4
    q, k, v = (torch.randn(T, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    qs = [x.clone().requires_grad_() for x in (q, k, v)]
    qr = [x.clone().requires_grad_() for x in (q, k, v)]
    out = varlen_attention(*qs, cu, max(lengths), causal=causal)
    ref = _naive(*qr, lengths, causal)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    w = torch.randn(out.shape, generator=g, dtype=torch.float64)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    for a, b in zip(qs, qr, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


def test_attention_never_crosses_sequences():
    q = torch.randn(6, 2, 4, dtype=torch.float64)
    k, v = torch.randn_like(q), torch.randn_like(q)
    cu = torch.tensor([0, 2, 6])
    out = varlen_attention(q, k, v, cu, 4)
    v2 = v.clone()
    v2[2:] += 1.0  # only the second sequence's values change
    out2 = varlen_attention(q, k, v2, cu, 4)
    assert torch.equal(out[:2], out2[:2])
    assert not torch.allclose(out[2:], out2[2:])


def test_empty_sequences_and_empty_batch():
    q = torch.randn(3, 2, 4)
    out = varlen_attention(q, q, q, torch.tensor([0, 0, 3, 3]), 3)
    torch.testing.assert_close(out, varlen_attention(q, q, q, torch.tensor([0, 3]), 3))
    e = torch.zeros(0, 2, 4, requires_grad=True)
    o = varlen_attention(e, e, e, torch.tensor([0]), 0)
    assert o.shape == (0, 2, 4)
    o.sum().backward()
    assert e.grad is not None and e.grad.shape == e.shape


def test_bad_cu_seqlens():
    q = torch.randn(4, 2, 4)
    with pytest.raises(VarlenAttentionError, match="end at T=4"):
        varlen_attention(q, q, q, torch.tensor([0, 3]), 3)
    with pytest.raises(VarlenAttentionError, match="non-decreasing"):
        varlen_attention(q, q, q, torch.tensor([0, 3, 2, 4]), 3)
    with pytest.raises(VarlenAttentionError, match=r"\[T, H, D\]"):
        varlen_attention(q[0], q[0], q[0], torch.tensor([0, 2]), 2)
