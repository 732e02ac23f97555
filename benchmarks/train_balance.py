"""Measured per-rank balance of MMDiT training: no balancer vs a fixed spec vs auto (gloo, CPU).

    .venv/bin/python benchmarks/train_balance.py [--world-sizes 2,4] [--steps 20] [--json]
        [--set SECTION.KEY=VALUE ...]   (config overrides, e.g. model.d_model=256)

For each world size the same data (a skewed image+video mixture scaled to the CPU) is trained
three ways side by side in the same ranks (gloo, spawned, one thread each), with the trainer's own
``build_run`` / ``train_step``: ``none``, a fixed spec (g2n1 / g4n1) and ``auto``. Every step
each run trains on the same batch, one after the other in a rotating order, so load drift on a
shared machine hits the three alike. The cost model is calibrated once per block type (double /
single stream, forward + backward; held-out MAPE printed; per-sequence constant ``e`` and
per-call constant ``f`` separated by timing packed calls) and given to both balancers; with
``--cost calibrate`` the ranks then measure in place ``u``, the fixed per-step cost of a rank in a
g > 1 bag (``measure_bag_overhead``: uniform data, g1nW against every gGnW/G), as the trainer's
``cost = "calibrate"`` does. The modelled per-rank times (``CostModel.rank_time``) include ``f``
and ``u``; ``--no-bag-overhead`` leaves ``u`` out.
Reported per run (medians over the steps after ``--warmup``):

* per-rank compute max/mean, from thread CPU time (robust when cores are shared);
* max-rank compute ratio against ``none`` = the step speedup with one core per rank;
* the modelled ideal of that ratio and the fraction reached: a step model
  ``cpu = E + k * modelled_load`` is fitted on the unbalanced run (``E``: what every rank pays per
  step whatever its data: Python/kernel-call overheads, FSDP, embeddings) and evaluated at the
  unbalanced and the balanced modelled makespans of each step (also without ``u``, i.e. what
  the planner's loads alone promise: ``fraction_of_ideal_without_u``);
* the largest relative loss difference to the unbalanced run over all steps.

Targets (issue 10): auto max/mean <= 1.05, none >= 2 (at 4 ranks), ratio >= 90% of the ideal,
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
    rank: int, world: int, cfg: Any, modes: list[str], rdzv: str, out: str, bag_overhead: bool
) -> None:
    """One rank: the three runs side by side, one step of each in turn (rotating the order)."""
    import dataclasses
    import datetime

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from knapformer.data.synthetic import SyntheticMixture
    from knapformer.planning.cost import CostModel
    from knapformer.train.costs import flops_cost, measure_bag_overhead
    from knapformer.train.step import ThreadClock, build_run, train_step

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
        clock = ThreadClock()
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
    mp.start_processes(
        _rank_main,
        args=(world, cfg, modes, str(tmp / f"rdzv{world}"), str(out), bag_overhead),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    return json.loads(out.read_text())


def _step_model(recs: list[dict], warmup: int) -> tuple[float, float, float]:
    """Fit ``cpu = E + k * modelled_load`` over the ranks and steps of the unbalanced run.

    ``E`` is what every rank pays per step whatever its sequences (Python and kernel-call
    overheads, FSDP, embeddings), ``k`` converts cost-model units to CPU seconds. Returns
    ``(E, k, r2)``.
    """
    rs = recs[warmup:]
    y = np.concatenate([r["rank_compute_cpu_s"] for r in rs])
    x = np.concatenate([r["rank_modelled_load"] for r in rs])
    A = np.stack([np.ones_like(x), x], axis=1)
    (E, k), *_ = np.linalg.lstsq(A, y, rcond=None)
    r2 = 1.0 - float(np.sum((A @ [E, k] - y) ** 2) / np.sum((y - y.mean()) ** 2))
    return max(float(E), 0.0), float(k), r2


def _summary(
    recs: list[dict], warmup: int, step_model: tuple[float, float, float] | None, u: float = 0.0
) -> dict[str, Any]:
    rs = recs[warmup:]
    cpu = np.array([r["rank_compute_cpu_s"] for r in rs])
    wall = np.array([r["rank_compute_wall_s"] for r in rs])
    out = {
        "layouts": sorted({r["layout"] for r in rs}),
        "cpu_max_over_mean": float(np.median(cpu.max(1) / cpu.mean(1))),
        "wall_max_over_mean": float(np.median(wall.max(1) / wall.mean(1))),
        "max_rank_cpu_s": float(np.median(cpu.max(1))),
        "total_cpu_s": float(np.median(cpu.sum(1))),
        "modelled_max_over_mean": float(np.mean([r["modelled_max_over_mean"] for r in rs])),
        "plan_ms": float(np.mean([r["plan_ms"] for r in rs])),
        "losses": [r["loss"] for r in recs],
    }
    if "modelled_speedup" in rs[0] and step_model is not None:
        # Unbalanced / balanced modelled max-rank time, with the step model fitted on the
        # unbalanced run (the per-rank overhead E is paid by every rank in both runs).
        E, k, _ = step_model
        before = E + k * np.array([r["modelled_unbalanced_makespan"] for r in rs])
        after = E + k * np.array([r["modelled_makespan"] for r in rs])
        out["modelled_ideal_ratio"] = float(np.median(before / after))
        # The same without the bag's fixed cost u (what the planner's loads alone promise).
        g = np.array([r["rank_bag_size"] for r in rs], dtype=np.float64)
        loads = np.array([r["rank_modelled_load"] for r in rs]) - u * (g - 1) / g
        out["modelled_ideal_ratio_without_u"] = float(np.median(before / (E + k * loads.max(1))))
    return out


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
                step_model = _step_model(recs["none"], args.warmup)
                result.setdefault("step_model", {})[str(w)] = {
                    "per_rank_overhead_s": step_model[0],
                    "s_per_cost_unit": step_model[1],
                    "r2": step_model[2],
                }
                per_world[str(w)] = {
                    m: _summary(recs[m], args.warmup, step_model, got["u"]) for m in modes
                }
                prog.advance(task)
    for w in worlds:
        runs_w = per_world[str(w)]
        base = runs_w["none"]
        for b in (FIXED[w], "auto"):
            r = runs_w[b]
            r["max_rank_ratio_vs_none"] = base["max_rank_cpu_s"] / r["max_rank_cpu_s"]
            r["fraction_of_ideal"] = r["max_rank_ratio_vs_none"] / r["modelled_ideal_ratio"]
            r["fraction_of_ideal_without_u"] = (
                r["max_rank_ratio_vs_none"] / r["modelled_ideal_ratio_without_u"]
            )
            r["max_rel_loss_diff_vs_none"] = float(
                max(abs(x - y) / abs(y) for x, y in zip(r["losses"], base["losses"], strict=True))
            )
    result["worlds"] = per_world
    auto = [per_world[str(w)]["auto"] for w in worlds]
    result["targets"] = {
        "auto_cpu_max_over_mean_le_1.05": all(a["cpu_max_over_mean"] <= 1.05 for a in auto),
        "none_cpu_max_over_mean_ge_2_at_4": (
            per_world["4"]["none"]["cpu_max_over_mean"] >= 2.0 if "4" in per_world else None
        ),
        "ratio_ge_90pct_of_ideal": all(a["fraction_of_ideal"] >= 0.9 for a in auto),
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
        f"{'world':>5} {'balancer':>9} {'layouts':>18} {'cpu max/mean':>12} {'modelled':>9} "
        f"{'ratio vs none':>13} {'ideal':>6} {'of ideal':>8} {'loss rel diff':>13} "
        f"{'max rank s':>10} {'sum ranks s':>11}"
    )
    for w in worlds:
        for b, r in per_world[str(w)].items():
            lay = ",".join(r["layouts"])[:18]
            ratio = r.get("max_rank_ratio_vs_none")
            print(
                f"{w:>5} {b:>9} {lay:>18} {r['cpu_max_over_mean']:>12.3f} "
                f"{r['modelled_max_over_mean']:>9.3f} "
                + (
                    f"{ratio:>13.3f} {r['modelled_ideal_ratio']:>6.3f} "
                    f"{100 * r['fraction_of_ideal']:>7.1f}% "
                    f"{r['max_rel_loss_diff_vs_none']:>13.2e}"
                    if ratio is not None
                    else f"{'1 (base)':>13} {'':>6} {'':>8} {'':>13}"
                )
                + f" {r['max_rank_cpu_s']:>10.3f} {r['total_cpu_s']:>11.3f}"
            )
    for w, m in result.get("step_model", {}).items():
        print(
            f"step model (world {w}, fitted on 'none'): E={m['per_rank_overhead_s'] * 1e3:.1f} ms "
            f"per rank, R^2={m['r2']:.3f}"
        )
    for w, m in result.get("bag_overhead", {}).items():
        if m.get("unmodelled_s"):
            print(
                f"fixed cost of a rank in a g-bag (world {w}, measured in place): "
                f"u={m['u'] * 1e3:.1f} ms * (g-1)/g; of ideal without it: "
                + ", ".join(
                    f"{b} {100 * r['fraction_of_ideal_without_u']:.1f}%"
                    for b, r in per_world[w].items()
                    if "fraction_of_ideal_without_u" in r
                )
            )
    print("targets: " + ", ".join(f"{k}={v}" for k, v in result["targets"].items()))
    la0, la1 = result["load_average_start"][0], result["load_average_end"][0]
    print(f"elapsed {result['elapsed_s']:.0f} s; load average (1 min) {la0:.1f} -> {la1:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
