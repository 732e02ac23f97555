"""Make docs/painted.png: view 0 of the README render with a pink stroke painted on the box.

This stands in for an artist's brush: `python docs/make_painted.py renders/view_000.png
docs/painted.png`, after `splatpainter render src/splatpainter/data/demo.ply --orbit 4
--size 256x256 --out renders/` (the README's command). Paint lands only on the asset, not on
the black background.
"""

import sys

import numpy as np
from PIL import Image, ImageDraw


def main(src: str, dst: str) -> None:
    view = Image.open(src).convert("RGB")
    stroke = Image.new("L", view.size, 0)
    draw = ImageDraw.Draw(stroke)
    xs = np.linspace(62, 194, 40)
    ys = 176 + 9 * np.sin((xs - 62) / 132 * 2 * np.pi)
    draw.line(list(zip(xs.tolist(), ys.tolist(), strict=True)), fill=255, width=11, joint="curve")
    draw.ellipse((118, 128, 142, 152), fill=255)
    arr = np.asarray(view).astype(np.float32)
    on_asset = arr.max(axis=2) > 12
    m = (np.asarray(stroke) > 0) & on_asset
    arr[m] = (240, 40, 150)
    Image.fromarray(arr.astype(np.uint8)).save(dst)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
