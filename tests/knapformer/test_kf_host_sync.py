"""route, reverse_route and attention never read device data back on the host.

On CUDA such a read (``.item()``, ``.tolist()``, ``.cpu()``, ``bool(t)``, ``nonzero``, ...) waits
for every queued kernel. Without a GPU, a tensor subclass stands in for device memory: the
step's index tables (what :func:`~knapformer.distributed.balancer.upload_table` would put on the
device) and the model's inputs are ``DeviceTensor``s, every result computed from them is one too,
and every host read of one is recorded. Real gloo ranks run the balanced ops, forward and
backward, and parallelize's dispatcher (routing, conditioning gather, routing back); the records
must stay empty. A control shows that the recorder does
see such a read (varlen attention without the host offsets copies ``cu_seqlens`` back).

A whole ``train_step`` (plan, forward, backward, clipping, AdamW, EMA, the record) reads the
device at most ``STEP_BUDGET`` times: today once (the gathered loss / gradient-norm row); the
plan's gathers, the visual-token count and the timings are host data on CPU collectives.
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
            moved = False  # (a tensor copied to the host is host data from then on)
            if func in host_reads:
                cls.reads.append(name)
                moved = func in (torch.Tensor.cpu, torch.Tensor.tolist, torch.Tensor.numpy)
            elif func is torch.Tensor.to and to_host(args, kwargs):
                cls.reads.append("to(cpu)")
                moved = True
            elif func is torch.Tensor.copy_ and not isinstance(args[0], DeviceTensor):
                cls.reads.append("copy_ to host")
            ret = super().__torch_function__(func, types, args, kwargs)
            if moved and isinstance(ret, DeviceTensor):
                ret = ret.as_subclass(torch.Tensor)
            return ret

    return DeviceTensor


def sync_worker(rank: int, world: int) -> dict:
    import numpy as np
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    import knapformer.distributed.balancer as balancer_mod
    import knapformer.distributed.parallelize as parallelize_mod
    from knapformer.attention.varlen import varlen_attention
    from knapformer.distributed import Balancer
    from knapformer.models.mmdit import MMDiT, TokenState, mmdit_config
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
            z = bal.reverse_route(a.reshape(-1, 32))
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


# ---- a whole training step ------------------------------------------------------------------

#: Host reads of device data a training step may make (the plan's gathers included): the
#: trainer reads its gathered loss / gradient-norm row once; everything else is host data.
STEP_BUDGET = 2


def step_worker(rank: int, world: int, raw: dict) -> dict:
    """``train_step`` (plan, forward, backward, clipping, AdamW, EMA, the record's gathers) with
    the batch, the target and every uploaded host table standing in for device memory."""
    import dataclasses

    import torch
    from torch.distributed.device_mesh import init_device_mesh

    import knapformer.distributed.balancer as balancer_mod
    import knapformer.distributed.parallelize as parallelize_mod
    import knapformer.models.mmdit as mmdit_mod
    from knapformer.calibration.clock import CPUClock
    from knapformer.data.synthetic import TrainBatch
    from knapformer.train.config import apply_overrides, build_config
    from knapformer.train.costs import flops_cost
    from knapformer.train.ema import EMA
    from knapformer.train.step import build_run, mixture, train_step

    DeviceTensor = _device_tensor_class()
    plain_upload = mmdit_mod.upload_table

    def upload(arr, device, dtype=torch.int64):
        return plain_upload(arr, device, dtype).as_subclass(DeviceTensor)

    for mod in (balancer_mod, parallelize_mod, mmdit_mod):
        mod.upload_table = upload
    cpu = torch.device("cpu")
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    out: dict = {}
    for balancer in ("none", "g2n1", "auto"):
        cfg = build_config(apply_overrides(raw, {"balance.balancer": balancer}))
        model, bal, optim = build_run(cfg, flops_cost(cfg.model_config()), mesh, cpu)
        ema = EMA(model, 0.9)
        data = mixture(cfg, cfg.model_config(), world)
        for step in (1, 2):
            tb = data.batch(step, rank)
            b = tb.batch
            host_mask = b.is_img.numpy().copy()  # what the loader knows on the host
            dev = {f.name: getattr(b, f.name) for f in dataclasses.fields(b)}
            for k, v in dev.items():
                if isinstance(v, torch.Tensor):
                    dev[k] = v.as_subclass(DeviceTensor)
            batch = type(b)(**{**dev, "is_img_host": host_mask})
            tb = TrainBatch(batch=batch, target=tb.target.as_subclass(DeviceTensor))
            DeviceTensor.reads.clear()
            rec = train_step(
                model, bal, optim, tb, step, bal.cost if bal else flops_cost(cfg.model_config()),
                CPUClock(), cpu, lr=1e-3, grad_clip=1.0, ema=ema,
            )  # fmt: skip
            out[f"{balancer} step {step}"] = list(DeviceTensor.reads)
            assert rec["layout"] != "none" or balancer == "none"
        # control: the forward without the host copy of the modality mask finds the streams
        # with nonzero on the device, which the recorder sees
        if bal is not None:
            bal.plan_step(b.seq_lens)
        DeviceTensor.reads.clear()
        model(type(b)(**{**dev, "is_img_host": None}))
        out[f"{balancer} control"] = list(DeviceTensor.reads)
    return out


@pytest.mark.timeout(180)
def test_training_step_reads_the_device_at_most_twice(tmp_path):
    from _dist_utils import TINY_TRAIN

    res = run_workers(__file__, "step_worker", 2, tmp_path, args=(TINY_TRAIN,), timeout=150)
    for rank, out in enumerate(res):
        runs = ("none", "g2n1", "auto")
        assert set(out) == {f"{b} {s}" for b in runs for s in ("step 1", "step 2", "control")}
        for what, reads in out.items():
            if what.endswith("control"):
                assert reads.count("nonzero") >= 2, f"rank {rank}: the recorder missed {what}"
            else:  # (at least the one read of the loss row: the recorder sees the step)
                assert 1 <= len(reads) <= STEP_BUDGET, f"rank {rank}, {what}: {reads}"
