"""Time forward+backward of a block on a set of cases (e.g. (length, bag size) pairs).

Generic over any ``nn.Module`` driven by a ``make_inputs(case) -> (args, kwargs)`` callable, so
the same harness times the reference block and any user block. Median of ``repeats`` after
``warmup`` runs, round-robin over the cases. On CPU the clock is the process's CPU time
(robust to other processes sharing the cores; exact when the block runs on this process's
threads, which it does with a fixed thread count); on CUDA it is wall-clock time with the
device synchronised around each run.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["time_forward_backward"]


def time_forward_backward(
    module: Any,
    make_inputs: Callable[[Any], tuple[tuple[Any, ...], dict[str, Any]]],
    cases: Sequence[Any],
    repeats: int = 5,
    warmup: int = 2,
    device: Any = None,
    clock: str = "auto",
    min_time_s: float = 0.0,
    max_repeats: int = 50,
    on_run: Callable[[int, int], None] | None = None,
) -> list[float]:
    """Median seconds of one forward+backward per case (``make_inputs(case)`` builds the call;
    loss = sum of the output * a fixed random tensor, so every output element gets a gradient).

    A case whose warmup shows it is fast gets more repeats (up to ``max_repeats``) so that its
    timed runs add up to about ``min_time_s``: short runs are the noisiest, and cheap to repeat.
    ``on_run(done, total)`` is called after every run (the total is exact once warmup is over).
    """
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    cuda = dev.type == "cuda"
    if clock == "auto":
        clock = "wall" if cuda else "cpu"
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'auto', 'wall' or 'cpu', got {clock!r}")
    # CPU time of this process: on a shared machine the time the scheduler gives to other
    # processes is not counted, so contention does not masquerade as a slower block.
    now = time.process_time if clock == "cpu" else time.perf_counter

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    built = []
    for case in cases:
        args, kwargs = make_inputs(case)
        probe = module(*args, **kwargs)
        built.append((args, kwargs, torch.randn_like(probe)))
        del probe

    runs = [0, (warmup + repeats) * len(built)]

    def run_once(args: Any, kwargs: Any, seed: Any) -> float:
        module.zero_grad(set_to_none=True)
        sync()
        t0 = now()
        y = module(*args, **kwargs)
        (y * seed).sum().backward()
        sync()
        elapsed = now() - t0
        runs[0] += 1
        if on_run is not None:
            on_run(runs[0], runs[1])
        return elapsed

    # Round-robin over the cases: a burst of load from other processes then hits every case
    # about equally instead of inflating whichever one happened to be running.
    warm: list[float] = [0.0] * len(built)
    for _ in range(warmup):
        for i, case in enumerate(built):
            warm[i] = run_once(*case)
    wanted = [
        min(
            max(repeats, math.ceil(min_time_s / w) if w > 0 else repeats), max(max_repeats, repeats)
        )
        for w in warm
    ]
    runs[1] = warmup * len(built) + sum(wanted)
    times: list[list[float]] = [[] for _ in built]
    for r in range(max(wanted)):
        for i, case in enumerate(built):
            if r < wanted[i]:
                times[i].append(run_once(*case))
    return [statistics.median(ts) for ts in times]
