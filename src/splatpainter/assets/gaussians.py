"""The Gaussian asset: plain tensors in, plain tensors out.

Layout (see coord contract): ``means [N,3]``, ``quats [N,4]`` (w, x, y, z; not necessarily
normalised), ``log_scales [N,3]``, ``opacity_logits [N]``, ``sh [N,K,3]`` with ``K = (D+1)^2``
coefficient-major (``sh[:, 0]`` is the DC term, INRIA ``f_dc``), optional ``features [N,F]``.
Colour in direction d is ``0.5 + sum_k sh[:, k] * Y_k(d)`` clamped at zero, as in INRIA 3DGS.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

SH_C0 = 0.28209479177387814
SH_C1 = 0.4886025119029199
SH_C2 = (
    1.0925484305920792,
    -1.0925484305920792,
    0.31539156525252005,
    -1.0925484305920792,
    0.5462742152960396,
)
SH_C3 = (
    -0.5900435899266435,
    2.890611442640554,
    -0.4570457994644658,
    0.3731763325901154,
    -0.4570457994644658,
    1.445305721320277,
    -0.5900435899266435,
)

_K_TO_DEGREE = {1: 0, 4: 1, 9: 2, 16: 3}


class AssetError(ValueError):
    """An asset whose tensors are inconsistent or hold invalid values."""


def sh_coeff_count(degree: int) -> int:
    """Number of SH coefficients per colour channel for a degree 0..3."""
    if degree not in (0, 1, 2, 3):
        raise AssetError(f"SH degree must be 0..3, got {degree}")
    return (degree + 1) ** 2


def sh_basis(dirs: torch.Tensor, degree: int) -> torch.Tensor:
    """Real SH basis [..., (D+1)^2] at unit directions [..., 3], INRIA 3DGS sign convention."""
    sh_coeff_count(degree)
    x, y, z = dirs[..., 0], dirs[..., 1], dirs[..., 2]
    out = [torch.full_like(x, SH_C0)]
    if degree >= 1:
        out += [-SH_C1 * y, SH_C1 * z, -SH_C1 * x]
    if degree >= 2:
        xx, yy, zz = x * x, y * y, z * z
        out += [
            SH_C2[0] * x * y,
            SH_C2[1] * y * z,
            SH_C2[2] * (2.0 * zz - xx - yy),
            SH_C2[3] * x * z,
            SH_C2[4] * (xx - yy),
        ]
    if degree >= 3:
        out += [
            SH_C3[0] * y * (3.0 * xx - yy),
            SH_C3[1] * x * y * z,
            SH_C3[2] * y * (4.0 * zz - xx - yy),
            SH_C3[3] * z * (2.0 * zz - 3.0 * xx - 3.0 * yy),
            SH_C3[4] * x * (4.0 * zz - xx - yy),
            SH_C3[5] * z * (xx - yy),
            SH_C3[6] * x * (xx - 3.0 * yy),
        ]
    return torch.stack(out, dim=-1)


def rgb_to_sh_dc(rgb: torch.Tensor) -> torch.Tensor:
    """DC coefficient reproducing a view-independent colour (inverse of 0.5 + C0*dc)."""
    return (rgb - 0.5) / SH_C0


def sh_dc_to_rgb(dc: torch.Tensor, *, clamp: bool = True) -> torch.Tensor:
    """View-independent colour of a DC coefficient, clamped at zero like the renderer
    (clamp=False: the linear value 0.5 + C0 dc, to which colour edits of the DC term add)."""
    rgb = 0.5 + SH_C0 * dc
    return rgb.clamp_min(0.0) if clamp else rgb


def map_sh_bands(rest: torch.Tensor, rest_map: torch.Tensor) -> torch.Tensor:
    """The view-dependent SH bands [N, K-1, 3] under per-Gaussian colour maps [N, 3, 3]:
    rest'[n, k] = rest_map[n] @ rest[n, k].  A linear colour map of the rendered colour is the
    same map on every band (the bands are colour deviations by view direction)."""
    return torch.einsum("nij,nkj->nki", rest_map.to(rest), rest)


def quat_to_rotmat(quats: torch.Tensor) -> torch.Tensor:
    """Rotation matrices [...,3,3] of (w,x,y,z) quaternions (normalised first)."""
    q = quats / quats.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    w, x, y, z = q.unbind(-1)
    return torch.stack(
        [
            1 - 2 * (y * y + z * z),
            2 * (x * y - w * z),
            2 * (x * z + w * y),
            2 * (x * y + w * z),
            1 - 2 * (x * x + z * z),
            2 * (y * z - w * x),
            2 * (x * z - w * y),
            2 * (y * z + w * x),
            1 - 2 * (x * x + y * y),
        ],
        dim=-1,
    ).reshape(*q.shape[:-1], 3, 3)


def rotmat_to_quat(mats: torch.Tensor) -> torch.Tensor:
    """Unit (w,x,y,z) quaternions [...,4] of rotation matrices [...,3,3], w >= 0.

    Uses the largest-diagonal branch per matrix so it stays accurate near 180 degrees.
    """
    m = mats
    m00, m01, m02 = m[..., 0, 0], m[..., 0, 1], m[..., 0, 2]
    m10, m11, m12 = m[..., 1, 0], m[..., 1, 1], m[..., 1, 2]
    m20, m21, m22 = m[..., 2, 0], m[..., 2, 1], m[..., 2, 2]
    # Four candidate (unnormalised) quaternions; each is accurate when its leading term is large.
    cands = torch.stack(
        [
            torch.stack([1 + m00 + m11 + m22, m21 - m12, m02 - m20, m10 - m01], -1),
            torch.stack([m21 - m12, 1 + m00 - m11 - m22, m01 + m10, m02 + m20], -1),
            torch.stack([m02 - m20, m01 + m10, 1 - m00 + m11 - m22, m12 + m21], -1),
            torch.stack([m10 - m01, m02 + m20, m12 + m21, 1 - m00 - m11 + m22], -1),
        ],
        -2,
    )
    lead = torch.stack(
        [1 + m00 + m11 + m22, 1 + m00 - m11 - m22, 1 - m00 + m11 - m22, 1 - m00 - m11 + m22], -1
    )
    best = lead.argmax(-1)
    q = torch.gather(cands, -2, best[..., None, None].expand(*best.shape, 1, 4)).squeeze(-2)
    q = q / q.norm(dim=-1, keepdim=True)
    return torch.where(q[..., :1] < 0, -q, q)


def quat_multiply(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product a*b of (w,x,y,z) quaternions (rotation b first, then a)."""
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        -1,
    )


