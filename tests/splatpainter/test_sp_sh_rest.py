"""Appearance beyond DC: a linear colour map applied to every SH band is the same map applied to
the rendered colour, at any view (highlights follow a recolour)."""

import pytest
import torch

from splatpainter.assets.gaussians import SH_C0, sh_basis
from splatpainter.assets.procedural import make_demo_asset
from splatpainter.camera import orbit_cameras
from splatpainter.edit.methods import (
    IMPERCEPTIBLE,
    apply_color_delta,
    colour_change_bound,
    sh_rest_norm_bound,
)
from splatpainter.render import render


def test_linear_map_on_every_band_equals_the_map_on_the_rendered_colour():
    g = torch.Generator().manual_seed(0)
    asset = make_demo_asset(3000, sh_degree=3).asset
    n = asset.num_gaussians
    sh = asset.sh.clone()
    # colours well inside the box at every view, so the renderer's clamp never acts
    sh[:, 0] = (0.3 + 0.4 * torch.rand(n, 3, generator=g) - 0.5) / SH_C0
    sh[:, 1:] = 0.03 * torch.randn(n, 15, 3, generator=g)
    asset = asset.replace(sh=sh)
    m = torch.tensor([[0.7, 0.2, 0.05], [0.1, 0.6, 0.2], [0.05, 0.1, 0.8]])
    b = torch.tensor([0.05, 0.0, 0.1])
    base = 0.5 + SH_C0 * asset.sh[:, 0]
    edited = apply_color_delta(asset, base @ m.T + b - base, m.expand(n, 3, 3), min_change=0.0)
    # grazing and ordinary views, none of them special to the map
    cams = orbit_cameras(asset, 3, width=48, height=48, elevation_deg=-5.0)
    cams += orbit_cameras(asset, 2, width=48, height=48, elevation_deg=70.0)
    for cam in cams:
        before, after = render(asset, cam), render(edited, cam)
        want = before.rgb @ m.T + b * before.alpha[..., None]
        assert torch.allclose(after.rgb, want, atol=2e-5), float((after.rgb - want).abs().max())


def test_identity_map_and_zero_delta_keep_every_bit():
    asset = make_demo_asset(500, sh_degree=3).asset
    n = asset.num_gaussians
    out = apply_color_delta(asset, torch.zeros(n, 3), torch.eye(3).expand(n, 3, 3))
    assert torch.equal(out.sh, asset.sh)


@pytest.mark.parametrize("degree", [1, 2, 3])
def test_the_bands_norm_bound_is_the_basis_norm_in_every_direction(degree):
    d = torch.nn.functional.normalize(torch.randn(4096, 3, dtype=torch.float64), dim=-1)
    norms = sh_basis(d, degree)[:, 1:].norm(dim=-1)
    assert torch.allclose(norms, torch.full_like(norms, sh_rest_norm_bound(degree)), rtol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_change_kept_out_moves_no_pixel_of_any_view_by_half_a_level(seed):
    """The Gaussians apply_color_delta leaves alone (colour_change_bound under IMPERCEPTIBLE)
    together move no pixel of any view by IMPERCEPTIBLE: the renders with and without the cut
    differ by less, at grazing and ordinary views; and the cut leaves some out and keeps some."""
    g = torch.Generator().manual_seed(seed)
    asset = make_demo_asset(3000, sh_degree=3, seed=seed).asset
    n = asset.num_gaussians
    sh = asset.sh.clone()
    sh[:, 1:] = 0.4 * torch.randn(n, 15, 3, generator=g)  # strong view dependence
    asset = asset.replace(sh=sh)
    # deltas and maps around the level: a third only move the DC term, a third only the bands
    scale = IMPERCEPTIBLE * torch.exp(2.0 * torch.randn(n, 1, generator=g))
    rgb = scale * torch.randn(n, 3, generator=g)
    spread = 0.02 * scale[:, :, None] / IMPERCEPTIBLE
    maps = torch.eye(3) + spread * torch.randn(n, 3, 3, generator=g)
    part = torch.arange(n) % 3
    rgb[part == 1] = 0.0
    maps[part == 0] = torch.eye(3)
    exact = apply_color_delta(asset, rgb, maps, min_change=0.0)
    cut = apply_color_delta(asset, rgb, maps)
    kept = (cut.sh != asset.sh).flatten(1).any(1)
    left = (exact.sh != asset.sh).flatten(1).any(1) & ~kept
    assert int(left.sum()) > n // 10 and int(kept.sum()) > n // 10
    assert torch.equal(cut.sh[kept], exact.sh[kept])
    for p in range(3):  # every part has some left out: the bands' bound is needed
        assert bool((left & (part == p)).any())
    assert bool((colour_change_bound(asset.sh[left], exact.sh[left]) < IMPERCEPTIBLE).all())
    cams = orbit_cameras(asset, 4, width=64, height=64, elevation_deg=-5.0)
    cams += orbit_cameras(asset, 3, width=64, height=64, elevation_deg=70.0)
    worst = 0.0
    for cam in cams:
        worst = max(worst, float((render(cut, cam).rgb - render(exact, cam).rgb).abs().max()))
    assert 0.0 < worst < IMPERCEPTIBLE


def test_the_colour_change_bound_is_reached_in_the_direction_the_bands_move_along():
    """Tight: a change of DC and bands along Y(d*) (one channel) moves the colour at d* by the
    bound, and no direction by more."""
    g = torch.Generator().manual_seed(0)
    dirs = torch.randn(20000, 3, generator=g, dtype=torch.float64)
    dirs = torch.nn.functional.normalize(dirs, dim=-1)
    star = dirs[:1]
    old = torch.randn(1, 16, 3, generator=g, dtype=torch.float64)
    step = torch.zeros(1, 16, 3, dtype=torch.float64)
    step[0, :, 1] = 1e-3 * sh_basis(star, 3)[0]  # DC and bands, in the green channel
    bound = float(colour_change_bound(old, old + step)[0])
    moved = (sh_basis(dirs, 3) @ step[0]).abs().amax(-1)  # colour change per direction
    assert abs(float(moved[0]) - bound) < 1e-12
    assert float(moved.max()) <= bound + 1e-15


def test_the_write_back_block_by_block_is_the_whole_one(monkeypatch):
    from splatpainter.edit import methods

    g = torch.Generator().manual_seed(3)
    asset = make_demo_asset(2000, sh_degree=3).asset
    n = asset.num_gaussians
    scale = IMPERCEPTIBLE * torch.exp(2.0 * torch.randn(n, 1, generator=g))
    rgb = scale * torch.randn(n, 3, generator=g)
    maps = torch.eye(3) + 0.01 * torch.randn(n, 3, 3, generator=g)
    whole = apply_color_delta(asset, rgb, maps)
    monkeypatch.setattr(methods, "WRITE_BACK_ROWS", 97)
    assert torch.equal(apply_color_delta(asset, rgb, maps).sh, whole.sh)
    rows = torch.arange(0, n, 3)
    only = torch.zeros(n, dtype=torch.bool)
    only[rows] = True
    eye = torch.eye(3).expand(n, 3, 3)
    maps_only = torch.where(only[:, None, None], maps, eye)
    full = apply_color_delta(asset, rgb * only[:, None], maps_only)
    assert torch.equal(apply_color_delta(asset, rgb[rows], maps[rows], rows=rows).sh, full.sh)
