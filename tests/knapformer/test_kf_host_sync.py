"""route, reverse_route and attention never read device data back on the host.

On CUDA such a read (``.item()``, ``.tolist()``, ``.cpu()``, ``bool(t)``, ``nonzero``, ...) waits
for every queued kernel. Without a GPU, a tensor subclass stands in for device memory: the
step's index tables (what :func:`~knapformer.distributed.balancer.upload_table` would put on the
device) and the model's inputs are ``DeviceTensor``s, every result computed from them is one too,
and every host read of one is recorded. Real gloo ranks run the balanced ops, forward and
backward, and parallelize's dispatcher (routing, conditioning gather, routing back); the records
must stay empty. A control shows that the recorder does
see such a read (varlen attention without the host offsets copies ``cu_seqlens`` back).
(``scripts/gpu_check.sh`` runs the same paths on CUDA under ``set_sync_debug_mode("error")``.)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import ClassVar

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _dist_utils import run_workers


def _device_tensor_class():
    """A ``torch.Tensor`` subclass recording host reads of its values (class attribute)."""
    import torch

    host_reads = {
        torch.Tensor.item,
        torch.Tensor.tolist,
        torch.Tensor.numpy,
        torch.Tensor.cpu,
        torch.Tensor.__bool__,
        torch.Tensor.__int__,
        torch.Tensor.__float__,
        torch.Tensor.__index__,
        torch.Tensor.__array__,
        torch.Tensor.nonzero,
        torch.nonzero,
        torch.Tensor.masked_select,
        torch.masked_select,
        torch.Tensor.unique,
        torch.unique,
        torch.Tensor.__repr__,
    }

    def to_host(args: tuple, kwargs: dict) -> bool:
        targets = [*args[1:], kwargs.get("device"), kwargs.get("other")]
        for t in targets:
            if isinstance(t, str) and t.startswith("cpu"):
                return True
            if isinstance(t, torch.device) and t.type == "cpu":
                return True
            if isinstance(t, torch.Tensor) and not isinstance(t, DeviceTensor):
                return True
        return False

    class DeviceTensor(torch.Tensor):
        reads: ClassVar[list[str]] = []

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", repr(func))
            if func in host_reads:
                cls.reads.append(name)
            elif func is torch.Tensor.to and to_host(args, kwargs):
                cls.reads.append("to(cpu)")
            elif func is torch.Tensor.copy_ and not isinstance(args[0], DeviceTensor):
                cls.reads.append("copy_ to host")
            return super().__torch_function__(func, types, args, kwargs)

    return DeviceTensor


def sync_worker(rank: int, world: int) -> dict:
    import numpy as np
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    import knapformer.distributed.balancer as balancer_mod
    import knapformer.distributed.parallelize as parallelize_mod
    from knapformer.attention.varlen import varlen_attention
    from knapformer.distributed import Balancer
    from knapformer.models.mmdit import MMDiT, TokenState, device_varlen_attention, mmdit_config
    from knapformer.planning.cost import CostModel

    DeviceTensor = _device_tensor_class()
    plain_upload = balancer_mod.upload_table

    def upload(arr: np.ndarray, device: torch.device, dtype: torch.dtype = torch.int64):
        return plain_upload(arr, device, dtype).as_subclass(DeviceTensor)

    balancer_mod.upload_table = upload
    parallelize_mod.upload_table = upload
    out: dict = {}
    gen = torch.Generator().manual_seed(rank)
    lens = [[37, 5, 12], [60]][rank]
    for spec in ("g1n2", "g2n1"):
        bal = Balancer(spec, CostModel.flops(32), num_heads=4)
        for step in range(2):  # the second step plans again: fresh tables, uploaded again
            bal.plan_step(lens)
            x = torch.randn(sum(lens), 32, generator=gen).as_subclass(DeviceTensor)
            x.requires_grad_(True)
            pos = torch.arange(sum(lens)).as_subclass(DeviceTensor)
            DeviceTensor.reads.clear()
            y, p = bal.route(x, pos)
            q = (y + p[:, None].to(y.dtype)).view(-1, 4, 8)
            a = bal.attention(q, q, q)
            b = bal.attention(q, q, q, attn_fn=device_varlen_attention)
            z = bal.reverse_route((a + b).reshape(-1, 32))
            z.square().sum().backward()
            out[f"{spec} step {step}"] = list(DeviceTensor.reads)
        # control: the same attention without the host offsets reads cu_seqlens back
        DeviceTensor.reads.clear()
        pre = bal.pre_attn(q, q, q)
        varlen_attention(pre.q, pre.k, pre.v, pre.cu_seqlens, pre.max_seqlen)
        out[f"{spec} control"] = list(DeviceTensor.reads)

    # parallelize's dispatcher: tokens and per-token features routed in, the per-sequence
    # conditioning delivered to every token, the output routed back
    cfg = mmdit_config("tiny")
    torch.manual_seed(0)
    model = MMDiT(cfg)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    bal = Balancer("g2n1", CostModel.flops(32), num_heads=cfg.num_heads, group=mesh)
    parallelize_mod.parallelize(model, mesh, bal, fsdp=False)
    T = sum(lens)
    dev = lambda t: t.as_subclass(DeviceTensor)  # noqa: E731
    state = TokenState(
        h=dev(torch.randn(T, cfg.d_model, generator=gen)).requires_grad_(True),
        positions=dev(torch.randint(0, 9, (T, 3), generator=gen)),
        kind=dev(torch.randint(0, 2, (T,), generator=gen)),
        seq_ids=dev(torch.arange(len(lens)).repeat_interleave(torch.tensor(lens))),
        seq_lens=lens,
        cond=dev(torch.randn(len(lens), 5, generator=gen)),
    )
    bal.plan_step(lens)
    DeviceTensor.reads.clear()
    d = model.dispatcher.dispatch(state)
    y = d.h * d.cond.index_select(0, d.seq_index)[:, :1] + d.positions[:, :1] + d.kind[:, None]
    model.dispatcher.combine(y).sum().backward()
    out["dispatch + combine"] = list(DeviceTensor.reads)
    return out


@pytest.mark.timeout(180)
def test_balanced_ops_read_nothing_back_from_the_device(tmp_path):
    res = run_workers(__file__, "sync_worker", 2, tmp_path, timeout=150)
    for rank, out in enumerate(res):
        for what, reads in out.items():
            if what.endswith("control"):
                assert reads, f"rank {rank}: the recorder missed a host read ({what})"
            else:
                assert reads == [], f"rank {rank}, {what}: host reads of device data {reads}"
