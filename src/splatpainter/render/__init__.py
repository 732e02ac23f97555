"""Differentiable 3DGS renderer: compiled CPU kernels (numba), a PyTorch reference, gsplat on CUDA.

Stages (gsplat-style): EWA projection -> SH colour -> tile binning (16x16 tiles, 3-sigma box)
-> per-tile (depth, index) order -> front-to-back compositing with early termination.

- ``rasterize(means, quats, log_scales, opacity_logits, sh, world_to_cam, K, width, height,
  background=..., sh_degree=None, backend="auto", colors=None) -> RenderOutput``
- ``render(asset, camera, *, background, sh_degree, backend, colors) -> RenderOutput``
- ``splat_weights(asset, camera, pixel_weights=None) -> [N]`` per-Gaussian compositing weight.

``RenderOutput``: rgb [H,W,3], alpha [H,W], depth [H,W] (alpha-normalised expected camera z,
0 where alpha is 0), radii [N] (0 = culled), means2d [N,2], ``visible``. Backends: "numba"
(fast CPU, explicit backward), "reference" (pure PyTorch autograd), "gsplat" (CUDA), "auto".
Conventions follow ``splatpainter.camera`` (OpenCV, pixel centres at +0.5).

On a shared/oversubscribed CPU, set ``OMP_WAIT_POLICY=PASSIVE`` before starting Python: the
numba "omp" threading layer (and torch) otherwise spin at barriers and can run several times
slower.
"""

from splatpainter.render.api import (
    BACKENDS,
    RenderError,
    RenderOutput,
    rasterize,
    render,
    splat_weights,
)

__all__ = ["BACKENDS", "RenderError", "RenderOutput", "rasterize", "render", "splat_weights"]
