"""wsutils.estimators.relu (the ReLU-attention propositions, the far-n model) and
wsutils.estimators.authors (the authors' search and its O(n·d) replica)."""

import math

import numpy as np
import pytest
import torch
from rounding import gamma

import wsutils as ws
from wsutils.estimators import authors as au
from wsutils.estimators.authors import authors_estimator, authors_map, authors_replica
from wsutils.estimators.objectives import fast_objective
from wsutils.estimators.rates import far_slope_prediction, slope_standard_error
from wsutils.estimators.relu import (
    relu_orthogonal_takeover,
    relu_upper_bound,
    relu_zeta_estimate,
)
from wsutils.estimators.softmax_laws import (
    FRO2_BIAS,
    FRO2_SD,
    attention_fro2_draws,
    attention_fro2_law,
    lse_model,
)


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny matmuls: one thread avoids thread contention on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _text(n, d, seed):
    return ws.sample_X(n, d, seed=seed), ws.sample_W(d, seed=seed + 1)


def test_orthogonal_takeover_zeroes_the_other_scores():
    X, W = _text(6, 16, 3)
    t = relu_orthogonal_takeover(X, W, 2)
    assert t.dim_K == 16 - 5
    assert float(torch.linalg.vector_norm(t.Delta)) <= math.sqrt(16)
    assert t.self_score > 0 and t.max_cross < 1e-10 * t.self_score
    assert t.self_weight > 1 - 1e-12
    assert t.change >= t.row_bound * (1 - 1e-9)
    Xp = X.clone()
    Xp[2] += t.Delta
    out = ws.relu_attention(Xp, W)
    torch.testing.assert_close(out[2], Xp[2], rtol=1e-9, atol=1e-9)  # the row attends to itself


def test_orthogonal_takeover_refuses_when_no_room():
    X, W = _text(20, 8, 1)
    with pytest.raises(ValueError, match="n − 1"):
        relu_orthogonal_takeover(X, W, 0)


def test_upper_bound_holds_for_random_and_searched_perturbations():
    n, d = 80, 4
    X, W = _text(n, d, 5)
    zeta = relu_zeta_estimate(X, 0, starts=8, steps=400)
    b = relu_upper_bound(X, W, 0, zeta)
    g = torch.Generator().manual_seed(0)
    phi = lambda Z: ws.relu_attention(Z, W)  # noqa: E731
    for _ in range(20):
        D = torch.randn(d, generator=g, dtype=torch.float64)
        D = D / D.norm() * math.sqrt(d) * float(torch.rand(1, generator=g))
        assert ws.relative_change(phi, X, 0, D) <= b.value
    best = ws.attention_word_sensitivity(
        X, W, normalisation="relu", rows=[0], starts=8, steps=60, seed=0
    ).value
    assert 0 < best <= b.value


def test_upper_bound_refuses_bad_zeta():
    X, W = _text(30, 4, 2)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="zeta"):
            relu_upper_bound(X, W, 0, bad)


def test_far_model_and_slope_error():
    assert -0.40 < far_slope_prediction((500, 1000, 2000, 4000), 192) < -0.30
    ns = (100, 200, 400, 800)
    exact = np.array([[-0.5 * math.log(n)] * 3 for n in ns])
    assert slope_standard_error(ns, exact) < 1e-12
    with pytest.raises(ValueError):
        slope_standard_error(ns, exact[:2])
    mean, sd = lse_model(101, 3.5)
    assert mean == pytest.approx(math.log(100) + 1.75) and sd > 0


