"""Cost models of an MMDiT for the balancer: FLOP-based, calibrated per block type
(:mod:`knapformer.calibration.blocks`), and ``u`` measured in place on the training ranks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from knapformer.calibration.blocks import BlockCosts, calibrate_blocks
from knapformer.models.mmdit import MMDiTConfig
from knapformer.planning.cost import CostModel

__all__ = ["BlockCosts", "calibrate_blocks", "flops_cost", "measure_bag_overhead"]


def flops_cost(cfg: MMDiTConfig, gamma: float = 1.0) -> CostModel:
    """The paper's ``24 L d^2 + gamma 4 L^2 d`` per block: both FLUX block types have ~24 d^2
    linear FLOPs per token (QKV/out + 4x MLP; single: fused 3d+4d in, 5d out)."""
    return CostModel.flops(cfg.d_model, gamma=gamma, num_blocks=cfg.depth_double + cfg.depth_single)


def measure_bag_overhead(
    cfg: Any, cost: CostModel, mesh: Any, device: torch.device, steps: int = 14, warmup: int = 2
) -> tuple[CostModel, dict[str, Any]]:
    """``cost`` with ``u`` measured on this process group (collective; every rank returns the
    same). What a rank of a ``g``-bag pays per step for the Ulysses exchange whatever its data
    (agreement all-gathers, all-to-all calls, relayout calls) needs the real collectives, so it
    is timed in place: a few steps of uniform data (every rank the same short images) with
    ``g1nW`` (routing only) and every ``g{g}n{W/g}``, side by side and in rotating order, as
    in training. Each layout's per-rank busy time (the device's clock) minus its modelled load
    (``t`` and ``f``) leaves the unmodelled part; ``u`` is the least-squares fit of its growth
    over ``g1nW`` (the median over steps of the same step's difference) on ``(g-1)/g`` (>= 0).
    Returns the new cost model and the measurements. It holds one copy of the model per layout
    (1 + the number of bag sizes) at once; for a model too large for that, set ``u`` in a
    saved profile."""
    import dataclasses as dc

    import torch.distributed as dist

    from knapformer.calibration.clock import clock_for
    from knapformer.data.synthetic import SyntheticMixture
    from knapformer.train.step import build_run, train_step

    world = dist.get_world_size()
    mcfg = cfg.model_config()
    sizes = [g for g in (2, 4, 8, 16) if g <= world and world % g == 0 and mcfg.num_heads % g == 0]
    if not sizes or steps <= warmup:
        return cost, {"unmodelled_s": {}, "u": cost.u}
    base = dc.replace(cost, u=0.0)
    data = SyntheticMixture(
        f"g{world}b3i{8 * cfg.data.patch_px}f1s0",
        mcfg,
        world,
        text_tokens_max=cfg.data.text_tokens_max,
        patch_px=cfg.data.patch_px,
        seed=cfg.data.seed,
    )
    specs = [f"g1n{world}"] + [f"g{g}n{world // g}" for g in sizes]
    runs = {}
    for spec in specs:
        mode = dc.replace(cfg, balance=dc.replace(cfg.balance, balancer=spec))
        runs[spec] = build_run(mode, base, mesh, device)
    clock = clock_for(device)
    extra: dict[str, list[float]] = {s: [] for s in specs}
    for step in range(1, steps + 1):
        tb = data.batch(step, dist.get_rank())
        k = step % len(specs)
        for spec in specs[k:] + specs[:k]:
            model, bal, optim = runs[spec]
            dist.barrier()
            rec = train_step(model, bal, optim, tb, step, base, clock, device)
            if step > warmup:
                busy = np.asarray(rec["rank_busy_s"])
                extra[spec].append(float(np.mean(busy - np.asarray(rec["rank_modelled_load"]))))
    med = {s: float(np.median(v)) for s, v in extra.items()}
    # Growth over g1nW step by step (the same batch, moments apart: load drift cancels), median.
    x = np.array([(g - 1) / g for g in sizes])
    y = np.array(
        [np.median(np.subtract(extra[s], extra[specs[0]])) for s in specs[1:]], dtype=np.float64
    )
    u = max(float(x @ y / (x @ x)), 0.0)
    return dc.replace(cost, u=u), {"unmodelled_s": med, "growth_s": y.tolist(), "u": u}
