"""Measure all-to-all cost on this machine for the cost model's ``c`` term.

Spawns a 2-process gloo group (file:// rendezvous, no ports), times ``all_to_all_single`` on
``[m, d]`` float32 tensors for a few ``m``, and fits ``time = alpha + k*m`` (median of repeats).
The per-block Ulysses traffic of a chunk of ``L/g`` tokens is 8 such volumes (q, k, v, out
forward; their gradients backward), of which the share ``(g-1)/g`` leaves the GPU, so matching
``c*L*(g-1)/g`` at the measured ``g = 2`` gives ``c = 8*k``. The per-collective latency
``alpha`` is shared by all sequences of a bag, so it is reported, not folded into ``e``.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["A2A_VOLUMES_PER_BLOCK", "CommResult", "measure_all_to_all"]

A2A_VOLUMES_PER_BLOCK = 8


@dataclass(frozen=True)
class CommResult:
    sizes: tuple[int, ...]  # rows m of the [m, d] tensor all-to-all'd
    seconds: tuple[float, ...]  # median time per all_to_all_single
    alpha: float  # latency, s
    k: float  # s per row of d float32 values (whole tensor, at world 2)
    d_model: int

    @property
    def c(self) -> float:
        """The cost model's c (seconds per token, for one block forward+backward) at g=2."""
        return A2A_VOLUMES_PER_BLOCK * self.k


def _worker(rank: int, init_file: str, out_file: str, sizes: list[int], d: int, reps: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        med = []
        for m in sizes:
            x = torch.randn(m, d)
            y = torch.empty_like(x)
            ts = []
            for i in range(reps + 2):
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_to_all_single(y, x)
                dt = time.perf_counter() - t0
                if i >= 2:  # warmup
                    ts.append(dt)
            # both ranks must agree: the slower rank's time is the collective's time
            tt = torch.tensor([statistics.median(ts)], dtype=torch.float64)
            dist.all_reduce(tt, op=dist.ReduceOp.MAX)
            med.append(float(tt.item()))
        if rank == 0:
            tmp = out_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump(med, f)
            os.replace(tmp, out_file)
    finally:
        dist.destroy_process_group()


def measure_all_to_all(
    d_model: int,
    sizes: tuple[int, ...] = (256, 1024, 4096, 8192),
    repeats: int = 5,
    timeout_s: float = 90.0,
) -> CommResult:
    """Time a 2-rank gloo all_to_all_single; kills the workers if they exceed `timeout_s`."""
    import multiprocessing as mp

    sizes = tuple(int(m) - int(m) % 2 for m in sizes)  # even rows: equal splits at world 2
    if len(sizes) < 2 or min(sizes) < 2:
        raise ValueError("need at least two all-to-all sizes >= 2 rows")
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="kf_a2a_") as tmp:
        init_file = str(Path(tmp) / "init")
        out_file = str(Path(tmp) / "out.json")
        procs = [
            ctx.Process(
                target=_worker, args=(r, init_file, out_file, list(sizes), d_model, repeats)
            )
            for r in range(2)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(deadline - time.monotonic(), 0.1))
        hung = [p for p in procs if p.is_alive()]
        for p in hung:
            p.kill()
            p.join(5)
        if hung or any(p.exitcode != 0 for p in procs) or not os.path.exists(out_file):
            codes = [p.exitcode for p in procs]
            raise RuntimeError(
                f"all-to-all measurement failed (timeout={bool(hung)}, exit codes {codes})"
            )
        with open(out_file) as f:
            secs = json.load(f)
    m = np.asarray(sizes, dtype=np.float64)
    s = np.asarray(secs, dtype=np.float64)
    k, alpha = np.polyfit(m, s, 1)
    return CommResult(
        sizes=sizes,
        seconds=tuple(float(x) for x in s),
        alpha=float(max(alpha, 0.0)),
        k=float(max(k, 0.0)),
        d_model=d_model,
    )
