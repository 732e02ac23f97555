"""Planner speed and quality: everything the planner costs per step, and its guarantee.

Usage: python benchmarks/planner_speed.py [--repeats R] [--exact N] [--plain] [--json]

The planner's hot loops are compiled numba kernels: ``kernels`` reports the one-off time to
compile them (first run in an environment) or load them from numba's cache (later runs), spent
once per process before anything is timed; every other figure is steady state. ``--plain``
also times the plain Python/numpy loops (same plans) in the same run, for ratios.

Sections (each printed as a table; ``--json`` prints one object):

* ``speed``: the default solver (``local-search``) and ``reference`` on 1,000 sequences on 32
  GPUs and 16,000 on 1,024 GPUs: median wall and CPU ms, "best ms" (median over instances of
  the fastest of ``--inner`` runs: on a shared machine the better estimate of an idle one),
  modelled max/mean, gap to the lower bound, share of tokens moved.
* ``guarantee``: the default solver against ``reference`` on random steps (lognormal, Pareto,
  image+video; 32 GPUs): how many plans are worse (must be 0), equal, better.
* ``auto``: the auto-layout decision per step on the paper mixtures at 1x and 3x their batch
  (89-336 sequences on 32 GPUs), wall and thread CPU time: steady state (the current layout is
  kept when the bounds show nothing beats it by the hysteresis) and the first step (no current
  layout; cold per-process caches, and warm), each as the median and the max over the steps.
* ``replica``: 32 replicas of a 32-GPU group (1,024 GPUs): planning the whole world, which
  every rank used to do, against planning one replica, which each rank does now.
* ``groups``: process groups auto needs at 1,024 GPUs (created lazily, when a layout is first
  chosen) against every node-local bag (created eagerly before).
* ``cuda_sync``: with CUDA, route/reverse_route/attention (forward and backward) run under
  ``torch.cuda.set_sync_debug_mode("error")`` (one rank, ``cpu:gloo,cuda:nccl``), with the same
  plan and right after a new ``plan_step``; skipped without CUDA. ``--exact N`` also compares
  with the HiGHS optimum on N small instances.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from typing import Any

import numpy as np

from knapformer.distributed.autolayout import AutoLayout
from knapformer.planning import DEFAULT_SOLVER, BagLayout, CostModel, plan_step
from knapformer.planning.solvers import fast
from knapformer.sim.datacodes import MIXTURES, parse_data_codes, resolve_mixture, sample_steps

COST = CostModel.flops(3072, 1.0)


def synthetic_lengths(num_seqs: int, world: int, seed: int) -> list[list[int]]:
    """Log-uniform lengths 256..16k tokens, spread unevenly over ranks (Dirichlet weights)."""
    rng = np.random.default_rng(seed)
    lengths = np.exp(rng.uniform(np.log(256), np.log(16384), size=num_seqs)).astype(np.int64)
    counts = rng.multinomial(num_seqs, rng.dirichlet(np.full(world, 2.0)))
    out, i = [], 0
    for c in counts.tolist():
        out.append(lengths[i : i + c].tolist())
        i += c
    return out


def realistic_lengths(kind: str, n: int, world: int, seed: int) -> list[list[int]]:
    """Lognormal, Pareto or image+video lengths, spread unevenly over the ranks."""
    rng = np.random.default_rng(seed)
    if kind == "lognormal":
        x = rng.lognormal(np.log(2000), 1.0, n)
    elif kind == "pareto":
        x = 256 * (1 + rng.pareto(1.2, n))
    else:
        img = (rng.choice([256, 512, 1024, 2048], n) // 16) ** 2
        vid = rng.random(n) < 0.1
        x = np.where(vid, img * rng.integers(4, 30, n), img) + rng.integers(0, 393, n)
    x = np.clip(x, 1, 200_000).astype(np.int64)
    counts = rng.multinomial(n, rng.dirichlet(np.full(world, 1.5)))
    return [p.tolist() for p in np.split(x, np.cumsum(counts)[:-1])]


CASES = [
    ("1k_seqs_32_gpus", 1000, 32, "g1n16+g2n4+g4n2"),
    ("1k_seqs_32_gpus_g4n8", 1000, 32, "g4n8"),
    ("1k_seqs_32_gpus_g8", 1000, 32, "g1n8+g2n4+g4n2+g8n1"),
    ("16k_seqs_1024_gpus_one_group", 16000, 1024, "g1n512+g2n128+g4n64"),
]


def _timed(fn, inner: int) -> tuple[Any, float, float, float]:
    """Result, wall ms, CPU ms of the first run, and the fastest wall ms of ``inner`` runs."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    wall, cpu = (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
    best = wall
    for _ in range(inner - 1):
        t0 = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0) * 1e3)
    return out, wall, cpu, best


