"""NNLS fit of the cost model and profile round trip (pure, fast)."""

import numpy as np
import pytest

from knapformer.calibration.fit import CalibrationError, fit_cost, mape, split_heldout
from knapformer.planning.cost import CostModel


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


def test_bad_input_is_reported():
    with pytest.raises(CalibrationError, match="at least 3"):
        fit_cost([1, 2], 1, [1.0, 2.0])
    with pytest.raises(CalibrationError, match="positive"):
        fit_cost([1, 2, 3], 1, [1.0, 0.0, 2.0])
    with pytest.raises(CalibrationError, match="4 distinct lengths"):
        split_heldout([64, 128, 128])


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
