"""What the browser's client-side viewport needs from the server: the splat library's files, the
asset once as bytes, and afterwards only what an edit changed (a colour delta).

The page renders the asset itself with WebGL (the PlayCanvas engine, pinned in
`web/package-lock.json` and installed by `scripts/setup.sh` with `npm ci`), so orbiting makes
no request at all.  It loads the current asset once as an INRIA `.ply` (float32: the engine
parses it directly, in the file's order), and after an apply, undo or redo it asks for the
difference between the asset it holds and the current one: the indices of the Gaussians whose
colour (SH, all bands) or opacity changed, with their new values.  Geometry is frozen by every
edit method; if it ever differs, the delta is refused and the page loads the asset again.

Which asset the page holds is named by a token the server hands out with the bytes; tokens are
only ever compared with the assets of the same session's history (an unknown one is answered
with 409, and the page falls back to a full load).
"""

from __future__ import annotations

import collections
import itertools
import struct
import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch

WEB = Path(__file__).resolve().parent
NODE_MODULES = WEB / "node_modules"
# The files the page may load from /vendor/NAME: the engine's minified ES module (no other file:
# its sort worker is inlined, and it fetches nothing at run time for splats).
VENDOR_FILES = {"playcanvas.mjs": NODE_MODULES / "playcanvas" / "build" / "playcanvas.min.mjs"}
DELTA_MAGIC = b"SPD1"
DELTA_HEADER = struct.Struct("<4sIIII")  # magic, num_gaussians, count, sh coefficients K, flags


def vendor_missing() -> str | None:
    """Why the client-side viewport's library cannot be served (None: it can)."""
    missing = [name for name, path in VENDOR_FILES.items() if not path.is_file()]
    if not missing:
        return None
    return (
        f"the WebGL viewport library is not installed ({', '.join(missing)} missing under "
        f"{NODE_MODULES}); run `bash scripts/setup.sh` (it needs node and npm)"
    )


class AssetTokens:
    """Numbers for the asset objects pages hold, so a page can say which one it has.

    Assets are immutable once in a session's history (an edit makes a new one), so an object
    names one state exactly.  Weak references, except for the last `keep` assets named: the
    session keeps only its current asset whole (older entries keep changed rows), and the asset
    a page holds must outlive the edit after it for a colour delta (not a reload) to reach it.
    """

    def __init__(self, keep: int = 8) -> None:
        self._lock = threading.Lock()
        self._count = itertools.count(1)
        self._by_token: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self._by_id: dict[int, int] = {}
        self._recent: collections.deque[Any] = collections.deque(maxlen=keep)

    def token(self, asset: Any) -> int:
        with self._lock:
            t = self._by_id.get(id(asset))
            if t is not None and self._by_token.get(t) is asset:
                return t
            t = next(self._count)
            self._by_token[t] = asset
            self._recent.append(asset)
            self._by_id[id(asset)] = t
            weakref.finalize(asset, self._forget, id(asset), t)
            return t

    def _forget(self, key: int, token: int) -> None:
        with self._lock:
            if self._by_id.get(key) == token:
                del self._by_id[key]

    def get(self, token: int) -> Any | None:
        with self._lock:
            return self._by_token.get(token)


class DeltaRefused(RuntimeError):
    """No colour delta leads from the page's asset to the current one (the page reloads it)."""


def asset_bytes(asset: Any) -> bytes:
    """The asset as INRIA .ply bytes (float32, every SH band), in the session's order."""
    from splatpainter.io import ply_to_bytes

    return ply_to_bytes(asset.detach().to("cpu").to(torch.float32))


def colour_delta(old: Any, new: Any) -> bytes:
    """The Gaussians whose SH or opacity differ between `old` and `new`, as little-endian bytes:
    header (b"SPD1", num_gaussians, count, K, flags=0) | count uint32 indices |
    count*K*3 float32 SH ([count, K, 3], as the asset stores it) | count float32 opacity logits.
    """
    if old is new:
        n, k = new.num_gaussians, int(new.sh.shape[1])
        return DELTA_HEADER.pack(DELTA_MAGIC, n, 0, k, 0)
    if old.num_gaussians != new.num_gaussians or old.sh.shape != new.sh.shape:
        raise DeltaRefused("the asset's size or SH degree changed")
    for name in ("means", "quats", "log_scales"):
        if not torch.equal(getattr(old, name), getattr(new, name)):
            raise DeltaRefused(f"the asset's geometry ({name}) changed")
    old_sh, new_sh = old.sh.detach().cpu(), new.sh.detach().cpu()
    old_op = old.opacity_logits.detach().cpu().reshape(-1)
    new_op = new.opacity_logits.detach().cpu().reshape(-1)
    changed = (old_sh != new_sh).flatten(1).any(1) | (old_op != new_op)
    idx = torch.nonzero(changed).reshape(-1)
    n, k = new.num_gaussians, int(new_sh.shape[1])
    parts = [
        DELTA_HEADER.pack(DELTA_MAGIC, n, int(idx.numel()), k, 0),
        idx.numpy().astype("<u4").tobytes(),
        new_sh[idx].numpy().astype("<f4").tobytes(),
        new_op[idx].numpy().astype("<f4").tobytes(),
    ]
    return b"".join(parts)


def read_colour_delta(data: bytes) -> dict[str, np.ndarray | int]:
    """Parse `colour_delta` bytes (what the page does in JavaScript; for tests and tools)."""
    if len(data) < DELTA_HEADER.size:
        raise ValueError(f"colour delta: {len(data)} bytes, shorter than its header")
    magic, n, count, k, _flags = DELTA_HEADER.unpack_from(data)
    if magic != DELTA_MAGIC:
        raise ValueError(f"colour delta: bad magic {magic!r}")
    want = DELTA_HEADER.size + count * 4 * (1 + 3 * k + 1)
    if len(data) != want:
        raise ValueError(f"colour delta: {len(data)} bytes, expected {want}")
    off = DELTA_HEADER.size
    idx = np.frombuffer(data, "<u4", count, off)
    off += 4 * count
    sh = np.frombuffer(data, "<f4", count * k * 3, off).reshape(count, k, 3)
    off += 4 * count * k * 3
    opacity = np.frombuffer(data, "<f4", count, off)
    return {"num_gaussians": n, "indices": idx, "sh": sh, "opacity_logits": opacity}


__all__ = [
    "VENDOR_FILES",
    "AssetTokens",
    "DeltaRefused",
    "asset_bytes",
    "colour_delta",
    "read_colour_delta",
    "vendor_missing",
]
