"""appshell.progress: outside a terminal, progress is an occasional plain line on stderr."""

import io

from rich.console import Console

from appshell.progress import DEFAULT_EVERY_S, EVERY_ENV, LineProgress, display


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_a_line_at_most_every_interval_and_the_last_state_at_the_end():
    clock, out = Clock(), io.StringIO()
    with LineProgress(every_s=10, stream=out, clock=clock) as p:
        task = p.add_task("evaluate", total=8, info="", lr=None)
        for _ in range(3):
            clock.t += 3
            p.advance(task)
        assert lines(out) == []  # 9 s: nothing yet
        clock.t += 1
        p.update(task, advance=1, description="recolor seed 3", info="loss 0.5", lr=0.1)
        assert lines(out) == ["recolor seed 3: 4/8 (50%) loss 0.5 lr 0.1 0m10s"]
        clock.t += 5
        p.update(task, completed=8)
    assert lines(out)[1:] == ["recolor seed 3: 8/8 (100%) loss 0.5 lr 0.1 0m15s"]


def test_a_short_run_writes_nothing_and_reset_restarts_the_clock():
    clock, out = Clock(), io.StringIO()
    with LineProgress(every_s=30, stream=out, clock=clock) as p:
        task = p.add_task("cache", total=None)
        clock.t += 29
        p.update(task, completed=5)
    assert out.getvalue() == ""
    with LineProgress(every_s=0, stream=out, clock=clock) as p:
        task = p.add_task("cache", total=4)
        clock.t += 3700
        p.reset(task, total=2, description="phase 2: cache")
        p.advance(task)
        assert p.tasks[task].total == 2
    assert lines(out) == ["phase 2: cache: 0/2 (0%) 0m00s", "phase 2: cache: 1/2 (50%) 0m00s"]
    clock2 = Clock()
    with LineProgress(every_s=0, stream=out, clock=clock2) as p:
        task = p.add_task("train", total=None)
        clock2.t += 3725
        p.advance(task, 7)
    assert lines(out)[-1] == "train: 7 1h02m"


def test_display_is_live_only_on_a_terminal(monkeypatch):
    from rich.progress import Progress

    pipe = Console(file=io.StringIO(), force_terminal=False)
    tty = Console(file=io.StringIO(), force_terminal=True)
    assert isinstance(display(console=pipe), LineProgress)
    assert isinstance(display(console=tty), Progress)
    monkeypatch.setenv(EVERY_ENV, "2.5")
    assert display(console=pipe).every_s == 2.5
    for bad in ("soon", "-1"):
        monkeypatch.setenv(EVERY_ENV, bad)
        assert display(console=pipe).every_s == DEFAULT_EVERY_S
