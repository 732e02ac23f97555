"""The plain MMDiT: packing never leaks between sequences, conditioning is per sequence, RoPE is
per axis, bad input is named; the synthetic data is deterministic and validated."""

from __future__ import annotations

import pytest
import torch

from knapformer.data.synthetic import SyntheticMixture, sample_grid
from knapformer.models.mmdit import (
    MMDiT,
    MMDiTConfig,
    MMDiTInputError,
    Modulation,
    PackedBatch,
    mmdit_config,
)
from knapformer.sim.datacodes import DataCodeError, parse_data_codes

CFG = mmdit_config("tiny")


def _seq(n_txt: int, grid: tuple[int, int, int], seed: int, interleave: bool = False) -> dict:
    g = torch.Generator().manual_seed(seed)
    t, h, w = grid
    n_img = t * h * w
    pos = torch.stack(
        torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"), -1
    ).reshape(-1, 3)
    is_img = torch.arange(n_txt + n_img) >= n_txt
    positions = torch.cat([torch.zeros(n_txt, 3, dtype=torch.int64), pos])
    if interleave:  # text tokens need not come first
        perm = torch.randperm(n_txt + n_img, generator=g)
        is_img, positions = is_img[perm], positions[perm]
    return {
        "img": torch.randn(n_img, CFG.patch_dim, generator=g, dtype=torch.float64),
        "txt": torch.randn(n_txt, CFG.text_dim, generator=g, dtype=torch.float64),
        "pos": positions,
        "is_img": is_img,
        "t": torch.rand((), generator=g, dtype=torch.float64),
        "pooled": torch.randn(CFG.pooled_dim, generator=g, dtype=torch.float64),
    }


def _pack(seqs: list[dict]) -> PackedBatch:
    return PackedBatch(
        img=torch.cat([s["img"] for s in seqs]),
        txt=torch.cat([s["txt"] for s in seqs]),
        is_img=torch.cat([s["is_img"] for s in seqs]),
        positions=torch.cat([s["pos"] for s in seqs]),
        seq_lens=[int(s["is_img"].numel()) for s in seqs],
        timesteps=torch.stack([s["t"] for s in seqs]),
        pooled=torch.stack([s["pooled"] for s in seqs]),
    )


def _randomize_modulation(model: MMDiT) -> MMDiT:
    """Random (not adaLN-Zero) modulations: blocks that start as the identity would let
    per-sequence conditioning or routing mistakes through unseen."""
    for m in model.modules():
        if isinstance(m, Modulation):
            m.lin.reset_parameters()
    return model


def _model(cfg: MMDiTConfig = CFG) -> MMDiT:
    torch.manual_seed(0)
    return _randomize_modulation(MMDiT(cfg).double())


SEQS = [(3, (1, 2, 3)), (0, (3, 2, 2)), (5, (1, 1, 1)), (2, (2, 1, 3))]


@pytest.mark.parametrize("interleave", [False, True])
def test_packed_forward_equals_per_sequence(interleave):
    model = _model()
    seqs = [_seq(n, g, i, interleave) for i, (n, g) in enumerate(SEQS)]
    out = model(_pack(seqs))
    assert out.shape == (sum(s["img"].shape[0] for s in seqs), CFG.patch_dim)
    off = 0
    for s in seqs:
        alone = model(_pack([s]))
        torch.testing.assert_close(out[off : off + alone.shape[0]], alone, rtol=1e-12, atol=1e-12)
        off += alone.shape[0]


def test_conditioning_and_rope_act_per_sequence_and_axis():
    model = _model()
    seqs = [_seq(n, g, i) for i, (n, g) in enumerate(SEQS[:2])]
    base = model(_pack(seqs))
    n0 = seqs[0]["img"].shape[0]
    # A new timestep for sequence 1 changes sequence 1 only.
    seqs_t = [dict(s) for s in seqs]
    seqs_t[1]["t"] = seqs[1]["t"] + 0.3
    out = model(_pack(seqs_t))
    torch.testing.assert_close(out[:n0], base[:n0], rtol=1e-12, atol=1e-12)
    assert (out[n0:] - base[n0:]).abs().max() > 1e-6
    # RoPE is relative: shifting a whole sequence's positions changes nothing ...
    seqs_s = [dict(s) for s in seqs]
    seqs_s[0]["pos"] = seqs[0]["pos"] + torch.tensor([2, 5, 1])
    torch.testing.assert_close(model(_pack(seqs_s)), base, rtol=1e-10, atol=1e-10)
    # ... while swapping the h and w axes does change the output.
    seqs_w = [dict(s) for s in seqs]
    seqs_w[0]["pos"] = seqs[0]["pos"][:, [0, 2, 1]]
    assert (model(_pack(seqs_w))[:n0] - base[:n0]).abs().max() > 1e-6


