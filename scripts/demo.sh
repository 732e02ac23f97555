#!/usr/bin/env bash
# Set up .venv (idempotent) and run the main demo of both systems on shipped defaults.
# Output goes to ./out/demo (PNG renders, plans, plots).
set -euo pipefail
cd "$(dirname "$0")/.."
# OpenMP threads (torch and numba) must sleep, not spin, while waiting: spinning threads of
# parallel test workers starve each other on a 2-core machine.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
bash scripts/setup.sh "knapformer,splatpainter,dev"
V=.venv/bin
OUT=out/demo
mkdir -p "$OUT"
KF_DATA=src/knapformer/data
SP_DATA=src/splatpainter/data

echo
echo "=== knapformer: plan one step of the paper's mixed-resolution mixture on 32 GPUs ==="
for solver in reference ours; do
    echo "--- solver: $solver, spec g1n16+g2n4+g4n2 ---"
    "$V/knapformer" plan --lengths "$KF_DATA/mixres_32gpu.json" --spec g1n16+g2n4+g4n2 --solver "$solver"
done

echo
echo "=== knapformer: simulate 20 steps of the joint image-video mixture, auto layout ==="
"$V/knapformer" simulate --mixture joint --gpus 32 --steps 20 --spec auto --plot-dir "$OUT/knapformer"

echo
echo "=== splatpainter: asset info, turntable render, and a paint-over edit ==="
"$V/splatpainter" info "$SP_DATA/demo.ply"
"$V/splatpainter" render "$SP_DATA/demo.ply" --orbit 4 --size 256x256 --out "$OUT/splatpainter/orbit"
"$V/python" -m splatpainter.demo --out "$OUT/splatpainter/edit"
echo
echo "Demo outputs are in $OUT"
