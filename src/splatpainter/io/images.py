"""8-bit image files <-> float tensors in [0, 1]; writes are atomic like every other output.

Reads are bounded before any pixel is decoded: only regular files (no FIFOs or devices), at
most 256 MiB on disk and 64M pixels (a decompression bomb is refused from its header).
"""

from __future__ import annotations

import io
import os
import warnings

import numpy as np
import torch

from appshell.atomic import atomic_write_bytes
from appshell.errors import UserError
from appshell.inputs import check_regular_file

MAX_IMAGE_BYTES = 256 << 20
MAX_IMAGE_PIXELS = 64 << 20  # e.g. 8192x8192


class ImageInputError(UserError):
    """An image file that cannot be read, is too large, or is not an image."""


def _read(path: str | os.PathLike[str], mode: str, what: str) -> torch.Tensor:
    from PIL import Image, UnidentifiedImageError

    try:
        check_regular_file(path, max_bytes=MAX_IMAGE_BYTES, what=what)
    except UserError as e:
        raise ImageInputError(str(e)) from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:  # reads the header only
                w, h = im.size
                if w * h > MAX_IMAGE_PIXELS:
                    raise ImageInputError(
                        f"{path}: {w}x{h} is {w * h:,} pixels; the limit for a {what} is "
                        f"{MAX_IMAGE_PIXELS:,}"
                    )
                arr = np.asarray(im.convert(mode), dtype=np.float32) / 255.0
    except UnidentifiedImageError:
        raise ImageInputError(f"{path}: not a readable {what}") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageInputError(f"{path}: {what} refused as a decompression bomb ({e})") from None
    except (OSError, SyntaxError, ValueError) as e:
        if isinstance(e, ImageInputError):
            raise
        raise ImageInputError(f"{path}: damaged {what} ({e})") from None
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
