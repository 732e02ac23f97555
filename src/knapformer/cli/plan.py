"""`knapformer plan`: balance one step of given sequence lengths and report the plan."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer

from appshell.cli import JsonFlag, UserError, choice_enum, print_json, status
from appshell.inputs import load_json
from knapformer.cli.app import app
from knapformer.cli.options import DModel, Gamma, GpusPerNode, Heads, Profile
from knapformer.planning.solvers import ALIASES, DEFAULT_SOLVER, SOLVERS

Solver = choice_enum("Solver", [DEFAULT_SOLVER, *sorted(set(SOLVERS) - {DEFAULT_SOLVER}), *ALIASES])


class _InputError(UserError):
    pass


def load_lengths(path: Path) -> list[list[int]]:
    """Read ``{"ranks": [[len, ...], ...]}``; raise a one-line UserError on bad content."""
    doc = load_json(path, what="lengths file")
    if not isinstance(doc, dict) or "ranks" not in doc:
        raise _InputError(f'{str(path)!r} must be a JSON object with a "ranks" list')
    ranks = doc["ranks"]
    if not isinstance(ranks, list) or not ranks:
        raise _InputError(f'"ranks" in {str(path)!r} must be a non-empty list of lists')
    out: list[list[int]] = []
    for r, row in enumerate(ranks):
        if not isinstance(row, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in row
        ):
            raise _InputError(f"rank {r} in {str(path)!r} must be a list of integer lengths")
        out.append(row)
    return out


def warm_planner() -> None:
    """Compile (first use in an environment, tens of seconds) or load from numba's cache the
    planner's kernels under a spinner, so that wait is explained instead of looking like a
    hang."""
    from knapformer.planning.solvers import fast

    if fast.kernels() is not None:
        with status("planner kernels: compiled once on first use (up to a minute), then cached"):
            fast.warm_up()


def _fmt_loads(before: Any, after: Any, mean: float, bag_of_rank: Any, sizes: Any) -> str:
    lines = ["rank  bag  g   before  after   (per-GPU load / mean)"]
    for r in range(len(before)):
        b = int(bag_of_rank[r])
        lines.append(
            f"{r:4d} {b:4d} {int(sizes[b]):2d}  {before[r] / mean:7.3f} {after[r] / mean:7.3f}"
        )
    return "\n".join(lines)


@app.command()
def plan(
    lengths: Path = typer.Option(
        ..., help='JSON file {"ranks": [[len, ...], ...]}, one list per rank.'
    ),
    spec: str = typer.Option(..., help="Bag layout g<G>n<N>+... (e.g. g1n16+g2n4+g4n2) or 'auto'."),
    d_model: DModel = 3072,
    gamma: Gamma = 1.0,
    a2a_flops_per_byte: float = typer.Option(
        0.0, help="Price of Ulysses all-to-all bytes in FLOPs (0 = compute only)."
    ),
    heads: Heads = 24,
    solver: Solver = typer.Option(
        "local-search",
        help="local-search (default, alias ours: never worse than reference), reference "
        "(the published greedy) or exact (HiGHS MILP, small instances).",
    ),
    gpus_per_node: GpusPerNode = 8,
    max_tokens_per_gpu: int = typer.Option(None, help="Per-GPU token budget after routing."),
    profile: Profile = None,
    time_limit: float = typer.Option(
        10.0, help="Seconds for --solver exact, building its model included."
    ),
    json_out: JsonFlag = False,
) -> None:
    """Plan one step: sequence -> bag assignment, per-GPU loads, lower bound and gap."""
    import numpy as np

    from knapformer.planning.auto import choose_layout
    from knapformer.planning.cost import CostModel
    from knapformer.planning.layout import BagLayout, LayoutError
    from knapformer.planning.plan import plan_step

    solver = solver.value
    if not (math.isfinite(time_limit) and time_limit > 0):
        raise _InputError(f"time_limit must be a finite number > 0 (--time-limit {time_limit})")
    with status(f"reading {lengths}"):  # a million sequences take seconds to parse
        ranks = load_lengths(lengths)
    world = len(ranks)
    if profile is not None:
        cost = CostModel.load(profile)
    else:
        cost = CostModel.flops(d_model, gamma, a2a_flops_per_byte=a2a_flops_per_byte)
    if gpus_per_node < 1:
        raise _InputError("--gpus-per-node must be >= 1")
    warm_planner()
    if spec.strip().lower() == "auto":
        with status("choosing the layout"):
            spec_used = choose_layout(ranks, world, heads, gpus_per_node, cost)
    else:
        spec_used = spec
    layout = BagLayout.parse(spec_used, world, heads)
    for ranks_of_bag in layout.bag_ranks:
        if ranks_of_bag[0] // gpus_per_node != ranks_of_bag[-1] // gpus_per_node:
            raise LayoutError(
                f"bag on ranks {ranks_of_bag[0]}..{ranks_of_bag[-1]} of {spec_used!r} spans "
                f"two nodes (--gpus-per-node {gpus_per_node})"
            )
    options: dict[str, Any] = {}
    if max_tokens_per_gpu is not None:
        options["max_tokens_per_gpu"] = max_tokens_per_gpu
    if solver == "exact":
        options["time_limit"] = time_limit
    n = sum(len(r) for r in ranks)
    limit = f", at most {time_limit:g} s" if solver == "exact" else ""
    with status(f"planning {n:,} sequences on {world} GPUs ({solver}{limit})"):
        p = plan_step(ranks, layout, cost, solver=solver, **options)
    summary = p.summary()
    summary["requested_spec"] = spec
    summary["cost"] = cost.name
    if max_tokens_per_gpu is not None:
        summary["max_tokens_per_gpu"] = max_tokens_per_gpu
        summary["max_tokens_on_a_gpu"] = int(p.tokens_per_gpu().max())
    if json_out:
        m = p.mean_load if p.mean_load > 0 else 1.0
        summary["load_before_over_mean"] = [round(x, 4) for x in (p.load_before / m).tolist()]
        summary["load_after_over_mean"] = [round(x, 4) for x in (p.load_after / m).tolist()]
        print_json(summary, indent=None)
        return
    sizes = np.asarray(layout.bag_sizes)
    typer.echo(
        f"{p.num_sequences} sequences on {world} GPUs, layout {layout.spec}"
        f"{' (auto)' if spec.strip().lower() == 'auto' else ''}, solver {solver}, cost {cost.name}"
    )
    typer.echo(_fmt_loads(p.load_before, p.load_after, p.mean_load, layout.bag_of_rank, sizes))
    typer.echo(
        f"max/mean: before {p.unbalanced_max_over_mean:.4f}  after "
        f"{p.balanced_max_over_mean:.4f}  lower bound {p.lower_bound_over_mean:.4f}  "
        f"gap {p.gap:.3%}"
    )
    typer.echo(
        f"tokens moved {p.tokens_moved_fraction:.1%}  tokens through SP all-to-alls "
        f"{p.sp_tokens_fraction:.1%}  planning {p.plan_ms:.2f} ms"
    )
