"""The sizes of the theory chapters (word-sensitivity, random-features, deep-random-features,
generalization, generalization-n) in ``wsutils.experiments``: at the paper scale they are the
grids of the authors' scripts, the quick scale is smaller, and ``scale()`` follows
``WSBOOK_SCALE``."""

import numpy as np
import pytest

from wsutils.experiments import deep_random_features as drf_exp
from wsutils.experiments import generalization as gen_exp
from wsutils.experiments import random_features as rf_exp
from wsutils.experiments import word_sensitivity as ws_exp

MODULES = (ws_exp, rf_exp, drf_exp, gen_exp)


def test_paper_grids_are_the_authors():
    rf = rf_exp.scale("paper")
    assert rf.ds == (192, 384, 768) and rf.ns == (90, 100, 110, 120, 130, 140, 150)
    drf = drf_exp.scale("paper")
    assert drf.paper_n == (50, 60, 70, 80) and drf_exp.DEPTHS == (2, 4, 8)
    gen = gen_exp.scale("paper")
    assert gen.d == 768 and gen.Ns == (1100, 1200, 1300)


def test_rf_long_range_lies_beyond_the_grid():
    for name in ("quick", "paper"):
        P = rf_exp.scale(name)
        assert max(P.long_ns) > max(P.ns)


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_scale_follows_the_knob(module, monkeypatch):
    for name in ("quick", "paper"):
        monkeypatch.setenv("WSBOOK_SCALE", name)
        assert module.scale() == module.SCALES[name] == module.scale(name)
    with pytest.raises(ValueError):
        module.scale("huge")


def test_fitted_slope_recovers_a_planted_slope():
    n = np.repeat([10.0, 20.0, 40.0, 80.0], 3)
    groups = np.tile([0, 1, 2], 4)
    noise = np.random.default_rng(0).normal(0, 1e-3, n.size)
    S = np.exp(-0.5 * np.log(n) + groups + noise)
    slope, half = rf_exp.fitted_slope(n, S, groups)
    assert abs(slope + 0.5) <= half < 0.05


def test_lower_order_bound_is_the_proposition():
    eps_g = np.sqrt(2 * np.log(2 / rf_exp.DELTA))
    n, k = 100, 100 * 64
    expected = 1 / (2 * np.sqrt(n) * (1 + eps_g * np.sqrt(2 / k)))
    np.testing.assert_allclose(rf_exp.lower_order_bound(n, k), expected, rtol=1e-15)
