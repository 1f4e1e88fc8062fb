"""The ``rows`` law of random features (``wsutils.estimators.rf.rf_rows_law``,
``prop-rf-rows-law`` in the IMDb chapter): ``V flat(X)`` drawn jointly with the searched column
blocks only, ``Σ_{i∈S} V_i x_i + σ_S z``."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

import wsutils as ws
from wsutils.estimators.rf import (
    rf_preactivation,
    rf_relative_change,
    rf_rows_law,
    rf_weight_block,
    rf_word_sensitivity,
)

KS_LEVEL = 1e-3


def test_every_row_is_the_blocks_mode_draw_to_the_last_bit():
    n, d, k = 5, 4, 30
    X = ws.sample_X(n, d, seed=1)
    assert torch.equal(rf_rows_law(X, k, list(range(n)), seed=3), rf_preactivation(X, k, seed=3))
    a = rf_word_sensitivity(X, k, rows=None, seed=3, steps=10, mode="rows")
    b = rf_word_sensitivity(X, k, rows=None, seed=3, steps=10, mode="blocks")
    assert a.mode == "rows" and a.value == b.value and a.per_row == b.per_row
    assert a.per_row_upper == b.per_row_upper and a.per_row_lower == b.per_row_lower


def test_the_searched_blocks_are_the_blocks_mode_blocks_and_the_rest_has_the_stated_scale():
    """Exact in construction: ``g − Σ_{i∈S} V_i x_i = σ_S z`` with the blocks of blocks mode
    and ``σ_S = ‖flat(X_{−S})‖/√D``; over 400 seeds (32 units each) ``z`` is standard normal
    (mean, variance within 5 standard errors) and uncorrelated with the blocks' part."""
    n, d, k, S = 7, 3, 32, [0, 4]
    X = ws.sample_X(n, d, seed=2).double()
    sigma = math.sqrt(float((X[[1, 2, 3, 5, 6]] ** 2).sum()) / (n * d))
    zs, parts = [], []
    for s in range(400):
        part = sum(rf_weight_block(k, n, d, i, seed=s) @ X[i] for i in S)
        zs.append((rf_rows_law(X, k, S, seed=s) - part) / sigma)
        parts.append(part)
    z, part = torch.cat(zs).numpy(), torch.cat(parts).numpy()
    m = len(z)
    assert abs(z.mean()) < 5 / math.sqrt(m)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / m)
    assert abs(np.corrcoef(z, part)[0, 1]) < 5 / math.sqrt(m)


def test_the_joint_law_matches_the_full_draw_over_seeds():
    """Two samples over independent seeds, blocks mode (all ``n`` blocks) against rows mode:
    joint statistics of ``(g, V_{i_1}, V_{i_2})`` — ``‖ReLU(g)‖²``, the correlation of ``g``
    with the searched blocks' part, and ``⟨ReLU(g), V_i u⟩`` for a fixed ``u`` — have the same
    law (two-sample Kolmogorov–Smirnov, level 1e-3)."""
    n, d, k, S = 6, 3, 24, [1, 5]
    X = ws.sample_X(n, d, seed=4).double()
    u = torch.ones(d, dtype=torch.float64) / math.sqrt(d)

    def stat(g, seed):
        V1, V5 = (rf_weight_block(k, n, d, i, seed=seed, dtype=torch.float64) for i in S)
        part = V1 @ X[1] + V5 @ X[5]
        r = torch.relu(g)
        return [
            float(r @ r),
            float(torch.corrcoef(torch.stack([g, part]))[0, 1]),
            float(r @ (V1 @ u)),
            float(r @ (V5 @ u)),
        ]

    full = np.array([stat(rf_preactivation(X, k, seed=s), s) for s in range(300)])
    rows = np.array([stat(rf_rows_law(X, k, S, seed=10_000 + s), 10_000 + s) for s in range(300)])
    for j in range(full.shape[1]):
        assert stats.ks_2samp(full[:, j], rows[:, j]).pvalue > KS_LEVEL, j


def test_the_estimate_has_the_law_of_the_blocks_mode_estimate():
    n, d, k = 6, 4, 24
    X = ws.sample_X(n, d, seed=5)
    a = [
        rf_word_sensitivity(X, k, rows=[0, 3], seed=s, steps=15, mode="blocks").value
        for s in range(80)
    ]
    b = [
        rf_word_sensitivity(X, k, rows=[0, 3], seed=1000 + s, steps=15, mode="rows").value
        for s in range(80)
    ]
    assert stats.ks_2samp(a, b).pvalue > KS_LEVEL


def test_rows_mode_value_and_bounds_are_those_of_the_drawn_g_and_blocks():
    n, d, k, S = 8, 4, 40, [0, 3, 7]
    X = ws.sample_X(n, d, seed=6)
    r = rf_word_sensitivity(X, k, rows=S, seed=11, steps=20, mode="rows")
    assert r.mode == "rows" and set(r.per_row) == set(S) and r.row in S
    assert r.lower <= r.value <= r.upper
    g = rf_rows_law(X, k, S, seed=11)
    Vi = rf_weight_block(k, n, d, r.row, seed=11, dtype=torch.float64)
    val = float(rf_relative_change(g, Vi, torch.as_tensor(r.Delta)))
    np.testing.assert_allclose(val, r.value, rtol=1e-12)
    assert float(np.linalg.norm(r.Delta)) <= math.sqrt(d)


@pytest.mark.parametrize("rows, match", [([], "empty"), ([0, 0], "repeated"), ([9], "range")])
def test_rf_rows_law_bad_rows(rows, match):
    X = ws.sample_X(4, 3, seed=0)
    with pytest.raises(ValueError, match=match):
        rf_rows_law(X, 10, rows, seed=0)


def test_unknown_mode_names_rows():
    X = ws.sample_X(4, 3, seed=0)
    with pytest.raises(ValueError, match="'rows'"):
        rf_word_sensitivity(X, 10, rows=[0, 1], mode="dense")
