"""Launchers: spawn ``nproc`` local ranks (``knapformer train --nproc N``) or join torchrun.

Both map the same command-line flags onto config overrides (:func:`flag_overrides`), so the
config file stays the single source of truth and a flag is just a dotted-key override.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from pathlib import Path
from typing import Any

from knapformer.train.config import ConfigError, TrainConfig, parse_override

__all__ = ["flag_overrides", "spawn"]


def flag_overrides(
    *,
    balancer: str | None = None,
    steps: int | None = None,
    log: str | None = None,
    checkpoint_dir: str | None = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    data_codes: str | None = None,
    cost: str | None = None,
    progress: bool | None = None,
    sets: list[str] | None = None,
) -> dict[str, Any]:
    """Named flags and ``--set section.key=value`` as one dict of dotted overrides."""
    out: dict[str, Any] = {}
    for s in sets or []:
        key, value = parse_override(s)
        out[key] = value
    named = {
        "balance.balancer": balancer,
        "train.steps": steps,
        "log.path": log,
        "checkpoint.dir": checkpoint_dir,
        "checkpoint.every": checkpoint_every,
        "checkpoint.resume": True if resume else None,
        "data.codes": data_codes,
        "balance.cost": cost,
        "log.progress": progress,
    }
    out.update({k: v for k, v in named.items() if v is not None})
    return out


def _rank_main(rank: int, world: int, cfg: TrainConfig, rdzv: str) -> None:
    import torch
    import torch.distributed as dist

    from knapformer.train.loop import train
    from knapformer.train.runtime import default_backend

    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= world
    if use_cuda:  # pragma: no cover - CUDA only
        torch.cuda.set_device(rank)
    dist.init_process_group(
        default_backend(use_cuda),  # "cpu:gloo,cuda:nccl" on CUDA: host-side agreement on gloo
        init_method=f"file://{rdzv}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=cfg.train.timeout_s),
    )
    try:
        train(cfg)
    finally:
        dist.destroy_process_group()


def spawn(cfg: TrainConfig, nproc: int) -> None:
    """Run ``nproc`` ranks on this machine (file:// rendezvous, no ports); raises on failure."""
    import torch.multiprocessing as mp

    if nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, got {nproc}")
    os.environ.setdefault("OMP_NUM_THREADS", str(cfg.train.threads))
    with tempfile.TemporaryDirectory(prefix="knapformer-rdzv-") as tmp:
        rdzv = str(Path(tmp) / "rendezvous")
        mp.start_processes(
            _rank_main, args=(nproc, cfg, rdzv), nprocs=nproc, join=True, start_method="spawn"
        )
