"""Which implementation the planner's inner loops run: the compiled kernels
(:mod:`._kernels`, numba) when numba is installed, else the pure-Python/numpy versions next
to each call site. Both give the same plans bit for bit (the tests compare them); the
compiled ones are several times faster. ``KNAPFORMER_PLANNER_KERNELS=0`` or
:func:`use_kernels` (``False``) selects the plain versions.

The first call of a kernel in a fresh environment compiles it (seconds; numba then caches
the machine code on disk, and later processes load it in milliseconds):
:func:`warm_up` does that up front (the CLI shows a progress message meanwhile).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import numpy as np

__all__ = ["available", "kernels", "use_kernels", "warm_up", "writable"]

_state: dict[str, object] = {
    "enabled": os.environ.get("KNAPFORMER_PLANNER_KERNELS", "1") != "0",
    "module": None,  # the imported kernels module, or False if numba is missing
}


def available() -> bool:
    """Whether the compiled kernels can be used (numba importable)."""
    if _state["module"] is None:
        try:
            from knapformer.planning.solvers import _kernels
        except ImportError:
            _state["module"] = False
        else:
            _state["module"] = _kernels
    return _state["module"] is not False


def kernels() -> ModuleType | None:
    """The compiled kernels module, or None: use the plain version."""
    if not _state["enabled"] or not available():
        return None
    return _state["module"]  # type: ignore[return-value]


@contextmanager
def use_kernels(enabled: bool) -> Iterator[None]:
    """Run the planner with (True) or without (False) the compiled kernels inside the block."""
    before = _state["enabled"]
    _state["enabled"] = enabled
    try:
        yield
    finally:
        _state["enabled"] = before


# empty token state for kernels called without a token budget (one compiled signature)
NO_TOKS = np.zeros(1, dtype=np.int64)
NO_TOKK = np.zeros((1, 1), dtype=np.int64)


def writable(a: np.ndarray) -> np.ndarray:
    """``a`` itself, or a copy if it is read-only: numba compiles read-only arrays as a type of
    their own, and the planner's cached arrays are read-only (one signature, one compile)."""
    return a if a.flags.writeable else a.copy()


def warm_up() -> bool:
    """Compile (first use) or load from numba's cache (later) every kernel, with the argument
    types the planner passes, on a tiny instance. Returns whether the kernels are in use."""
    kern = kernels()
    if kern is None:
        return False
    i64, f64 = np.int64, np.float64
    tg = np.asarray([[4.0, 2.5], [3.0, 2.0], [1.0, 0.75]])
    cls = np.asarray([0, 0, 1], dtype=i64)
    items = np.arange(3, dtype=i64)
    bag, load = np.zeros(3, dtype=i64), np.zeros(3)
    kern.reference_assign(tg[:, 0].copy(), np.zeros(3, i64), np.ones(3, i64), cls, 2, np.ones(2))
    kern.lpt_into(tg, items, np.zeros(3, i64), cls, 2, bag, load, 1.0)
    kern.best_fit_into(tg, items, cls, 2, bag, load, 5.0)
    sizes = np.asarray([1, 1, 2], dtype=i64)
    kern.pair_round(
        tg, tg[:, 0].copy(), f64(5.0), sizes, cls, bag, load, 0.0, -1, NO_TOKS, NO_TOKK, 4, 1024,
        1e-12,
    )  # fmt: skip
    kern.bottleneck_pick(
        tg, load, bag, cls, sizes, bag.copy(), items, False, -1, NO_TOKS, NO_TOKK, 1e-12
    )
    return True
