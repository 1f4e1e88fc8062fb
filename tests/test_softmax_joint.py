"""prop-softmax-joint: the rows' score shifts share one ball (issue 60, part 1). The joint
certificate is never above the row-wise one, and never below a change that a Δ makes."""

import math

import numpy as np
import pytest
import torch
from ball_changes import changes

import wsutils as ws
import wsutils.estimators.softmax_upper as su
from wsutils.estimators.self_attention import attention_word_sensitivity
from wsutils.estimators.softmax_upper import softmax_certified_upper
from wsutils.maps import Normalisation, attention_scores

NORMS = [
    Normalisation("softmax"),
    Normalisation("softmax", beta=3.0),
    Normalisation("scalable"),
    Normalisation("softmax", sink=3.0),
]


def _rows_on_a_grid(grid: int):
    """The row terms of one text (n = 30, d = 6, strong weights) at every word, its grid's
    cells, and 4001 shifts over each row's range with h_ji² at each (rows, words, shifts)."""
    X, W = ws.sample_X(30, 6, seed=9).double(), 2 * ws.sample_W(6, seed=10).double()
    n, d = X.shape
    c = 1 / math.sqrt(d)
    z = c * attention_scores(X, W)
    A = torch.softmax(z, dim=1)
    w = c * torch.linalg.vector_norm(X @ W, dim=1)
    terms = su._RowTerms(X, W, z, A, A @ X, w, c, math.sqrt(d), None)
    cols, zc, ell, p, spread, w, r, u_own = terms(torch.arange(n))
    top, t2, keep = su._joint_grid(cols, zc, ell, p, spread, w, r, u_own, grid)
    t = w[:, None] * torch.linspace(-1, 1, 4001, dtype=torch.float64)[None, :]
    h2 = su._row_term(zc, ell, p, spread, w, r, t[:, None, :]) ** 2
    return top, t2, keep, w, t[:, None, :], h2


@pytest.mark.parametrize("grid", [1, 2, 32])
@pytest.mark.parametrize("omega", [0.05, 1.0, 20.0])
def test_each_rows_grid_bound_is_above_its_sup(grid, omega):
    """The grid's bound on sup_t h_ji(t)² − ωt² (the largest h² at an interval's ends, the
    smallest t² on it) against the same function on a grid of 4001 shifts, for every row and
    word of a text: never below it (the unclipped joint value, before the row-wise minimum)."""
    top, t2, keep, _, t, h2 = _rows_on_a_grid(grid)
    bound = (top - omega * t2).max(dim=2).values
    fine = h2 - omega * t**2
    assert (bound[keep] >= fine.max(dim=2).values[keep] * (1 - 1e-12)).all()


@pytest.mark.parametrize("grid", [1, 2, 32])
def test_each_rows_bound_with_linear_multipliers_is_above_its_sup(grid):
    """The cells' bound on sup_t h_ji(t)² − η_j t − ω_j t² (refine's rows term: the largest h²
    on a cell plus the concave part at its clipped vertex) against the same function on a grid
    of 4001 shifts, for every row and word, random ω_j > 0 and η_j of both signs."""
    top, _, keep, w, t, h2 = _rows_on_a_grid(grid)
    n = len(w)
    g = torch.Generator().manual_seed(grid)
    scale = float(top.max()) / float(w.max())
    om = torch.rand(n, n, generator=g, dtype=torch.float64) * scale / float(w.max()) + 1e-3
    eta = torch.randn(n, n, generator=g, dtype=torch.float64) * scale  # (words, rows)
    bound = su._cells_sup(top, su._cell_ends(w, grid), om, eta)  # (rows, words)
    fine = h2 - eta.T[:, :, None] * t - om.T[:, :, None] * t**2
    want = fine.max(dim=2).values
    assert (bound[keep] >= want[keep] - 1e-12 * fine.abs().amax(dim=2)[keep]).all()


@pytest.mark.parametrize("norm", NORMS, ids=str)
def test_joint_acts_on_a_long_text(norm):
    """Where the shifts' ball binds (n ≫ d), the joint bound is below the row-wise one at
    some word, and finite at every word."""
    X, W = ws.sample_X(120, 16, seed=120), ws.sample_W(16, seed=16)
    joint = softmax_certified_upper(X, W, normalisation=norm)
    rows = softmax_certified_upper(X, W, normalisation=norm, joint=False)
    words = slice(1, None) if norm.sink is not None else slice(None)
    assert np.isfinite(joint[words]).all() and (joint[words] < rows[words]).any()


@pytest.mark.parametrize("norm", NORMS, ids=str)
def test_joint_lies_above_every_change_tried(norm):
    """Random Δ in the ball (on its sphere and inside), at every word of two texts, and a long
    search with the take-overs."""
    g = torch.Generator().manual_seed(0)
    for n, d in [(30, 4), (60, 8)]:
        X, W = ws.sample_X(n, d, seed=3).double(), ws.sample_W(d, seed=4).double() * 2
        _above_every_change(X, W, norm, softmax_certified_upper(X, W, normalisation=norm), g)


