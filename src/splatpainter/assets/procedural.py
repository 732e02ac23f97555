"""Procedural assets: unions of textured primitives as flattened surface Gaussians.

Every Gaussian sits on a primitive's surface, is flat along the surface normal (its local z
axis, smallest scale) and knows its surface point, unit outward normal, primitive id and
surface (u, v). Because edits and ground truth can then be defined *in 3D* (on the surface),
every rendered view of an edit is consistent. Counts are split across primitives in
proportion to surface area; everything is seeded and deterministic on the CPU.
Conventions: Z-up, assets roughly inside the unit cube [-0.5, 0.5]^3.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from splatpainter.assets.gaussians import (
    AssetError,
    GaussianAsset,
    rgb_to_sh_dc,
    rotmat_to_quat,
    sh_coeff_count,
)

Vec3 = tuple[float, float, float]
# random_texture draws from the first five kinds only: seeded procedural assets stay as they were.
_CLASSIC_KINDS = ("solid", "checker", "stripes", "noise", "gradient")
TEXTURE_KINDS = (*_CLASSIC_KINDS, "sunburst", "plaid")


def rotation_from_euler(
    rx_deg: float = 0.0, ry_deg: float = 0.0, rz_deg: float = 0.0
) -> torch.Tensor:
    """R = Rz @ Ry @ Rx (extrinsic x, then y, then z), float64 [3,3]."""
    ax, ay, az = (math.radians(a) for a in (rx_deg, ry_deg, rz_deg))
    cx, sx, cy, sy, cz, sz = (math.cos(ax), math.sin(ax), math.cos(ay), math.sin(ay),
                              math.cos(az), math.sin(az))  # fmt: skip
    rx = torch.tensor([[1, 0, 0], [0, cx, -sx], [0, sx, cx]], dtype=torch.float64)
    ry = torch.tensor([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]], dtype=torch.float64)
    rz = torch.tensor([[cz, -sz, 0], [sz, cz, 0], [0, 0, 1]], dtype=torch.float64)
    return rz @ ry @ rx


# --------------------------------------------------------------------------- textures
@dataclass(frozen=True)
class Texture:
    """A colour field on a primitive's surface.

    kind: solid | checker | stripes | noise | gradient | sunburst | plaid. space "uv" evaluates
    on the surface parameterisation (u, v in [0, 1]), "object" on the primitive's local 3D
    coordinates (seamless, scale-aware). frequency: checker cells / stripes per unit, noise base
    frequency, sunburst rays. sunburst (a guitar top): colour_a at the centre fading radially to
    colour_b at the rim, modulated by angular rays; plaid: two crossing stripe sets, so a part
    shows colour_a, colour_b and their blend. Both make one part many colours, which defeats
    "same colour = same part" rules.
    """

    kind: str = "solid"
    color_a: Vec3 = (0.8, 0.8, 0.8)
    color_b: Vec3 = (0.2, 0.2, 0.2)
    frequency: float = 8.0
    space: str = "uv"
    axis: int = 0  # stripes / gradient direction (u=0, v=1 in uv space; x, y, z in object space)
    seed: int = 0  # noise lattice
    octaves: int = 3

    def __post_init__(self) -> None:
        if self.kind not in TEXTURE_KINDS:
            raise AssetError(f"texture kind {self.kind!r} unknown; use one of {TEXTURE_KINDS}")
        if self.space not in ("uv", "object"):
            raise AssetError(f"texture space must be 'uv' or 'object', got {self.space!r}")
        if not self.frequency > 0:
            raise AssetError(f"texture frequency must be positive, got {self.frequency}")

    def sample(self, uv: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        """RGB [n,3] in [0,1] at surface coordinates uv [n,2] / local points [n,3] (float64)."""
        coords = uv if self.space == "uv" else local
        a = torch.tensor(self.color_a, dtype=torch.float64)
        b = torch.tensor(self.color_b, dtype=torch.float64)
        if self.kind == "solid":
            t = torch.zeros(coords.shape[0], dtype=torch.float64)
        elif self.kind == "checker":
            cells = torch.floor(coords * self.frequency).to(torch.int64).sum(dim=1)
            t = (cells % 2).to(torch.float64)
        elif self.kind == "stripes":
            t = (torch.floor(coords[:, self.axis % coords.shape[1]] * self.frequency) % 2).double()
        elif self.kind == "gradient":
            x = coords[:, self.axis % coords.shape[1]]
            if self.space == "object":
                x = x + 0.5  # local coordinates span about [-0.5, 0.5]
            t = x.clamp(0.0, 1.0)
        elif self.kind == "sunburst":
            t = _sunburst(coords, self.space, self.axis, self.frequency)
        elif self.kind == "plaid":
            t = _plaid(coords, self.axis, self.frequency)
        else:
            t = _fractal_noise(coords, self.frequency, self.octaves, self.seed)
        return ((1 - t)[:, None] * a + t[:, None] * b).clamp(0.0, 1.0)


def _plane_coords(coords: torch.Tensor, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The two coordinates other than `axis` (uv: u and v themselves)."""
    if coords.shape[1] == 2:
        return coords[:, 0], coords[:, 1]
    a = axis % 3
    return coords[:, (a + 1) % 3], coords[:, (a + 2) % 3]


