#!/usr/bin/env bash
# GPU check for knapformer (at most ~8 minutes): every CUDA-only test, then a short timing.
#
#   bash scripts/gpu_check.sh            # uses .venv/bin/python (a CUDA build of torch), else python3
#
# CUDA-only tests live in tests/**/test_*_cuda.py (skipped on machines without a GPU): varlen
# attention on CUDA (flash-attn varlen or torch's varlen_attn) against the exact SDPA path, no
# host-device sync in route, attention and reverse_route (forward and backward, with the same
# plan and right after a new plan_step; CPU twin: tests/knapformer/test_kf_host_sync.py), and the
# trainer on one GPU with NCCL/bf16. Then the planner benchmark's CUDA sync check.
# The timing runs one MMDiT forward+backward per sequence length in bf16 and prints ms and
# achieved TFLOP/s (6 * the paper's per-block FLOP model, so attention is counted).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

"$PY" - <<'PYEOF'
import torch
assert torch.cuda.is_available(), "gpu_check: no CUDA device visible to torch"
from knapformer.attention.varlen import flash_attn_available
print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, flash-attn: {flash_attn_available()}")
PYEOF

echo "== CUDA-only tests"
mapfile -t CUDA_TESTS < <(find tests -name 'test_*_cuda.py' | sort)
timeout 300 "$PY" -m pytest -p no:xdist -q -p no:cacheprovider "${CUDA_TESTS[@]}"

echo "== planner benchmark: CUDA sync check"
timeout 60 "$PY" - <<'PYEOF'
import sys
sys.path.insert(0, "benchmarks")
from planner_speed import cuda_sync_check
status = cuda_sync_check()["status"]
print(status)
assert "sync found" not in status, status
PYEOF

echo "== timing (bf16, one sequence per step)"
timeout 150 "$PY" - <<'PYEOF'
import time
import torch
from knapformer.models.mmdit import MMDiT, PackedBatch, mmdit_config

cfg = mmdit_config("small", depth_double=2, depth_single=4)
dev, dt = torch.device("cuda"), torch.bfloat16
model = MMDiT(cfg).to(dev, dt)
for L in (1024, 4096, 16384):
    n_txt = 256
    side = int(((L - n_txt)) ** 0.5)
    n_img = side * side
    T = n_txt + n_img
    pos = torch.stack(torch.meshgrid(torch.zeros(1, dtype=torch.long), torch.arange(side),
                                     torch.arange(side), indexing="ij"), -1).reshape(-1, 3)
    b = PackedBatch(
        img=torch.randn(n_img, cfg.patch_dim, device=dev, dtype=dt),
        txt=torch.randn(n_txt, cfg.text_dim, device=dev, dtype=dt),
        is_img=(torch.arange(T) >= n_txt).to(dev),
        positions=torch.cat([torch.zeros(n_txt, 3, dtype=torch.long), pos]).to(dev),
        seq_lens=[T], timesteps=torch.rand(1, device=dev, dtype=dt),
        pooled=torch.randn(1, cfg.pooled_dim, device=dev, dtype=dt),
    )
    for i in range(6):
        if i == 2:
            torch.cuda.synchronize(); t0 = time.perf_counter()
        model(b).float().square().mean().backward()
    torch.cuda.synchronize()
    s = (time.perf_counter() - t0) / 4
    blocks = cfg.depth_double + cfg.depth_single
    flops = 3 * blocks * (24 * T * cfg.d_model**2 + 4 * T * T * cfg.d_model)
    print(f"L={T:6d}: {s * 1e3:8.2f} ms fwd+bwd, {flops / s / 1e12:7.1f} TFLOP/s (model FLOPs)")
PYEOF
echo "gpu_check: OK"
