"""The single-precision reduced-mode draw of wsutils.estimators.rf (``precision="float32"``)
and the float64 products over a single-precision block (``_blocks64``, ``_mm64``,
``_grams``)."""

import math

import numpy as np
import pytest
import torch
from rounding import dot_tolerance

import wsutils as ws
from wsutils.estimators.rf import (
    _grams,
    _mm64,
    rf_certified_lower,
    rf_certified_upper,
    rf_relative_change,
    rf_row_law,
    rf_word_sensitivity,
)
from wsutils.experiments.random_features import rf_point

n, d = 6, 4
K = 4 * n * d


def test_float32_draw_is_single_precision_and_seeded():
    X = ws.sample_X(n, d, seed=0)
    u, Vi = rf_row_law(X, K, 1, seed=5, precision="float32")
    assert Vi.dtype == torch.float32 and u.dtype == torch.float64
    u2, Vi2 = rf_row_law(X, K, 1, seed=5, precision="float32")
    assert torch.equal(u, u2) and torch.equal(Vi, Vi2)
    _, Vi3 = rf_row_law(X.float(), K, 1, seed=5, precision="float32")
    assert torch.equal(Vi, Vi3)  # the seed alone, not X's dtype
    _, V64 = rf_row_law(X, K, 1, seed=5)
    assert not torch.equal(Vi.double(), V64)  # another draw than float64's


def test_float32_draw_is_certified_in_float64():
    X = ws.sample_X(n, d, seed=1)
    r = rf_word_sensitivity(X, K, rows=2, seed=7, steps=6, precision="float32")
    u, Vi = rf_row_law(X, K, 2, seed=7, precision="float32")
    # the value is the float64 relative change at the returned Δ for the drawn weights
    np.testing.assert_allclose(
        r.value, float(rf_relative_change(u, Vi.double(), torch.as_tensor(r.Delta))), rtol=1e-12
    )
    np.testing.assert_allclose(r.upper, rf_certified_upper(u, Vi.double()), rtol=1e-12)
    np.testing.assert_allclose(r.lower, rf_certified_lower(u, Vi.double())[0], rtol=1e-12)
    # the float32 ascent ranks its iterates in float32: 1e-6 covers that rounding
    assert r.lower <= r.value * (1 + 1e-6) and r.value <= r.upper
    assert np.linalg.norm(r.Delta) <= math.sqrt(d)


def test_rf_point_passes_the_precision():
    a = rf_point(family="isotropic", n=n, d=d, seed=3, precision="float32")
    b = rf_point(family="isotropic", n=n, d=d, seed=3)
    assert a["S"] != b["S"] and a["lower"] <= a["S"] * (1 + 1e-6) <= a["upper"] * (1 + 1e-6)


def test_bad_precision():
    X = ws.sample_X(n, d, seed=0)
    with pytest.raises(ValueError, match="precision"):
        rf_row_law(X, K, 0, seed=0, precision="half")
    with pytest.raises(ValueError, match="precision"):
        rf_word_sensitivity(X, K, precision=torch.float16)


@pytest.mark.parametrize("rows", [1, 8191, 8192, 20001])
def test_products_over_a_float32_block_are_float64(rows):
    """``_mm64`` and ``_grams`` convert a float32 block into one reused float64 buffer; every
    block, the last partial one included, gives the float64 product of the exact values."""
    g = torch.Generator().manual_seed(rows)
    A = torch.randn(rows, 5, generator=g)
    M = torch.randn(5, 3, generator=g, dtype=torch.float64)
    A64 = A.double()
    # two float64 computations of length-5 dot products of exact values (tests/rounding.py)
    bound = dot_tolerance(
        5, torch.linalg.vector_norm(A64, dim=1)[:, None], torch.linalg.vector_norm(M, dim=0)
    )
    assert bool(((_mm64(A, M) - A64 @ M).abs() <= bound).all())
    active = torch.rand(rows, generator=g) > 0.5
    G, GJ = _grams(A, active)
    np.testing.assert_allclose(G, A64.T @ A64, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(GJ, A64[active].T @ A64[active], rtol=1e-12, atol=1e-12)
