"""The bracket as the estimators' answer (issue 60, part 3): ``upper`` beside the lower bound
wherever the library has a certificate, ``None`` where it has none."""

import math

import numpy as np
import pytest
import torch

import wsutils as ws
from wsutils.estimators.relu import relu_certified_upper
from wsutils.estimators.screen import screened_word_sensitivity
from wsutils.estimators.self_attention import attention_word_sensitivity
from wsutils.estimators.softmax_upper import softmax_certified_upper
from wsutils.estimators.upper import attention_certified_upper
from wsutils.maps import Normalisation, attention
from wsutils.tokenwise import TokenwiseMap, softmax_attention

CERTIFIED = ["raf", {"name": "softmax", "beta": 2.0}, "scalable", "relu"]
NONE = ["sparsemax", "entmax", "sigmoid", "hardmax"]


def text(n=12, d=8, seed=1):
    return ws.sample_X(n, d, seed=seed), ws.sample_W(d, seed=seed + 1)


@pytest.mark.parametrize("norm", CERTIFIED + [Normalisation("softmax", sink=2.0)])
@pytest.mark.parametrize("seed", [1, 5])
def test_each_searched_row_is_bracketed(norm, seed):
    X, W = text(seed=seed)
    r = attention_word_sensitivity(X, W, normalisation=norm, takeovers=True, steps=20)
    assert r.upper is not None and set(r.per_row_upper) == set(r.per_row)
    assert all(r.per_row[i] <= r.per_row_upper[i] for i in r.per_row)
    assert r.upper == max(r.per_row_upper.values()) and r.value <= r.upper
    assert f"∈ [{r.value:.6g}, {r.upper:.6g}]" in repr(r)


@pytest.mark.parametrize("norm", CERTIFIED)
def test_the_bound_holds_at_random_changes(norm):
    """Every row's bound lies above the exact change of many random Δ in the ball."""
    X, W = text(n=7, d=6, seed=3)
    r = attention_word_sensitivity(X, W, normalisation=norm, steps=0, starts=1)
    phi = Normalisation.parse(norm)
    base = attention(X[None].double(), W.double(), normalisation=phi)[0]
    g = torch.Generator().manual_seed(0)
    for i in range(7):
        D = torch.randn(200, 6, generator=g, dtype=torch.float64)
        D *= math.sqrt(6) * torch.rand(200, 1, generator=g, dtype=torch.float64) ** (1 / 6)
        D /= torch.clamp(D.norm(dim=1, keepdim=True) / math.sqrt(6), min=1.0)
        Xi = X.double().expand(200, 7, 6).clone()
        Xi[:, i] += D
        moved = attention(Xi, W.double(), normalisation=phi)
        change = (moved - base).flatten(1).norm(dim=1) / base.norm()
        assert float(change.max()) <= r.per_row_upper[i]


def test_the_bound_is_the_certificate_of_the_rows_searched():
    X, W = text()
    r = attention_word_sensitivity(X, W, rows=[2, 5], steps=10)
    np.testing.assert_allclose(
        [r.per_row_upper[2], r.per_row_upper[5]],
        softmax_certified_upper(X, W, rows=[2, 5]),
        rtol=1e-12,
    )
    relu = attention_word_sensitivity(X, W, normalisation="relu", rows=[4], steps=10)
    np.testing.assert_allclose(relu.upper, relu_certified_upper(X, W)[4], rtol=1e-12)


@pytest.mark.parametrize("norm", NONE)
def test_no_certificate_is_none(norm):
    X, W = text()
    r = attention_word_sensitivity(X, W, normalisation=norm, rows=[0, 1], steps=5)
    assert r.upper is None and r.per_row_upper == {}
    assert "lower bound" in repr(r)


def test_upper_false_changes_nothing_else():
    X, W = text()
    full = attention_word_sensitivity(X, W, rows=[0, 3], steps=10)
    light = attention_word_sensitivity(X, W, rows=[0, 3], steps=10, upper=False)
    assert light.upper is None and light.per_row_upper == {}
    assert light.per_row == full.per_row and np.array_equal(light.Delta, full.Delta)


def test_relu_off_its_conditions_has_none():
    X, W = text()
    assert attention_certified_upper(2 * X.double(), W.double(), [0], normalisation="relu") is None
    one = attention_certified_upper(X[:1].double(), W.double(), [0], normalisation="relu")
    assert one is None


def test_a_declared_softmax_map_is_bracketed_and_a_plain_one_is_not():
    X, W = text()
    phi = softmax_attention(W)
    r = ws.word_sensitivity(phi, X, starts=2, steps=20, seed=0)
    np.testing.assert_allclose(
        [r.per_row_upper[i] for i in range(12)], softmax_certified_upper(X, W), rtol=1e-12
    )
    assert r.value <= r.upper
    plain = ws.word_sensitivity(lambda Z: phi(Z), X, starts=2, steps=20, seed=0)
    assert plain.upper is None and math.isclose(plain.value, r.value, rel_tol=1e-6)


def test_the_screened_estimator_bounds_every_word():
    X, W = text(n=20)
    r = screened_word_sensitivity(X, W, screen=dict(keep=2), steps=10)
    assert len(r.per_row) == 2 and sorted(r.per_row_upper) == list(range(20))
    np.testing.assert_allclose(r.upper, softmax_certified_upper(X, W).max(), rtol=1e-12)
    assert r.value <= r.upper
    assert screened_word_sensitivity(X, W, screen=dict(keep=2), upper=False).upper is None


def test_a_certificate_below_a_value_found_is_refused():
    X, W = text()
    phi = softmax_attention(W)
    false = TokenwiseMap(phi.tokens, phi.mix, lambda X, rows: np.zeros(len(rows)))
    with pytest.raises(ValueError, match="does not bound this map"):
        ws.word_sensitivity(false, X, starts=1, steps=5)
    short = TokenwiseMap(phi.tokens, phi.mix, lambda X, rows: np.ones(1))
    with pytest.raises(ValueError, match="one bound per row"):
        ws.word_sensitivity(short, X, starts=1, steps=5)


def test_a_sinks_own_token_gets_no_bound():
    """prop-softmax-upper bounds words; the sink's token (row 0) is not one (the referee of
    issue 60 found changes above the old value there)."""
    X, W = text()
    sink = Normalisation("softmax", sink=6.0)
    U = softmax_certified_upper(X, W, normalisation=sink)
    assert U[0] == math.inf and np.isfinite(U[1:]).all()
    r = attention_word_sensitivity(X, W, normalisation=sink, rows=[0, 3], steps=10)
    assert r.upper is None and r.per_row_upper == {}  # no bracket with the sink's row in it
    words = attention_word_sensitivity(X, W, normalisation=sink, steps=10)  # words 1..n-1
    assert sorted(words.per_row_upper) == list(range(1, 12)) and words.value <= words.upper
    screened = screened_word_sensitivity(
        X, W, normalisation=sink, screen=dict(keep=2), steps=5, also=[0]
    )
    assert screened.upper is None and 0 in screened.per_row  # no error, no bracket


def test_screened_also_rows_are_bounded_too():
    X, W = text(n=20)
    r = screened_word_sensitivity(X, W, screen=dict(keep=1), steps=5, also=[7])
    assert 7 in r.per_row and sorted(r.per_row_upper) == list(range(20))


def test_a_declared_map_whose_weights_require_grad():
    X, W = text()
    phi = softmax_attention(torch.nn.Parameter(W.clone()))
    r = ws.word_sensitivity(phi, X, starts=1, steps=5)
    assert r.upper is not None and r.value <= r.upper
