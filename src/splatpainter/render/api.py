"""Public entry points: tensor-level ``rasterize`` and asset/camera-level ``render``."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch

from splatpainter.render.gsplat_backend import gsplat_available, rasterize_gsplat
from splatpainter.render.project import (
    EPS2D,
    FAR_PLANE,
    NEAR_PLANE,
    check_options,
    project_gaussians,
    sh_to_color,
)

if TYPE_CHECKING:
    from splatpainter.assets.gaussians import GaussianAsset
    from splatpainter.camera import Camera

BACKENDS = ("auto", "numba", "reference", "gsplat")


class RenderError(ValueError):
    """Invalid renderer input (shapes, camera, backend); the message names the problem."""


@dataclass
class RenderOutput:
    """Rendered images plus per-Gaussian screen-space extras (gsplat's render modes).

    - ``rgb`` [H,W,D]: the colour ("RGB"; D = 3, or the channel count of ``colors``);
    - ``alpha`` [H,W]: accumulated opacity, ``1 - T_final``;
    - ``depth`` [H,W]: *expected* depth ("ED") ``sum_i w_i z_i / alpha`` (0 where alpha is 0);
    - ``depth_accum`` [H,W]: accumulated depth ("D") ``sum_i w_i z_i``;

    with ``w_i`` the compositing weights and ``z_i`` view-space depth. With a batch of C
    cameras every field gains a leading [C] dimension.
    """

    rgb: torch.Tensor  # [H,W,D]
    alpha: torch.Tensor  # [H,W]
    depth: torch.Tensor  # [H,W]
    radii: torch.Tensor  # [N] int32, the larger per-axis radius (0 = culled)
    means2d: torch.Tensor  # [N,2] pixel coordinates
    depth_accum: torch.Tensor | None = None  # [H,W]
    radii_xy: torch.Tensor | None = None  # [N,2] int32 per-axis radii (x, y)

    @property
    def visible(self) -> torch.Tensor:
        """[N] bool: the Gaussian touches at least one tile of the image."""
        return self.radii > 0


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise RenderError(msg)


def _validate(
    means, quats, log_scales, opacity_logits, sh, colors, world_to_cam, K, width, height
) -> tuple[int, int]:
    """Checks shapes and values; returns (largest SH degree, number of cameras or 0)."""
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
        _check(
            isinstance(colors, torch.Tensor), f"colors must be a torch.Tensor, got {type(colors)}"
        )
        _check(
            colors.dim() == 2 and colors.shape[0] == n and colors.shape[1] >= 1,
            f"colors must be [{n},D] (D >= 1 channels), got {tuple(colors.shape)}",
        )
        deg = 0
    batched = world_to_cam.dim() == 3
    c = world_to_cam.shape[0] if batched else 0
    _check(
        world_to_cam.dim() in (2, 3) and tuple(world_to_cam.shape[-2:]) == (4, 4)
        and (c > 0 or not batched),
        f"world_to_cam must be [4,4] or [C,4,4] with C >= 1, got {tuple(world_to_cam.shape)}",
    )  # fmt: skip
    _check(
        tuple(K.shape) == (3, 3) or (batched and tuple(K.shape) == (c, 3, 3)),
        f"K must be [3,3]{f' or [{c},3,3]' if batched else ''}, got {tuple(K.shape)}",
    )
    _check(bool(torch.isfinite(K).all()), "K has non-finite entries")
    _check(bool(torch.isfinite(world_to_cam).all()), "world_to_cam has non-finite entries")
    focal = K.reshape(-1, 3, 3).diagonal(dim1=1, dim2=2)[:, :2]  # [C or 1, (fx, fy)]
    if not bool((focal > 0).all()):
        fx, fy = focal[:, 0].tolist(), focal[:, 1].tolist()
        raise RenderError(f"focal lengths must be positive, got fx={fx}, fy={fy}")
    for name, v in (("width", width), ("height", height)):
        _check(
            isinstance(v, int) and not isinstance(v, bool) and v > 0,
            f"{name} must be a positive int, got {v!r}",
        )
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
    return deg, c


def _background(background, channels: int, cams: int, like: torch.Tensor) -> torch.Tensor:
    """[D] (or [C,D] for a batch): None means black. Kept differentiable when it is a tensor."""
    if background is None:
        bg = torch.zeros(channels, dtype=like.dtype, device=like.device)
    else:
        bg = torch.as_tensor(background, dtype=like.dtype)
    shapes = [(channels,)] + ([(cams, channels)] if cams else [])
    _check(
        tuple(bg.shape) in shapes,
        f"background must have {channels} values (one per colour channel)"
        + (f" or shape [{cams},{channels}]" if cams else "")
        + f", got shape {tuple(bg.shape)}",
    )
    _check(bool(torch.isfinite(bg).all()), "background has non-finite values")
    return bg


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
    background: torch.Tensor | Sequence[float] | None = None,
    sh_degree: int | None = None,
    backend: str = "auto",
    colors: torch.Tensor | None = None,
    *,
    near_plane: float = NEAR_PLANE,
    far_plane: float = FAR_PLANE,
    eps2d: float = EPS2D,
    radius_clip: float = 0.0,
    rasterize_mode: str = "classic",
) -> RenderOutput:
    """Render Gaussians, differentiably w.r.t. every tensor input.

    ``sh`` is [N,K,3] coefficient-major (``sh[:,0]`` = DC); ``sh_degree`` (default: the
    largest the coefficients allow) selects how many bands are used. ``colors`` [N,D] (any
    number of channels, e.g. features) replaces SH evaluation entirely (used as given, not
    offset or clamped). ``background`` [D] (default black) shows through with weight
    ``T_final``. ``world_to_cam`` [4,4] or a batch [C,4,4] (``K`` [3,3] shared or [C,3,3],
    ``background`` [D] or [C,D]): a batch renders every camera and stacks the outputs.

    Options as gsplat's ``rasterization()``: Gaussians with view-space depth outside
    ``[near_plane, far_plane]`` are culled (defaults: INRIA's 0.2, gsplat's 1e10); ``eps2d``
    is the low-pass dilation (px^2) of the 2D covariance; Gaussians whose per-axis radii are
    both ``<= radius_clip`` px are culled; ``rasterize_mode="antialiased"`` scales opacity
    by ``sqrt(det(cov2d) / det(cov2d + eps2d))`` (Mip-Splatting). All rules: ``project.py``.

    Backends: "numba" (compiled CPU), "reference" (pure PyTorch), "gsplat" (CUDA + gsplat;
    differences in ``gsplat_backend``), "auto" (gsplat on CUDA when installed, else numba).
    """
    _check(backend in BACKENDS, f"unknown backend {backend!r}; choose one of {BACKENDS}")
    problem = check_options(near_plane, far_plane, eps2d, radius_clip, rasterize_mode)
    _check(problem is None, problem or "")
    max_deg, cams = _validate(
        means, quats, log_scales, opacity_logits, sh, colors, world_to_cam, K, width, height
    )
    channels = 3 if colors is None else int(colors.shape[1])
    bg = _background(background, channels, cams, means)
    if colors is None:
        if sh_degree is None:
            sh_degree = max_deg
        _check(
            isinstance(sh_degree, int) and 0 <= sh_degree <= max_deg,
            f"sh_degree must be an int in 0..{max_deg} for sh with {sh.shape[1]} coefficients, "
            f"got {sh_degree!r}",
        )
    opts = {
        "near_plane": float(near_plane),
        "far_plane": float(far_plane),
        "eps2d": float(eps2d),
        "radius_clip": float(radius_clip),
        "antialiased": rasterize_mode == "antialiased",
    }
    backend = _pick_backend(means, backend)
    gaussians = (means, quats, log_scales, opacity_logits, sh, colors)
    if backend == "gsplat":
        _check(gsplat_available(), "backend 'gsplat' needs CUDA and the gsplat package")
        _check(means.is_cuda, "backend 'gsplat' needs the Gaussians on a CUDA device")
        w2c_b = world_to_cam if cams else world_to_cam[None]
        k_b = K.expand(max(cams, 1), 3, 3) if K.dim() == 2 else K
        bg_b = bg.expand(max(cams, 1), channels) if bg.dim() == 1 else bg
        res = rasterize_gsplat(*gaussians, w2c_b, k_b, width, height, bg_b, sh_degree or 0, **opts)
        out = RenderOutput(*res)
        return out if cams else _unbatch(out)
    if not cams:
        return _render_one(gaussians, world_to_cam, K, width, height, bg, sh_degree, backend, opts)
    outs = [
        _render_one(
            gaussians,
            world_to_cam[i],
            K if K.dim() == 2 else K[i],
            width,
            height,
            bg if bg.dim() == 1 else bg[i],
            sh_degree,
            backend,
            opts,
        )
        for i in range(cams)
    ]
    return RenderOutput(
        **{f.name: torch.stack([getattr(o, f.name) for o in outs]) for f in fields(RenderOutput)}
    )


def _unbatch(out: RenderOutput) -> RenderOutput:
    return RenderOutput(**{f.name: getattr(out, f.name)[0] for f in fields(RenderOutput)})


def _render_one(
    gaussians, world_to_cam, K, width, height, bg, sh_degree, backend, opts, weights=None
):
    """One camera through the numba or the reference stages.  weights (a list; numba, no
    gradient): each Gaussian's compositing weight [N] is appended to it, from the render's
    own binning (`render_and_weights`)."""
    means, quats, log_scales, opacity_logits, sh, colors = gaussians
    w2c = world_to_cam.to(device=means.device, dtype=means.dtype)
    if backend == "numba":
        from splatpainter.render import numba_backend as nb

        project, shade, raster = nb.project_numba, nb.sh_to_color_numba, nb.rasterize_numba
    else:
        from splatpainter.render.reference import rasterize_reference as raster

        project, shade = project_gaussians, sh_to_color
    opacities = torch.sigmoid(opacity_logits)
    proj = project(
        means, quats, log_scales, w2c, K.to(means), width, height, opacities=opacities, **opts
    )
    if colors is None and backend == "numba":  # SH only where it will be composited
        colors = shade(means, sh, w2c, sh_degree, visible=proj.radii > 0)
    elif colors is None:
        colors = shade(means, sh, w2c, sh_degree)
    if proj.compensations is not None:
        opacities = opacities * proj.compensations.to(opacities)
    args = (proj.means2d, proj.conics, colors, opacities, proj.depths, proj.extents, width, height,
            bg.to(means.device))  # fmt: skip
    if weights is None:
        rgb, alpha, depth_sum = raster(*args)
    else:
        rgb, alpha, depth_sum, w = nb.rasterize_and_weights_numba(*args)
        weights.append(w.to(device=means.device, dtype=means.dtype))
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
        depth_accum=depth_sum,
        radii_xy=proj.extents.to(means.device),
    )


def _pick_backend(means: torch.Tensor, backend: str) -> str:
    """ "auto": gsplat for CUDA tensors where it is installed, else numba."""
    if backend == "auto":
        return "gsplat" if means.is_cuda and gsplat_available() else "numba"
    return backend


def _numba_projection(a: GaussianAsset, camera: Camera):
    """(projection, opacities) of a detached asset on the numba backend, the inputs checked
    first: what a render's compositing passes share (`ColorRender`, `splat_sums`)."""
    from splatpainter.render import numba_backend as nb

    w, h = int(camera.width), int(camera.height)
    _validate(
        a.means, a.quats, a.log_scales, a.opacity_logits, a.sh, None, camera.world_to_cam,
        camera.K(), w, h,
    )  # fmt: skip
    w2c = camera.world_to_cam.to(device=a.means.device, dtype=a.means.dtype)
    with torch.no_grad():
        opacities = torch.sigmoid(a.opacity_logits)
        proj = nb.project_numba(
            a.means, a.quats, a.log_scales, w2c, camera.K().to(a.means), w, h, opacities=opacities
        )
    return proj, opacities


def render(
    asset: GaussianAsset,
    camera: Camera,
    *,
    background: torch.Tensor | Sequence[float] | None = None,
    sh_degree: int | None = None,
    backend: str = "auto",
    colors: torch.Tensor | None = None,
    near_plane: float = NEAR_PLANE,
    far_plane: float = FAR_PLANE,
    eps2d: float = EPS2D,
    radius_clip: float = 0.0,
    rasterize_mode: str = "classic",
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
        near_plane=near_plane,
        far_plane=far_plane,
        eps2d=eps2d,
        radius_clip=radius_clip,
        rasterize_mode=rasterize_mode,
    )


class ColorRender:
    """Renders of one asset's geometry from one camera in colours that change between calls
    (the least-squares solve's steps): the projection and tile binning are done once, each
    call composites the given colours.  ``self(colors [N, 3]) -> rgb [H, W, 3]`` on a black
    background, differentiable in the colours, the same bits as ``render(asset, camera,
    colors=colors).rgb``.  On other backends than numba each call is that render."""

    def __init__(self, asset: GaussianAsset, camera: Camera, *, backend: str = "auto") -> None:
        a = asset.detach()
        backend = _pick_backend(a.means, backend)
        self.asset, self.camera, self.backend = a, camera, backend
        self._staged = None
        if backend != "numba":
            return
        from splatpainter.render import numba_backend as nb

        proj, opacities = _numba_projection(a, camera)
        w, h = int(camera.width), int(camera.height)
        bins = nb.bin_tiles(proj.means2d, proj.extents, proj.depths, w, h)
        self._staged = (proj, opacities, bins, _background(None, 3, 0, a.means))

    def __call__(self, colors: torch.Tensor) -> torch.Tensor:
        if self._staged is None:
            return render(self.asset, self.camera, colors=colors, backend=self.backend).rgb
        from splatpainter.render import numba_backend as nb

        _check(
            isinstance(colors, torch.Tensor)
            and tuple(colors.shape) == (self.asset.num_gaussians, 3),
            f"colors must be [{self.asset.num_gaussians}, 3], got "
            f"{tuple(getattr(colors, 'shape', ()))}",
        )
        proj, opacities, bins, bg = self._staged
        w, h = int(self.camera.width), int(self.camera.height)
        rgb, _, _ = nb.rasterize_numba(
            proj.means2d, proj.conics, colors, opacities, proj.depths, proj.extents, w, h, bg,
            bins=bins,
        )  # fmt: skip
        return rgb.to(device=self.asset.means.device, dtype=self.asset.means.dtype)


@dataclass
class CompositingWeights:
    """A render's linear map from per-Gaussian colours to pixels (rgb = A c + T bg, the
    geometry fixed) as its non-zero entries w_gp = alpha_gp T_gp, each pixel's front to back:
    ``apply`` (A c) and ``adjoint`` (A^T t) are then a gather and a scatter over the entries,
    not a compositing pass each (the least-squares solve's steps)."""

    pixel: torch.Tensor  # [E] int64: y * width + x
    gaussian: torch.Tensor  # [E] int64
    weight: torch.Tensor  # [E]
    height: int
    width: int
    num_gaussians: int

    def apply(self, colors: torch.Tensor) -> torch.Tensor:
        """A c: [H, W, C] of per-Gaussian values c [num_gaussians, C] (a black background)."""
        out = colors.new_zeros(self.height * self.width, colors.shape[1])
        out.index_add_(0, self.pixel, self.weight[:, None].to(colors) * colors[self.gaussian])
        return out.view(self.height, self.width, -1)

    def adjoint(self, image: torch.Tensor) -> torch.Tensor:
        """A^T t: [num_gaussians, C] of per-pixel values t [H, W, C]."""
        flat = image.reshape(self.height * self.width, -1)
        out = image.new_zeros(self.num_gaussians, flat.shape[1])
        out.index_add_(0, self.gaussian, self.weight[:, None].to(image) * flat[self.pixel])
        return out

    def matrix(self, dtype: torch.dtype, *, transpose: bool = False) -> torch.Tensor:
        """A [H W, num_gaussians] (or A^T) as a sparse row-major matrix, for repeated products:
        each is then one sparse product instead of `apply`'s gather and scatter."""
        hw = self.height * self.width
        rows, cols = (self.gaussian, self.pixel) if transpose else (self.pixel, self.gaussian)
        shape = (self.num_gaussians, hw) if transpose else (hw, self.num_gaussians)
        order = torch.argsort(rows, stable=True)
        crow = torch.zeros(shape[0] + 1, dtype=torch.int64, device=rows.device)
        crow[1:] = torch.cumsum(torch.bincount(rows, minlength=shape[0]), 0)
        with warnings.catch_warnings():  # (CSR support is marked beta)
            warnings.simplefilter("ignore", UserWarning)
            return torch.sparse_csr_tensor(
                crow, cols[order], self.weight[order].to(dtype), shape, check_invariants=False
            )

    def residual_step(self, target: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """x -> A^T (A x - t) for t [H, W, C], for repeated calls (a least-squares solve's
        steps): two sparse products (`matrix`) instead of `apply` and `adjoint`'s gathers and
        scatters."""
        if self.pixel.numel() == 0:
            return lambda x: torch.zeros_like(x)
        t = target.reshape(self.height * self.width, -1)
        a = self.matrix(target.dtype)
        a_t = self.matrix(target.dtype, transpose=True)
        return lambda x: a_t @ (a @ x - t)

    def remapped(self, index: torch.Tensor, size: int) -> CompositingWeights:
        """The entries of the Gaussians g with index[g] >= 0, renumbered index[g] of `size`."""
        new = index[self.gaussian]
        keep = new >= 0
        return CompositingWeights(
            self.pixel[keep], new[keep], self.weight[keep], self.height, self.width, size
        )


# Entries above which `compositing_weights` declines (20 bytes each, more with their copies):
# a whole 512x512 view of a dense capture would hold tens of millions.
MAX_COMPOSITING_ENTRIES = 1 << 24


def compositing_weights(
    asset: GaussianAsset, camera: Camera, *, limit: int = MAX_COMPOSITING_ENTRIES
) -> CompositingWeights | None:
    """The render's compositing weights as a `CompositingWeights` (numba backend: the same
    rules and bits as its raster); None on another backend or above `limit` entries."""
    a = asset.detach()
    if _pick_backend(a.means, "auto") != "numba":
        return None
    from splatpainter.render import numba_backend as nb

    proj, opacities = _numba_projection(a, camera)
    w, h = int(camera.width), int(camera.height)
    found = nb.splat_entries_numba(
        proj.means2d, proj.conics, opacities, proj.depths, proj.extents, w, h, limit
    )
    if found is None:
        return None
    pix, gauss, weight = (t.to(a.means.device) for t in found)
    return CompositingWeights(pix, gauss, weight.to(a.means.dtype), h, w, a.num_gaussians)


def splat_weights(
    asset: GaussianAsset,
    camera: Camera,
    pixel_weights: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Per-Gaussian compositing weight ``sum_p m_p w_gp`` [N] (m = pixel_weights [H,W] or 1):
    the sum of the Gaussian's alpha-blending weights over the (weighted) pixels."""
    h, w = int(camera.height), int(camera.width)
    if pixel_weights is None:
        m = asset.means.new_ones(h, w)
    else:
        m = pixel_weights
        _check(
            isinstance(m, torch.Tensor) and tuple(m.shape) == (h, w),
            f"pixel_weights must be [{h},{w}], got {tuple(getattr(m, 'shape', ()))}",
        )
    return splat_sums(asset, camera, m[..., None], backend=backend)[:, 0]


def splat_sums(
    asset: GaussianAsset,
    camera: Camera,
    targets: torch.Tensor,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Per-Gaussian sums ``sum_p w_gp targets[p]`` [N, C] of per-pixel values targets [H,W,C]
    under the asset's compositing weights w (occlusion and opacity included): the gradient of
    ``sum_p <rgb_p, targets_p>`` with respect to a colour override.  The numba backend gets
    all C channels from one forward-like pass (`_kernels_lanes.raster_sums`); the others
    differentiate a render."""
    a = asset.detach()
    backend = _pick_backend(a.means, backend)
    _check(backend in BACKENDS, f"unknown backend {backend!r}; choose one of {BACKENDS}")
    h, w = int(camera.height), int(camera.width)
    _check(
        isinstance(targets, torch.Tensor) and targets.dim() == 3 and targets.shape[:2] == (h, w),
        f"targets must be [{h},{w},C], got {tuple(getattr(targets, 'shape', ()))}",
    )
    if backend != "numba":
        colors = a.means.new_zeros(a.num_gaussians, targets.shape[2]).requires_grad_(True)
        with torch.enable_grad():
            out = render(a, camera, backend=backend, colors=colors)
            (grad,) = torch.autograd.grad((out.rgb * targets.to(out.rgb)).sum(), colors)
        return grad
    from splatpainter.render import numba_backend as nb

    proj, opacities = _numba_projection(a, camera)
    sums = nb.splat_sums_numba(
        proj.means2d, proj.conics, opacities, proj.depths, proj.extents, w, h, targets
    )
    return sums.to(device=a.means.device, dtype=a.means.dtype)


def footprint_box(
    asset: GaussianAsset, camera: Camera, *, margin: int = 1
) -> tuple[int, int, int, int] | None:
    """(x0, y0, x1, y1), inclusive: a pixel box holding every pixel where some Gaussian of
    `asset` is drawn (its opacity-aware box, the projection rules every backend shares),
    widened by `margin` pixels against rounding and clipped to the image; None when no
    Gaussian is drawn.  A render or sums pass of `camera.cropped` to it then sees all of them."""
    a = asset.detach()
    w, h = int(camera.width), int(camera.height)
    if a.num_gaussians == 0:
        return None
    with torch.no_grad():
        p = project_gaussians(
            a.means, a.quats, a.log_scales, camera.world_to_cam.to(a.means), camera.K().to(a.means),
            w, h, opacities=torch.sigmoid(a.opacity_logits),
        )  # fmt: skip
        drawn = p.radii > 0
        if not bool(drawn.any()):
            return None
        m = p.means2d[drawn].to(torch.float64)
        ext = p.extents[drawn].to(torch.float64)
        lo = torch.floor(m - ext).min(0).values - margin
        hi = torch.ceil(m + ext).max(0).values + margin
    x0, y0 = max(0, int(lo[0])), max(0, int(lo[1]))
    x1, y1 = min(w - 1, int(hi[0])), min(h - 1, int(hi[1]))
    if x0 > x1 or y0 > y1:
        return None
    return x0, y0, x1, y1


def render_and_weights(
    asset: GaussianAsset, camera: Camera, *, backend: str = "auto"
) -> tuple[RenderOutput, torch.Tensor]:
    """``(render(asset, camera), splat_weights(asset, camera))`` bit for bit, without
    gradients; on the numba backend from one projection and one binning, so that Stage I's
    preprocessing views at 1M Gaussians pay for those once, not twice."""
    a = asset.detach()
    backend = _pick_backend(a.means, backend)
    if backend != "numba":
        with torch.no_grad():
            out = render(a, camera, backend=backend)
        return out, splat_weights(a, camera, backend=backend)
    max_deg, _ = _validate(
        a.means, a.quats, a.log_scales, a.opacity_logits, a.sh, None, camera.world_to_cam,
        camera.K(), int(camera.width), int(camera.height),
    )  # fmt: skip
    opts = {
        "near_plane": float(NEAR_PLANE),
        "far_plane": float(FAR_PLANE),
        "eps2d": float(EPS2D),
        "radius_clip": 0.0,
        "antialiased": False,
    }
    gaussians = (a.means, a.quats, a.log_scales, a.opacity_logits, a.sh, None)
    weights: list[torch.Tensor] = []
    with torch.no_grad():
        out = _render_one(
            gaussians, camera.world_to_cam, camera.K(), int(camera.width), int(camera.height),
            _background(None, 3, 0, a.means), max_deg, backend, opts, weights,
        )  # fmt: skip
    return out, weights[0]