def _sunburst(coords: torch.Tensor, space: str, axis: int, rays: float) -> torch.Tensor:
    """Blend weight in [0, 1]: a smooth radial ramp from the centre plus angular ray bands."""
    x, y = _plane_coords(coords, axis)
    if space == "uv":  # centre of the parameterisation, rim at distance 0.5
        x, y, rim = x - 0.5, y - 0.5, 0.5
    else:  # local coordinates of a primitive are about 0.1-0.3 across
        rim = 0.2
    r = (torch.sqrt(x * x + y * y) / rim).clamp(0.0, 1.0)
    ramp = r * r * (3 - 2 * r)  # smoothstep
    ray = 0.5 + 0.5 * torch.cos(torch.atan2(y, x) * round(rays))
    return (ramp * (0.8 + 0.4 * ray)).clamp(0.0, 1.0)


def _plaid(coords: torch.Tensor, axis: int, frequency: float) -> torch.Tensor:
    """Blend weight in {0, 0.5, 1}: two crossing sets of narrow stripes (a tartan)."""
    x, y = _plane_coords(coords, axis)
    on_x = ((x * frequency) % 1.0 < 0.4).double()
    on_y = ((y * frequency * 1.3) % 1.0 < 0.3).double()
    return 0.5 * (on_x + on_y)


def _hash_lattice(ijk: torch.Tensor, seed: int) -> torch.Tensor:
    """Deterministic pseudo-random value in [0,1) per integer lattice point (any dimension)."""
    h = torch.full(ijk.shape[:-1], (seed * 0x9E3779B1 + 0x85EBCA6B) & 0x7FFFFFFF, dtype=torch.int64)
    primes = (73856093, 19349663, 83492791)
    for d in range(ijk.shape[-1]):
        h = (h ^ (ijk[..., d] * primes[d % 3])) & 0x7FFFFFFF
        h = (h * 1103515245 + 12345) & 0x7FFFFFFF
        h = h ^ (h >> 13)
    return (h & 0xFFFF).double() / 65536.0


def _value_noise(x: torch.Tensor, seed: int) -> torch.Tensor:
    """Smooth value noise in [0,1] at points [n,d] (multilinear, smoothstep-weighted)."""
    base = torch.floor(x)
    f = x - base
    w = f * f * (3 - 2 * f)
    base = base.to(torch.int64)
    d = x.shape[1]
    out = torch.zeros(x.shape[0], dtype=torch.float64)
    for corner in range(1 << d):
        offs = torch.tensor([(corner >> k) & 1 for k in range(d)], dtype=torch.int64)
        weight = torch.ones(x.shape[0], dtype=torch.float64)
        for k in range(d):
            weight = weight * (w[:, k] if offs[k] else 1 - w[:, k])
        out = out + weight * _hash_lattice(base + offs, seed)
    return out