def speed(repeats: int, solvers: list[str], inner: int, tick, plain: bool) -> list[dict]:
    plan_step(synthetic_lengths(100, 8, 0), BagLayout.parse("g1n4+g2n2", 8), COST)  # warm-up
    rows = []
    runs = [(s, k) for s in solvers for k in ((True, False) if plain else (True,))]
    for name, n, world, spec in CASES:
        layout = BagLayout.parse(spec, world, 24)
        for solver, kern in runs:
            if not kern and n > 1000:
                continue  # (plain versions: the 32-GPU cases are enough for the ratios)
            wall, cpu, best, plans = [], [], [], []
            for rep in range(repeats):
                lengths = synthetic_lengths(n, world, seed=rep)
                with fast.use_kernels(kern):
                    plan, w, c, b = _timed(
                        lambda lengths=lengths, layout=layout, solver=solver: plan_step(
                            lengths, layout, COST, solver=solver
                        ),
                        inner,
                    )
                wall.append(w)
                cpu.append(c)
                best.append(b)
                plans.append(plan)
            tick()
            rows.append(
                {
                    "case": name,
                    "spec": spec,
                    "solver": solver if kern else f"{solver} (plain)",
                    "compiled_kernels": kern and fast.kernels() is not None,
                    "num_sequences": n,
                    "world_size": world,
                    "median_ms": float(np.median(wall)),
                    "median_cpu_ms": float(np.median(cpu)),
                    "median_best_of_ms": float(np.median(best)),
                    "p90_ms": float(np.percentile(wall, 90)),
                    "median_balanced_max_over_mean": float(
                        np.median([p.balanced_max_over_mean for p in plans])
                    ),
                    "median_gap": float(np.median([p.gap for p in plans])),
                    "median_tokens_moved_fraction": float(
                        np.median([p.tokens_moved_fraction for p in plans])
                    ),
                }
            )
    return rows


