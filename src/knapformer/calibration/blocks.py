"""Calibrate the cost model of the MMDiT's blocks on the device that trains.

Calibration times what one GPU of a ``g``-bag computes for ``n`` length-``L`` sequences in a
double- and in a single-stream block, forward + backward, separately: the block runs on its
``ceil(L/g)``-token chunk of each sequence and its attention module is replaced by one that
re-lays q, k, v out as Ulysses would (whole sequences, ``H/g`` heads, filled by local copies) and
runs the real varlen attention. Each block type gets its own NNLS fit of
``time = f + n * ((a L + b L^2)/g + e)`` on some lengths, with the MAPE reported on the others
(held out, one sequence per call). Timing calls with one and with several sequences separates the
two constants: ``e`` is paid per sequence by every GPU of its bag (its attention call, its
adaLN modulation), so it is part of the per-sequence cost the planner sums, and splitting a short
sequence over a bag costs ``g * e`` of work; ``f`` is paid once per block call whatever the data
(Python and kernel-launch overheads), i.e. equally on every rank (``CostModel.f``). The model's
cost is ``depth_double * double + depth_single * single``. Times are the device clock's busy
time (:mod:`knapformer.calibration.clock`: thread CPU time on CPU, CUDA events on GPU).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from knapformer.calibration.clock import Clock, CPUClock, clock_for
from knapformer.calibration.fit import fit_cost, mape, split_heldout
from knapformer.calibration.run import bag_attention
from knapformer.models.mmdit import DoubleStreamBlock, MMDiTConfig, SingleStreamBlock, Streams
from knapformer.models.rope import rope_nd
from knapformer.planning.cost import CostModel

__all__ = ["PACKED_SEQUENCES", "BlockCosts", "calibrate_blocks"]


#: Sequences per timed call besides one: packed calls at the shortest fitted lengths separate the
#: per-sequence constant ``e`` from the per-call one ``f``.
PACKED_SEQUENCES = 4


class _EmulatedBagAttention(nn.Module):
    """Attention of one GPU of a g-bag; ``meta`` is the :func:`bag_attention` callable."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: Any) -> torch.Tensor:
        return meta(q, k, v)


def _time_cases(
    block: nn.Module,
    make_inputs: Callable[[Any], tuple[tuple[Any, ...], dict]],
    cases: Sequence[Any],
    repeats: int,
    warmup: int,
    quantile: float,
    min_time_s: float = 0.0,
    clock: Clock | None = None,
    on_run: Callable[[], None] | None = None,
) -> list[float]:
    """Forward+backward busy time per case on ``clock`` (default: this thread's CPU time), over
    interleaved rounds, with the load of each round taken out.

    Other processes on shared cores slow a run down (cache and core sharing inflate even CPU
    time) by a factor that drifts from round to round and hits every case of a round alike. A
    median polish of the log-times (case level + round factor) removes those factors; each case
    gets the median of its corrected times, at the load of the ``quantile`` quietest rounds
    (on recorded timings this halved the held-out error against a plain low quantile). Each
    round visits the cases in a new (seeded) order: in a fixed order the case after the largest
    one always starts with caches it has evicted, a bias of 10-15% at the shortest lengths. A
    case whose warmup shows it is cheap gets more repeats (up to 4x), so that its timed runs add
    up to about ``min_time_s``: on a loaded machine 13 repeats leave ~5% noise in a short case.
    """
    import gc

    built = []
    for case in cases:
        args, kwargs = make_inputs(case)
        built.append((args, kwargs, torch.randn_like(block(*args, **kwargs))))
    first = [0.0] * len(built)
    rng = np.random.default_rng(0)
    clock = clock or CPUClock()

    def run(i: int) -> float:
        args, kwargs, seed = built[i]
        block.zero_grad(set_to_none=True)
        t0 = clock.mark()
        (block(*args, **kwargs) * seed).sum().backward()
        t1 = clock.mark()
        clock.wait()  # (CUDA: the events must be done before they are read)
        if on_run is not None:
            on_run()
        return clock.busy_s(t0, t1)

    gc_was_on = gc.isenabled()
    gc.collect()
    gc.disable()  # (a collection inside a timed run is another process's kind of noise)
    try:
        for _ in range(warmup):
            for i in rng.permutation(len(built)).tolist():
                first[i] = run(i)
        wanted = [
            min(max(repeats, math.ceil(min_time_s / w)), 4 * repeats) if w > 0 else repeats
            for w in first
        ]
        times = np.full((len(built), max(wanted)), np.nan)  # [case, round]
        for r in range(max(wanted)):
            for i in rng.permutation(len(built)).tolist():
                if r < wanted[i]:
                    times[i, r] = max(run(i), 1e-9)
    finally:
        if gc_was_on:
            gc.enable()
    return _median_polish(times, quantile)


