"""Online refit of the cost model from the trainer's own measured per-rank compute times.

The calibrated model is fitted on isolated blocks before training (and ``u`` on a few uniform
steps); a training step adds what those do not see (embeddings, the loss, FSDP hooks, the real
mixture of lengths, the load of the machine). Each step logs, per rank, the busy time of its
forward + backward on the training device's clock (``rank_busy_s``: thread CPU time on CPU,
CUDA-event time less the collectives on GPU, so peers' waits are not fitted as compute) and
the basis of its modelled time: the sums over the sequences of its bag of the cost formula's
columns (``L/g, L^2/g, L(g-1)/g, 1``), then ``1`` (for ``f``) and ``(g-1)/g``
(for ``u``); the rank's modelled time is the model's coefficients dotted with these
(:meth:`CostModel.rank_time`). :func:`refit` fits the coefficients to the measured times:

* robust: iteratively reweighted least squares with Huber weights (a preempted step is an
  outlier, not a change of the model), all coefficients >= 0 (NNLS, so plans stay valid);
* anchored: a ridge term pulls every coefficient towards the prior model (the base model times
  one global scale, the median ratio of measured to modelled times, which also converts FLOP
  units to seconds). Coefficients the data cannot tell apart (every rank of every step in the
  same bag size leaves ``u`` indistinguishable from ``f``) keep their prior share instead of
  taking arbitrary values.

:class:`CostRefit` is the trainer's state: the samples of the steps so far (the first step of a
process, which pays one-off allocation costs, left out) and the model in use; it refits every
``every`` steps. Pure: the trainer has rank 0 fit and broadcast, and checkpoints the state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from knapformer.planning.cost import COEFFICIENTS, CostModel, cost_terms

__all__ = ["FEATURES", "CostRefit", "RefitError", "rank_features", "refit"]

FEATURES = COEFFICIENTS  # the coefficient each feature column multiplies, in order
_HUBER = 1.5  # residuals beyond this many robust standard deviations are down-weighted
# prior strength per coefficient, as a fraction of the data's weight on its column: only enough
# to settle directions the data leaves open (at 1e-2 it already bent well-determined ones)
_RIDGE = 1e-3
_MAX_STEPS = 400  # samples kept (the most recent steps)


class RefitError(ValueError):
    """Refit state or samples that cannot be used."""


def rank_features(lengths: Sequence[int] | np.ndarray, g: int) -> np.ndarray:
    """[6] the basis of a rank's modelled time when its bag of size ``g`` holds ``lengths``:
    column sums of :func:`cost_terms`, then 1 and ``(g-1)/g``."""
    L = np.asarray(lengths, dtype=np.float64).reshape(-1)
    cols = [float(np.sum(c)) for c in cost_terms(L, g)] if L.size else [0.0] * 4
    return np.array([*cols, 1.0, (g - 1.0) / g])


def _coefficients(cost: CostModel) -> np.ndarray:
    return np.array(cost.values(), dtype=np.float64)


def _robust_nnls(
    X: np.ndarray, y: np.ndarray, prior: np.ndarray, iters: int
) -> tuple[np.ndarray, np.ndarray]:
    """Huber-IRLS of ``y ~ X theta``, ``theta >= 0``, with the ridge pull towards ``prior``;
    returns ``theta`` and the final sample weights."""
    from scipy.optimize import nnls

    n = X.shape[0]
    col = np.sqrt(np.mean(X * X, axis=0))  # each column's scale (0: not in the data)
    used = col > 0
    norm = col[used]  # (columns to unit scale for NNLS)
    ridge = np.full(int(used.sum()), np.sqrt(_RIDGE * n))
    w = np.ones(n)
    theta = prior.copy()
    for _ in range(iters):
        sw = np.sqrt(w)
        A = np.vstack([X[:, used] * sw[:, None] / norm, np.diag(ridge)])
        rhs = np.concatenate([y * sw, ridge * prior[used] * norm])
        sol, _ = nnls(A, rhs, maxiter=50 * A.shape[1])
        theta[used] = sol / norm
        r = y - X @ theta
        s = 1.4826 * float(np.median(np.abs(r - np.median(r))))
        if s <= 0:
            break
        w_new = np.minimum(1.0, _HUBER * s / np.maximum(np.abs(r), 1e-300))
        if np.allclose(w_new, w, rtol=0, atol=1e-6):
            break
        w = w_new
    return theta, w


def refit(
    cost: CostModel,
    X: np.ndarray,
    y: np.ndarray,
    groups: np.ndarray | None = None,
    iters: int = 8,
) -> tuple[CostModel, dict]:
    """``cost`` with coefficients fitted to measured times ``y`` [n] of ranks with features
    ``X`` [n, 6] (see the module docstring). Returns the model and fit statistics.

    ``groups`` [n] (e.g. the step of each sample): samples of one group share a load factor (a
    busier machine slows every rank of a step alike), estimated by alternating with the fit as
    the median ratio of measured to fitted time per group, normalised to a median of 1; then
    mostly the differences between the ranks of a step, which are what balancing acts on,
    shape the fit."""
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != len(FEATURES) or y.shape != (X.shape[0],):
        raise RefitError(f"refit needs X [n, {len(FEATURES)}] and y [n], got {X.shape}, {y.shape}")
    if not (np.isfinite(X).all() and np.isfinite(y).all()) or (X < 0).any():
        raise RefitError("refit samples must be finite and the features >= 0")
    base = _coefficients(cost)
    modelled = X @ base
    ok = (modelled > 0) & (y > 0)
    if ok.sum() < 2:
        raise RefitError("refit needs at least 2 samples with positive modelled and measured time")
    scale = float(np.median(y[ok] / modelled[ok]))
    prior = scale * base
    X, y = X[ok], y[ok]
    factor = np.ones(y.shape[0])
    rounds = 1
    if groups is not None:
        _, gid = np.unique(np.asarray(groups)[ok], return_inverse=True)
        rounds = 3
    for _ in range(rounds):
        theta, w = _robust_nnls(X, y / factor, prior, iters)
        if groups is None:
            break
        ratio = y / np.maximum(X @ theta, 1e-300)
        per = np.array([np.median(ratio[gid == k]) for k in range(int(gid.max()) + 1)])
        per /= float(np.median(per))
        factor = per[gid]
    if theta[0] <= 0 and theta[1] <= 0:  # (a cost model needs a length dependence)
        theta[:2] = prior[:2]
    fitted = cost.with_values(theta, name=f"refit:{cost.name}")
    pred = factor * (X @ theta)
    stats = {
        "samples": int(y.shape[0]),
        "prior_scale": scale,
        "mape_before_percent": float(100 * np.mean(np.abs(scale * modelled[ok] - y) / y)),
        "mape_after_percent": float(100 * np.mean(np.abs(pred - y) / y)),
        "downweighted": int(np.sum(w < 1.0)),
    }
    return fitted, stats


@dataclasses.dataclass
class CostRefit:
    """The trainer's online refit: samples of the steps so far, the model in use, refits every
    ``every`` steps (the first after ``every`` samples). State to checkpoint: :meth:`state_dict`."""

    base: CostModel
    every: int
    current: CostModel | None = None
    steps: list[int] = dataclasses.field(default_factory=list)
    X: list[list[list[float]]] = dataclasses.field(default_factory=list)  # [step][rank][6]
    y: list[list[float]] = dataclasses.field(default_factory=list)  # [step][rank]
    fits: int = 0
    _seen_first: bool = dataclasses.field(default=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.every, int) or isinstance(self.every, bool) or self.every < 1:
            raise RefitError(f"refit every must be a positive integer, got {self.every!r}")
        if self.current is None:
            self.current = self.base

    def observe(self, rec: dict[str, Any]) -> None:
        """Record a step (the trainer's record: ``rank_cost_features``, ``rank_busy_s``);
        the first step this process runs is left out (one-off allocation costs)."""
        if not self._seen_first:
            self._seen_first = True
            return
        self.steps.append(int(rec["step"]))
        self.X.append([[float(v) for v in row] for row in rec["rank_cost_features"]])
        self.y.append([float(v) for v in rec["rank_busy_s"]])
        del self.steps[:-_MAX_STEPS], self.X[:-_MAX_STEPS], self.y[:-_MAX_STEPS]

    def due(self, step: int) -> bool:
        return step % self.every == 0 and len(self.y) >= 2

    def fit(self) -> tuple[CostModel, dict]:
        """Fit on every kept sample (prior: the base model); sets and returns the model."""
        X = np.asarray(self.X, dtype=np.float64).reshape(-1, len(FEATURES))
        y = np.asarray(self.y, dtype=np.float64).reshape(-1)
        groups = np.repeat(np.asarray(self.steps), [len(r) for r in self.y])
        fitted, stats = refit(self.base, X, y, groups)
        self.current = fitted
        self.fits += 1
        return fitted, stats

    def adopt(self, cost: CostModel) -> None:
        """Use a model fitted elsewhere (rank 0's, broadcast)."""
        self.current = cost
        self.fits += 1

    def state_dict(self) -> dict[str, Any]:
        assert self.current is not None
        return {
            "base": self.base.to_dict(),
            "current": self.current.to_dict(),
            "every": self.every,
            "steps": list(self.steps),
            "X": self.X,
            "y": self.y,
            "fits": self.fits,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            self.base = CostModel.from_dict(state["base"])
            self.current = CostModel.from_dict(state["current"])
            steps, X, y = list(state["steps"]), list(state["X"]), list(state["y"])
            fits = int(state["fits"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RefitError(f"invalid cost refit state: {exc}") from None
        if not (len(steps) == len(X) == len(y)):
            raise RefitError("invalid cost refit state: samples of different lengths")
        self.steps, self.X, self.y, self.fits = steps, X, y, fits
