"""``G.rf_texts_law``: one draw of the texts' RF pre-activations and the block ``V_i`` from
their joint law (prop-rf-texts-law in the generalization chapter). Its moments are those of
the full draw (``H Hᵀ/k → flat(X) flat(X)ᵀ/D``, ``D·H V_i/k → X_i``), on each of the three
factors of ``K_{−i}`` (Cholesky, the columns themselves, the eigendecomposition of a singular
``K_{−i}``); ``V_i`` is the blocks-mode block; the same seed gives the same draw."""

import math

import pytest
import torch
from rounding import dot_tolerance

from wsutils import generalization as G
from wsutils.estimators.rf import rf_weight_block
from wsutils.generalization._features import _rest_factor
from wsutils.maps import flat


def _texts(B, n, d, duplicate=False):
    X = G.planted_data(B - 1, n, d, seed=1)[0]
    X = torch.cat([X, X[:1]]) if duplicate else torch.cat([X, X[-1:] * -1])
    if duplicate:  # equal to text 0 but for word 1: K_{−1} is singular
        X[-1, 1] = X[1, 1]
    return X


@pytest.mark.parametrize(
    "B, n, d, duplicate",
    [(6, 4, 3, False), (20, 3, 4, False), (6, 4, 3, True)],  # Cholesky, columns, eigh
)
def test_moments_are_those_of_the_full_draw(B, n, d, duplicate):
    X = _texts(B, n, d, duplicate)
    k, row, D = 100_000, 1, n * d
    H, Vi = G.rf_texts_law(X, k, seed=3, row=row, block_rows=4096)
    Xf = flat(X).double()
    K = Xf @ Xf.T / D
    # E[H Hᵀ/k] = K, each entry a mean of k products of two centred Gaussians
    sd = torch.sqrt((torch.outer(K.diagonal(), K.diagonal()) + K**2) / k)
    assert float(((H @ H.T / k - K) / sd).abs().max()) < 6
    # E[H_bj V_i[j, c]] = x_{b,i,c}/D: the pre-activations use this V_i
    cross = H @ Vi * D / k
    sd_cross = torch.sqrt((K.diagonal()[:, None] * D + Xf[:, row * d : (row + 1) * d] ** 2) / k)
    assert float(((cross - X[:, row].double()) / sd_cross).abs().max()) < 6


def test_rest_factor_reproduces_K():
    for B, n, d, dup in [(6, 4, 3, False), (20, 3, 4, False), (6, 4, 3, True)]:
        Xf = flat(_texts(B, n, d, dup)).double()
        keep = torch.ones(n * d, dtype=torch.bool)
        keep[d : 2 * d] = False
        want = Xf[:, keep] @ Xf[:, keep].T / (n * d)
        F = _rest_factor(Xf, 1, d)
        torch.testing.assert_close(F @ F.T, want, rtol=0, atol=1e-12)


def test_block_and_seed():
    X = _texts(5, 3, 4)
    H, Vi = G.rf_texts_law(X, 50, seed=7, row=2, block_rows=16)
    assert torch.equal(Vi, rf_weight_block(50, 3, 4, 2, seed=7, dtype=torch.float64))
    H2, _ = G.rf_texts_law(X, 50, seed=7, row=2, block_rows=16)
    assert torch.equal(H, H2)
    H3, _ = G.rf_texts_law(X, 50, seed=8, row=2, block_rows=16)
    assert not torch.equal(H, H3)
    # one text, one row: no other word, so H = X_i V_iᵀ exactly (no noise)
    one = X[:, :1]
    H1, V1 = G.rf_texts_law(one, 50, seed=7, row=0)
    x = one[:, 0].double()  # two computations of length-d dot products (tests/rounding.py)
    bound = dot_tolerance(
        x.shape[1],
        torch.linalg.vector_norm(x, dim=1)[:, None],
        torch.linalg.vector_norm(V1, dim=1)[None, :],
    )
    assert bool(((H1 - x @ V1.T).abs() <= bound).all())


def test_bad_input():
    X = _texts(5, 3, 4)
    with pytest.raises(ValueError, match="out of range"):
        G.rf_texts_law(X, 10, seed=0, row=3)
    with pytest.raises(ValueError, match="batch of texts"):
        G.rf_texts_law(X[0], 10, seed=0)
    bad = X.clone()
    bad[0, 0, 0] = math.nan
    with pytest.raises(ValueError, match="non-finite"):
        G.rf_texts_law(bad, 10, seed=0)
    with pytest.raises(ValueError, match="block_rows"):
        G.rf_texts_law(X, 10, seed=0, block_rows=0)
