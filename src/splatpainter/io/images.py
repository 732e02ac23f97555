"""8-bit image files <-> float tensors in [0, 1]; writes are atomic like every other output."""

from __future__ import annotations

import io
import os

import numpy as np
import torch

from splatpainter.io.atomic import atomic_write_bytes


def _read(path: str | os.PathLike[str], mode: str, what: str) -> torch.Tensor:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            arr = np.asarray(im.convert(mode), dtype=np.float32) / 255.0
    except UnidentifiedImageError:
        raise ValueError(f"{path}: not a readable {what}") from None
    return torch.from_numpy(arr.copy())


def load_image(path: str | os.PathLike[str], what: str = "image") -> torch.Tensor:
    """PNG/JPEG -> float tensor [H, W, 3] in [0, 1] (an alpha channel is dropped)."""
    return _read(path, "RGB", what)


def load_mask(path: str | os.PathLike[str]) -> torch.Tensor:
    """Grayscale (or RGB, converted) image -> float tensor [H, W] in [0, 1]."""
    return _read(path, "L", "mask image")


def save_png(image: torch.Tensor, path: str | os.PathLike[str]) -> None:
    """Write an [H, W, 3] (or [H, W]) float image in [0, 1] as an 8-bit PNG, atomically."""
    from PIL import Image

    arr = (image.detach().cpu().clamp(0, 1).numpy() * 255.0 + 0.5).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    atomic_write_bytes(path, buf.getvalue())
