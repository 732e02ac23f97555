"""`knapformer simulate`: balancing strategies side by side on sampled or given steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from appshell.atomic import check_output_dir
from appshell.cli import JsonFlag, UserError, choice_enum, note, print_json, progress
from knapformer.cli.app import app
from knapformer.cli.options import DModel, Gamma, GpusPerNode, Heads, Profile
from knapformer.sim.datacodes import MIXTURES

Mixture = choice_enum("Mixture", MIXTURES)


def _table(rows: list[dict[str, Any]]) -> str:
    cols = [
        ("strategy", "strategy", "{}"),
        ("spec", "spec", "{}"),
        ("unbal max/mean", "unbalanced_max_over_mean", "{:.4f}"),
        ("max/mean", "balanced_max_over_mean", "{:.4f}"),
        ("LB/mean", "lower_bound_over_mean", "{:.4f}"),
        ("median gap %", "median_gap", "{:.3%}"),
        ("SP tokens %", "sp_tokens_fraction", "{:.1%}"),
        ("moved %", "tokens_moved_fraction", "{:.1%}"),
        ("plan ms", "plan_ms", "{:.2f}"),
    ]
    cells = [[h for h, _, _ in cols]]
    for r in rows:
        cells.append(
            [
                f.format(r[k]).rstrip("%") if k == "median_gap" else f.format(r[k])
                for _, k, f in cols
            ]
        )
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    lines = [
        "  ".join(
            c.rjust(w) if i > 1 else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in cells
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


@app.command()
def simulate(
    mixture: Mixture = typer.Option(None, help="A mixture of the paper."),
    data_codes: str = typer.Option(None, help="Data codes g<G>b<B>i<R>f<F>s<S>,..."),
    lengths: Path = typer.Option(None, help='JSON {"ranks": [[len,...],...]} or {"steps": [...]}'),
    gpus: int = typer.Option(None, help="World size (a multiple of the mixture's GPU count)."),
    steps: int = typer.Option(20, help="Sampled steps (ignored with --lengths)."),
    spec: str = typer.Option(..., help="Bag layout g<G>n<N>+... or 'auto'."),
    gamma: Gamma = 1.0,
    d_model: DModel = 3072,
    heads: Heads = 24,
    gpus_per_node: GpusPerNode = 8,
    profile: Profile = None,
    hysteresis: float = typer.Option(
        0.02, help="--spec auto: keep the previous layout unless the best is this much better."
    ),
    seed: int = typer.Option(0, help="Sampler seed."),
    json_out: JsonFlag = False,
    plot_dir: Path = typer.Option(None, help="Write loads.png and routing.png here."),
) -> None:
    """Compare no balancing, the published greedy (given and best homogeneous spec) and ours."""
    from knapformer.planning.cost import CostModel
    from knapformer.sim import datacodes as dc
    from knapformer.sim.simulator import simulate as run_simulation

    sources = [x for x in (mixture, data_codes, lengths) if x is not None]
    if len(sources) != 1:
        raise UserError("give exactly one of --mixture, --data-codes or --lengths")
    if not 0 <= hysteresis <= 1:  # also refuses NaN
        raise UserError(f"--hysteresis must be a number in [0, 1], got {hysteresis}")
    if steps < 1:
        raise UserError(f"--steps must be >= 1, got {steps}")
    if lengths is not None:
        all_steps = dc.load_lengths_file(lengths)
        if gpus is not None and gpus != len(all_steps[0]):
            raise UserError(f"--gpus {gpus} but {lengths} has {len(all_steps[0])} ranks")
    else:
        if gpus is None:
            raise UserError("--gpus is required with --mixture or --data-codes")
        mix = (
            dc.resolve_mixture(mixture.value)
            if mixture is not None
            else dc.parse_data_codes(data_codes)
        )
        all_steps = dc.sample_steps(mix, gpus, steps, seed)
        if gpus != mix.gpus:
            note(
                f"note: the mixture describes {mix.gpus} GPUs; {gpus} GPUs = "
                f"{gpus // mix.gpus} independent replicas of it (contiguous ranks)"
            )
    cost = CostModel.load(profile) if profile is not None else CostModel.flops(d_model, gamma)
    if plot_dir is not None:
        check_output_dir(plot_dir)  # before the run, not after it
    from knapformer.cli.plan import warm_planner

    warm_planner()
    with progress("planning steps (every strategy)", counted=True) as bar:
        result = run_simulation(
            all_steps, cost, spec, heads, gpus_per_node, hysteresis=hysteresis, on_plan=bar
        )
    rows = result.summaries()
    if plot_dir is not None:
        from knapformer.sim.plots import plot_loads, plot_routing

        plot_loads(result.example_plans, plot_dir / "loads.png", title="step 0")
        if "ours" in result.example_plans:
            plot_routing(result.example_plans["ours"], plot_dir / "routing.png")
    if json_out:
        print_json(rows)
        return
    typer.echo(
        f"{len(all_steps)} steps, {len(all_steps[0])} GPUs, "
        f"{sum(len(r) for r in all_steps[0])} sequences/step, cost {cost.name}"
    )
    typer.echo(_table(rows))
    for r in rows:
        if "note" in r:
            typer.echo(f"{r['strategy']}: {r['note']}")
        if "specs_used" in r:
            typer.echo(f"{r['strategy']} layouts: {r['specs_used']}")
            typer.echo(f"{r['strategy']} layout choice: {r['layout_ms']:.2f} ms median per step")
    if plot_dir is not None:
        typer.echo(f"plots: {plot_dir / 'loads.png'}, {plot_dir / 'routing.png'}")
