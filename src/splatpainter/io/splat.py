"""antimatter15 ``.splat`` read/write: 32 bytes per Gaussian, little-endian, no header.

Layout per Gaussian: position f32x3, linear scale f32x3 (= exp(log_scale)), RGBA u8x4
(RGB = 0.5 + C0 * SH DC, alpha = sigmoid(opacity)), quaternion u8x4 (w, x, y, z, normalised,
stored as round(q * 128 + 128) clipped to 0..255). View-dependent SH bands are dropped, and
colour, opacity and rotation are quantised to 8 bits; a round trip is exact only for
positions and scales (up to exp/log rounding).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from splatpainter.assets.gaussians import SH_C0, GaussianAsset
from splatpainter.io.atomic import atomic_open
from splatpainter.io.errors import AssetFormatError

SPLAT_DTYPE = np.dtype(
    [("position", "<f4", (3,)), ("scale", "<f4", (3,)), ("rgba", "u1", (4,)), ("rot", "u1", (4,))]
)
assert SPLAT_DTYPE.itemsize == 32

# Alphas of 0 or 255 would give infinite logits; read them a quarter step inside, which still
# quantises back to the same byte.
_ALPHA_EPS = 0.25 / 255.0


def splat_from_bytes(data: bytes, source: str = "<bytes>") -> GaussianAsset:
    if len(data) == 0:
        raise AssetFormatError(f"{source}: empty .splat file")
    if len(data) % SPLAT_DTYPE.itemsize:
        raise AssetFormatError(
            f"{source}: .splat size {len(data)} is not a multiple of 32 bytes (truncated?)"
        )
    table = np.frombuffer(data, dtype=SPLAT_DTYPE)
    pos = table["position"].astype(np.float32)
    scale = table["scale"].astype(np.float32)
    for name, arr in (("position", pos), ("scale", scale)):
        bad = ~np.isfinite(arr).all(axis=1)
        if bad.any():
            i = int(np.argmax(bad))
            raise AssetFormatError(f"{source}: non-finite {name} at Gaussian {i}: {arr[i]}")
    bad = ~(scale > 0).all(axis=1)
    if bad.any():
        i = int(np.argmax(bad))
        raise AssetFormatError(f"{source}: non-positive scale at Gaussian {i}: {scale[i]}")
    q = (table["rot"].astype(np.float32) - 128.0) / 128.0
    qn = np.linalg.norm(q, axis=1)
    bad = ~(qn > 0)
    if bad.any():
        raise AssetFormatError(f"{source}: zero quaternion at Gaussian {int(np.argmax(bad))}")
    # Quaternions are kept as stored (not renormalised), like the INRIA .ply rot_* values.
    rgba = table["rgba"].astype(np.float32) / 255.0
    alpha = np.clip(rgba[:, 3], _ALPHA_EPS, 1.0 - _ALPHA_EPS)
    sh = ((rgba[:, :3] - 0.5) / SH_C0)[:, None, :]
    return GaussianAsset(
        means=torch.from_numpy(pos),
        quats=torch.from_numpy(q),
        log_scales=torch.from_numpy(np.log(scale)),
        opacity_logits=torch.from_numpy(np.log(alpha / (1.0 - alpha)).astype(np.float32)),
        sh=torch.from_numpy(np.ascontiguousarray(sh, dtype=np.float32)),
    )


def read_splat(path: str | os.PathLike[str]) -> GaussianAsset:
    """Load a .splat file as a float32, SH degree 0 asset."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise AssetFormatError(f"cannot read {path}: {e.strerror or e}") from None
    return splat_from_bytes(data, str(path))


def _quantise(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def splat_to_bytes(asset: GaussianAsset, *, sort: bool = False) -> bytes:
    """Serialise; sort=True orders by size * opacity, descending, as web viewers prefer."""
    asset.validate()
    a = asset.detach().to(device="cpu", dtype=torch.float32)
    n = a.num_gaussians
    table = np.empty(n, dtype=SPLAT_DTYPE)
    table["position"] = a.means.numpy()
    scales = a.log_scales.exp().numpy()
    table["scale"] = scales
    rgb = 0.5 + SH_C0 * a.sh[:, 0, :].numpy()
    alpha = torch.sigmoid(a.opacity_logits).numpy()
    table["rgba"] = _quantise(np.concatenate([rgb, alpha[:, None]], axis=1) * 255.0)
    q = a.normalized_quats().numpy()
    table["rot"] = _quantise(q * 128.0 + 128.0)
    if sort:
        importance = -np.exp(a.log_scales.sum(dim=1).numpy()) * alpha
        table = table[np.argsort(importance, kind="stable")]
    return table.tobytes()


def write_splat(asset: GaussianAsset, path: str | os.PathLike[str], *, sort: bool = False) -> None:
    """Atomically write a .splat file (SH bands above 0 are dropped)."""
    data = splat_to_bytes(asset, sort=sort)
    with atomic_open(path) as f:
        f.write(data)
