"""CUDA-only checks (skipped without a GPU; run by scripts/gpu_check.sh).

* varlen attention on CUDA (flash-attn varlen when installed, else torch's ``varlen_attn``)
  matches the exact per-sequence SDPA path;
* route, attention and reverse_route (and their backward) add no host-device synchronisation
  (CUDA sync debug mode = error);
* the trainer runs on one GPU with NCCL in bf16, and with the default mixed backend
  ("cpu:gloo,cuda:nccl") in FSDP2 bf16 mixed precision with clipping, warm-up and EMA, on CUDA.
"""

from __future__ import annotations

import datetime

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_device_varlen_attention_matches_sdpa():
    """The device kernel (bf16 on CUDA: flash-attn or torch's varlen_attn), with and without
    host offsets, against the exact per-sequence SDPA path (fp32)."""
    from knapformer.attention.varlen import varlen_attention

    torch.manual_seed(0)
    lens = [7, 130, 1, 64]
    T, H, D = sum(lens), 4, 64
    q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    cu_host = [0, *torch.tensor(lens).cumsum(0).tolist()]
    cu = torch.tensor(cu_host, device="cuda")
    ref = varlen_attention(q.float(), k.float(), v.float(), cu, max(lens))
    for host in (None, cu_host):
        out = varlen_attention(q, k, v, cu.to(torch.int32), max(lens), cu_seqlens_host=host)
        torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2)


def test_balanced_ops_add_no_host_sync(tmp_path):
    """route, attention (Ulysses hooks + the varlen attention dispatch),
    reverse_route and their backward, under ``set_sync_debug_mode("error")``, with the
    ``"cpu:gloo,cuda:nccl"`` backend the README asks for (agreement on the CPU): on the second
    step of a plan and, after a new ``plan_step``, on the first (pinned, non-blocking uploads
    of the step's tables). The CPU twin is tests/knapformer/test_kf_host_sync.py."""
    import torch.distributed as dist

    from knapformer.distributed.balancer import Balancer
    from knapformer.planning.cost import CostModel

    torch.cuda.set_device(0)
    dist.init_process_group(
        "cpu:gloo,cuda:nccl",
        init_method=f"file://{tmp_path / 'rdzv'}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        bal = Balancer("g1n1", CostModel.flops(256), num_heads=4, device=torch.device("cuda", 0))
        lens = [100, 37, 512]
        T = sum(lens)
        x = torch.randn(T, 4 * 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        pos = torch.arange(T, device="cuda")

        def layer() -> torch.Tensor:
            y, p = bal.route(x, pos)
            q = (y + p[:, None].to(y.dtype)).view(T, 4, 64)
            a = bal.attention(q, q, q)
            z = bal.reverse_route(a.reshape(T, -1))
            z.float().square().sum().backward()
            return z

        bal.plan_step(lens)
        layer()  # warm-up (kernels, allocator, NCCL communicator)
        torch.cuda.synchronize()
        for new_plan in (False, True):
            if new_plan:
                bal.plan_step(lens)  # host only: the tables are uploaded by the next call
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                z = layer()
            finally:
                torch.cuda.set_sync_debug_mode("default")
            assert z.shape == (T, 4 * 64)
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


def test_trainer_runs_mixed_precision_on_the_mixed_backend(tmp_path):
    import torch.distributed as dist

    from knapformer.train.config import build_config
    from knapformer.train.loop import train
    from knapformer.train.runtime import default_backend, run_device

    torch.cuda.set_device(0)
    dist.init_process_group(
        default_backend(True),
        init_method=f"file://{tmp_path / 'rdzv'}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        assert run_device().type == "cuda"  # chosen from the group's backends, not its name
        train_cfg = {"steps": 4, "mixed_precision": "bf16", "grad_clip": 1.0}
        train_cfg |= {"warmup_steps": 2, "lr_schedule": "cosine", "ema_decay": 0.9}
        cfg = build_config(
            {
                "model": {"preset": "cpu"},
                "data": {"codes": "g1b4i256f1s0"},
                "train": train_cfg,
                "balance": {"balancer": "auto"},
                "log": {"progress": False},
            }
        )
        recs = train(cfg)
    finally:
        dist.destroy_process_group()
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    assert all(torch.isfinite(torch.tensor([r["loss"], r["grad_norm"]])).all() for r in recs)
    assert recs[0]["lr"] == pytest.approx(0.5e-3)
