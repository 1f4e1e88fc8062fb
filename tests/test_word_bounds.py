"""The proved lower bounds on random features' outputs at one-word substitutions
(``G.rf_word_bounds``, prop-word-bound of the word-flips chapter)."""

import math

import pytest
import torch

import wsutils as ws
from wsutils import generalization as G


def _instance(seed=0, n=5, d=4, k=300, m=3):
    X = ws.sample_X(n, d, seed=seed)
    V = G.sample_V_blocked(k, n, d, seed=seed + 1, dtype=torch.float64).double()
    g = torch.Generator().manual_seed(seed + 2)
    thetas = torch.randn(m, k, generator=g, dtype=torch.float64) / math.sqrt(k)
    rows = torch.cat(
        [
            X[1][None],
            torch.randn(200, d, generator=g, dtype=torch.float64) * 0.6,
            torch.randn(20, d, generator=g, dtype=torch.float64) * 3,
        ]
    )
    return X, V, thetas, rows


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("y", [1.0, -1.0])
def test_bounds_lie_below_the_exact_outputs(seed, y):
    """``L ≤ y·t`` for every candidate, near and far, whatever ``tau``; at the text's own
    row the bound is its output; with every unit scored exactly (``tau ≥ max|h|`` and
    read-outs with ``y·θ_l < 0`` everywhere) the bound is the output, and units that can
    only raise the outputs are left out of it."""
    X, V, thetas, rows = _instance(seed)
    row, d = 1, X.shape[1]
    h = V @ X.reshape(-1)
    Vi = V[:, row * d : (row + 1) * d]
    exact = y * G.word_scores(G.rf_flip_model(h, Vi), X[row], rows, thetas)
    for tau in (0.0, 0.05, 0.3, 1.0):
        L = G.rf_word_bounds(h, Vi, X[row], rows, thetas, y, tau=tau, batch=37)
        assert L.shape == exact.shape
        assert (L <= exact + 1e-12).all()
        torch.testing.assert_close(L[0], exact[0], rtol=0, atol=1e-12)
    # every unit can lower every output (y·θ_l < 0): with tau ≥ max|h| all are exact
    lowering = -y * thetas.abs()
    low = y * G.word_scores(G.rf_flip_model(h, Vi), X[row], rows, lowering)
    everything = float(h.abs().max())
    L = G.rf_word_bounds(
        h, Vi, X[row], rows, lowering, y, tau=everything, near_dtype=torch.float64
    )
    torch.testing.assert_close(L, low, rtol=1e-10, atol=1e-10)
    # in single precision (the default) the bound is lowered by its rounding allowance
    # γ_{d+2}‖Δ‖ Σ|θ_l|‖V_l‖ and stays within twice that of the output
    L32 = G.rf_word_bounds(h, Vi, X[row], rows, lowering, y, tau=everything)
    u = (d + 2) * 2.0**-24
    allowance = (
        u
        / (1 - u)
        * torch.linalg.vector_norm(rows - X[row], dim=1, keepdim=True)
        * (lowering.abs() @ torch.linalg.vector_norm(Vi, dim=1))
    )
    assert (L32 <= low + 1e-12).all() and (low - L32 <= 2 * allowance + 1e-12).all()
    assert (low - L32 > 0.5 * allowance).any()  # the allowance is subtracted
    # a unit that only raises the outputs (y·θ_l ≥ 0 for every model) is left out: the
    # bound of read-outs that never lower is the output at x plus the linear term
    raising = y * thetas.abs()
    L = G.rf_word_bounds(h, Vi, X[row], rows, raising, y, tau=everything)
    on = (h > 0).double()
    first = y * (torch.relu(h) @ raising.T + (rows - X[row]) @ ((raising * on) @ Vi).T)
    torch.testing.assert_close(L, first, rtol=1e-10, atol=1e-10)
    # the bound rules out something at this scale: it is not vacuous
    assert (G.rf_word_bounds(h, Vi, X[row], rows, thetas, y, tau=0.3) > exact.min()).any()


def test_bounds_refuse_bad_input():
    X, V, thetas, rows = _instance()
    h, Vi = V @ X.reshape(-1), V[:, 4:8]
    good = dict(h=h, Vi=Vi, x=X[1], rows=rows, thetas=thetas, y=1.0)
    for bad, msg in [
        (dict(h=h[:-1]), "one pre-activation"),
        (dict(x=X), "one row"),
        (dict(rows=rows[:, :3]), "candidates"),
        (dict(rows=rows[:0]), "rows the candidates"),
        (dict(thetas=thetas[:, :-1]), "read-outs"),
        (dict(y=0.5), "label"),
        (dict(rows=torch.full_like(rows, math.nan)), "rows"),
        (dict(h=torch.full_like(h, math.inf)), "h"),
    ]:
        with pytest.raises(ValueError, match=msg):
            G.rf_word_bounds(**{**good, **bad})
    with pytest.raises(ValueError, match="tau"):
        G.rf_word_bounds(**good, tau=-0.1)
    with pytest.raises(ValueError, match="batch"):
        G.rf_word_bounds(**good, batch=0)
    for dtype in (torch.int32, torch.float16):
        with pytest.raises(ValueError, match="near_dtype"):
            G.rf_word_bounds(**good, near_dtype=dtype)
