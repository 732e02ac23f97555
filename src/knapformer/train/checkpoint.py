"""Checkpoints with ``torch.distributed.checkpoint`` (DCP): model, optimiser, trainer state.

Layout: ``DIR/step_00000012/`` holds the DCP shards of the (FSDP2-sharded) model, optimiser and
EMA (when the run keeps one, sharded like the parameters) plus ``trainer.json`` (step, balancer
state, data position, config, the cost model in use, the online refit's state, whether there is
an EMA), and ``DIR/latest`` names the newest complete step directory. ``latest`` is replaced
atomically only after every rank has finished writing, so a crash mid-save leaves the previous
checkpoint in charge.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from appshell.atomic import atomic_open
from appshell.inputs import InputFileError, load_json, read_text

if TYPE_CHECKING:
    from knapformer.train.ema import EMA

__all__ = [
    "CheckpointError",
    "latest_checkpoint",
    "load_checkpoint",
    "read_trainer_state",
    "save_checkpoint",
]


class CheckpointError(ValueError):
    """No usable checkpoint where one was asked for."""


def _step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def save_checkpoint(
    root: str | Path,
    step: int,
    model: nn.Module,
    optim: Any,
    extra: dict[str, Any],
    ema: EMA | None = None,
) -> Path:
    """Collective: every rank writes its shards; rank 0 writes the trainer state and ``latest``."""
    root = Path(root)
    path = _step_dir(root, step)
    if dist.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    msd, osd = get_state_dict(model, optim)
    state: dict[str, Any] = {"model": msd, "optim": osd}
    if ema is not None:
        state["ema"] = ema.state_dict()
    dcp.save(state, checkpoint_id=str(path))
    dist.barrier()
    if dist.get_rank() == 0:
        with atomic_open(path / "trainer.json", "w") as f:
            json.dump({"step": step, **extra}, f, indent=2, sort_keys=True)
        with atomic_open(root / "latest", "w") as f:
            f.write(path.name + "\n")
    dist.barrier()
    return path


def latest_checkpoint(root: str | Path) -> Path:
    root = Path(root)
    marker = root / "latest"
    if not marker.exists():
        raise CheckpointError(f"--resume: no checkpoint in {str(root)!r} (no 'latest' file)")
    path = root / read_text(marker, max_bytes=4096, what="checkpoint marker").strip()
    if not (path / "trainer.json").exists():
        raise CheckpointError(f"--resume: checkpoint {str(path)!r} is incomplete")
    return path


def read_trainer_state(root: str | Path) -> dict[str, Any]:
    """The latest checkpoint's trainer state (step, balancer, data position, config, cost
    model), without touching the model: the trainer needs the cost model before building it."""
    path = latest_checkpoint(root)
    try:
        extra = load_json(path / "trainer.json", what="trainer state")
    except InputFileError as exc:
        raise CheckpointError(f"--resume: {exc}") from None
    if not isinstance(extra, dict):
        raise CheckpointError(f"--resume: trainer state in {str(path)!r} is not a JSON object")
    return extra


def load_checkpoint(
    root: str | Path, model: nn.Module, optim: Any, ema: EMA | None = None
) -> dict[str, Any]:
    """Collective: restore model, optimiser and (if the checkpoint has one) the EMA in place;
    returns the trainer state. A checkpoint without an EMA leaves ``ema`` as it is."""
    path = latest_checkpoint(root)
    extra = read_trainer_state(root)
    msd, osd = get_state_dict(model, optim)
    state: dict[str, Any] = {"model": msd, "optim": osd}
    if ema is not None and extra.get("ema"):
        state["ema"] = ema.state_dict()  # DCP loads into these tensors in place
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if ema is not None and not extra.get("ema"):
        ema.reset(model)  # start from the restored weights
    return extra
