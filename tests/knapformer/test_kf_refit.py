"""Online refit of the cost model from measured per-rank times (issue 10): the fit is robust,
anchored to the prior where the data cannot tell coefficients apart, and its state round-trips."""

from __future__ import annotations

import numpy as np
import pytest

from knapformer.planning import CostModel
from knapformer.train.refit import CostRefit, RefitError, rank_features, refit

TRUE = CostModel(a=2e-5, b=3e-9, c=0.0, e=1.5e-3, f=0.015, u=0.03, name="true")


def _samples(seed: int, steps: int = 30, world: int = 4, sizes=(1, 2, 4)):
    """Per-rank features of random bags and their times under TRUE, with a load factor per
    step, 2% noise and a few preempted (3x) ranks."""
    rng = np.random.default_rng(seed)
    X, y, groups = [], [], []
    for s in range(steps):
        load = rng.uniform(0.8, 1.6)
        for _ in range(world):
            g = int(rng.choice(sizes))
            lens = rng.integers(64, 4000, int(rng.integers(0, 6)))
            x = rank_features(lens, g)
            t = float(x @ [TRUE.a, TRUE.b, TRUE.c, TRUE.e, TRUE.f, TRUE.u])
            t *= load * rng.normal(1.0, 0.02)
            if rng.random() < 0.05:
                t *= 3.0
            X.append(x)
            y.append(t)
            groups.append(s)
    return np.array(X), np.array(y), np.array(groups)


def test_rank_features_give_rank_time():
    lens = [100, 2000, 37]
    for g in (1, 2, 4):
        x = rank_features(lens, g)
        load = float(np.sum(TRUE.t(np.asarray(lens), g)))
        coef = np.array([TRUE.a, TRUE.b, TRUE.c, TRUE.e, TRUE.f, TRUE.u])
        assert x @ coef == pytest.approx(TRUE.rank_time(load, g), rel=1e-12)
    assert rank_features([], 2) @ [1, 1, 1, 1, 1, 1] == pytest.approx(1.5)  # f + u/2 only


def _coef(m: CostModel) -> np.ndarray:
    return np.array([m.a, m.b, m.c, m.e, m.f, m.u])


def _scaled_mape(model: CostModel, X: np.ndarray) -> tuple[float, float]:
    """(MAPE in %, scale) of ``model``'s rank times on ``X`` against TRUE's, after the one
    scale that the steps' load factors leave open (the median ratio)."""
    pred, true = X @ _coef(model), X @ _coef(TRUE)
    c = float(np.median(pred / true))
    return float(100 * np.mean(np.abs(pred / c - true) / true)), c


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_refit_recovers_rank_times_from_a_prior_in_other_units(seed):
    X, y, groups = _samples(seed)
    # the prior: FLOP-like units (1e9 x) and wrong shares of b, e, f and u
    prior = CostModel(a=TRUE.a * 1e9, b=TRUE.b * 2e9, e=0.0, f=TRUE.f * 3e9, u=0.0, name="p")
    fitted, stats = refit(prior, X, y, groups)
    held, _, _ = _samples(100 + seed)  # ranks the fit has not seen
    assert _scaled_mape(prior, held)[0] > 10.0
    err, scale = _scaled_mape(fitted, held)
    assert err < 3.0
    assert 0.8 <= scale <= 1.6  # (the steps' load factors are drawn from [0.8, 1.6])
    assert stats["downweighted"] >= 1  # the preempted ranks
    assert stats["mape_after_percent"] < stats["mape_before_percent"]


def test_refit_keeps_the_prior_where_the_data_cannot_tell():
    # every rank in a 2-bag: u (g-1)/g = u/2 on every sample, indistinguishable from f; the
    # data fix f + u/2, the prior (of the right shape) how it splits
    X, y, groups = _samples(1, sizes=(2,))
    fitted, _ = refit(TRUE, X, y, groups)
    _, scale = _scaled_mape(fitted, X)
    assert fitted.f == pytest.approx(scale * TRUE.f, rel=0.1)
    assert fitted.u == pytest.approx(scale * TRUE.u, rel=0.1)
    # no u column at all (only 1-GPU bags): u stays the prior's, rescaled
    X1, y1, g1 = _samples(2, sizes=(1,))
    fitted1, stats1 = refit(TRUE, X1, y1, g1)
    assert fitted1.u == pytest.approx(TRUE.u * stats1["prior_scale"], rel=1e-12)


def test_refit_state_round_trips_and_bad_input_is_named():
    X, y, _ = _samples(3, steps=6, world=2)
    r = CostRefit(TRUE, every=2)
    for s in range(6):
        rec = {
            "step": s + 1,
            "rank_cost_features": X[2 * s : 2 * s + 2].tolist(),
            "rank_busy_s": y[2 * s : 2 * s + 2].tolist(),
        }
        r.observe(rec)
    assert r.steps == [2, 3, 4, 5, 6]  # the process's first step is left out
    assert r.due(6) and not r.due(5)
    fitted, _ = r.fit()
    again = CostRefit(TRUE, every=2)
    again.load_state_dict(r.state_dict())
    assert again.current == fitted and again.X == r.X and again.y == r.y and again.fits == 1
    assert again.fit()[0] == fitted  # deterministic
    with pytest.raises(RefitError, match="X \\[n, 6\\]"):
        refit(TRUE, X[:, :4], y)
    with pytest.raises(RefitError, match="finite"):
        refit(TRUE, X, y * np.nan)
    with pytest.raises(RefitError, match="every"):
        CostRefit(TRUE, every=0)
    with pytest.raises(RefitError, match="invalid cost refit state"):
        again.load_state_dict({"base": {}})
