"""Masked PSNR against a hand computation: -10 log10(mean over the masked pixels and all three
channels of the squared error), data range 1, to 1e-9 dB; pooled over views by squared-error
sum and value count (not by averaging per-view PSNRs)."""

from __future__ import annotations

import math

import pytest
import torch

from splatpainter.eval import metrics as M


def _images(seed: int, h: int = 7, w: int = 5):
    g = torch.Generator().manual_seed(seed)
    pred = torch.rand(h, w, 3, generator=g)
    target = torch.rand(h, w, 3, generator=g)
    mask = torch.rand(h, w, generator=g) < 0.4
    return pred, target, mask


def _hand_sq(pred, target, mask) -> tuple[float, int]:
    """Sum of squared errors and value count over the masked pixels, in plain Python floats."""
    terms = [
        (float(pred[i, j, c]) - float(target[i, j, c])) ** 2
        for i in range(pred.shape[0])
        for j in range(pred.shape[1])
        if bool(mask[i, j])
        for c in range(3)
    ]
    return math.fsum(terms), len(terms)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_psnr_equals_hand_computed_psnr_on_the_mask(seed):
    """psnr(pred, target, mask) == 10 log10(1 / mse over mask pixels x 3 channels)."""
    pred, target, mask = _images(seed)
    assert 0 < int(mask.sum()) < mask.numel()  # a real, partial mask
    sq, n = _hand_sq(pred, target, mask)
    want = 10.0 * math.log10(n / sq)
    assert abs(M.psnr(pred, target, mask) - want) <= 1e-9
    full = torch.ones_like(mask)
    sq_all, n_all = _hand_sq(pred, target, full)
    assert abs(M.psnr(pred, target) - 10.0 * math.log10(n_all / sq_all)) <= 1e-9


def test_masked_psnr_pools_views_by_squared_error_and_count():
    """Two views of different mask sizes: one PSNR from the pooled sum and count."""
    (p1, t1, m1), (p2, t2, m2) = _images(3), _images(4, h=4, w=9)
    sq1, n1 = _hand_sq(p1, t1, m1)
    sq2, n2 = _hand_sq(p2, t2, m2)
    pooled = M.SquaredError().add(p1, t1, m1).add(p2, t2, m2)
    assert pooled.count == n1 + n2
    assert abs(pooled.mse - (sq1 + sq2) / (n1 + n2)) <= 1e-15
    assert abs(pooled.psnr() - 10.0 * math.log10((n1 + n2) / (sq1 + sq2))) <= 1e-9
