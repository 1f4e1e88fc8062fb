"""Every Δ that wsutils returns lies in the ball ‖Δ‖ ≤ √d exactly: for exact rational arithmetic
over its float entries (``fractions.Fraction``), for numpy's norm and for torch's norm, in
float64 and float32 (:func:`wsutils.sensitivity.project_ball`, :func:`ball_slack`)."""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wsutils as ws
from wsutils.estimators import self_attention as at
from wsutils.estimators import takeover as tk
from wsutils.estimators.drf import drf_row_sensitivity
from wsutils.estimators.rf import rf_certified_lower, rf_row_law
from wsutils.generalization import search_flip
from wsutils.sensitivity import ball_slack, cosine_ascent, project_ball

SETTINGS = dict(
    max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
DTYPES = {"float64": torch.float64, "float32": torch.float32}


def assert_in_ball(Delta, d):
    """‖Δ‖ ≤ √d for Fraction arithmetic, numpy's norm and torch's norm, row by row."""
    a = Delta.detach().cpu().numpy() if isinstance(Delta, torch.Tensor) else np.asarray(Delta)
    a = a.reshape(-1, d)
    for row in a:
        exact = sum(Fraction(float(x)) ** 2 for x in row)
        assert exact <= d, f"exact ‖Δ‖² exceeds d = {d} by {float(exact - d):.3g}"
        assert np.linalg.norm(row) <= math.sqrt(d)
        assert float(torch.linalg.vector_norm(torch.from_numpy(row.copy()))) <= math.sqrt(d)


def _sphere(n, d, dtype, seed, scale=1.0):
    """Rows rescaled to norm √d the naive way (the case that used to leave the ball)."""
    g = torch.Generator().manual_seed(seed)
    Z = torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype)
    return Z * (scale * math.sqrt(d) / torch.linalg.vector_norm(Z, dim=-1, keepdim=True))


@settings(**SETTINGS)
@given(
    d=st.integers(1, 400),
    rows=st.integers(1, 8),
    dtype=st.sampled_from(list(DTYPES)),
    scale=st.sampled_from([1e-3, 0.5, 1.0, 1 + 1e-9, 1.0001, 3.0, 1e6]),
    seed=st.integers(0, 2**31),
)
def test_project_ball_is_exact(d, rows, dtype, scale, seed):
    Delta = _sphere(rows, d, DTYPES[dtype], seed, scale)
    P = project_ball(Delta, math.sqrt(d))
    assert P.dtype == Delta.dtype
    assert_in_ball(P, d)
    # rows well inside are untouched; a row on the boundary moves by at most the slack
    slack = ball_slack(d, Delta.dtype)
    inside = torch.linalg.vector_norm(Delta.double(), dim=-1) <= math.sqrt(d) * (1 - 2 * slack)
    assert torch.equal(P[inside], Delta[inside])
    if scale >= 1:
        moved = (P.double() - Delta.double() / scale).norm(dim=-1) / math.sqrt(d)
        assert float(moved.max()) <= 2 * slack + 4 * torch.finfo(Delta.dtype).eps


def test_project_ball_refuses_what_it_cannot_certify():
    with pytest.raises(TypeError, match="float32 or float64"):
        project_ball(torch.ones(2, 3, dtype=torch.float16), math.sqrt(3))
    with pytest.raises(ValueError, match="non-finite"):
        project_ball(torch.tensor([[math.nan, 1.0]]), math.sqrt(2))


def test_project_ball_and_normalise_rows_do_not_overflow():
    """Issue 14 item 2: rows of norm ≥ 1e154 used to come back as zeros."""
    big = torch.full((2, 3), 1e200, dtype=torch.float64)
    P = project_ball(big, math.sqrt(3))
    assert_in_ball(P, 3)
    np.testing.assert_allclose(P.numpy(), np.ones((2, 3)), rtol=1e-13)
    np.testing.assert_allclose(ws.normalise_rows(big).numpy(), np.ones((2, 3)), rtol=1e-15)
    tiny = torch.full((1, 4), 1e-200, dtype=torch.float64)
    np.testing.assert_allclose(ws.normalise_rows(tiny).numpy(), np.ones((1, 4)), rtol=1e-15)


def _text(n, d, seed, dtype):
    return ws.sample_X(n, d, seed=seed).to(DTYPES[dtype])


shapes = dict(
    n=st.integers(1, 5),
    d=st.integers(1, 40),
    seed=st.integers(0, 10**6),
    dtype=st.sampled_from(list(DTYPES)),
)


@settings(**SETTINGS)
@given(**shapes)
def test_generic_and_attention_estimators_return_deltas_in_the_ball(n, d, seed, dtype):
    X = _text(n, d, seed, dtype)
    W = ws.sample_W(d, seed=seed + 1).to(X.dtype)
    res = [ws.word_sensitivity(lambda Z: ws.raf(Z, W), X, steps=3, starts=2, seed=seed)]
    for kind in ("raf", "relu"):
        try:
            res.append(
                at.attention_word_sensitivity(
                    X,
                    W,
                    normalisation=kind,
                    steps=3,
                    starts=2,
                    seed=seed,
                    takeovers=bool(seed % 2),
                )
            )
        except ValueError as e:  # ReLU attention with every score ≤ 0: φ(X) = 0, refused
            assert "‖φ(X)‖ = 0" in str(e)
    for r in res:
        assert_in_ball(r.Delta, d)
        for D in r.per_row_Delta.values():
            assert_in_ball(D, d)


@settings(**SETTINGS)
@given(**shapes)
def test_takeovers_return_deltas_in_the_ball(n, d, seed, dtype):
    X = _text(n, d, seed, dtype)
    W = ws.sample_W(d, seed=seed + 1).to(X.dtype)
    row = seed % n
    assert_in_ball(tk.row_takeover(X, W, row), d)
    assert_in_ball(tk.takeover_candidates(X, W, row), d)
    try:
        assert_in_ball(tk.key_takeover(X, W, row), d)
    except ValueError as e:  # Wᵀx̄ = 0 (e.g. d = 1 with a zero mean): refused with a reason
        assert "key take-over" in str(e)


@settings(**SETTINGS)
@given(
    n=st.integers(1, 4),
    d=st.integers(1, 24),
    seed=st.integers(0, 10**6),
    dtype=st.sampled_from(list(DTYPES)),
)
def test_drf_rf_and_flip_searches_return_deltas_in_the_ball(n, d, seed, dtype):
    X = _text(n, d, seed, dtype)
    try:
        _, D = drf_row_sensitivity(X, 2, 16, row=0, seed=seed, search=dict(starts=2, steps=3))
        assert_in_ball(D, d)
    except ValueError as e:
        assert "no unit" in str(e)
    try:
        r = ws.rf_word_sensitivity(X, 16, rows=0, seed=seed, starts=2, steps=3)
        assert_in_ball(r.Delta, d)
        u, Vi = rf_row_law(X.double(), 16, 0, seed=seed)
        assert_in_ball(rf_certified_lower(u, Vi)[1], d)
    except ValueError as e:
        assert "active" in str(e) or "undefined" in str(e)
    w = torch.randn(d, generator=torch.Generator().manual_seed(seed), dtype=DTYPES[dtype])
    f = search_flip(lambda D: D @ w, d, 5.0, dtype=DTYPES[dtype], starts=2, steps=3, seed=seed)
    assert_in_ball(f.Delta, d)
    best, Ds = cosine_ascent(
        lambda D: D @ w,
        project_ball(_sphere(3, d, w.dtype, seed), d**0.5),
        math.sqrt(d),
        steps=3,
        lr=0.5,
    )
    assert_in_ball(Ds, d)
