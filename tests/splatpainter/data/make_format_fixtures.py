"""Writes ``formats/``: small assets and what the reference tool made of them (see README.md).

Sources (written by our PLY writer, stored gzipped): ``sh3.ply`` (300 Gaussians, SH degree 3,
so two 256-wide chunks in compressed PLY) and ``sh0.ply`` (40 Gaussians, SH degree 0). Values
sit on a 2^-12 grid (positions 2^-16) so the files gzip well; that grid is 16x finer than any
format's step, so quantisation is exercised as with arbitrary floats. The first Gaussians have
opacity logits of +-30 and +-40 (alpha bytes 255 / 0, which the reference decodes to +-inf).

Then, with the reference CLI (``@playcanvas/splat-transform``, path in $SPLAT_TRANSFORM or
tests/tools/node_modules/.bin/splat-transform, which scripts/setup.sh installs with the tests):
- ``ref_{sh3,sh0}.spz`` (``--spz-version 3``) and ``ref_{sh3,sh0}.compressed.ply``;
- their decodes back to PLY: ``ref_*.compressed.ply.ply.gz`` and ``ref_sh0.spz.ply.gz`` (the
  SH degree 3 .spz decode is left out for size: ``ours_sh3_v3.spz`` covers that decoder);
- our own writes ``ours_sh3_v3.spz`` (the first 64 Gaussians of sh3) and ``ours_sh0_v2.spz``,
  decoded by the reference to ``ours_*.spz.ply.gz``.
Decoded PLYs are gzipped (``gzip -9``) to keep the fixtures small; the tests gunzip them.

Run ``python tests/splatpainter/data/make_format_fixtures.py`` to rewrite them (needs node).
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from splatpainter.assets.gaussians import SH_C0, GaussianAsset
from splatpainter.io import read_ply, write_ply, write_spz

OUT = Path(__file__).with_name("formats")
TOOL = os.environ.get(
    "SPLAT_TRANSFORM",
    str(Path(__file__).resolve().parents[2] / "tools/node_modules/.bin/splat-transform"),
)
POSITION_GRID, GRID = 2.0**-16, 2.0**-12  # 16x finer than .spz steps, so nothing aligns


def make_asset(n: int, degree: int, seed: int) -> GaussianAsset:
    """Random Gaussians inside every format's ranges, plus four extreme opacities."""
    rng = np.random.default_rng(seed)
    k = (degree + 1) ** 2
    sh = np.zeros((n, k, 3))
    sh[:, 0] = (rng.uniform(0.02, 0.98, (n, 3)) - 0.5) / SH_C0
    sh[:, 1:] = rng.uniform(-0.6, 0.6, (n, k - 1, 3))
    opacity = rng.normal(0.0, 2.0, n)
    opacity[:4] = [30.0, -30.0, 40.0, -40.0]

    def grid(a: np.ndarray, step: float = GRID) -> torch.Tensor:
        return torch.tensor(np.round(a / step) * step, dtype=torch.float32)

    return GaussianAsset(
        means=grid(rng.uniform(-3.0, 3.0, (n, 3)), POSITION_GRID),
        quats=grid(rng.normal(size=(n, 4))),
        log_scales=grid(rng.uniform(-6.0, 0.0, (n, 3))),
        opacity_logits=grid(opacity),
        sh=grid(sh),
    )


def run(*args: Path | str) -> None:
    assert shutil.which("node"), "node is needed to run the reference tool"
    subprocess.run([TOOL, "-q", "-w", *map(str, args)], check=True)


def gz(src: Path, dst: Path) -> None:
    dst.write_bytes(gzip.compress(src.read_bytes(), compresslevel=9, mtime=0))


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for old in OUT.glob("*.gz"):
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        write_ply(make_asset(300, 3, seed=22), t / "sh3.ply")
        write_ply(make_asset(40, 0, seed=23), t / "sh0.ply")
        sh3 = read_ply(t / "sh3.ply")
        first = GaussianAsset(*(x[:64] for x in sh3.tensors().values()))
        write_spz(first, OUT / "ours_sh3_v3.spz", version=3, notes=[])
        write_spz(read_ply(t / "sh0.ply"), OUT / "ours_sh0_v2.spz", version=2, notes=[])
        for name in ("sh3", "sh0"):
            gz(t / f"{name}.ply", OUT / f"{name}.ply.gz")
            run("--spz-version", "3", t / f"{name}.ply", OUT / f"ref_{name}.spz")
            run(t / f"{name}.ply", OUT / f"ref_{name}.compressed.ply")
            decoded = [f"ref_{name}.compressed.ply"] + (["ref_sh0.spz"] if name == "sh0" else [])
            for made in decoded:
                run(OUT / made, t / f"{made}.ply")
                gz(t / f"{made}.ply", OUT / f"{made}.ply.gz")
        for made in ("ours_sh3_v3.spz", "ours_sh0_v2.spz"):
            run(OUT / made, t / f"{made}.ply")
            gz(t / f"{made}.ply", OUT / f"{made}.ply.gz")
    version = subprocess.run([TOOL, "--version"], capture_output=True, text=True)
    print((version.stdout + version.stderr).strip(), "->", OUT)
    print(*(f"{p.name} {p.stat().st_size}" for p in sorted(OUT.iterdir())), sep="\n")
    print("total", sum(p.stat().st_size for p in OUT.iterdir()))


if __name__ == "__main__":
    main()
