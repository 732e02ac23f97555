"""The training loop of one rank: synthetic mixture -> (balanced) MMDiT -> rectified-flow loss.

Per step every rank: builds its batch (outside the timed region), plans with the balancer
(``plan_step``: two integer all-gathers + the planner), runs forward + backward (the rank's own
work timed on the device's clock, :mod:`knapformer.calibration.clock`: thread CPU time on CPU,
CUDA events less the collectives on GPU; the step's wall time is logged as ``step_wall_s``),
clips the gradients by their global norm, steps AdamW at the scheduled rate (``lr_at``: a pure
function of the step), updates the EMA, and gathers a few numbers so rank 0 can write one JSON
record per step (``lr`` and the pre-clip ``grad_norm`` included); the step itself lives in
:mod:`knapformer.train.step`, which the cost measurements share. The loss is
the global mean over every visual token and channel, so balanced and unbalanced runs optimise
the same objective and their losses agree to float tolerance.

The cost model in use goes into every checkpoint and a resumed run plans with it (no new
calibration); with ``balance.refit_steps`` it is refitted online from the logged per-rank times
(:mod:`knapformer.train.refit`; rank 0 fits, every rank gets the same model by broadcast).

Refused before anything is built: a fresh run into a directory holding checkpoints (unless
``checkpoint.overwrite``), a resume whose config differs from the checkpoint's, a config whose
memory estimate exceeds the machine's. A resumed run cuts its JSONL log back to the checkpoint's
step, so steps after it are not logged twice; a non-finite loss stops the run
(:class:`DivergedError`, naming the step) instead of training on NaN weights.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from knapformer.calibration.clock import clock_for
from knapformer.planning.cost import CostModel
from knapformer.train.config import TrainConfig, check_world
from knapformer.train.refit import CostRefit
from knapformer.train.runtime import init_distributed, run_device
from knapformer.train.step import DTYPES, build_run, lr_at, mixture, train_step

__all__ = [
    "DivergedError",
    "build_cost",
    "build_run",
    "init_distributed",
    "train",
    "train_step",
    "truncate_log",
]


class DivergedError(ValueError):
    """The loss stopped being finite: the run cannot continue (and must not exit 0)."""


def truncate_log(path: str | Path, step: int) -> int:
    """Keep the JSONL records of steps <= ``step`` (a resumed run logs the later ones again),
    dropping a torn last line; atomic, so a kill leaves the old log or the cut one. Returns
    the records kept."""
    from appshell.atomic import atomic_write_text

    p = Path(path)
    if not p.is_file():
        return 0
    kept = []
    with open(p, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] <= step:
                kept.append(json.dumps(rec) + "\n")
    atomic_write_text(p, "".join(kept))
    return len(kept)


def build_cost(cfg: TrainConfig, log: Callable[[str], None] | None = None) -> tuple[CostModel, Any]:
    """The balancer's cost model; ``calibrate`` runs on rank 0, on the device that trains (timed
    on its clock), and is broadcast to the others."""
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
            mcfg, lengths, bags, repeats=5, min_time_s=0.1, dtype=DTYPES[cfg.train.dtype],
            device=run_device(), log=log,
        )  # fmt: skip
        payload[0] = (costs.total.to_dict(), costs.summary())
    dist.broadcast_object_list(payload, src=0)
    total, summary = payload[0]
    return CostModel.from_dict(total), summary


def train(cfg: TrainConfig, progress: bool | None = None) -> list[dict[str, Any]]:
    """Run (or resume) training on the initialised process group; rank 0 returns the records."""
    from torch.distributed.device_mesh import init_device_mesh

    from knapformer.train.budget import check_memory
    from knapformer.train.checkpoint import (
        check_fresh_dir,
        check_resume,
        load_checkpoint,
        read_trainer_state,
        save_checkpoint,
    )
    from knapformer.train.ema import EMA

    init_distributed(cfg.train.timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    check_world(cfg, world)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or world
    check_memory(cfg, world, local, cuda=run_device().type == "cuda")
    saved = read_trainer_state(cfg.checkpoint.dir) if cfg.checkpoint.resume else None
    if saved is not None:
        check_resume(cfg, saved)
    elif cfg.checkpoint.dir:
        check_fresh_dir(cfg.checkpoint.dir, cfg.checkpoint.overwrite)
    torch.set_num_threads(cfg.train.threads)
    device = run_device()
    dtype = DTYPES[cfg.train.dtype]
    mcfg = cfg.model_config()
    data = mixture(cfg, mcfg, world)
    say = print if rank == 0 else (lambda *_a, **_k: None)
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
    balanced = cfg.balance.balancer.strip().lower() != "none"
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
    ema = EMA(model, cfg.train.ema_decay) if cfg.train.ema_decay > 0 else None

    start = 0
    if cfg.checkpoint.resume:
        extra = load_checkpoint(cfg.checkpoint.dir, model, optim, ema)
        start = int(extra["step"])
        if ema is not None and not extra.get("ema"):
            say("resume: the checkpoint has no EMA; the EMA starts from its weights")
        if balancer is not None and extra.get("balancer") is not None:
            balancer.load_state_dict(extra["balancer"])

    log_f = None
    if rank == 0 and cfg.log.path:
        Path(cfg.log.path).parent.mkdir(parents=True, exist_ok=True)
        if cfg.checkpoint.resume:
            truncate_log(cfg.log.path, start)
        log_f = open(cfg.log.path, "a" if cfg.checkpoint.resume else "w")  # noqa: SIM115
    show = (cfg.log.progress if progress is None else progress) and rank == 0
    records: list[dict[str, Any]] = []
    clock = clock_for(device)
    try:
        with _progress(show, cfg.train.steps, start) as advance:
            for step in range(start + 1, cfg.train.steps + 1):
                tb = data.batch(step, rank, dtype=dtype)
                rec = train_step(
                    model,
                    balancer,
                    optim,
                    tb,
                    step,
                    cost,
                    clock,
                    device,
                    lr=lr_at(step, cfg.train),
                    grad_clip=cfg.train.grad_clip,
                    ema=ema,
                )
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
                if not math.isfinite(rec["loss"]):  # the same on every rank: all stop here
                    raise DivergedError(
                        f"step {step}: the loss is {rec['loss']} (training diverged); lower "
                        "train.lr or set train.grad_clip"
                    )
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
                            "ema": ema is not None,
                        },
                        ema=ema,
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
