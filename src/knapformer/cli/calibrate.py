"""`knapformer calibrate`: time the MMDiT's blocks here, fit the cost model, save a profile."""

from __future__ import annotations

from pathlib import Path

import typer

from appshell.atomic import check_outputs
from appshell.cli import (
    DeviceOption,
    JsonFlag,
    UserError,
    note,
    parse_device,
    print_json,
    progress,
)
from knapformer.cli.app import app


def _ints(text: str, what: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out:
        raise UserError(f"{what} must be comma-separated integers, got {text!r}")
    return out


@app.command()
def calibrate(
    preset: str = typer.Option(
        "cpu", help="MMDiT preset whose blocks are timed: tiny, cpu, small or flux."
    ),
    d_model: int | None = typer.Option(None, help="Model width (default: the preset's)."),
    heads: int | None = typer.Option(
        None, help="Attention heads (default: the preset's; every bag size must divide it)."
    ),
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
    device: DeviceOption = None,  # type: ignore[assignment]  (default: cuda if available)
    comm: bool = typer.Option(True, help="Measure 2-process gloo all-to-all for the c term."),
    out: Path = typer.Option(None, help="Write the profile JSON here (atomic)."),
    plot: Path = typer.Option(None, help="Write a PNG of measured vs fitted times."),
    json_out: JsonFlag = False,
) -> None:
    """Fit t(L, g) = (a*L + b*L^2)/g + c*L*(g-1)/g + e (and the per-call f) to timings of the
    MMDiT's double- and single-stream blocks, the model `knapformer train` trains."""
    from knapformer.calibration.run import calibrate as run_calibration
    from knapformer.calibration.run import plot_fit

    if repeats < 1 or warmup < 0 or threads < 1:
        raise UserError("need --repeats >= 1, --warmup >= 0, --threads >= 1")
    if not min_time >= 0:
        raise UserError(f"--min-time must be >= 0 seconds, got {min_time}")
    if device is not None:
        device = str(parse_device(device))
    check_outputs(out, plot)  # before the timings, not after them
    log = note if json_out else typer.echo
    with progress("timing the MMDiT's blocks", counted=True) as bar:
        report = run_calibration(
            preset=preset,
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
            on_run=bar,
        )
    p = report.profile
    if out is not None:
        p.save(out)
    if plot is not None:
        plot_fit(report, plot)
    if json_out:
        print_json(p.to_dict())
        return
    typer.echo(
        f"profile {p.name}: a={p.a:.4g} s/token, b={p.b:.4g} s/token^2, c={p.c:.4g} s/token, "
        f"e={p.e:.4g} s/sequence, f={p.f:.4g} s/step"
    )
    typer.echo(
        f"held-out MAPE {report.heldout_mape:.2f}% (lengths {list(report.lengths_heldout)}), "
        f"fit MAPE {report.fit_mape:.2f}%, {report.elapsed_s:.1f} s"
    )
    if out is not None:
        typer.echo(f"saved {out}")
    if plot is not None:
        typer.echo(f"plot {plot}")
