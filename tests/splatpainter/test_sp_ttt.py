"""Tests of the LaCT test-time-training layer (closed-form gradient, Muon step, state handling)."""

import pytest
import torch

from splatpainter.model.ttt import (
    CUBIC_COEFFS,
    FastWeights,
    TTTConfig,
    TTTLayer,
    fast_weight_grads,
    newton_schulz,
    swiglu_fast,
)


def _rand_weights(b, h, m, d, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    w0 = torch.randn(b, h, m, d, generator=g, dtype=dtype) / d**0.5
    w1 = torch.randn(b, h, d, m, generator=g, dtype=dtype) / m**0.5
    w2 = torch.randn(b, h, m, d, generator=g, dtype=dtype) / d**0.5
    return w0, w1, w2


def test_closed_form_gradient_matches_autograd():
    b, h, t, d, m = 2, 3, 17, 8, 16
    g = torch.Generator().manual_seed(1)
    k = torch.nn.functional.normalize(
        torch.randn(b, h, t, d, generator=g, dtype=torch.float64), dim=-1
    )
    v = torch.randn(b, h, t, d, generator=g, dtype=torch.float64)
    lr = torch.rand(b, h, t, 3, generator=g, dtype=torch.float64)
    ws = [w.requires_grad_(True) for w in _rand_weights(b, h, m, d)]
    closed = fast_weight_grads(k, v, lr, *ws)
    for j in range(3):
        f = swiglu_fast(k, *ws)
        loss = -((f * v).sum(-1) * lr[..., j]).sum()
        (auto,) = torch.autograd.grad(loss, ws[j])
        torch.testing.assert_close(closed[j], auto, rtol=1e-10, atol=1e-12)


def test_closed_form_gradient_is_differentiable_for_meta_training():
    # Outer autograd must flow through the closed-form update into the initial weights.
    layer = TTTLayer(TTTConfig(dim=16, num_heads=2)).double()
    x = torch.randn(1, 10, 16, dtype=torch.float64)
    q = torch.randn(1, 5, 16, dtype=torch.float64)
    state = layer.update(layer.init_state(1), x)
    layer.apply(state, q).square().sum().backward()
    for p in (layer.w0, layer.w1, layer.w2, layer.qkv.weight, layer.lr_proj.weight):
        assert p.grad is not None and p.grad.abs().sum() > 0


@pytest.mark.parametrize("shape", [(32, 8), (8, 32), (16, 16)])
def test_newton_schulz_near_orthogonal(shape):
    g = torch.randn(4, *shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    # Muon's quintic (5 steps) lands singular values in a band around 1, not exactly on it.
    s = torch.linalg.svdvals(newton_schulz(g, steps=5))
    assert s.min() > 0.6 and s.max() < 1.25, s
    # The cubic iteration converges to orthogonal; enough steps get it within 1e-6.
    s = torch.linalg.svdvals(newton_schulz(g, steps=60, coeffs=CUBIC_COEFFS))
    torch.testing.assert_close(s, torch.ones_like(s), atol=1e-6, rtol=0)


def test_newton_schulz_zero_stays_zero():
    z = torch.zeros(2, 8, 4)
    assert torch.equal(newton_schulz(z), z)


def test_update_preserves_row_norms_and_changes_weights():
    layer = TTTLayer(TTTConfig(dim=32, num_heads=4)).double()
    state = layer.init_state(2)
    x = torch.randn(2, 50, 32, dtype=torch.float64)
    new = layer.update(state, x)
    for w_old, w_new in zip(state.tensors(), new.tensors(), strict=True):
        torch.testing.assert_close(w_new.norm(dim=-1), w_old.norm(dim=-1), rtol=1e-10, atol=0)
        assert (w_new - w_old).abs().max() > 1e-3
    assert new.num_updates == 1


def test_zero_token_weight_leaves_sample_bit_identical():
    layer = TTTLayer(TTTConfig(dim=16, num_heads=2))
    state = layer.init_state(2)
    x = torch.randn(2, 12, 16)
    weight = torch.ones(2, 12)
    weight[1] = 0.0
    new = layer.update(state, x, token_weight=weight)
    for w_old, w_new in zip(state.tensors(), new.tensors(), strict=True):
        assert torch.equal(w_new[1], w_old[1])
        assert not torch.equal(w_new[0], w_old[0])


def test_padding_tokens_do_not_matter():
    layer = TTTLayer(TTTConfig(dim=16, num_heads=2)).double()
    x = torch.randn(1, 12, 16, dtype=torch.float64)
    pad = torch.cat([x, torch.randn(1, 5, 16, dtype=torch.float64)], dim=1)
    weight = torch.cat([torch.ones(1, 12), torch.zeros(1, 5)], dim=1).double()
    a = layer.update(layer.init_state(1), x)
    b = layer.update(layer.init_state(1), pad, token_weight=weight)
    for wa, wb in zip(a.tensors(), b.tensors(), strict=True):
        torch.testing.assert_close(wa, wb)


def test_chunked_apply_equals_one_shot():
    layer = TTTLayer(TTTConfig(dim=32, num_heads=4))
    state = layer.update(layer.init_state(1), torch.randn(1, 40, 32))
    q = torch.randn(1, 103, 32)
    with torch.no_grad():
        full = layer.apply(state, q)
        pieces = torch.cat([layer.apply(state, c) for c in q.split(17, dim=1)], dim=1)
    torch.testing.assert_close(pieces, full, rtol=1e-6, atol=1e-6)


def test_damping_pulls_toward_anchor_and_keeps_norms():
    base = TTTLayer(TTTConfig(dim=16, num_heads=2))
    damped = TTTLayer(TTTConfig(dim=16, num_heads=2, damping=0.5))
    damped.load_state_dict(base.state_dict())
    xs = [torch.randn(1, 20, 16) for _ in range(6)]
    s_free, s_damp = base.init_state(1), damped.init_state(1)
    assert s_free.anchor is None and s_damp.anchor is not None
    with torch.no_grad():
        for x in xs:
            s_free = base.update(s_free, x)
            s_damp = damped.update(s_damp, x)
    init = base.init_state(1)
    drift_free = sum((a - b).norm() for a, b in zip(s_free.tensors(), init.tensors(), strict=True))
    drift_damp = sum((a - b).norm() for a, b in zip(s_damp.tensors(), init.tensors(), strict=True))
    assert drift_damp < drift_free
    for w, w0 in zip(s_damp.tensors(), init.tensors(), strict=True):
        torch.testing.assert_close(w.norm(dim=-1), w0.norm(dim=-1), rtol=1e-5, atol=0)


def test_fast_weights_roundtrip_dict():
    layer = TTTLayer(TTTConfig(dim=16, num_heads=2, damping=0.2))
    state = layer.update(layer.init_state(1), torch.randn(1, 8, 16)).detach()
    back = FastWeights.from_dict(state.to_dict())
    for a, b in zip(state.tensors(), back.tensors(), strict=True):
        assert torch.equal(a, b)
    assert back.num_updates == state.num_updates and back.anchor is not None


def test_bad_config():
    with pytest.raises(ValueError, match="divisible"):
        TTTConfig(dim=10, num_heads=3)
