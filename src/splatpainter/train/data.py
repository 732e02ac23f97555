"""Edit data with 3D ground truth: random procedural assets and edits defined in 3D.

Every edit is a change of each Gaussian's base colour (SH DC) computed from the asset's 3D
surface (points, normals, primitive ids), so every view of the ground truth is consistent and the
Gaussians an edit changes are known exactly, including those that no edit view sees.  An edit
sequence is deterministic in its seed:

    seq = make_sequence(seed, SequenceSpec(...))
    seq.source                 # the input asset (GaussianAsset)
    seq.steps[k].colors        # ground-truth base colours after edit k (cumulative) [N, 3]
    seq.steps[k].views         # 1-3 EditViews: 8-bit renders of the ground truth
    seq.heldout                # cameras that are never edit inputs

Edit kinds (`KINDS`): paint (a ball, surface patch or stroke takes a colour or a texture, projected
from the first edit camera with a depth test), recolor (one primitive: HSV change or 3x3 colour
transform), global (3x3 colour transform of everything), relight (albedo x (ambient + diffuse
max(0, n.l))) and detail (the input asset's texture is low-passed over neighbours; the edit puts
the high frequencies back in a region).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from splatpainter.assets.gaussians import (
    GaussianAsset,
    rgb_to_sh_dc,
    sh_coeff_count,
    sh_dc_to_rgb,
)
from splatpainter.assets.procedural import ProceduralAsset, build_asset, random_primitives
from splatpainter.camera import Camera, orbit_cameras
from splatpainter.edit.views import EditView

KINDS = ("paint", "recolor", "global", "relight", "detail")
# The model's kind hint (one of stage2.EDIT_HINTS) for each kind: recolor covers a part and the
# whole asset alike.
HINT_OF_KIND = {"paint": "paint", "recolor": "recolor", "global": "recolor",
                "relight": "relight", "detail": "detail"}  # fmt: skip


class EditDataError(ValueError):
    """An edit that cannot be made for this asset (e.g. relight without normals)."""


@dataclass(frozen=True)
class SequenceSpec:
    """What to generate: sizes, how many edits, which kinds, how fuzzy the asset is."""

    min_gaussians: int = 3000
    max_gaussians: int = 8000
    min_edits: int = 1
    max_edits: int = 3
    kinds: tuple[str, ...] = KINDS
    first_kind: str | None = None  # force the kind of the first edit (evaluation per kind)
    max_views: int = 3
    view_size: int = 64
    num_heldout: int = 4
    fuzzy_prob: float = 0.5  # probability of INRIA-like augmentation (SH 3, jitter, opacity)
    overlap_prob: float = 0.3  # a paint lands near the previous paint

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in KINDS]
        if bad or (self.first_kind is not None and self.first_kind not in KINDS):
            raise EditDataError(f"unknown edit kind(s) {bad or [self.first_kind]}; use {KINDS}")
        if not 1 <= self.min_edits <= self.max_edits:
            raise EditDataError("need 1 <= min_edits <= max_edits")
        if not 1000 <= self.min_gaussians <= self.max_gaussians:
            raise EditDataError("need 1000 <= min_gaussians <= max_gaussians")


@dataclass
class EditStep:
    """One edit: its kind, the ground truth after it, and what the user gives the editor."""

    kind: str
    colors: torch.Tensor  # [N, 3] ground-truth base colours after this edit (cumulative)
    changed: torch.Tensor  # [N] bool: Gaussians whose colour this edit changed
    views: list[EditView]
    renders: list[torch.Tensor] = field(default_factory=list)  # float GT renders, pre-quantise


@dataclass
class EditSequence:
    seed: int
    source: GaussianAsset  # input asset (colours = source_colors)
    source_colors: torch.Tensor  # [N, 3]
    normals: torch.Tensor  # [N, 3] surface normals (ground-truth geometry, for relight)
    primitive_id: torch.Tensor  # [N]
    steps: list[EditStep]
    heldout: list[Camera]

    def asset_at(self, k: int) -> GaussianAsset:
        """Ground-truth asset after edit k (k = -1: the source)."""
        return self.source if k < 0 else with_base_colors(self.source, self.steps[k].colors)


# ------------------------------------------------------------------------ colours
def base_colors(asset: GaussianAsset) -> torch.Tensor:
    return sh_dc_to_rgb(asset.sh[:, 0, :], clamp=False)


def with_base_colors(asset: GaussianAsset, colors: torch.Tensor) -> GaussianAsset:
    """The asset with SH DC set to `colors` (higher bands, geometry kept bit-exact)."""
    sh = asset.sh.clone()
    sh[:, 0, :] = rgb_to_sh_dc(colors.to(sh))
    return asset.replace(sh=sh)


def rgb_to_hsv(c: torch.Tensor) -> torch.Tensor:
    r, g, b = c.unbind(-1)
    mx, mn = c.max(-1).values, c.min(-1).values
    d = mx - mn
    safe = torch.where(d > 0, d, torch.ones_like(d))
    h = torch.where(
        mx == r, ((g - b) / safe) % 6, torch.where(mx == g, (b - r) / safe + 2, (r - g) / safe + 4)
    )
    h = torch.where(d > 0, h / 6.0, torch.zeros_like(h))
    s = torch.where(mx > 0, d / torch.where(mx > 0, mx, torch.ones_like(mx)), torch.zeros_like(mx))
    return torch.stack([h, s, mx], -1)


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    h, s, v = hsv.unbind(-1)
    k = lambda n: (n + h * 6) % 6  # noqa: E731
    f = lambda n: v - v * s * torch.clamp(torch.minimum(k(n), 4 - k(n)), 0, 1)  # noqa: E731
    return torch.stack([f(5), f(3), f(1)], -1)


def random_color_transform(gen: torch.Generator) -> tuple[str, torch.Tensor]:
    """('hsv', [dh, s_scale, v_scale]) or ('matrix', [3, 4] affine) drawn at random."""
    u = torch.rand(4, generator=gen, dtype=torch.float64)
    if u[0] < 0.5:
        return "hsv", torch.tensor(
            [float(u[1]) - 0.5, 0.4 + 1.2 * float(u[2]), 0.7 + 0.6 * float(u[3])]
        )
    m = torch.eye(3, dtype=torch.float64) + 0.4 * torch.randn(
        3, 3, generator=gen, dtype=torch.float64
    )
    b = 0.1 * torch.randn(3, 1, generator=gen, dtype=torch.float64)
    return "matrix", torch.cat([m, b], 1).float()


def apply_color_transform(colors: torch.Tensor, kind: str, params: torch.Tensor) -> torch.Tensor:
    if kind == "hsv":
        hsv = rgb_to_hsv(colors)
        h = (hsv[:, 0] + params[0]) % 1.0
        s = (hsv[:, 1] * params[1]).clamp(0, 1)
        v = (hsv[:, 2] * params[2]).clamp(0, 1)
        return hsv_to_rgb(torch.stack([h, s, v], -1)).clamp(0, 1)
    p = params.to(colors)
    return (colors @ p[:, :3].T + p[:, 3]).clamp(0, 1)


def low_pass(points: torch.Tensor, colors: torch.Tensor, k: int = 16) -> torch.Tensor:
    """Mean colour over each Gaussian's k nearest neighbours (itself included)."""
    out = torch.empty_like(colors)
    for i in range(0, points.shape[0], 2048):
        d = torch.cdist(points[i : i + 2048], points)
        idx = d.topk(min(k, points.shape[0]), largest=False).indices
        out[i : i + 2048] = colors[idx].mean(1)
    return out