def _above_every_change(X, W, norm, U, g):
    """``U`` (one bound per word) against 300 random Δ in the ball at every word (150 on its
    sphere, 150 inside) and a long search with the take-overs."""
    n, d = X.shape
    for i in range(1 if norm.sink is not None else 0, n):
        D = torch.randn(300, d, generator=g, dtype=torch.float64)
        D *= math.sqrt(d) / D.norm(dim=1, keepdim=True)
        D[150:] *= torch.rand(150, 1, generator=g, dtype=torch.float64)
        assert float(changes(X, W, norm, i, D).max()) <= U[i]
    found = attention_word_sensitivity(
        X, W, normalisation=norm, takeovers=True, starts=6, steps=150, upper=False
    )
    assert all(v <= U[i] for i, v in found.per_row.items())


@pytest.mark.parametrize("grid", [2, 32])
def test_joint_on_a_fine_grid_of_a_tiny_text(grid):
    """d = 2: every Δ of a fine polar grid of the ball stays below the joint bound, with the
    chapter's grid of shifts and with coarse ones (where a wrong interval bound shows)."""
    X, W = ws.sample_X(12, 2, seed=5).double(), 3 * ws.sample_W(2, seed=6).double()
    norm = Normalisation("softmax")
    U = softmax_certified_upper(X, W, grid=grid)
    assert (U < softmax_certified_upper(X, W, joint=False)).any()  # the joint bound acts here
    t = torch.linspace(0, 2 * math.pi, 721, dtype=torch.float64)[:-1]
    rad = math.sqrt(2) * torch.linspace(0, 1, 41, dtype=torch.float64)
    D = (rad[:, None, None] * torch.stack([t.cos(), t.sin()], -1)[None]).reshape(-1, 2)
    for i in range(12):
        assert float(changes(X, W, norm, i, D).max()) <= U[i]


def test_joint_is_the_same_for_any_rows_asked():
    X, W = ws.sample_X(50, 8, seed=7), ws.sample_W(8, seed=8)
    full = softmax_certified_upper(X, W)
    some = softmax_certified_upper(X, W, rows=[3, 17, 40])
    np.testing.assert_allclose(some, full[[3, 17, 40]], rtol=1e-12)


@pytest.mark.parametrize("norm", NORMS, ids=str)
@pytest.mark.parametrize("n,d", [(30, 4), (10, 16)])  # BᵀΩB (n > d) and the Gram (n ≤ d)
def test_per_row_multipliers_lie_above_every_change_tried(norm, n, d):
    """prop-softmax-joint with one multiplier per row (refine): never above the one
    multiplier's bound, and never below a change that random Δ or a long search make."""
    g = torch.Generator().manual_seed(1)
    X, W = ws.sample_X(n, d, seed=11).double(), ws.sample_W(d, seed=12).double() * 2
    one = softmax_certified_upper(X, W, normalisation=norm)
    U = softmax_certified_upper(X, W, normalisation=norm, refine=40)
    words = range(1 if norm.sink is not None else 0, n)
    assert (U[list(words)] <= one[list(words)]).all()
    _above_every_change(X, W, norm, U, g)


def test_per_row_multipliers_tighten_and_more_steps_are_never_worse():
    """On a text where the shifts' ball binds, the per-row multipliers lower the bound at
    some word, and a longer search (the same iterates, then more) is never looser."""
    X, W = ws.sample_X(80, 24, seed=13), ws.sample_W(24, seed=14)
    one = softmax_certified_upper(X, W)
    short = softmax_certified_upper(X, W, refine=5)
    long = softmax_certified_upper(X, W, refine=30)
    assert (long <= short).all() and (short <= one).all() and (long < one).any()


@pytest.mark.parametrize(
    "norm,n,grid",
    [
        (norm, n, grid)
        for norm in NORMS
        for n, grid in [(2, 32), (3, 2), (12, 2), (30, 32)]  # C = US square (n ≤ d) and tall
        if n > 2 or norm.sink is None  # a sink takes a row: two words besides it at least
    ],
    ids=str,
)
def test_per_row_multipliers_on_a_fine_grid_of_a_tiny_text(norm, n, grid):
    """d = 2: every Δ of a fine polar grid of the ball stays below the refined bound, for
    every normalisation (a sink's row 0 among the rows), strong weights, and texts shorter
    and longer than d (where the shifts' matrix C = US is square or tall)."""
    X, W = ws.sample_X(n, 2, seed=5 + n).double(), 3.4 * ws.sample_W(2, seed=6).double()
    U = softmax_certified_upper(X, W, normalisation=norm, refine=30, grid=grid)
    t = torch.linspace(0, 2 * math.pi, 361, dtype=torch.float64)[:-1]
    rad = math.sqrt(2) * torch.linspace(0, 1, 21, dtype=torch.float64)
    D = (rad[:, None, None] * torch.stack([t.cos(), t.sin()], -1)[None]).reshape(-1, 2)
    for i in range(1 if norm.sink is not None else 0, n):
        assert float(changes(X, W, norm, i, D).max()) <= U[i]


