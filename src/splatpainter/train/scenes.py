"""Scenes for edit data, one builder per suite (`SUITES`).

- procedural: one random union of 2-5 primitives, each with its own palette texture and flat
  splats (optionally fuzzed).  Easy: a colour-similarity rule can find the edited part.
- distractor: 2-4 separate objects where colour misleads: one object has an identical twin
  (same Gaussians, only translated), parts of different objects share colours from a small scene
  palette, and parts carry multi-colour textures (sunburst, plaid, gradient, ...).
- capture: INRIA-scan-like Gaussians: anisotropic, non-flat, tilted, overlapping, semi-transparent,
  off-surface jitter, SH degree 3 with real view dependence, and a few % floaters.

Every builder returns a `Scene`: the asset plus the ground-truth surface each Gaussian came from
(points, normals, part and object ids, texture colours), so edits are defined in 3D.
Everything is deterministic in the seed and runs on the CPU.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from splatpainter.assets.gaussians import GaussianAsset, rotmat_to_quat, sh_coeff_count
from splatpainter.assets.procedural import (
    PALETTE,
    ProceduralAsset,
    Texture,
    area_proportional_counts,
    build_asset,
    random_primitives,
    tangent_frames,
)

SUITES = ("procedural", "distractor", "capture")
MIN_GAP = 0.1  # clear space between the bounding boxes of separate objects (means)
_PITCH = 0.5  # distance between the centres of neighbouring object slots


@dataclass
class Scene:
    """An asset and the ground-truth surface behind each of its N Gaussians."""

    asset: GaussianAsset
    points: torch.Tensor  # [N, 3] surface points (capture means are jittered off them)
    normals: torch.Tensor  # [N, 3] unit surface normals (floaters: random)
    primitive_id: torch.Tensor  # [N] int64 part, unique across objects; floaters -1
    instance_id: torch.Tensor  # [N] int64 object; floaters -1
    twin_index: torch.Tensor  # [N] int64 same Gaussian in the twin object, or -1
    colors: torch.Tensor  # [N, 3] texture colours (sharp)

    @property
    def num_gaussians(self) -> int:
        return self.asset.num_gaussians


def _gen(seed: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed) * 1_000_033 + salt)


def _uniform(gen: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand(1, generator=gen))


def _randint(gen: torch.Generator, lo: int, hi: int) -> int:
    """Uniform integer in [lo, hi]."""
    return lo + int(torch.randint(hi - lo + 1, (1,), generator=gen))


# ------------------------------------------------------------------------ procedural
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


def procedural_scene(seed: int, n: int, *, fuzzy: bool) -> Scene:
    """The original suite: one object, a palette texture per part (same draws as ever)."""
    pa, asset = random_asset(int(seed), n, fuzzy=fuzzy)
    return Scene(
        asset,
        pa.points,
        pa.normals,
        pa.primitive_id,
        torch.zeros(n, dtype=torch.int64),
        torch.full((n,), -1, dtype=torch.int64),
        pa.base_colors.float(),
    )


# ------------------------------------------------------------------------ objects
@dataclass
class _Object:
    """One object (built once; a twin is a translated copy), centred on its bounding box."""

    asset: GaussianAsset
    points: torch.Tensor
    normals: torch.Tensor
    primitive_id: torch.Tensor  # local part ids 0..P-1
    colors: torch.Tensor

    @property
    def extent(self) -> torch.Tensor:
        return self.asset.means.amax(0) - self.asset.means.amin(0)


def scene_palette(gen: torch.Generator, size: int) -> list[tuple[float, float, float]]:
    """`size` distinct colours of the procedural palette: the few colours a scene's parts share."""
    order = torch.randperm(len(PALETTE), generator=gen)[:size].tolist()
    return [PALETTE[i] for i in order]


