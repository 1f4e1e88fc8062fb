"""Batched flip searches (``wsutils.generalization.search_flips``) and the batched read-outs
of the flip models."""

import math

import pytest
import torch
from rounding import dot_tolerance, gamma

import wsutils as ws
from wsutils import generalization as G


def _models(n=5, d=4, row=2, seed=0):
    X = ws.sample_X(n, d, seed=seed)
    W = ws.sample_W(d, seed=seed + 1)
    H, Vi = G.rf_preactivations(X[None], 17, seed=seed + 2, row=row, dtype=torch.float64)
    return {
        "rf": G.rf_flip_model(H[0], Vi),
        "raf": G.attention_flip_model(X, W, "raf", row),
        "relu": G.attention_flip_model(X, W, "relu", row),
        "sparsemax": G.attention_flip_model(X, W, "sparsemax", row),
    }


@pytest.mark.parametrize("kind", ["rf", "raf", "relu", "sparsemax"])
def test_batched_readout_is_the_readout_of_each_vector(kind):
    model = _models()[kind]
    g = torch.Generator().manual_seed(3)
    p = model.phi_row(torch.zeros(1, 4, dtype=torch.float64)).shape[1]
    Ws = torch.randn(3, p, generator=g, dtype=torch.float64)
    Delta = torch.randn(7, 4, generator=g, dtype=torch.float64)
    idx = torch.tensor([0, 2, 1, 1, 0, 2, 2])
    got = model.batched(Ws, torch.float64)(Delta, idx)
    want = torch.stack([model.readout(Delta[b : b + 1], Ws[int(idx[b])])[0] for b in range(7)])
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    f32 = model.batched(Ws, torch.float32)(Delta.float(), idx)
    assert f32.dtype == torch.float32
    torch.testing.assert_close(f32.double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["rf", "raf"])
