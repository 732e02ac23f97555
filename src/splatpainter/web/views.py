"""Pure helpers of the browser editor: orbit views -> cameras, image bytes <-> tensors.

The page describes its view as orbit parameters, never as a camera matrix, and the server turns
them into the one `Camera` both the displayed frame and the edit use; so an edit is always fitted
on exactly the pixels of the view the user painted on.
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

MAX_SIDE = 2048  # pixels per side of a view; also bounds every decoded image
FOV_Y_DEG = 40.0
MARGIN = 1.1


class WebInputError(ValueError):
    """A malformed request value; the message names it (answered with a 4xx)."""


@dataclass(frozen=True)
class OrbitView:
    """Azimuth/elevation in degrees around the asset's centre (Z up), zoom as a multiple of the
    framing distance, pan in units of the bounding radius, image size in pixels."""

    az: float = 30.0
    el: float = 20.0
    zoom: float = 1.0
    pan_x: float = 0.0
    pan_y: float = 0.0
    width: int = 512
    height: int = 512

    def validate(self) -> OrbitView:
        for name in ("az", "el", "zoom", "pan_x", "pan_y"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise WebInputError(f"view.{name}: expected a finite number, got {v!r}")
        if not -89.9 <= self.el <= 89.9:
            raise WebInputError(f"view.el: must be in [-89.9, 89.9] degrees, got {self.el}")
        if not 0.05 <= self.zoom <= 20:
            raise WebInputError(f"view.zoom: must be in [0.05, 20], got {self.zoom}")
        if abs(self.pan_x) > 10 or abs(self.pan_y) > 10:
            raise WebInputError("view.pan_x/pan_y: must be within +-10 radii")
        for name in ("width", "height"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 8 <= v <= MAX_SIDE:
                raise WebInputError(f"view.{name}: expected an integer in 8..{MAX_SIDE}, got {v!r}")
        return self

    @classmethod
    def from_dict(cls, d: Any) -> OrbitView:
        if not isinstance(d, dict):
            raise WebInputError(f"view: expected an object, got {type(d).__name__}")
        names = set(asdict(cls()))
        unknown = sorted(set(d) - names)
        if unknown:
            raise WebInputError(f"view: unknown field(s) {', '.join(unknown)}")
        return cls(**d).validate()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def orbit_camera(view: OrbitView, centre: torch.Tensor, radius: float):
    """The camera of `view` around a bounding sphere (centre [3], radius)."""
    from splatpainter.camera import Camera, framing_distance, look_at

    probe = Camera.from_fov(view.width, view.height, FOV_Y_DEG, torch.eye(4))
    dist = framing_distance(max(radius, 1e-6), probe.fov_x, probe.fov_y, MARGIN) * view.zoom
    az, el = math.radians(view.az), math.radians(view.el)
    direction = torch.tensor(
        [math.cos(el) * math.cos(az), math.cos(el) * math.sin(az), math.sin(el)],
        dtype=torch.float64,
    )
    up = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    right = torch.linalg.cross(up, direction)
    right = right / right.norm()
    cam_up = torch.linalg.cross(direction, right)
    target = centre.double() + radius * (view.pan_x * right + view.pan_y * cam_up)
    eye = target + dist * direction
    return Camera.from_fov(view.width, view.height, FOV_Y_DEG, look_at(eye, target, up), "web")


def orbit_frame(centre: torch.Tensor, radius: float, background: Any) -> dict[str, Any]:
    """What the page's WebGL viewport needs to compute `orbit_camera` itself (so orbiting
    makes no request): the bounding sphere, the field of view, the margin, the background."""
    return {
        "centre": [float(x) for x in centre.reshape(3).tolist()],
        "radius": float(radius),
        "fov_y_deg": FOV_Y_DEG,
        "margin": MARGIN,
        "background": [float(b) for b in background],
    }


def to_uint8(rgb: torch.Tensor) -> np.ndarray:
    """[H, W, 3] float in [0, 1] -> uint8, rounded as `save_png` does."""
    return (rgb.detach().cpu().clamp(0, 1).numpy() * 255.0 + 0.5).astype(np.uint8)


def encode_image(rgb: torch.Tensor, fmt: str, quality: int = 85) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    im = Image.fromarray(to_uint8(rgb))
    if fmt == "png":
        im.save(buf, format="PNG", compress_level=1)
    else:
        im.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def decode_image(data: bytes, width: int, height: int, what: str, mode: str) -> torch.Tensor:
    """PNG/JPEG bytes of exactly width x height -> float tensor in [0, 1] (mode "RGB" or "L").

    The size is checked from the header before any pixel is decoded, so an oversized image (a
    decompression bomb included) is refused without allocating it.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.format not in ("PNG", "JPEG", "WEBP"):
                raise WebInputError(f"{what}: expected a PNG, JPEG or WebP image, got {im.format}")
            if im.size != (width, height):
                raise WebInputError(
                    f"{what}: image is {im.size[0]}x{im.size[1]} but the view is {width}x{height}"
                )
            arr = np.asarray(im.convert(mode), dtype=np.float32) / 255.0
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as e:
        raise WebInputError(f"{what}: not a readable image ({e})") from None
    return torch.from_numpy(arr.copy())


def decode_data_url(text: Any, what: str) -> bytes:
    """The bytes of a `data:image/...;base64,` URL (or of bare base64)."""
    if not isinstance(text, str):
        raise WebInputError(f"{what}: expected a base64 data URL string")
    if text.startswith("data:"):
        head, sep, text = text.partition(",")
        if not sep or not head.endswith(";base64"):
            raise WebInputError(f"{what}: expected a base64 data URL")
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise WebInputError(f"{what}: invalid base64") from None