def test_empty_batch_runs_and_backpropagates():
    model = _model()
    f = torch.float64
    empty = PackedBatch(
        torch.zeros(0, CFG.patch_dim, dtype=f),
        torch.zeros(0, CFG.text_dim, dtype=f),
        torch.zeros(0, dtype=torch.bool),
        torch.zeros(0, 3, dtype=torch.int64),
        [],
        torch.zeros(0, dtype=f),
        torch.zeros(0, CFG.pooled_dim, dtype=f),
    )
    out = model(empty)
    assert out.shape == (0, CFG.patch_dim)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_bad_input_is_named():
    model = _model()
    b = _pack([_seq(2, (1, 2, 2), 0)])
    bad = PackedBatch(
        b.img, b.txt, b.is_img, b.positions, [b.num_tokens + 1], b.timesteps, b.pooled
    )
    with pytest.raises(MMDiTInputError, match="seq_lens sum"):
        model(bad)
    bad = PackedBatch(
        b.img, b.txt, b.is_img, b.positions.float(), b.seq_lens, b.timesteps, b.pooled
    )
    with pytest.raises(MMDiTInputError, match="positions must be int64"):
        model(bad)
    bad = PackedBatch(b.img[:, :3], b.txt, b.is_img, b.positions, b.seq_lens, b.timesteps, b.pooled)
    with pytest.raises(MMDiTInputError, match="img must be"):
        model(bad)
    with pytest.raises(MMDiTInputError, match="not divisible"):
        mmdit_config("tiny", num_heads=3)
    with pytest.raises(MMDiTInputError, match="axes_dim"):
        mmdit_config("tiny", axes_dim=(2, 2, 2))
    with pytest.raises(MMDiTInputError, match="unknown model field"):
        mmdit_config("tiny", width=3)
    with pytest.raises(MMDiTInputError, match="unknown model preset"):
        mmdit_config("huge")


def test_flux_preset_shape():
    cfg = mmdit_config("flux")
    assert (cfg.d_model, cfg.num_heads, cfg.depth_double, cfg.depth_single) == (3072, 24, 19, 38)
    assert cfg.head_dim == 128 and sum(cfg.axes_dim) == 128


# ---- synthetic data ----------------------------------------------------------------------------


def test_synthetic_batches_are_deterministic_and_follow_the_codes():
    data = SyntheticMixture("g1b3i64f1s0,g1b1i64f17s1", CFG, 2, text_tokens_max=5)
    a, b = data.batch(3, 1), data.batch(3, 1)
    torch.testing.assert_close(a.batch.img, b.batch.img, rtol=0, atol=0)
    torch.testing.assert_close(a.target, b.target, rtol=0, atol=0)
    assert a.seq_lens == data.lengths(3, 1)
    assert data.batch(4, 1).batch.img.shape != a.batch.img.shape or not torch.equal(
        data.batch(4, 1).batch.img, a.batch.img
    )
    r0 = data.batch(1, 0)
    assert len(r0.seq_lens) == 3 and len(a.seq_lens) == 1
    # video: floor(17 / 3.4) = 5 latent frames of 4 x ~4 tokens, plus 0..5 text tokens
    t, h, _ = sample_grid(parse_data_codes("g1b1i64f17s1").codes[0], 16, 1.0)
    assert (t, h) == (5, 4)
    n_img = int(a.batch.is_img.sum())
    assert a.target.shape == (n_img, CFG.patch_dim) and n_img % (t * h) == 0
    # rectified-flow timesteps t = sigmoid(N(0, 1)) lie strictly inside (0, 1)
    assert torch.all((a.batch.timesteps > 0) & (a.batch.timesteps < 1))


