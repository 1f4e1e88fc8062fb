"""wsutils.generalization with the general attention map (``map="attention"`` and a named
normalisation, chapter normalisation): the same records as the paper's maps where they
coincide, a read-out equal to the full map, gradients that match finite differences, and
clear errors for bad input."""

import math

import numpy as np
import pytest
import torch

import wsutils as ws
from wsutils import generalization as G
from wsutils.maps import Normalisation

SHARP = ["softmax", "scalable", "sparsemax", "hardmax", "entmax", "sigmoid", "relu"]


@pytest.mark.parametrize("kind, name", [("raf", "softmax"), ("relu", "relu")])
def test_general_map_reproduces_the_paper_maps_bit_for_bit(kind, name):
    kw = dict(n=5, d=4, Ns=[8, 12], seed=2, search=dict(starts=2, steps=15))
    old = G.flip_point(map=kind, **kw)
    new = G.flip_point(map="attention", normalisation=name, **kw)
    np.testing.assert_equal(new, old)  # every field of every run, exactly
    for method in G.METHODS:  # the authors' search too
        kw2 = dict(kw, Ns=[8], losses=("output",), method=method, search=dict(starts=2, steps=10))
        np.testing.assert_equal(
            G.flip_point(map="attention", normalisation=name, **kw2), G.flip_point(map=kind, **kw2)
        )


@pytest.mark.parametrize("name", SHARP)
def test_general_readout_equals_the_full_forward_pass(name):
    n, d, row = 7, 3, 2
    X, W = ws.sample_X(n, d, seed=5), ws.sample_W(d, seed=6)
    model = G.attention_flip_model(X, W, name, row)
    g = torch.Generator().manual_seed(1)
    Delta = torch.randn(4, d, generator=g, dtype=torch.float64)
    w = torch.randn(n * d, generator=g, dtype=torch.float64)
    torch.testing.assert_close(model.readout(Delta, w), model.phi_row(Delta) @ w)
    Xp = X.clone()
    Xp[row] += Delta[1]
    torch.testing.assert_close(
        model.phi_row(Delta[1:2])[0], ws.flat(ws.maps.attention(Xp, W, normalisation=name))
    )
    F = G.attention_features(torch.stack([X, Xp]), W, name)
    torch.testing.assert_close(F[1], model.phi_row(Delta[1:2])[0])


@pytest.mark.parametrize("name", ["softmax", "scalable", "sparsemax", "hardmax"])
def test_general_readout_gradient_matches_finite_differences(name):
    """The search follows ``∂⟨φ(X_i(Δ)), w⟩/∂Δ``; central differences of step h agree to
    O(h²) where the map is smooth (sparsemax and hardmax are piecewise smooth: at a random Δ
    no support or maximiser changes within ±h, with probability one)."""
    n, d, row = 9, 4, 0
    X, W = ws.sample_X(n, d, seed=11), ws.sample_W(d, seed=12)
    model = G.attention_flip_model(X, W, name, row)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(n * d, generator=g, dtype=torch.float64)
    Delta = torch.randn(1, d, generator=g, dtype=torch.float64).requires_grad_(True)
    (grad,) = torch.autograd.grad(model.readout(Delta, w).sum(), Delta)
    h, E = 1e-6, torch.eye(d, dtype=torch.float64)
    with torch.no_grad():
        fd = torch.stack(
            [
                (model.readout(Delta + h * E[k], w) - model.readout(Delta - h * E[k], w))[0]
                for k in range(d)
            ]
        ) / (2 * h)
    torch.testing.assert_close(grad[0], fd, rtol=1e-6, atol=1e-7)
    assert float(grad.abs().max()) > 0  # hardmax too: through the values x_i + Δ


def test_general_map_records_satisfy_the_identity():
    for name in ("scalable", "sparsemax", "hardmax"):
        out = G.flip_point(
            map="attention",
            normalisation=name,
            n=6,
            d=4,
            Ns=[8, 12],
            seed=0,
            search=dict(steps=15, starts=2),
        )
        assert len(out["runs"]) == 2 * 2 * 3
        for r in out["runs"]:
            assert abs(r["t1"] - r["y"]) < 1e-12 and r["interp_err"] < 1e-10
            assert r["norm_Delta"] <= math.sqrt(4)
            np.testing.assert_allclose(
                r["D1"] - r["y"], r["base_term"] + r["sens_term"], atol=1e-10
            )
            assert math.isnan(r["S_bound"])  # no certificate for attention


def test_normalisation_may_be_a_name_a_dict_or_a_Normalisation():
    kw = dict(map="attention", n=5, d=4, Ns=[8], seed=1, losses=("output",))
    kw |= dict(search=dict(steps=5, starts=2))
    by_name = G.flip_point(normalisation="scalable", **kw)
    by_dict = G.flip_point(normalisation={"name": "scalable", "s": 1.0}, **kw)
    by_obj = G.flip_point(normalisation=Normalisation("scalable", s=1.0), **kw)
    np.testing.assert_equal(by_name, by_dict)
    np.testing.assert_equal(by_name, by_obj)
    other = G.flip_point(normalisation={"name": "scalable", "s": 3.0}, **kw)
    assert other["runs"][0]["D0"] != by_name["runs"][0]["D0"]


def test_flip_table_names_the_normalisation_only_where_there_is_one():
    rec = dict(
        map="attention",
        normalisation="sparsemax",
        n=5,
        d=4,
        seed=0,
        **G.flip_point(
            map="attention",
            normalisation="sparsemax",
            n=5,
            d=4,
            Ns=[8],
            seed=0,
            search=dict(steps=3, starts=1),
            losses=("output",),
        ),
    )
    old = dict(
        map="raf",
        n=5,
        d=4,
        seed=0,
        **G.flip_point(
            map="raf", n=5, d=4, Ns=[8], seed=0, search=dict(steps=3, starts=1), losses=("output",)
        ),
    )
    rows = G.flip_table([rec, old])
    assert rows[0]["normalisation"] == "sparsemax" and "normalisation" not in rows[-1]


def test_general_map_bad_input():
    kw = dict(n=5, d=4, Ns=[8], seed=0)
    with pytest.raises(ValueError, match="needs normalisation"):
        G.flip_point(map="attention", **kw)
    with pytest.raises(ValueError, match="applies only to map='attention'"):
        G.flip_point(map="raf", normalisation="softmax", **kw)
    with pytest.raises(ValueError, match="normalisation must be one of"):
        G.flip_point(map="attention", normalisation="softermax", **kw)
    with pytest.raises(ValueError, match="needs 'name'"):
        G.flip_point(map="attention", normalisation={"s": 2.0}, **kw)
    with pytest.raises(ValueError, match="needs 'name'"):
        G.flip_point(map="attention", normalisation={"name": "scalable", "temp": 2.0}, **kw)
    with pytest.raises(ValueError, match="s applies only"):
        G.flip_point(map="attention", normalisation={"name": "softmax", "s": 2.0}, **kw)
    with pytest.raises(TypeError, match="normalisation must be a name"):
        G.flip_point(map="attention", normalisation=3, **kw)
    with pytest.raises(ValueError, match="map must be one of"):
        G.flip_point(map="sparsemax", **kw)
    X, W = ws.sample_X(5, 4, seed=0), ws.sample_W(4, seed=1)
    with pytest.raises(ValueError, match="normalisation must be one of"):
        G.attention_flip_model(X, W, "attention", 0)
    with pytest.raises(ValueError, match="normalisation must be one of"):
        G.attention_features(X[None], W, "rf")
    assert G.authors_lr_steps("attention", 7) == G.authors_lr_steps("raf", 7)
