""".splat -> .splat is byte-exact; .ply -> .splat quantises within the documented error.

The fixture file is written here with ``struct`` straight from the format's description
(antimatter15's convert.py convention: position f32x3, scale f32x3, RGBA u8, rotation u8 as
round(q * 128 + 128) of the normalised quaternion, Gaussians sorted by -volume * opacity),
not by this package's writer.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import torch

from splatpainter.assets import SH_C0, GaussianAsset
from splatpainter.io import read_splat, splat_to_bytes, write_splat


def _other_tool_splat(n: int = 400, seed: int = 3) -> bytes:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        pos = rng.normal(size=3) * 2.0
        scale = np.exp(rng.uniform(-9.0, 2.0, size=3))  # tiny to large: |log s| up to 9
        f_dc = rng.normal(size=3) * 1.5
        opacity = 1 / (1 + math.exp(-rng.normal() * 4))
        q = rng.normal(size=4)
        q /= np.linalg.norm(q)
        rgba = np.clip(np.round(np.append(0.5 + SH_C0 * f_dc, opacity) * 255), 0, 255)
        rot = np.clip(np.round(q * 128 + 128), 0, 255)
        rows.append((-np.prod(scale) * opacity, pos, scale, rgba, rot))
    rows.append((0.0, np.zeros(3), np.ones(3), [0, 255, 0, 255], [255, 128, 128, 128]))
    rows.append((0.0, np.ones(3), np.full(3, 1e-15), [255, 0, 1, 0], [200, 120, 0, 17]))
    rows.sort(key=lambda r: r[0])
    out = b""
    for _, pos, scale, rgba, rot in rows:
        out += struct.pack(
            "<3f3f4B4B", *pos, *scale, *(int(v) for v in rgba), *(int(v) for v in rot)
        )
    return out


def test_splat_round_trip_is_byte_exact(tmp_path):
    raw = _other_tool_splat()
    src = tmp_path / "other.splat"
    src.write_bytes(raw)
    asset = read_splat(src, dtype=torch.float64)
    dst = tmp_path / "again.splat"
    write_splat(asset, dst)
    assert dst.read_bytes() == raw
    # the float32 default: everything but the scales exact, scales within the stated error
    a32 = read_splat(src)
    again = np.frombuffer(splat_to_bytes(a32), np.uint8).reshape(-1, 32)
    first = np.frombuffer(raw, np.uint8).reshape(-1, 32)
    assert np.array_equal(again[:, :12], first[:, :12])
    assert np.array_equal(again[:, 24:], first[:, 24:])
    s0 = np.frombuffer(raw, "<f4").reshape(-1, 8)[:, 3:6].astype(np.float64)
    s1 = np.frombuffer(splat_to_bytes(a32), "<f4").reshape(-1, 8)[:, 3:6].astype(np.float64)
    bound = (np.abs(np.log(s0)) + 1) * 2.0**-24
    assert (np.abs(s1 / s0 - 1) <= bound).all()


def test_ply_to_splat_quantisation_error_is_as_documented():
    g = torch.Generator().manual_seed(0)
    n = 3000
    a = GaussianAsset(
        means=torch.randn(n, 3, generator=g),
        quats=torch.randn(n, 4, generator=g) * 3,
        log_scales=torch.randn(n, 3, generator=g) * 3 - 3,
        opacity_logits=torch.randn(n, generator=g) * 3,
        sh=torch.randn(n, 4, 3, generator=g),
    )
    tab = np.frombuffer(splat_to_bytes(a), np.uint8).reshape(n, 32)
    f = np.frombuffer(tab.tobytes(), "<f4").reshape(n, 8)
    assert np.array_equal(f[:, :3], a.means.numpy())  # positions exact (float32 asset)
    scale = np.exp(a.log_scales.double().numpy())
    assert (np.abs(f[:, 3:6] / scale - 1) <= 2.0**-24).all()  # nearest float32
    rgb = np.clip(0.5 + SH_C0 * a.sh[:, 0].double().numpy(), 0, 1)
    assert (np.abs(tab[:, 24:27] / 255 - rgb) <= 0.5 / 255 + 1e-12).all()
    alpha = torch.sigmoid(a.opacity_logits.double()).numpy()
    assert (np.abs(tab[:, 27] / 255 - alpha) <= 0.5 / 255 + 1e-12).all()
    q = a.normalized_quats().double().numpy()
    err = np.abs((tab[:, 28:32].astype(np.float64) - 128) / 128 - q)
    step = np.where(q * 128 + 128 > 255, 1 / 128, 0.5 / 128)  # +1 clips to 255
    assert (err <= step + 1e-7).all()
    assert err.max() > 0.4 / 128  # the bound is attained, not loose


def test_convert_cli_splat_to_splat_is_byte_exact(tmp_path):
    from typer.testing import CliRunner

    from splatpainter.cli import app

    src, dst = tmp_path / "other.splat", tmp_path / "again.splat"
    src.write_bytes(_other_tool_splat())
    result = CliRunner().invoke(app, ["convert", str(src), str(dst)])
    assert result.exit_code == 0, result.output
    assert dst.read_bytes() == src.read_bytes()
