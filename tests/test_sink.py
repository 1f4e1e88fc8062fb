"""The attention sink (eq. eq-sink-attention, chapter attention-sink) as one parameter of the
softmax map, of the fast estimator and of the take-over certificates, and the upper
certificate of softmax attention (prop-softmax-upper), which must lie above the exact change
of every Δ the searches and constructions return."""

import math

import numpy as np
import pytest
import torch

import wsutils as ws
from tests.rounding import gamma
from wsutils.estimators import objectives as ob
from wsutils.estimators.self_attention import attention_word_sensitivity
from wsutils.estimators.softmax_upper import softmax_certified_upper
from wsutils.estimators.takeover import certified_lower_bound, constructions
from wsutils.maps import Normalisation, attention, attention_scores
from wsutils.sensitivity import project_ball, relative_changes, search_setup

SINK_ROWS = ("zero", "small", "real")  # the sink's value v_s = x_0: zero, 0.1·a row, a row
MARGINS = (0.0, 4.0, 12.0)


def _text(n, d, sink_row, seed=1):
    X = ws.sample_X(n, d, seed=seed)
    if sink_row == "zero":
        X[0] = 0
    elif sink_row == "small":
        X[0] *= 0.1
    return X, ws.sample_W(d, seed=seed + 1)


def test_sink_zero_margin_is_no_sink_and_the_formula_holds():
    """``b = 0`` adds an exact zero to the scores (the same floats as no sink); for ``b ≠ 0``
    the map is the extra-logit formula Σ_k e^{z_jk + β_k} x_k / Σ_k e^{z_jk + β_k}."""
    X, W = _text(10, 8, "real")
    assert torch.equal(attention(X, W, sink=0.0), attention(X, W))  # z + 0.0 is z exactly
    b = 3.0
    z = attention_scores(X, W)
    z[:, 0] += b
    E = torch.exp(z - z.max(dim=1, keepdim=True).values)
    direct = (E @ X) / E.sum(dim=1, keepdim=True)
    tol = 2 * gamma(10 + 8) * (1 + float(z.abs().max())) * math.sqrt(8)
    torch.testing.assert_close(attention(X, W, sink=b), direct, rtol=0, atol=tol)


@pytest.mark.parametrize("sink_row", SINK_ROWS)
@pytest.mark.parametrize("b", MARGINS)
def test_fast_objective_with_a_sink_equals_the_full_map(sink_row, b):
    """The fast objective's relative change and its written-out gradient at random Δ (rows
    0, the sink, and three words) against the full map and autograd, within the rounding of
    its sums of at most n·d terms, scaled by the scores (their error moves the weights)."""
    n, d = 12, 16
    X, W = _text(n, d, sink_row)
    norm = Normalisation("softmax", sink=b)
    obj = ob.fast_objective(X, W, norm)
    rows = torch.tensor([0, 1, 5, 11])
    gen = torch.Generator().manual_seed(3)
    D = project_ball(3 * torch.randn(4, d, dtype=torch.float64, generator=gen), math.sqrt(d))
    vals, grad = obj.evaluate(rows, D)
    base = attention(X, W, normalisation=norm)
    Dg = D.clone().requires_grad_(True)
    full, F = [], 0
    for k, r in enumerate(rows.tolist()):
        Xp = X.index_put((torch.tensor([r]),), (X[r] + Dg[k])[None])
        change = attention(Xp, W, normalisation=norm) - base
        full.append(torch.linalg.vector_norm(change.detach()) / torch.linalg.vector_norm(base))
        F = F + (change**2).sum()
    (auto,) = torch.autograd.grad(F, Dg)
    scale = 1 + float(attention_scores(X, W).abs().max()) + b
    rtol = 2 * gamma(n * d) * scale
    torch.testing.assert_close(vals, torch.stack(full), rtol=rtol, atol=0)
    torch.testing.assert_close(grad(), auto, rtol=0, atol=rtol * float(auto.abs().max()))


def test_sink_token_is_not_a_word():
    """With a sink, row 0 may have any norm and the default rows are the words 1..n−1;
    without one a zero row is refused as before."""
    X, W = _text(6, 8, "zero")
    _, rows, _ = search_setup(X, rows=None, sink=True)
    assert rows == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="norm"):
        search_setup(X, rows=None)
    res = attention_word_sensitivity(
        X, W, normalisation={"name": "softmax", "sink": 2.0}, starts=1, steps=3, seed=0
    )
    assert sorted(res.per_row) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(name="relu", sink=1.0), ValueError),
        (dict(name="sparsemax", sink=1.0), ValueError),
        (dict(name="softmax", sink=math.nan), ValueError),
        (dict(name="softmax", sink=math.inf), ValueError),
        (dict(name="softmax", sink="1"), TypeError),
        (dict(name="softmax", sink=True), TypeError),
    ],
)
def test_sink_refusals(kwargs, error):
    with pytest.raises(error, match="sink"):
        Normalisation(**kwargs)


