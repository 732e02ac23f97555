"""Image files <-> float tensors in [0, 1]; writes are atomic like every other output.

Reads are bounded before any pixel is decoded: only regular files (no FIFOs or devices), at
most 256 MiB on disk and 64M pixels (a decompression bomb is refused from its header).

Every pixel format is scaled by its own range (8-bit /255, 16-bit /65535) rather than through
PIL's ``convert("RGB")``/``convert("L")``, which clips 16-bit values to 255 and so turns a
16-bit edit image or mask into black and white. Transparency (RGBA, LA, PA, palette or tRNS)
is composited over black, the background every edit method renders on, so a transparent
pixel reads as "nothing painted here" (mask: not selected). Formats with no defined [0, 1]
scale (32-bit float or integer TIFFs, ...) are refused in one line, never clipped.
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
                arr = _to_channels(_pixels(im, path, what), mode)
    except UnidentifiedImageError:
        raise ImageInputError(f"{path}: not a readable {what}") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageInputError(f"{path}: {what} refused as a decompression bomb ({e})") from None
    except (OSError, SyntaxError, ValueError) as e:
        if isinstance(e, ImageInputError):
            raise
        raise ImageInputError(f"{path}: damaged {what} ({e})") from None
    return torch.from_numpy(arr.copy())


def _pixels(im, path: str | os.PathLike[str], what: str) -> np.ndarray:
    """The pixels as float32 [H, W, C] in [0, 1] (C: 1 gray, 3 RGB; alpha already applied)."""
    mode = im.mode
    if mode in ("P", "PA") or ("transparency" in im.info and mode in ("1", "L", "RGB")):
        im, mode = im.convert("RGBA"), "RGBA"  # palette and tRNS transparency as real alpha
    elif mode in ("CMYK", "YCbCr", "LAB", "HSV", "RGBX"):
        im, mode = im.convert("RGB"), "RGB"  # 8-bit colour spaces PIL converts exactly
    if mode == "1":
        arr = np.asarray(im, dtype=np.float32)
    elif mode in ("L", "LA", "RGB", "RGBA"):
        arr = np.asarray(im, dtype=np.float32) / 255.0
    elif mode.startswith("I;16") or (mode == "I" and im.format == "PNG"):
        arr = np.asarray(im).astype(np.float32) / 65535.0  # a 16-bit PNG read as I is 0..65535
    else:
        raise ImageInputError(
            f"{path}: {mode} pixels have no defined 0..1 range for a {what}; "
            "save it as an 8- or 16-bit PNG or a JPEG"
        )
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.shape[2] in (2, 4):  # composite over the black background
        arr = arr[:, :, :-1] * arr[:, :, -1:]
    return arr


def _to_channels(arr: np.ndarray, mode: str) -> np.ndarray:
    """[H, W, C] -> [H, W, 3] ("RGB") or [H, W] ("L", ITU-R 601 luma like PIL's)."""
    if mode == "RGB":
        return np.repeat(arr, 3, axis=2) if arr.shape[2] == 1 else arr
    if arr.shape[2] == 1:
        return arr[:, :, 0]
    return arr @ np.array([0.299, 0.587, 0.114], dtype=np.float32)


def load_image(path: str | os.PathLike[str], what: str = "image") -> torch.Tensor:
    """PNG/JPEG -> float tensor [H, W, 3] in [0, 1] (alpha composited over black)."""
    return _read(path, "RGB", what)


def load_mask(path: str | os.PathLike[str]) -> torch.Tensor:
    """Grayscale (or RGB, converted to luma) image -> float tensor [H, W] in [0, 1]."""
    return _read(path, "L", "mask image")


def save_png(image: torch.Tensor, path: str | os.PathLike[str]) -> None:
    """Write an [H, W, 3] (or [H, W]) float image in [0, 1] as an 8-bit PNG, atomically."""
    from PIL import Image

    arr = (image.detach().cpu().clamp(0, 1).numpy() * 255.0 + 0.5).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    atomic_write_bytes(path, buf.getvalue())