def test_without_steps_each_search_keeps_the_start_search_flip_keeps(kind):
    """No step taken: the batch and the one-by-one search compare the same starts (no
    search path is followed), so they return the same start and Δ."""
    model = _models()[kind]
    p = model.phi_row(torch.zeros(1, 4, dtype=torch.float64)).shape[1]
    Ws = torch.randn(3, p, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    taus = [-1.0, 0.5, 2.0]
    got = G.search_flips(model, Ws, taus, 4, starts=5, steps=0, seed=7)
    for j, tau in enumerate(taus):
        one = G.search_flip(lambda D: model.readout(D, Ws[j]), 4, tau, starts=5, steps=0, seed=7)
        assert got[j].start == one.start
        # the same Gaussian draws scaled to the sphere by two code paths: a norm (d + 1
        # roundings), a division and a product, then the projection onto the ball (as many
        # again), each relative to entries of size at most √d, in each of two computations
        d = one.Delta.shape[0]
        atol = 2 * 2 * gamma(d + 3) * math.sqrt(d)
        torch.testing.assert_close(got[j].Delta, one.Delta, rtol=0, atol=atol)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_search_flips_reach_reachable_targets_in_the_ball(dtype):
    d = 9
    a = torch.arange(1.0, d + 1, dtype=torch.float64)
    model = G.FlipModel(phi_row=lambda D: D, readout=lambda D, w: D @ w)  # no batched form
    Ws = torch.stack([a, -2 * a])
    taus = [-float(a.norm()), 3 * float(a.norm())]
    res = G.search_flips(model, Ws, taus, d, starts=3, steps=100, seed=1, dtype=dtype)
    for r, w, tau in zip(res, Ws, taus):
        assert r.Delta.dtype == torch.float64
        assert float(r.Delta.norm()) <= math.sqrt(d)
        # float64 at the returned Δ: the model's read-out and this product are two
        # computations of one length-d dot product (tests/rounding.py)
        tol = dot_tolerance(d, float(r.Delta.norm()), float(w.norm()))
        assert abs(r.value - float(r.Delta @ w)) <= tol
        # the loss is the square of value − τ: one subtraction and one square, rounded twice
        # in each of two computations
        assert abs(r.loss - (r.value - tau) ** 2) <= 2 * gamma(2) * r.loss
        assert r.min_loss == r.loss  # the same float, copied
        assert abs(r.value - tau) < 1e-3 * abs(tau)


def test_search_flips_bad_input():
    model = _models()["rf"]
    with pytest.raises(ValueError, match="one target per"):
        G.search_flips(model, torch.ones(2, 17), [1.0], 4)
    with pytest.raises(ValueError, match="dtype must be"):
        G.search_flips(model, torch.ones(1, 17), [1.0], 4, dtype="float16")
    with pytest.raises(TypeError, match="unknown search setting"):
        G.search_flips(model, torch.ones(1, 17), [1.0], 4, search_dtype="float32")
    with pytest.raises(ValueError, match="non-finite"):
        G.search_flips(model, torch.full((1, 17), math.nan), [1.0], 4)
    with pytest.raises(ValueError, match="dtype must be"):
        G.flip_point(map="rf", n=4, d=6, Ns=[8], seed=0, search={"dtype": "half"})
    with pytest.raises(ValueError, match="seeds its search from its own seed"):
        G.flip_point(map="rf", n=4, d=6, Ns=[8], seed=0, search={"seed": 3})


@pytest.mark.parametrize("map", G.MAPS)
def test_batched_flip_runs_keep_the_invariants_and_run_every_search(map):
    kw = dict(map=map, n=4, d=6, Ns=[8, 10], seed=2)
    new = G.flip_point(**kw, search=dict(steps=25, starts=3))["runs"]
    old = G.flip_point(
        **kw, batch_searches=False, search=dict(steps=25, starts=3, dtype="float64")
    )["runs"]
    assert [(r["N"], r["training"], r["loss"]) for r in new] == [
        (r["N"], r["training"], r["loss"]) for r in old
    ]
    for r, o in zip(new, old):
        # everything that does not depend on the search is the same number
        for key in ("t0", "t1", "interp_err", "rho", "S_bound", "norm_phi_theta0", "y"):
            assert r[key] == o[key] or (math.isnan(r[key]) and math.isnan(o[key])), key
        assert abs(r["t1"] - r["y"]) < 1e-12 and r["norm_Delta"] <= math.sqrt(6)
        rhs = (r["D0"] - r["t0"]) + (r["c"] - 1) * (r["y"] - r["t0"])
        assert abs(r["D1"] - r["y"] - rhs) < 1e-9
        assert (
            r["search_loss"] == pytest.approx((r["D1"] + r["y"]) ** 2, rel=1e-9)
            if r["loss"] == "output"
            else True
        )


@pytest.mark.parametrize("kind", ["rf", "raf"])
def test_authors_searches_take_the_authors_steps(kind):
    """Zero and one step (no long path to follow): the batch gives the numbers of
    ``authors_search`` run alone; the last iterate is returned and ``min_loss`` ≤ ``loss``."""
    model = _models()[kind]
    p = model.phi_row(torch.zeros(1, 4, dtype=torch.float64)).shape[1]
    Ws = torch.randn(3, p, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    taus = [-1.0, 0.5, 2.0]
    for steps in (0, 1):
        got = G.authors_searches(model, Ws, taus, 4, lr=0.7, steps=steps)
        for j, tau in enumerate(taus):
            one = G.authors_search(lambda D: model.readout(D, Ws[j]), 4, tau, lr=0.7, steps=steps)
            torch.testing.assert_close(got[j].Delta, one.Delta, rtol=1e-12, atol=1e-12)
            assert got[j].value == pytest.approx(one.value, rel=1e-12, abs=1e-12)
            assert got[j].min_loss <= got[j].loss and got[j].start == 0
    with pytest.raises(ValueError, match="lr"):
        G.authors_searches(model, Ws, taus, 4, lr=-1.0, steps=3)
    with pytest.raises(ValueError, match="one target per row"):
        G.authors_searches(model, Ws, taus[:2], 4, lr=1.0, steps=3)


@pytest.mark.parametrize("map", G.MAPS)
def test_both_searches_in_one_point_are_the_two_points(map):
    """``method=["ours", "authors"]`` builds the features once; every number that does not
    depend on the search equals that of the two separate points, and each search keeps its
    own steps (ours: ``search``'s; the authors': ``gen.py``'s)."""
    kw = dict(
        map=map,
        n=4,
        d=6,
        Ns=[8, 10],
        seed=2,
        data="authors",
        losses=["output"],
        trainings=["fine_tune"],
    )
    search = dict(steps=20, starts=3)
    both = G.flip_point(**kw, method=["ours", "authors"], search=search)["runs"]
    ours = G.flip_point(**kw, method="ours", search=search)["runs"]
    auth = G.flip_point(**kw, method="authors")["runs"]
    assert [r["method"] for r in both] == ["ours"] * len(ours) + ["authors"] * len(auth)
    for r, o in zip(both, ours + auth):
        assert r["method"] == o["method"] and r["N"] == o["N"]
        for key in ("t0", "t1", "interp_err", "rho", "norm_phi_theta0", "y"):
            assert r[key] == o[key], key
    with pytest.raises(ValueError, match="distinct"):
        G.flip_point(**kw, method=["ours", "ours"])
    with pytest.raises(ValueError, match="method must be"):
        G.flip_point(**kw, method=[])


@pytest.mark.parametrize("kind", ["rf", "raf", "relu", "sparsemax"])
def test_word_scores_are_the_full_maps_read_out(kind):
    """``G.word_scores`` gives, for every candidate row and every read-out, the read-out of
    the map's features on the whole text with that row replaced (a full forward pass here),
    whatever the batch size; candidates far outside the ball are scored as well."""
    n, d, row = 5, 4, 2
    X = ws.sample_X(n, d, seed=0)
    W = ws.sample_W(d, seed=1)
    V = G.sample_V_blocked(17, n, d, seed=2, block_rows=2048, dtype=torch.float64).double()
    full = {
        "rf": lambda Z: ws.rf(Z, V),
        "raf": lambda Z: ws.maps.flat(ws.raf(Z, W)),
        "relu": lambda Z: ws.maps.flat(ws.relu_attention(Z, W)),
        "sparsemax": lambda Z: ws.maps.flat(ws.maps.attention(Z, W, normalisation="sparsemax")),
    }[kind]
    model = _models()[kind]
    g = torch.Generator().manual_seed(4)
    rows = 3 * torch.randn(6, d, generator=g, dtype=torch.float64)  # ‖x' − x_i‖ > √d
    p = full(X).reshape(-1).shape[0]
    thetas = torch.randn(3, p, generator=g, dtype=torch.float64)
    want = torch.stack(
        [full(torch.cat([X[:row], r[None], X[row + 1 :]])).reshape(-1) @ thetas.T for r in rows]
    )
    for batch in (1, 4, 100):
        got = G.word_scores(model, X[row], rows, thetas, batch=batch)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_word_scores_refuse_bad_input():
    model = _models()["raf"]
    X = ws.sample_X(5, 4, seed=0)
    good = dict(x=X[2], rows=torch.ones(3, 4, dtype=torch.float64), thetas=torch.ones(1, 20))
    for bad, msg in [
        (dict(rows=torch.ones(3, 5)), "rows the candidates"),
        (dict(rows=torch.ones(0, 4)), "rows the candidates"),
        (dict(x=X), "one row"),
        (dict(thetas=torch.ones(1, 19)), "read-outs"),
        (dict(thetas=torch.ones(0, 20)), "read-outs"),
        (dict(rows=torch.full((3, 4), math.nan)), "rows"),
    ]:
        with pytest.raises(ValueError, match=msg):
            G.word_scores(model, **{**good, **bad})
    with pytest.raises(ValueError, match="batch"):
        G.word_scores(model, **good, batch=0)


@pytest.mark.parametrize("name", ["raf", "relu", "scalable"])
def test_row_column_readouts_match_the_features(name):
    """The row-and-column read-out of softmax, scalable softmax and ReLU attention
    (``G.word_scores``' fast path) equals the features' read-out, also where the new scores
    are huge (softmax saturates: each row's sums are kept relative to its largest score) and
    where ReLU attention leaves rows of zero weight."""
    n, d, row = 6, 5, 3
    X = ws.sample_X(n, d, seed=5)
    W = ws.sample_W(d, seed=6)
    model = G.attention_flip_model(X, W, name, row)
    assert model.readouts is not None
    g = torch.Generator().manual_seed(7)
    Delta = torch.cat(
        [
            torch.randn(5, d, generator=g, dtype=torch.float64),
            40 * torch.randn(3, d, generator=g, dtype=torch.float64),  # scores in the hundreds
            -X[row][None],  # x' = 0: column i and row i of the scores vanish
        ]
    )
    thetas = torch.randn(4, n * d, generator=g, dtype=torch.float64)
    want = model.phi_row(Delta) @ thetas.T
    got = model.readouts(thetas)(Delta)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    if name == "relu":  # every score negative: rows of zero weight, but for row i's change
        Xp, Wn = X.abs(), -W.abs()
        assert (Xp @ Wn @ Xp.T < 0).all()
        m = G.attention_flip_model(Xp, Wn, "relu", row)
        torch.testing.assert_close(
            m.readouts(thetas)(Delta), m.phi_row(Delta) @ thetas.T, rtol=1e-9, atol=1e-9
        )


def test_trained_readouts_are_the_flip_runs_models():
    """``G.trained_readouts`` trains what the flip runs train: each ``θ₁`` interpolates the new
    text and its ``N`` training texts; bad input is refused."""
    g = torch.Generator().manual_seed(8)
    Phi = torch.randn(7, 30, generator=g, dtype=torch.float64)
    Y = torch.sign(torch.randn(7, generator=g, dtype=torch.float64))
    phi = torch.randn(30, generator=g, dtype=torch.float64)
    thetas, keys = G.trained_readouts(Phi, Y, phi, -1.0, Ns=[7, 5])
    assert keys == [(5, "fine_tune"), (5, "retrain"), (7, "fine_tune"), (7, "retrain")]
    torch.testing.assert_close(phi @ thetas.T, torch.full((4,), -1.0, dtype=torch.float64))
    for (N, training), th in zip(keys, thetas):
        if training == "retrain":
            torch.testing.assert_close(Phi[:N] @ th, Y[:N])
    for bad, msg in [
        (dict(Ns=[8]), "N ≥ max"),
        (dict(trainings=["sgd"]), "trainings"),
        (dict(Y=Y[:6]), "one label"),
    ]:
        with pytest.raises(ValueError, match=msg):
            G.trained_readouts(**{**dict(Phi=Phi, Y=Y, phi=phi, y=-1.0, Ns=[5]), **bad})