def test_upper_certificate_refuses_other_maps_and_a_zero_output():
    X, W = _text(6, 8, "real")
    with pytest.raises(ValueError, match="relu_certified_upper"):
        softmax_certified_upper(X, W, normalisation="relu")
    with pytest.raises(ValueError, match="= 0"):
        softmax_certified_upper(torch.zeros(4, 8, dtype=torch.float64), W)
    with pytest.raises(ValueError, match="d × d"):
        softmax_certified_upper(X, W[:4, :4])


@pytest.mark.parametrize(
    "n, d, sink_row, b",
    [
        (8, 16, "real", None),
        (24, 32, "real", None),
        (120, 8, "real", None),
        (24, 32, "zero", 4.0),
        (24, 32, "zero", 12.0),
        (24, 32, "small", 8.0),
        (24, 32, "real", 12.0),
        (60, 16, "real", 4.0),
    ],
)
def test_upper_certificate_lies_above_every_delta_found(n, d, sink_row, b):
    """prop-softmax-upper bounds the change over the whole ball: it lies above the exact
    change of the search's Δ (each row's best, with the take-over starts), of every
    construction and of random points of the sphere, at each row (within the rounding of
    the float64 change it is compared with)."""
    X, W = _text(n, d, sink_row)
    norm = Normalisation("softmax", sink=b)
    U = softmax_certified_upper(X, W, normalisation=norm)
    words = list(range(1, n)) if b is not None else list(range(n))
    rows = words[:: max(1, len(words) // 6)]
    res = attention_word_sensitivity(
        X, W, normalisation=norm, rows=rows, takeovers=True, starts=2, steps=40, seed=0
    )
    slack = 1 - 2 * gamma(n * d)
    gen = torch.Generator().manual_seed(5)
    phi = lambda Z: attention(Z, W, normalisation=norm)  # noqa: E731
    for r in rows:
        assert U[r] >= res.per_row[r] * slack, (r, U[r], res.per_row[r])
        cands = constructions(X, W, r, norm)
        sphere = project_ball(1e3 * torch.randn(16, d, dtype=torch.float64, generator=gen), d**0.5)
        D = torch.cat([cands, sphere])
        vals = relative_changes(phi, X, [r] * len(D), D)
        assert float(vals.max()) <= U[r] / slack, (r, float(vals.max()), U[r])
        assert certified_lower_bound(X, W, r, normalisation=norm) <= U[r] / slack


@pytest.mark.parametrize("value, b", [("real", 4.0), ("zero", 12.0), ("small", 0.0)])
def test_sink_point_lower_is_the_constructions_certificate(value, b):
    """The chapter's grid keeps each text's scores across margins: its lower bound is
    certified_lower_bound's (the same constructions, the same map), within the rounding of
    two evaluations of a length-(n+1)·d computation."""
    from wsutils.experiments.sink import sink_point, sink_text

    n, d = 12, 32
    got = sink_point(d, n, b, value, 5, rows=(1, 2))["lower"]
    X, W = sink_text(n, d, value, 5), ws.sample_W(d, seed=6)
    norm = Normalisation("softmax", sink=b)
    ref = max(certified_lower_bound(X, W, r, normalisation=norm) for r in (1, 2))
    assert got == pytest.approx(ref, rel=2 * gamma((n + 1) * d))


@pytest.mark.parametrize("b", [None, 4.0, 20.0])
def test_upper_certificate_at_some_rows_is_the_full_ones(b):
    """rows= computes the certificate's columns for those words only (O(n·d) a word): the
    same bound as the full computation's entries, up to the rounding slack that the
    distances carry (both are upper bounds; the slack is √γ_{d+2} of a distance)."""
    from wsutils.experiments.sink import sink_text

    n, d = 30, 32
    X = ws.sample_X(n, d, seed=1) if b is None else sink_text(n - 1, d, "real", 3)
    W = ws.sample_W(d, seed=2)
    norm = Normalisation("softmax", sink=b)
    full = softmax_certified_upper(X, W, normalisation=norm)
    some = softmax_certified_upper(X, W, normalisation=norm, rows=[1, 5, 7])
    # a distance's slack, √γ_{d+2}(‖a‖ + ‖b‖) with norms up to √d, relative to ‖φ(X)‖_F: where
    # the sink makes the certificate small, that slack is most of it
    base = float(torch.linalg.vector_norm(attention(X, W, normalisation=norm)))
    slack = 4 * math.sqrt(gamma(d + 2))
    np.testing.assert_allclose(
        some, full[[1, 5, 7]], rtol=slack, atol=slack * 2 * math.sqrt(d) / base
    )
    with pytest.raises(ValueError, match="out of range"):
        softmax_certified_upper(X, W, rows=[n])


@pytest.mark.parametrize("value, b", [("real", 24.0), ("zero", 20.0)])
def test_sink_point_searched_lower_is_the_estimators(value, b):
    """With a search, the grid's lower bound is the estimator's for the sink map (the
    constructions among its starts), so it is never below the constructions' bound beyond
    the rounding of two float64 evaluations, and never above the upper certificate."""
    from wsutils.experiments.sink import sink_point, sink_text

    n, d = 12, 32
    search = {"starts": 2, "steps": 30}
    got = sink_point(d, n, b, value, 5, rows=(1,), search=search)
    X, W = sink_text(n, d, value, 5), ws.sample_W(d, seed=6)
    norm = Normalisation("softmax", sink=b)
    ref = attention_word_sensitivity(
        X, W, normalisation=norm, rows=[1], takeovers=True, seed=0, **search
    ).value
    slack = 2 * gamma((n + 1) * d)
    assert got["searched"] and got["lower"] == pytest.approx(ref, rel=slack)
    assert got["lower"] >= got["lower_constructions"] * (1 - slack)
    assert got["lower"] <= got["upper"] * (1 + slack)


def test_past_the_own_margin_the_certificate_keeps_the_row():
    """margin_own is log Σ_k e^{s̄_1k} (prop-sink-rows, part 2): past it the off-sink weight
    bound e^{margin_own − b0} is below 1, and the estimator's best Δ keeps no more of word
    1's row off the sink than that bound allows."""
    from wsutils.experiments.sink import sink_point, sink_text
    from wsutils.maps import normalise_scores

    n, d = 12, 32
    m = sink_point(d, n, 0.0, "zero", 5)["margin_own"]
    X, W = sink_text(n, d, "zero", 5), ws.sample_W(d, seed=6)
    b = m + 2.0
    norm = Normalisation("softmax", sink=b)
    res = attention_word_sensitivity(
        X, W, normalisation=norm, rows=[1], takeovers=True, seed=0, starts=2, steps=30
    )
    Xp = X.clone()
    Xp[1] += torch.as_tensor(res.Delta, dtype=X.dtype)
    A = normalise_scores(attention_scores(Xp, W), norm)
    assert 1 - float(A[1, 0]) <= math.exp(m - b) * (1 + 1e-9)


@pytest.mark.parametrize("d", [3, 8, 32])
def test_ball_quadratic_sup_bounds_the_maximum_and_attains_it(d):
    """lem-ball-quadratic: the bound lies above ΔᵀAΔ + gᵀΔ at every point of the ball tried
    (random points, the sphere's top eigenvector, and the trust-region maximiser), and at the
    maximiser (Δ = (μI − A)⁻¹g/2 with ‖Δ‖ = r, μ from numpy's eigendecomposition) it is
    attained up to the bisection's and the solve's rounding."""
    from wsutils.estimators.softmax_upper import ball_quadratic_sup

    gen = torch.Generator().manual_seed(d)
    A = torch.randn(d, d, dtype=torch.float64, generator=gen)
    A = (A + A.T) / 2
    G = 3 * torch.randn(4, d, dtype=torch.float64, generator=gen)
    r = math.sqrt(d)
    ub = ball_quadratic_sup(A, G, r)
    lam, Q = np.linalg.eigh(A.numpy())
    for k, g in enumerate(G.numpy()):
        c = (Q.T @ g) ** 2
        lo, hi = max(lam[-1], 0.0), max(lam[-1], 0.0) + np.linalg.norm(g) / (2 * r) + 1
        for _ in range(200):  # ‖Δ(μ)‖ = r: the secular equation, decreasing in μ
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if 0.25 * (c / (mid - lam) ** 2).sum() > r * r else (lo, mid)
        D = np.linalg.solve(hi * np.eye(d) - A.numpy(), g) / 2
        D *= min(1.0, r / np.linalg.norm(D))
        best = D @ A.numpy() @ D + g @ D
        D2 = project_ball(torch.randn(256, d, dtype=torch.float64, generator=gen) * 9, r)
        tried = torch.einsum("bi,ij,bj->b", D2, A, D2) + D2 @ G[k]
        assert float(ub[k]) >= max(best, float(tried.max()))
        assert float(ub[k]) <= best + 1e-6 * (1 + abs(best))
        separate = r * float(torch.linalg.vector_norm(G[k])) + max(lam[-1], 0.0) * d
        assert float(ub[k]) <= separate * (1 + 1e-12)
