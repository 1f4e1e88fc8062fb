"""wsutils.estimators.rates: the models behind the rate tolerances (chapters random-features and
deep-random-features)."""

import math

import numpy as np
import pytest

from wsutils.estimators import rates
from wsutils.estimators.drf import drf_limit_change


def test_rf_typical_values_at_k_equal_D():
    n, d = 100, 16
    assert rates.rf_upper_limit(n, d, n * d) == pytest.approx(math.sqrt(2) * 1.1 / 10)
    assert rates.rf_lower_typical(n, d, n * d) == pytest.approx(
        (1 + math.sqrt(0.02)) / math.sqrt(200)
    )


def test_slope_window_contains_the_model_slopes():
    n = np.repeat(np.arange(90, 151, 10), 3).astype(float)
    lo, hi = rates.rf_slope_window(n, 192, n * 192)
    assert hi == -0.5 and lo < -0.5
    for a1 in np.linspace(0, rates.A1_MAX, 7):  # every a_1 of the model fits inside
        S = 3.0 * rates.rf_finite_width_factor(192, n * 192, a1) / np.sqrt(n)
        assert lo - 1e-12 <= rates.ols_slope(n, S) <= hi + 1e-12
    S = 3.0 * (1 + 2.0 / np.sqrt(n)) / np.sqrt(n)  # a_1 = 2 is outside the model
    assert rates.ols_slope(n, S) < lo


def test_slope_window_is_a_point_at_fixed_width():
    n = np.array([20.0, 40, 80])
    assert rates.rf_slope_window(n, 16, 4096) == pytest.approx((-0.5, -0.5))


def test_ols_slope_with_groups():
    n = np.array([10.0, 20, 40, 10, 20, 40])
    g = np.array([0, 0, 0, 1, 1, 1])
    S = np.where(g == 0, 1.0, 5.0) * n**-0.5
    assert rates.ols_slope(n, S, g) == pytest.approx(-0.5)


def test_drf_expansion_matches_the_corner_value():
    for L in (2, 4, 8):
        for n in (1e4, 1e6):
            F = float(drf_limit_change(n, L, 1.0, 1.0)) * math.sqrt(n)
            assert abs(F - rates.drf_limit_expansion(n, L)) <= L**2 / n


@pytest.mark.parametrize(
    "call",
    [
        lambda: rates.rf_upper_limit(0, 1, 1),
        lambda: rates.rf_lower_typical(10, -1, 5),
        lambda: rates.rf_finite_width_factor(1, 1, a1=2.0),
        lambda: rates.ols_slope([1.0], [1.0]),
        lambda: rates.drf_limit_expansion(10, -1),
    ],
)
def test_bad_input_is_refused(call):
    with pytest.raises(ValueError):
        call()


def test_bonferroni_band_and_its_failure_probability():
    assert rates.bonferroni_z(1, 0.05) == pytest.approx(1.959964, rel=1e-6)
    for m in (1, 3, 75):
        p = rates.family_failure(rates.bonferroni_z(m), m)
        assert 0.0099 < p < 0.01 * (1 + 1e-9)
    assert rates.family_failure(3.0, 1) == pytest.approx(0.0026998, rel=1e-4)
    assert rates.family_failure(3.0, 0) == 0.0
    with pytest.raises(ValueError):
        rates.bonferroni_z(0)


def test_ols_slope_bound_is_attained_and_bounds_every_perturbation():
    ns = np.geomspace(1e3, 1e5, 9)
    b = 1 / ns
    bound = rates.ols_slope_bound(ns, b)
    x = np.log(ns)
    sign = np.sign(x - x.mean())
    base = ns**-0.5
    assert abs(rates.ols_slope(ns, base * np.exp(b * sign)) + 0.5) == pytest.approx(bound)
    g = np.random.default_rng(0)
    for _ in range(20):
        eps = b * g.uniform(-1, 1, ns.size)
        assert abs(rates.ols_slope(ns, base * np.exp(eps)) + 0.5) <= bound * (1 + 1e-12)
    with pytest.raises(ValueError):
        rates.ols_slope_bound(ns, -b)


def test_slope_se_seeds_counts_only_the_spread_between_seeds():
    ns = (10, 50, 100, 250)
    curved = np.array([[math.log(n) ** 2] * 3 for n in ns])  # no spread between seeds
    assert rates.slope_se_seeds(ns, curved) < 1e-14
    noisy = curved + np.array([[0.1, -0.1, 0.0]] * 4)
    x = np.log(ns)
    want = math.sqrt(0.01 / (3 * float(((x - x.mean()) ** 2).sum())))
    assert rates.slope_se_seeds(ns, noisy) == pytest.approx(want)
    with pytest.raises(ValueError):
        rates.slope_se_seeds(ns, curved[:, :1])


def test_ols_slope_range_holds_every_slope_inside_the_brackets_and_is_attained():
    ns = np.array([10.0, 20, 50, 100, 200])
    g = np.random.default_rng(1)
    lower = ns**-0.5 * g.uniform(0.8, 1.2, ns.size)
    upper = lower * g.uniform(1.0, 3.0, ns.size)
    lo, hi = rates.ols_slope_range(ns, lower, upper)
    assert lo < rates.ols_slope(ns, lower) < hi
    for _ in range(200):
        y = lower + g.uniform(0, 1, ns.size) * (upper - lower)
        assert lo - 1e-12 <= rates.ols_slope(ns, y) <= hi + 1e-12
    x = np.log(ns)
    rising = x > x.mean()
    steep = np.where(rising, lower, upper)  # the least slope's y
    flat = np.where(rising, upper, lower)
    assert rates.ols_slope(ns, steep) == pytest.approx(lo, rel=1e-9)
    assert rates.ols_slope(ns, flat) == pytest.approx(hi, rel=1e-9)
    lo_eq, hi_eq = rates.ols_slope_range(ns, lower, lower)  # a closed bracket: one slope
    assert lo_eq == pytest.approx(hi_eq, rel=1e-9)
    assert lo_eq == pytest.approx(rates.ols_slope(ns, lower), rel=1e-9)
    assert rates.ols_slope_range(ns, lower, np.r_[upper[:-1], np.inf])[1] == np.inf
    with pytest.raises(ValueError):
        rates.ols_slope_range(ns, upper, lower)  # upper below lower
    with pytest.raises(ValueError):
        rates.ols_slope_range(ns, lower, upper[:-1])
    with pytest.raises(ValueError, match="two different"):
        rates.ols_slope_range([10.0, 10.0], [1.0, 1.0], [2.0, 2.0])  # no slope to bound
