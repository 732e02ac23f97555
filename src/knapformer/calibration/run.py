"""Calibrate the cost model of the reference block on this machine.

Per bag size ``g`` we time what ONE GPU of a ``g``-bag computes for a length-``L`` sequence:
the block's projections and MLP on its ``ceil(L/g)``-token chunk, and attention over the whole
sequence for ``H/g`` heads. The block takes its attention as a callable, so the emulation is
exact in compute: the callable re-lays q, k, v out from ``[L/g, H, D]`` to ``[L, H/g, D]`` (the
shape Ulysses produces, filled by local copies instead of an all-to-all), runs the real varlen
attention and lays the output back. The all-to-all itself is timed separately (2-process gloo)
and gives ``c``. ``a, b, e`` come from an NNLS fit of the compute timings on some lengths; the
MAPE is reported on the others (held out).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from knapformer.calibration.fit import CalibrationError, fit_cost, mape, split_heldout
from knapformer.planning.cost import CostModel

__all__ = [
    "DEFAULT_LENGTHS",
    "CalibrationReport",
    "bag_attention",
    "calibrate",
    "plot_fit",
    "reference_block",
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
        """Compute-only prediction (the c term is communication, not in the timings)."""
        compute_only = dataclasses.replace(self.profile, c=0.0)
        return np.asarray(compute_only.t(np.asarray(L, dtype=np.float64), g))


def bag_attention(g: int, length: int, n: int = 1) -> Callable[[Any, Any, Any], Any]:
    """Attention callable emulating one GPU of a g-bag that holds ``n`` length-`length` sequences.

    The GPU holds one ``ceil(length/g)``-row chunk of each sequence (``n`` chunks back to back).
    As Ulysses does, the whole call re-lays q, k, v out once (one gather for all sequences, here
    from local copies instead of an all-to-all) to whole sequences with ``H/g`` heads, runs the
    varlen attention (one call per sequence on CPU) and lays the output back once.
    """
    import torch

    from knapformer.attention.varlen import varlen_attention

    if g < 1 or length < 1 or n < 1:
        raise CalibrationError(f"bag emulation needs g, length, n >= 1; got {g}, {length}, {n}")
    cu = torch.arange(n + 1, dtype=torch.int64) * length
    C = math.ceil(length / g)
    seq = torch.arange(n).repeat_interleave(length)
    pos = torch.arange(length).repeat(n)
    gather = seq * C + pos % C  # [n*L]: row of each whole-sequence token among the local chunks
    # [g*n*C]: for peer p and local row r, the whole-sequence row that peer p sends back
    r = torch.arange(n * C)
    j = torch.arange(g)[:, None] * C + (r % C)[None, :]
    scatter = ((r // C)[None, :] * length + j.clamp(max=length - 1)).flatten()

    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        _, H, D = q.shape
        if g == 1:
            return varlen_attention(q, k, v, cu, length)
        hg = H // g
        x = torch.stack((q, k, v), dim=1)[:, :, :hg].index_select(0, gather)  # [n*L, 3, H/g, D]
        qs, ks, vs = x.unbind(dim=1)
        o = varlen_attention(qs, ks, vs, cu, length)  # [n*L, H/g, D]
        y = o.index_select(0, scatter).view(g, n * C, hg, D)
        return y.movedim(0, 1).reshape(n * C, H, D)

    return attn


def reference_block(d_model: int, heads: int, device: Any = None) -> Any:
    import torch

    from knapformer.models.block import TransformerBlock

    torch.manual_seed(0)
    return TransformerBlock(d_model, heads).to(device or "cpu")


def calibrate(
    d_model: int = 256,
    heads: int = 4,
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
) -> CalibrationReport:
    """Time, fit and return a profile (not saved; see `CostModel.save`).

    ``on_run(done, total)`` reports the timed runs (for a progress bar).
    """
    import torch

    from knapformer.calibration.comm import measure_all_to_all
    from knapformer.calibration.timing import time_forward_backward
    from knapformer.models.block import rope_cos_sin

    t_start = time.perf_counter()
    say = log or (lambda _msg: None)
    bag_sizes = tuple(sorted(set(int(g) for g in bag_sizes)))
    if not bag_sizes or bag_sizes[0] < 1:
        raise CalibrationError(f"bag sizes must be >= 1, got {list(bag_sizes)}")
    bad = [g for g in bag_sizes if heads % g]
    if bad:
        raise CalibrationError(f"bag sizes {bad} do not divide heads={heads}")
    if d_model % heads or (d_model // heads) % 2:
        raise CalibrationError(f"d_model={d_model} must split into {heads} heads of even size")
    if any(int(x) < max(bag_sizes) for x in lengths):
        raise CalibrationError(f"every length must be >= the largest bag size {max(bag_sizes)}")
    fit_L, held_L = split_heldout(lengths)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    block = reference_block(d_model, heads, dev)
    head_dim = d_model // heads
    all_L = sorted(set(fit_L) | set(held_L))
    cases = [(g, L) for g in bag_sizes for L in all_L]

    def make_inputs(case: tuple[int, int]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        g, L = case
        C = math.ceil(L / g)  # the largest chunk: the bag waits for it
        x = torch.randn(C, d_model, device=dev, requires_grad=True)
        rope = rope_cos_sin(torch.arange(C, device=dev), head_dim)
        return (x, rope, bag_attention(g, L)), {}

    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)  # fixed for comparable timings; restored afterwards
    try:
        secs = time_forward_backward(
            block, make_inputs, cases, repeats, warmup, dev, min_time_s=min_time_s, on_run=on_run
        )
    finally:
        torch.set_num_threads(prev_threads)
    measured: dict[int, dict[int, float]] = {g: {} for g in bag_sizes}
    for (g, L), s in zip(cases, secs, strict=True):
        measured[g][L] = s
    for g in bag_sizes:
        say(f"g={g}: " + ", ".join(f"L={L}: {s * 1e3:.2f} ms" for L, s in measured[g].items()))

    def arrays(ls: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        L = np.array([x for g in bag_sizes for x in ls], dtype=np.float64)
        G = np.repeat(np.asarray(bag_sizes, dtype=np.float64), len(ls))
        t = np.array([measured[g][x] for g in bag_sizes for x in ls])
        return L, G, t

    L, G, t = arrays(fit_L)
    fit = fit_cost(L, G, t, fixed_c=0.0)
    Lh, Gh, th = arrays(held_L)
    pred_h = fit.predict(Lh, Gh)
    held_mape = mape(th, pred_h)
    per_g = {g: mape(th[Gh == g], pred_h[Gh == g]) for g in bag_sizes}
    say(f"fit MAPE {fit.fit_mape:.2f}% on {fit_L}; held-out MAPE {held_mape:.2f}% on {held_L}")
    say("held-out MAPE per bag size: " + ", ".join(f"g={g}: {m:.2f}%" for g, m in per_g.items()))

    comm: dict[str, Any] = {}
    c = 0.0
    if measure_comm:
        try:
            r = measure_all_to_all(d_model)
            c = r.c
            comm = {
                "backend": "gloo",
                "world": 2,
                "rows": list(r.sizes),
                "seconds": list(r.seconds),
                "latency_s": r.alpha,
                "s_per_row": r.k,
                "c": c,
            }
            say(f"all-to-all (gloo, 2 procs, d={d_model}): {r.k * 1e9:.1f} ns/row, c={c:.3g}")
        except RuntimeError as exc:  # report, keep the compute fit
            comm = {"error": str(exc)}
            say(f"all-to-all measurement failed, c=0: {exc}")
    block_name = "TransformerBlock"
    profile = CostModel(
        a=fit.a,
        b=fit.b,
        c=c,
        e=fit.e,
        name=f"calibrated:{block_name}(d={d_model},h={heads},{dev.type})",
        meta={
            "units": "seconds per block forward+backward",
            "block": block_name,
            "d_model": d_model,
            "heads": heads,
            "device": dev.type,
            "threads": threads,
            "bag_sizes": list(bag_sizes),
            "lengths_fit": fit_L,
            "lengths_heldout": held_L,
            "fit_mape_percent": fit.fit_mape,
            "heldout_mape_percent": held_mape,
            "heldout_mape_percent_per_bag_size": {str(g): m for g, m in per_g.items()},
            "clock": "wall" if dev.type == "cuda" else "cpu",
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
        fit_mape=fit.fit_mape,
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
