"""Per-view results remembered while the tensors they were computed from stay the same.

An editing session changes colours, never geometry, and paints several strokes from one view:
what a view of the geometry alone gives (each Gaussian's total compositing weight) holds for
the whole session, and the frame the user was shown is the one the edit is fitted on.  A
`ViewMemo` keeps a few such results, each under the identity and in-place version of the
tensors it was computed from (held weakly: a dropped asset frees its entries) and the exact
camera.  A hit is the very value computed before (unless someone wrote into it in place: then
it is dropped), so nothing downstream can tell.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable, Sequence

import torch


def camera_key(camera) -> tuple:
    """The exact camera: size, intrinsics and pose, bit for bit."""
    return (
        int(camera.width),
        int(camera.height),
        camera.K().detach().cpu().double().numpy().tobytes(),
        camera.world_to_cam.detach().cpu().double().numpy().tobytes(),
    )


class ViewMemo:
    """At most `entries` values, least recently used first out; thread-safe."""

    def __init__(self, entries: int = 4) -> None:
        self.entries = entries
        self._items: OrderedDict[tuple, tuple[list, torch.Tensor, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _key(tensors: Sequence[torch.Tensor], camera, extra: Hashable) -> tuple:
        return (tuple(id(t) for t in tensors), camera_key(camera), extra)

    @staticmethod
    def _alive(refs: list, tensors: Sequence[torch.Tensor]) -> bool:
        return all(r() is t and t._version == v for (r, v), t in zip(refs, tensors, strict=True))

    def get(
        self, tensors: Sequence[torch.Tensor], camera, extra: Hashable = ()
    ) -> torch.Tensor | None:
        key = self._key(tensors, camera, extra)
        with self._lock:
            item = self._items.get(key)
            if item is not None and self._alive(item[0], tensors) and item[1]._version == item[2]:
                self._items.move_to_end(key)
                self.hits += 1
                return item[1]
            if item is not None:  # its tensors or the value itself were written in place
                del self._items[key]
            self.misses += 1
            return None

    def put(
        self, tensors: Sequence[torch.Tensor], camera, value: torch.Tensor, extra: Hashable = ()
    ) -> None:
        if self.entries <= 0:
            return
        key = self._key(tensors, camera, extra)
        refs = [(weakref.ref(t), t._version) for t in tensors]
        with self._lock:
            dropped = [k for k, it in self._items.items() if any(w() is None for w, _ in it[0])]
            for k in dropped:  # entries of dropped tensors
                del self._items[k]
            self._items[key] = (refs, value, value._version)
            self._items.move_to_end(key)
            while len(self._items) > self.entries:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
