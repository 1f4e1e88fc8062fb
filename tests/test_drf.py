"""The wide-limit formula of deep random features (wsutils.estimators.drf)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import wsutils as ws
from wsutils.estimators.drf import (
    arccos_map,
    drf_limit_change,
    drf_limit_sensitivity,
    drf_row_law,
    drf_row_sensitivity,
)


def test_arccos_map_fixed_points_and_values():
    assert arccos_map(1.0, 3) == pytest.approx(1.0)
    assert arccos_map(0.0, 1) == pytest.approx(1 / math.pi)
    assert arccos_map(-1.0, 1) == pytest.approx(0.0, abs=1e-15)
    assert arccos_map(0.3, 0) == pytest.approx(0.3)


@settings(max_examples=50, deadline=None)
@given(c=st.floats(-1, 1), L=st.integers(1, 10))
def test_arccos_map_never_decreases_the_cosine(c, L):
    assert arccos_map(c, L) >= arccos_map(c, L - 1) - 1e-15


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 10**5), L=st.integers(0, 8), r=st.floats(0, 1), c=st.floats(-1, 1))
def test_limit_change_below_identity(n, L, r, c):
    assert drf_limit_change(n, L, r, c) <= r / math.sqrt(n) * (1 + 1e-9) + 1e-300


def test_limit_change_matches_the_plain_formula_at_moderate_n():
    n, L, r, c = 7, 3, 0.8, -0.4
    rho = math.sqrt(1 + (2 * r * c + r * r) / n)
    cos0 = (1 + r * c / n) / rho
    plain = math.sqrt(rho**2 + 1 - 2 * rho * float(arccos_map(cos0, L)))
    np.testing.assert_allclose(drf_limit_change(n, L, r, c), plain, rtol=1e-9)


@pytest.mark.parametrize("L", [1, 2])
def test_wide_network_matches_the_limit_at_a_fixed_Delta(L):
    """Relative change of a wide He-scaled network at Δ = x_1 vs the limit formula.

    Width 4096 (first layer through the row law): the fluctuation of a ratio of averages over
    k units is of relative order 1/√k ≈ 0.016 per layer (measured: 2–4 % per draw at L ≤ 2);
    the mean of 5 draws must be within 5 %, several standard errors."""
    n, d, k = 10, 6, 4096
    X = ws.sample_X(n, d, seed=0)
    vals = []
    for s in range(5):
        b, A, Vs = drf_row_law(X, L, k, 0, seed=s)
        h0, h1 = torch.relu(b), torch.relu(b + A @ X[0])
        for V in Vs:
            h0, h1 = torch.relu(V @ h0), torch.relu(V @ h1)
        vals.append(float(torch.linalg.vector_norm(h1 - h0) / torch.linalg.vector_norm(h0)))
    np.testing.assert_allclose(np.mean(vals), drf_limit_change(n, L, 1.0, 1.0), rtol=0.05)


def test_limit_maximiser_is_the_doubled_word():
    for n in (5, 50, 500):
        for L in (1, 4):
            S, r, c = drf_limit_sensitivity(n, L)
            np.testing.assert_allclose(S, drf_limit_change(n, L, 1.0, 1.0), rtol=1e-9)


def test_row_sensitivity_is_seeded_and_in_the_ball():
    X = ws.sample_X(8, 4, seed=1)
    a = drf_row_sensitivity(X, 2, 64, seed=3, search=dict(steps=10))
    b = drf_row_sensitivity(X, 2, 64, seed=3, search=dict(steps=10))
    assert a[0] == b[0] and np.array_equal(a[1], b[1])
    assert np.linalg.norm(a[1]) <= 2 * (1 + 1e-12)


def test_bad_input():
    with pytest.raises(ValueError, match="L"):
        arccos_map(0.5, -1)
    with pytest.raises(ValueError, match="n"):
        drf_limit_sensitivity(0, 2)
    with pytest.raises(ValueError, match="width"):
        drf_row_law(ws.sample_X(3, 2, seed=0), 2, 0, 0, seed=0)


def _recompute(b, A, Vs, Delta):
    """The relative change of the DRF at Δ, in float64, written out with matrix–vector
    products (not the estimator's batched code)."""
    h0, h1 = torch.relu(b), torch.relu(b + A @ torch.as_tensor(Delta))
    for V in Vs:
        h0, h1 = torch.relu(V @ h0), torch.relu(V @ h1)
    return float(torch.linalg.vector_norm(h1 - h0) / torch.linalg.vector_norm(h0))


def test_float32_weights_are_single_precision_numbers_from_the_seed():
    X = ws.sample_X(6, 4, seed=0)
    b, A, Vs = drf_row_law(X, 3, 32, 0, seed=5, precision="float32")
    for M in (A, *Vs):
        assert M.dtype == torch.float64 and torch.equal(M, M.float().double())
    again = drf_row_law(X, 3, 32, 0, seed=5, precision="float32")
    assert all(torch.equal(p, q) for p, q in zip((b, A, *Vs), (again[0], again[1], *again[2])))
    b64, A64, _ = drf_row_law(X, 3, 32, 0, seed=5)  # the float64 draw: another one
    assert not torch.equal(A, A64)


@pytest.mark.parametrize("L", [1, 3])
def test_float32_search_is_certified_in_float64(L):
    n, d, k = 8, 4, 48
    X = ws.sample_X(n, d, seed=1)
    v, D = drf_row_sensitivity(
        X, L, k, seed=3, init=X[0], precision="float32", search=dict(starts=2, steps=6)
    )
    assert np.linalg.norm(D) <= math.sqrt(d)
    b, A, Vs = drf_row_law(X, L, k, 0, seed=3, precision="float32")
    np.testing.assert_allclose(v, _recompute(b, A, Vs, D), rtol=1e-12)
    # the search keeps its best iterate, the start Δ = x_1 included: the float64 value at the
    # returned Δ is below the float64 value there only through the float32 ranking of the
    # iterates (a relative 1e-4 covers float32 rounding of a 3-layer forward pass of width 48)
    assert v >= _recompute(b, A, Vs, X[0]) * (1 - 1e-4)
    assert (
        drf_row_sensitivity(
            X, L, k, seed=3, init=X[0], precision="float32", search=dict(starts=2, steps=6)
        )[0]
        == v
    )


def test_bad_precision():
    X = ws.sample_X(3, 2, seed=0)
    with pytest.raises(ValueError, match="precision"):
        drf_row_sensitivity(X, 2, 8, precision="float16")
    with pytest.raises(ValueError, match="precision"):
        drf_row_law(X, 2, 8, 0, seed=0, precision=64)


def test_search_settings_stop_and_refusals():
    """The DRF search takes a Search or a dict (``DRF_SEARCH`` for the fields left out): its
    steps land on the sphere, so ``stop=(m, rtol)`` with a tolerance every step meets gives
    the ``steps=m`` search, and a ``lr`` or ``dtype`` it would not use is refused."""
    X = ws.sample_X(6, 4, seed=2)
    for m in (1, 3):
        early = drf_row_sensitivity(X, 2, 32, seed=1, search=dict(steps=30, stop=(m, 1e9)))
        short = drf_row_sensitivity(X, 2, 32, seed=1, search=dict(steps=m))
        assert early[0] == short[0] and np.array_equal(early[1], short[1])
    for bad in (dict(lr=0.1), dict(dtype="float32"), dict(progress=True)):
        with pytest.raises(ValueError, match="deep random-feature search takes no"):
            drf_row_sensitivity(X, 2, 32, search=bad)
    with pytest.raises(TypeError, match="unknown search setting"):
        drf_row_sensitivity(X, 2, 32, search=dict(start=2))