# ------------------------------------------------------------------------ assets
def fuzz_asset(asset: GaussianAsset, gen: torch.Generator, strength: float = 1.0) -> GaussianAsset:
    """Push a clean procedural asset toward trained INRIA scenes: SH degree 3 with random view
    dependence, jittered anisotropic scales, lowered opacities (geometry stays near the surface)."""
    n = asset.num_gaussians
    s = float(strength)
    jitter = s * 0.35 * torch.randn(n, 3, generator=gen)
    log_scales = asset.log_scales + jitter + s * 0.25
    op = asset.opacity_logits - s * 2.5 * torch.rand(n, generator=gen)
    sh = torch.zeros(n, sh_coeff_count(3), 3)
    sh[:, 0] = asset.sh[:, 0]
    amp = s * 0.15 * torch.rand(n, 1, 1, generator=gen)
    sh[:, 1:] = amp * torch.randn(n, sh.shape[1] - 1, 3, generator=gen)
    return asset.replace(log_scales=log_scales, opacity_logits=op, sh=sh)


def random_asset(seed: int, n: int, *, fuzzy: bool) -> tuple[ProceduralAsset, GaussianAsset]:
    pa = build_asset(random_primitives(seed), n, seed=seed)
    asset = pa.asset
    if fuzzy:
        asset = fuzz_asset(asset, torch.Generator().manual_seed(seed + 7919))
    return pa, asset


def view_camera(asset: GaussianAsset, azimuth: float, elevation: float, size: int) -> Camera:
    el = max(-80.0, min(80.0, elevation))
    return orbit_cameras(
        asset, 1, width=size, height=size, elevation_deg=el, azimuth_start_deg=azimuth
    )[0]


