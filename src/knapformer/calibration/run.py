"""`knapformer calibrate`: the cost model of the MMDiT that trains, fitted on this machine.

Per bag size ``g`` it times what ONE GPU of a ``g``-bag computes for a length-``L`` sequence in
each of the MMDiT's block types (:mod:`knapformer.calibration.blocks`): the block's projections
and MLP on its ``ceil(L/g)``-token chunk, and attention over the whole sequence for ``H/g``
heads (:func:`bag_attention` re-lays q, k, v out as Ulysses would, filled by local copies
instead of an all-to-all). The all-to-all itself is timed separately (2-process gloo) and gives
``c``. The profile is the depth-weighted sum of the two block types' fits; the MAPE is reported
on held-out lengths.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from knapformer.calibration.fit import CalibrationError, mape, split_heldout
from knapformer.planning.cost import CostModel

__all__ = [
    "DEFAULT_LENGTHS",
    "CalibrationReport",
    "bag_attention",
    "calibrate",
    "plot_fit",
]

DEFAULT_LENGTHS = (64, 128, 192, 256, 384, 512, 640, 768, 1024, 1280, 1536)


@dataclass(frozen=True)
class CalibrationReport:
    profile: CostModel
    block: str
    lengths_fit: tuple[int, ...]
    lengths_heldout: tuple[int, ...]
    bag_sizes: tuple[int, ...]
    measured: dict[int, dict[int, float]]  # g -> L -> seconds (median)
    fit_mape: float
    heldout_mape: float
    heldout_mape_per_g: dict[int, float]
    comm: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def predicted(self, L: Sequence[int], g: int) -> np.ndarray:
        """Compute-only prediction of one call (the c term is communication, not in the
        timings; the per-call constant f is)."""
        compute_only = dataclasses.replace(self.profile, c=0.0)
        return np.asarray(compute_only.t(np.asarray(L, dtype=np.float64), g)) + self.profile.f


def bag_attention(
    g: int, length: int, n: int = 1, device: Any = None
) -> Callable[[Any, Any, Any], Any]:
    """Attention callable emulating one GPU of a g-bag that holds ``n`` length-`length` sequences.

    The GPU holds one ``ceil(length/g)``-row chunk of each sequence (``n`` chunks back to back).
    As Ulysses does, the whole call re-lays q, k, v out once (one gather for all sequences, here
    from local copies instead of an all-to-all) to whole sequences with ``H/g`` heads, runs the
    varlen attention (one call per sequence on CPU) and lays the output back once. Its index
    tables live on ``device`` (default CPU), the offsets also on the host (no copy back).
    """
    import torch

    from knapformer.attention.varlen import varlen_attention

    if g < 1 or length < 1 or n < 1:
        raise CalibrationError(f"bag emulation needs g, length, n >= 1; got {g}, {length}, {n}")
    dev = torch.device(device if device is not None else "cpu")
    cu_host = np.arange(n + 1, dtype=np.int64) * length
    cu = torch.from_numpy(cu_host).to(dev)
    C = math.ceil(length / g)
    seq = torch.arange(n).repeat_interleave(length)
    pos = torch.arange(length).repeat(n)
    gather = seq * C + pos % C  # [n*L]: row of each whole-sequence token among the local chunks
    # [g*n*C]: for peer p and local row r, the whole-sequence row that peer p sends back
    r = torch.arange(n * C)
    j = torch.arange(g)[:, None] * C + (r % C)[None, :]
    scatter = ((r // C)[None, :] * length + j.clamp(max=length - 1)).flatten().to(dev)
    gather = gather.to(dev)

    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        _, H, D = q.shape
        if g == 1:
            return varlen_attention(q, k, v, cu, length, cu_seqlens_host=cu_host)
        hg = H // g
        x = torch.stack((q, k, v), dim=1)[:, :, :hg].index_select(0, gather)  # [n*L, 3, H/g, D]
        qs, ks, vs = x.unbind(dim=1)
        o = varlen_attention(qs, ks, vs, cu, length, cu_seqlens_host=cu_host)  # [n*L, H/g, D]
        y = o.index_select(0, scatter).view(g, n * C, hg, D)
        return y.movedim(0, 1).reshape(n * C, H, D)

    return attn


def _axes(head_dim: int) -> tuple[int, int, int]:
    """A FLUX-like (t, h, w) RoPE split of ``head_dim`` into three even sizes (FLUX: 16, 56,
    56 of 128), for a model calibrated at a width other than its preset's."""
    t = max(2, head_dim // 8 // 2 * 2)
    h = (head_dim - t) // 2 // 2 * 2
    return t, h, head_dim - t - h


def calibrate(
    d_model: int | None = None,
    heads: int | None = None,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    bag_sizes: Sequence[int] = (1, 2, 4),
    repeats: int = 5,
    warmup: int = 2,
    threads: int = 1,
    device: str | None = None,
    measure_comm: bool = True,
    min_time_s: float = 0.25,
    log: Callable[[str], None] | None = None,
    on_run: Callable[[int, int], None] | None = None,
    preset: str = "cpu",
) -> CalibrationReport:
    """Time the MMDiT's double- and single-stream blocks (``preset``, its width and heads
    replaced by ``d_model`` / ``heads`` when given) on ``device`` with its clock, fit each,
    add the measured all-to-all term ``c``, and return the whole model's profile (not saved;
    see `CostModel.save`). ``on_run(done, total)`` reports the timed runs (a progress bar)."""
    import torch

    from knapformer.calibration.blocks import calibrate_blocks
    from knapformer.calibration.comm import measure_all_to_all
    from knapformer.models.mmdit import MMDiTInputError, mmdit_config

    t_start = time.perf_counter()
    say = log or (lambda _msg: None)
    bag_sizes = tuple(sorted(set(int(g) for g in bag_sizes)))
    if not bag_sizes or bag_sizes[0] < 1:
        raise CalibrationError(f"bag sizes must be >= 1, got {list(bag_sizes)}")
    over: dict[str, Any] = {}
    if d_model is not None or heads is not None:
        try:
            base = mmdit_config(preset)
        except MMDiTInputError as exc:
            raise CalibrationError(str(exc)) from None
        d = base.d_model if d_model is None else int(d_model)
        h = base.num_heads if heads is None else int(heads)
        if h < 1 or d < 1 or d % h or (d // h) % 2 or d // h < 6:
            raise CalibrationError(f"d_model={d} must split into {h} heads of even size >= 6")
        over = {"d_model": d, "num_heads": h, "axes_dim": _axes(d // h)}
    try:
        cfg = mmdit_config(preset, **over)
    except MMDiTInputError as exc:
        raise CalibrationError(str(exc)) from None
    bad = [g for g in bag_sizes if cfg.num_heads % g]
    if bad:
        raise CalibrationError(f"bag sizes {bad} do not divide heads={cfg.num_heads}")
    if any(int(x) < max(bag_sizes) for x in lengths):
        raise CalibrationError(f"every length must be >= the largest bag size {max(bag_sizes)}")
    split_heldout(lengths)  # (enough distinct lengths: a clear error before any timing)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)  # fixed for comparable timings; restored afterwards
    try:
        costs = calibrate_blocks(
            cfg, lengths, bag_sizes, repeats=repeats, warmup=warmup, min_time_s=min_time_s,
            device=dev, log=say, on_run=on_run,
        )  # fmt: skip
    except ValueError as exc:
        raise CalibrationError(str(exc)) from None
    finally:
        torch.set_num_threads(prev_threads)
    fit_L, held_L = list(costs.lengths_fit), list(costs.lengths_heldout)
    # the whole model's time of one sequence per call: depth-weighted sum of the block types
    depth = {"double": cfg.depth_double, "single": cfg.depth_single}
    measured: dict[int, dict[int, float]] = {g: {} for g in bag_sizes}
    for g in bag_sizes:
        for L in sorted({*fit_L, *held_L}):
            measured[g][L] = sum(k * costs.measured[b][(g, L, 1)] for b, k in depth.items())
        say(f"g={g}: " + ", ".join(f"L={L}: {s * 1e3:.2f} ms" for L, s in measured[g].items()))
    total = costs.total

    def err(ls: Sequence[int], g: int | None = None) -> float:
        gs = bag_sizes if g is None else (g,)
        t = np.array([measured[gg][x] for gg in gs for x in ls])
        p = np.array([total.t(x, gg) + total.f for gg in gs for x in ls])
        return mape(t, p)

    held_mape, fit_mape = err(held_L), err(fit_L)
    per_g = {g: err(held_L, g) for g in bag_sizes}
    say(f"model: fit MAPE {fit_mape:.2f}% on {fit_L}; held-out MAPE {held_mape:.2f}% on {held_L}")
    say("held-out MAPE per bag size: " + ", ".join(f"g={g}: {m:.2f}%" for g, m in per_g.items()))

    blocks = cfg.depth_double + cfg.depth_single
    comm: dict[str, Any] = {}
    c = 0.0
    if measure_comm:
        try:
            r = measure_all_to_all(cfg.d_model)
            c = r.c * blocks  # (per block, measured; the model has `blocks` of them)
            comm = {
                "backend": "gloo",
                "world": 2,
                "rows": list(r.sizes),
                "seconds": list(r.seconds),
                "latency_s": r.alpha,
                "s_per_row": r.k,
                "c": c,
            }
            say(f"all-to-all (gloo, 2 procs, d={cfg.d_model}): {r.k * 1e9:.1f} ns/row, c={c:.3g}")
        except RuntimeError as exc:  # report, keep the compute fit
            comm = {"error": str(exc)}
            say(f"all-to-all measurement failed, c=0: {exc}")
    block_name = f"MMDiT({cfg.depth_double}x double + {cfg.depth_single}x single)"
    profile = dataclasses.replace(
        total,
        c=c,
        name=f"calibrated:mmdit(d={cfg.d_model},h={cfg.num_heads},"
        f"{cfg.depth_double}x2+{cfg.depth_single}x1,{dev.type})",
        meta={
            "units": f"{dev.type} busy seconds per model forward+backward",
            "block": block_name,
            "model": cfg.to_dict(),
            "d_model": cfg.d_model,
            "heads": cfg.num_heads,
            "device": dev.type,
            "threads": threads,
            "bag_sizes": list(bag_sizes),
            "lengths_fit": fit_L,
            "lengths_heldout": held_L,
            "fit_mape_percent": fit_mape,
            "heldout_mape_percent": held_mape,
            "heldout_mape_percent_per_bag_size": {str(g): m for g, m in per_g.items()},
            "heldout_mape_percent_per_block": costs.heldout_mape,
            "per_block": {"double": costs.double.to_dict(), "single": costs.single.to_dict()},
            "clock": "cuda events" if dev.type == "cuda" else "thread cpu time",
            "measured_seconds": {
                str(g): {str(k): v for k, v in m.items()} for g, m in measured.items()
            },
            "comm": comm,
        },
    )
    return CalibrationReport(
        profile=profile,
        block=block_name,
        lengths_fit=tuple(fit_L),
        lengths_heldout=tuple(held_L),
        bag_sizes=bag_sizes,
        measured=measured,
        fit_mape=fit_mape,
        heldout_mape=held_mape,
        heldout_mape_per_g=per_g,
        comm=comm,
        elapsed_s=time.perf_counter() - t_start,
    )


def plot_fit(report: CalibrationReport, path: Any) -> Any:
    """Measured (points; held-out hollow) vs fitted (lines) per bag size, atomic PNG."""
    from knapformer.sim.plots import _pyplot, atomic_savefig

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    L_dense = np.linspace(
        min(report.measured[report.bag_sizes[0]]), max(report.measured[report.bag_sizes[0]]), 200
    )
    for i, g in enumerate(report.bag_sizes):
        color = f"C{i}"
        fitL = list(report.lengths_fit)
        held = list(report.lengths_heldout)
        ax.plot(L_dense, report.predicted(L_dense, g) * 1e3, color=color, lw=1, label=f"fit g={g}")
        ax.plot(fitL, [report.measured[g][x] * 1e3 for x in fitL], "o", color=color, ms=4)
        ax.plot(
            held, [report.measured[g][x] * 1e3 for x in held], "o", mfc="none", color=color, ms=6
        )
    ax.set_xlabel("sequence length L (tokens)")
    ax.set_ylabel("forward+backward per GPU (ms)")
    ax.set_title(
        f"{report.profile.name}\nheld-out MAPE {report.heldout_mape:.2f}% (hollow = held out)",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    try:
        return atomic_savefig(fig, path)
    finally:
        plt.close(fig)