@dataclass(eq=False)  # tensors have no single truth value; compare attributes explicitly
class GaussianAsset:
    """A 3D Gaussian Splatting asset as a bundle of per-Gaussian tensors."""

    means: torch.Tensor
    quats: torch.Tensor
    log_scales: torch.Tensor
    opacity_logits: torch.Tensor
    sh: torch.Tensor
    features: torch.Tensor | None = None

    # ----------------------------------------------------------------- basic properties
    @property
    def num_gaussians(self) -> int:
        return int(self.means.shape[0])

    def __len__(self) -> int:
        return self.num_gaussians

    @property
    def sh_degree(self) -> int:
        k = int(self.sh.shape[1]) if self.sh.dim() == 3 else -1
        if k not in _K_TO_DEGREE:
            raise AssetError(f"sh has {k} coefficients per channel; expected one of 1, 4, 9, 16")
        return _K_TO_DEGREE[k]

    @property
    def device(self) -> torch.device:
        return self.means.device

    @property
    def dtype(self) -> torch.dtype:
        return self.means.dtype

    def tensors(self) -> dict[str, torch.Tensor]:
        """Named tensors (features only when present), in a fixed order."""
        out = {
            "means": self.means,
            "quats": self.quats,
            "log_scales": self.log_scales,
            "opacity_logits": self.opacity_logits,
            "sh": self.sh,
        }
        if self.features is not None:
            out["features"] = self.features
        return out

    # ----------------------------------------------------------------- constructors
    @classmethod
    def from_colors(
        cls,
        means: torch.Tensor,
        colors: torch.Tensor,
        *,
        scales: torch.Tensor | float = 0.01,
        quats: torch.Tensor | None = None,
        opacities: torch.Tensor | float = 0.9,
        sh_degree: int = 0,
        features: torch.Tensor | None = None,
    ) -> GaussianAsset:
        """Build from linear quantities (RGB in [0,1], scales, opacity in (0,1))."""
        means = torch.as_tensor(means, dtype=torch.float32)
        n = means.shape[0]
        colors = torch.as_tensor(colors, dtype=means.dtype, device=means.device)
        scales_t = torch.as_tensor(scales, dtype=means.dtype, device=means.device)
        if scales_t.dim() == 0:
            scales_t = scales_t.expand(n, 3)
        elif scales_t.dim() == 1:  # one isotropic scale per Gaussian
            scales_t = scales_t[:, None].expand(n, 3)
        op = torch.as_tensor(opacities, dtype=means.dtype, device=means.device).expand(n)
        op = op.clamp(1e-6, 1 - 1e-6)
        if quats is None:
            quats = torch.zeros(n, 4, dtype=means.dtype, device=means.device)
            quats[:, 0] = 1.0
        sh = torch.zeros(n, sh_coeff_count(sh_degree), 3, dtype=means.dtype, device=means.device)
        sh[:, 0] = rgb_to_sh_dc(colors.expand(n, 3))
        return cls(
            means=means,
            quats=torch.as_tensor(quats, dtype=means.dtype, device=means.device).clone(),
            log_scales=scales_t.log().clone(),
            opacity_logits=torch.logit(op).clone(),
            sh=sh,
            features=features,
        )

    @classmethod
    def empty(cls, sh_degree: int = 0, dtype: torch.dtype = torch.float32) -> GaussianAsset:
        k = sh_coeff_count(sh_degree)
        return cls(
            means=torch.zeros(0, 3, dtype=dtype),
            quats=torch.zeros(0, 4, dtype=dtype),
            log_scales=torch.zeros(0, 3, dtype=dtype),
            opacity_logits=torch.zeros(0, dtype=dtype),
            sh=torch.zeros(0, k, 3, dtype=dtype),
        )

    # ----------------------------------------------------------------- validation
    def validate(self, *, check_values: bool = True) -> GaussianAsset:
        """Raise AssetError naming the attribute (and first bad Gaussian) if anything is off.

        Returns self so calls can be chained (``load(...).validate()``).
        """
        tensors = self.tensors()
        for name, t in tensors.items():
            if not isinstance(t, torch.Tensor):
                raise AssetError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
            if not t.is_floating_point():
                raise AssetError(f"{name}: expected a floating-point tensor, got {t.dtype}")
        n = self.means.shape[0] if self.means.dim() >= 1 else -1
        expected = {
            "means": (n, 3),
            "quats": (n, 4),
            "log_scales": (n, 3),
            "opacity_logits": (n,),
        }
        for name, shape in expected.items():
            if tuple(tensors[name].shape) != shape:
                raise AssetError(
                    f"{name}: expected shape {list(shape)}, got {list(tensors[name].shape)}"
                )
        if self.sh.dim() != 3 or self.sh.shape[0] != n or self.sh.shape[2] != 3:
            raise AssetError(f"sh: expected shape [{n}, K, 3], got {list(self.sh.shape)}")
        self.sh_degree  # noqa: B018 - raises on a bad K
        if self.features is not None and (self.features.dim() != 2 or self.features.shape[0] != n):
            raise AssetError(f"features: expected shape [{n}, F], got {list(self.features.shape)}")
        dtypes = {t.dtype for t in tensors.values()}
        devices = {t.device for t in tensors.values()}
        if len(dtypes) > 1:
            raise AssetError(f"tensors have mixed dtypes {sorted(map(str, dtypes))}")
        if len(devices) > 1:
            raise AssetError(f"tensors live on different devices {sorted(map(str, devices))}")
        if not check_values or n == 0:
            return self
        for name, t in tensors.items():
            bad = ~torch.isfinite(t.reshape(n, -1)).all(dim=1)
            if bool(bad.any()):
                i = int(bad.nonzero()[0, 0])
                raise AssetError(
                    f"{name}: non-finite value at Gaussian {i} ({t[i].detach().cpu().tolist()})"
                )
        qn = self.quats.detach().norm(dim=1)
        bad = ~(qn > 1e-12)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise AssetError(f"quats: zero-length quaternion at Gaussian {i}")
        return self

    # ----------------------------------------------------------------- tensor plumbing
    def _map(self, fn) -> GaussianAsset:
        return GaussianAsset(
            means=fn(self.means),
            quats=fn(self.quats),
            log_scales=fn(self.log_scales),
            opacity_logits=fn(self.opacity_logits),
            sh=fn(self.sh),
            features=None if self.features is None else fn(self.features),
        )

    def to(self, *args, **kwargs) -> GaussianAsset:
        """Like torch.Tensor.to (device and/or dtype), applied to every tensor."""
        return self._map(lambda t: t.to(*args, **kwargs))

    def clone(self) -> GaussianAsset:
        return self._map(lambda t: t.clone())

    def detach(self) -> GaussianAsset:
        return self._map(lambda t: t.detach())

    def requires_grad_(self, flag: bool = True) -> GaussianAsset:
        for t in self.tensors().values():
            t.requires_grad_(flag)
        return self

    def replace(self, **changes) -> GaussianAsset:
        return dataclasses.replace(self, **changes)

    def subset(self, index: torch.Tensor | slice | Sequence[int]) -> GaussianAsset:
        """Gaussians selected by a boolean mask, index tensor or slice."""
        if not isinstance(index, (slice, torch.Tensor)):
            index = torch.as_tensor(index, dtype=torch.long)
        return self._map(lambda t: t[index])

    def with_sh_degree(self, degree: int) -> GaussianAsset:
        """Truncate (or zero-pad) the SH bands to a degree."""
        k = sh_coeff_count(degree)
        cur = self.sh.shape[1]
        if k <= cur:
            sh = self.sh[:, :k].clone()
        else:
            pad = self.sh.new_zeros(self.sh.shape[0], k - cur, 3)
            sh = torch.cat([self.sh, pad], dim=1)
        return dataclasses.replace(self, sh=sh)

    @staticmethod
    def concat(assets: Sequence[GaussianAsset]) -> GaussianAsset:
        """Union of assets; SH degrees are padded to the largest."""
        if not assets:
            raise AssetError("concat needs at least one asset")
        deg = max(a.sh_degree for a in assets)
        assets = [a.with_sh_degree(deg) for a in assets]
        has_f = [a.features is not None for a in assets]
        if any(has_f) and not all(has_f):
            raise AssetError("concat: either all or none of the assets must carry features")
        return GaussianAsset(
            means=torch.cat([a.means for a in assets]),
            quats=torch.cat([a.quats for a in assets]),
            log_scales=torch.cat([a.log_scales for a in assets]),
            opacity_logits=torch.cat([a.opacity_logits for a in assets]),
            sh=torch.cat([a.sh for a in assets]),
            features=torch.cat([a.features for a in assets]) if all(has_f) else None,  # type: ignore[misc]
        )

    # ----------------------------------------------------------------- derived quantities
    def scales(self) -> torch.Tensor:
        return self.log_scales.exp()

    def opacities(self) -> torch.Tensor:
        return torch.sigmoid(self.opacity_logits)

    def normalized_quats(self) -> torch.Tensor:
        return self.quats / self.quats.norm(dim=-1, keepdim=True)

    def rotation_matrices(self) -> torch.Tensor:
        return quat_to_rotmat(self.quats)

    def covariances(self) -> torch.Tensor:
        """World-space covariances R S S R^T, [N,3,3]."""
        r = self.rotation_matrices()
        s = self.scales()
        rs = r * s[:, None, :]
        return rs @ rs.transpose(1, 2)

    def base_colors(self) -> torch.Tensor:
        """View-independent (DC) colour [N,3]."""
        return sh_dc_to_rgb(self.sh[:, 0])

    def colors(self, view_dirs: torch.Tensor | None = None) -> torch.Tensor:
        """Colour [N,3] seen along unit directions [N,3] or [3] (DC only if None)."""
        if view_dirs is None or self.sh_degree == 0:
            return self.base_colors()
        d = view_dirs / view_dirs.norm(dim=-1, keepdim=True)
        basis = sh_basis(d.expand(self.num_gaussians, 3), self.sh_degree)  # [N,K]
        return (0.5 + (basis[:, :, None] * self.sh).sum(1)).clamp_min(0.0)

    def bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Axis-aligned (min, max) of the means."""
        if self.num_gaussians == 0:
            raise AssetError("bounds of an empty asset are undefined")
        m = self.means.detach()
        return m.min(dim=0).values, m.max(dim=0).values

    def bounding_sphere(self, *, sigma: float = 0.0) -> tuple[torch.Tensor, float]:
        """(centre, radius) enclosing all means (plus sigma * largest scale, for framing)."""
        lo, hi = self.bounds()
        centre = (lo + hi) / 2
        radius = float((self.means.detach() - centre).norm(dim=1).max())
        if sigma > 0:
            radius += sigma * float(self.log_scales.detach().max().exp())
        return centre, radius


# --------------------------------------------------------------------- geometric transforms
@dataclass(frozen=True)
class SimilarityTransform:
    """x -> scale * R x + translation, with R orthogonal (det +1, or -1 for a mirror)."""

    rotation: torch.Tensor  # [3,3]
    scale: float
    translation: torch.Tensor  # [3]

    @staticmethod
    def identity() -> SimilarityTransform:
        return SimilarityTransform(torch.eye(3), 1.0, torch.zeros(3))

    def apply_points(self, points: torch.Tensor) -> torch.Tensor:
        r = self.rotation.to(points)
        return self.scale * points @ r.T + self.translation.to(points)

    def inverse(self) -> SimilarityTransform:
        r_inv = self.rotation.T
        return SimilarityTransform(
            r_inv, 1.0 / self.scale, -(r_inv @ self.translation) / self.scale
        )

    def matrix(self) -> torch.Tensor:
        """4x4 homogeneous matrix."""
        m = torch.eye(4, dtype=self.rotation.dtype)
        m[:3, :3] = self.scale * self.rotation
        m[:3, 3] = self.translation.to(m)
        return m


def sh_rotation_matrices(rotation: torch.Tensor, degree: int) -> list[torch.Tensor]:
    """Per-band matrices D_l with new_coeffs_l = D_l @ old_coeffs_l for an asset turned by rotation.

    Solved by least squares on sample directions: the band-l span is closed under orthogonal maps,
    so the fit is exact (to rounding), and it handles every degree and mirrors alike.
    """
    r = torch.as_tensor(rotation, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    dirs = torch.randn(64, 3, generator=gen, dtype=torch.float64)
    dirs = dirs / dirs.norm(dim=1, keepdim=True)
    # colour'(d) = colour(R^T d)  =>  B(d) c' = B(R^T d) c
    basis_new = sh_basis(dirs, degree)
    basis_old = sh_basis(dirs @ r, degree)  # rows are (R^T d)^T
    out = []
    for band in range(1, degree + 1):
        sl = slice(band * band, (band + 1) * (band + 1))
        sol = torch.linalg.lstsq(basis_new[:, sl], basis_old[:, sl]).solution
        out.append(sol)
    return out


def transform_asset(
    asset: GaussianAsset,
    rotation: torch.Tensor | None = None,
    scale: float = 1.0,
    translation: torch.Tensor | Sequence[float] | None = None,
) -> GaussianAsset:
    """Apply x -> scale * R x + t consistently to means, orientations, sizes and SH bands."""
    if not scale > 0 or not math.isfinite(scale):
        raise AssetError(f"scale must be a positive finite number, got {scale}")
    dt, dev = asset.dtype, asset.device
    r64 = torch.eye(3, dtype=torch.float64) if rotation is None else torch.as_tensor(rotation)
    r64 = r64.detach().to(torch.float64).cpu()
    if r64.shape != (3, 3) or not torch.allclose(
        r64 @ r64.T, torch.eye(3, dtype=r64.dtype), atol=1e-5
    ):
        raise AssetError("rotation must be an orthogonal 3x3 matrix")
    det = float(torch.linalg.det(r64))
    t = torch.zeros(3) if translation is None else torch.as_tensor(translation)
    t = t.to(dtype=dt, device=dev)
    r = r64.to(dtype=dt, device=dev)
    means = scale * asset.means @ r.T + t
    log_scales = asset.log_scales + math.log(scale)
    if det > 0:
        q_r = rotmat_to_quat(r64).to(dtype=dt, device=dev)
        quats = quat_multiply(q_r.expand_as(asset.quats), asset.quats)
    else:
        # A mirror: R_new = M R F with F = diag(-1, 1, 1) keeps det +1 and the same covariance.
        rot = r @ quat_to_rotmat(asset.quats)
        rot = rot * torch.tensor([-1.0, 1.0, 1.0], dtype=dt, device=dev)
        quats = rotmat_to_quat(rot) * asset.quats.norm(dim=-1, keepdim=True)
    sh = asset.sh
    if asset.sh_degree > 0:
        sh = sh.clone()
        for band, mat in enumerate(sh_rotation_matrices(r64, asset.sh_degree), start=1):
            sl = slice(band * band, (band + 1) * (band + 1))
            sh[:, sl] = torch.einsum("ij,njc->nic", mat.to(dtype=dt, device=dev), asset.sh[:, sl])
    return dataclasses.replace(asset, means=means, quats=quats, log_scales=log_scales, sh=sh)


_AXES = {
    "+x": (1.0, 0.0, 0.0),
    "-x": (-1.0, 0.0, 0.0),
    "+y": (0.0, 1.0, 0.0),
    "-y": (0.0, -1.0, 0.0),
    "+z": (0.0, 0.0, 1.0),
    "-z": (0.0, 0.0, -1.0),
}


def up_axis_rotation(src_up: str, dst_up: str) -> torch.Tensor:
    """Proper rotation taking axis src_up (e.g. "+y") onto dst_up (e.g. "+z"), 90/180 degrees.

    "+y" -> "+z" (TRELLIS / glTF Y-up to Z-up) is (x, y, z) -> (x, -z, y).
    """
    names = {k.lstrip("+"): k for k in _AXES} | {k: k for k in _AXES}
    try:
        a = torch.tensor(_AXES[names[src_up.lower()]], dtype=torch.float64)
        b = torch.tensor(_AXES[names[dst_up.lower()]], dtype=torch.float64)
    except KeyError as e:
        raise AssetError(f"unknown axis {e.args[0]!r}; use one of {sorted(_AXES)}") from None
    if torch.equal(a, b):
        return torch.eye(3, dtype=torch.float64)
    if torch.equal(a, -b):
        # 180 degrees about any axis perpendicular to a.
        perp = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
        if abs(float(perp @ a)) > 0.5:
            perp = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
        return 2 * torch.outer(perp, perp) - torch.eye(3, dtype=torch.float64)
    axis = torch.linalg.cross(a, b)  # unit, 90-degree rotation a -> b
    kx = torch.tensor(
        [[0.0, -axis[2], axis[1]], [axis[2], 0.0, -axis[0]], [-axis[1], axis[0], 0.0]],
        dtype=torch.float64,
    )
    return torch.eye(3, dtype=torch.float64) + kx + kx @ kx


def convert_axes(
    asset: GaussianAsset, src_up: str = "+y", dst_up: str = "+z", *, drop_higher_sh: bool = False
) -> GaussianAsset:
    """Re-express an asset authored with one up axis in another (all SH bands rotated).

    drop_higher_sh truncates SH to degree 0 instead of rotating bands (faster, loses view effects).
    """
    if drop_higher_sh:
        asset = asset.with_sh_degree(0)
    return transform_asset(asset, rotation=up_axis_rotation(src_up, dst_up))


def normalize_to_unit_cube(
    asset: GaussianAsset, *, half_extent: float = 0.5
) -> tuple[GaussianAsset, SimilarityTransform]:
    """Centre the means' bounding box at the origin and scale its longest side to 2*half_extent.

    Returns the new asset and the transform that maps old coordinates to new ones.
    """
    lo, hi = asset.bounds()
    centre = ((lo + hi) / 2).to(torch.float64).cpu()
    extent = float((hi - lo).max())
    scale = 1.0 if extent <= 0 else 2 * half_extent / extent
    tf = SimilarityTransform(torch.eye(3, dtype=torch.float64), scale, -scale * centre)
    out = transform_asset(asset, None, scale, tf.translation)
    return out, tf
