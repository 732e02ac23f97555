"""Differentiable 3DGS renderer: compiled CPU kernels (numba), a PyTorch reference, gsplat on CUDA.

Stages (gsplat-style): EWA projection (near/far culling, eps2d dilation, optional antialiased
opacity compensation, per-axis opacity-aware boxes where alpha reaches 1/255) -> SH colour ->
tile binning (16x16 tiles) -> per-tile (depth, index) order -> front-to-back compositing with
early termination. The rules are stated once, in ``project.py``.

- ``rasterize(means, quats, log_scales, opacity_logits, sh, world_to_cam, K, width, height,
  background=None, sh_degree=None, backend="auto", colors=None, *, near_plane=0.2,
  far_plane=1e10, eps2d=0.3, radius_clip=0.0, rasterize_mode="classic") -> RenderOutput``;
  ``world_to_cam`` [C,4,4] renders a batch of cameras; ``colors`` [N,D] any channel count.
- ``render(asset, camera, **same options) -> RenderOutput``
- ``splat_weights(asset, camera, pixel_weights=None) -> [N]`` per-Gaussian compositing weight;
  ``splat_sums(asset, camera, targets [H,W,C]) -> [N,C]`` any per-pixel values summed under
  those weights (one forward-like pass on the numba backend); ``footprint_box(asset, camera)``
  the pixel box every drawn Gaussian stays in (a crop of it renders them all);
  ``ColorRender(asset, camera)(colors)``: renders of one geometry in changing colours, its
  projection and binning done once; ``compositing_weights(asset, camera)``: the same linear
  map as its non-zero entries (``CompositingWeights.apply`` / ``adjoint``: the least-squares
  solve's steps as a gather and a scatter).

``RenderOutput``: rgb [H,W,D], alpha [H,W], depth [H,W] (expected depth: alpha-normalised
view-space z, 0 where alpha is 0), depth_accum [H,W] (accumulated depth), radii [N] (larger
per-axis radius, 0 = culled), radii_xy [N,2], means2d [N,2], ``visible``. Backends: "numba"
(fast CPU, explicit backward for every input: Gaussians, colours, camera pose, intrinsics,
background), "reference" (pure PyTorch autograd), "gsplat" (CUDA), "auto".
Conventions follow ``splatpainter.camera`` (OpenCV, pixel centres at +0.5).

On a shared/oversubscribed CPU, set ``OMP_WAIT_POLICY=PASSIVE`` before starting Python: the
numba "omp" threading layer (and torch) otherwise spin at barriers and can run several times
slower.
"""

from splatpainter.render.api import (
    BACKENDS,
    ColorRender,
    CompositingWeights,
    RenderError,
    RenderOutput,
    compositing_weights,
    footprint_box,
    rasterize,
    render,
    splat_sums,
    splat_weights,
)

__all__ = [
    "BACKENDS",
    "ColorRender",
    "CompositingWeights",
    "RenderError",
    "RenderOutput",
    "compositing_weights",
    "footprint_box",
    "rasterize",
    "render",
    "splat_sums",
    "splat_weights",
]
