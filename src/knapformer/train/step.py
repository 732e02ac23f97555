"""One training step and what it is built from: model + balancer + optimiser, LR schedule, clipping.

Shared by the trainer (:mod:`knapformer.train.loop`) and the in-place cost measurements
(:mod:`knapformer.train.costs`), which run the same steps; it imports neither of them, so the
modules of ``knapformer.train`` form no import circle.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from knapformer.calibration.clock import Clock
from knapformer.data.synthetic import SyntheticMixture, TrainBatch
from knapformer.models.host import to_device
from knapformer.planning.cost import CostModel
from knapformer.train.config import TrainConfig, TrainLoopConfig
from knapformer.train.refit import rank_features

if TYPE_CHECKING:
    from knapformer.train.ema import EMA

__all__ = [
    "DTYPES",
    "build_run",
    "clip_grad_norm",
    "lr_at",
    "mixed_precision_policy",
    "mixture",
    "train_step",
]

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def mixture(cfg: TrainConfig, mcfg: Any, world: int) -> SyntheticMixture:
    """The synthetic data the config asks for, for `world` ranks."""
    return SyntheticMixture(
        cfg.data.codes,
        mcfg,
        world,
        text_tokens_max=cfg.data.text_tokens_max,
        patch_px=cfg.data.patch_px,
        seed=cfg.data.seed,
    )


def lr_at(step: int, t: TrainLoopConfig) -> float:
    """The learning rate of 1-based ``step``: linear warm-up to ``t.lr`` over ``warmup_steps``,
    then ``lr_schedule`` over the remaining steps.

    A pure function of the step (no scheduler state), so a resumed run uses the same rates.
    Warm-up starts at ``lr / warmup_steps`` (never a wasted step at 0); the decay starts at the
    full rate and ends one decrement above 0 at ``t.steps`` (the last step still learns).
    """
    if step <= t.warmup_steps:
        return t.lr * step / t.warmup_steps
    if t.lr_schedule == "constant":
        return t.lr
    span = max(t.steps - t.warmup_steps, 1)
    progress = min((step - t.warmup_steps - 1) / span, 1.0)
    if t.lr_schedule == "linear":
        return t.lr * (1.0 - progress)
    return t.lr * 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Global L2 norm of the gradients (over every shard: FSDP2 gradients are DTensors), and
    clip them to ``max_norm`` when it is > 0. Returns the norm *before* clipping (a tensor, so
    reading it is left to the caller's one host transfer per step)."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    if isinstance(norm, DTensor):  # a partial norm per shard: reduce it over the mesh
        norm = norm.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def mixed_precision_policy(t: TrainLoopConfig) -> Any:
    """FSDP2 policy for ``mixed_precision``: bf16 parameters for compute (all-gathered in
    bf16), fp32 sharded master weights (what the optimiser holds) and fp32 gradient
    reduction. Inputs are not cast by FSDP: the model casts its own inputs, so the timestep
    and RoPE tables stay fp32 (see :class:`~knapformer.models.mmdit.MMDiT`)."""
    if t.mixed_precision == "none":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False
    )


def build_run(
    cfg: TrainConfig, cost: CostModel, mesh: Any, device: torch.device
) -> tuple[torch.nn.Module, Any, torch.optim.Optimizer]:
    """Model (seeded init), balancer (``cfg.balance.balancer``; None for ``none``), parallelized
    over ``mesh``, and its optimiser. Collective (balancer construction, FSDP)."""
    from knapformer.distributed.balancer import Balancer
    from knapformer.distributed.parallelize import parallelize
    from knapformer.models.mmdit import MMDiT

    mcfg = cfg.model_config()
    torch.manual_seed(cfg.train.seed)
    model = MMDiT(mcfg).to(device=device, dtype=DTYPES[cfg.train.dtype])
    spec = cfg.balance.balancer.strip()
    balancer = None
    if spec.lower() != "none":
        balancer = Balancer(
            "auto" if spec.lower() == "auto" else spec,
            cost,
            num_heads=mcfg.num_heads,
            solver=cfg.balance.solver,
            group=mesh,
        )
    parallelize(
        model,
        mesh,
        balancer,
        activation_checkpointing=cfg.train.activation_checkpointing,
        mp_policy=mixed_precision_policy(cfg.train),
    )
    optim = torch.optim.AdamW(
        model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay
    )
    return model, balancer, optim


def _host_rows(values: list[float], device: torch.device) -> np.ndarray:
    """``[world, k]``: every rank's host ``values``. A CPU collective where the default group
    has a CPU backend (gloo, ``"cpu:gloo,cuda:nccl"``), so it never waits for the device;
    through ``device`` otherwise (plain ``"nccl"``: one more host read)."""
    from knapformer.distributed.groups import has_cpu_backend

    dev = torch.device("cpu") if has_cpu_backend(None) else device
    t = torch.tensor(values, dtype=torch.float64, device=dev)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return torch.stack(out).cpu().numpy()


def train_step(
    model: torch.nn.Module,
    balancer: Any,
    optim: torch.optim.Optimizer,
    tb: TrainBatch,
    step: int,
    cost: CostModel,
    clock: Clock,
    device: torch.device,
    *,
    lr: float | None = None,
    grad_clip: float = 0.0,
    ema: EMA | None = None,
) -> dict[str, Any]:
    """One step on every rank (collective): plan, forward + backward, gradient clipping,
    optimiser step at ``lr`` (None: the optimiser's own), EMA update.

    Returns the step's record (the same on every rank): the global loss, the learning rate,
    the global gradient norm before clipping, ``step_wall_s`` (the slowest rank's wall time
    from the step's start to the end of its optimiser step, communication included: what a
    training step costs), ``rank_busy_s`` (each rank's own forward + backward work on
    ``clock``: thread CPU time on CPU, CUDA-event time less the balancer's collectives on
    GPU), tokens, the layout and the modelled per-rank loads (``*_max_over_mean`` share the
    unbalanced mean as denominator, as :class:`~knapformer.planning.plan.Plan` does).

    Device data is read back once (the gathered loss/norm row; on CUDA that read also makes the
    clock's events readable); the visual-token count and the timings travel as host data.
    """
    world = dist.get_world_size()
    start = clock.mark()
    batch, target = tb.batch.to(device), to_device(tb.target, device)  # (CUDA: non-blocking)
    t_plan = time.perf_counter()
    plan = balancer.plan_step(batch.seq_lens) if balancer is not None else None
    plan_step_ms = (time.perf_counter() - t_plan) * 1e3
    n_vis = float(_host_rows([float(target.numel())], device)[:, 0].sum())
    with clock.tracking():
        busy0 = clock.mark()
        pred = model(batch)
        wide = torch.promote_types(pred.dtype, torch.float32)  # bf16 -> fp32; float64 stays
        sq = (pred.to(wide) - target.to(wide)).pow(2).sum()
        (sq * (world / n_vis)).backward()  # FSDP averages: the sum over ranks is d(mean loss)
        busy1 = clock.mark()
    if lr is not None:
        for group in optim.param_groups:
            group["lr"] = lr
    grad_norm = clip_grad_norm([p for g in optim.param_groups for p in g["params"]], grad_clip)
    optim.step()
    optim.zero_grad(set_to_none=True)
    if ema is not None:
        ema.update(model)
    end = clock.mark()
    tokens = balancer.tables.num_balanced_tokens if plan is not None else batch.num_tokens
    # Modelled per-rank step times over the whole world: the planner's load plus the fixed costs
    # a rank pays whatever it holds (``CostModel.rank_time``: f, and u for a rank of a g > 1 bag).
    # A replicated layout's plan covers only this rank's replica (contiguous blocks of ranks).
    before = cost.rank_time(float(np.sum(cost.t(np.asarray(batch.seq_lens, dtype=np.float64)))))
    after = before
    if plan is not None:
        loads = np.asarray(plan.load_after, dtype=np.float64)
        after = cost.rank_time(float(loads[balancer.rank % loads.size]), balancer.bag_size)
    bag = balancer.bag_size if plan is not None else 1
    if plan is not None:  # the basis of this rank's modelled time (for the online refit)
        lay = plan.layout
        mine = lay.bag_of_rank[balancer.rank % lay.world_size]
        feats = rank_features(plan.lengths[plan.bag == mine], lay.bag_sizes[mine])
    else:
        feats = rank_features(np.asarray(batch.seq_lens), 1)
    # Device values (loss, gradient norm) in one gather and one read; host values apart.
    norm = grad_norm.detach().to(torch.float64)
    if norm.device != sq.device:  # (the norm of no gradients is a CPU zero)
        norm = norm.to(sq.device)
    dev_row = torch.stack([sq.detach().to(torch.float64), norm])
    dev_rows = [torch.empty_like(dev_row) for _ in range(world)]
    dist.all_gather(dev_rows, dev_row)
    dv = torch.stack(dev_rows).cpu().numpy()  # the step's one read of device data
    # (on CUDA that read waited for the stream, so the clock's events are done)
    host = [float(tokens), before, after, float(bag), *(float(x) for x in feats)]
    host += [clock.busy_s(busy0, busy1), clock.wall_s(start, end)]
    st = _host_rows(host, device)
    load_before, load_after = st[:, 1], st[:, 2]
    mean = float(load_before.mean()) or 1.0
    extra: dict[str, Any] = {}
    if plan is not None:
        extra = {
            "modelled_speedup": float(load_before.max() / load_after.max()),
            "modelled_makespan": float(load_after.max()),
            "modelled_unbalanced_makespan": float(load_before.max()),
            "lower_bound_over_mean": float(plan.lower_bound_over_mean),  # this rank's replica
            "tokens_moved_fraction": float(plan.tokens_moved_fraction),
        }
    return {
        "step": step,
        "loss": float(dv[:, 0].sum() / n_vis),
        "lr": float(optim.param_groups[0]["lr"]),
        "grad_norm": float(dv[0, 1]),  # the same on every rank (a global norm)
        "step_wall_s": float(st[:, -1].max()),
        "rank_busy_s": st[:, -2].tolist(),
        "rank_tokens": [int(x) for x in st[:, 0]],
        "layout": balancer.layout_spec if balancer is not None else "none",
        "plan_ms": float(plan.plan_ms) if plan is not None else 0.0,
        "plan_step_ms": plan_step_ms,
        "modelled_max_over_mean": float(load_after.max()) / mean,
        "modelled_unbalanced_max_over_mean": float(load_before.max()) / mean,
        "rank_modelled_load": load_after.tolist(),
        "rank_bag_size": [int(x) for x in st[:, 3]],
        "rank_cost_features": st[:, 4:-2].tolist(),  # [rank][a, b, c, e, f, u] basis
        **extra,
    }
