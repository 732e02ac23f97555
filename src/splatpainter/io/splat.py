"""antimatter15 ``.splat`` read/write: 32 bytes per Gaussian, little-endian, no header.

Layout per Gaussian: position f32x3, linear scale f32x3 (= exp(log_scale)), RGBA u8x4
(RGB = 0.5 + C0 * SH DC, alpha = sigmoid(opacity)), quaternion u8x4 (w, x, y, z, normalised,
stored as round(q * 128 + 128) clipped to 0..255).

``.splat -> .splat`` is byte-exact when read with ``dtype=torch.float64``: positions and
scales are float32 in the file and survive float64. Float32 log-scales cannot hold every
float32 scale (scales a few ulps apart share a float32 logarithm once |log s| > 0.5), so the
float32 default is exact for positions, colours, opacities and rotations, and scales come back
with relative error <= |log s| * 2^-24 + 2^-24. Colours and
opacities decode to the byte's value and round back to it; quaternions are kept as stored
(not renormalised), and a quaternion already on the byte grid ``(b - 128) / 128`` is written
as it is, so its bytes come back unchanged.

Writing any other asset (e.g. from a .ply) quantises, each value rounded to the nearest step:
positions to float32 (exact for float32 assets), scales to the float32 nearest
``exp(log_scale)`` (relative error <= 2^-24), RGB = 0.5 + C0 * f_dc and alpha each to
``round(255 v)`` after clipping to [0, 1] (error <= 0.5/255 inside [0, 1]), each component
of the normalised quaternion to ``round(128 q + 128)`` clipped to 0..255 (error <= 0.5/128,
or 1/128 for a component of exactly +1, which clips to 255); SH bands above 0 are dropped.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from appshell.atomic import atomic_write_bytes
from appshell.inputs import InputFileError, read_bytes
from splatpainter.assets.gaussians import SH_C0, GaussianAsset
from splatpainter.io.errors import AssetFormatError
from splatpainter.io.validate import check_asset_values

SPLAT_DTYPE = np.dtype(
    [("position", "<f4", (3,)), ("scale", "<f4", (3,)), ("rgba", "u1", (4,)), ("rot", "u1", (4,))]
)
assert SPLAT_DTYPE.itemsize == 32

# Alphas of 0 or 255 would give infinite logits; read them a quarter step inside, which still
# quantises back to the same byte.
_ALPHA_EPS = 0.25 / 255.0
MAX_SPLAT_BYTES = 4 << 30  # 4 GiB: 134M Gaussians


def splat_from_bytes(
    data: bytes, source: str = "<bytes>", *, dtype: torch.dtype = torch.float32
) -> GaussianAsset:
    """Decode a .splat; ``dtype=torch.float64`` keeps every scale exactly (see the module)."""
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
    sh = ((rgba[:, :3].astype(np.float64) - 0.5) / SH_C0)[:, None, :]
    alpha = alpha.astype(np.float64)
    np_dt = np.float64 if dtype == torch.float64 else np.float32
    asset = GaussianAsset(
        means=torch.from_numpy(pos.astype(np_dt)),
        quats=torch.from_numpy(q.astype(np_dt)),
        log_scales=torch.from_numpy(np.log(scale.astype(np.float64)).astype(np_dt)),
        opacity_logits=torch.from_numpy(np.log(alpha / (1.0 - alpha)).astype(np_dt)),
        sh=torch.from_numpy(np.ascontiguousarray(sh, dtype=np_dt)),
    )
    return check_asset_values(asset, source)


def read_splat(
    path: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32
) -> GaussianAsset:
    """Load a .splat file as an SH degree 0 asset (float64: byte-exact when written back)."""
    try:
        data = read_bytes(path, max_bytes=MAX_SPLAT_BYTES, what=".splat file")
    except InputFileError as e:
        raise AssetFormatError(str(e)) from None
    return splat_from_bytes(data, str(path), dtype=dtype)


def _quantise(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def _quantise_quats(q: np.ndarray) -> np.ndarray:
    """Bytes round(128 q + 128) of the normalised quaternion; one already on the byte grid
    (every component (b - 128) / 128 for a byte b, as read from a .splat) keeps its bytes."""
    stored = q * 128.0 + 128.0
    on_grid = ((stored == np.rint(stored)) & (stored >= 0) & (stored <= 255)).all(axis=1)
    norm = np.linalg.norm(q, axis=1, keepdims=True)
    scaled = np.where(on_grid[:, None], stored, q / norm * 128.0 + 128.0)
    return _quantise(scaled)


def splat_to_bytes(asset: GaussianAsset, *, sort: bool = False) -> bytes:
    """Serialise; sort=True orders by size * opacity, descending, as web viewers prefer."""
    check_asset_values(asset, "cannot write .splat")
    if asset.num_gaussians == 0:
        raise AssetFormatError(
            "cannot write .splat: the asset has no Gaussians (an empty .splat file is not readable)"
        )
    a = asset.detach().to(device="cpu", dtype=torch.float64)  # float32 values are exact
    n = a.num_gaussians
    table = np.empty(n, dtype=SPLAT_DTYPE)
    table["position"] = a.means.numpy().astype(np.float32)
    table["scale"] = np.exp(a.log_scales.numpy()).astype(np.float32)
    rgb = 0.5 + SH_C0 * a.sh[:, 0, :].numpy()
    alpha = torch.sigmoid(a.opacity_logits).numpy()
    table["rgba"] = _quantise(np.concatenate([rgb, alpha[:, None]], axis=1) * 255.0)
    table["rot"] = _quantise_quats(a.quats.numpy())
    if sort:
        importance = -np.exp(a.log_scales.sum(dim=1).numpy()) * alpha
        table = table[np.argsort(importance, kind="stable")]
    return table.tobytes()


def write_splat(asset: GaussianAsset, path: str | os.PathLike[str], *, sort: bool = False) -> None:
    """Atomically write a .splat file (SH bands above 0 are dropped)."""
    data = splat_to_bytes(asset, sort=sort)
    splat_from_bytes(data, f"{path} (as it would be written)")  # a file we write always loads
    atomic_write_bytes(path, data)
