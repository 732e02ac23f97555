#!/usr/bin/env bash
# Rebuild docs/painted.png and docs/splatpainter_edit.png with the project's own CLI:
# render the shipped demo asset, paint on view 0, edit with the shipped model, render again.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_WAIT_POLICY=PASSIVE
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
splatpainter render src/splatpainter/data/demo.ply --orbit 4 --size 256x256 --out "$work/renders"
python docs/make_painted.py "$work/renders/view_000.png" docs/painted.png
splatpainter edit src/splatpainter/data/demo.ply --view "$work/renders/view_000.json" \
    --image docs/painted.png --out "$work/edited.ply"
splatpainter render "$work/edited.ply" --camera "$work/renders/view_000.json" --out "$work/edited"
splatpainter render "$work/edited.ply" --orbit 8 --size 256x256 --out "$work/orbit"   # view 1: 45 deg
python - "$work" <<'PY'
import sys
from PIL import Image
w = sys.argv[1]
tiles = [f"{w}/renders/view_000.png", "docs/painted.png", f"{w}/edited/view_000.png",
         f"{w}/orbit/view_001.png"]
sheet = Image.new("RGB", (256 * len(tiles), 256))
for i, p in enumerate(tiles):
    sheet.paste(Image.open(p).convert("RGB"), (256 * i, 0))
sheet.save("docs/splatpainter_edit.png")
PY
echo "wrote docs/painted.png and docs/splatpainter_edit.png"