def heldout_cameras(
    asset: GaussianAsset, edit_azimuth: float, n: int, size: int, gen: torch.Generator
) -> list[Camera]:
    """The back of the first edit view, one from below, the rest at random (never edit inputs)."""
    cams = [view_camera(asset, edit_azimuth + 180.0, 20.0, size)]
    if n > 1:
        cams.append(view_camera(asset, edit_azimuth + 90.0, -60.0, size))
    for _ in range(max(0, n - 2)):
        u = torch.rand(2, generator=gen).tolist()
        cams.append(view_camera(asset, 360.0 * u[0], -40.0 + 110.0 * u[1], size))
    return cams[:n]


# ------------------------------------------------------------------------ edits
def _visible(asset: GaussianAsset, cam: Camera, min_weight: float = 0.05) -> torch.Tensor:
    from splatpainter.render import splat_weights

    return splat_weights(asset, cam) >= min_weight


def _pick(mask: torch.Tensor, gen: torch.Generator) -> int:
    idx = mask.nonzero().flatten()
    if idx.numel() == 0:
        idx = torch.arange(mask.shape[0])
    return int(idx[int(torch.randint(idx.numel(), (1,), generator=gen))])


def _rand_color(gen: torch.Generator) -> torch.Tensor:
    return torch.rand(3, generator=gen)


def paint_edit(
    colors: torch.Tensor,
    points: torch.Tensor,
    normals: torch.Tensor,
    visible: torch.Tensor,
    gen: torch.Generator,
    near: int | None = None,
) -> torch.Tensor:
    """Paint a ball, patch or stroke on the visible surface; returns the new colours."""
    seed = near if near is not None else _pick(visible, gen)
    p0, n0 = points[seed], normals[seed]
    shape = ("ball", "patch", "stroke")[int(torch.randint(3, (1,), generator=gen))]
    if shape == "stroke":
        tangent = torch.linalg.cross(n0, torch.randn(3, generator=gen))
        tangent = tangent / tangent.norm().clamp_min(1e-6)
        r = 0.02 + 0.03 * float(torch.rand(1, generator=gen))
        region = torch.zeros(points.shape[0], dtype=torch.bool)
        c = p0
        for _ in range(int(torch.randint(3, 7, (1,), generator=gen))):
            region |= (points - c).norm(dim=-1) < r
            nxt = c + 1.5 * r * tangent
            c = points[(points - nxt).norm(dim=-1).argmin()]
    else:
        r = 0.04 + 0.08 * float(torch.rand(1, generator=gen))
        region = (points - p0).norm(dim=-1) < r
        if shape == "patch":
            region &= normals @ n0 > 0.7
    region &= visible  # projected from the edit camera with a depth test
    if float(torch.rand(1, generator=gen)) < 0.6:
        paint = _rand_color(gen).expand_as(colors)
    else:  # a two-colour decal texture in 3D
        a, b = _rand_color(gen), _rand_color(gen)
        f = 10.0 + 20.0 * float(torch.rand(1, generator=gen))
        t = (torch.floor(points * f).long().sum(-1) % 2).float()[:, None]
        paint = (1 - t) * a + t * b
    return torch.where(region[:, None], paint, colors)


def make_edit(
    kind: str,
    colors: torch.Tensor,
    seq_info: dict,
    visible: torch.Tensor,
    gen: torch.Generator,
    near: int | None = None,
) -> torch.Tensor:
    """New colours [N, 3] for one edit of `kind` applied to `colors`."""
    points, normals, pid = seq_info["points"], seq_info["normals"], seq_info["primitive_id"]
    if kind == "paint":
        return paint_edit(colors, points, normals, visible, gen, near)
    if kind in ("recolor", "global"):
        for _ in range(8):  # redraw transforms that barely change anything
            tk, params = random_color_transform(gen)
            if kind == "recolor":
                part = int(pid[_pick(visible, gen)])
                sel = pid == part
            else:
                sel = torch.ones_like(pid, dtype=torch.bool)
            new = apply_color_transform(colors[sel], tk, params)
            if float((new - colors[sel]).abs().mean()) > 0.06:
                break
        out = colors.clone()
        out[sel] = new
        return out
    if kind == "relight":
        if normals is None:
            raise EditDataError("relight needs surface normals; this asset has none")
        light = torch.randn(3, generator=gen)
        light = light / light.norm()
        ambient = 0.2 + 0.35 * float(torch.rand(1, generator=gen))
        diffuse = (0.9 + 0.5 * float(torch.rand(1, generator=gen))) - ambient
        shade = ambient + diffuse * (normals @ light).clamp_min(0)
        return (colors * shade[:, None]).clamp(0, 1)
    if kind == "detail":
        sharp, blurred = seq_info.get("sharp"), seq_info.get("blurred")
        if sharp is None:
            raise EditDataError("detail needs a low-passed source asset (sequence without it)")
        seed = _pick(visible, gen)
        r = 0.1 + 0.15 * float(torch.rand(1, generator=gen))
        region = (points - points[seed]).norm(dim=-1) < r
        return torch.where(region[:, None], (colors + sharp - blurred).clamp(0, 1), colors)
    raise EditDataError(f"unknown edit kind {kind!r}; use one of {KINDS}")


