"""Launchers: spawn ``nproc`` local ranks (``knapformer train --nproc N``) or join torchrun.

Both map the same command-line flags onto config overrides (:func:`flag_overrides`), so the
config file stays the single source of truth and a flag is just a dotted-key override.

The spawned ranks die with the launcher, however it dies: each asks the kernel for SIGKILL when
its parent exits (``prctl(PR_SET_PDEATHSIG)``, Linux) and a watchdog thread polls the parent
pid where that is not available. The launcher removes its rendezvous directory on every exit it
sees (an error, Ctrl-C, SIGTERM; SIGKILL leaves only that empty temp directory).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import gc
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from knapformer.train.config import ConfigError, TrainConfig, parse_override

__all__ = ["RankError", "flag_overrides", "spawn"]

PR_SET_PDEATHSIG = 1


class RankError(RuntimeError):
    """A rank stopped on an expected error; its message is the error's one line (the launcher
    shows the last line of the rank's traceback: this one)."""


def flag_overrides(
    *,
    balancer: str | None = None,
    steps: int | None = None,
    log: str | None = None,
    checkpoint_dir: str | None = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    overwrite: bool = False,
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
        "checkpoint.overwrite": True if overwrite else None,
        "data.codes": data_codes,
        "balance.cost": cost,
        "log.progress": progress,
    }
    out.update({k: v for k, v in named.items() if v is not None})
    return out


def _die_with_parent(parent: int, poll_s: float = 1.0) -> None:
    """Make this rank exit when the launcher ``parent`` does: ranks left training on their own
    hold the machine (and the checkpoint directory) with nobody to stop them."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the launcher died before the request was in place
        os._exit(1)

    def watch() -> None:  # where prctl is not there (or the parent changed under it)
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="knapformer-parent-watchdog", daemon=True).start()


def _rank_main(rank: int, world: int, cfg: TrainConfig, rdzv: str, parent: int) -> None:
    _die_with_parent(parent)
    import torch
    import torch.distributed as dist

    from appshell.cli import is_expected, one_line
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
    error = None
    try:
        train(cfg)
    except Exception as exc:
        if not is_expected(exc):
            raise
        error = one_line(exc)  # (leaving this block frees exc's frames: model, groups)
    finally:
        dist.destroy_process_group()
    if error is not None:
        gc.collect()  # the gloo contexts go now, not at interpreter teardown (see below)
        raise RankError(error)
    leave_without_teardown()


def leave_without_teardown(code: int = 0) -> None:
    """End a finished rank here. Objects that still hold gloo contexts (subgroups of the
    balancer, FSDP's mesh) die at interpreter teardown, where a context's destructor can meet a
    joinable worker thread and abort the process ("terminate called without an active
    exception", SIGABRT) after a run that succeeded: about 1 run in 10 of a 2-rank CLI test.
    Everything the run writes is closed by then; flush the streams and skip the teardown."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


JOIN_GRACE_S = 10.0  # how long the other ranks may take to stop on their own after one failed


class _Terminated(SystemExit):
    """SIGTERM in the launcher: unwind (stop the ranks, remove the rendezvous directory)."""


def spawn(cfg: TrainConfig, nproc: int) -> None:
    """Run ``nproc`` ranks on this machine (file:// rendezvous, no ports); raises on failure.
    The ranks are stopped and the rendezvous directory removed on any exit of this function,
    SIGTERM included."""
    import torch.multiprocessing as mp

    if nproc < 1:
        raise ConfigError(f"--nproc must be >= 1, got {nproc}")
    os.environ.setdefault("OMP_NUM_THREADS", str(cfg.train.threads))
    # torch warns "Terminating process ..." when one rank fails; the caller reports the failure
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None

    def on_sigterm(signum: int, frame: Any) -> None:
        raise _Terminated(128 + signum)

    if main:
        signal.signal(signal.SIGTERM, on_sigterm)
    tmp = Path(tempfile.mkdtemp(prefix="knapformer-rdzv-"))
    ctx = None
    try:
        ctx = mp.start_processes(
            _rank_main,
            args=(nproc, cfg, str(tmp / "rendezvous"), os.getpid()),
            nprocs=nproc,
            join=False,
            start_method="spawn",
        )
        # A failing rank's peers usually fail the same way a moment later (a diverged loss is
        # the same on every rank): let them shut down their process group themselves before
        # they are stopped, or gloo's threads abort them with "terminate called ...".
        while not ctx.join(grace_period=JOIN_GRACE_S):
            pass
    finally:
        if ctx is not None:
            _stop(ctx.processes)
        shutil.rmtree(tmp, ignore_errors=True)
        if main and previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _stop(processes: list[Any], grace_s: float = 5.0) -> None:
    """SIGTERM every rank still running, then SIGKILL what is left after ``grace_s``."""
    alive = [p for p in processes if p.is_alive()]
    for p in alive:
        with contextlib.suppress(OSError):
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in alive:
        p.join(max(deadline - time.monotonic(), 0.0))
        if p.is_alive():
            with contextlib.suppress(OSError):
                p.kill()
            p.join(1.0)
