"""MMDiT blocks against FLUX's published adaLN arithmetic, written out here independently.

FLUX (``flux/modules/layers.py``): ``Modulation`` maps ``silu(vec)`` through one linear layer and
chunks the result as (shift, scale, gate) per sub-layer; a sub-layer's residual update is
``x + gate * f((1 + scale) * norm(x) + shift)``, with ``norm`` a LayerNorm without affine
(eps 1e-6). The double-stream block does that twice per stream (attention, then MLP); the
single-stream block once, around its fused attention + MLP. The model starts adaLN-Zero
(modulations 0: every block the identity), so the modulation weights are set by hand here, and
differ per sequence through ``vec``. Only the inner sub-layers (linear layers, QK-norm, RoPE
rotation) are the block's own; the modulation, norms, attention and residuals are re-derived.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from knapformer.models.mmdit import (
    AttnMeta,
    DoubleStreamBlock,
    MMDiT,
    SingleStreamBlock,
    Streams,
    mmdit_config,
)
from knapformer.models.rope import apply_rope, rope_nd

CFG = mmdit_config("tiny")
D, H, HD = CFG.d_model, CFG.num_heads, CFG.head_dim
SEQ_LENS = [5, 7]


def _inputs(seed: int = 0):
    """Two packed sequences with text and visual tokens interleaved, one ``vec`` per sequence."""
    g = torch.Generator().manual_seed(seed)
    T = sum(SEQ_LENS)
    h = torch.randn(T, D, generator=g, dtype=torch.float64)
    vec = torch.randn(len(SEQ_LENS), D, generator=g, dtype=torch.float64)
    kind = torch.tensor([0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0, 1])
    positions = torch.randint(0, 4, (T, 3), generator=g)
    seq = torch.repeat_interleave(torch.arange(len(SEQ_LENS)), torch.tensor(SEQ_LENS))
    cu = torch.tensor([0, *torch.tensor(SEQ_LENS).cumsum(0).tolist()])
    meta = AttnMeta(cu, max(SEQ_LENS))
    rope = rope_nd(positions, CFG.axes_dim, CFG.rope_theta, dtype=torch.float64)
    return h, vec, kind, seq, rope, meta


def _set_modulation(lin: torch.nn.Linear, seed: int) -> None:
    """Hand-set (non-zero, distinct per chunk) modulation weights and biases."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        lin.weight.copy_(0.3 * torch.randn(lin.weight.shape, generator=g, dtype=torch.float64))
        lin.bias.copy_(0.5 * torch.randn(lin.bias.shape, generator=g, dtype=torch.float64))


def _flux_mod(lin: torch.nn.Linear, vec: torch.Tensor, seq: torch.Tensor, n: int):
    """FLUX ``Modulation``: ``lin(silu(vec))`` chunked into n (shift, scale, gate) triples, per
    token through its sequence."""
    out = F.silu(vec) @ lin.weight.T + lin.bias
    chunks = out[seq].chunk(3 * n, dim=-1)
    return [tuple(chunks[3 * i : 3 * i + 3]) for i in range(n)]


def _norm(x: torch.Tensor) -> torch.Tensor:
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-6)


def _attention(q, k, v, rope, seq_lens):
    """Joint attention inside each sequence (RoPE on q and k, softmax(q k^T / sqrt(d)) v)."""
    cos, sin = rope
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    out, start = [], 0
    for L in seq_lens:
        qs, ks, vs = (t[start : start + L].transpose(0, 1) for t in (q, k, v))  # [H, L, HD]
        w = torch.softmax(qs @ ks.transpose(1, 2) / HD**0.5, dim=-1)
        out.append((w @ vs).transpose(0, 1).reshape(L, D))
        start += L
    return torch.cat(out)


def test_double_stream_block_is_flux_modulated_attention_then_gated_mlp():
    """Per stream: x1 = x + g1 * proj(attn((1+c1)*norm(x)+s1)); out = x1 + g2 * mlp((1+c2)*norm(x1)
    + s2), with (s1, c1, g1, s2, c2, g2) = lin(silu(vec)) in FLUX's chunk order."""
    torch.manual_seed(0)
    blk = DoubleStreamBlock(CFG).double()
    _set_modulation(blk.img.mod.lin, 1)
    _set_modulation(blk.txt.mod.lin, 2)
    h, vec, kind, seq, rope, meta = _inputs()
    got = blk(h, vec, rope, Streams.from_kind(kind, seq), meta)

    is_img = kind.bool()
    q, k, v = (torch.empty(h.shape[0], H, HD, dtype=torch.float64) for _ in range(3))
    mods = {}
    for w, sel in ((blk.img, is_img), (blk.txt, ~is_img)):
        (s1, c1, g1), m2 = _flux_mod(w.mod.lin, vec, seq[sel], 2)
        mods[id(w)] = (g1, m2)
        qkv = w.qkv((1 + c1) * _norm(h[sel]) + s1).view(-1, 3, H, HD)
        qn, kn = w.qk_norm(qkv[:, 0], qkv[:, 1])
        q[sel], k[sel], v[sel] = qn, kn, qkv[:, 2]
    attn = _attention(q, k, v, rope, SEQ_LENS)
    want = torch.empty_like(h)
    for w, sel in ((blk.img, is_img), (blk.txt, ~is_img)):
        g1, (s2, c2, g2) = mods[id(w)]
        x1 = h[sel] + g1 * w.proj(attn[sel])
        want[sel] = x1 + g2 * w.mlp((1 + c2) * _norm(x1) + s2)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_single_stream_block_is_one_flux_modulated_parallel_attention_and_mlp():
    """out = h + gate * linear2([attn(qkv), gelu_tanh(mlp)]) with [qkv, mlp] = linear1((1 + scale)
    * norm(h) + shift) and (shift, scale, gate) = lin(silu(vec)) in FLUX's chunk order."""
    torch.manual_seed(0)
    blk = SingleStreamBlock(CFG).double()
    _set_modulation(blk.mod.lin, 3)
    h, vec, _, seq, rope, meta = _inputs(1)
    got = blk(h, vec, rope, seq, meta)

    ((shift, scale, gate),) = _flux_mod(blk.mod.lin, vec, seq, 1)
    fused = blk.linear1((1 + scale) * _norm(h) + shift)
    qkv, mlp = fused[:, : 3 * D].view(-1, 3, H, HD), fused[:, 3 * D :]
    q, k = blk.qk_norm(qkv[:, 0], qkv[:, 1])
    attn = _attention(q, k, qkv[:, 2], rope, SEQ_LENS)
    want = h + gate * blk.linear2(torch.cat([attn, F.gelu(mlp, approximate="tanh")], dim=-1))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_modulation_starts_at_zero_so_blocks_start_as_identity():
    """adaLN-Zero: with the modulations as initialised, both blocks return their input exactly."""
    torch.manual_seed(0)
    h, vec, kind, seq, rope, meta = _inputs(2)
    model = MMDiT(CFG).double()
    dbl, sgl = model.double_blocks[0], model.single_blocks[0]
    assert torch.equal(dbl(h, vec, rope, Streams.from_kind(kind, seq), meta), h)
    assert torch.equal(sgl(h, vec, rope, seq, meta), h)
