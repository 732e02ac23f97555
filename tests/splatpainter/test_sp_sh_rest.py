"""Appearance beyond DC: a linear colour map applied to every SH band is the same map applied to
the rendered colour, at any view (highlights follow a recolour)."""

import torch

from splatpainter.assets.gaussians import SH_C0
from splatpainter.assets.procedural import make_demo_asset
from splatpainter.camera import orbit_cameras
from splatpainter.edit.methods import apply_color_delta
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
    edited = apply_color_delta(asset, base @ m.T + b - base, m.expand(n, 3, 3))
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
