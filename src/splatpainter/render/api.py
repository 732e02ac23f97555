"""Public entry points: tensor-level ``rasterize`` and asset/camera-level ``render``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from splatpainter.render.gsplat_backend import gsplat_available, rasterize_gsplat
from splatpainter.render.project import project_gaussians, sh_to_color

if TYPE_CHECKING:
    from splatpainter.assets.gaussians import GaussianAsset
    from splatpainter.camera import Camera

BACKENDS = ("auto", "numba", "reference", "gsplat")


class RenderError(ValueError):
    """Invalid renderer input (shapes, camera, backend); the message names the problem."""


@dataclass
class RenderOutput:
    """Rendered images plus per-Gaussian screen-space extras.

    ``depth`` is the *normalised* expected depth ``sum_i w_i z_i / alpha`` (0 where
    ``alpha == 0``), with ``w_i`` the compositing weights and ``z_i`` camera-space depth.
    """

    rgb: torch.Tensor  # [H,W,3]
    alpha: torch.Tensor  # [H,W]
    depth: torch.Tensor  # [H,W]
    radii: torch.Tensor  # [N] int32, 0 = culled (behind the camera / off-screen)
    means2d: torch.Tensor  # [N,2] pixel coordinates

    @property
    def visible(self) -> torch.Tensor:
        """[N] bool: the Gaussian touches at least one tile of the image."""
        return self.radii > 0


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise RenderError(msg)


def _validate(
    means, quats, log_scales, opacity_logits, sh, colors, world_to_cam, K, width, height, bg
) -> int:
    for name, t in (
        ("means", means),
        ("quats", quats),
        ("log_scales", log_scales),
        ("opacity_logits", opacity_logits),
        ("world_to_cam", world_to_cam),
        ("K", K),
    ):
        _check(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t)}")
        _check(t.is_floating_point(), f"{name} must be floating point, got {t.dtype}")
    n = means.shape[0] if means.dim() == 2 else -1
    _check(
        means.dim() == 2 and means.shape[1] == 3, f"means must be [N,3], got {tuple(means.shape)}"
    )
    _check(tuple(quats.shape) == (n, 4), f"quats must be [{n},4], got {tuple(quats.shape)}")
    _check(
        tuple(log_scales.shape) == (n, 3),
        f"log_scales must be [{n},3], got {tuple(log_scales.shape)}",
    )
    _check(
        tuple(opacity_logits.shape) == (n,),
        f"opacity_logits must be [{n}], got {tuple(opacity_logits.shape)}",
    )
    if colors is None:
        _check(sh is not None, "either sh or colors must be given")
        _check(
            sh.dim() == 3 and sh.shape[0] == n and sh.shape[2] == 3,
            f"sh must be [{n},K,3], got {tuple(sh.shape)}",
        )
        k = sh.shape[1]
        deg = math.isqrt(k) - 1
        _check(k in (1, 4, 9, 16), f"sh has {k} coefficients per channel; expected 1, 4, 9 or 16")
    else:
        _check(tuple(colors.shape) == (n, 3), f"colors must be [{n},3], got {tuple(colors.shape)}")
        deg = 0
    _check(
        tuple(world_to_cam.shape) == (4, 4),
        f"world_to_cam must be [4,4], got {tuple(world_to_cam.shape)}",
    )
    _check(tuple(K.shape) == (3, 3), f"K must be [3,3], got {tuple(K.shape)}")
    _check(bool(torch.isfinite(K).all()), "K has non-finite entries")
    _check(bool(torch.isfinite(world_to_cam).all()), "world_to_cam has non-finite entries")
    _check(
        float(K[0, 0]) > 0 and float(K[1, 1]) > 0,
        f"focal lengths must be positive, got fx={float(K[0, 0])}, fy={float(K[1, 1])}",
    )
    for name, v in (("width", width), ("height", height)):
        _check(
            isinstance(v, int) and not isinstance(v, bool) and v > 0,
            f"{name} must be a positive int, got {v!r}",
        )
    _check(tuple(bg.shape) == (3,), f"background must have 3 values, got {tuple(bg.shape)}")
    attrs = [("means", means), ("quats", quats), ("log_scales", log_scales)]
    attrs += [
        ("opacity_logits", opacity_logits),
        ("sh" if colors is None else "colors", sh if colors is None else colors),
    ]
    for name, t in attrs if n > 0 else []:
        if bool(torch.isfinite(t.detach().sum())):
            continue  # one reduction; the per-element scan only runs when something is off
        ok = torch.isfinite(t.detach()).reshape(n, -1).all(dim=1)
        if not bool(ok.all()):
            first = int(torch.nonzero(~ok)[0, 0])
            raise RenderError(f"{name} has a non-finite value at Gaussian {first}")
    return deg


def rasterize(
    means: torch.Tensor,
    quats: torch.Tensor,
    log_scales: torch.Tensor,
    opacity_logits: torch.Tensor,
    sh: torch.Tensor | None,
    world_to_cam: torch.Tensor,
    K: torch.Tensor,
    width: int,
    height: int,
    background: torch.Tensor | tuple[float, float, float] = (0.0, 0.0, 0.0),
    sh_degree: int | None = None,
    backend: str = "auto",
    colors: torch.Tensor | None = None,
) -> RenderOutput:
    """Render Gaussians, differentiably w.r.t. every attribute (and ``colors`` if given).

    ``sh`` is [N,K,3] coefficient-major (``sh[:,0]`` = DC); ``sh_degree`` (default: the
    largest the coefficients allow) selects how many bands are used. ``colors`` [N,3] replaces
    SH evaluation entirely (used as given, not offset or clamped). ``background`` is a constant
    (no gradient). Backends: "numba" (compiled CPU), "reference" (pure PyTorch), "gsplat"
    (CUDA + gsplat), "auto" (gsplat on CUDA when installed, otherwise numba).
    """
    _check(backend in BACKENDS, f"unknown backend {backend!r}; choose one of {BACKENDS}")
    bg = torch.as_tensor(background, dtype=means.dtype if torch.is_tensor(means) else None)
    max_deg = _validate(
        means, quats, log_scales, opacity_logits, sh, colors, world_to_cam, K, width, height, bg
    )
    if colors is None:
        if sh_degree is None:
            sh_degree = max_deg
        _check(
            isinstance(sh_degree, int) and 0 <= sh_degree <= max_deg,
            f"sh_degree must be an int in 0..{max_deg} for sh with {sh.shape[1]} coefficients, "
            f"got {sh_degree!r}",
        )
    if backend == "auto":
        backend = "gsplat" if means.is_cuda and gsplat_available() else "numba"
    if backend == "gsplat":
        _check(gsplat_available(), "backend 'gsplat' needs CUDA and the gsplat package")
        _check(means.is_cuda, "backend 'gsplat' needs the Gaussians on a CUDA device")
        rgb, alpha, depth, radii, means2d = rasterize_gsplat(
            means, quats, log_scales, opacity_logits, sh, colors, world_to_cam, K,
            width, height, bg, sh_degree or 0,
        )  # fmt: skip
        return RenderOutput(rgb=rgb, alpha=alpha, depth=depth, radii=radii, means2d=means2d)

    w2c = world_to_cam.to(device=means.device, dtype=means.dtype)
    if backend == "numba":
        from splatpainter.render import fast

        project, shade, raster = fast.project_numba, fast.sh_to_color_numba, fast.rasterize_numba
    else:
        from splatpainter.render.reference import rasterize_reference as raster

        project, shade = project_gaussians, sh_to_color
    proj = project(means, quats, log_scales, w2c, K.to(means), width, height)
    if colors is None:
        colors = shade(means, sh, w2c, sh_degree)
    opacities = torch.sigmoid(opacity_logits)
    rgb, alpha, depth_sum = raster(
        proj.means2d, proj.conics, colors, opacities, proj.depths, proj.radii,
        width, height, bg.to(means.device),
    )  # fmt: skip
    rgb, alpha, depth_sum = (
        x.to(device=means.device, dtype=means.dtype) for x in (rgb, alpha, depth_sum)
    )
    depth = torch.where(alpha > 0, depth_sum / alpha.clamp_min(1e-10), torch.zeros_like(alpha))
    return RenderOutput(
        rgb=rgb,
        alpha=alpha,
        depth=depth,
        radii=proj.radii.to(means.device),
        means2d=proj.means2d.to(device=means.device, dtype=means.dtype),
    )


def render(
    asset: GaussianAsset,
    camera: Camera,
    *,
    background: torch.Tensor | tuple[float, float, float] = (0.0, 0.0, 0.0),
    sh_degree: int | None = None,
    backend: str = "auto",
    colors: torch.Tensor | None = None,
) -> RenderOutput:
    """Render a ``GaussianAsset`` from a ``Camera`` (see ``rasterize`` for the options)."""
    return rasterize(
        asset.means,
        asset.quats,
        asset.log_scales,
        asset.opacity_logits,
        asset.sh,
        camera.world_to_cam,
        camera.K(),
        int(camera.width),
        int(camera.height),
        background=background,
        sh_degree=sh_degree,
        backend=backend,
        colors=colors,
    )


def splat_weights(
    asset: GaussianAsset,
    camera: Camera,
    pixel_weights: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Per-Gaussian compositing weight ``sum_p m_p w_gp`` [N] (m = pixel_weights [H,W] or 1).

    Computed as the gradient of the rendered image w.r.t. a colour override, which is exactly
    the sum of the Gaussian's alpha-blending weights over the (weighted) pixels.
    """
    n = asset.num_gaussians
    colors = torch.zeros(n, 3, dtype=asset.means.dtype, device=asset.means.device)
    colors.requires_grad_(True)
    with torch.enable_grad():
        out = render(asset.detach(), camera, backend=backend, colors=colors)
        m = torch.ones_like(out.alpha) if pixel_weights is None else pixel_weights.to(out.alpha)
        _check(
            tuple(m.shape) == tuple(out.alpha.shape),
            f"pixel_weights must be [{camera.height},{camera.width}], got {tuple(m.shape)}",
        )
        (grad,) = torch.autograd.grad((out.rgb[..., 0] * m).sum(), colors)
    return grad[:, 0]
