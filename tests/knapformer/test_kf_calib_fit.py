"""NNLS fit of the cost model and profile round trip (pure, fast)."""

import numpy as np
import pytest

from knapformer.calibration.fit import CalibrationError, fit_cost, mape, split_heldout
from knapformer.planning.cost import CostModel, CostModelError


def _synthetic(a, b, c, e, lengths, gs):
    L = np.array([x for _ in gs for x in lengths], dtype=float)
    g = np.repeat(np.asarray(gs, dtype=float), len(lengths))
    t = (a * L + b * L * L) / g + c * L * (g - 1) / g + e
    return L, g, t


@pytest.mark.parametrize(
    "coef", [(3e-6, 2e-9, 1e-7, 5e-4), (1e-5, 0.0, 0.0, 0.0), (0.0, 4e-9, 2e-6, 1e-3)]
)
def test_recovers_known_coefficients(coef):
    L, g, t = _synthetic(*coef, [64, 128, 256, 512, 1024, 2048, 4096], [1, 2, 4])
    fit = fit_cost(L, g, t)
    got = (fit.a, fit.b, fit.c, fit.e)
    t_max = float(t.max())
    for want, have, col in zip(coef, got, (4096, 4096**2, 4096, 1), strict=True):
        if want > 0:
            assert have == pytest.approx(want, rel=1e-6)
        else:  # an absent term stays (numerically) absent
            assert have * col <= 1e-9 * t_max
    assert fit.fit_mape < 1e-6
    np.testing.assert_allclose(fit.predict(L, g), t, rtol=1e-8)


def test_noisy_fit_is_close_and_nonnegative():
    rng = np.random.default_rng(0)
    L, g, t = _synthetic(3e-6, 2e-9, 0.0, 5e-4, [64, 96, 128, 256, 512, 1024, 2048], [1])
    noisy = t * rng.uniform(0.98, 1.02, size=t.size)
    fit = fit_cost(L, g, noisy)
    assert min(fit.a, fit.b, fit.c, fit.e) >= 0
    assert fit.fit_mape < 2.5
    assert abs(fit.b - 2e-9) / 2e-9 < 0.1


def test_fixed_c_is_kept_and_c_without_g_is_zero():
    L, g, t = _synthetic(3e-6, 2e-9, 0.0, 5e-4, [64, 128, 256, 512], [1])
    assert fit_cost(L, g, t).c == 0.0
    fit = fit_cost(L, g, t, fixed_c=7e-7)
    assert fit.c == 7e-7 and fit.fit_mape < 1e-6


def test_packed_calls_separate_the_per_sequence_and_per_call_constants():
    # time = f + n * ((a L + b L^2)/g + e): one-sequence calls alone cannot tell e from f
    L = np.array([64, 128, 256, 512, 1024, 64, 128, 64, 128, 64, 128], dtype=float)
    g = np.array([1, 1, 1, 1, 1, 2, 2, 1, 1, 2, 2], dtype=float)
    n = np.array([1, 1, 1, 1, 1, 1, 1, 4, 4, 4, 4], dtype=float)
    a, b, e, f = 3e-6, 2e-9, 5e-4, 2e-3
    t = f + n * ((a * L + b * L * L) / g + e)
    fit = fit_cost(L, g, t, fixed_c=0.0, n=n)
    assert (fit.a, fit.b, fit.e, fit.f) == pytest.approx((a, b, e, f), rel=1e-6)
    np.testing.assert_allclose(fit.predict(L, g, n), t, rtol=1e-8)
    ones = n == 1
    merged = fit_cost(L[ones], g[ones], t[ones])
    assert merged.f == 0.0 and merged.e == pytest.approx(e + f, rel=1e-6)


def test_bad_input_is_reported():
    with pytest.raises(CalibrationError, match="at least 3"):
        fit_cost([1, 2], 1, [1.0, 2.0])
    with pytest.raises(CalibrationError, match="positive"):
        fit_cost([1, 2, 3], 1, [1.0, 0.0, 2.0])
    with pytest.raises(CalibrationError, match="4 distinct lengths"):
        split_heldout([64, 128, 128])
    with pytest.raises(CalibrationError, match="integers >= 1"):
        fit_cost([1, 2, 3], 1, [1.0, 2.0, 3.0], n=[1, 0, 2])
    with pytest.raises(CalibrationError, match="sequence counts"):
        fit_cost([1, 2, 3], 1, [1.0, 2.0, 3.0], n=[1, 2])


def test_heldout_split_interleaves_inside_the_range():
    fit, held = split_heldout([64, 128, 256, 512, 1024, 2048, 4096])
    assert held and set(fit).isdisjoint(held)
    assert min(fit) < min(held) and max(held) < max(fit)
    assert mape([1.0, 2.0], [1.1, 1.8]) == pytest.approx(10.0)


def test_profile_round_trip(tmp_path):
    prof = CostModel(a=3e-6, b=2e-9, c=1e-7, e=5e-4, name="calibrated", meta={"mape": 1.5})
    path = tmp_path / "profile.json"
    prof.save(path)
    back = CostModel.load(path)
    assert back == prof and back.meta == {"mape": 1.5}
    assert back.t(1000, 2) == prof.t(1000, 2)


def test_per_rank_constant_f_round_trips_and_old_profiles_load(tmp_path):
    prof = CostModel(a=3e-6, b=2e-9, e=5e-4, f=0.015, name="calibrated")
    path = tmp_path / "profile.json"
    prof.save(path)
    assert CostModel.load(path).f == 0.015
    # a profile written before f existed loads with f = 0
    old = {"kind": "knapformer-cost-profile", "version": 1, "a": 3e-6, "b": 2e-9, "c": 0.0,
           "e": 5e-4, "name": "old", "meta": {}}  # fmt: skip
    assert CostModel.from_dict(old).f == 0.0
    # f is outside t (the planner's per-sequence cost) and inside a rank's modelled time
    assert prof.t(100, 2) == CostModel(a=3e-6, b=2e-9, e=5e-4).t(100, 2)
    assert prof.rank_time(0.25) == pytest.approx(0.265)
    np.testing.assert_allclose(prof.rank_time(np.array([0.0, 1.0])), [0.015, 1.015])
    assert (prof + prof).f == pytest.approx(0.03) and prof.scaled(3).f == pytest.approx(0.045)
    with pytest.raises(CostModelError, match="f must be >= 0"):
        CostModel(a=1.0, b=0.0, f=-1.0)
