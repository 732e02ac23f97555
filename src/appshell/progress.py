"""Progress on stderr: a live rich display in a terminal, occasional plain lines elsewhere.

A rich live display needs a terminal; in a pipe, a log file or under ``nohup`` it would show
nothing until the end (or print its last frame onto a stream meant for ``--json``).  There,
`display` returns a `LineProgress` instead: the same small API (``add_task``, ``update``,
``advance``, ``reset``, ``tasks``), writing a line such as

    evaluate recolor seed 12: 45/197 (23%) 4m10s
    train: 120/3600 (3%) loss 0.4321 1m02s

(a task's fields follow as "name value"; a field named ``info`` is free text, shown as it is)

to stderr at most every ``APPSHELL_PROGRESS_EVERY`` seconds (default 30), so a long run in a
log still says how far it is, and a short one stays silent.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

EVERY_ENV = "APPSHELL_PROGRESS_EVERY"
DEFAULT_EVERY_S = 30.0


def _every_s() -> float:
    raw = os.environ.get(EVERY_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_EVERY_S
    return value if value >= 0 else DEFAULT_EVERY_S


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@dataclass
class _Task:
    description: str
    total: float | None
    completed: float = 0.0
    fields: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0
    shown: tuple | None = None  # (completed, description) last written


class LineProgress:
    """rich.progress.Progress's task API, written as plain lines (see the module docstring)."""

    def __init__(
        self,
        every_s: float | None = None,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every_s = _every_s() if every_s is None else every_s
        self.stream = stream
        self.clock = clock
        self.tasks: list[_Task] = []
        self._last_line = clock()
        self._wrote = False

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        """After a run long enough to have written a line, the last state of every task."""
        if self._wrote:
            for task in self.tasks:
                if task.shown != (task.completed, task.description):
                    self._write(task)

    def add_task(
        self, description: str, total: float | None = 100.0, completed: float = 0, **fields: Any
    ) -> int:
        self.tasks.append(_Task(description, total, completed, fields, self.clock()))
        return len(self.tasks) - 1

    def update(
        self,
        task_id: int,
        *,
        total: float | None = None,
        completed: float | None = None,
        advance: float | None = None,
        description: str | None = None,
        **fields: Any,
    ) -> None:
        task = self.tasks[task_id]
        if total is not None:
            task.total = total
        if completed is not None:
            task.completed = completed
        if advance is not None:
            task.completed += advance
        if description is not None:
            task.description = description
        fields.pop("visible", None)
        fields.pop("refresh", None)
        task.fields.update(fields)
        if self.clock() - self._last_line >= self.every_s:
            self._write(task)

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def reset(
        self,
        task_id: int,
        *,
        total: float | None = None,
        completed: float = 0,
        description: str | None = None,
        **fields: Any,
    ) -> None:
        task = self.tasks[task_id]
        task.started, task.completed, task.shown = self.clock(), completed, None
        self.update(task_id, total=total, description=description, **fields)

    def line(self, task: _Task) -> str:
        done = f"{task.completed:g}"
        if task.total:
            done += f"/{task.total:g} ({100 * task.completed / task.total:.0f}%)"
        extra = " ".join(
            str(v) if k == "info" else f"{k} {v}"
            for k, v in task.fields.items()
            if v not in (None, "")
        )
        parts = [f"{task.description}: {done}", extra, _clock(self.clock() - task.started)]
        return " ".join(p for p in parts if p)

    def _write(self, task: _Task) -> None:
        stream = self.stream or sys.stderr
        print(self.line(task), file=stream, flush=True)
        task.shown = (task.completed, task.description)
        self._last_line = self.clock()
        self._wrote = True


def display(*columns: Any, transient: bool = False, console: Any = None) -> Any:
    """A rich ``Progress`` with these columns on stderr if it is a terminal, else `LineProgress`."""
    from rich.console import Console
    from rich.progress import Progress

    console = console or Console(stderr=True)
    if not console.is_terminal:
        return LineProgress()
    return Progress(*columns, console=console, transient=transient)


class Bar:
    """A handle on one progress task: advance, update, or use as a (done, total) callback."""

    def __init__(self, progress: Any, task: Any) -> None:
        self._progress = progress
        self._task = task

    def advance(self, n: float = 1) -> None:
        self._progress.advance(self._task, n)

    def update(self, **fields: Any) -> None:
        self._progress.update(self._task, **fields)

    def __call__(self, done: float, total: float | None = None) -> None:
        if total is None:
            self._progress.update(self._task, completed=done)
        else:
            self._progress.update(self._task, completed=done, total=total)


@contextlib.contextmanager
def progress(
    description: str,
    total: float | None = None,
    *,
    transient: bool = True,
    counted: bool | None = None,
) -> Iterator[Bar]:
    """One task's progress bar; a spinner with elapsed time when nothing is counted.

    counted=True shows a bar even when the total is only known later (set via the callback).
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns: list[Any] = [SpinnerColumn(), TextColumn("{task.description}")]
    if counted or (counted is None and total is not None):
        columns += [BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()]
    columns.append(TimeElapsedColumn())
    with display(*columns, transient=transient) as p:
        yield Bar(p, p.add_task(description, total=total))


@contextlib.contextmanager
def status(description: str) -> Iterator[None]:
    """A spinner with elapsed time for one step of unknown length."""
    with progress(description):
        yield
