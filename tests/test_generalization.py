"""wsutils.generalization: the Gram-matrix closed forms against numpy's lstsq/pinv and explicit
re-fitting, the blocked RF features against the dense map, the flip search's promises."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import wsutils as ws
from wsutils import generalization as G


def _problem(N=6, p=20, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((N, p)), rng.standard_normal(N), rng.standard_normal(p), 0.7


@settings(max_examples=25, deadline=None)
@given(N=st.integers(1, 12), extra=st.integers(1, 20), seed=st.integers(0, 10**6))
def test_min_norm_interpolator_matches_lstsq_and_pinv(N, extra, seed):
    Phi, Y, _, _ = _problem(N, N + extra, seed)
    theta0 = G.min_norm_interpolator(Phi, Y)
    assert isinstance(theta0, np.ndarray)
    np.testing.assert_allclose(theta0, np.linalg.lstsq(Phi, Y, rcond=None)[0], atol=1e-8)
    np.testing.assert_allclose(theta0, np.linalg.pinv(Phi) @ Y, atol=1e-8)
    np.testing.assert_allclose(Phi @ theta0, Y, atol=1e-9)


def test_torch_in_torch_out():
    Phi, Y, phi, y = _problem()
    theta0 = G.min_norm_interpolator(torch.as_tensor(Phi), torch.as_tensor(Y))
    assert isinstance(theta0, torch.Tensor)
    np.testing.assert_allclose(theta0.numpy(), np.linalg.pinv(Phi) @ Y, atol=1e-10)


def test_projection_matches_dense_projector():
    Phi, _, phi, _ = _problem()
    P = np.eye(Phi.shape[1]) - np.linalg.pinv(Phi) @ Phi
    np.testing.assert_allclose(G.project_out(Phi, phi), P @ phi, atol=1e-10)
    np.testing.assert_allclose(Phi @ G.project_out(Phi, phi), 0, atol=1e-10)


def test_fine_tune_is_the_closest_interpolator_of_the_new_text():
    Phi, Y, phi, y = _problem()
    theta0 = G.min_norm_interpolator(Phi, Y)
    theta1 = G.fine_tune(theta0, phi, y)
    # explicit re-fit: the min-norm correction δ with ⟨φ, θ₀ + δ⟩ = y
    delta = np.linalg.lstsq(phi[None], [y - phi @ theta0], rcond=None)[0]
    np.testing.assert_allclose(theta1, theta0 + delta, atol=1e-12)
    np.testing.assert_allclose(phi @ theta1, y, atol=1e-12)


def test_retrain_equals_refitting_all_texts():
    Phi, Y, phi, y = _problem()
    theta1 = G.retrain(Phi, Y, phi, y)
    refit = np.linalg.pinv(np.vstack([Phi, phi])) @ np.append(Y, y)
    np.testing.assert_allclose(theta1, refit, atol=1e-10)
    np.testing.assert_allclose(Phi @ theta1, Y, atol=1e-10)
    np.testing.assert_allclose(phi @ theta1, y, atol=1e-12)


def test_singular_gram_is_a_clear_error():
    Phi, Y, phi, y = _problem()
    dup = np.vstack([Phi, Phi[:1]])
    with pytest.raises(ValueError, match="singular"):
        G.min_norm_interpolator(dup, np.append(Y, Y[0]))
    with pytest.raises(ValueError, match="only p"):
        G.min_norm_interpolator(Phi[:, :3], Y)
    with pytest.raises(ValueError, match="span"):
        G.retrain(Phi, Y, Phi[0] + 2 * Phi[1], y)
    with pytest.raises(ValueError, match="one label per row"):
        G.min_norm_interpolator(Phi, Y[:-1])
    with pytest.raises(ValueError, match="no features"):
        G.fine_tune(np.ones(3), np.zeros(3), 1.0)


def test_planted_labels_follow_the_planted_direction():
    Xs, Y, X, y = G.planted_data(50, 4, 6, seed=3)
    assert Xs.shape == (50, 4, 6) and X.shape == (4, 6) and y in (-1.0, 1.0)
    np.testing.assert_allclose(torch.linalg.vector_norm(Xs, dim=-1), math.sqrt(6), rtol=1e-12)
    u = ws.weights.gaussian((24,), 1 / math.sqrt(24), seed=4)
    assert torch.equal(Y, torch.sign(ws.flat(Xs) @ u))
    Xs2, Y2, _, _ = G.planted_data(50, 4, 6, seed=3)
    assert torch.equal(Xs, Xs2) and torch.equal(Y, Y2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_blocked_rf_features_equal_the_dense_map(dtype):
    n, d, k = 3, 4, 11
    Xs = ws.sample_X(5 * n, d, seed=1).reshape(5, n, d)
    H, Vi = G.rf_preactivations(Xs, k, seed=7, row=1, block_rows=4, dtype=dtype)
    V = G.sample_V_blocked(k, n, d, seed=7, block_rows=4, dtype=dtype).double()
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for b in range(5):
        np.testing.assert_allclose(torch.relu(H[b]), ws.rf(Xs[b], V), atol=tol)
    torch.testing.assert_close(Vi, V[:, d : 2 * d])
    # any block regenerates alone from its own seed
    blocks = dict(G.rf_blocks(k, n, d, seed=7, block_rows=4, dtype=dtype))
    torch.testing.assert_close(blocks[8].double(), V[8:])


def test_rf_flip_model_is_the_rf_map_of_the_perturbed_text():
    n, d, k = 3, 4, 13
    X = ws.sample_X(n, d, seed=2)
    H, Vi = G.rf_preactivations(X[None], k, seed=5, row=2, block_rows=5, dtype=torch.float64)
    V = G.sample_V_blocked(k, n, d, seed=5, block_rows=5, dtype=torch.float64)
    model = G.rf_flip_model(H[0], Vi)
    Delta = torch.randn(2, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for b in range(2):
        Xp = X.clone()
        Xp[2] += Delta[b]
        torch.testing.assert_close(model.phi_row(Delta)[b], ws.rf(Xp, V))
    # the certified bound really bounds the change, at random points of the ball
    scaled = Delta * 10 * math.sqrt(d) / torch.linalg.vector_norm(Delta * 10, dim=-1, keepdim=True)
    change = torch.linalg.vector_norm(model.phi_row(scaled) - torch.relu(H[0]), dim=-1)
    assert bool((change <= model.change_bound).all())


@settings(max_examples=20, deadline=None)
@given(
    n=st.integers(2, 7),
    d=st.integers(1, 6),
    row=st.integers(0, 6),
    seed=st.integers(0, 10**5),
    kind=st.sampled_from(["raf", "relu"]),
)
def test_attention_readout_equals_the_full_forward_pass(n, d, row, seed, kind):
    row = row % n
    X = ws.sample_X(n, d, seed=seed)
    W = ws.sample_W(d, seed=seed + 1)
    model = G.attention_flip_model(X, W, kind, row)
    g = torch.Generator().manual_seed(seed)
    Delta = torch.randn(3, d, generator=g, dtype=torch.float64) * 2
    w = torch.randn(n * d, generator=g, dtype=torch.float64)
    torch.testing.assert_close(model.readout(Delta, w), model.phi_row(Delta) @ w)
    fn = ws.raf if kind == "raf" else ws.relu_attention
    torch.testing.assert_close(
        model.phi_row(torch.zeros(1, d, dtype=torch.float64))[0], ws.flat(fn(X, W))
    )


def test_search_flip_reaches_a_reachable_target_and_stays_in_the_ball():
    d = 9
    a = torch.arange(1.0, d + 1, dtype=torch.float64)
    # ⟨a, Δ⟩ ranges over ±‖a‖√d; the target −‖a‖ is reachable, −10‖a‖√d is not.
    res = G.search_flip(lambda D: D @ a, d, -float(a.norm()), starts=3, steps=100, seed=1)
    # normalised steps land within about one final step of the target
    assert abs(res.value + float(a.norm())) < 1e-3 * float(a.norm())
    assert float(res.Delta.norm()) <= math.sqrt(d)
    far = G.search_flip(lambda D: D @ a, d, -10 * float(a.norm() * math.sqrt(d)), steps=100)
    assert float(far.Delta.norm()) <= math.sqrt(d)
    np.testing.assert_allclose(far.value, -float(a.norm()) * math.sqrt(d), rtol=1e-6)


def test_search_flip_is_reproducible():
    a = torch.randn(5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    f = lambda D: torch.tanh(D @ a) + (D**2).sum(-1) * 0.1  # noqa: E731
    r1 = G.search_flip(f, 5, -1.0, steps=30, seed=4)
    r2 = G.search_flip(f, 5, -1.0, steps=30, seed=4)
    assert torch.equal(r1.Delta, r2.Delta)


@pytest.mark.parametrize("map", ["rf", "raf", "relu"])
def test_flip_point_invariants_and_identity(map):
    out = G.flip_point(map=map, n=4, d=6, Ns=[8, 10], seed=0, search=dict(steps=20, starts=2))
    runs = out["runs"]
    assert len(runs) == 2 * 2 * 3
    for r in runs:
        assert abs(r["t1"] - r["y"]) < 1e-12  # f(X; θ₁) = y
        assert r["interp_err"] < 1e-10  # Φθ₀ = Y
        assert r["norm_Delta"] <= math.sqrt(6)
        # f(X_Δ; θ₁) − y = ⟨φ_Δ − φ, θ₀⟩ + (c(Δ) − 1)(y − t0)
        rhs = (r["D0"] - r["t0"]) + (r["c"] - 1) * (r["y"] - r["t0"])
        assert abs(r["D1"] - r["y"] - rhs) < 1e-9


def test_flip_point_bad_input():
    with pytest.raises(ValueError, match="map must be"):
        G.flip_point(map="cnn", n=4, d=6, Ns=[8], seed=0)
    with pytest.raises(ValueError, match="unknown losses"):
        G.flip_point(map="rf", n=4, d=6, Ns=[8], seed=0, losses=["hinge"])
    with pytest.raises(ValueError, match="below p"):
        G.flip_point(map="rf", n=2, d=3, Ns=[8], seed=0)
    with pytest.raises(ValueError, match="loss must be"):
        G.flip_target("hinge", theta1=torch.ones(2), phi=torch.ones(2), y=1.0)


@pytest.mark.parametrize("map", G.MAPS)
def test_flip_runs_on_planted_data_equals_flip_point(map):
    kw = dict(Ns=[8, 10], search=dict(starts=2, steps=15))
    Xs, Y, X, y = G.planted_data(10, 4, 6, seed=3)
    direct = G.flip_runs(map, Xs, Y, X, y, seed=6, **kw)  # flip_point: weights seed + 3
    np.testing.assert_equal(direct, G.flip_point(map=map, n=4, d=6, seed=3, **kw))  # NaN == NaN
    np.testing.assert_allclose([r["t1"] for r in direct["runs"]], y, rtol=0, atol=1e-12)


def test_flip_runs_bad_input():
    Xs, Y, X, y = G.planted_data(10, 4, 6, seed=0)
    with pytest.raises(ValueError, match=r"\(N, n, d\)"):
        G.flip_runs("rf", Xs[0], Y, X, y, Ns=[5], seed=0)
    with pytest.raises(ValueError, match="new text"):
        G.flip_runs("rf", Xs, Y, X[:3], y, Ns=[5], seed=0)
    with pytest.raises(ValueError, match="one label per training text"):
        G.flip_runs("rf", Xs, Y[:-1], X, y, Ns=[5], seed=0)
    with pytest.raises(ValueError, match="±1"):
        G.flip_runs("rf", Xs, (Y + 1) / 2, X, y, Ns=[5], seed=0)
    with pytest.raises(ValueError, match="±1"):
        G.flip_runs("rf", Xs, Y, X, 0.0, Ns=[5], seed=0)
    with pytest.raises(ValueError, match="between 1 and len"):
        G.flip_runs("rf", Xs, Y, X, y, Ns=[11], seed=0)
    with pytest.raises(ValueError, match="norm √d"):
        G.flip_runs("rf", 2 * Xs, Y, X, y, Ns=[5], seed=0)
    with pytest.raises(ValueError, match="map must be"):
        G.flip_runs("cnn", Xs, Y, X, y, Ns=[5], seed=0)
    with pytest.raises(ValueError, match="row must be an integer word index"):
        G.flip_runs("raf", Xs, Y, X, y, Ns=[5], seed=0, row=4)


def test_empty_Ns_is_a_clear_error():
    Xs, Y, X, y = G.planted_data(5, 3, 4, seed=0)
    for call in (
        lambda: G.flip_point(map="rf", n=3, d=4, Ns=[], seed=0),
        lambda: G.flip_runs("rf", Xs, Y, X, y, Ns=[], seed=0),
        lambda: G.flip_grid(d=4, Ns=[], seeds=[0]),
    ):
        with pytest.raises(ValueError, match="Ns is empty"):
            call()
    with pytest.raises(TypeError, match="integer"):
        G.flip_runs("rf", Xs, Y, X, y, Ns=[2.5], seed=0)


def test_authors_data_is_gen_py_data():
    Xs, Y, X, y = G.authors_data(30, 4, 5, seed=3)
    D = 20
    w = ws.weights.gaussian((D,), 1 / math.sqrt(D), seed=4, dtype=torch.float64)
    g = ws.weights.gaussian((D,), 1.0, seed=5, dtype=torch.float64)
    x = (torch.eye(D, dtype=torch.float64) - torch.outer(w, w)) @ g + w  # gen.py, densely
    np.testing.assert_allclose(X.reshape(-1), x, atol=1e-12)
    np.testing.assert_array_equal(Y, torch.sign(Xs.reshape(30, -1) @ w))
    assert y == 1.0 and float(x @ w) > 0
    assert not torch.allclose(Xs.norm(dim=-1), torch.full((30, 4), math.sqrt(5.0), dtype=Xs.dtype))


def test_authors_search_is_plain_projected_gradient_descent_with_the_last_iterate():
    # a quadratic read-out: the plain steps with lr 0.1 can be written out by hand
    d, a = 4, torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)

    def readout(D):
        return D @ a

    res = G.authors_search(readout, d, 5.0, lr=0.1, steps=3)
    Delta = torch.zeros(d, dtype=torch.float64)
    for _ in range(3):
        Delta = Delta - 0.1 * 2 * (Delta @ a - 5.0) * a
        Delta = Delta * min(1.0, 2.0 / float(Delta.norm()))
    np.testing.assert_allclose(res.Delta, Delta, atol=1e-12)
    assert res.loss == pytest.approx(float((Delta @ a - 5.0) ** 2))
    assert res.min_loss <= res.loss


def test_flip_runs_records_both_terms_of_the_identity_under_both_searches():
    for method in G.METHODS:
        out = G.flip_point(
            map="raf",
            n=5,
            d=8,
            Ns=[10, 20],
            seed=1,
            losses=("output",),
            method=method,
            data="authors",
            search=dict(steps=20),
        )
        for r in out["runs"]:
            assert r["method"] == method
            np.testing.assert_allclose(
                r["D1"] - r["y"], r["base_term"] + r["sens_term"], atol=1e-10
            )
            assert abs(r["base_term"]) <= r["rel_change"] * r["norm_phi_theta0"] * (1 + 1e-9)


def test_search_flip_refuses_an_init_it_would_split():
    """An ``init`` of ``2d`` entries used to become two starts (``reshape(-1, d)``); like the
    estimators' ``init`` it must be one perturbation of length ``d`` or an ``m × d`` array."""
    d = 4
    readout = lambda D: D.sum(dim=-1)  # noqa: E731 - a linear read-out is enough here
    with pytest.raises(ValueError, match="init must be one perturbation"):
        G.search_flip(readout, d, -1.0, steps=2, init=torch.ones(2 * d, dtype=torch.float64))
    with pytest.raises(TypeError, match="steps must be an integer"):
        G.search_flip(readout, d, -1.0, steps=2.5)
    res = G.search_flip(readout, d, -1.0, steps=2, init=torch.ones(2, d, dtype=torch.float64))
    assert float(torch.linalg.vector_norm(res.Delta)) <= math.sqrt(d)
