"""Cost models of an MMDiT for the balancer: FLOP-based, or calibrated per block type.

Calibration times what one GPU of a ``g``-bag computes for a length-``L`` sequence in a double-
and in a single-stream block, forward + backward, separately: the block runs on its
``ceil(L/g)``-token chunk and its attention module is replaced by one that re-lays q, k, v out as
Ulysses would (whole sequence, ``H/g`` heads, filled by local copies) and runs the real varlen
attention. Each block type gets its own NNLS fit of ``t(L, g) = (a L + b L^2)/g + e`` on some
lengths, with the MAPE reported on the others (held out); the model's cost is
``depth_double * double + depth_single * single`` without the intercepts: those are paid once
per block call (equally on every rank), not per sequence.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from knapformer.calibration.fit import fit_cost, mape, split_heldout
from knapformer.calibration.run import bag_attention
from knapformer.models.mmdit import (
    DoubleStreamBlock,
    MMDiTConfig,
    SingleStreamBlock,
    Streams,
)
from knapformer.models.rope import rope_nd
from knapformer.planning.cost import CostModel

__all__ = ["BlockCosts", "calibrate_blocks", "flops_cost"]


def flops_cost(cfg: MMDiTConfig, gamma: float = 1.0) -> CostModel:
    """The paper's ``24 L d^2 + gamma 4 L^2 d`` per block: both FLUX block types have ~24 d^2
    linear FLOPs per token (QKV/out + 4x MLP; single: fused 3d+4d in, 5d out)."""
    return CostModel.flops(cfg.d_model, gamma=gamma, num_blocks=cfg.depth_double + cfg.depth_single)


class _EmulatedBagAttention(nn.Module):
    """Attention of one GPU of a g-bag; ``meta = (g, L)`` says which bag and sequence."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: Any) -> torch.Tensor:
        g, L = meta
        return bag_attention(g, L)(q, k, v)


def _time_cases(
    block: nn.Module,
    make_inputs: Callable[[Any], tuple[tuple[Any, ...], dict]],
    cases: Sequence[Any],
    repeats: int,
    warmup: int,
    quantile: float,
) -> list[float]:
    """A low quantile of forward+backward CPU time per case, round-robin over the cases.

    Other processes on shared cores only ever slow a run down (cache and core sharing inflate
    even CPU time), so a low quantile of many interleaved repeats estimates the block's own cost
    better than the median does.
    """
    built = []
    for case in cases:
        args, kwargs = make_inputs(case)
        built.append((args, kwargs, torch.randn_like(block(*args, **kwargs))))
    times: list[list[float]] = [[] for _ in built]
    for r in range(warmup + repeats):
        for i, (args, kwargs, seed) in enumerate(built):
            block.zero_grad(set_to_none=True)
            t0 = time.process_time()
            (block(*args, **kwargs) * seed).sum().backward()
            if r >= warmup:
                times[i].append(time.process_time() - t0)
    return [float(np.quantile(t, quantile)) for t in times]


@dataclass(frozen=True)
class BlockCosts:
    """Per-block-type fits and the resulting whole-model cost."""

    double: CostModel
    single: CostModel
    total: CostModel
    heldout_mape: dict[str, float]
    fit_mape: dict[str, float]
    lengths_fit: tuple[int, ...]
    lengths_heldout: tuple[int, ...]
    per_rank_overhead_s: float = 0.0  # fitted per-call intercepts of all blocks (not per sequence)

    def summary(self) -> dict[str, Any]:
        return {
            "double": self.double.to_dict(),
            "single": self.single.to_dict(),
            "total": self.total.to_dict(),
            "heldout_mape_percent": self.heldout_mape,
            "fit_mape_percent": self.fit_mape,
            "lengths_fit": list(self.lengths_fit),
            "lengths_heldout": list(self.lengths_heldout),
            "per_rank_overhead_s": self.per_rank_overhead_s,
        }


