"""SplatPainter: interactive editing of 3D Gaussian Splatting assets from 2D edits."""

from __future__ import annotations

import importlib
import os
from typing import Any

__version__ = "0.1.0"

# Intel MKL (torch's CPU BLAS) picks a code path by memory alignment unless told otherwise, so
# two runs of one training config parted after a few steps (by 1e-7); "AUTO" keeps its fastest
# path for this CPU, repeatably.  Read when MKL first runs, so set before any torch maths.
os.environ.setdefault("MKL_CBWR", "AUTO")
# torch's CPU allocator backs tensors of 2 MB or more with transparent huge pages when this is
# set (Linux, THP "madvise" or "always"; elsewhere it does nothing).  At 1M Gaussians every
# stage makes tensors of tens to hundreds of MB, and their first touch in 4 kB pages was a
# quarter to a third of opening an asset (the kernel's page faults).  Read at torch's first
# large allocation; THP_MEM_ALLOC_ENABLE=0 turns it off.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

# Core types, imported on first use so `import splatpainter` (and `--help`) stays light.
_LAZY = {
    "GaussianAsset": "splatpainter.assets.gaussians",
    "AssetError": "splatpainter.assets.gaussians",
    "Camera": "splatpainter.camera",
    "CameraError": "splatpainter.camera",
    "orbit_cameras": "splatpainter.camera",
    "load_asset": "splatpainter.io",
    "save_asset": "splatpainter.io",
    "AssetFormatError": "splatpainter.io",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'splatpainter' has no attribute {name!r}")
