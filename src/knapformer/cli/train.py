"""`knapformer train`: train the MMDiT on the synthetic mixture, balanced or not."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from appshell.atomic import check_output_dir, check_outputs
from appshell.cli import JsonFlag, note, print_json
from appshell.inputs import read_text
from knapformer.cli.app import app

if TYPE_CHECKING:
    from knapformer.train.config import TrainConfig


@app.command()
def train(
    config: Path = typer.Option(..., help="TOML config (e.g. configs/tiny.toml)."),
    nproc: int = typer.Option(1, help="Local ranks to spawn (gloo on CPU, NCCL on CUDA)."),
    balancer: str = typer.Option(None, help="none | auto | a bag spec such as g1n2+g2n1."),
    steps: int = typer.Option(None, help="Train up to this step."),
    log: Path = typer.Option(None, help="JSONL log, one record per step (rank 0)."),
    checkpoint_dir: Path = typer.Option(None, help="Where DCP checkpoints go."),
    checkpoint_every: int = typer.Option(None, help="Checkpoint every K steps (and the last)."),
    resume: bool = typer.Option(False, help="Continue from the latest checkpoint."),
    overwrite: bool = typer.Option(
        False, help="Start a new run in a checkpoint dir that holds checkpoints (replaces them)."
    ),
    data_codes: str = typer.Option(None, help="Override data.codes (g<G>b<B>i<R>f<F>s<S>,...)."),
    cost: str = typer.Option(None, help="flops | calibrate | PROFILE.json."),
    progress: bool = typer.Option(True, help="Rich progress bar on rank 0."),
    set_: list[str] = typer.Option(
        None, "--set", metavar="KEY=VALUE", help="Any config key: --set train.lr=3e-4 (repeatable)."
    ),
    json_out: JsonFlag = False,
) -> None:
    """Train; for torchrun use `python -m knapformer.train` with the same flags."""
    from knapformer.train.config import ConfigError, check_world, load_config
    from knapformer.train.launch import flag_overrides, spawn

    cfg = load_config(
        config,
        flag_overrides(
            balancer=balancer,
            steps=steps,
            log=None if log is None else str(log),
            checkpoint_dir=None if checkpoint_dir is None else str(checkpoint_dir),
            checkpoint_every=checkpoint_every,
            resume=resume,
            overwrite=overwrite,
            data_codes=data_codes,
            cost=cost,
            progress=progress,
            sets=set_ or [],
        ),
    )
    if nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, got {nproc}")
    check_world(cfg, nproc)
    check_outputs(cfg.log.path or None)  # before any rank starts
    if cfg.checkpoint.dir:  # not only at the first checkpoint, after steps of training
        check_output_dir(cfg.checkpoint.dir)
    _check_before_spawning(cfg, nproc)
    from knapformer.cli.plan import warm_planner

    warm_planner()  # (compiled here once: the ranks then load the kernels from numba's cache)
    try:
        spawn(cfg, nproc)
    except Exception as exc:  # a rank failed: show its last line, not a wall of tracebacks
        typer.echo(f"error: training failed: {_rank_message(exc)}", err=True)
        raise typer.Exit(1) from None
    last = None
    if cfg.log.path and Path(cfg.log.path).is_file():
        rows = [ln for ln in read_text(cfg.log.path).splitlines() if ln.strip()]
        last = json.loads(rows[-1]) if rows else None
    if json_out:
        print_json({"log": cfg.log.path, "checkpoint_dir": cfg.checkpoint.dir, "last": last})
    elif cfg.log.path:
        note(f"log {cfg.log.path}")


def _check_before_spawning(cfg: TrainConfig, nproc: int) -> None:
    """Everything that can be refused without the ranks, refused here in one line: a fresh run
    into a directory that holds checkpoints, a resume from a checkpoint whose config differs or
    whose files are damaged or not DCP's, and a run that would not fit in memory."""
    import torch

    from knapformer.train.budget import check_memory
    from knapformer.train.checkpoint import (
        check_fresh_dir,
        check_resume,
        latest_checkpoint,
        read_metadata,
        read_trainer_state,
        verify_files,
    )

    ck = cfg.checkpoint
    if ck.resume:
        extra = read_trainer_state(ck.dir)
        check_resume(cfg, extra)
        path = latest_checkpoint(ck.dir)
        verify_files(path, extra)
        read_metadata(path)
    elif ck.dir:
        check_fresh_dir(ck.dir, ck.overwrite)
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= nproc
    check_memory(cfg, nproc, nproc, cuda=cuda)


_EXC_PREFIX = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Interrupt): ")


def _rank_message(exc: BaseException) -> str:
    """The last line of a failed rank's traceback, without the exception's class name."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return repr(exc)
    return _EXC_PREFIX.sub("", lines[-1])
