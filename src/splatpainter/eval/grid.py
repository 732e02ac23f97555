"""A picture for a person: one row per seed, columns = edit input, ground truth at a held-out
view, and every method at that same held-out view.  Written as an 8-bit PNG, atomically."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field

import numpy as np
import torch

HEADER_PX = 16  # height of the column-label strip
GAP_PX = 2  # white gap between tiles


@dataclass
class GridRow:
    """The images of one seed: [H, W, 3] floats in [0, 1]."""

    seed: int
    edit_input: torch.Tensor
    ground_truth: torch.Tensor
    methods: dict[str, torch.Tensor] = field(default_factory=dict)
    heldout_index: int = 0


def _to_uint8(img: torch.Tensor) -> np.ndarray:
    return (img.detach().cpu().float().clamp(0, 1).numpy() * 255.0 + 0.5).astype(np.uint8)


def compose_grid(rows: list[GridRow], methods: list[str]):
    """A PIL image: a label strip, then one row of tiles per seed (tiles resized to the first
    ground-truth tile's size)."""
    from PIL import Image, ImageDraw

    if not rows:
        raise ValueError("a grid needs at least one row")
    labels = ["edit input", "ground truth", *methods]
    th, tw = (int(s) for s in rows[0].ground_truth.shape[:2])
    cols = len(labels)
    width = cols * tw + (cols - 1) * GAP_PX
    height = HEADER_PX + len(rows) * (th + GAP_PX)
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    for c, label in enumerate(labels):
        draw.text((c * (tw + GAP_PX) + 2, 2), label[: max(1, tw // 6)], fill=(0, 0, 0))
    for r, row in enumerate(rows):
        missing = [m for m in methods if m not in row.methods]
        if missing:
            raise ValueError(f"grid row of seed {row.seed} has no image for {missing}")
        tiles = [row.edit_input, row.ground_truth, *(row.methods[m] for m in methods)]
        y = HEADER_PX + r * (th + GAP_PX)
        for c, tile in enumerate(tiles):
            im = Image.fromarray(_to_uint8(tile))
            if im.size != (tw, th):
                im = im.resize((tw, th), Image.BILINEAR)
            canvas.paste(im, (c * (tw + GAP_PX), y))
        text = f"seed {row.seed}"
        draw.text((3, y + 3), text, fill=(0, 0, 0))
        draw.text((2, y + 2), text, fill=(255, 255, 255))
    return canvas


def write_grid(path: str | os.PathLike[str], rows: list[GridRow], methods: list[str]) -> None:
    """Compose the grid and write it as a PNG (readers never see a partial file)."""
    from appshell.atomic import atomic_write_bytes

    buf = io.BytesIO()
    compose_grid(rows, methods).save(buf, format="PNG")
    atomic_write_bytes(path, buf.getvalue())