def guarantee(cases: int, tick) -> dict:
    """Default solver vs reference, exact float comparison of the plans' makespans."""
    specs = ["g1n32", "g4n8", "g8n4", "g1n16+g2n4+g4n2", "g1n8+g2n4+g4n2+g8n1"]
    costs = [CostModel.flops(3072, 1.0), CostModel.flops(3072, 0.4)]
    worse = equal = better = 0
    best_gain = 0.0
    rng = np.random.default_rng(0)
    for i in range(cases):
        kind = ("lognormal", "pareto", "image+video")[i % 3]
        n = int(rng.integers(30, 1500))
        lengths = realistic_lengths(kind, n, 32, int(rng.integers(2**31)))
        layout = BagLayout.parse(specs[i % len(specs)], 32, 24)
        cost = costs[(i // len(specs)) % len(costs)]
        ours = plan_step(lengths, layout, cost).makespan
        ref = plan_step(lengths, layout, cost, solver="reference").makespan
        worse += ours > ref
        equal += ours == ref
        better += ours < ref
        best_gain = max(best_gain, 1.0 - ours / ref)
        if i % 20 == 19:
            tick()
    return {
        "cases": cases,
        "worse": int(worse),
        "equal": int(equal),
        "better": int(better),
        "largest_gain": best_gain,
    }


def _scaled(mixture: str, k: int) -> str:
    return re.sub(r"b(\d+)", lambda m: f"b{int(m.group(1)) * k}", MIXTURES[mixture])


def _cold_caches() -> None:
    """Forget every per-process cache the auto decision uses (parsed layouts, per-layout
    arrays): the next decision costs what the first one of a fresh process does."""
    from knapformer.planning import auto
    from knapformer.planning.solvers import problem

    auto._parse.cache_clear()
    auto._spec_for_terms.cache_clear()
    problem._REPLICA_CACHE.clear()


def auto_speed(steps: int, tick, plain: bool) -> list[dict]:
    """Per-step auto decision on 32 GPUs (8 per node, 24 heads), FLUX-size cost.

    Steady state: the current layout kept from the previous step (the bounds show nothing
    beats it by the hysteresis). Full: no current layout, as on the first step, with cold
    caches (``_cold_caches``) and, in ``full_warm``, with warm ones. Each is the best of 3
    runs from the same state (robust to other load), wall and thread CPU time."""
    cost = CostModel.flops(3072, 1.0).scaled(57)
    rows = []
    for mixture, k, kern in [
        (m, k, kern) for m in ("mixres", "joint") for k in (1, 3) for kern in (True, False)
    ]:
        if not kern and not plain:
            continue
        with fast.use_kernels(kern):
            data = sample_steps(parse_data_codes(_scaled(mixture, k)), 32, steps + 1, seed=1)
            sched = AutoLayout(32, 24, 8, cost)
            sched.decide(data[0])
            steady, steady_cpu, changed = [], [], 0
            for s in data[1:]:
                before = sched.current
                runs = []
                for _ in range(3):
                    sched.current, sched.step = before, 1
                    t0, c0 = time.perf_counter(), time.thread_time()
                    sched.decide(s)
                    runs.append(((time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3))
                steady.append(min(r[0] for r in runs))
                steady_cpu.append(min(r[1] for r in runs))
                changed += sched.current != before
            full, full_cpu, warm = [], [], []
            for s in data[1:]:
                runs = []
                for _ in range(3):
                    _cold_caches()
                    sched.current, sched.step = None, 0
                    t0, c0 = time.perf_counter(), time.thread_time()
                    sched.decide(s)
                    runs.append(((time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3))
                    sched.current, sched.step = None, 0
                    t0 = time.perf_counter()
                    sched.decide(s)
                    warm.append((time.perf_counter() - t0) * 1e3)
                full.append(min(r[0] for r in runs))
                full_cpu.append(min(r[1] for r in runs))
            tick()
            rows.append(
                {
                    "mixture": f"{mixture} x{k}" + ("" if kern else " (plain)"),
                    "compiled_kernels": kern and fast.kernels() is not None,
                    "num_sequences": sum(len(r) for r in data[0]),
                    "steady_median_ms": float(np.median(steady)),
                    "steady_median_cpu_ms": float(np.median(steady_cpu)),
                    "steady_p90_ms": float(np.percentile(steady, 90)),
                    "steady_max_ms": float(np.max(steady)),
                    "steady_max_cpu_ms": float(np.max(steady_cpu)),
                    "steady_layout_changes": int(changed),
                    "full_median_ms": float(np.median(full)),
                    "full_median_cpu_ms": float(np.median(full_cpu)),
                    "full_max_ms": float(np.max(full)),
                    "full_max_cpu_ms": float(np.max(full_cpu)),
                    "full_warm_median_ms": float(np.median(warm)),
                    "layout": sched.current,
                }
            )
    return rows


def replica_speed(repeats: int, inner: int, tick) -> dict:
    """32 replicas of g1n16+g2n4+g4n2 on 1,024 GPUs, 16,000 sequences."""
    spec, world = "g1n16+g2n4+g4n2", 1024
    whole = BagLayout.parse(spec, world, 24)
    one = BagLayout.parse(spec, 32, 24)
    w_ms, r_ms = [], []
    for rep in range(repeats):
        lengths = synthetic_lengths(16000, world, seed=rep)
        w_ms.append(_timed(lambda x=lengths: plan_step(x, whole, COST), inner)[3])
        r_ms.append(_timed(lambda x=lengths: plan_step(x[:32], one, COST), inner)[3])
    tick()
    return {
        "spec": spec,
        "world_size": world,
        "num_sequences": 16000,
        "whole_world_best_ms": float(np.median(w_ms)),
        "own_replica_best_ms": float(np.median(r_ms)),
    }


def group_counts(steps: int, tick) -> list[dict]:
    rows = []
    for mixture in ("mixres", "joint"):
        sched = AutoLayout(1024, 24, 8, COST)
        for s in sample_steps(resolve_mixture(mixture), 1024, steps, seed=0):
            sched.decide(s)
        tick()
        rows.append(
            {
                "mixture": mixture,
                "world_size": 1024,
                "steps": steps,
                "lazy_groups": sched.num_groups,
                "eager_groups": len(sched.bags),
            }
        )
    return rows


def cuda_sync_check() -> dict:
    """route/reverse_route/attention under sync debug mode "error" (one rank, NCCL + gloo)."""
    import torch

    if not torch.cuda.is_available():
        return {"status": "skipped: no CUDA"}
    import tempfile

    import torch.distributed as dist

    from knapformer.distributed import Balancer

    init = f"file://{tempfile.mkdtemp()}/rdzv"
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=init, rank=0, world_size=1)
    try:
        dev = torch.device("cuda", 0)
        bal = Balancer("g1n1", COST, num_heads=8, device=dev)
        bal.plan_step([300, 200, 50])
        x = torch.randn(550, 8 * 64, device=dev, dtype=torch.bfloat16, requires_grad=True)

        def layer() -> None:
            q = bal.route(x).view(-1, 8, 64)
            y = bal.reverse_route(bal.attention(q, q, q).reshape(-1, 8 * 64))
            y.float().sum().backward()

        layer()  # warm-up: kernels, allocator, communicator
        torch.cuda.synchronize()
        status = {}
        for case in ("same plan", "new plan"):
            if case == "new plan":  # host only; the next call uploads the step's tables
                bal.plan_step([300, 200, 50])
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                layer()
                status[case] = "ok: no synchronizing CUDA call"
            except RuntimeError as exc:
                status[case] = f"sync found: {exc}"
            finally:
                torch.cuda.set_sync_debug_mode("default")
        return {"status": "; ".join(f"{k}: {v}" for k, v in status.items())}
    finally:
        dist.destroy_process_group()


def exact_gap(instances: int) -> dict:
    """The default solver and the published greedy vs the HiGHS optimum on small instances."""
    rng = np.random.default_rng(0)
    layout = BagLayout.parse("g1n4+g2n1+g2n1", 8, 24)
    ours, ref, optimal = [], [], 0
    for _ in range(instances):
        lengths = [
            [int(x) for x in np.exp(rng.uniform(np.log(64), np.log(20000), rng.integers(1, 4)))]
            for _ in range(8)
        ]
        ex = plan_step(lengths, layout, COST, solver="exact", time_limit=30)
        optimal += bool(ex.info.get("optimal"))
        ours.append(plan_step(lengths, layout, COST).makespan / ex.makespan - 1)
        ref.append(plan_step(lengths, layout, COST, solver="reference").makespan / ex.makespan - 1)
    return {
        "instances": instances,
        "spec": layout.spec,
        "proved_optimal": optimal,
        "ours_mean_gap_to_optimum": float(np.mean(ours)),
        "ours_max_gap_to_optimum": float(np.max(ours)),
        "ours_share_optimal": float(np.mean(np.asarray(ours) <= 1e-9)),
        "reference_mean_gap_to_optimum": float(np.mean(ref)),
        "reference_max_gap_to_optimum": float(np.max(ref)),
    }


def kernel_warm_up() -> dict:
    """Time :func:`fast.warm_up` in this fresh process: compiling the kernels (first run in an
    environment) or loading them from numba's on-disk cache (every later run). It happens once
    per process, before any timed planning; every figure below is steady state."""
    t0 = time.perf_counter()
    used = fast.warm_up()
    s = time.perf_counter() - t0
    if not used:
        note = "not in use (numba missing or KNAPFORMER_PLANNER_KERNELS=0): plain loops"
    else:
        note = (
            f"compiled or loaded from numba's cache in {s:.1f} s, once per process before the "
            "timed runs (compiling happens once per environment, then the cache is loaded)"
        )
    return {"compiled": used, "warm_up_s": s, "note": note}


def main() -> None:
    from rich.progress import Progress

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--solvers", default=f"{DEFAULT_SOLVER},reference")
    ap.add_argument("--inner", type=int, default=3, help="runs per instance for the best-of column")
    ap.add_argument("--guarantee", type=int, default=300, help="random steps for the guarantee")
    ap.add_argument("--auto-steps", type=int, default=20)
    ap.add_argument("--exact", type=int, default=0, help="small instances vs the exact solver")
    ap.add_argument(
        "--plain",
        action="store_true",
        help="also time the plain Python/numpy loops (no compiled kernels), for same-run ratios",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if min(args.repeats, args.inner, args.auto_steps) < 1 or args.guarantee < 0:
        ap.error("--repeats, --inner and --auto-steps must be >= 1, --guarantee >= 0")
    solvers = args.solvers.split(",")
    total = len(CASES) * len(solvers) * (2 if args.plain else 1) + args.guarantee // 20 + 8 + 3
    with Progress(transient=True) as progress:
        task = progress.add_task("planner benchmarks", total=total)

        def tick() -> None:
            progress.advance(task)

        progress.update(task, description="planner kernels (compiled on first use, then cached)")
        out: dict[str, Any] = {
            "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "kernels": kernel_warm_up(),
        }
        progress.update(task, description="planner benchmarks")
        out |= {
            "speed": speed(args.repeats, solvers, args.inner, tick, args.plain),
            "guarantee": guarantee(args.guarantee, tick),
            "auto": auto_speed(args.auto_steps, tick, args.plain),
            "replica": replica_speed(max(1, args.repeats // 3), args.inner, tick),
            "groups": group_counts(4, tick),
            "cuda_sync": cuda_sync_check(),
            "exact_gap": exact_gap(args.exact) if args.exact > 0 else None,
        }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"(1-min load average {out['load_average_1min']:.1f} on {os.cpu_count()} CPUs)")
    print(f"planner kernels: {out['kernels']['note']}")
    print(
        f"{'case':32s} {'solver':12s} {'wall ms':>8s} {'cpu ms':>7s} {'best ms':>7s} "
        f"{'p90 ms':>7s} {'max/mean':>9s} {'gap':>8s} {'moved':>6s}"
    )
    for r in out["speed"]:
        print(
            f"{r['case']:32s} {r['solver']:12s} {r['median_ms']:8.2f} {r['median_cpu_ms']:7.2f} "
            f"{r['median_best_of_ms']:7.2f} "
            f"{r['p90_ms']:7.2f} {r['median_balanced_max_over_mean']:9.4f} "
            f"{r['median_gap']:8.4%} {r['median_tokens_moved_fraction']:6.3f}"
        )
    g = out["guarantee"]
    print(
        f"\nguarantee ({DEFAULT_SOLVER} vs reference, {g['cases']} random steps, 32 GPUs): "
        f"worse {g['worse']}, equal {g['equal']}, better {g['better']} "
        f"(largest gain {g['largest_gain']:.2%})"
    )
    print(f"\n{'auto decision (32 GPUs)':24s} {'seqs':>5s} {'steady ms':>9s} {'cpu':>6s} "
          f"{'p90':>6s} {'max':>6s} {'cpu':>6s} {'changes':>7s} {'first ms':>8s} {'cpu':>6s} "
          f"{'max':>6s} {'cpu':>6s} {'warm':>6s}  layout")  # fmt: skip
    for r in out["auto"]:
        print(
            f"{r['mixture']:24s} {r['num_sequences']:5d} {r['steady_median_ms']:9.2f} "
            f"{r['steady_median_cpu_ms']:6.2f} {r['steady_p90_ms']:6.2f} {r['steady_max_ms']:6.2f} "
            f"{r['steady_max_cpu_ms']:6.2f} {r['steady_layout_changes']:7d} "
            f"{r['full_median_ms']:8.2f} {r['full_median_cpu_ms']:6.2f} {r['full_max_ms']:6.2f} "
            f"{r['full_max_cpu_ms']:6.2f} {r['full_warm_median_ms']:6.2f}  {r['layout']}"
        )
    r = out["replica"]
    print(
        f"\n{r['num_sequences']} sequences, {r['world_size']} GPUs = 32 x {r['spec']}: whole world "
        f"{r['whole_world_best_ms']:.2f} ms, own replica (what each rank plans) "
        f"{r['own_replica_best_ms']:.2f} ms"
    )
    for r in out["groups"]:
        print(
            f"auto process groups at {r['world_size']} GPUs ({r['mixture']}, {r['steps']} steps): "
            f"{r['lazy_groups']} created lazily (eager: {r['eager_groups']})"
        )
    print(f"CUDA host-device syncs in route/reverse_route/attention: {out['cuda_sync']['status']}")
    gap = out["exact_gap"]
    if gap is not None:
        print(
            f"vs exact on {gap['instances']} small instances ({gap['spec']}, "
            f"{gap['proved_optimal']} proved optimal): ours mean gap "
            f"{gap['ours_mean_gap_to_optimum']:.3%} max {gap['ours_max_gap_to_optimum']:.3%} "
            f"(optimal in {gap['ours_share_optimal']:.0%}); reference mean "
            f"{gap['reference_mean_gap_to_optimum']:.3%} "
            f"max {gap['reference_max_gap_to_optimum']:.3%}"
        )


if __name__ == "__main__":
    main()
