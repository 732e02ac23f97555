"""`splatpainter evaluate [--suites LIST] [--seeds A-B] [--methods LIST] [--json] [--out DIR]`.

Scores the editor, the baselines and the ablations against 3D ground truth at held-out views,
per suite and edit kind (see `splatpainter.eval.suite` for the metrics and the JSON schema),
prints a table per suite (or the JSON report), and writes a grid PNG per suite and edit kind
plus report.json into --out.
"""

from __future__ import annotations

from pathlib import Path

import typer

from appshell.atomic import check_output_dir
from appshell.cli import JsonFlag, UserError, note, print_json
from splatpainter.cli.app import app
from splatpainter.cli.options import EvalHint

UNTRAINED_WARNING = (
    "warning: the editor model has untrained, deterministically seeded weights; its rows are "
    "not a meaningful measure of the method (pass --weights with trained weights)"
)


def _parse_range(text: str, what: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("-")
    try:
        a, b = int(lo), int(hi if sep else lo)
    except ValueError:
        raise UserError(f"--{what}: expected MIN-MAX (e.g. 5000-8000), got {text!r}") from None
    return a, b


@app.command()
def evaluate(
    suites: str | None = typer.Option(
        None,
        "--suites",
        "--suite",
        metavar="LIST",
        help="comma list of procedural, distractor, capture (default: all three)",
    ),
    seeds: str = typer.Option(
        "0-7", metavar="SEEDS", help="evaluation seeds: A-B, A or a comma list (< 100000)"
    ),
    methods: str = typer.Option(
        "model,backproject,rule,diffusion,diffusion_centred,model_kind,model_init",
        metavar="LIST",
        help="comma list of model, backproject, optimize (slow), rule, diffusion, "
        "diffusion_centred (the seen Gaussians on the solve centred on the map), and the "
        "ablations model_kind (told the true kind), model_init (no learned weights)",
    ),
    kinds: str | None = typer.Option(
        None,
        metavar="LIST",
        help="comma list of paint, recolor, global, relight, detail, brush (a square dab across "
        "parts, not trained on) (default: all six)",
    ),
    as_json: JsonFlag = False,
    out: Path = typer.Option(Path("out/evaluate"), help="folder for grid PNGs and report.json"),
    weights: Path | None = typer.Option(
        None, help="editor weights for the model methods (default: the shipped ones)"
    ),
    hint: EvalHint = typer.Option(
        EvalHint.auto,
        help="edit-kind hint of model, rule and diffusion: auto (inferred, as users run it) "
        "or kind (the true one)",
    ),
    gaussians: str = typer.Option("5000-8000", metavar="MIN-MAX", help="asset size range MIN-MAX"),
    view_size: int = typer.Option(128, help="edit and held-out view size (pixels)"),
    heldout: int = typer.Option(8, help="held-out views per scene"),
    optimize_steps: int = typer.Option(500, help="Adam steps of the optimize baseline"),
    forgetting: bool = typer.Option(
        True, "--forgetting/--no-forgetting", help="also measure forgetting over 5-edit sequences"
    ),
    grid_rows: int = typer.Option(3, help="seeds shown in each grid PNG"),
) -> None:
    """Score the editor, baselines and ablations on held-out views against 3D ground truth,
    per suite and edit kind."""
    from splatpainter.eval.suite import (
        DEFAULT_SUITES,
        METHODS,
        SUITES,
        EvalConfig,
        EvalError,
        parse_names,
        parse_seeds,
    )
    from splatpainter.train.data import ALL_KINDS

    lo, hi = _parse_range(gaussians, "gaussians")
    config = EvalConfig(
        seeds=parse_seeds(seeds),
        methods=parse_names(methods, METHODS, "methods"),
        kinds=ALL_KINDS if kinds is None else parse_names(kinds, ALL_KINDS, "kinds"),
        suites=DEFAULT_SUITES if suites is None else parse_names(suites, SUITES, "suites"),
        min_gaussians=lo,
        max_gaussians=hi,
        view_size=view_size,
        num_heldout=heldout,
        optimize_steps=optimize_steps,
        hint=hint.value,
        forgetting=forgetting,
        grid_rows=grid_rows,
    ).validate()
    if weights is not None and not config.needs_model:
        raise EvalError(
            "--weights only applies when --methods includes model, model_kind or model_init"
        )
    check_output_dir(out)  # before the run, not after it

    model, label = None, None
    if config.needs_model:
        from splatpainter.eval.suite import load_model

        model, label = load_model(weights)
        if not model.trained:
            note(UNTRAINED_WARNING)
    result = run_with_progress(config, model, label)
    from splatpainter.eval.suite import write_outputs

    write_outputs(result, out)

    if as_json:
        print_json(result.report)
        return
    from rich.console import Console

    from splatpainter.eval.table import report_tables

    console = Console()
    if not console.is_terminal:
        console = Console(width=130)
    for table in report_tables(result.report):
        console.print(table)
    for suite, by_kind in result.report["grids"].items():
        for kind, path in by_kind.items():
            console.print(f"grid {suite} {kind}: {path}")
    console.print(f"report: {out / 'report.json'}")


def run_with_progress(config, model=None, weights_label: str | None = None):
    """`run_suite` with a rich progress bar on stderr."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from appshell.progress import display
    from splatpainter.eval.suite import run_suite

    with display(
        TextColumn("{task.description:<32}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task("evaluate", total=config.num_units())

        def step(desc: str, done: int) -> None:
            bar.update(task, description=desc, advance=done)

        return run_suite(config, model, step, weights_label)
