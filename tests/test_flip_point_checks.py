"""The flip point's cheaper checks and copies (issue 25): ``checks.all_finite`` answers as the
entrywise test, the features of the training texts plus the new one are those of their
concatenation to the last bit, and ``flip_point`` (its own data, not re-checked) gives the
records of ``flip_runs`` on the same data (checked)."""

import math

import pytest
import torch
from rounding import dot_tolerance

from wsutils import generalization as G
from wsutils.checks import all_finite, check_finite
from wsutils.generalization import _features, _flip
from wsutils.maps import Normalisation
from wsutils.weights import sample_W


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_all_finite_is_the_entrywise_test(dtype):
    g = torch.Generator().manual_seed(0)
    for shape in [(1,), (7,), (3, 5), (2, 3, 4)]:
        for bad in [None, math.nan, math.inf, -math.inf]:
            t = torch.randn(shape, generator=g).to(dtype)
            if bad is not None:
                t.view(-1)[t.numel() // 2] = bad
            assert all_finite(t) == bool(torch.isfinite(t).all())
    top = torch.finfo(dtype).max
    # finite entries whose sum overflows (to inf, or to NaN via inf − inf): still finite
    assert all_finite(torch.full((9,), top, dtype=dtype))
    assert all_finite(torch.tensor([top] * 4 + [-top] * 4, dtype=dtype))
    t = torch.randn(6, 8, generator=g).to(dtype).T  # not contiguous
    t[2, 3] = math.nan
    assert not all_finite(t) and not all_finite(t[:, 3]) and all_finite(t[:, 2])


def test_all_finite_integers_and_check_finite_message():
    assert all_finite(torch.arange(5)) and all_finite(torch.tensor([True, False]))
    with pytest.raises(ValueError, match="has 2 non-finite entries"):
        check_finite("X", torch.tensor([1.0, math.nan, math.inf]))
    with pytest.raises(ValueError, match="is empty"):
        check_finite("X", torch.zeros(0))


@pytest.mark.parametrize("normalisation", ["raf", "relu", "sparsemax"])
@pytest.mark.parametrize("N", [5, 63, 64, 70, 127, 128])
def test_feature_rows_are_those_of_the_concatenation(normalisation, N):
    Xs, _, X, _ = G.planted_data(N, 6, 8, seed=1)
    W = sample_W(8, seed=2)
    want = G.attention_features(torch.cat([Xs, X[None]]), W, normalisation)
    got = _features._attention_rows(Xs, X, W, Normalisation.parse(normalisation), 64)
    assert torch.equal(got, want)
    assert torch.equal(G.attention_features(Xs, W, normalisation), want[:-1])


def test_rf_rows_are_those_of_the_concatenation():
    Xs, _, X, _ = G.planted_data(9, 3, 4, seed=1)
    allX = torch.cat([Xs, X[None]])
    H, Vi = G.rf_texts_law(allX, 12, seed=5, row=1, block_rows=5)
    Phi, phi, _ = _flip._features(
        "rf", Xs, X, seed=5, row=1, block_rows=5, progress=False, norm=None
    )
    assert torch.equal(Phi, torch.relu(H[:-1])) and torch.equal(phi, torch.relu(H[-1]))


@pytest.mark.parametrize("map", ["rf", "raf", "relu"])
def test_flip_point_is_flip_runs_on_its_data(map):
    Xs, Y, X, y = G.planted_data(30, 4, 16, seed=0)
    search = dict(starts=2, steps=20, dtype="float32")
    opts = dict(seed=3, search=search)
    a = G.flip_point(map=map, n=4, d=16, Ns=[20, 30], seed=0, search=search)
    b = G.flip_runs(map, Xs, Y, X, y, Ns=[20, 30], **opts)
    assert repr(a) == repr(b)  # S_bound is NaN for attention: repr compares it too


def test_flip_runs_still_checks_its_input():
    Xs, Y, X, y = G.planted_data(10, 3, 4, seed=0)
    bad = Xs.clone()
    bad[2, 1, 0] = math.nan
    with pytest.raises(ValueError, match="non-finite"):
        G.flip_runs("raf", bad, Y, X, y, Ns=[5], seed=0, search=dict(steps=2))
    with pytest.raises(ValueError, match="norm"):
        G.flip_runs("raf", 2 * Xs, Y, X, y, Ns=[5], seed=0, search=dict(steps=2))


def test_gram_by_blocks_is_the_gram_matrix():
    from wsutils.generalization._linalg import _gram, _gram_by_blocks

    g = torch.Generator().manual_seed(4)
    small = torch.randn(300, 500, generator=g, dtype=torch.float64)
    K = _gram(small)
    assert torch.equal(K, K.T)  # symmetric by construction: one triangle, mirrored
    # syrk and gemm: two computations of each length-p dot product (tests/rounding.py)
    norms = torch.linalg.vector_norm(small, dim=1)
    bound = dot_tolerance(small.shape[1], norms[:, None], norms[None, :])
    assert bool(((K - small @ small.T).abs() <= bound).all())
    big = torch.randn(700, 900, generator=g, dtype=torch.float64)
    K, ref = _gram(big), big @ big.T
    assert torch.equal(K, K.T)
    # the same dot products, summed in another order: equal to rounding (u·√p·max|K|)
    assert float((K - ref).abs().max()) <= 1e-13 * float(ref.abs().max())
    L = G.gram_cholesky(big)
    torch.testing.assert_close(L @ L.T, ref, rtol=0, atol=1e-12 * float(ref.abs().max()))
    Kb = _gram_by_blocks(big, 4)  # the way off the CPU, checked here on it
    assert torch.equal(Kb, Kb.T)
    assert float((Kb - ref).abs().max()) <= 1e-13 * float(ref.abs().max())
    big32 = big.float()  # syrk in single precision too
    K32, ref32 = _gram(big32), big32 @ big32.T
    assert K32.dtype == torch.float32 and torch.equal(K32, K32.T)
    assert float((K32 - ref32).abs().max()) <= 1e-5 * float(ref32.abs().max())
