"""Host data onto the device without a host sync.

A pageable host-to-device copy on CUDA waits for every queued kernel (``set_sync_debug_mode``
reports it as a sync); a copy from pinned memory with ``non_blocking=True`` does not, and the
caching host allocator keeps the pinned buffer until the copy is done. Index tables that the
host already knows (where the visual tokens are, each token's sequence, routing permutations)
go to the device this way instead of being recomputed there with ``nonzero`` and read back.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["to_device", "upload_table"]


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``; a CPU -> CUDA copy goes through pinned memory, without blocking."""
    device = torch.device(device)
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":  # pragma: no cover - CUDA only
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def upload_table(
    arr: np.ndarray, device: torch.device | str, dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """A host table (numpy) as a ``dtype`` tensor on ``device`` (see :func:`to_device`)."""
    t = torch.from_numpy(np.ascontiguousarray(arr))
    if t.dtype != dtype:
        t = t.to(dtype)
    return to_device(t, device)
