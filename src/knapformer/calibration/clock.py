"""Clocks for a rank's own work on the device that trains: thread CPU time on CPU, CUDA events
on GPU.

Why two: on CPU a collective that waits for a peer sleeps, so the thread's CPU time is the
rank's own work (and other processes sharing the core do not count). On CUDA the host returns
before the device has run anything, and a host clock stopped after ``cuda.synchronize()`` counts
the time the device waited for peers inside NCCL as compute: a cost model fitted to that learns
noise. CUDA events on the compute stream time the device's own queue instead; the intervals it
spends in the balancer's collectives (recorded by :func:`comm_span`, which
:mod:`knapformer.distributed.collectives` wraps around every all-to-all) are taken out of the
busy time.

A clock's marks are read after the caller's own sync point (the trainer's one host read per
step): :meth:`Clock.busy_s` / :meth:`Clock.wall_s` never wait themselves, except where
:meth:`Clock.wait` was not called on CUDA, where reading an unfinished event raises.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["CPUClock", "CUDAClock", "Clock", "clock_for", "comm_span"]


class Clock(abc.ABC):
    """Marks on one timeline; ``busy_s`` = own work between two marks, ``wall_s`` = elapsed."""

    @abc.abstractmethod
    def mark(self) -> Any: ...

    @abc.abstractmethod
    def busy_s(self, start: Any, end: Any) -> float: ...

    @abc.abstractmethod
    def wall_s(self, start: Any, end: Any) -> float: ...

    @abc.abstractmethod
    def wait(self) -> None:
        """Make the marks taken so far readable."""

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        """While inside, collectives report their intervals to this clock (CUDA only)."""
        yield


class CPUClock(Clock):
    """Thread CPU time (busy) and ``perf_counter`` (wall) of the calling thread."""

    def mark(self) -> tuple[float, float]:
        return time.thread_time(), time.perf_counter()

    def busy_s(self, start: tuple[float, float], end: tuple[float, float]) -> float:
        return end[0] - start[0]

    def wall_s(self, start: tuple[float, float], end: tuple[float, float]) -> float:
        return end[1] - start[1]

    def wait(self) -> None:
        """Nothing to wait for: the marks are read when taken."""


_ACTIVE: CUDAClock | None = None


class CUDAClock(Clock):  # pragma: no cover - CUDA only
    """CUDA events on the current stream of ``device``. Busy time is the events' interval
    minus the collective intervals recorded in between (:func:`comm_span`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def _event(self) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def mark(self) -> tuple[torch.cuda.Event, int]:
        return self._event(), len(self._spans)

    def wall_s(self, start: tuple[Any, int], end: tuple[Any, int]) -> float:
        return start[0].elapsed_time(end[0]) * 1e-3

    def busy_s(self, start: tuple[Any, int], end: tuple[Any, int]) -> float:
        comm = sum(a.elapsed_time(b) for a, b in self._spans[start[1] : end[1]]) * 1e-3
        return max(self.wall_s(start, end) - comm, 0.0)

    def wait(self) -> None:
        torch.cuda.current_stream(self.device).synchronize()

    @contextlib.contextmanager
    def span(self) -> Iterator[None]:
        a = self._event()
        try:
            yield
        finally:
            self._spans.append((a, self._event()))

    @contextlib.contextmanager
    def tracking(self) -> Iterator[None]:
        global _ACTIVE
        before, _ACTIVE = _ACTIVE, self
        self._spans.clear()  # (marks of an earlier tracking period are not read any more)
        try:
            yield
        finally:
            _ACTIVE = before


def comm_span(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """Around a collective on ``device``: its interval leaves the busy time of the CUDA clock
    that is tracking (none on CPU, where a waiting collective costs no thread time anyway)."""
    if _ACTIVE is not None and device.type == "cuda":  # pragma: no cover - CUDA only
        return _ACTIVE.span()
    return contextlib.nullcontext()


def clock_for(device: torch.device | str) -> Clock:
    """The clock of ``device``'s kind: :class:`CUDAClock` on CUDA, else :class:`CPUClock`."""
    device = torch.device(device)
    if device.type == "cuda":  # pragma: no cover - CUDA only
        return CUDAClock(device)
    if device.type != "cpu":
        raise ValueError(f"no clock for device type {device.type!r} (cpu or cuda)")
    return CPUClock()
