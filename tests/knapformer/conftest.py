"""Compile (or load) the planner's numba kernels once, in the test process, before any test
spawns ranks: on a fresh clone the ranks then load them from numba's cache instead of each
compiling them for tens of seconds against their collective timeouts."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _planner_kernels_warm() -> None:
    from knapformer.planning.solvers import fast

    fast.warm_up()
