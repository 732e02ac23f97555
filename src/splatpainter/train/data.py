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
transform; in the distractor suite often only the part's share inside a ball or half-space),
global (colour transform of everything), relight (albedo x (ambient + diffuse max(0, n.l))) and
detail (the input asset's texture is low-passed over neighbours; the edit puts the high
frequencies back in a region). Not trained on (`EXTRA_KINDS`): brush (a square dab across parts
on the edit view, the stroke a user paints).

Suites (`SUITES`, `SequenceSpec.suite`, scenes in train/scenes.py): procedural (one object, a
palette colour per part: colour similarity finds the edited part), distractor (objects with an
identical twin, colours shared across parts, multi-colour textures, partial-part recolours: colour
misleads) and capture (INRIA-like fuzzy Gaussians with view-dependent SH and floaters).

View-dependent colour follows every edit: an edit also gives a per-Gaussian linear colour map
`rest_map` [N, 3, 3] applied to every SH band >= 1 (`edit_sh`), so highlights take the new colour.
`EditStep.bleed` marks unchanged Gaussians at risk of wrongly taking an edit (`bleed_mask`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from splatpainter.assets.gaussians import (
    GaussianAsset,
    map_sh_bands,
    rgb_to_sh_dc,
    sh_dc_to_rgb,
)
from splatpainter.camera import Camera, orbit_cameras
from splatpainter.edit.views import EditView
from splatpainter.train.scenes import (
    SUITES,
    Scene,
    build_scene,
    fuzz_asset,  # noqa: F401 - re-exported (it lived here)
    random_asset,  # noqa: F401 - re-exported
)

KINDS = ("paint", "recolor", "global", "relight", "detail")
# Kinds the shipped editor was not trained on, which a sequence may still hold: "brush", a
# square dab across parts on the edit view (`brush_edit`), the stroke users paint.
EXTRA_KINDS = ("brush",)
ALL_KINDS = (*KINDS, *EXTRA_KINDS)
BRUSH_SIDES = (0.12, 0.35)  # a brush square's side, of the view's width
# The model's kind hint (one of stage2.EDIT_HINTS) for each kind: recolor covers a part and the
# whole asset alike.
HINT_OF_KIND = {"paint": "paint", "recolor": "recolor", "global": "recolor",
                "relight": "relight", "detail": "detail", "brush": "paint"}  # fmt: skip


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
    suite: str = "procedural"  # which scenes: one of SUITES
    partial_prob: float = 0.5  # distractor: a recolour stops inside its part (ball/half-space)

    def __post_init__(self) -> None:
        if self.suite not in SUITES:
            raise EditDataError(f"unknown suite {self.suite!r}; use one of {SUITES}")
        if not 0.0 <= self.partial_prob <= 1.0:
            raise EditDataError("need 0 <= partial_prob <= 1")
        bad = [k for k in self.kinds if k not in ALL_KINDS]
        if bad or (self.first_kind is not None and self.first_kind not in ALL_KINDS):
            raise EditDataError(f"unknown edit kind(s) {bad or [self.first_kind]}; use {ALL_KINDS}")
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
    sh: torch.Tensor  # [N, K, 3] ground-truth SH after this edit (cumulative; DC from colors)
    rest_map: torch.Tensor  # [N, 3, 3] this edit's colour map of SH bands >= 1 (see edit_sh)
    bleed: torch.Tensor  # [N] bool: unchanged Gaussians at risk of wrongly taking it (bleed_mask)
    renders: list[torch.Tensor] = field(default_factory=list)  # float GT renders, pre-quantise


@dataclass
class EditSequence:
    seed: int
    source: GaussianAsset  # input asset (colours = source_colors)
    source_colors: torch.Tensor  # [N, 3]
    normals: torch.Tensor  # [N, 3] surface normals (ground-truth geometry, for relight)
    primitive_id: torch.Tensor  # [N] part (unique across objects); floaters -1
    steps: list[EditStep]
    heldout: list[Camera]
    instance_id: torch.Tensor  # [N] int64 object instance (procedural: all 0); floaters -1
    twin_index: torch.Tensor  # [N] int64 the same Gaussian in an identical twin object, or -1
    points: torch.Tensor  # [N, 3] surface points edits are defined on (capture: means differ)
    suite: str = "procedural"

    def asset_at(self, k: int) -> GaussianAsset:
        """Ground-truth asset after edit k (k = -1: the source), higher SH bands edited too."""
        return self.source if k < 0 else self.source.replace(sh=self.steps[k].sh)


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


def color_transform_map(colors: torch.Tensor, kind: str, params: torch.Tensor) -> torch.Tensor:
    """Linear part [n, 3, 3] of `apply_color_transform` at each colour (out x in): the matrix M
    itself, or for HSV the Jacobian by central differences (clamped against hue singularities).
    View-dependent SH bands are small deviations around the colour, so they map by it."""
    n = colors.shape[0]
    if kind != "hsv":
        return params[:, :3].to(colors).expand(n, 3, 3).clone()
    c = colors.double()
    eps = 1e-3
    cols = []
    for j in range(3):
        e = torch.zeros(3, dtype=c.dtype)
        e[j] = eps
        hi = apply_color_transform(c + e, kind, params.double())
        lo = apply_color_transform(c - e, kind, params.double())
        cols.append((hi - lo) / (2 * eps))
    return torch.stack(cols, -1).clamp(-3.0, 3.0).to(colors)


def identity_maps(n: int) -> torch.Tensor:
    return torch.eye(3).expand(n, 3, 3).clone()


def edit_sh(sh: torch.Tensor, colors: torch.Tensor, rest_map: torch.Tensor) -> torch.Tensor:
    """SH after an edit: DC from the new base colours [N, 3], every higher band mapped by the
    per-Gaussian colour map [N, 3, 3] (rest'[n, k] = rest_map[n] @ rest[n, k], the convention of
    edit.methods.apply_color_delta).  Bands of identity-mapped Gaussians keep their bits."""
    out = sh.clone()
    out[:, 0, :] = rgb_to_sh_dc(colors.to(sh))
    if sh.shape[1] > 1:
        eye = torch.eye(3, dtype=rest_map.dtype)
        moved = (rest_map != eye).flatten(1).any(-1)
        if bool(moved.any()):
            m = rest_map[moved].to(sh)
            out[moved, 1:, :] = map_sh_bands(sh[moved, 1:, :], m)
    return out


BLEED_BINS = 6  # RGB grid for the colours an edit touched
BLEED_SHARE = 0.05  # a bin is one of the edit's colours when it holds this share of the changed
BLEED_RADIUS = 0.1  # RGB distance to such a colour (bin mean) that counts as "the same colour"


def bleed_mask(
    kind: str, before: torch.Tensor, changed: torch.Tensor, twin_index: torch.Tensor
) -> torch.Tensor:
    """[N] bool: Gaussians an edit did not change that a careless editor would change too.

    (a) twins: the Gaussian of an identical twin object at the place of a changed one;
    (b) colour: an unchanged Gaussian whose pre-edit colour lies within BLEED_RADIUS of an edit
    colour, the mean pre-edit colour of a 6x6x6 RGB bin that holds >= BLEED_SHARE of the changed
    Gaussians.  Empty for global recolour and relight (everything changes)."""
    out = torch.zeros_like(changed)
    if kind in ("global", "relight") or not bool(changed.any()):
        return out
    has_twin = twin_index >= 0
    out[has_twin] = changed[twin_index[has_twin]]
    c = before.clamp(0, 1)
    cb = (c[changed] * BLEED_BINS).long().clamp(max=BLEED_BINS - 1)
    key = (cb[:, 0] * BLEED_BINS + cb[:, 1]) * BLEED_BINS + cb[:, 2]
    counts = torch.bincount(key, minlength=BLEED_BINS**3)
    sums = torch.zeros(BLEED_BINS**3, 3).index_add_(0, key, c[changed].float())
    keep = counts >= max(1.0, BLEED_SHARE * float(changed.sum()))
    if bool(keep.any()):
        centres = sums[keep] / counts[keep, None]
        out |= torch.cdist(c.float(), centres).amin(1) < BLEED_RADIUS
    return out & ~changed


def low_pass(points: torch.Tensor, colors: torch.Tensor, k: int = 16) -> torch.Tensor:
    """Mean colour over each Gaussian's k nearest neighbours (itself included)."""
    out = torch.empty_like(colors)
    for i in range(0, points.shape[0], 2048):
        d = torch.cdist(points[i : i + 2048], points)
        idx = d.topk(min(k, points.shape[0]), largest=False).indices
        out[i : i + 2048] = colors[idx].mean(1)
    return out


def scene_low_pass(scene: Scene) -> torch.Tensor:
    """`low_pass` of the texture colours within each object (floaters keep theirs); a twin copy
    takes its original's result so the twins stay identical."""
    inst = scene.instance_id
    if bool((inst == 0).all()):  # one object (procedural): as ever
        return low_pass(scene.points, scene.colors)
    out = scene.colors.clone()
    for i in inst.unique().tolist():
        m = inst == i
        if i >= 0:
            out[m] = low_pass(scene.points[m], scene.colors[m])
    copy = scene.twin_index >= 0
    copy &= scene.twin_index < torch.arange(inst.shape[0])  # the later copy of each pair
    out[copy] = out[scene.twin_index[copy]]
    return out


# ------------------------------------------------------------------------ cameras
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
    return _fill(colors, points, region, gen)


def brush_edit(
    colors: torch.Tensor,
    points: torch.Tensor,
    visible: torch.Tensor,
    camera: Camera,
    gen: torch.Generator,
) -> torch.Tensor:
    """A square dab of a brush on the edit view, as a user paints one: every Gaussian the view
    shows whose centre falls in a square BRUSH_SIDES of the view's width across, around a
    visible one, takes a colour or a decal.  It cuts across parts and objects, and a flat colour
    over the whole of a solid-coloured part is also what recolouring that part would give: there
    what tells a stroke from a recolour is where its edge runs."""
    seed = _pick(visible, gen)
    lo, hi = BRUSH_SIDES
    half = 0.5 * (lo + (hi - lo) * float(torch.rand(1, generator=gen))) * camera.width
    uv, _ = camera.project(points)
    region = visible & ((uv - uv[seed]).abs() <= half).all(-1)
    return _fill(colors, points, region, gen)


def _fill(
    colors: torch.Tensor, points: torch.Tensor, region: torch.Tensor, gen: torch.Generator
) -> torch.Tensor:
    """colors with `region` [N] painted: one random colour, or a two-colour decal in 3D."""
    if float(torch.rand(1, generator=gen)) < 0.6:
        paint = _rand_color(gen).expand_as(colors)
    else:  # a two-colour decal texture in 3D
        a, b = _rand_color(gen), _rand_color(gen)
        f = 10.0 + 20.0 * float(torch.rand(1, generator=gen))
        t = (torch.floor(points * f).long().sum(-1) % 2).float()[:, None]
        paint = (1 - t) * a + t * b
    return torch.where(region[:, None], paint, colors)


class EditResult(NamedTuple):
    colors: torch.Tensor  # [N, 3] new base colours
    rest_map: torch.Tensor  # [N, 3, 3] linear colour map of the SH bands >= 1 (see edit_sh)


def _partial_region(points: torch.Tensor, sel: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """The part `sel` cut by a ball around one of its points or a half-space through one of its
    points, keeping 25-75 % of it, so a recolour stops inside a part."""
    idx = sel.nonzero().flatten()
    p = points[idx]
    share = 0.25 + 0.5 * float(torch.rand(1, generator=gen))
    if float(torch.rand(1, generator=gen)) < 0.5:  # ball
        centre = p[int(torch.randint(idx.numel(), (1,), generator=gen))]
        d = (points - centre).norm(dim=-1)
        radius = torch.quantile(d[idx], share)
        return sel & (d <= radius)
    direction = torch.randn(3, generator=gen)
    proj = points @ (direction / direction.norm())
    cut = torch.quantile(proj[idx], 1.0 - share)  # the plane passes through a point of the part
    return sel & (proj >= cut)


def make_edit_full(
    kind: str,
    colors: torch.Tensor,
    seq_info: dict,
    visible: torch.Tensor,
    gen: torch.Generator,
    near: int | None = None,
) -> EditResult:
    """New colours [N, 3] and SH-band colour map [N, 3, 3] for one edit of `kind` on `colors`.

    seq_info: points, normals, primitive_id (-1: floaters, never picked as a part), optional
    sharp/blurred (detail), partial_prob (recolours that stop inside a part) and camera (the
    view a brush paints on)."""
    points, normals, pid = seq_info["points"], seq_info["normals"], seq_info["primitive_id"]
    n = colors.shape[0]
    if kind == "paint":
        return EditResult(paint_edit(colors, points, normals, visible, gen, near), identity_maps(n))
    if kind == "brush":
        new = brush_edit(colors, points, visible, seq_info["camera"], gen)
        return EditResult(new, identity_maps(n))
    if kind in ("recolor", "global"):
        partial = float(seq_info.get("partial_prob", 0.0))
        for _ in range(8):  # redraw transforms that barely change anything
            tk, params = random_color_transform(gen)
            if kind == "recolor":
                part = int(pid[_pick(visible & (pid >= 0), gen)])
                sel = pid == part
                # (no draw without partial recolours: the procedural suite keeps its sequences)
                if partial > 0 and float(torch.rand(1, generator=gen)) < partial:
                    sel = _partial_region(points, sel, gen)
            else:
                sel = torch.ones_like(pid, dtype=torch.bool)
            new = apply_color_transform(colors[sel], tk, params)
            if float((new - colors[sel]).abs().mean()) > 0.06:
                break
        out = colors.clone()
        out[sel] = new
        rest = identity_maps(n)
        rest[sel] = color_transform_map(colors[sel], tk, params)
        return EditResult(out, rest)
    if kind == "relight":
        if normals is None:
            raise EditDataError("relight needs surface normals; this asset has none")
        light = torch.randn(3, generator=gen)
        light = light / light.norm()
        ambient = 0.2 + 0.35 * float(torch.rand(1, generator=gen))
        diffuse = (0.9 + 0.5 * float(torch.rand(1, generator=gen))) - ambient
        shade = ambient + diffuse * (normals @ light).clamp_min(0)
        return EditResult(
            (colors * shade[:, None]).clamp(0, 1), shade[:, None, None] * torch.eye(3)
        )
    if kind == "detail":
        sharp, blurred = seq_info.get("sharp"), seq_info.get("blurred")
        if sharp is None:
            raise EditDataError("detail needs a low-passed source asset (sequence without it)")
        seed = _pick(visible, gen)
        r = 0.1 + 0.15 * float(torch.rand(1, generator=gen))
        region = (points - points[seed]).norm(dim=-1) < r
        new = torch.where(region[:, None], (colors + sharp - blurred).clamp(0, 1), colors)
        return EditResult(new, identity_maps(n))
    raise EditDataError(f"unknown edit kind {kind!r}; use one of {ALL_KINDS}")


def make_edit(
    kind: str,
    colors: torch.Tensor,
    seq_info: dict,
    visible: torch.Tensor,
    gen: torch.Generator,
    near: int | None = None,
) -> torch.Tensor:
    """New colours [N, 3] for one edit of `kind` applied to `colors` (`make_edit_full` also
    gives the map of the higher SH bands)."""
    return make_edit_full(kind, colors, seq_info, visible, gen, near).colors


def quantize(img: torch.Tensor) -> torch.Tensor:
    """8-bit round trip, as a PNG the user painted would have."""
    return torch.round(img.clamp(0, 1) * 255.0) / 255.0


def make_sequence(seed: int, spec: SequenceSpec | None = None) -> EditSequence:
    """A random scene of `spec.suite` and a sequence of 3D edits, all determined by `seed`."""
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
    scene = build_scene(spec.suite, int(seed), n, fuzzy=fuzzy)
    asset, points = scene.asset, scene.points
    sharp = scene.colors.float()
    info: dict = {"points": points, "normals": scene.normals, "primitive_id": scene.primitive_id}
    if spec.suite == "distractor":
        info["partial_prob"] = spec.partial_prob
    colors = sharp
    if needs_detail:
        blurred = scene_low_pass(scene)
        info.update(sharp=sharp, blurred=blurred)
        colors = blurred
    source = with_base_colors(asset, colors)
    sh = source.sh
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
        current = source.replace(sh=sh)
        visible = _visible(current, cams[0])
        info["camera"] = cams[0]  # the view a brush paints on
        near = None
        if kind == "paint" and last_paint is not None and u[2] < spec.overlap_prob:
            close = (points - points[last_paint]).norm(dim=-1) < 0.08
            if bool((close & visible).any()):
                near = _pick(close & visible, gen)
        for _ in range(6):  # redraw edits that change (almost) nothing
            new, rest_map = make_edit_full(kind, colors, info, visible, gen, near)
            if int(((new - colors).abs().amax(-1) > 4.0 / 255.0).sum()) >= 10:
                break
            near = None
        if kind == "paint":
            changed_now = (new - colors).abs().amax(-1) > 0
            last_paint = _pick(changed_now, gen) if bool(changed_now.any()) else None
        sh = edit_sh(sh, new, rest_map)
        gt = source.replace(sh=sh)
        views, renders = [], []
        for j, cam in enumerate(cams):
            with torch.no_grad():
                img = render(gt, cam).rgb
            renders.append(img)
            views.append(EditView(cam, quantize(img), None, f"edit{i}_view{j}"))
        changed = (new - colors).abs().amax(-1) > 1.0 / 255.0
        bleed = bleed_mask(kind, colors, changed, scene.twin_index)
        steps.append(EditStep(kind, new, changed, views, sh, rest_map, bleed, renders))
        colors = new
    held = heldout_cameras(source, first_az, spec.num_heldout, spec.view_size, gen)
    return EditSequence(
        seed=int(seed),
        source=source,
        source_colors=base_colors(source),
        normals=scene.normals,
        primitive_id=scene.primitive_id,
        steps=steps,
        heldout=held,
        instance_id=scene.instance_id,
        twin_index=scene.twin_index,
        points=points,
        suite=spec.suite,
    )
