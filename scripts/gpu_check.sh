#!/usr/bin/env bash
# GPU check for knapformer on ONE GPU, at most ~8 minutes; the last line is a one-line JSON
# summary ({"ok": ..., ...}).
#
#   bash scripts/gpu_check.sh            # uses $PYTHON, else .venv/bin/python, else python3
#
# 1. prerequisites, checked first; every missing one is named and the script exits 2:
#    python, torch >= 2.6 with CUDA, a visible GPU, pytest, and flash-attn or torch >= 2.11
#    (varlen attention without a host sync);
# 2. the CUDA-only tests (tests/**/test_*_cuda.py: varlen attention against exact SDPA, no host
#    sync in route / attention / reverse_route, the trainer on one GPU with NCCL and bf16);
# 3. the MMDiT training step (the trainer's train_step: plan, forward, backward, clipping,
#    AdamW, logging gathers; "cpu:gloo,cuda:nccl", FSDP2 bf16 mixed precision, balancer g1n1)
#    for configs/tiny.toml and for a FLUX-sized model of one double- and one single-stream block
#    (d 3072, 24 heads): tokens/s (median step_wall_s) and MFU (3 x the forward FLOPs
#    24 L d^2 + 4 L^2 d per block, over the GPU's dense bf16 peak: $PEAK_TFLOPS, else a table);
# 4. the host-sync budget: the same steps under torch.cuda.set_sync_debug_mode("warn"), the
#    synchronizing calls counted per step (budget 2; the CPU twin counts 1:
#    tests/knapformer/test_kf_host_sync.py).
# One H200 cannot host several NCCL ranks, so nothing here measures balance.
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$SECONDS
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3 || true)"
if [ -z "$PY" ]; then
  echo "gpu_check: missing: python (set PYTHON or create .venv)" >&2
  echo '{"ok": false, "missing": ["python"]}'
  exit 2
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

# ---- 1. prerequisites ---------------------------------------------------------------------
"$PY" - <<'PYEOF'
import importlib.util
import json
import sys

missing = []
try:
    import torch
except ImportError:
    torch = None
    missing.append("torch (pip install torch, a CUDA build)")
if torch is not None:
    ver = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if ver < (2, 6):
        missing.append(f"torch >= 2.6 (fully_shard), found {torch.__version__}")
    if torch.version.cuda is None:
        missing.append(f"a CUDA build of torch (found {torch.__version__}, CPU only)")
    elif not torch.cuda.is_available():
        missing.append("a CUDA device (torch.cuda.is_available() is False)")
    if importlib.util.find_spec("flash_attn") is None and ver < (2, 11):
        missing.append(f"flash-attn, or torch >= 2.11 for varlen_attn (found {torch.__version__})")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        missing.append("torch.distributed with NCCL")
for mod, why in (("pytest", "pytest (the CUDA-only tests)"), ("knapformer", "knapformer (src/)")):
    if importlib.util.find_spec(mod) is None:
        missing.append(why)
if missing:
    print("gpu_check: missing: " + "; ".join(missing), file=sys.stderr)
    print(json.dumps({"ok": False, "missing": missing}))
    sys.exit(2)
from knapformer.attention.varlen import flash_attn_available

print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
      f"flash-attn: {flash_attn_available()}")
PYEOF
rc=$?
[ $rc -eq 0 ] || exit $rc

# ---- 2. CUDA-only tests ---------------------------------------------------------------------
echo "== CUDA-only tests"
mapfile -t CUDA_TESTS < <(find tests -name 'test_*_cuda.py' | sort)
timeout 240 "$PY" -m pytest -p no:xdist -q -p no:cacheprovider "${CUDA_TESTS[@]}"
TESTS_RC=$?

# ---- 3 + 4. training step: tokens/s, MFU, host syncs ------------------------------------------
echo "== MMDiT training step on one GPU (tokens/s, MFU, host syncs per step)"
SUMMARY=$(TESTS_RC=$TESTS_RC T0=$T0 timeout 200 "$PY" - <<'PYEOF'
import json
import os
import tempfile
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from knapformer.calibration.clock import clock_for
from knapformer.train.config import load_config
from knapformer.train.costs import flops_cost
from knapformer.train.step import build_run, mixture, train_step

BUDGET = 2
PEAK = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "A100": 312e12, "L40S": 362e12}
name = torch.cuda.get_device_name(0)
peak = float(os.environ.get("PEAK_TFLOPS", 0)) * 1e12 or next(
    (v for k, v in PEAK.items() if k in name), 0.0
)
torch.cuda.set_device(0)
dev = torch.device("cuda", 0)
dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"file://{tempfile.mkdtemp()}/rdzv",
                        rank=0, world_size=1)
