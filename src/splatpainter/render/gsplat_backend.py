"""Optional CUDA backend: ``gsplat.rasterization`` (gsplat >= 1.5) with this package's rules.

Not exercised on CPU-only machines (gsplat needs CUDA). What is the same as the numba and
reference backends (``project.py`` states the rules): OpenCV camera, pixel centres at +0.5,
near/far culling in view space, ``eps2d`` dilation, ``radius_clip``, classic/antialiased
modes (same compensation), per-axis opacity-aware boxes, 16 px tiles, the 1/255 alpha
cut-off, SH + 0.5 clamped at 0, expected depth = accumulated depth / alpha. The overflow
guard (2D standard deviation above ``MAX_SIGMA_PX``) is applied here before gsplat runs, by
giving those Gaussians opacity 0 (gsplat then culls them), and scales are clamped as ours.

Documented differences, and exactly what ``test_gsplat_matches_reference_on_cuda`` tolerates:

- alpha clamp: gsplat clamps ``opacity * exp(power)`` at 0.999, the other backends at 0.99
  (the INRIA value). The parity test renders the reference with ``alpha_max=0.999`` for the
  tight comparison, and checks that with 0.99 the images differ only at pixels where some
  Gaussian's raw alpha exceeds 0.99.
- transmittance stop: gsplat stops when ``T (1 - alpha) <= 1e-4``, the others when it is
  ``< 1e-4`` (differs only on exact float equality).
- float32 throughout (the numba projection computes in float64), so agreement is to ~1e-4.
"""

from __future__ import annotations

import torch

from splatpainter.render.project import MAX_LOG_SCALE, TILE, overflow_mask


def gsplat_available() -> bool:
    """True when gsplat imports and CUDA is usable."""
    if not torch.cuda.is_available():
        return False
    try:
        import gsplat  # noqa: F401
    except ImportError:
        return False
    return True


def rasterize_gsplat(
    means: torch.Tensor,
    quats: torch.Tensor,
    log_scales: torch.Tensor,
    opacity_logits: torch.Tensor,
    sh: torch.Tensor | None,
    colors: torch.Tensor | None,
    world_to_cam: torch.Tensor,
    K: torch.Tensor,
    width: int,
    height: int,
    background: torch.Tensor,
    sh_degree: int,
    *,
    near_plane: float,
    far_plane: float,
    eps2d: float,
    radius_clip: float,
    antialiased: bool,
) -> tuple[torch.Tensor, ...]:
    """Batched cameras [C,4,4] / [C,3,3], background [C,D]; returns the ``RenderOutput``
    fields in order, each with a leading [C] dimension."""
    import gsplat

    dev, dt = means.device, means.dtype
    if colors is None:
        feats, degree = sh[:, : (sh_degree + 1) ** 2, :], sh_degree
    else:
        feats, degree = colors, None
    w2c = world_to_cam.to(device=dev, dtype=dt)
    Ks = K.to(device=dev, dtype=dt)
    drop = torch.zeros(means.shape[0], dtype=torch.bool, device=dev)
    for i in range(w2c.shape[0]):  # the overflow guard, for any of the cameras
        drop |= overflow_mask(
            means, quats, log_scales, w2c[i], Ks[i], width, height,
            near_plane=near_plane, far_plane=far_plane,
        )  # fmt: skip
    opacities = torch.sigmoid(opacity_logits) * (~drop).to(dt)
    renders, alphas, meta = gsplat.rasterization(
        means=means,
        quats=quats,
        scales=torch.exp(log_scales.clamp_max(MAX_LOG_SCALE)),
        opacities=opacities,
        colors=feats,
        viewmats=w2c,
        Ks=Ks,
        width=width,
        height=height,
        near_plane=near_plane,
        far_plane=far_plane,
        eps2d=eps2d,
        radius_clip=radius_clip,
        sh_degree=degree,
        backgrounds=background.to(device=dev, dtype=dt),
        render_mode="RGB+D",
        rasterize_mode="antialiased" if antialiased else "classic",
        tile_size=TILE,
        packed=False,
    )
    radii = meta["radii"]  # [C,N,2] in gsplat >= 1.5, [C,N] before
    radii_xy = radii if radii.dim() == 3 else torch.stack([radii, radii], dim=-1)
    alpha = alphas[..., 0]
    depth_accum = renders[..., -1]
    depth = torch.where(alpha > 0, depth_accum / alpha.clamp_min(1e-10), torch.zeros_like(alpha))
    return (
        renders[..., :-1],
        alpha,
        depth,
        radii_xy.max(dim=-1).values.to(torch.int32),
        meta["means2d"],
        depth_accum,
        radii_xy.to(torch.int32),
    )
