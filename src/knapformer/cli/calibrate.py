"""`knapformer calibrate`: time the reference block here, fit the cost model, save a profile."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from knapformer.cli.app import app


def _ints(text: str, what: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out:
        typer.echo(f"error: {what} must be comma-separated integers, got {text!r}", err=True)
        raise typer.Exit(2)
    return out


@app.command()
def calibrate(
    d_model: int = typer.Option(256, help="Block width."),
    heads: int = typer.Option(4, help="Attention heads (bag sizes must divide it)."),
    lengths: str = typer.Option(
        "64,128,192,256,384,512,640,768,1024,1280,1536",
        help="Sequence lengths to time; every third interior one is held out of the fit.",
    ),
    bag_sizes: str = typer.Option("1,2,4", help="Bag sizes g to emulate (per-GPU compute)."),
    repeats: int = typer.Option(5, help="Timed repeats per point (median)."),
    warmup: int = typer.Option(2, help="Untimed warmup runs per point."),
    min_time: float = typer.Option(
        0.25, help="Fast points get extra repeats until their timed runs add up to this (s)."
    ),
    threads: int = typer.Option(1, help="torch.set_num_threads for the timings."),
    device: str = typer.Option(None, help="cpu or cuda (default: cuda if available)."),
    comm: bool = typer.Option(True, help="Measure 2-process gloo all-to-all for the c term."),
    out: Path = typer.Option(None, help="Write the profile JSON here (atomic)."),
    plot: Path = typer.Option(None, help="Write a PNG of measured vs fitted times."),
    json_out: bool = typer.Option(False, "--json", help="Print the profile as JSON."),
) -> None:
    """Fit t(L, g) = (a*L + b*L^2)/g + c*L*(g-1)/g + e to timings of the reference block."""
    from knapformer.calibration.run import calibrate as run_calibration
    from knapformer.calibration.run import plot_fit

    if repeats < 1 or warmup < 0 or threads < 1:
        typer.echo("error: need --repeats >= 1, --warmup >= 0, --threads >= 1", err=True)
        raise typer.Exit(2)
    log = (lambda m: typer.echo(m, err=True)) if json_out else typer.echo
    try:
        report = run_calibration(
            d_model=d_model,
            heads=heads,
            lengths=_ints(lengths, "--lengths"),
            bag_sizes=_ints(bag_sizes, "--bag-sizes"),
            repeats=repeats,
            warmup=warmup,
            threads=threads,
            device=device,
            measure_comm=comm,
            min_time_s=min_time,
            log=log,
        )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    p = report.profile
    try:
        if out is not None:
            p.save(out)
        if plot is not None:
            plot_fit(report, plot)
    except OSError as exc:
        typer.echo(f"error: cannot write output: {exc}", err=True)
        raise typer.Exit(2) from None
    if json_out:
        typer.echo(json.dumps(p.to_dict(), indent=2, sort_keys=True))
        return
    typer.echo(
        f"profile {p.name}: a={p.a:.4g} s/token, b={p.b:.4g} s/token^2, c={p.c:.4g} s/token, "
        f"e={p.e:.4g} s"
    )
    typer.echo(
        f"held-out MAPE {report.heldout_mape:.2f}% (lengths {list(report.lengths_heldout)}), "
        f"fit MAPE {report.fit_mape:.2f}%, {report.elapsed_s:.1f} s"
    )
    if out is not None:
        typer.echo(f"saved {out}")
    if plot is not None:
        typer.echo(f"plot {plot}")
