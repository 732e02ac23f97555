"""`splatpainter train --config CONFIG --out DIR [--resume]`: train the editor."""

from __future__ import annotations

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
    steps: int | None = typer.Option(None, help="override optim.steps"),
    cache_dir: Path | None = typer.Option(None, help="override data.cache_dir"),
    json_out: JsonFlag = False,
) -> None:
    """Train the Stage I + Stage II editor on procedural 3D edits.

    Writes OUT/checkpoint.pt (exact resume), OUT/log.jsonl (one line per step), OUT/loss.png
    and OUT/editor.safetensors (load with --weights, or ship as the package default).
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from splatpainter.train.config import load_config
    from splatpainter.train.loop import WEIGHTS
    from splatpainter.train.loop import train as run_training

    cfg = load_config(config)
    if steps is not None:
        if steps < 1:
            raise UserError(f"--steps must be >= 1, got {steps}")
        cfg.optim.steps = steps
    if cache_dir is not None:
        cfg.data.cache_dir = str(cache_dir)
    check_output_dir(out)  # before the cache is built, not after
    console = Console(stderr=True)
    last: dict = {}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    ) as progress:
        cache_task = progress.add_task(
            "edit data (built once, cached)", total=cfg.data.num_sequences, info=""
        )
        step_task = progress.add_task("training", total=cfg.optim.steps, info="")

        def on_cache(done: int, total: int) -> None:
            progress.update(cache_task, completed=done)

        def on_step(step: int, row: dict) -> None:
            last.update(row)
            progress.update(
                step_task,
                completed=step + 1,
                info=f"loss {row['loss']:.4f} lr {row['lr']:.2e}",
            )

        progress.update(cache_task, completed=0)
        run_training(cfg, out, resume=resume, on_cache=on_cache, on_step=on_step)
        progress.update(cache_task, completed=cfg.data.num_sequences)
    summary = {
        "out": str(out),
        "weights": str(out / WEIGHTS),
        "steps": cfg.optim.steps,
        "last_loss": last.get("loss"),
        "elapsed_s": last.get("elapsed_s"),
    }
    if json_out:
        print_json(summary, indent=None)
    else:
        typer.echo(f"wrote {out / WEIGHTS} (last loss {summary['last_loss']})")
