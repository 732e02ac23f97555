"""CUDA-only checks (skipped without a GPU; run by scripts/gpu_check.sh).

* varlen attention on CUDA (flash-attn varlen when installed, else torch's ``varlen_attn``)
  matches the exact per-sequence SDPA path;
* a balanced attention call adds no host-device synchronisation (CUDA sync debug mode = error);
* the trainer runs on one GPU with NCCL in bf16.
"""

from __future__ import annotations

import datetime

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_device_varlen_attention_matches_sdpa():
    from knapformer.attention.varlen import varlen_attention
    from knapformer.models.mmdit import device_varlen_attention

    torch.manual_seed(0)
    lens = [7, 130, 1, 64]
    T, H, D = sum(lens), 4, 64
    q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda")
    out = device_varlen_attention(q, k, v, cu.to(torch.int32), max(lens))
    ref = varlen_attention(q.float(), k.float(), v.float(), cu, max(lens))
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2)


def test_balanced_attention_adds_no_host_sync(tmp_path):
    import torch.distributed as dist

    from knapformer.distributed.balancer import Balancer
    from knapformer.distributed.parallelize import BalancedAttention
    from knapformer.planning.cost import CostModel

    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl",
        init_method=f"file://{tmp_path / 'rdzv'}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        bal = Balancer("g1n1", CostModel.flops(256), num_heads=4)
        lens = [100, 37, 512]
        bal.plan_step(lens)
        attn = BalancedAttention(bal)
        q, k, v = (
            torch.randn(sum(lens), 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)
        )
        attn(q, k, v)  # first call of the step builds (and caches) the index tensors
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            out = attn(q, k, v)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert out.shape == q.shape
    finally:
        dist.destroy_process_group()


def test_trainer_runs_on_one_gpu_with_nccl(tmp_path):
    import torch.distributed as dist

    from knapformer.train.config import build_config
    from knapformer.train.loop import train

    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl",
        init_method=f"file://{tmp_path / 'rdzv'}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        cfg = build_config(
            {
                "model": {"preset": "cpu"},
                "data": {"codes": "g1b4i256f1s0"},
                "train": {"steps": 3, "dtype": "bfloat16"},
                "balance": {"balancer": "auto"},
                "log": {"progress": False},
            }
        )
        recs = train(cfg)
    finally:
        dist.destroy_process_group()
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in recs)
