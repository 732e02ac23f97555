"""The training loop of one rank: synthetic mixture -> (balanced) MMDiT -> rectified-flow loss.

Per step every rank: builds its batch (outside the timed region), plans with the balancer
(``plan_step``: two integer all-gathers + the planner), runs forward + backward (timed: thread
CPU time, and the wall time the thread was runnable, so blocked collective waits are excluded),
steps AdamW, and gathers a few numbers so rank 0 can write one JSON record per step. The loss is
the global mean over every visual token and channel, so balanced and unbalanced runs optimise
the same objective and their losses agree to float tolerance.

The cost model in use goes into every checkpoint and a resumed run plans with it (no new
calibration); with ``balance.refit_steps`` it is refitted online from the logged per-rank times
(:mod:`knapformer.train.refit`; rank 0 fits, every rank gets the same model by broadcast).
"""

from __future__ import annotations

import datetime
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from knapformer.data.synthetic import SyntheticMixture, TrainBatch
from knapformer.planning.cost import CostModel
from knapformer.train.config import TrainConfig, check_world
from knapformer.train.refit import CostRefit, rank_features

__all__ = ["ThreadClock", "build_cost", "build_run", "init_distributed", "train", "train_step"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


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


def mixture(cfg, mcfg, world: int) -> SyntheticMixture:
    """The synthetic data the config asks for, for `world` ranks."""
    return SyntheticMixture(
        cfg.data.codes,
        mcfg,
        world,
        text_tokens_max=cfg.data.text_tokens_max,
        patch_px=cfg.data.patch_px,
        seed=cfg.data.seed,
    )


def build_cost(cfg: TrainConfig, log: Callable[[str], None] | None = None) -> tuple[CostModel, Any]:
    """The balancer's cost model; ``calibrate`` runs on rank 0 and is broadcast to the others."""
    from knapformer.train.costs import calibrate_blocks, flops_cost

    mcfg = cfg.model_config()
    kind = cfg.balance.cost
    if kind == "flops":
        return flops_cost(mcfg, cfg.balance.gamma), None
    if kind != "calibrate":
        return CostModel.load(kind), None
    payload: list[Any] = [None]
    if dist.get_rank() == 0:
        world = dist.get_world_size()
        data = mixture(cfg, mcfg, world)
        longest = max(max(data.lengths(s, r)) for s in range(1, 4) for r in range(world))
        bags = [g for g in (1, 2, 4, 8) if g <= world and mcfg.num_heads % g == 0]
        lo = max(bags[-1], 16)
        lengths = np.unique(np.geomspace(lo, max(longest, 4 * lo), 10).astype(int)).tolist()
        costs = calibrate_blocks(
            mcfg, lengths, bags, repeats=5, min_time_s=0.1, dtype=_DTYPES[cfg.train.dtype], log=log
        )
        payload[0] = (costs.total.to_dict(), costs.summary())
    dist.broadcast_object_list(payload, src=0)
    total, summary = payload[0]
    return CostModel.from_dict(total), summary


def init_distributed(timeout_s: float) -> None:
    """From torchrun's environment (``env://``): NCCL when CUDA is present, else gloo."""
    if dist.is_initialized():
        return
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":  # pragma: no cover - CUDA only
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))


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
    model = MMDiT(mcfg).to(device=device, dtype=_DTYPES[cfg.train.dtype])
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
    parallelize(model, mesh, balancer, activation_checkpointing=cfg.train.activation_checkpointing)
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
) -> dict[str, Any]:
    """One step on every rank (collective): plan, timed forward + backward, optimiser step.

    Returns the step's record (the same on every rank): the global loss, per-rank compute
    times and tokens, the layout and the modelled per-rank loads (``*_max_over_mean`` share the
    unbalanced mean as denominator, as :class:`~knapformer.planning.plan.Plan` does).
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
    sq = (pred.float() - target.float()).pow(2).sum()
    (sq * (world / n_vis[0])).backward()  # FSDP averages: the sum over ranks is d(mean loss)
    if device.type == "cuda":  # pragma: no cover - CUDA only; the device time belongs to the step
        torch.cuda.synchronize(device)
    cpu1, wall1 = clock.now()
    optim.step()
    optim.zero_grad(set_to_none=True)
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
        [cpu1 - cpu0, wall1 - wall0, float(tokens), float(sq.detach()), before, after, bag]
        + [float(x) for x in feats],
        dtype=torch.float64,
        device=device,
    )
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
        "rank_cost_features": st[:, 7:].tolist(),  # [rank][a, b, c, e, f, u] basis
        **extra,
    }


def train(cfg: TrainConfig, progress: bool | None = None) -> list[dict[str, Any]]:
    """Run (or resume) training on the initialised process group; rank 0 returns the records."""
    from torch.distributed.device_mesh import init_device_mesh

    from knapformer.train.checkpoint import load_checkpoint, read_trainer_state, save_checkpoint

    init_distributed(cfg.train.timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    check_world(cfg, world)
    torch.set_num_threads(cfg.train.threads)
    cuda = torch.cuda.is_available() and dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = _DTYPES[cfg.train.dtype]
    mcfg = cfg.model_config()
    data = mixture(cfg, mcfg, world)
    say = print if rank == 0 else (lambda *_a, **_k: None)
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
    balanced = cfg.balance.balancer.strip().lower() != "none"
    saved = read_trainer_state(cfg.checkpoint.dir) if cfg.checkpoint.resume else None
    if saved is not None and saved.get("cost") is not None:
        # The model the run planned with (calibrated, measured, refitted): a new calibration
        # would time differently and could change the plans, and with them the rounding.
        cost = _saved_cost(saved["cost"])
        say(f"resume: planning with the checkpoint's cost model ({cost.name})")
    else:
        cost, calib = build_cost(cfg, log=say)
        if calib is not None:
            mape = calib["heldout_mape_percent"]
            say(f"calibrated cost model, held-out MAPE per block type: {mape}")
        if calib is not None and balanced:
            from knapformer.train.costs import measure_bag_overhead

            cost, bag = measure_bag_overhead(cfg, cost, mesh, device)
            if bag["unmodelled_s"]:
                say(f"measured per-rank fixed cost of a g-bag: {cost.u * 1e3:.1f} ms * (g-1)/g")
    refit = None
    if cfg.balance.refit_steps and balanced:
        refit = CostRefit(cost, cfg.balance.refit_steps)
        if saved is not None and saved.get("cost_refit") is not None:
            refit.load_state_dict(saved["cost_refit"])
        cost = refit.current or cost
    model, balancer, optim = build_run(cfg, cost, mesh, device)

    start = 0
    if cfg.checkpoint.resume:
        extra = load_checkpoint(cfg.checkpoint.dir, model, optim)
        start = int(extra["step"])
        if balancer is not None and extra.get("balancer") is not None:
            balancer.load_state_dict(extra["balancer"])
        if extra.get("data", {}).get("seed", cfg.data.seed) != cfg.data.seed:
            raise ValueError("--resume: the checkpoint was written with another data.seed")

    log_f = None
    if rank == 0 and cfg.log.path:
        Path(cfg.log.path).parent.mkdir(parents=True, exist_ok=True)
        log_f = open(cfg.log.path, "a" if cfg.checkpoint.resume else "w")  # noqa: SIM115
    show = (cfg.log.progress if progress is None else progress) and rank == 0
    records: list[dict[str, Any]] = []
    clock = ThreadClock()
    try:
        with _progress(show, cfg.train.steps, start) as advance:
            for step in range(start + 1, cfg.train.steps + 1):
                tb = data.batch(step, rank, dtype=dtype)
                rec = train_step(model, balancer, optim, tb, step, cost, clock, device)
                if refit is not None:
                    refit.observe(rec)  # (the record is the same on every rank)
                    if refit.due(step):
                        cost, rec["cost_refit"] = _refit_shared(refit)
                        balancer.set_cost(cost)
                if rank == 0:
                    records.append(rec)
                    if log_f is not None:
                        log_f.write(json.dumps(rec) + "\n")
                        log_f.flush()
                advance(rec["loss"])
                every = cfg.checkpoint.every
                if every and (step % every == 0 or step == cfg.train.steps):
                    save_checkpoint(
                        cfg.checkpoint.dir,
                        step,
                        model,
                        optim,
                        {
                            "balancer": balancer.state_dict() if balancer is not None else None,
                            "data": {"seed": cfg.data.seed, "next_step": step + 1},
                            "config": cfg.to_dict(),
                            "cost": cost.to_dict(),
                            "cost_refit": refit.state_dict() if refit is not None else None,
                        },
                    )
    finally:
        if log_f is not None:
            log_f.close()
    return records


def _saved_cost(d: Any) -> CostModel:
    from knapformer.planning.cost import CostModelError
    from knapformer.train.checkpoint import CheckpointError

    try:
        return CostModel.from_dict(d)
    except CostModelError as exc:
        raise CheckpointError(f"--resume: the checkpoint's cost model is invalid: {exc}") from None


def _refit_shared(refit: CostRefit) -> tuple[CostModel, dict[str, Any]]:
    """Collective: rank 0 refits the cost model on the samples so far and broadcasts it, so
    every rank plans with the same model bit for bit. Returns the model in use and a summary
    for the log (a failed fit keeps the current model and says why)."""
    from knapformer.train.refit import RefitError

    payload: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            fitted, stats = refit.fit()
            payload[0] = (fitted.to_dict(), stats)
        except RefitError as exc:
            payload[0] = (None, {"error": str(exc)})
    dist.broadcast_object_list(payload, src=0)
    model, stats = payload[0]
    if model is not None and dist.get_rank() != 0:
        refit.adopt(CostModel.from_dict(model))
    assert refit.current is not None
    return refit.current, {**stats, "model": refit.current.to_dict()}


class _progress:
    """Rich progress bar on rank 0 (``advance(loss)`` per step); a no-op elsewhere."""

    def __init__(self, show: bool, total: int, start: int) -> None:
        self.show, self.total, self.start = show, total, start
        self._p: Any = None

    def __enter__(self) -> Callable[[float], None]:
        if not self.show:
            return lambda _loss: None
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn

        from appshell.progress import display

        self._p = display(
            TextColumn("train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
        )
        self._p.start()
        task = self._p.add_task("train", total=self.total, completed=self.start, loss="-")
        return lambda loss: self._p.update(task, advance=1, loss=f"{loss:.4f}")

    def __exit__(self, *exc: object) -> None:
        if self._p is not None:
            self._p.stop()