def _median_polish(times: np.ndarray, quantile: float) -> list[float]:
    """Per-row level of ``[case, round]`` timings (NaN = not run) without per-round factors:
    ``log t = case + round``, fitted by alternating medians; the round factors are shifted so
    that their ``quantile`` is 0 (the level of the quieter rounds)."""
    lt = np.log(times)
    rnd = np.zeros(lt.shape[1])
    for _ in range(5):
        case = np.nanmedian(lt - rnd[None, :], axis=1)
        rnd = np.nanmedian(lt - case[:, None], axis=0)
    rnd -= np.quantile(rnd, quantile)
    return [float(x) for x in np.exp(np.nanmedian(lt - rnd[None, :], axis=1))]


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
    per_rank_overhead_s: float = 0.0  # fitted per-call constants of all blocks (= total.f)
    packed_mape: dict[str, float] = field(default_factory=dict)  # fit MAPE of the n > 1 calls
    #: block type -> (g, L, n) -> busy seconds of one call (forward + backward)
    measured: dict[str, dict[tuple[int, int, int], float]] = field(default_factory=dict)

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
            "packed_fit_mape_percent": self.packed_mape,
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
    min_time_s: float = 0.0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    log: Callable[[str], None] | None = None,
    on_run: Callable[[int, int], None] | None = None,
) -> BlockCosts:
    """Time both block types on ``device`` (the one that trains) with its clock
    (:func:`~knapformer.calibration.clock.clock_for`: thread CPU time on CPU, CUDA events on
    GPU), fit, return the costs. ``on_run(done, total)`` after every timed run (a progress
    bar; the total is an estimate until the cheap cases' extra repeats are known)."""
    if repeats < 1 or warmup < 0 or not 0.0 <= quantile <= 1.0:
        raise ValueError("need repeats >= 1, warmup >= 0 and 0 <= quantile <= 1")
    bag_sizes = tuple(sorted({int(g) for g in bag_sizes}))
    if any(cfg.num_heads % g for g in bag_sizes):
        raise ValueError(f"bag sizes {list(bag_sizes)} must divide num_heads={cfg.num_heads}")
    if any(int(L) < max(bag_sizes) for L in lengths):
        raise ValueError(f"every calibration length must be >= the largest bag {max(bag_sizes)}")
    fit_L, held_L = split_heldout(sorted({int(L) for L in lengths}))
    all_L = sorted(set(fit_L) | set(held_L))
    packed_L = fit_L[:3]  # short: where the constants matter and packed calls are cheap
    cases = [(g, L, 1) for g in bag_sizes for L in all_L]
    cases += [(g, L, PACKED_SEQUENCES) for g in bag_sizes for L in packed_L]
    device = torch.device(device)
    clock = clock_for(device)
    torch.manual_seed(0)
    vec = torch.randn(PACKED_SEQUENCES, cfg.d_model, dtype=dtype, device=device)
    fits: dict[str, CostModel] = {}
    times: dict[str, dict[tuple[int, int, int], float]] = {}
    runs = [0, 2 * len(cases) * (warmup + repeats)]

    def ran() -> None:
        runs[0] += 1
        runs[1] = max(runs[1], runs[0])
        if on_run is not None:
            on_run(runs[0], runs[1])

    held: dict[str, float] = {}
    fitm: dict[str, float] = {}
    packm: dict[str, float] = {}
    for name, cls in (("double", DoubleStreamBlock), ("single", SingleStreamBlock)):
        block = cls(cfg).to(device=device, dtype=dtype)
        block.attn = _EmulatedBagAttention()

        def make_inputs(case: tuple[int, int, int], cls: type = cls) -> tuple[tuple, dict]:
            g, L, n = case
            C = math.ceil(L / g)
            x = torch.randn(n * C, cfg.d_model, dtype=dtype, device=device, requires_grad=True)
            zeros = torch.zeros(n * C, dtype=torch.int64)
            pos = torch.stack([zeros, zeros, torch.arange(C).repeat(n)], dim=1).to(device)
            rope = rope_nd(pos, cfg.axes_dim, cfg.rope_theta, dtype=dtype)
            seq = torch.arange(n).repeat_interleave(C)
            attn = bag_attention(g, L, n, device=device)
            if cls is DoubleStreamBlock:
                kind = (torch.arange(C) >= int(C * text_fraction)).to(torch.int64).repeat(n)
                streams = Streams.from_host(kind.numpy(), seq.numpy(), device)
                return (x, vec[:n], rope, streams, attn), {}
            return (x, vec[:n], rope, seq.to(device), attn), {}

        secs = _time_cases(
            block, make_inputs, cases, repeats, warmup, quantile, min_time_s, clock, ran
        )
        measured = dict(zip(cases, secs, strict=True))
        times[name] = measured
        fit_cases = [c for c in cases if c[1] in fit_L]
        held_cases = [c for c in cases if c[1] in held_L]
        G, L, N = (np.array([c[i] for c in fit_cases], dtype=np.float64) for i in range(3))
        t = np.array([measured[c] for c in fit_cases])
        fit = fit_cost(L, G, t, fixed_c=0.0, n=N)
        Gh, Lh = (np.array([c[i] for c in held_cases], dtype=np.float64) for i in range(2))
        th = np.array([measured[c] for c in held_cases])
        held[name] = mape(th, fit.predict(Lh, Gh)) if held_cases else float("nan")
        fitm[name] = fit.fit_mape
        packed = N > 1
        packm[name] = mape(t[packed], fit.predict(L, G, N)[packed])
        if fit.a <= 0 and fit.b <= 0:
            raise ValueError(
                f"calibration of the {name}-stream block found no length dependence (timings "
                f"are all overhead at L={all_L}); calibrate at longer lengths or use cost=flops"
            )
        fits[name] = fit.cost(f"calibrated:{cls.__name__}(d={cfg.d_model})")
        if log is not None:
            log(
                f"{name}-stream block: fit MAPE {fit.fit_mape:.2f}%, held-out {held[name]:.2f}%; "
                f"per sequence {fit.e * 1e6:.0f} us, per call {fit.f * 1e6:.0f} us"
            )
    total = fits["double"].scaled(cfg.depth_double) + fits["single"].scaled(cfg.depth_single)
    total = dataclasses.replace(
        total,
        name=f"calibrated:mmdit(d={cfg.d_model},{cfg.depth_double}x2+{cfg.depth_single}x1)",
        meta={
            "heldout_mape_percent": held,
            "units": f"{device.type} busy seconds per step (fwd+bwd)",
            "per_rank_overhead_s": total.f,
        },
    )
    return BlockCosts(
        fits["double"],
        fits["single"],
        total,
        held,
        fitm,
        tuple(fit_L),
        tuple(held_L),
        total.f,
        packm,
        times,
    )