def _fractal_noise(x: torch.Tensor, frequency: float, octaves: int, seed: int) -> torch.Tensor:
    total = torch.zeros(x.shape[0], dtype=torch.float64)
    amp, norm = 1.0, 0.0
    for o in range(max(1, octaves)):
        total = total + amp * _value_noise(x * frequency * (2**o), seed + 7919 * o)
        norm += amp
        amp *= 0.5
    return total / norm


# --------------------------------------------------------------------------- primitives
@dataclass(frozen=True)
class Primitive:
    """A closed or open surface in a local frame, placed by centre + rotation (+ texture).

    kind / dims: sphere (radius), box (sx, sy, sz), cylinder (radius, height; capped),
    cone (radius, height; capped base), torus (major R, minor r), plane (sx, sy; facing +z),
    disc (radius; facing +z).
    """

    kind: str
    dims: tuple[float, ...]
    center: Vec3 = (0.0, 0.0, 0.0)
    rotation: tuple[tuple[float, ...], ...] | None = None  # 3x3, local -> world
    texture: Texture = field(default_factory=Texture)
    opacity: float = 0.95

    def __post_init__(self) -> None:
        need = {"sphere": 1, "box": 3, "cylinder": 2, "cone": 2, "torus": 2, "plane": 2, "disc": 1}
        if self.kind not in need:
            raise AssetError(f"primitive kind {self.kind!r} unknown; use one of {sorted(need)}")
        if len(self.dims) != need[self.kind] or not all(d > 0 for d in self.dims):
            raise AssetError(
                f"{self.kind}: expected {need[self.kind]} positive dims, got {self.dims}"
            )
        if self.kind == "torus" and not self.dims[1] < self.dims[0]:
            raise AssetError("torus: minor radius must be smaller than the major radius")
        if not 0 < self.opacity < 1:
            raise AssetError(f"opacity must be in (0, 1), got {self.opacity}")

    def rotation_matrix(self) -> torch.Tensor:
        if self.rotation is None:
            return torch.eye(3, dtype=torch.float64)
        r = torch.tensor(self.rotation, dtype=torch.float64)
        if r.shape != (3, 3) or not torch.allclose(r @ r.T, torch.eye(3, dtype=r.dtype), atol=1e-6):
            raise AssetError(f"{self.kind}: rotation must be a 3x3 rotation matrix")
        return r

    def area(self) -> float:
        d = self.dims
        if self.kind == "sphere":
            return 4 * math.pi * d[0] ** 2
        if self.kind == "box":
            return 2 * (d[0] * d[1] + d[1] * d[2] + d[0] * d[2])
        if self.kind == "cylinder":
            return 2 * math.pi * d[0] * d[1] + 2 * math.pi * d[0] ** 2
        if self.kind == "cone":
            return math.pi * d[0] * math.hypot(d[0], d[1]) + math.pi * d[0] ** 2
        if self.kind == "torus":
            return 4 * math.pi**2 * d[0] * d[1]
        if self.kind == "plane":
            return d[0] * d[1]
        return math.pi * d[0] ** 2

    def sample_local(
        self, n: int, gen: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """n uniform (by area) surface samples: points, unit normals, uv, in the local frame."""
        sampler = getattr(self, f"_sample_{self.kind}")
        p, nrm, uv = sampler(n, gen)
        nrm = nrm / nrm.norm(dim=1, keepdim=True)
        return p, nrm, uv

    # Each sampler returns float64 (points [n,3], normals [n,3], uv [n,2]).
    def _sample_sphere(self, n: int, gen: torch.Generator):
        r = self.dims[0]
        d = torch.randn(n, 3, generator=gen, dtype=torch.float64)
        d = d / d.norm(dim=1, keepdim=True).clamp_min(1e-12)
        u = (torch.atan2(d[:, 1], d[:, 0]) / (2 * math.pi)) % 1.0
        v = torch.acos(d[:, 2].clamp(-1, 1)) / math.pi
        return r * d, d, torch.stack([u, v], 1)

    def _sample_box(self, n: int, gen: torch.Generator):
        size = torch.tensor(self.dims, dtype=torch.float64)
        half = size / 2
        # faces: +x, -x, +y, -y, +z, -z; areas proportional to the two spanning sides
        face_axes = [(0, 1, 2), (0, 1, 2), (1, 0, 2), (1, 0, 2), (2, 0, 1), (2, 0, 1)]
        areas = torch.tensor([float(size[a1] * size[a2]) for _, a1, a2 in face_axes])
        face = (
            torch.multinomial(areas, n, replacement=True, generator=gen) if n else areas[:0].long()
        )
        uv = torch.rand(n, 2, generator=gen, dtype=torch.float64)
        pts = torch.zeros(n, 3, dtype=torch.float64)
        nrm = torch.zeros(n, 3, dtype=torch.float64)
        for f, (ax, a1, a2) in enumerate(face_axes):
            m = face == f
            sign = 1.0 if f % 2 == 0 else -1.0
            pts[m, ax] = sign * half[ax]
            pts[m, a1] = (uv[m, 0] - 0.5) * size[a1]
            pts[m, a2] = (uv[m, 1] - 0.5) * size[a2]
            nrm[m, ax] = sign
        # uv atlas: six faces side by side in u, so textures do not repeat identically
        uv_atlas = torch.stack([(uv[:, 0] + face.double()) / 6.0, uv[:, 1]], 1)
        return pts, nrm, uv_atlas

    def _sample_cylinder(self, n: int, gen: torch.Generator, cone: bool = False):
        r, h = self.dims
        side = math.pi * r * math.hypot(r, h) if cone else 2 * math.pi * r * h
        cap = math.pi * r * r
        caps = 1 if cone else 2
        probs = torch.tensor([side] + [cap] * caps)
        part = (
            torch.multinomial(probs, n, replacement=True, generator=gen) if n else probs[:0].long()
        )
        theta = torch.rand(n, generator=gen, dtype=torch.float64) * 2 * math.pi
        s = torch.rand(n, generator=gen, dtype=torch.float64)
        rho = torch.sqrt(torch.rand(n, generator=gen, dtype=torch.float64))  # uniform on a disc
        pts = torch.zeros(n, 3, dtype=torch.float64)
        nrm = torch.zeros(n, 3, dtype=torch.float64)
        uv = torch.zeros(n, 2, dtype=torch.float64)
        m = part == 0
        if cone:
            # uniform on the lateral surface: radius from apex ∝ sqrt(U)
            t = torch.sqrt(s[m])
            rad = r * t
            pts[m, 0], pts[m, 1] = rad * torch.cos(theta[m]), rad * torch.sin(theta[m])
            pts[m, 2] = h / 2 - h * t
            slope = r / h
            nrm[m, 0], nrm[m, 1] = torch.cos(theta[m]), torch.sin(theta[m])
            nrm[m, 2] = slope
            uv[m, 1] = t
        else:
            pts[m, 0], pts[m, 1] = r * torch.cos(theta[m]), r * torch.sin(theta[m])
            pts[m, 2] = (s[m] - 0.5) * h
            nrm[m, 0], nrm[m, 1] = torch.cos(theta[m]), torch.sin(theta[m])
            uv[m, 1] = s[m]
        uv[m, 0] = theta[m] / (2 * math.pi)
        for c in range(1, caps + 1):
            m = part == c
            z = -h / 2 if (cone or c == 2) else h / 2
            pts[m, 0], pts[m, 1] = (
                r * rho[m] * torch.cos(theta[m]),
                r * rho[m] * torch.sin(theta[m]),
            )
            pts[m, 2] = z
            nrm[m, 2] = 1.0 if z > 0 else -1.0
            uv[m, 0] = 0.5 + 0.5 * rho[m] * torch.cos(theta[m])
            uv[m, 1] = 0.5 + 0.5 * rho[m] * torch.sin(theta[m])
        return pts, nrm, uv

    def _sample_cone(self, n: int, gen: torch.Generator):
        return self._sample_cylinder(n, gen, cone=True)

    def _sample_torus(self, n: int, gen: torch.Generator):
        big, small = self.dims
        # Area element ∝ (R + r cos(phi)): rejection-sample phi, vectorised in rounds.
        phis: list[torch.Tensor] = []
        got = 0
        while got < n:
            cand = torch.rand(2 * (n - got) + 16, generator=gen, dtype=torch.float64) * 2 * math.pi
            acc = torch.rand(cand.shape[0], generator=gen, dtype=torch.float64)
            keep = cand[acc * (big + small) <= big + small * torch.cos(cand)]
            phis.append(keep)
            got += keep.shape[0]
        phi = torch.cat(phis)[:n] if phis else torch.zeros(0, dtype=torch.float64)
        theta = torch.rand(n, generator=gen, dtype=torch.float64) * 2 * math.pi
        ring = big + small * torch.cos(phi)
        pts = torch.stack(
            [ring * torch.cos(theta), ring * torch.sin(theta), small * torch.sin(phi)], 1
        )
        nrm = torch.stack(
            [torch.cos(phi) * torch.cos(theta), torch.cos(phi) * torch.sin(theta), torch.sin(phi)],
            1,
        )
        uv = torch.stack([theta / (2 * math.pi), phi / (2 * math.pi)], 1)
        return pts, nrm, uv

    def _sample_plane(self, n: int, gen: torch.Generator):
        uv = torch.rand(n, 2, generator=gen, dtype=torch.float64)
        pts = torch.zeros(n, 3, dtype=torch.float64)
        pts[:, 0] = (uv[:, 0] - 0.5) * self.dims[0]
        pts[:, 1] = (uv[:, 1] - 0.5) * self.dims[1]
        nrm = torch.zeros(n, 3, dtype=torch.float64)
        nrm[:, 2] = 1.0
        return pts, nrm, uv

    def _sample_disc(self, n: int, gen: torch.Generator):
        r = self.dims[0]
        rho = torch.sqrt(torch.rand(n, generator=gen, dtype=torch.float64))
        theta = torch.rand(n, generator=gen, dtype=torch.float64) * 2 * math.pi
        x, y = rho * torch.cos(theta), rho * torch.sin(theta)
        pts = torch.stack([r * x, r * y, torch.zeros_like(x)], 1)
        nrm = torch.zeros(n, 3, dtype=torch.float64)
        nrm[:, 2] = 1.0
        return pts, nrm, torch.stack([0.5 + 0.5 * x, 0.5 + 0.5 * y], 1)


# Convenience constructors --------------------------------------------------------------
RotationLike = torch.Tensor | Sequence[Sequence[float]] | None


def _make(
    kind: str,
    dims: Sequence[float],
    center: Sequence[float],
    texture: Texture | None,
    rotation: RotationLike,
    opacity: float,
) -> Primitive:
    rot = None
    if rotation is not None:
        rot = tuple(tuple(float(v) for v in row) for row in torch.as_tensor(rotation).tolist())
    return Primitive(
        kind,
        tuple(float(d) for d in dims),
        (float(center[0]), float(center[1]), float(center[2])),
        rot,
        texture or Texture(),
        opacity,
    )


def sphere(
    radius: float,
    center: Sequence[float] = (0.0, 0.0, 0.0),
    texture: Texture | None = None,
    *,
    rotation: RotationLike = None,
    opacity: float = 0.95,
) -> Primitive:
    return _make("sphere", (radius,), center, texture, rotation, opacity)


def box(
    size: Sequence[float],
    center: Sequence[float] = (0.0, 0.0, 0.0),
    texture: Texture | None = None,
    *,
    rotation: RotationLike = None,
    opacity: float = 0.95,
) -> Primitive:
    return _make("box", size, center, texture, rotation, opacity)


def cylinder(
    radius: float,
    height: float,
    center: Sequence[float] = (0.0, 0.0, 0.0),
    texture: Texture | None = None,
    *,
    rotation: RotationLike = None,
    opacity: float = 0.95,
) -> Primitive:
    """Axis along local z, centred; capped at both ends."""
    return _make("cylinder", (radius, height), center, texture, rotation, opacity)


def cone(
    radius: float,
    height: float,
    center: Sequence[float] = (0.0, 0.0, 0.0),
    texture: Texture | None = None,
    *,
    rotation: RotationLike = None,
    opacity: float = 0.95,
) -> Primitive:
    """Apex at local +z, capped base at -z, centred on its half height."""
    return _make("cone", (radius, height), center, texture, rotation, opacity)


def torus(
    major: float,
    minor: float,
    center: Sequence[float] = (0.0, 0.0, 0.0),
    texture: Texture | None = None,
    *,
    rotation: RotationLike = None,
    opacity: float = 0.95,
) -> Primitive:
    """Ring in the local xy plane."""
    return _make("torus", (major, minor), center, texture, rotation, opacity)


def plane(
    size: Sequence[float],
    center: Sequence[float] = (0.0, 0.0, 0.0),
    texture: Texture | None = None,
    *,
    rotation: RotationLike = None,
    opacity: float = 0.95,
) -> Primitive:
    """One-sided rectangle in the local xy plane, facing +z."""
    return _make("plane", size, center, texture, rotation, opacity)


def disc(
    radius: float,
    center: Sequence[float] = (0.0, 0.0, 0.0),
    texture: Texture | None = None,
    *,
    rotation: RotationLike = None,
    opacity: float = 0.95,
) -> Primitive:
    """One-sided disc in the local xy plane, facing +z."""
    return _make("disc", (radius,), center, texture, rotation, opacity)


# --------------------------------------------------------------------------- assembly
@dataclass
class ProceduralAsset:
    """A GaussianAsset plus the surface each Gaussian was sampled from."""

    asset: GaussianAsset
    points: torch.Tensor  # [N,3] surface points (equal to asset.means)
    normals: torch.Tensor  # [N,3] unit outward normals
    primitive_id: torch.Tensor  # [N] int64 index into primitives
    uv: torch.Tensor  # [N,2] surface parameterisation of the primitive, in [0,1]
    base_colors: torch.Tensor  # [N,3] texture colour sampled at the point
    primitives: list[Primitive]

    def __len__(self) -> int:
        return self.asset.num_gaussians

    def to(self, device: torch.device | str) -> ProceduralAsset:
        return ProceduralAsset(
            self.asset.to(device),
            self.points.to(device),
            self.normals.to(device),
            self.primitive_id.to(device),
            self.uv.to(device),
            self.base_colors.to(device),
            self.primitives,
        )


def area_proportional_counts(areas: Sequence[float], n: int) -> list[int]:
    """Split n into integer counts ∝ areas (largest remainders; sums exactly to n)."""
    total = float(sum(areas))
    if total <= 0:
        raise AssetError("primitives have zero total area")
    exact = [n * a / total for a in areas]
    counts = [math.floor(e) for e in exact]
    order = sorted(range(len(areas)), key=lambda i: (counts[i] - exact[i], i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def tangent_frames(normals: torch.Tensor) -> torch.Tensor:
    """Rotation matrices [n,3,3] whose third column is the normal."""
    helper = torch.zeros_like(normals)
    use_x = normals[:, 0].abs() < 0.9
    helper[use_x, 0] = 1.0
    helper[~use_x, 1] = 1.0
    t1 = torch.linalg.cross(helper, normals)
    t1 = t1 / t1.norm(dim=1, keepdim=True)
    t2 = torch.linalg.cross(normals, t1)
    return torch.stack([t1, t2, normals], dim=2)


def build_asset(
    primitives: Sequence[Primitive],
    n: int = 20000,
    *,
    seed: int = 0,
    sh_degree: int = 0,
    flatness: float = 0.05,
    overlap: float = 0.7,
) -> ProceduralAsset:
    """Sample n flattened surface Gaussians over the union of primitives.

    The in-plane scale is overlap * (mean spacing), the spacing being sqrt(total area / n), so
    neighbouring splats cover the surface; the normal scale is flatness * in-plane scale.
    """
    if not primitives:
        raise AssetError("build_asset needs at least one primitive")
    if n < 1:
        raise AssetError(f"need at least one Gaussian, got n={n}")
    if not 0 < flatness <= 1:
        raise AssetError(f"flatness must be in (0, 1], got {flatness}")
    k = sh_coeff_count(sh_degree)
    gen = torch.Generator().manual_seed(int(seed))
    areas = [p.area() for p in primitives]
    counts = area_proportional_counts(areas, n)
    pts_l, nrm_l, uv_l, col_l, pid_l, op_l = [], [], [], [], [], []
    for i, (prim, c) in enumerate(zip(primitives, counts, strict=True)):
        local_p, local_n, uv = prim.sample_local(c, gen)
        colors = prim.texture.sample(uv, local_p)
        r = prim.rotation_matrix()
        centre = torch.tensor(prim.center, dtype=torch.float64)
        pts_l.append(local_p @ r.T + centre)
        nrm_l.append(local_n @ r.T)
        uv_l.append(uv)
        col_l.append(colors)
        pid_l.append(torch.full((c,), i, dtype=torch.int64))
        op_l.append(torch.full((c,), prim.opacity, dtype=torch.float64))
    points = torch.cat(pts_l)
    normals = torch.cat(nrm_l)
    normals = normals / normals.norm(dim=1, keepdim=True)
    colors = torch.cat(col_l)
    spacing = math.sqrt(sum(areas) / n)
    s_plane = overlap * spacing
    log_scales = torch.log(
        torch.tensor([s_plane, s_plane, flatness * s_plane], dtype=torch.float64)
    ).expand(n, 3)
    quats = rotmat_to_quat(tangent_frames(normals))
    opac = torch.cat(op_l)
    sh = torch.zeros(n, k, 3, dtype=torch.float64)
    sh[:, 0] = rgb_to_sh_dc(colors)
    asset = GaussianAsset(
        means=points.float(),
        quats=quats.float(),
        log_scales=log_scales.float().contiguous(),
        opacity_logits=torch.logit(opac).float(),
        sh=sh.float(),
    )
    asset.validate()
    return ProceduralAsset(
        asset=asset,
        points=points.float(),
        normals=normals.float(),
        primitive_id=torch.cat(pid_l),
        uv=torch.cat(uv_l).float(),
        base_colors=colors.float(),
        primitives=list(primitives),
    )


def demo_primitives() -> list[Primitive]:
    """The demo scene: a checkered pedestal, striped ball, noisy torus, gradient cylinder, cone."""
    return [
        box(
            (0.6, 0.6, 0.2),
            center=(0.0, 0.0, -0.17),
            texture=Texture(
                "checker", (0.85, 0.85, 0.8), (0.15, 0.2, 0.45), frequency=6.0, space="object"
            ),
        ),
        sphere(
            0.17,
            center=(-0.12, -0.1, 0.1),
            texture=Texture(
                "stripes", (0.9, 0.25, 0.15), (0.95, 0.85, 0.2), frequency=10.0, axis=1
            ),
        ),
        torus(
            0.16,
            0.05,
            center=(0.15, 0.12, -0.02),
            rotation=rotation_from_euler(20.0, 0.0, 0.0),
            texture=Texture(
                "noise", (0.1, 0.55, 0.3), (0.85, 0.95, 0.6), frequency=6.0, space="object", seed=3
            ),
        ),
        cylinder(
            0.07,
            0.32,
            center=(0.17, -0.15, 0.09),
            texture=Texture("gradient", (0.3, 0.2, 0.7), (0.95, 0.6, 0.9), axis=1),
        ),
        cone(
            0.09,
            0.2,
            center=(-0.15, 0.17, 0.03),
            texture=Texture("checker", (0.95, 0.55, 0.1), (0.3, 0.15, 0.05), frequency=8.0),
        ),
    ]


def make_demo_asset(n: int = 20000, *, seed: int = 0, sh_degree: int = 0) -> ProceduralAsset:
    """The shipped demo scene (Z-up, inside [-0.5, 0.5]^3) with n Gaussians."""
    return build_asset(demo_primitives(), n, seed=seed, sh_degree=sh_degree)


_PALETTE = [
    (0.9, 0.2, 0.2), (0.2, 0.6, 0.9), (0.95, 0.8, 0.2), (0.3, 0.8, 0.35), (0.6, 0.3, 0.8),
    (0.95, 0.55, 0.15), (0.9, 0.9, 0.9), (0.15, 0.15, 0.2), (0.55, 0.35, 0.2), (0.2, 0.75, 0.7),
]  # fmt: skip
PALETTE: tuple[Vec3, ...] = tuple(_PALETTE)  # the colours random textures are drawn from


def random_texture(gen: torch.Generator) -> Texture:
    def pick() -> int:
        return int(torch.randint(len(_PALETTE), (1,), generator=gen))

    kind = _CLASSIC_KINDS[int(torch.randint(len(_CLASSIC_KINDS), (1,), generator=gen))]
    a = pick()
    b = (a + 1 + int(torch.randint(len(_PALETTE) - 1, (1,), generator=gen))) % len(_PALETTE)
    freq = float(4 + 8 * torch.rand(1, generator=gen))
    space = (
        "object"
        if kind in ("noise", "gradient") or float(torch.rand(1, generator=gen)) < 0.3
        else "uv"
    )
    return Texture(kind, _PALETTE[a], _PALETTE[b], frequency=freq, space=space,
                   axis=int(torch.randint(3, (1,), generator=gen)),
                   seed=int(torch.randint(1 << 16, (1,), generator=gen)))  # fmt: skip


def random_primitives(seed: int, num_primitives: int | None = None) -> list[Primitive]:
    """A random, seeded union of 2-5 textured primitives inside the unit cube."""
    gen = torch.Generator().manual_seed(int(seed))
    count = num_primitives or int(torch.randint(2, 6, (1,), generator=gen))
    kinds = ("sphere", "box", "cylinder", "cone", "torus")
    prims = []
    for _ in range(count):
        kind = kinds[int(torch.randint(len(kinds), (1,), generator=gen))]
        u = torch.rand(8, generator=gen, dtype=torch.float64).tolist()
        centre = (0.5 * (u[0] - 0.5), 0.5 * (u[1] - 0.5), 0.5 * (u[2] - 0.5))
        rot = rotation_from_euler(360 * u[3], 360 * u[4], 360 * u[5])
        size = 0.1 + 0.12 * u[6]
        tex = random_texture(gen)
        if kind == "sphere":
            prims.append(sphere(size, centre, tex))
        elif kind == "box":
            dims = (2 * size, size * (1 + u[7]), size * (2 - u[7]))
            prims.append(box(dims, centre, tex, rotation=rot))
        elif kind == "cylinder":
            prims.append(cylinder(size * 0.6, size * (1.5 + u[7]), centre, tex, rotation=rot))
        elif kind == "cone":
            prims.append(cone(size * 0.7, size * (1.5 + u[7]), centre, tex, rotation=rot))
        else:
            prims.append(torus(size, size * (0.2 + 0.2 * u[7]), centre, tex, rotation=rot))
    return prims


def random_procedural_asset(
    seed: int, n: int = 5000, *, num_primitives: int | None = None, sh_degree: int = 0
) -> ProceduralAsset:
    """A random seeded scene (for tests and training data)."""
    return build_asset(random_primitives(seed, num_primitives), n, seed=seed, sh_degree=sh_degree)
