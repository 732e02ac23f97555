"""Optional CUDA backend: ``gsplat.rasterization`` with this package's conventions.

Not exercised on CPU-only machines (gsplat needs CUDA). Conventions match the numba/reference
path: OpenCV camera, pixel centres at +0.5, near plane 0.01, 0.3 px dilation ("classic"
mode), 16 px tiles, SH + 0.5 clamped at 0, normalised expected depth ("ED").
"""

from __future__ import annotations

import torch

from splatpainter.render.project import EPS2D, NEAR_PLANE, TILE


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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns rgb [H,W,3], alpha [H,W], normalised depth [H,W], radii [N], means2d [N,2]."""
    import gsplat

    dev = means.device
    if colors is None:
        feats, degree = sh[:, : (sh_degree + 1) ** 2, :], sh_degree
    else:
        feats, degree = colors, None
    renders, alphas, meta = gsplat.rasterization(
        means=means,
        quats=quats,
        scales=torch.exp(log_scales),
        opacities=torch.sigmoid(opacity_logits),
        colors=feats,
        viewmats=world_to_cam.to(device=dev, dtype=means.dtype)[None],
        Ks=K.to(device=dev, dtype=means.dtype)[None],
        width=width,
        height=height,
        near_plane=NEAR_PLANE,
        eps2d=EPS2D,
        sh_degree=degree,
        backgrounds=background.to(device=dev, dtype=means.dtype)[None],
        render_mode="RGB+ED",
        rasterize_mode="classic",
        tile_size=TILE,
        packed=False,
    )
    radii = meta["radii"][0]
    if radii.dim() == 2:  # newer gsplat: per-axis radii [N,2]
        radii = radii.max(dim=-1).values
    return (
        renders[0, ..., :3],
        alphas[0, ..., 0],
        renders[0, ..., 3],
        radii.to(torch.int32),
        meta["means2d"][0],
    )