@pytest.mark.parametrize("kind", ["raf", "relu"])
def test_authors_replica_takes_their_steps(kind):
    """``authors_replica`` computes the iterates of ``authors_estimator`` with another
    objective: a different floating-point computation, so after 60 steps of lr 10 the two
    paths need not agree to rounding on every machine (issue 23 item 13). What is the same
    on every machine is the step map: from each iterate of the authors' own path, one step of
    each loss gives the same next iterate (to 1e-12 of the ball's radius; the two gradients
    agree to ~1e-15, measured)."""
    X, W = _text(8, 12, 7)
    Xt, Wt, n, d, steps, lr, x0, norm = au._setup(X, W, kind, 3, 10.0, 60)
    fn = au._map_fn(norm)
    phi = fn(Xt, Wt).reshape(-1)
    obj = fast_objective(Xt, Wt, norm)
    scale = obj.base_norm / math.sqrt(n * d)
    xt, rest, row = x0.clone(), Xt[1:], torch.zeros(1, dtype=torch.long)
    for _ in range(steps):
        x = xt.clone().requires_grad_(True)
        feats = fn(torch.cat([x[None], rest]), Wt).reshape(-1)
        (g_full,) = torch.autograd.grad(-torch.sqrt(torch.mean((feats - phi) ** 2)), x)
        D = (xt - Xt[0]).requires_grad_(True)
        (g_fast,) = torch.autograd.grad(-scale * obj(row, D[None])[0], D)
        nxt = au._project(xt - lr * g_full, x0, math.sqrt(d))
        alt = au._project(xt - lr * g_fast, x0, math.sqrt(d))
        assert float(torch.linalg.vector_norm(nxt - alt)) <= 1e-12 * math.sqrt(d)
        xt = nxt
    for run in (
        authors_estimator(X, W, seed=3, normalisation=kind, steps=60),
        authors_replica(X, W, seed=3, normalisation=kind, steps=60),
    ):
        assert math.isfinite(run.as_run) and 0 <= run.in_ball
        assert run.in_ball <= run.as_run * (1 + 1e-9) or run.ratio <= 1