def shared_texture(
    gen: torch.Generator, palette: list[tuple[float, float, float]], first: int | None = None
) -> Texture:
    """A texture whose colours come from the scene palette (colour `first` forced as colour_a).

    Solid parts share exact colours across objects; sunburst, plaid, gradient, stripes and noise
    make one part many colours."""
    kinds = ("solid", "solid", "sunburst", "plaid", "gradient", "stripes", "noise")
    kind = kinds[int(torch.randint(len(kinds), (1,), generator=gen))]
    a = first if first is not None else int(torch.randint(len(palette), (1,), generator=gen))
    b = (a + 1 + int(torch.randint(len(palette) - 1, (1,), generator=gen))) % len(palette)
    axis = int(torch.randint(3, (1,), generator=gen))
    seed = int(torch.randint(1 << 16, (1,), generator=gen))
    if kind == "sunburst":
        return Texture(kind, palette[a], palette[b], frequency=float(_randint(gen, 6, 16)),
                       space="object", axis=axis)  # fmt: skip
    if kind == "plaid":
        return Texture(kind, palette[a], palette[b], frequency=_uniform(gen, 3.0, 7.0), axis=axis)
    if kind in ("gradient", "stripes"):
        freq = _uniform(gen, 4.0, 10.0)
        return Texture(kind, palette[a], palette[b], frequency=freq, axis=axis % 2)
    if kind == "noise":
        freq = _uniform(gen, 8.0, 20.0)
        return Texture(kind, palette[a], palette[b], frequency=freq, space="object", seed=seed)
    return Texture("solid", palette[a], palette[b])


def _build_object(
    gen: torch.Generator,
    n: int,
    size: float,
    palette: list[tuple[float, float, float]],
    first_color: int | None,
    num_parts: int,
) -> _Object:
    """A few textured primitives from `random_primitives`, scaled to `size` and centred."""
    prims = random_primitives(int(torch.randint(1 << 30, (1,), generator=gen)), num_parts)
    firsts = [first_color] + [None] * (len(prims) - 1)
    prims = [
        dataclasses.replace(p, texture=shared_texture(gen, palette, f))
        for p, f in zip(prims, firsts, strict=True)
    ]
    pa = build_asset(prims, n, seed=int(torch.randint(1 << 30, (1,), generator=gen)))
    lo, hi = pa.points.amin(0), pa.points.amax(0)
    scale = size / float((hi - lo).max())
    centre = 0.5 * (lo + hi)
    asset = pa.asset.replace(
        means=(pa.asset.means - centre) * scale, log_scales=pa.asset.log_scales + math.log(scale)
    )
    return _Object(asset, (pa.points - centre) * scale, pa.normals, pa.primitive_id, pa.base_colors)


def _slots(count: int, gen: torch.Generator) -> list[tuple[float, float]]:
    """xy centres for `count` objects: a row of two, or a 2x2 grid, in random order."""
    if count == 1:
        return [(0.0, 0.0)]
    h = _PITCH / 2
    cells = [(-h, 0.0), (h, 0.0)] if count == 2 else [(-h, -h), (h, -h), (-h, h), (h, h)]
    order = torch.randperm(len(cells), generator=gen).tolist()
    return [cells[i] for i in order[:count]]


