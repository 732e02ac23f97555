"""HSV colour adjustments: the web editor's HSV tool and the editor's HSV recolour hypothesis
make the same change (hue turned, saturation and value scaled), so it is written once here."""

from __future__ import annotations

import math

import torch


def rgb_to_hsv(rgb: torch.Tensor) -> torch.Tensor:
    """[..., 3] RGB (>= 0) -> [..., 3] (hue in degrees [0, 360), saturation, value = max)."""
    r, g, b = rgb.unbind(-1)
    mx, mn = rgb.amax(-1), rgb.amin(-1)
    c = mx - mn
    safe = torch.where(c > 0, c, torch.ones_like(c))
    hue = torch.where(
        mx == r,
        torch.remainder((g - b) / safe, 6.0),
        torch.where(mx == g, (b - r) / safe + 2.0, (r - g) / safe + 4.0),
    )
    hue = torch.where(c > 0, hue * 60.0, torch.zeros_like(hue))
    sat = torch.where(
        mx > 0, c / torch.where(mx > 0, mx, torch.ones_like(mx)), torch.zeros_like(mx)
    )
    return torch.stack([hue, sat, mx], -1)


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """[N, 3] (hue in degrees, saturation, value) -> [N, 3] RGB."""
    hue, sat, val = hsv.unbind(-1)
    c = val * sat
    hp = torch.remainder(hue, 360.0) / 60.0
    x = c * (1 - torch.abs(torch.remainder(hp, 2.0) - 1))
    zero = torch.zeros_like(c)
    sector = torch.clamp(torch.floor(hp), 0, 5).long()
    table = torch.stack(
        [
            torch.stack([c, x, zero], -1),
            torch.stack([x, c, zero], -1),
            torch.stack([zero, c, x], -1),
            torch.stack([zero, x, c], -1),
            torch.stack([x, zero, c], -1),
            torch.stack([c, zero, x], -1),
        ],
        1,
    )
    rgb = table[torch.arange(len(sector)), sector]
    return rgb + (val - c)[:, None]


def adjust_hsv_colors(
    rgb: torch.Tensor, hue: float, saturation: float, brightness: float
) -> torch.Tensor:
    """[N, 3] colours (negatives read as 0) moved in HSV: hue + `hue` degrees, saturation x
    `saturation` (at most 1), value x `brightness` (not capped: a 3D colour may exceed 1)."""
    return adjust_hsv(rgb_to_hsv(rgb.clamp_min(0.0)), hue, saturation, brightness)


def adjust_hsv(hsv: torch.Tensor, hue: float, saturation: float, brightness: float):
    """`adjust_hsv_colors` of colours already in HSV [N, 3] (fits try many adjustments)."""
    hsv = torch.stack(
        [hsv[:, 0] + hue, (hsv[:, 1] * saturation).clamp(0.0, 1.0), hsv[:, 2] * brightness], -1
    )
    return hsv_to_rgb(hsv)


def hsv_matrix(hue: float, saturation: float, brightness: float) -> torch.Tensor:
    """The linear colour map [3, 3] for the view-dependent SH bands (colour deviations): a
    rotation by `hue` about the grey axis, `saturation` scaling the part off that axis, then
    `brightness` scaling all."""
    grey = torch.full((3, 3), 1.0 / 3.0, dtype=torch.float64)
    a = math.radians(hue)
    k = torch.tensor([[0, -1, 1], [1, 0, -1], [-1, 1, 0]], dtype=torch.float64) / math.sqrt(3)
    rot = torch.eye(3, dtype=torch.float64) + math.sin(a) * k + (1 - math.cos(a)) * (k @ k)
    return brightness * (grey + saturation * rot @ (torch.eye(3, dtype=torch.float64) - grey))
