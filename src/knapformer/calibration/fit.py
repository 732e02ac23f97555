"""Fit ``t(L, g) = (a*L + b*L^2)/g + c*L*(g-1)/g + e`` to timings by non-negative least squares.

A timed call may hold ``n`` identical sequences and pay a fixed cost ``f`` once per call
(Python and kernel-launch overheads of the block): ``time = f + n * t(L, g)``. Timing calls with
several ``n`` separates the per-sequence constant ``e`` (one attention call per sequence) from
``f``; with ``n = 1`` everywhere the two are one column and ``f`` stays 0.

Pure: arrays in, coefficients out. Rows are weighted by 1/t so the fit minimises *relative*
error (short and long sequences count alike; otherwise the largest L dominates and short
sequences get a meaningless intercept), and columns are normalised before NNLS because L^2
is many orders of magnitude larger than 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from knapformer.planning.cost import COEFFICIENTS, TERMS, CostModel, cost_terms

__all__ = ["CalibrationError", "FitResult", "design_matrix", "fit_cost", "mape", "split_heldout"]


class CalibrationError(ValueError):
    """Unusable calibration input (too few points, non-positive timings, bad lengths)."""


@dataclass(frozen=True)
class FitResult:
    """Fitted non-negative coefficients and the fit's relative error on its own points."""

    a: float
    b: float
    c: float
    e: float
    fit_mape: float
    f: float = 0.0  # fixed cost per timed call, whatever its number of sequences

    def predict(
        self,
        L: np.ndarray | Sequence[float],
        g: np.ndarray | Sequence[float] | int = 1,
        n: np.ndarray | Sequence[float] | int = 1,
    ) -> np.ndarray:
        """Time of a call holding ``n`` length-``L`` sequences in a ``g``-bag."""
        X = design_matrix(np.asarray(L, dtype=np.float64), np.asarray(g, dtype=np.float64))
        n_arr = np.broadcast_to(np.asarray(n, dtype=np.float64), X.shape[:1])
        return n_arr * (X @ np.array([getattr(self, k) for k in TERMS])) + self.f

    def cost(self, name: str, **overrides: float) -> CostModel:
        """The fitted coefficients as a :class:`CostModel` (``u`` is not fitted here: 0)."""
        fitted = (*TERMS, "f")
        values = {k: getattr(self, k) if k in fitted else 0.0 for k in COEFFICIENTS}
        return CostModel(**{**values, **overrides}, name=name)


def design_matrix(L: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The cost model's own basis (:func:`cost_terms`) as columns, one row per point."""
    return np.stack([np.ravel(x) for x in cost_terms(L, g)], axis=1)


def mape(measured: np.ndarray | Sequence[float], predicted: np.ndarray | Sequence[float]) -> float:
    """Mean absolute percentage error, in percent."""
    m = np.asarray(measured, dtype=np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    return float(np.mean(np.abs(p - m) / m) * 100.0)


def fit_cost(
    L: np.ndarray | Sequence[float],
    g: np.ndarray | Sequence[float] | int,
    t: np.ndarray | Sequence[float],
    fixed_c: float | None = None,
    n: np.ndarray | Sequence[float] | int = 1,
) -> FitResult:
    """NNLS fit of (a, b, c, e) and, when ``n`` (sequences per timed call) varies, the per-call
    cost ``f``; `fixed_c` pins c (e.g. from a bandwidth measurement).

    Without g > 1 points the c column is identically zero and c comes out 0 unless pinned.
    """
    from scipy.optimize import nnls

    L = np.asarray(L, dtype=np.float64).ravel()
    t = np.asarray(t, dtype=np.float64).ravel()
    g = np.broadcast_to(np.asarray(g, dtype=np.float64), L.shape).astype(np.float64)
    try:
        n_arr = np.broadcast_to(np.asarray(n, dtype=np.float64), L.shape).astype(np.float64)
    except ValueError:
        raise CalibrationError(
            f"{L.size} lengths but sequence counts of shape {np.shape(n)}"
        ) from None
    if np.any(n_arr < 1) or np.any(n_arr != np.round(n_arr)):
        raise CalibrationError("sequence counts per call must be integers >= 1")
    if L.size != t.size:
        raise CalibrationError(f"{L.size} lengths but {t.size} timings")
    if L.size < 3:
        raise CalibrationError(f"need at least 3 timed points to fit, got {L.size}")
    if np.any(L < 1) or np.any(g < 1):
        raise CalibrationError("lengths and bag sizes must be >= 1")
    if np.any(~np.isfinite(t)) or np.any(t <= 0):
        raise CalibrationError("timings must be positive and finite")
    per_call = np.unique(n_arr).size > 1  # else f and e are one column: keep it in e
    X = design_matrix(L, g) * n_arr[:, None]
    X = np.concatenate([X, np.ones((L.size, 1 if per_call else 0))], axis=1)
    y = t.copy()
    if fixed_c is not None:
        if fixed_c < 0:
            raise CalibrationError(f"fixed c must be >= 0, got {fixed_c}")
        y = y - X[:, 2] * fixed_c
        X = X.copy()
        X[:, 2] = 0.0
    w = 1.0 / t
    Xw = X * w[:, None]
    yw = y * w
    scale = np.linalg.norm(Xw, axis=0)
    active = scale > 0
    coef = np.zeros(X.shape[1])
    sol, _ = nnls(Xw[:, active] / scale[active], yw, maxiter=1000)
    coef[active] = sol / scale[active]
    if fixed_c is not None:
        coef[2] = fixed_c
    a, b, c, e = (float(x) for x in coef[:4])
    res = FitResult(a=a, b=b, c=c, e=e, fit_mape=0.0, f=float(coef[4]) if per_call else 0.0)
    return dataclasses.replace(res, fit_mape=mape(t, res.predict(L, g, n_arr)))


def split_heldout(lengths: Sequence[int], every: int = 3) -> tuple[list[int], list[int]]:
    """Interleaved split: every `every`-th interior length is held out, the extremes are fitted.

    Held-out lengths lie inside the fitted range, so MAPE measures interpolation, which is what
    the planner does with the profile.
    """
    ls = sorted(set(int(x) for x in lengths))
    if len(ls) < 4:
        raise CalibrationError(f"need at least 4 distinct lengths (3 fit + 1 held out), got {ls}")
    held = [x for i, x in enumerate(ls) if 0 < i < len(ls) - 1 and i % every == 1]
    fit = [x for x in ls if x not in held]
    if len(fit) < 3:
        raise CalibrationError(f"too few lengths left to fit after holding out {held}")
    return fit, held