def calibrate_blocks(
    cfg: MMDiTConfig,
    lengths: Sequence[int],
    bag_sizes: Sequence[int] = (1, 2),
    *,
    text_fraction: float = 0.1,
    repeats: int = 9,
    warmup: int = 1,
    quantile: float = 0.25,
    dtype: torch.dtype = torch.float32,
    log: Callable[[str], None] | None = None,
) -> BlockCosts:
    """Time both block types on this process's CPU thread(s), fit, return the costs."""
    if repeats < 1 or warmup < 0 or not 0.0 <= quantile <= 1.0:
        raise ValueError("need repeats >= 1, warmup >= 0 and 0 <= quantile <= 1")
    bag_sizes = tuple(sorted({int(g) for g in bag_sizes}))
    if any(cfg.num_heads % g for g in bag_sizes):
        raise ValueError(f"bag sizes {list(bag_sizes)} must divide num_heads={cfg.num_heads}")
    if any(int(L) < max(bag_sizes) for L in lengths):
        raise ValueError(f"every calibration length must be >= the largest bag {max(bag_sizes)}")
    fit_L, held_L = split_heldout(sorted({int(L) for L in lengths}))
    all_L = sorted(set(fit_L) | set(held_L))
    cases = [(g, L) for g in bag_sizes for L in all_L]
    torch.manual_seed(0)
    vec = torch.randn(1, cfg.d_model, dtype=dtype)
    fits: dict[str, CostModel] = {}
    held: dict[str, float] = {}
    fitm: dict[str, float] = {}
    for name, cls in (("double", DoubleStreamBlock), ("single", SingleStreamBlock)):
        block = cls(cfg).to(dtype)
        block.attn = _EmulatedBagAttention()

        def make_inputs(case: tuple[int, int], cls: type = cls) -> tuple[tuple[Any, ...], dict]:
            g, L = case
            C = math.ceil(L / g)
            x = torch.randn(C, cfg.d_model, dtype=dtype, requires_grad=True)
            pos = torch.stack([torch.zeros(C, dtype=torch.int64)] * 2 + [torch.arange(C)], dim=1)
            rope = rope_nd(pos, cfg.axes_dim, cfg.rope_theta, dtype=dtype)
            seq = torch.zeros(C, dtype=torch.int64)
            if cls is DoubleStreamBlock:
                kind = (torch.arange(C) >= int(C * text_fraction)).to(torch.int64)
                return (x, vec, rope, Streams.from_kind(kind, seq), (g, L)), {}
            return (x, vec, rope, seq, (g, L)), {}

        secs = _time_cases(block, make_inputs, cases, repeats, warmup, quantile)
        measured = {case: s for case, s in zip(cases, secs, strict=True)}

        def arrays(ls: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            L = np.array([x for g in bag_sizes for x in ls], dtype=np.float64)
            G = np.repeat(np.asarray(bag_sizes, dtype=np.float64), len(ls))
            t = np.array([measured[(g, x)] for g in bag_sizes for x in ls])  # noqa: B023
            return L, G, t

        L, G, t = arrays(fit_L)
        fit = fit_cost(L, G, t, fixed_c=0.0)
        Lh, Gh, th = arrays(held_L)
        held[name] = mape(th, fit.predict(Lh, Gh)) if len(held_L) else float("nan")
        fitm[name] = fit.fit_mape
        if fit.a <= 0 and fit.b <= 0:
            raise ValueError(
                f"calibration of the {name}-stream block found no length dependence (timings "
                f"are all overhead at L={all_L}); calibrate at longer lengths or use cost=flops"
            )
        fits[name] = CostModel(
            a=fit.a, b=fit.b, e=fit.e, name=f"calibrated:{cls.__name__}(d={cfg.d_model})"
        )
        if log is not None:
            log(f"{name}-stream block: fit MAPE {fit.fit_mape:.2f}%, held-out {held[name]:.2f}%")
    # The fitted intercept is paid once per block *call* (Python, kernel launches), whatever
    # the number of sequences, i.e. equally on every rank: it is kept out of the per-sequence
    # cost the planner sums (e = 0) and reported as the per-rank overhead of a step.
    overhead = cfg.depth_double * fits["double"].e + cfg.depth_single * fits["single"].e
    total = fits["double"].scaled(cfg.depth_double) + fits["single"].scaled(cfg.depth_single)
    total = CostModel(
        total.a,
        total.b,
        total.c,
        0.0,
        name=f"calibrated:mmdit(d={cfg.d_model},{cfg.depth_double}x2+{cfg.depth_single}x1)",
        meta={
            "heldout_mape_percent": held,
            "units": "CPU seconds per step (fwd+bwd)",
            "per_rank_overhead_s": overhead,
        },
    )
    return BlockCosts(
        fits["double"], fits["single"], total, held, fitm, tuple(fit_L), tuple(held_L), overhead
    )