def test_authors_ball_is_centred_at_the_noisy_start():
    X, W = _text(10, 16, 11)
    run = authors_replica(X, W, seed=0)
    xi = torch.randn(16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert run.ratio <= 1 + 0.1 * float(xi.norm()) / 4 + 1e-12


def test_authors_refuses_bad_input():
    X, W = _text(5, 4, 1)
    with pytest.raises(ValueError, match="normalisation must be 'raf' or 'relu'"):
        authors_replica(X, W, seed=0, normalisation="rf")
    with pytest.raises(TypeError):
        authors_replica(X, W, seed=0, steps=True)
    with pytest.raises(ValueError, match="lr"):
        authors_replica(X, W, seed=0, lr=-1.0)


def _softmax_attention_tol(X, W):
    """How far two float64 computations of ``softmax(XWXᵀ/√d) X`` may be apart
    (tests/rounding.py): a score ``x_r W x_cᵀ/√d`` is two products of length ``d`` and a
    division, off by at most ``E = γ_{2d+1} max_rc |x_r|ᵀ|W||x_c| / √d``; a weight
    ``exp(s_rc)/Σ_c exp(s_rc)`` is then off by at most ``2E + γ_{n+2}``, relative (the shift
    by the row's maximum is exact); an output ``Σ_c A_rc x_cj`` adds ``γ_n`` more, relative
    to ``Σ_c A_rc |x_cj| ≤ max|X|``. Twice that: two computations."""
    n, d = X.shape
    A = X.abs()
    E = gamma(2 * d + 1) * float((A @ W.abs() @ A.T).max()) / math.sqrt(d)
    return 2 * (2 * E + gamma(n + 2) + gamma(n)) * float(A.max())


def test_authors_map_differs_only_by_float32_rounding():
    X, W = _text(12, 48, 4)
    for kind, fn in (("raf", ws.raf), ("relu", ws.relu_attention)):
        theirs, ours = authors_map(X, W, normalisation=kind), fn(X, W)
        rel = float(torch.linalg.vector_norm(theirs - ours) / torch.linalg.vector_norm(ours))
        assert 0 < rel < 1e-6
    X, W = _text(12, 64, 4)  # √64 is exact in float32
    theirs = authors_map(X, W, normalisation="raf")
    torch.testing.assert_close(theirs, ws.raf(X, W), rtol=0, atol=_softmax_attention_tol(X, W))
    with pytest.raises(ValueError, match="normalisation must be 'raf' or 'relu'"):
        authors_map(X, W, normalisation="rf")


def test_fro2_law_mean_is_the_exact_draws_mean():
    """Issue 32 item 2.10: the row model's mean is the exact mean of ``‖A‖_F²`` (each row's
    law is exact), checked against full draws of ``(X, W)`` at a small size, where the
    correlation across rows is strongest; the row model's sd leaves that correlation out
    and is smaller, which is why the book takes the spread from the full draws."""
    for n, d in ((40, 16), (100, 32)):
        exact = attention_fro2_draws(n, d, draws=400, seed=3)
        mean, sd = attention_fro2_law(n, d, draws=2000, seed=4)
        se = math.hypot(exact.std(ddof=1) / math.sqrt(400), sd / math.sqrt(2000))
        assert abs(exact.mean() - mean) < 4 * se, (n, d, exact.mean(), mean, se)
        assert sd < exact.std(ddof=1)  # the rows' correlation adds variance


def test_fro2_law_tends_to_the_delta_method():
    """At large ``n`` and ``d`` the law approaches the delta method's ``e(1 − 7.6/n)`` and
    ``16.1/n`` (the first-order sd overstates the spread of typical draws: within 30 %)."""
    e = math.e
    assert FRO2_SD == pytest.approx(math.sqrt(e**6 - 4 * e**4 + 4 * e**3 - e**2))
    assert 16.0 < FRO2_SD < 16.2 and 7.5 < FRO2_BIAS < 7.7
    mean, sd = attention_fro2_law(400, 10**6, draws=200, seed=0)
    assert mean == pytest.approx(e * (1 - FRO2_BIAS / 400), abs=4 * sd / math.sqrt(200))
    assert 0.7 < sd / (FRO2_SD / 400) < 1.0


@pytest.mark.parametrize(
    "kw", [dict(n=1, d=8), dict(n=8, d=1), dict(n=8, d=8, draws=1), dict(n=8, d=8, seed=-1)]
)
def test_fro2_law_refuses_bad_sizes(kw):
    for f in (attention_fro2_law, attention_fro2_draws):
        with pytest.raises(ValueError):
            f(**kw)


def test_sigma2_model_matches_the_construction():
    """Issue 23 item 7: the reduced Monte Carlo of sigma2_model against σ² = ‖Wᵀx'‖²/d
    computed from the row take-over itself, at d = 48 (means within 4 combined standard
    errors; sd within 20 %)."""
    from wsutils.estimators import takeover as tk
    from wsutils.estimators.softmax_laws import sigma2_model

    d, m = 48, 300
    direct = []
    for k in range(m):
        X, W = ws.sample_X(2, d, seed=10 + k), ws.sample_W(d, seed=10_000 + k)
        x1 = X[0] + torch.as_tensor(tk.row_takeover(X, W, 0))
        direct.append(float(torch.linalg.vector_norm(W.T @ x1) ** 2) / d)
    mean, sd = sigma2_model(d, draws=3000, seed=1)
    se = sd * math.sqrt(1 / m + 1 / 3000)
    assert abs(np.mean(direct) - mean) < 4 * se
    assert 0.8 < np.std(direct, ddof=1) / sd < 1.2
    assert mean > sigma2_model(4 * d, draws=600, seed=2)[0] > 3.5  # the bias falls with d


def test_relu_certified_upper_bounds_every_word():
    """Issue 23 item 2: the certified bound of prop-relu-low at every row is at least the
    per-row bound with the same ζ and at least every relative change a search finds."""
    from wsutils.estimators.relu import (
        relu_certified_upper,
        relu_upper_bound,
        relu_zeta_estimate,
        relu_zeta_lower,
    )

    X, W = _text(120, 6, 3)
    up = relu_certified_upper(X, W)
    zl = relu_zeta_lower(X)
    assert up.shape == (120,) and np.all(zl >= 0)
    for i in (0, 7, 119):
        assert zl[i] <= relu_zeta_estimate(X, i) * (1 + 1e-12)  # certified ≤ attained
        exact = relu_upper_bound(X, W, i, max(zl[i], 1e-300)).value
        assert up[i] >= exact * (1 - 1e-12)
    res = ws.word_sensitivity(
        lambda Z: ws.relu_attention(Z, W), X, rows=[0, 7, 119], steps=30, starts=3, seed=0
    )
    for i, v in res.per_row.items():
        assert v <= up[i]
    # at n ≫ d² the closed-form ζ bound is positive
    Xbig = ws.sample_X(6000, 3, seed=1)
    assert relu_zeta_lower(Xbig).min() > 0
