"""Measured step-time speedup of balanced MMDiT training: no balancer vs fixed specs vs auto
(gloo, CPU).

    .venv/bin/python benchmarks/train_balance.py [--world-sizes 2,4] [--steps 20] [--json]
        [--set SECTION.KEY=VALUE ...]   (config overrides, e.g. model.d_model=256)

For each world size the same data (a skewed image+video mixture scaled to the CPU) is trained
three ways side by side in the same ranks (gloo, spawned, one thread each, each rank pinned to
its own core with ``os.sched_setaffinity``), with the trainer's own ``build_run`` /
``train_step``: ``none``, a fixed spec (g2n1 / g4n1) and ``auto``. Every step each run trains on
the same batch, one after the other in a rotating order (interleaved), so load drift on a
shared machine hits the three alike. The cost model is calibrated once per block type (double /
single stream, forward + backward; held-out MAPE printed) and given to both balancers; with
``--cost calibrate`` the ranks then measure in place ``u``, the fixed per-step cost of a rank in
a g > 1 bag (``measure_bag_overhead``), as the trainer's ``cost = "calibrate"`` does.

Reported per run (medians over the steps after ``--warmup``):

* ``wall_speedup``: median ``step_wall_s`` of ``none`` over the run's median ``step_wall_s`` (the
  slowest rank's wall time from the step's start to the end of its optimiser step, so the
  all-to-alls and every wait are in it): what a training step gains;
* per-rank busy max/mean (``rank_busy_s``: thread CPU time of forward + backward);
* ``of ideal``: ``wall_speedup`` over the ideal, the unbalanced run's measured busy max/mean
  (what perfect balance of the busy time would give if nothing else changed). Nothing measured on
  the balanced runs enters the ideal;
* the largest relative loss difference to the unbalanced run over all steps.

Targets (issue 24): wall_speedup >= 1.3 at 2 ranks where the unbalanced max/mean is >= 1.5;
losses equal to fp32 tolerance at every step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: World size -> data codes: rank 0.. hold images, the last rank one long smooth video.
CODES = {
    2: "g1b3i128f1s0,g1b1i128f68s1",
    4: "g3b3i128f1s0,g1b1i128f68s1",
}
FIXED = {2: "g2n1", 4: "g4n1"}
#: Config overrides (``--set``) applied by default: none, configs/tiny.toml as it is
#: (``--set model.d_model=256 --set "model.axes_dim=[16, 24, 24]"`` measures a wider model).
DEFAULT_SETS: list[str] = []


def _rank_main(
    rank: int,
    world: int,
    cfg: Any,
    modes: list[str],
    rdzv: str,
    out: str,
    bag_overhead: bool,
    cores: list[int],
) -> None:
    """One rank: the three runs side by side, one step of each in turn (rotating the order)."""
    import dataclasses
    import datetime

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from knapformer.calibration.clock import CPUClock
    from knapformer.data.synthetic import SyntheticMixture
    from knapformer.planning.cost import CostModel
    from knapformer.train.costs import flops_cost, measure_bag_overhead
    from knapformer.train.step import build_run, train_step

    os.sched_setaffinity(0, {cores[rank % len(cores)]})  # each rank its own core
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{rdzv}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=cfg.train.timeout_s),
    )
    try:
        mcfg = cfg.model_config()
        cost = (
            flops_cost(mcfg, cfg.balance.gamma)
            if cfg.balance.cost == "flops"
            else CostModel.load(cfg.balance.cost)
        )
        data = SyntheticMixture(
            cfg.data.codes, mcfg, world, text_tokens_max=cfg.data.text_tokens_max,
            patch_px=cfg.data.patch_px, seed=cfg.data.seed,
        )  # fmt: skip
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
        bag: dict[str, Any] = {}
        if bag_overhead:  # the calibration's in-place part: u, on these ranks
            cost, bag = measure_bag_overhead(cfg, cost, mesh, torch.device("cpu"))
        runs = {}
        for m in modes:
            mode_cfg = dataclasses.replace(
                cfg, balance=dataclasses.replace(cfg.balance, balancer=m)
            )
            runs[m] = build_run(mode_cfg, cost, mesh, torch.device("cpu"))
        clock = CPUClock()
        recs: dict[str, list[dict]] = {m: [] for m in modes}
        for step in range(1, cfg.train.steps + 1):
            tb = data.batch(step, rank)
            k = step % len(modes)
            for m in modes[k:] + modes[:k]:
                model, bal, optim = runs[m]
                dist.barrier()  # every run starts its step together, as in a real job
                recs[m].append(
                    train_step(model, bal, optim, tb, step, cost, clock, torch.device("cpu"))
                )
        if rank == 0:
            Path(out).write_text(json.dumps({"records": recs, "bag_overhead": bag, "u": cost.u}))
    finally:
        dist.destroy_process_group()


def _run_world(
    cfg_path: Path,
    world: int,
    modes: list[str],
    steps: int,
    cost: str,
    tmp: Path,
    sets: list[str],
    bag_overhead: bool,
) -> dict[str, Any]:
    import torch.multiprocessing as mp

    from knapformer.train.config import load_config
    from knapformer.train.launch import flag_overrides

    cfg = load_config(
        cfg_path,
        flag_overrides(steps=steps, data_codes=CODES[world], cost=cost, progress=False, sets=sets),
    )
    out = tmp / f"world{world}.json"
    cores = sorted(os.sched_getaffinity(0))
    mp.start_processes(
        _rank_main,
        args=(world, cfg, modes, str(tmp / f"rdzv{world}"), str(out), bag_overhead, cores),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    return json.loads(out.read_text())


def _summary(recs: list[dict], warmup: int) -> dict[str, Any]:
    rs = recs[warmup:]
    busy = np.array([r["rank_busy_s"] for r in rs])
    wall = np.array([r["step_wall_s"] for r in rs])
    return {
        "layouts": sorted({r["layout"] for r in rs}),
        "median_step_wall_s": float(np.median(wall)),
        "busy_max_over_mean": float(np.median(busy.max(1) / busy.mean(1))),
        "max_rank_busy_s": float(np.median(busy.max(1))),
        "modelled_max_over_mean": float(np.mean([r["modelled_max_over_mean"] for r in rs])),
        "plan_ms": float(np.mean([r["plan_ms"] for r in rs])),
        "losses": [r["loss"] for r in recs],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "tiny.toml"))
    ap.add_argument("--world-sizes", default="2,4")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the figures")
    ap.add_argument("--cost", default="calibrate", help="calibrate | flops | PROFILE.json")
    ap.add_argument(
        "--set",
        action="append",
        dest="sets",
        metavar="SECTION.KEY=VALUE",
        help="config override, e.g. model.d_model=256 (repeatable)",
    )
    ap.add_argument(
        "--no-bag-overhead",
        action="store_true",
        help="with --cost calibrate: skip measuring u (the fixed cost of a rank in a g > 1 bag)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    sets = DEFAULT_SETS if args.sets is None else args.sets
    worlds = [int(w) for w in args.world_sizes.split(",") if w.strip()]
    bad = [w for w in worlds if w not in CODES]
    if bad or args.steps <= args.warmup:
        print(
            f"error: world sizes must be among {sorted(CODES)} and --steps > --warmup",
            file=sys.stderr,
        )
        return 2
    from rich.progress import Progress

    from knapformer.train.config import load_config
    from knapformer.train.costs import calibrate_blocks
    from knapformer.train.launch import flag_overrides

    say = (lambda *_a: None) if args.json else print
    t0 = time.perf_counter()
    result: dict[str, Any] = {
        "config": args.config,
        "overrides": sets,
        "steps": args.steps,
        "warmup": args.warmup,
        "load_average_start": list(os.getloadavg()),  # (cores shared with other jobs)
    }
    with tempfile.TemporaryDirectory(prefix="kf-train-balance-") as tmp:
        cost = args.cost
        if cost == "calibrate":
            import torch

            from knapformer.data.synthetic import SyntheticMixture

            torch.set_num_threads(1)
            mcfg = load_config(args.config, flag_overrides(sets=sets)).model_config()
            longest = max(
                max(SyntheticMixture(CODES[w], mcfg, w).lengths(s, r))
                for w in worlds
                for s in range(1, 4)
                for r in range(w)
            )
            lengths = np.unique(np.geomspace(64, longest, 11).astype(int)).tolist()
            bags = [g for g in (1, 2, 4) if g <= max(worlds) and mcfg.num_heads % g == 0]
            say(f"calibrating double/single-stream blocks at L={lengths}, g={bags} ...")
            costs = calibrate_blocks(mcfg, lengths, bags, repeats=13, min_time_s=0.3)
            cost = str(Path(tmp) / "profile.json")
            costs.total.save(cost)
            result["calibration"] = {
                "heldout_mape_percent": costs.heldout_mape,
                "fit_mape_percent": costs.fit_mape,
                "lengths_heldout": list(costs.lengths_heldout),
                "target_met": max(costs.heldout_mape.values()) <= 5.0,
                "per_sequence_e_s": costs.total.e,
                "per_rank_f_s": costs.total.f,
            }
            say(
                "held-out MAPE per block type: "
                + ", ".join(f"{k} {v:.2f}%" for k, v in costs.heldout_mape.items())
            )
        result["cost"] = args.cost
        bag_overhead = args.cost == "calibrate" and not args.no_bag_overhead
        per_world: dict[str, Any] = {}
        with Progress(disable=args.json, transient=True) as prog:
            task = prog.add_task("interleaved runs per world size", total=len(worlds))
            for w in worlds:
                modes = ["none", FIXED[w], "auto"]
                got = _run_world(
                    Path(args.config), w, modes, args.steps, cost, Path(tmp), sets, bag_overhead
                )
                recs = got["records"]
                result.setdefault("bag_overhead", {})[str(w)] = got["bag_overhead"]
                per_world[str(w)] = {m: _summary(recs[m], args.warmup) for m in modes}
                prog.advance(task)
    for w in worlds:
        runs_w = per_world[str(w)]
        base = runs_w["none"]
        ideal = base["busy_max_over_mean"]  # measured on the unbalanced run only
        for b in (FIXED[w], "auto"):
            r = runs_w[b]
            r["wall_speedup"] = base["median_step_wall_s"] / r["median_step_wall_s"]
            r["ideal"] = ideal
            r["fraction_of_ideal"] = r["wall_speedup"] / ideal
            r["max_rel_loss_diff_vs_none"] = float(
                max(abs(x - y) / abs(y) for x, y in zip(r["losses"], base["losses"], strict=True))
            )
    result["worlds"] = per_world
    result["cores"] = len(os.sched_getaffinity(0))
    two = per_world.get("2")
    result["targets"] = {
        "wall_speedup_ge_1.3_at_2_where_none_ge_1.5": (
            None
            if two is None or two["none"]["busy_max_over_mean"] < 1.5
            else two["auto"]["wall_speedup"] >= 1.3
        ),
        "losses_equal_fp32": all(
            per_world[str(w)][b]["max_rel_loss_diff_vs_none"] <= 1e-4
            for w in worlds
            for b in (FIXED[w], "auto")
        ),
    }
    result["elapsed_s"] = time.perf_counter() - t0
    result["load_average_end"] = list(os.getloadavg())
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{args.config} with {' '.join(sets) or 'no overrides'}: {args.steps} steps "
        f"(first {args.warmup} left out), cost {args.cost}"
    )
    print(
        f"{'world':>5} {'balancer':>9} {'layouts':>18} {'step wall s':>11} {'wall_speedup':>12} "
        f"{'ideal':>6} {'of ideal':>8} {'busy max/mean':>13} {'modelled':>9} "
        f"{'loss rel diff':>13}"
    )
    for w in worlds:
        for b, r in per_world[str(w)].items():
            lay = ",".join(r["layouts"])[:18]
            sp = r.get("wall_speedup")
            print(
                f"{w:>5} {b:>9} {lay:>18} {r['median_step_wall_s']:>11.4f} "
                + (
                    f"{sp:>12.3f} {r['ideal']:>6.3f} {100 * r['fraction_of_ideal']:>7.1f}% "
                    if sp is not None
                    else f"{'1 (base)':>12} {'':>6} {'':>8} "
                )
                + f"{r['busy_max_over_mean']:>13.3f} {r['modelled_max_over_mean']:>9.3f} "
                + (f"{r['max_rel_loss_diff_vs_none']:>13.2e}" if sp is not None else f"{'':>13}")
            )
    for w, m in result.get("bag_overhead", {}).items():
        if m.get("unmodelled_s"):
            print(
                f"fixed cost of a rank in a g-bag (world {w}, measured in place): "
                f"u={m['u'] * 1e3:.1f} ms * (g-1)/g"
            )
    print(f"ranks pinned one per core ({result['cores']} cores available; ranks beyond that share)")
    print("targets: " + ", ".join(f"{k}={v}" for k, v in result["targets"].items()))
    la0, la1 = result["load_average_start"][0], result["load_average_end"][0]
    print(f"elapsed {result['elapsed_s']:.0f} s; load average (1 min) {la0:.1f} -> {la1:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
