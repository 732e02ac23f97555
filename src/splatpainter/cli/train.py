"""`splatpainter train --config CONFIG --out DIR [--resume]`: train the editor."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from appshell.atomic import check_output_dir
from appshell.cli import JsonFlag, UserError, print_json
from splatpainter.cli.app import app


@app.command()
def train(
    config: Path = typer.Option(..., help="training config (TOML), e.g. configs/splatpainter/"),
    out: Path = typer.Option(Path("runs/editor"), help="run directory (checkpoint, log, weights)"),
    resume: bool = typer.Option(False, help="continue from the checkpoint in --out"),
    steps: int | None = typer.Option(None, help="override optim.steps (of every phase)"),
    cache_dir: Path | None = typer.Option(None, help="override data.cache_dir"),
    from_phase: str | None = typer.Option(
        None, help="start the [[phase]] curriculum at this phase (with --init)"
    ),
    init: Path | None = typer.Option(
        None, help="weights the earlier phases produced, for --from-phase"
    ),
    json_out: JsonFlag = False,
) -> None:
    """Train the Stage I + Stage II editor on procedural 3D edits.

    Writes OUT/checkpoint.pt (exact resume), OUT/log.jsonl (one line per step), OUT/loss.png
    and OUT/editor.safetensors (load with --weights, or ship as the package default).  A config
    with [[phase]] tables trains each phase in OUT/<i>-<name>/ and ends with the same files.
    Repeatable: the same config on the same machine and software gives the same log and weights
    bit for bit, resumed or not (the renderer runs on one thread while training; torch uses
    optim.threads, or its default).
    """
    from rich.progress import (
        BarColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from appshell.progress import display
    from splatpainter.train.config import load_config
    from splatpainter.train.loop import WEIGHTS
    from splatpainter.train.loop import train as run_training

    cfg = load_config(config)
    runs = [p.config for p in cfg.phases] or [cfg]
    if steps is not None and steps < 1:
        raise UserError(f"--steps must be >= 1, got {steps}")
    for run in runs:
        if steps is not None:
            run.optim.steps = steps
        if cache_dir is not None:
            run.data.cache_dir = str(cache_dir)
    total_steps = sum(run.optim.steps for run in runs)
    check_output_dir(out)  # before the cache is built, not after
    last: dict = {}
    t0 = time.perf_counter()
    with display(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ) as progress:
        cache_task = progress.add_task(
            "edit data (built once, cached)", total=runs[0].data.num_sequences, info=""
        )
        step_task = progress.add_task("training", total=total_steps, info="")

        def on_phase(index: int, name: str) -> None:
            n = runs[index].data.num_sequences
            where = f"phase {index + 1}/{len(runs)} {name}: "
            progress.reset(cache_task, total=n, description=where + "edit data (cached)")
            progress.update(step_task, description=where + "training")

        def on_cache(done: int, total: int) -> None:
            progress.update(cache_task, completed=done, total=total)

        def on_step(step: int, row: dict) -> None:
            last.update(row)
            progress.update(
                step_task,
                completed=step + 1,
                info=f"loss {row['loss']:.4f} lr {row['lr']:.2e}",
            )

        progress.update(cache_task, completed=0)
        run_training(
            cfg,
            out,
            resume=resume,
            on_cache=on_cache,
            on_step=on_step,
            on_phase=on_phase,
            from_phase=from_phase,
            init=init,
        )
        progress.update(cache_task, completed=progress.tasks[cache_task].total)
    summary = {
        "out": str(out),
        "weights": str(out / WEIGHTS),
        "steps": total_steps,
        "last_loss": last.get("loss"),
        "elapsed_s": round(time.perf_counter() - t0, 1),  # wall time, data cache included
    }
    if json_out:
        print_json(summary, indent=None)
    else:
        loss = summary["last_loss"]
        typer.echo(
            f"wrote {out / WEIGHTS} "
            + ("(no steps trained)" if loss is None else f"(last loss {loss})")
        )
