"""The demo asset shipped with the package (src/splatpainter/data/demo.ply) and its recipe."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import torch

from splatpainter.assets.gaussians import GaussianAsset
from splatpainter.assets.procedural import make_demo_asset

DEMO_NUM_GAUSSIANS = 20000
DEMO_SEED = 0


def tiled_demo_asset(
    per_tile: int, side: int, step: float | None = None
) -> tuple[torch.Tensor, GaussianAsset]:
    """(surface normals [N, 3], asset): side^3 copies of the procedural demo asset with
    `per_tile` Gaussians each, on a cubic lattice `step` apart (default: 1.1 times its extent).
    How the benchmarks and tests make a capture-scale asset (1M at 37,844 x 27) from the demo."""
    demo = make_demo_asset(per_tile, seed=DEMO_SEED)
    base = demo.asset
    if step is None:
        step = 1.1 * float((base.means.max(0).values - base.means.min(0).values).max())
    parts = [
        base.replace(means=base.means + step * torch.tensor([i, j, k], dtype=base.means.dtype))
        for i in range(side)
        for j in range(side)
        for k in range(side)
    ]
    return demo.normals.repeat(side**3, 1), GaussianAsset.concat(parts)


def demo_ply_path() -> Path:
    """Location of the shipped demo .ply (SH degree 0, with surface normals in nx/ny/nz)."""
    return Path(str(resources.files("splatpainter") / "data" / "demo.ply"))


def load_demo_asset() -> GaussianAsset:
    """The shipped demo asset; regenerated in memory if the file is missing."""
    from splatpainter.io import load_asset

    path = demo_ply_path()
    if path.is_file():
        return load_asset(path)
    return make_demo_asset(DEMO_NUM_GAUSSIANS, seed=DEMO_SEED).asset


def write_demo_ply(path: str | os.PathLike[str] | None = None) -> Path:
    """Regenerate the demo .ply (deterministic for a given torch version); returns its path."""
    from splatpainter.io import write_ply

    target = Path(path) if path is not None else demo_ply_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    demo = make_demo_asset(DEMO_NUM_GAUSSIANS, seed=DEMO_SEED)
    normals = demo.normals.numpy()
    extras = {"nx": normals[:, 0], "ny": normals[:, 1], "nz": normals[:, 2]}
    write_ply(demo.asset, target, extras=extras)
    return target


if __name__ == "__main__":
    print(write_demo_ply())
