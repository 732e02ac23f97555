"""Image and per-Gaussian metrics of the evaluation suite: plain tensors in, floats/tensors out.

Images are float [H, W, 3] in [0, 1] (data range 1); masks are bool [H, W].  PSNR is pooled:
callers add up squared errors and pixel counts over all the views of one scene (`SquaredError`)
and take one PSNR from the pooled MSE, so a view with few pixels does not weigh as much as one
with many.  No pixels to measure gives NaN (callers skip it); a zero error gives +inf unless a
`max_db` ceiling is asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

CHANGED_THRESHOLD = 2.0 / 255.0  # a pixel "changed" if some channel moved by more than this
OBJECT_ALPHA = 0.5  # an object pixel has ground-truth alpha above this
SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_K1, SSIM_K2 = 0.01, 0.03


def changed_mask(
    after: torch.Tensor, before: torch.Tensor, threshold: float = CHANGED_THRESHOLD
) -> torch.Tensor:
    """Pixels [H, W] whose max-channel |after - before| exceeds `threshold`."""
    _check_pair(after, before)
    return (after - before).abs().amax(-1) > threshold


def object_mask(alpha: torch.Tensor, threshold: float = OBJECT_ALPHA) -> torch.Tensor:
    """Pixels [H, W] the object covers (alpha above `threshold`)."""
    return alpha > threshold


@dataclass
class SquaredError:
    """Running sum of squared errors and the number of values, to pool MSE over views."""

    sum_sq: float = 0.0
    count: int = 0

    def add(self, pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None):
        """Add the squared error of all channels of the pixels in `mask` (all when None)."""
        _check_pair(pred, target)
        diff = (pred.double() - target.double()) ** 2
        if mask is not None:
            _check_mask(mask, pred)
            diff = diff[mask]
        self.sum_sq += float(diff.sum())
        self.count += int(diff.numel())
        return self

    @property
    def mse(self) -> float:
        return self.sum_sq / self.count if self.count else math.nan

    def psnr(self, max_db: float | None = None) -> float:
        return psnr_from_mse(self.mse, max_db)


def psnr_from_mse(mse: float, max_db: float | None = None) -> float:
    """10 log10(1 / mse) for data range 1; NaN for NaN, +inf (or `max_db`) for a zero error."""
    if math.isnan(mse):
        return math.nan
    if mse <= 0.0:
        return math.inf if max_db is None else float(max_db)
    db = -10.0 * math.log10(mse)
    return db if max_db is None else min(db, float(max_db))


def psnr(
    pred: torch.Tensor,
    target: torch.Tensor,
    mask: torch.Tensor | None = None,
    max_db: float | None = None,
) -> float:
    """PSNR over the pixels in `mask` (all when None) of one image pair."""
    return SquaredError().add(pred, target, mask).psnr(max_db)


def gaussian_window(size: int = SSIM_WINDOW, sigma: float = SSIM_SIGMA) -> torch.Tensor:
    """Normalised 1D Gaussian [size] (the separable SSIM window)."""
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2.0
    g = torch.exp(-(x**2) / (2.0 * sigma**2))
    return g / g.sum()


def ssim_map(
    a: torch.Tensor,
    b: torch.Tensor,
    window: int = SSIM_WINDOW,
    sigma: float = SSIM_SIGMA,
) -> torch.Tensor:
    """Per-pixel SSIM [H, W] of two images [H, W, C], averaged over channels.

    Wang et al. 2004: Gaussian-weighted local means, variances and covariance (window `window`,
    `sigma`), C1 = (0.01)^2, C2 = (0.03)^2 for data range 1.  The map has the image's size:
    borders are replicate-padded, so it can be averaged over any pixel mask.  Computed in
    float64, so identical images give exactly 1.
    """
    _check_pair(a, b)
    if window % 2 != 1 or window < 1:
        raise ValueError(f"SSIM window must be an odd positive size, got {window}")
    x = a.double().permute(2, 0, 1)  # [C, H, W]
    y = b.double().permute(2, 0, 1)
    g = gaussian_window(window, sigma).to(x.device)
    rows, cols = _blur_matrix(g, x.shape[1]), _blur_matrix(g, x.shape[2])

    def blur(t: torch.Tensor) -> torch.Tensor:  # separable, replicate-padded
        return rows.T @ t @ cols

    mx, my = blur(x), blur(y)
    sxx = blur(x * x) - mx * mx
    syy = blur(y * y) - my * my
    sxy = blur(x * y) - mx * my
    c1, c2 = SSIM_K1**2, SSIM_K2**2
    s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
    return s.mean(0).to(a.dtype if a.is_floating_point() else torch.float32)


def _blur_matrix(g: torch.Tensor, n: int) -> torch.Tensor:
    """[n, n] M with (t @ M)[j] = sum_k g[k] t[clamp(j + k - pad, 0, n - 1)]: a 1D blur with
    replicate padding as one matrix product (a grouped float64 conv is ~50x slower on a CPU)."""
    pad = g.shape[0] // 2
    j = torch.arange(n, device=g.device)
    src = (j[None, :] + torch.arange(g.shape[0], device=g.device)[:, None] - pad).clamp(0, n - 1)
    m = torch.zeros(n, n, dtype=g.dtype, device=g.device)
    m.index_put_((src.flatten(), j.expand_as(src).flatten()), g[:, None].expand_as(src).flatten(),
                 accumulate=True)  # fmt: skip
    return m


@dataclass
class MaskedMean:
    """Running mean of a per-pixel map over masked pixels, pooled over views."""

    total: float = 0.0
    count: int = 0

    def add(self, values: torch.Tensor, mask: torch.Tensor):
        _check_mask(mask, values[..., None])
        self.total += float(values.double()[mask].sum())
        self.count += int(mask.sum())
        return self

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan


def color_error(pred: torch.Tensor, target: torch.Tensor, select: torch.Tensor) -> float:
    """Mean |pred - target| over RGB of the selected Gaussians (NaN when none is selected)."""
    if pred.shape != target.shape or pred.dim() != 2:
        raise ValueError(
            f"colours must both be [N, 3], got {tuple(pred.shape)} and {tuple(target.shape)}"
        )
    if select.shape != pred.shape[:1]:
        raise ValueError(f"selection must be [{pred.shape[0]}], got {tuple(select.shape)}")
    if not bool(select.any()):
        return math.nan
    return float((pred.double()[select] - target.double()[select]).abs().mean())


def nanmean(values: list[float]) -> tuple[float, int]:
    """Mean of the non-NaN values and how many there were (NaN, 0 when none)."""
    kept = [v for v in values if not math.isnan(v)]
    return (sum(kept) / len(kept) if kept else math.nan), len(kept)


def _check_pair(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.shape != b.shape or a.dim() != 3:
        raise ValueError(
            f"images must both be [H, W, C], got {tuple(a.shape)} and {tuple(b.shape)}"
        )


def _check_mask(mask: torch.Tensor, image: torch.Tensor) -> None:
    if mask.dtype != torch.bool or mask.shape != image.shape[:2]:
        raise ValueError(
            f"mask must be bool [{image.shape[0]}, {image.shape[1]}], "
            f"got {mask.dtype} {tuple(mask.shape)}"
        )
