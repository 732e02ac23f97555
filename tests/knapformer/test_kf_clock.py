"""The device clock (CPU branch) and its use by the calibration and the training step.

The CUDA branch (events; collectives' intervals taken out of busy time) runs in
``scripts/gpu_check.sh``; here: thread CPU time counts this thread's work and not its sleeps
(a collective waiting for a peer sleeps), marks are ordered, the calibration times with the
clock it is given, and a step's wall time is the same on every rank and covers its busy time.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from knapformer.calibration.clock import Clock, CPUClock, clock_for, comm_span

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _dist_utils import TINY_TRAIN, run_workers

# thread_time and perf_counter are two clocks read one after the other: on pure CPU work the
# thread clock can run a few microseconds ahead of the wall clock (seen: 2.7 us over 20 ms)
RESOLUTION_S = 1e-3


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_cpu_clock_counts_work_and_not_sleep():
    clock = clock_for("cpu")
    assert isinstance(clock, CPUClock)
    a = clock.mark()
    time.sleep(0.05)
    b = clock.mark()
    _spin(0.02)
    c = clock.mark()
    assert clock.wall_s(a, b) >= 0.05  # the sleep is wall time ...
    assert clock.busy_s(a, b) < 0.01  # ... not this thread's work
    assert clock.busy_s(b, c) >= 0.02
    assert clock.wall_s(b, c) >= clock.busy_s(b, c) - RESOLUTION_S
    clock.wait()  # (nothing to wait for on CPU)


def test_cpu_clock_ignores_other_threads():
    import threading

    clock = CPUClock()
    t = threading.Thread(target=_spin, args=(0.05,))
    a = clock.mark()
    t.start()
    t.join()
    b = clock.mark()
    assert clock.busy_s(a, b) < 0.02 <= 0.05 <= clock.wall_s(a, b)


def test_clock_for_refuses_other_devices_and_comm_span_is_free_on_cpu():
    with pytest.raises(ValueError, match="no clock for device type 'meta'"):
        clock_for("meta")
    with comm_span(torch.device("cpu")):
        pass


class _CountingClock(Clock):
    """A clock whose busy time is known: every mark is one tick, a tick is 1 ms."""

    def __init__(self) -> None:
        self.ticks = 0

    def mark(self) -> int:
        self.ticks += 1
        return self.ticks

    def busy_s(self, start: int, end: int) -> float:
        return (end - start) * 1e-3

    wall_s = busy_s

    def wait(self) -> None:
        """(marks are plain numbers)"""


def test_calibration_times_with_the_clock_it_is_given():
    from knapformer.calibration.blocks import _time_cases

    block = torch.nn.Linear(4, 4)
    cases = [1, 2, 3]
    secs = _time_cases(
        block, lambda n: ((torch.randn(n, 4),), {}), cases, 3, 1, 0.25, clock=_CountingClock()
    )
    assert secs == pytest.approx([1e-3] * 3, rel=1e-12)  # one tick between the two marks


def step_worker(rank: int, world: int, raw: dict) -> dict:
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    from knapformer.train.config import build_config
    from knapformer.train.costs import flops_cost
    from knapformer.train.step import build_run, mixture, train_step

    cfg = build_config(raw)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    cpu = torch.device("cpu")
    model, bal, optim = build_run(cfg, flops_cost(cfg.model_config()), mesh, cpu)
    data = mixture(cfg, cfg.model_config(), world)
    recs = [
        train_step(model, bal, optim, data.batch(s, rank), s, bal.cost, clock_for(cpu), cpu)
        for s in (1, 2)
    ]
    return {"recs": recs}


@pytest.mark.timeout(120)
def test_step_wall_time_is_the_same_on_every_rank_and_covers_busy_time(tmp_path):
    res = run_workers(__file__, "step_worker", 2, tmp_path, args=(TINY_TRAIN,), timeout=100)
    for s in range(2):
        a, b = res[0]["recs"][s], res[1]["recs"][s]
        assert a["step_wall_s"] == b["step_wall_s"] > 0  # (the slowest rank's, on every rank)
        assert a["rank_busy_s"] == b["rank_busy_s"] and len(a["rank_busy_s"]) == 2
        # one thread's CPU time inside the step cannot exceed the step's wall time
        assert 0 < max(a["rank_busy_s"]) <= a["step_wall_s"] + RESOLUTION_S
