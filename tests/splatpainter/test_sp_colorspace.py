"""HSV adjustments (assets/colorspace.py) and the SH-band maps of an HSV recolour."""

import torch

from splatpainter.assets.colorspace import adjust_hsv_colors, hsv_to_rgb, rgb_to_hsv
from splatpainter.model.hypotheses import hsv_band_maps


def _colors(n: int = 4000, seed: int = 0) -> torch.Tensor:
    c = torch.rand(n, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    c[:50] = c[:50, :1]  # greys, whose hue is undefined
    c[50:60] = 0.0
    return c


def test_hsv_round_trip_gives_the_colour_back():
    c = _colors()
    assert torch.allclose(hsv_to_rgb(rgb_to_hsv(c)), c, atol=1e-12)


def test_the_identity_adjustment_changes_nothing_and_a_full_turn_neither():
    c = _colors()
    assert torch.allclose(adjust_hsv_colors(c, 0.0, 1.0, 1.0), c, atol=1e-12)
    assert torch.allclose(adjust_hsv_colors(c, 360.0, 1.0, 1.0), c, atol=1e-12)


def test_a_brightness_gain_scales_colours_and_their_band_maps():
    c = 0.01 + 0.5 * _colors()  # so that x 1.6 stays inside the colour box (and above 0)
    assert torch.allclose(adjust_hsv_colors(c, 0.0, 1.0, 1.6), 1.6 * c, atol=1e-12)
    maps = hsv_band_maps(c, torch.tensor([0.0, 1.0, 1.6]))
    assert torch.allclose(maps, 1.6 * torch.eye(3, dtype=c.dtype).expand_as(maps), atol=1e-6)


def test_band_maps_of_an_hsv_recolour_predict_how_a_small_colour_deviation_moves():
    """A view-dependent band adds a small deviation r to the base colour: the recolour moves
    c + r to about its move of c plus map @ r (away from hue and box edges)."""
    c = 0.1 + 0.8 * _colors()[60:]
    hsv = torch.tensor([75.0, 1.2, 0.9])
    r = 1e-5 * torch.randn(c.shape, generator=torch.Generator().manual_seed(1), dtype=c.dtype)
    maps = hsv_band_maps(c, hsv)
    moved = adjust_hsv_colors(c + r, *hsv.tolist()) - adjust_hsv_colors(c, *hsv.tolist())
    predicted = (maps @ r[:, :, None])[:, :, 0]
    inside = (adjust_hsv_colors(c, *hsv.tolist()) < 0.99).all(-1)
    err = (moved - predicted)[inside].abs().amax(-1)
    assert float(err.quantile(0.99)) < 1e-7