mesh = init_device_mesh("cuda", (1,), mesh_dim_names=("dp",))
common = {"train.mixed_precision": "bf16", "train.grad_clip": 1.0, "balance.balancer": "g1n1",
          "balance.cost": "flops", "log.progress": False}
cases = {
    # the shipped tiny model on its heavier rank's data (one 68-frame video: ~1.3k tokens)
    "tiny": {"data.codes": "g1b1i128f68s1"},
    "flux_block": {"model.preset": "flux", "model.depth_double": 1, "model.depth_single": 1,
                   "model.d_model": 3072, "model.num_heads": 24, "model.axes_dim": [16, 56, 56],
                   "model.patch_dim": 64, "model.text_dim": 4096, "model.pooled_dim": 768,
                   "model.time_dim": 256, "data.codes": "g1b2i1024f1s0",
                   "data.text_tokens_max": 256},
}
out = {}
syncs = []
for case, over in cases.items():
    cfg = load_config("configs/tiny.toml", {**common, **over})
    mcfg = cfg.model_config()
    model, bal, optim = build_run(cfg, flops_cost(mcfg), mesh, dev)
    data = mixture(cfg, mcfg, 1)
    clock = clock_for(dev)
    walls, toks, flops = [], [], []
    for step in range(1, 9):
        tb = data.batch(step, 0)
        lens = np.asarray(tb.batch.seq_lens, dtype=np.float64)
        counting = step > 2  # warm-up first (kernels, allocator, communicators)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if counting:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                rec = train_step(model, bal, optim, tb, step, bal.cost, clock, dev, lr=1e-4,
                                 grad_clip=1.0)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        if counting:
            syncs.append(sum("synchroniz" in str(w.message) for w in caught))
            walls.append(rec["step_wall_s"])
            toks.append(float(lens.sum()))
            blocks = mcfg.depth_double + mcfg.depth_single
            d = mcfg.d_model
            flops.append(3.0 * blocks * float(np.sum(24 * lens * d * d + 4 * lens**2 * d)))
    s = float(np.median(walls))
    out[case] = {
        "d_model": mcfg.d_model, "blocks": mcfg.depth_double + mcfg.depth_single,
        "tokens_per_step": float(np.median(toks)), "step_wall_s": s,
        "tokens_per_s": float(np.median(toks)) / s,
        "tflops": float(np.median(flops)) / s / 1e12,
        "mfu": float(np.median(flops)) / s / peak if peak else None,
        "loss": rec["loss"],
    }
    print(f"{case}: {out[case]}", flush=True)
    del model, bal, optim
    torch.cuda.empty_cache()
dist.destroy_process_group()
tests_ok = os.environ["TESTS_RC"] == "0"
summary = {
    "ok": tests_ok and max(syncs) <= BUDGET,
    "gpu": name, "torch": torch.__version__, "tests_passed": tests_ok,
    "syncs_per_step_max": max(syncs), "sync_budget": BUDGET, **out,
    "elapsed_s": None,
}
print("SUMMARY " + json.dumps(summary))
PYEOF
)
STEP_RC=$?
echo "$SUMMARY" | grep -v '^SUMMARY ' || true
LINE=$(echo "$SUMMARY" | grep '^SUMMARY ' | sed 's/^SUMMARY //')
if [ -z "$LINE" ]; then
  echo "{\"ok\": false, \"tests_passed\": $([ $TESTS_RC -eq 0 ] && echo true || echo false), \"step_check_rc\": $STEP_RC, \"elapsed_s\": $((SECONDS - T0))}"
  exit 1
fi
echo "$LINE" | sed "s/\"elapsed_s\": null/\"elapsed_s\": $((SECONDS - T0))/"
echo "$LINE" | grep -q '"ok": true' || exit 1
