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

from knapformer.data.synthetic import SyntheticMixture, TrainBatch
from knapformer.planning.cost import CostModel
from knapformer.train.config import TrainConfig, TrainLoopConfig
from knapformer.train.refit import rank_features

if TYPE_CHECKING:
    from knapformer.train.ema import EMA

__all__ = [
    "DTYPES",
    "ThreadClock",
    "build_run",
    "clip_grad_norm",
    "lr_at",
    "mixed_precision_policy",
    "mixture",
    "train_step",
]

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


class ThreadClock:
    """CPU time of this thread and the wall time it was runnable (on CPU or queued for one).

    Blocking in a collective (gloo/NCCL waits sleep) is excluded from both; time lost to other
    processes sharing the cores is in ``wall`` but not in ``cpu``. Linux ``schedstat``; elsewhere
    wall falls back to the plain wall clock. On CUDA the step synchronises the device before
    reading the clock, so ``wall`` then includes the device time (NCCL kernels included).
    """

    _PATH = "/proc/thread-self/schedstat"

    def __init__(self) -> None:
        self.has_schedstat = self._sched() is not None

    def _sched(self) -> float | None:
        try:
            with open(self._PATH) as f:
                run, wait, _ = f.read().split()
            return (int(run) + int(wait)) * 1e-9
        except (OSError, ValueError):
            return None

    def now(self) -> tuple[float, float]:
        s = self._sched() if self.has_schedstat else None
        return time.thread_time(), (s if s is not None else time.perf_counter())


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


def train_step(
    model: torch.nn.Module,
    balancer: Any,
    optim: torch.optim.Optimizer,
    tb: TrainBatch,
    step: int,
    cost: CostModel,
    clock: ThreadClock,
    device: torch.device,
    *,
    lr: float | None = None,
    grad_clip: float = 0.0,
    ema: EMA | None = None,
) -> dict[str, Any]:
    """One step on every rank (collective): plan, timed forward + backward, gradient clipping,
    optimiser step at ``lr`` (None: the optimiser's own), EMA update.

    Returns the step's record (the same on every rank): the global loss, the learning rate,
    the global gradient norm before clipping, per-rank compute times and tokens, the layout and
    the modelled per-rank loads (``*_max_over_mean`` share the unbalanced mean as denominator,
    as :class:`~knapformer.planning.plan.Plan` does).
    """
    world = dist.get_world_size()
    batch, target = tb.batch.to(device), tb.target.to(device)
    t_plan = time.perf_counter()
    plan = balancer.plan_step(batch.seq_lens) if balancer is not None else None
    plan_step_ms = (time.perf_counter() - t_plan) * 1e3
    n_vis = torch.tensor([target.numel()], dtype=torch.float64, device=device)
    dist.all_reduce(n_vis)
    cpu0, wall0 = clock.now()
    pred = model(batch)
    wide = torch.promote_types(pred.dtype, torch.float32)  # bf16 -> fp32; float64 stays
    sq = (pred.to(wide) - target.to(wide)).pow(2).sum()
    (sq * (world / n_vis[0])).backward()  # FSDP averages: the sum over ranks is d(mean loss)
    if device.type == "cuda":  # pragma: no cover - CUDA only; the device time belongs to the step
        torch.cuda.synchronize(device)
    cpu1, wall1 = clock.now()
    if lr is not None:
        for group in optim.param_groups:
            group["lr"] = lr
    grad_norm = clip_grad_norm([p for g in optim.param_groups for p in g["params"]], grad_clip)
    optim.step()
    optim.zero_grad(set_to_none=True)
    if ema is not None:
        ema.update(model)
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
    stats = torch.tensor(
        [cpu1 - cpu0, wall1 - wall0, float(tokens), 0.0, before, after, bag]
        + [float(x) for x in feats],
        dtype=torch.float64,
        device=device,
    )
    stats[3] = sq.detach()  # (device values join the one gather: no extra host sync)
    norm_row = grad_norm.detach().to(device=device, dtype=torch.float64).reshape(1)
    stats = torch.cat([stats, norm_row])
    allstats = [torch.empty_like(stats) for _ in range(world)]
    dist.all_gather(allstats, stats)
    st = torch.stack(allstats).cpu().numpy()
    load_before, load_after = st[:, 4], st[:, 5]
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
        "loss": float(st[:, 3].sum() / float(n_vis[0])),
        "lr": float(optim.param_groups[0]["lr"]),
        "grad_norm": float(st[0, -1]),  # the same on every rank (a global norm)
        "rank_compute_cpu_s": st[:, 0].tolist(),
        "rank_compute_wall_s": st[:, 1].tolist(),
        "rank_tokens": [int(x) for x in st[:, 2]],
        "layout": balancer.layout_spec if balancer is not None else "none",
        "plan_ms": float(plan.plan_ms) if plan is not None else 0.0,
        "plan_step_ms": plan_step_ms,
        "modelled_max_over_mean": float(load_after.max()) / mean,
        "modelled_unbalanced_max_over_mean": float(load_before.max()) / mean,
        "rank_modelled_load": load_after.tolist(),
        "rank_bag_size": [int(x) for x in st[:, 6]],
        "rank_cost_features": st[:, 7:-1].tolist(),  # [rank][a, b, c, e, f, u] basis
        **extra,
    }