def _capturize(obj: _Object, gen: torch.Generator) -> _Object:
    """INRIA-like Gaussians on the same surface: anisotropic, non-flat (flatness 0.2-0.8), tilted
    off the normal, overlapping, semi-transparent, jittered off the surface, SH degree 3 with
    part-coherent view dependence (highlights) stronger than `fuzz_asset`'s."""
    a = obj.asset
    n = a.num_gaussians
    spacing = a.log_scales[:, 0].exp() / 0.7  # build_asset's in-plane scale is 0.7 x spacing
    s = spacing * (1.0 + 0.6 * torch.rand(n, generator=gen))  # more overlap
    aniso = torch.exp(0.35 * torch.randn(n, 2, generator=gen))
    flat = 0.2 + 0.6 * torch.rand(n, generator=gen)
    scales = torch.stack([s * aniso[:, 0], s * aniso[:, 1], flat * s * aniso.prod(1).sqrt()], 1)
    tilted = obj.normals + 0.3 * torch.randn(n, 3, generator=gen)
    frames = tangent_frames(tilted / tilted.norm(dim=1, keepdim=True))
    twist = 2 * math.pi * torch.rand(n, generator=gen)
    c, si, z, o = twist.cos(), twist.sin(), torch.zeros(n), torch.ones(n)
    rz = torch.stack([c, -si, z, si, c, z, z, z, o], 1).reshape(n, 3, 3)
    quats = rotmat_to_quat(frames @ rz)
    means = obj.points + obj.normals * (0.3 * s * torch.randn(n, generator=gen))[:, None]
    opacity = 0.15 + 0.6 * torch.rand(n, generator=gen)
    parts = int(obj.primitive_id.max()) + 1
    pattern = 0.8 * torch.randn(parts, 15, 1, generator=gen) + 0.4 * torch.randn(
        parts, 15, 3, generator=gen
    )  # mostly colourless highlights, coherent over a part
    amp = 0.08 + 0.17 * torch.rand(n, 1, 1, generator=gen)
    sh = torch.zeros(n, sh_coeff_count(3), 3)
    sh[:, 0] = a.sh[:, 0]
    sh[:, 1:] = amp * (0.7 * pattern[obj.primitive_id] + 0.3 * torch.randn(n, 15, 3, generator=gen))
    asset = GaussianAsset(means.float(), quats.float(), scales.log().float(),
                          torch.logit(opacity).float(), sh)  # fmt: skip
    return dataclasses.replace(obj, asset=asset)


def _floaters(scene: Scene, count: int, gen: torch.Generator) -> Scene:
    """`count` small, faint, randomly coloured Gaussians near but off the surface (instance -1);
    their random normals keep relight defined."""
    if count <= 0:
        return scene
    anchor = torch.randint(scene.num_gaussians, (count,), generator=gen)
    off = 0.02 + 0.06 * torch.rand(count, 1, generator=gen)
    means = scene.points[anchor] + scene.normals[anchor] * off
    means = (means + 0.02 * torch.randn(count, 3, generator=gen)).clamp(-0.5, 0.5)
    size = scene.asset.log_scales[anchor].exp().mean(1)
    scales = size[:, None] * (0.5 + torch.rand(count, 3, generator=gen))
    quats = torch.randn(count, 4, generator=gen)
    quats = quats / quats.norm(dim=1, keepdim=True)
    normals = torch.randn(count, 3, generator=gen)
    normals = normals / normals.norm(dim=1, keepdim=True)
    colors = torch.rand(count, 3, generator=gen)
    opacity = 0.03 + 0.22 * torch.rand(count, generator=gen)
    k = scene.asset.sh.shape[1]
    fl = GaussianAsset.from_colors(means, colors, scales=scales, quats=quats, opacities=opacity,
                                   sh_degree=scene.asset.sh_degree)  # fmt: skip
    fl.sh[:, 1:] = 0.1 * torch.randn(count, k - 1, 3, generator=gen)
    none = torch.full((count,), -1, dtype=torch.int64)
    return Scene(
        GaussianAsset.concat([scene.asset, fl]),
        torch.cat([scene.points, means]),
        torch.cat([scene.normals, normals]),
        torch.cat([scene.primitive_id, none]),
        torch.cat([scene.instance_id, none]),
        torch.cat([scene.twin_index, none]),
        torch.cat([scene.colors, colors]),
    )


