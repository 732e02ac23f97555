"""Options and steps shared by several `splatpainter` commands (declared once)."""

from __future__ import annotations

import re
from typing import Any

from appshell.cli import UserError, choice_enum, status

# A render allocates several float buffers per pixel plus per-tile lists: 16.7M pixels
# (4096x4096) stays within a few GB; past that a typo like 60000x60000 would take minutes and
# end in a MemoryError.
MAX_RENDER_SIDE = 16384
MAX_RENDER_PIXELS = 4096 * 4096

EditMethod = choice_enum("EditMethod", ["model", "backproject", "optimize"])
EditKind = choice_enum("EditKind", ["auto", "paint", "recolor", "relight", "detail"])
Backend = choice_enum("Backend", ["auto", "numba", "reference", "gsplat"])
EvalHint = choice_enum("EvalHint", ["kind", "auto"])  # eval.suite.HINT_MODES


def check_render_size(width: int, height: int, what: str = "--size") -> tuple[int, int]:
    """Refuse image sizes that are empty or too large to render (one clear line)."""
    if width <= 0 or height <= 0:
        raise UserError(f"{what} {width}x{height}: width and height must be >= 1")
    if max(width, height) > MAX_RENDER_SIDE or width * height > MAX_RENDER_PIXELS:
        raise UserError(
            f"{what} {width}x{height} is {width * height:,} pixels; the limit is "
            f"{MAX_RENDER_PIXELS:,} pixels (e.g. 4096x4096) and {MAX_RENDER_SIDE} per side"
        )
    return width, height


def parse_size(text: str) -> tuple[int, int]:
    """'WxH' -> (width, height), within the render limits."""
    m = re.fullmatch(r"\s*(\d{1,9})\s*[xX]\s*(\d{1,9})\s*", text)
    if not m:
        raise UserError(f"--size must look like WIDTHxHEIGHT (e.g. 256x256), got {text!r}")
    return check_render_size(int(m.group(1)), int(m.group(2)))


def kernel_warmup(backend: str = "auto", device: Any = "cpu") -> None:
    """Compile (or load from numba's cache) the renderer kernels under a spinner.

    The first use on a machine compiles them, which takes about a minute; later runs load the
    cached machine code in about a second. A tiny render triggers it before the real work, so
    the wait is explained instead of looking like a hang.
    """
    import torch

    if backend not in ("auto", "numba") or torch.device(device).type != "cpu":
        return
    from splatpainter.assets.gaussians import GaussianAsset
    from splatpainter.camera import orbit_cameras
    from splatpainter.render import render

    with status("renderer kernels: compiled once on first use (about a minute), then cached"):
        g = torch.Generator().manual_seed(0)
        n = 8
        asset = GaussianAsset(
            means=torch.rand(n, 3, generator=g) - 0.5,
            quats=torch.tensor([[1.0, 0.0, 0.0, 0.0]]).repeat(n, 1),
            log_scales=torch.full((n, 3), -3.0),
            opacity_logits=torch.zeros(n),
            sh=torch.rand(n, 1, 3, generator=g),
        )
        cam = orbit_cameras(asset, 1, width=16, height=16)[0]
        render(asset, cam, backend="numba")


def read_asset(path: Any, **kwargs: Any) -> Any:
    """load_asset under a spinner (a multi-GB scene takes seconds to parse and check)."""
    from splatpainter.io import load_asset

    with status(f"reading {path}"):
        return load_asset(path, **kwargs)


def write_asset(asset: Any, path: Any, **kwargs: Any) -> None:
    """save_asset under a spinner (it checks, encodes, parses back and writes atomically)."""
    from splatpainter.io import save_asset

    with status(f"writing {path}"):
        save_asset(asset, path, **kwargs)
