"""Value checks every asset passes when it is loaded and before it is written.

`GaussianAsset.validate` checks shapes and finiteness of the stored values. A stored value can
be finite and still overflow once activated (a log-scale of 1e6 gives an infinite scale, a
position of 3e38 an infinite distance), which would only fail later, far from the file. These
checks run on the float32 values the renderer and the file formats use, so a file that loads
renders, and a file we write loads back.
"""

from __future__ import annotations

import numpy as np
import torch

from splatpainter.assets.gaussians import AssetError, GaussianAsset
from splatpainter.io.errors import AssetFormatError, add_note

# Squares (distances, covariances) of these must stay finite and non-zero in float32.
MAX_ABS_POSITION = 1e15
MAX_ABS_LOG_SCALE = 40.0
MAX_ABS_SH = 1e15
MIN_QUAT_NORM = 1e-12
# Opacity logits of +-inf (opacity exactly 1 or 0, as tools write after decoding 8-bit alphas)
# load as +-20: float32 sigmoid(20) is exactly 1.0, and sigmoid(-20) ~ 2e-9 is below the
# renderer's 1/255 alpha cut, so the clamped Gaussian renders exactly as the infinite one would.
OPACITY_LOGIT_LIMIT = 20.0


def _first_bad(bad: torch.Tensor) -> int | None:
    bad = bad.reshape(bad.shape[0], -1).any(dim=1)
    return int(bad.nonzero()[0, 0]) if bool(bad.any()) else None


def check_asset_values(asset: GaussianAsset, source: str = "asset") -> GaussianAsset:
    """Raise AssetFormatError naming the attribute and first bad Gaussian; return the asset.

    Checked in float32: every tensor finite (`validate`), |position| <= 1e15, |log-scale| <= 40
    (so exp(scale) and its square are finite and positive), opacity sigmoid finite, quaternion
    norm finite and > 1e-12, |SH| <= 1e15.
    """
    try:
        asset.validate()
    except AssetFormatError:
        raise
    except AssetError as e:
        raise AssetFormatError(f"{source}: {e}") from None
    if asset.num_gaussians == 0:
        return asset
    a = asset.detach().to(device="cpu", dtype=torch.float32)
    checks = [
        ("position", a.means, lambda t: ~(t.abs() <= MAX_ABS_POSITION),
         f"|coordinate| above {MAX_ABS_POSITION:g}"),
        ("log-scale", a.log_scales, lambda t: ~(t.abs() <= MAX_ABS_LOG_SCALE),
         f"|log-scale| above {MAX_ABS_LOG_SCALE:g} (exp overflows or vanishes)"),
        ("opacity", a.opacity_logits, lambda t: ~torch.isfinite(torch.sigmoid(t)),
         "sigmoid is not finite"),
        ("quaternion", a.quats, lambda t: ~(t.norm(dim=1) > MIN_QUAT_NORM)
         | ~torch.isfinite(t.norm(dim=1)), "norm is zero or not finite"),
        ("SH coefficient", a.sh, lambda t: ~(t.abs() <= MAX_ABS_SH),
         f"|value| above {MAX_ABS_SH:g}"),
    ]  # fmt: skip
    for name, tensor, is_bad, why in checks:
        i = _first_bad(is_bad(tensor))
        if i is not None:
            values = [round(float(v), 6) for v in tensor[i].reshape(-1)[:8]]
            raise AssetFormatError(f"{source}: {name} of Gaussian {i} {values}: {why}")
    return asset


def clamp_infinite_opacity(
    logits: np.ndarray, source: str, notes: list[str] | None = None
) -> np.ndarray:
    """Logits with +-inf replaced by +-OPACITY_LOGIT_LIMIT, and one note saying how many.

    NaN is left in place for the caller's finiteness check to refuse.
    """
    inf = np.isinf(logits)
    if not inf.any():
        return logits
    n_pos = int((logits[inf] > 0).sum())
    n_neg = int(inf.sum()) - n_pos
    out = np.where(inf, np.sign(logits) * OPACITY_LOGIT_LIMIT, logits).astype(logits.dtype)
    add_note(
        notes,
        f"{source}: {n_pos} opacity logit(s) of +inf loaded as opacity 1 and {n_neg} of -inf "
        f"as opacity 0 (logit clamped to +-{OPACITY_LOGIT_LIMIT:g})",
    )
    return out


__all__ = [
    "MAX_ABS_LOG_SCALE",
    "MAX_ABS_POSITION",
    "MAX_ABS_SH",
    "OPACITY_LOGIT_LIMIT",
    "check_asset_values",
    "clamp_infinite_opacity",
]


def asset_from_arrays(
    means, quats, log_scales, opacity_logits, sh, source: str = "asset"
) -> GaussianAsset:
    """A checked float32 asset from decoded numpy arrays (what every compressed reader ends
    with)."""

    def f32(a) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))

    asset = GaussianAsset(
        means=f32(means),
        quats=f32(quats),
        log_scales=f32(log_scales),
        opacity_logits=f32(opacity_logits),
        sh=f32(sh),
    )
    return check_asset_values(asset, source)