def test_synthetic_data_errors_are_named():
    with pytest.raises(DataCodeError, match="bad data code"):
        SyntheticMixture("g1b3x64f1s0", CFG, 1)
    with pytest.raises(DataCodeError, match="not a multiple"):
        SyntheticMixture("g1b3i64f1s0,g1b1i64f17s1", CFG, 3)
    with pytest.raises(DataCodeError, match="text_tokens_max"):
        SyntheticMixture("g1b3i64f1s0", CFG, 1, text_tokens_max=-1)


# ---- adaLN-Zero initialisation -----------------------------------------------------------------


def test_fresh_model_blocks_are_exact_identities():
    """adaLN-Zero: every modulation projection starts at zero, so each block returns its
    residual stream bit for bit (gates 0), whatever the input."""
    torch.manual_seed(0)
    model = MMDiT(mmdit_config("tiny", depth_double=2, depth_single=2))
    mods = [m for m in model.modules() if isinstance(m, Modulation)]
    assert len(mods) == 2 * 2 + 2 + 1  # two streams per double block, single blocks, final
    assert all(not m.lin.weight.any() and not m.lin.bias.any() for m in mods)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def hook(_mod, args, out):
        seen.append((args[0].detach().clone(), out.detach().clone()))

    for block in model.blocks:
        block.register_forward_hook(hook)
    seqs = [_seq(n, g, i, interleave=True) for i, (n, g) in enumerate(SEQS)]
    batch = _pack(
        [{k: v.float() if v.is_floating_point() else v for k, v in s.items()} for s in seqs]
    )
    out = model(batch)
    assert len(seen) == len(model.blocks)
    for x_in, x_out in seen:
        assert x_in.abs().max() > 0 and torch.equal(x_in, x_out)
    assert out.abs().max() > 0  # the final projection is not zeroed: gradients flow at step 1
    # init_weights() again (e.g. after building on the meta device) gives the same structure
    model.init_weights()
    assert all(not m.lin.weight.any() for m in mods)


def test_adaln_zero_model_still_learns():
    """The tiny model from its adaLN-Zero start lowers the rectified-flow loss on one batch."""
    cfg = mmdit_config("tiny")
    torch.manual_seed(0)
    model = MMDiT(cfg)
    tb = SyntheticMixture("g1b2i64f1s0", cfg, 1, text_tokens_max=4).batch(1, 0)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = (model(tb.batch) - tb.target).pow(2).mean()
        losses.append(loss.item())
        optim.zero_grad()
        loss.backward()
        optim.step()
    assert losses[-1] < 0.8 * losses[0], losses
    gates = [m.lin.weight for m in model.modules() if isinstance(m, Modulation)]
    assert all(g.abs().max() > 0 for g in gates)  # the modulations left zero


def test_bf16_model_keeps_timesteps_rope_and_norms_in_fp32():
    """In bf16, 0.5 and 0.501 are one number (spacing 2^-8): the conditioning and the timestep
    embedding stay fp32, so a bf16 model still tells them apart; norms compute in fp32 too."""
    from knapformer.models.mmdit import LayerNorm32, RMSNorm32

    model = _model().to(torch.bfloat16)
    seqs = [_seq(3, (1, 2, 3), 0)]
    a = model(_pack(seqs))
    seqs[0]["t"] = torch.tensor(0.5, dtype=torch.float64)
    b = model(_pack(seqs))
    seqs[0]["t"] = torch.tensor(0.501, dtype=torch.float64)
    c = model(_pack(seqs))
    assert a.dtype == torch.bfloat16 and (b - c).abs().max() > 0
    x = torch.randn(4, 64).to(torch.bfloat16) * 100 + 1000
    ln = LayerNorm32(64, elementwise_affine=False, eps=1e-6)
    want = torch.nn.functional.layer_norm(x.float(), (64,), eps=1e-6).to(torch.bfloat16)
    assert ln(x).dtype == torch.bfloat16 and torch.equal(ln(x), want)
    rms = RMSNorm32(64, eps=1e-6).to(torch.bfloat16)
    want = torch.nn.functional.rms_norm(x.float(), (64,), rms.weight.float(), 1e-6)
    assert torch.equal(rms(x), want.to(torch.bfloat16))