def quantize(img: torch.Tensor) -> torch.Tensor:
    """8-bit round trip, as a PNG the user painted would have."""
    return torch.round(img.clamp(0, 1) * 255.0) / 255.0


def make_sequence(seed: int, spec: SequenceSpec | None = None) -> EditSequence:
    """A random asset and a sequence of 3D edits, all determined by `seed`."""
    from splatpainter.render import render

    spec = spec or SequenceSpec()
    gen = torch.Generator().manual_seed(int(seed) * 1_000_003 + 17)
    u = torch.rand(3, generator=gen).tolist()
    n = spec.min_gaussians + int(u[0] * (spec.max_gaussians - spec.min_gaussians + 1))
    n = min(n, spec.max_gaussians)
    fuzzy = u[1] < spec.fuzzy_prob
    num_edits = spec.min_edits + int(
        torch.randint(spec.max_edits - spec.min_edits + 1, (1,), generator=gen)
    )
    kinds = [spec.kinds[int(torch.randint(len(spec.kinds), (1,), generator=gen))]
             for _ in range(num_edits)]  # fmt: skip
    if spec.first_kind is not None:
        kinds[0] = spec.first_kind
    needs_detail = "detail" in kinds
    pa, asset = random_asset(int(seed), n, fuzzy=fuzzy)
    sharp = pa.base_colors.float()
    info = {"points": pa.points, "normals": pa.normals, "primitive_id": pa.primitive_id}
    colors = sharp
    if needs_detail:
        blurred = low_pass(pa.points, sharp)
        info.update(sharp=sharp, blurred=blurred)
        colors = blurred
    source = with_base_colors(asset, colors)
    steps: list[EditStep] = []
    first_az = 360.0 * float(torch.rand(1, generator=gen))
    last_paint: int | None = None
    for i, kind in enumerate(kinds):
        az = first_az if i == 0 else 360.0 * float(torch.rand(1, generator=gen))
        el = -20.0 + 80.0 * float(torch.rand(1, generator=gen))
        nv = 1 + int(torch.randint(spec.max_views, (1,), generator=gen))
        cams = [view_camera(source, az, el, spec.view_size)]
        for _ in range(nv - 1):
            d = torch.rand(2, generator=gen).tolist()
            cams.append(
                view_camera(
                    source, az + 120.0 * (d[0] - 0.5), el + 40.0 * (d[1] - 0.5), spec.view_size
                )
            )
        current = with_base_colors(asset, colors)
        visible = _visible(current, cams[0])
        near = None
        if kind == "paint" and last_paint is not None and u[2] < spec.overlap_prob:
            close = (pa.points - pa.points[last_paint]).norm(dim=-1) < 0.08
            if bool((close & visible).any()):
                near = _pick(close & visible, gen)
        for _ in range(6):  # redraw edits that change (almost) nothing
            new = make_edit(kind, colors, info, visible, gen, near)
            if int(((new - colors).abs().amax(-1) > 4.0 / 255.0).sum()) >= 10:
                break
            near = None
        if kind == "paint":
            changed_now = (new - colors).abs().amax(-1) > 0
            last_paint = _pick(changed_now, gen) if bool(changed_now.any()) else None
        gt = with_base_colors(asset, new)
        views, renders = [], []
        for j, cam in enumerate(cams):
            with torch.no_grad():
                img = render(gt, cam).rgb
            renders.append(img)
            views.append(EditView(cam, quantize(img), None, f"edit{i}_view{j}"))
        changed = (new - colors).abs().amax(-1) > 1.0 / 255.0
        steps.append(EditStep(kind, new, changed, views, renders))
        colors = new
    held = heldout_cameras(source, first_az, spec.num_heldout, spec.view_size, gen)
    return EditSequence(
        int(seed), source, base_colors(source), pa.normals, pa.primitive_id, steps, held
    )