def multi_object_scene(
    gen: torch.Generator,
    n: int,
    num_objects: int,
    twin: bool,
    *,
    capture: bool = False,
    fuzzy: bool = False,
) -> Scene:
    """`num_objects` separate objects (gap >= MIN_GAP) in slots of a row or 2x2 grid.

    With `twin`, the first object appears twice: built (and fuzzed / capturized) once, the copy
    only translated, so both are identical apart from position.  Parts share a small palette and
    the first part of every other object reuses the first object's first colour."""
    palette = scene_palette(gen, _randint(gen, 3, 4))
    distinct = num_objects - 1 if twin else num_objects
    copies = [2 if (twin and j == 0) else 1 for j in range(distinct)]
    if num_objects == 1:
        sizes = [0.8]
    else:
        big = 0.37 if num_objects == 2 else 0.34
        sizes = [_uniform(gen, big - 0.1, big) for _ in range(distinct)]
    lo_parts = 2 if twin else 1  # a twin of a one-part object makes "part" mean "object"
    parts = [_randint(gen, lo_parts, 3) if num_objects > 1 else _randint(gen, 2, 5) for _ in sizes]
    # Gaussians per object in proportion to its (copied) area ~ size^2 x parts.
    weights = [c * s * s * p for c, s, p in zip(copies, sizes, parts, strict=True)]
    counts = area_proportional_counts(weights, n)
    objs = []
    for j in range(distinct):
        obj = _build_object(gen, max(50, counts[j] // copies[j]), sizes[j], palette,
                            0 if j > 0 else None, parts[j])  # fmt: skip
        if capture:
            obj = _capturize(obj, gen)
        elif fuzzy:
            obj = dataclasses.replace(obj, asset=fuzz_asset(obj.asset, gen))
        objs.append(obj)
    slots = _slots(num_objects, gen)
    # Off-surface jitter of capture means may poke 0.01 out of an object's point bounding box.
    jitter = max(0.0, (_PITCH - MIN_GAP - max(sizes)) / 2 - 0.01) if num_objects > 1 else 0.0
    assets, pts, nrm, pid, inst, twin_idx, cols = [], [], [], [], [], [], []
    offset_n, offset_p, slot = 0, 0, 0
    for j, obj in enumerate(objs):
        first = offset_n
        for copy in range(copies[j]):
            x, y = slots[slot]
            d = torch.tensor([x, y, 0.0]) + jitter * (2 * torch.rand(3, generator=gen) - 1)
            m = obj.asset.num_gaussians
            assets.append(obj.asset.replace(means=obj.asset.means + d))
            pts.append(obj.points + d)
            nrm.append(obj.normals)
            pid.append(obj.primitive_id + offset_p)
            inst.append(torch.full((m,), slot, dtype=torch.int64))
            cols.append(obj.colors.float())
            if copies[j] == 1:
                twin_idx.append(torch.full((m,), -1, dtype=torch.int64))
            else:  # each copy points at the same Gaussian in the other copy
                other = first + m * (1 - copy)
                twin_idx.append(torch.arange(other, other + m))
            offset_n += m
            offset_p += int(obj.primitive_id.max()) + 1
            slot += 1
    return Scene(
        GaussianAsset.concat(assets),
        torch.cat(pts),
        torch.cat(nrm),
        torch.cat(pid),
        torch.cat(inst),
        torch.cat(twin_idx),
        torch.cat(cols),
    )


def distractor_scene(seed: int, n: int, *, fuzzy: bool) -> Scene:
    """2-4 objects, one with an identical twin, shared colours, multi-colour textures."""
    gen = _gen(seed, 1)
    return multi_object_scene(gen, n, _randint(gen, 2, 4), True, fuzzy=fuzzy)


def capture_scene(seed: int, n: int) -> Scene:
    """1-3 capture-like objects (twins sometimes) plus 2-5 % floaters."""
    gen = _gen(seed, 2)
    count = _randint(gen, 1, 3)
    twin = count > 1 and float(torch.rand(1, generator=gen)) < 0.3
    floaters = round(n * _uniform(gen, 0.02, 0.05))
    scene = multi_object_scene(gen, n - floaters, count, twin, capture=True)
    return _floaters(scene, floaters, gen)


def build_scene(suite: str, seed: int, n: int, *, fuzzy: bool = False) -> Scene:
    """The scene of `suite` for `seed` with about n Gaussians (fuzzy: procedural/distractor)."""
    if suite == "procedural":
        return procedural_scene(seed, n, fuzzy=fuzzy)
    if suite == "distractor":
        return distractor_scene(seed, n, fuzzy=fuzzy)
    if suite == "capture":
        return capture_scene(seed, n)
    raise ValueError(f"unknown suite {suite!r}; use one of {SUITES}")
