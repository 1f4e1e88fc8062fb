"""The four maps of wsutils.maps against direct formulas, and their structural properties."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import wsutils as ws


def _softmax_rows(S):
    E = np.exp(S - S.max(axis=1, keepdims=True))
    return E / E.sum(axis=1, keepdims=True)


@pytest.fixture
def text():
    n, d = 7, 5
    return ws.sample_X(n, d, seed=0).numpy(), n, d


def test_rf_matches_direct_formula(text):
    X, n, d = text
    V = ws.sample_V(11, n, d, seed=1).numpy()
    expected = np.maximum(V @ X.reshape(-1), 0)  # row-major flat
    np.testing.assert_allclose(ws.rf(X, V), expected, rtol=1e-12)
    # column block i of V multiplies word i
    manual = sum(V[:, i * d : (i + 1) * d] @ X[i] for i in range(n))
    np.testing.assert_allclose(ws.rf(X, V), np.maximum(manual, 0), rtol=1e-12)


def test_drf_matches_direct_formula(text):
    X, n, d = text
    Vs = [V.numpy() for V in ws.sample_Vs(n, d, 3, widths=[13, 9, 4], seed=2)]
    h = X.reshape(-1)
    for V in Vs:
        h = np.maximum(V @ h, 0)
    np.testing.assert_allclose(ws.drf(X, Vs), h, rtol=1e-12)


def test_raf_matches_direct_formula(text):
    X, n, d = text
    W = ws.sample_W(d, seed=3).numpy()
    A = _softmax_rows(X @ W @ X.T / math.sqrt(d))
    np.testing.assert_allclose(ws.raf(X, W), A @ X, rtol=1e-12)


def test_relu_attention_matches_direct_formula(text):
    X, n, d = text
    W = ws.sample_W(d, seed=4).numpy()
    A = np.maximum(X @ W @ X.T / math.sqrt(d), 0)
    mass = A.sum(axis=1, keepdims=True)
    A = np.divide(A, mass, out=np.zeros_like(A), where=mass > 0)
    np.testing.assert_allclose(ws.relu_attention(X, W), A @ X, rtol=1e-12)


def test_relu_attention_all_zero_row_stays_zero():
    X = np.array([[1.0, 0.0], [0.0, 1.0]])
    W = -np.eye(2)  # every score x_i W x_j ≤ 0 ... row scores: -1 on diagonal, 0 off it
    out = ws.relu_attention(X, W)
    np.testing.assert_array_equal(out, np.zeros_like(X))


def test_softmax_rows_sum_to_one(text):
    X, n, d = text
    W = ws.sample_W(d, seed=5)
    Xt = torch.as_tensor(X)
    A = torch.softmax(ws.maps.attention_scores(Xt, W), dim=-1)
    torch.testing.assert_close(A.sum(-1), torch.ones(n, dtype=A.dtype))


@pytest.mark.parametrize("name", ["rf", "drf", "raf", "relu_attention"])
def test_numpy_and_torch_agree_and_kinds_are_kept(text, name):
    X, n, d = text
    weights = {
        "rf": ws.sample_V(6, n, d, seed=6),
        "drf": ws.sample_Vs(n, d, 2, widths=[8, 5], seed=7),
        "raf": ws.sample_W(d, seed=8),
        "relu_attention": ws.sample_W(d, seed=8),
    }[name]
    fn = getattr(ws, name)
    np_w = [w.numpy() for w in weights] if name == "drf" else weights.numpy()
    out_np = fn(X, np_w)
    Xt = torch.as_tensor(X).requires_grad_(True)
    out_t = fn(Xt, weights)
    assert isinstance(out_np, np.ndarray) and out_np.dtype == np.float64
    assert isinstance(out_t, torch.Tensor)
    np.testing.assert_allclose(out_np, out_t.detach().numpy(), rtol=1e-12)
    out_t.sum().backward()  # torch in: differentiable
    assert Xt.grad is not None and torch.isfinite(Xt.grad).all()


def test_dtype_argument_and_torch_dtype_kept(text):
    X, n, d = text
    W = ws.sample_W(d, seed=9)
    assert ws.raf(X, W, dtype=torch.float32).dtype == np.float32
    assert ws.raf(torch.as_tensor(X, dtype=torch.float32), W).dtype == torch.float32


@pytest.mark.parametrize("fn", [ws.raf, ws.relu_attention])
def test_attention_is_permutation_equivariant(text, fn):
    X, n, d = text
    W = ws.sample_W(d, seed=10).numpy()
    perm = np.random.default_rng(0).permutation(n)
    np.testing.assert_allclose(fn(X[perm], W), fn(X, W)[perm], rtol=1e-12, atol=1e-14)


def test_batched_input_equals_loop(text):
    X, n, d = text
    W = ws.sample_W(d, seed=11)
    V = ws.sample_V(4, n, d, seed=12)
    Xb = torch.stack([torch.as_tensor(X), torch.as_tensor(X[::-1].copy())])
    for fn, w in [(ws.raf, W), (ws.relu_attention, W), (ws.rf, V)]:
        batch = fn(Xb, w)
        torch.testing.assert_close(batch, torch.stack([fn(x, w) for x in Xb]))


def test_normalise_rows(text):
    X, n, d = text
    Y = ws.normalise_rows(3.0 * X + 1.0)
    np.testing.assert_allclose(np.linalg.norm(Y, axis=1), math.sqrt(d), rtol=1e-12)
    with pytest.raises(ValueError, match="all-zero row"):
        ws.normalise_rows(np.zeros((2, 3)))


def test_weight_scalings_and_seeds():
    n, d = 6, 40
    V = ws.sample_V(2000, n, d, seed=0)
    assert abs(float(V.var()) * n * d - 1) < 0.02
    W = ws.sample_W(d, seed=0)
    assert abs(float(W.var()) * d - 1) < 0.1
    Vs = ws.sample_Vs(n, d, 2, widths=[300, 200], seed=0)
    assert abs(float(Vs[1].var()) * 300 / 2 - 1) < 0.05
    torch.testing.assert_close(ws.sample_W(d, seed=3), ws.sample_W(d, seed=3))
    assert not torch.equal(ws.sample_W(d, seed=3), ws.sample_W(d, seed=4))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 6), d=st.integers(1, 6), k=st.integers(1, 8), seed=st.integers(0, 10**6))
def test_property_shapes_and_positive_homogeneity(n, d, k, seed):
    """Random shapes: output shapes, and RF/attention scalings (RF is 1-homogeneous in X)."""
    X = ws.sample_X(n, d, seed=seed)
    V = ws.sample_V(k, n, d, seed=seed + 1)
    W = ws.sample_W(d, seed=seed + 2)
    assert ws.rf(X, V).shape == (k,)
    assert ws.raf(X, W).shape == (n, d)
    assert ws.relu_attention(X, W).shape == (n, d)
    torch.testing.assert_close(ws.rf(2.5 * X, V), 2.5 * ws.rf(X, V))
    # a softmax row is a convex combination of rows of X: every output row has norm ≤ √d
    assert float(torch.linalg.vector_norm(ws.raf(X, W), dim=-1).max()) <= math.sqrt(d) * (
        1 + 1e-12
    )
