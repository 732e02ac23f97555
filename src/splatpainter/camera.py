"""Pinhole cameras in the OpenCV convention, with JSON I/O, orbit framing and Plücker rays.

Conventions (binding for every module that renders or projects):
- Camera space: x right, y down, z forward (OpenCV). ``world_to_cam`` is a 4x4 rigid transform,
  ``p_c = R p_w + t``; the camera centre is ``-R^T t``.
- Image space: ``u = fx * x / z + cx``, ``v = fy * y / z + cy`` in pixels, where pixel (row i,
  column j) covers ``[j, j+1) x [i, i+1)`` and its centre is at ``(u, v) = (j + 0.5, i + 0.5)``.
  A centred principal point is therefore ``cx = width / 2``, ``cy = height / 2``.
- Image arrays are indexed ``[row, column]`` = ``[v, u]``: shapes ``[H, W, ...]``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

JSON_FIELDS = ("width", "height", "fx", "fy", "cx", "cy", "world_to_cam")


class CameraError(ValueError):
    """A camera (or camera file) with missing, malformed or inconsistent values."""


def _as_w2c(value: Any) -> torch.Tensor:
    try:
        m = torch.as_tensor(value, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as e:
        raise CameraError(f"world_to_cam: not a numeric 4x4 matrix ({e})") from None
    if tuple(m.shape) != (4, 4):
        raise CameraError(f"world_to_cam: expected shape [4, 4], got {list(m.shape)}")
    return m


@dataclass
class Camera:
    """A pinhole camera; see the module docstring for the conventions."""

    width: int
    height: int
    fx: float
    fy: float
    cx: float
    cy: float
    world_to_cam: torch.Tensor
    name: str = ""

    def __post_init__(self) -> None:
        w = self.world_to_cam
        if not isinstance(w, torch.Tensor):
            self.world_to_cam = _as_w2c(w)
        elif w.dtype != torch.float32:
            self.world_to_cam = w.to(torch.float32)
        for f in ("width", "height"):
            v = getattr(self, f)
            if not isinstance(v, (bool, int)) and hasattr(v, "__index__"):  # numpy integers
                setattr(self, f, int(v))
        for f in ("fx", "fy", "cx", "cy"):
            v = getattr(self, f)
            # numpy scalars and one-element tensors are accepted as plain floats
            if (
                not isinstance(v, (bool, int, float))
                and hasattr(v, "item")
                and not isinstance(v, str)
            ):
                # if that fails the value is left as is and validate() names the field
                with contextlib.suppress(TypeError, ValueError, RuntimeError):
                    setattr(self, f, float(v.item()))
        self.validate()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Camera):
            return NotImplemented
        same = all(getattr(self, f) == getattr(other, f) for f in (*JSON_FIELDS[:6], "name"))
        return same and torch.equal(self.world_to_cam.cpu(), other.world_to_cam.cpu())

    __hash__ = None  # type: ignore[assignment]  # mutable value type

    def validate(self) -> Camera:
        """Raise CameraError naming the bad field."""
        for f in ("width", "height"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise CameraError(f"{f}: expected a positive integer, got {v!r}")
        for f in ("fx", "fy", "cx", "cy"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise CameraError(f"{f}: expected a finite number, got {v!r}")
        if not (self.fx > 0 and self.fy > 0):
            raise CameraError(f"focal lengths must be positive, got fx={self.fx}, fy={self.fy}")
        m = self.world_to_cam.detach().cpu()
        if tuple(m.shape) != (4, 4):
            raise CameraError(f"world_to_cam: expected shape [4, 4], got {list(m.shape)}")
        if not torch.isfinite(m).all():
            raise CameraError("world_to_cam: contains NaN or Inf")
        if not torch.allclose(m[3], torch.tensor([0.0, 0.0, 0.0, 1.0]), atol=1e-6):
            raise CameraError(f"world_to_cam: last row must be [0, 0, 0, 1], got {m[3].tolist()}")
        r = m[:3, :3].double()
        if (
            not torch.allclose(r @ r.T, torch.eye(3, dtype=r.dtype), atol=1e-4)
            or float(torch.linalg.det(r)) < 0
        ):
            raise CameraError(
                "world_to_cam: the 3x3 block must be a rotation (orthonormal, det +1)"
            )
        return self

    # ----------------------------------------------------------------- matrices
    @property
    def R(self) -> torch.Tensor:
        return self.world_to_cam[:3, :3]

    @property
    def t(self) -> torch.Tensor:
        return self.world_to_cam[:3, 3]

    @property
    def device(self) -> torch.device:
        return self.world_to_cam.device

    def K(self) -> torch.Tensor:
        """Intrinsic matrix [3,3] float32 on the camera's device."""
        return torch.tensor(
            [[self.fx, 0.0, self.cx], [0.0, self.fy, self.cy], [0.0, 0.0, 1.0]],
            dtype=torch.float32,
            device=self.device,
        )

    def cam_to_world(self) -> torch.Tensor:
        """Inverse extrinsics [4,4] (columns: right, down, forward, centre)."""
        r, t = self.R, self.t
        out = torch.eye(4, dtype=self.world_to_cam.dtype, device=self.device)
        out[:3, :3] = r.T
        out[:3, 3] = -r.T @ t
        return out

    def camera_center(self) -> torch.Tensor:
        return -self.R.T @ self.t

    def forward(self) -> torch.Tensor:
        """Unit viewing direction (camera +z) in world space."""
        return self.R[2]

    @property
    def fov_x(self) -> float:
        """Horizontal field of view in radians."""
        return 2.0 * math.atan(self.width / (2.0 * self.fx))

    @property
    def fov_y(self) -> float:
        return 2.0 * math.atan(self.height / (2.0 * self.fy))

    def to(self, device: torch.device | str) -> Camera:
        return dataclasses.replace(self, world_to_cam=self.world_to_cam.to(device))

    def resized(self, width: int, height: int) -> Camera:
        """Same view at another resolution (intrinsics scaled per axis)."""
        sx, sy = width / self.width, height / self.height
        return dataclasses.replace(
            self,
            width=width,
            height=height,
            fx=self.fx * sx,
            fy=self.fy * sy,
            cx=self.cx * sx,
            cy=self.cy * sy,
        )

    def cropped(self, x0: int, y0: int, width: int, height: int) -> Camera:
        """The pixels [y0, y0 + height) x [x0, x0 + width) of this view, as a camera of their own
        (same rays).  A render of it equals that window of this camera's render except where a
        Gaussian centred more than 0.3x the crop's half field of view outside it reaches in:
        the projection clamps its Jacobian at the camera's own field of view (gsplat's rule),
        so such a Gaussian is drawn slightly differently (~1e-3 in colour)."""
        if not (x0 >= 0 and y0 >= 0 and width >= 1 and height >= 1):
            raise CameraError(f"crop window ({x0}, {y0}, {width}, {height}) is empty or negative")
        if x0 + width > self.width or y0 + height > self.height:
            raise CameraError(
                f"crop window ({x0}, {y0}, {width}, {height}) exceeds {self.width}x{self.height}"
            )
        return dataclasses.replace(
            self, width=width, height=height, cx=self.cx - x0, cy=self.cy - y0
        )

    # ----------------------------------------------------------------- geometry
    def world_to_camera_points(self, points: torch.Tensor) -> torch.Tensor:
        return points @ self.R.to(points).T + self.t.to(points)

    def project(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """World points [N,3] -> (pixel coordinates [N,2] as (u, v), depth z [N])."""
        pc = self.world_to_camera_points(points)
        z = pc[:, 2]
        u = self.fx * pc[:, 0] / z + self.cx
        v = self.fy * pc[:, 1] / z + self.cy
        return torch.stack([u, v], dim=-1), z

    def pixel_rays(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(origins [H,W,3], unit directions [H,W,3]) through pixel centres, world space."""
        dev = self.device
        u = torch.arange(self.width, dtype=torch.float32, device=dev) + 0.5
        v = torch.arange(self.height, dtype=torch.float32, device=dev) + 0.5
        vv, uu = torch.meshgrid(v, u, indexing="ij")
        d_cam = torch.stack(
            [(uu - self.cx) / self.fx, (vv - self.cy) / self.fy, torch.ones_like(uu)], dim=-1
        )
        d_world = d_cam @ self.R  # rows: (R^T d)^T
        d_world = d_world / d_world.norm(dim=-1, keepdim=True)
        origins = self.camera_center().expand_as(d_world)
        return origins, d_world

    def plucker_rays(self) -> torch.Tensor:
        """Plücker ray map [H,W,6]: unit direction d, then moment o x d (o = camera centre)."""
        origins, dirs = self.pixel_rays()
        moment = torch.linalg.cross(origins, dirs, dim=-1)
        return torch.cat([dirs, moment], dim=-1)

    # ----------------------------------------------------------------- constructors
    @classmethod
    def from_fov(
        cls,
        width: int,
        height: int,
        fov_y_deg: float,
        world_to_cam: torch.Tensor,
        name: str = "",
    ) -> Camera:
        """Square pixels, centred principal point, vertical field of view in degrees."""
        if not 0 < fov_y_deg < 180:
            raise CameraError(f"fov must be in (0, 180) degrees, got {fov_y_deg}")
        f = height / (2.0 * math.tan(math.radians(fov_y_deg) / 2))
        return cls(width, height, f, f, width / 2.0, height / 2.0, world_to_cam, name)

    @classmethod
    def look_at(
        cls,
        eye: Sequence[float] | torch.Tensor,
        target: Sequence[float] | torch.Tensor,
        *,
        width: int,
        height: int,
        fov_y_deg: float = 40.0,
        up: Sequence[float] | torch.Tensor = (0.0, 0.0, 1.0),
        name: str = "",
    ) -> Camera:
        return cls.from_fov(width, height, fov_y_deg, look_at(eye, target, up), name)

    # ----------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "width": self.width,
            "height": self.height,
            "fx": float(self.fx),
            "fy": float(self.fy),
            "cx": float(self.cx),
            "cy": float(self.cy),
            "world_to_cam": self.world_to_cam.detach().cpu().tolist(),
            "convention": "opencv",
        }
        if self.name:
            d["name"] = self.name
        return d

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Any) -> Camera:
        """Inverse of to_dict; CameraError names any missing or invalid field."""
        if not isinstance(data, dict):
            raise CameraError(f"camera JSON must be an object, got {type(data).__name__}")
        missing = [f for f in JSON_FIELDS if f not in data]
        if missing:
            raise CameraError(f"camera JSON is missing field(s): {', '.join(missing)}")
        conv = data.get("convention", "opencv")
        if conv != "opencv":
            raise CameraError(f"convention: only 'opencv' is supported, got {conv!r}")
        for f in ("width", "height"):
            v = data[f]
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            if isinstance(v, bool) or not isinstance(v, int):
                raise CameraError(f"{f}: expected an integer, got {data[f]!r}")
            data = {**data, f: v}
        for f in ("fx", "fy", "cx", "cy"):
            if isinstance(data[f], bool) or not isinstance(data[f], (int, float)):
                raise CameraError(f"{f}: expected a number, got {data[f]!r}")
        name = data.get("name", "")
        if not isinstance(name, str):
            raise CameraError(f"name: expected a string, got {name!r}")
        return cls(
            width=data["width"],
            height=data["height"],
            fx=float(data["fx"]),
            fy=float(data["fy"]),
            cx=float(data["cx"]),
            cy=float(data["cy"]),
            world_to_cam=_as_w2c(data["world_to_cam"]),
            name=name,
        )

    @classmethod
    def from_json(cls, text: str | bytes | dict[str, Any]) -> Camera:
        if isinstance(text, dict):
            return cls.from_dict(text)
        from appshell.inputs import InputFileError, loads_json

        try:
            data = loads_json(text, source="camera")
        except InputFileError as e:
            raise CameraError(str(e)) from None
        return cls.from_dict(data)


# --------------------------------------------------------------------- free functions
def look_at(
    eye: Sequence[float] | torch.Tensor,
    target: Sequence[float] | torch.Tensor,
    up: Sequence[float] | torch.Tensor = (0.0, 0.0, 1.0),
) -> torch.Tensor:
    """OpenCV world_to_cam [4,4] for a camera at eye looking at target, image-up along up."""
    eye_t = torch.as_tensor(eye, dtype=torch.float64).detach().cpu().reshape(3)
    tgt = torch.as_tensor(target, dtype=torch.float64).detach().cpu().reshape(3)
    up_t = torch.as_tensor(up, dtype=torch.float64).detach().cpu().reshape(3)
    fwd = tgt - eye_t
    if float(fwd.norm()) < 1e-12:
        raise CameraError("look_at: eye and target coincide")
    fwd = fwd / fwd.norm()
    right = torch.linalg.cross(fwd, up_t)
    if float(right.norm()) < 1e-6 * max(float(up_t.norm()), 1e-12):
        # Looking straight along up: pick any perpendicular so the camera stays well defined.
        alt = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
        if abs(float(alt @ fwd)) > 0.9:
            alt = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
        right = torch.linalg.cross(fwd, alt)
    right = right / right.norm()
    down = torch.linalg.cross(fwd, right)
    w2c = torch.eye(4, dtype=torch.float64)
    r = torch.stack([right, down, fwd])
    w2c[:3, :3] = r
    w2c[:3, 3] = -r @ eye_t
    return w2c.float()


def _framing(target: Any) -> tuple[torch.Tensor, float, torch.Tensor | None, float]:
    """(centre, radius, points or None, pad) from an asset, (centre, radius) or a (min, max) box.

    For an asset, points are its means and pad is 3 sigma of a large (99th percentile) splat, so
    framing can be fitted to the actual points rather than to a loose bounding sphere.
    """
    if hasattr(target, "bounding_sphere"):
        centre, radius = target.bounding_sphere(sigma=3.0)
        pts = target.means.detach().cpu().double()
        big = target.log_scales.detach().cpu().double().max(dim=1).values
        pad = 3.0 * float(torch.quantile(big, 0.99).exp()) if big.numel() else 0.0
        if big.numel() > 1_000_000:  # quantile has a size limit; the max is a fine bound there
            pad = 3.0 * float(big.max().exp())
        return centre.detach().cpu().double(), float(radius), pts, pad
    if isinstance(target, tuple) and len(target) == 2 and isinstance(target[1], (int, float)):
        return (
            torch.as_tensor(target[0], dtype=torch.float64).reshape(3),
            float(target[1]),
            None,
            0.0,
        )
    lo, hi = (torch.as_tensor(x, dtype=torch.float64).reshape(3) for x in target)
    return (lo + hi) / 2, float((hi - lo).norm() / 2), None, 0.0


def _fit_distance(
    offsets: torch.Tensor, rotations: list[torch.Tensor], tan_x: float, tan_y: float, pad: float
) -> float:
    """Smallest distance from the centre at which every offset point (+pad) is in every view.

    A camera at centre - d * forward sees offset q at depth d + q.f and lateral q.right, q.down,
    so the constraint |lateral| + pad <= tan(half fov) * (depth - pad) is linear in d.
    """
    need = 0.0
    for r in rotations:
        x, y, zf = (offsets @ r.T).unbind(1)
        d_x = (x.abs() + pad) / tan_x - zf + pad
        d_y = (y.abs() + pad) / tan_y - zf + pad
        need = max(need, float(torch.maximum(d_x, d_y).max()))
    return need


def framing_distance(radius: float, fov_x: float, fov_y: float, margin: float = 1.1) -> float:
    """Distance at which a sphere of this radius fits in both fields of view (radians)."""
    half = min(fov_x, fov_y) / 2
    return margin * max(radius, 1e-6) / math.sin(half)


def orbit_cameras(
    target: Any,
    n: int,
    *,
    width: int = 256,
    height: int = 256,
    fov_y_deg: float = 40.0,
    elevation_deg: float = 20.0,
    azimuth_start_deg: float = 0.0,
    up: Sequence[float] = (0.0, 0.0, 1.0),
    distance: float | None = None,
    margin: float = 1.1,
    fit: str = "sphere",
) -> list[Camera]:
    """n cameras evenly spaced in azimuth around the target, all looking at its centre.

    target: a GaussianAsset, a (centre, radius) pair or a (min, max) box. All cameras share one
    distance: with fit="sphere" the bounding sphere (for an asset: of its means, plus 3 sigma of
    its largest splat) fits the view with the margin, the same for any azimuth; with
    fit="points" (assets only) it is the smallest distance at which all means, padded by 3
    sigma of a large splat, fit every one of these views with the margin (tighter framing).
    """
    if n < 1:
        raise CameraError(f"orbit needs at least one camera, got n={n}")
    if fit not in ("sphere", "points"):
        raise CameraError(f"fit must be 'sphere' or 'points', got {fit!r}")
    if not -90 < elevation_deg < 90:
        raise CameraError(f"elevation must be in (-90, 90) degrees, got {elevation_deg}")
    centre, radius, points, pad = _framing(target)
    probe = Camera.from_fov(width, height, fov_y_deg, torch.eye(4))
    up_t = torch.as_tensor(up, dtype=torch.float64)
    up_t = up_t / up_t.norm()
    # Orthonormal basis (a, b) of the ground plane perpendicular to up.
    seed = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    if abs(float(seed @ up_t)) > 0.9:
        seed = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    a = seed - (seed @ up_t) * up_t
    a = a / a.norm()
    b = torch.linalg.cross(up_t, a)
    el = math.radians(elevation_deg)
    directions = []
    for i in range(n):
        az = math.radians(azimuth_start_deg) + 2 * math.pi * i / n
        directions.append(
            math.cos(el) * (math.cos(az) * a + math.sin(az) * b) + math.sin(el) * up_t
        )
    if distance is not None:
        dist = float(distance)
    elif fit == "points" and points is not None and points.shape[0] > 0:
        rots = [look_at(centre + d, centre, up_t)[:3, :3].double() for d in directions]
        tan_x = math.tan(probe.fov_x / 2) / margin
        tan_y = math.tan(probe.fov_y / 2) / margin
        dist = _fit_distance(points - centre, rots, tan_x, tan_y, pad)
        dist = max(dist, 1e-3 * max(radius, 1e-6))
    else:
        dist = framing_distance(radius, probe.fov_x, probe.fov_y, margin)
    return [
        Camera.from_fov(
            width, height, fov_y_deg, look_at(centre + dist * d, centre, up_t), f"orbit_{i:03d}"
        )
        for i, d in enumerate(directions)
    ]


turntable_cameras = orbit_cameras


def cameras_from_json(data: Any) -> list[Camera]:
    """One camera, a list of cameras, or an INRIA cameras.json list -> list of Camera."""
    if isinstance(data, dict):
        if "cameras" in data and isinstance(data["cameras"], list):
            data = data["cameras"]
        else:
            return [_camera_from_any(data, 0)]
    if not isinstance(data, list):
        raise CameraError(f"camera file must hold an object or a list, got {type(data).__name__}")
    if not data:
        raise CameraError("camera file holds an empty list")
    return [_camera_from_any(d, i) for i, d in enumerate(data)]


def _camera_from_any(d: Any, i: int) -> Camera:
    try:
        if isinstance(d, dict) and "rotation" in d and "position" in d:
            return camera_from_inria(d)
        return Camera.from_dict(d)
    except CameraError as e:
        raise CameraError(f"camera {i}: {e}") from None


def camera_from_inria(entry: dict[str, Any]) -> Camera:
    """One entry of INRIA 3DGS cameras.json (rotation is cam-to-world, position the centre)."""
    required = ("width", "height", "position", "rotation", "fx", "fy")
    missing = [f for f in required if f not in entry]
    if missing:
        raise CameraError(f"INRIA camera is missing field(s): {', '.join(missing)}")
    try:
        rot = torch.as_tensor(entry["rotation"], dtype=torch.float64)
        pos = torch.as_tensor(entry["position"], dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as e:
        raise CameraError(f"INRIA camera: rotation/position not numeric ({e})") from None
    if rot.shape != (3, 3):
        raise CameraError(f"rotation: expected 3x3, got {list(rot.shape)}")
    if pos.shape != (3,):
        raise CameraError(f"position: expected 3 numbers, got {list(pos.shape)}")
    w2c = torch.eye(4, dtype=torch.float64)
    w2c[:3, :3] = rot.T
    w2c[:3, 3] = -rot.T @ pos
    width, height = entry["width"], entry["height"]
    name = entry.get("img_name", entry.get("id", ""))
    return Camera(
        width=int(width) if isinstance(width, (int, float)) else width,
        height=int(height) if isinstance(height, (int, float)) else height,
        fx=entry["fx"],
        fy=entry["fy"],
        cx=float(width) / 2.0 if isinstance(width, (int, float)) else 0.0,
        cy=float(height) / 2.0 if isinstance(height, (int, float)) else 0.0,
        world_to_cam=w2c.float(),
        name=str(name),
    )


def load_inria_cameras(path: str | os.PathLike[str]) -> list[Camera]:
    """Read an INRIA 3DGS cameras.json (a list of {id, img_name, width, height, position, ...})."""
    data = _read_json(path)
    if not isinstance(data, list):
        raise CameraError(f"{path}: INRIA cameras.json must hold a list")
    return [_camera_from_any_inria(d, i) for i, d in enumerate(data)]


def _camera_from_any_inria(d: Any, i: int) -> Camera:
    if not isinstance(d, dict):
        raise CameraError(f"camera {i}: expected an object, got {type(d).__name__}")
    try:
        return camera_from_inria(d)
    except CameraError as e:
        raise CameraError(f"camera {i}: {e}") from None


def _read_json(path: str | os.PathLike[str]) -> Any:
    from appshell.inputs import InputFileError, load_json

    try:
        return load_json(path, what="camera JSON file")
    except InputFileError as e:
        raise CameraError(str(e)) from None


def load_cameras(path: str | os.PathLike[str]) -> list[Camera]:
    """Cameras from a JSON file: a single camera, a list, or INRIA cameras.json."""
    try:
        return cameras_from_json(_read_json(path))
    except CameraError as e:
        msg = str(e)
        raise CameraError(msg if msg.startswith(str(path)) else f"{path}: {msg}") from None


def load_camera(path: str | os.PathLike[str]) -> Camera:
    cams = load_cameras(path)
    if len(cams) != 1:
        raise CameraError(f"{path}: expected one camera, found {len(cams)}")
    return cams[0]


def save_camera(camera: Camera, path: str | os.PathLike[str]) -> None:
    from appshell.atomic import atomic_write_text

    atomic_write_text(path, camera.to_json() + "\n")


def save_cameras(cameras: Sequence[Camera], path: str | os.PathLike[str]) -> None:
    from appshell.atomic import atomic_write_text

    atomic_write_text(path, json.dumps([c.to_dict() for c in cameras], indent=2) + "\n")