@pytest.mark.parametrize("norm", NORMS[:3], ids=str)
@pytest.mark.parametrize("n", [3, 12, 30])
def test_refined_bound_is_above_the_rows_own_maximum(norm, n):
    """Sharper than any change of the map: the refined bound against what the proposition
    relaxes, u_i² + Σ_{j≠i} h_ji(t_j)² at the shifts t = c·XWv of every v of a fine polar
    grid of the unit disc (d = 2, strong weights). A multiplier left on row i, or any
    relaxation that drops below the rows' own maximum, fails here."""
    X, W = ws.sample_X(n, 2, seed=20 + n).double(), 3.4 * ws.sample_W(2, seed=21).double()
    U = softmax_certified_upper(X, W, normalisation=norm, refine=40, grid=8)
    c, r = norm.scale(n), math.sqrt(2)
    z = c * attention_scores(X, W)
    A = torch.softmax(z, dim=1)
    XW = X @ W
    w = c * torch.linalg.vector_norm(XW, dim=1)
    terms = su._RowTerms(X, W, z, A, A @ X, w, c, r, None)
    cols, zc, ell, p, spread, w, r, u_own = terms(torch.arange(n))
    a = torch.linspace(0, 2 * math.pi, 721, dtype=torch.float64)[:-1]
    rad = torch.linspace(0, 1, 41, dtype=torch.float64)
    V = (rad[:, None, None] * torch.stack([a.cos(), a.sin()], -1)[None]).reshape(-1, 2)
    T = c * XW @ V.T  # (rows, points): the shifts of each v
    base = float((A @ X).norm())  # U = the numerator (1 + 2γ) over it
    for i in range(n):
        h2 = su._row_term(zc[:, i], ell[:, i], p[:, i], spread[:, i], w, r, T) ** 2
        h2[i] = u_own[i] ** 2
        assert float(h2.sum(dim=0).max().sqrt()) <= U[i] * base


@pytest.mark.parametrize("kw", [dict(refine=-1), dict(refine=2.5), dict(refine=3, joint=False)])
def test_per_row_multipliers_refuse_bad_settings(kw):
    X, W = ws.sample_X(8, 4, seed=1), ws.sample_W(4, seed=2)
    with pytest.raises((ValueError, TypeError), match="refine"):
        softmax_certified_upper(X, W, **kw)


@pytest.mark.parametrize("n", [1, 2, 7])  # fewer shifts than dimensions, and more
def test_the_multipliers_term_is_the_sup_over_the_ball(n):
    """The per-row multipliers' term, sup over ‖δ‖ ≤ 1 of ηᵀBδ + δᵀBᵀdiag(ω)Bδ (through
    C = US): above it at every δ of a fine polar grid of the ball (d = 2), within 1e-3 of
    the grid's largest value, and its maximiser's shifts reach it; with η = 0 it is
    ‖diag(√ω)B‖₂² (torch's spectral norm), up to the bisection's margin above it."""
    g = torch.Generator().manual_seed(n)
    B = torch.randn(n, 2, generator=g, dtype=torch.float64)
    U, sv, _ = torch.linalg.svd(B, full_matrices=False)
    om = torch.rand(4, n, generator=g, dtype=torch.float64) * 2
    om[0] = 0
    eta = torch.randn(4, n, generator=g, dtype=torch.float64)
    eta[1] = 0
    value, t_star = su._shift_ball_sup(U * sv, om, eta)
    a = torch.linspace(0, 2 * math.pi, 3601, dtype=torch.float64)[:-1]
    rad = torch.linspace(0, 1, 201, dtype=torch.float64)
    D = (rad[:, None, None] * torch.stack([a.cos(), a.sin()], -1)[None]).reshape(-1, 2)
    T = D @ B.T  # (points, n): the shifts
    grid = (T @ eta.T + (T**2) @ om.T).max(dim=0).values
    assert (value >= grid).all() and (value <= grid + 1e-3 * (1 + grid.abs())).all()
    at_star = (eta * t_star + om * t_star**2).sum(dim=1)
    # y* lies in the ball (up to rounding), so its value is below the bound; the bisection's
    # margin above λ_max, 1e-9·(1 + λ_max), and the rounding allowances keep the gap small
    assert (at_star <= value * (1 + 1e-12)).all()
    assert (value - at_star <= 1e-6 * (1 + value.abs())).all()
    want = torch.linalg.matrix_norm(om[1].sqrt()[:, None] * B, ord=2) ** 2
    gap = float(value[1] - want)  # ball_quadratic_sup takes μ ≥ λ_max + 1e-9·(1 + λ_max)
    assert 0 <= gap <= 2e-9 * (1 + float(want))
