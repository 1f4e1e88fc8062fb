"""Every word screened, the best few certified (wsutils.estimators.screen, issue 63)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import wsutils as ws
from tests.rounding import gamma
from wsutils.estimators.screen import Screen, screen_words, screened_word_sensitivity
from wsutils.estimators.self_attention import attention_word_sensitivity

SEARCH = dict(starts=2, steps=30, seed=0)


@pytest.mark.parametrize("normalisation, seed", [("raf", 1), ("raf", 2), ("sparsemax", 3)])
def test_screened_never_below_the_fixed_words_on_long_texts(normalisation, seed):
    """On random texts at n = 1000 the screened search (every word, the best 4 certified)
    returns at least what the same search over the fixed words 0 and 1 returns."""
    n, d = 1000, 16
    X, W = ws.sample_X(n, d, seed=seed), ws.sample_W(d, seed=seed + 1)
    fixed = attention_word_sensitivity(
        X, W, normalisation=normalisation, rows=[0, 1], takeovers=True, **SEARCH
    )
    res = screened_word_sensitivity(
        X, W, normalisation=normalisation, screen=dict(keep=4), **SEARCH
    )
    assert res.value >= fixed.value
    assert len(res.per_row) == 4 and res.row in res.per_row


def test_a_kept_word_gets_at_least_its_fixed_word_search():
    """A word the screen keeps is certified from the starts the fixed-word search gives it
    (its random starts seeded by the row, its constructions) plus the screened ones. With no
    steps each start is its own best iterate, so the kept word's value is at least the
    fixed-word search's, up to the rounding of two float64 certifications of the same Δ in
    different batches (γ of the map's n·d-long sums, twice). With steps, the same paths in
    other batch shapes may round apart, and no tolerance follows from the rounding."""
    n, d = 200, 16
    X, W = ws.sample_X(n, d, seed=4), ws.sample_W(d, seed=5)
    search = dict(SEARCH, steps=0)
    res = screened_word_sensitivity(X, W, screen=dict(keep=3), **search)
    for r, v in res.per_row.items():
        alone = attention_word_sensitivity(X, W, rows=[r], takeovers=True, **search)
        assert v >= alone.value * (1 - 2 * gamma(n * d))


def test_screen_words_ranks_every_word():
    n, d = 50, 8
    X, W = ws.sample_X(n, d, seed=6), ws.sample_W(d, seed=7)
    rows, values, Delta = screen_words(X, W, screen=Screen(starts=1, steps=5))
    assert rows == list(range(n)) and values.shape == (n,) and Delta.shape == (n, d)
    assert np.all(np.isfinite(values)) and np.all(values >= 0)
    assert float(torch.linalg.vector_norm(Delta, dim=1).max()) <= d**0.5


@pytest.mark.parametrize(
    "screen, err",
    [
        (dict(keep=0), ValueError),
        (dict(starts=0), ValueError),  # nothing to rank by
        (dict(starts=0, steps=5, constructions=True), ValueError),  # steps need starts
        (dict(constructions=1), TypeError),
        (dict(starts=1.5), TypeError),
        (dict(top=3), TypeError),
        ("fast", TypeError),
    ],
)
def test_bad_screens_are_refused(screen, err):
    with pytest.raises(err):
        Screen.parse(screen)


def test_grid_point_searches_every_word():
    """A grid point with rows='every' (the grids): the screened words and word 0 (where the
    take-over bound is computed) are certified, the value is bracketed by the certificate at
    them, which is at most the one over every word; and a screen without rows='every' is
    refused rather than ignored."""
    from wsutils.experiments.attention import sensitivity_point

    point = dict(normalisation="raf", d=16, n=60, seed=3, search=dict(starts=1, steps=5))
    r = sensitivity_point(**point, rows="every", screen=dict(keep=2))
    assert 0 in r["certified_rows"] and len(r["certified_rows"]) in (2, 3)  # keep, and word 0
    assert r["certified"] <= r["S"] * (1 + 1e-9)  # the constructions are starts
    assert r["S"] <= r["upper"] <= r["upper_all"]
    with pytest.raises(ValueError, match="rows='every'"):
        sensitivity_point(**point, rows=[0], screen=dict(keep=2))


def test_words_certified_whatever_the_screen_says():
    """`also`: word 0 certified beside the screen's best, never below the fixed-word search
    at word 0 with the same settings (its starts are a superset)."""
    n, d = 120, 16
    X, W = ws.sample_X(n, d, seed=8), ws.sample_W(d, seed=9)
    res = screened_word_sensitivity(X, W, screen=dict(keep=1), also=[0], **SEARCH)
    assert 0 in res.per_row and len(res.per_row) in (1, 2)
    fixed = attention_word_sensitivity(X, W, rows=[0], takeovers=True, **SEARCH)
    assert res.per_row[0] >= fixed.value * (1 - 2 * gamma(n * d))


@pytest.mark.parametrize("normalisation", ["raf", "sparsemax", "relu", "hardmax"])
def test_word_constructions_are_each_words_own(normalisation):
    """word_constructions builds every word's seven constructions at once: row i is the
    first seven rows of constructions(X, W, i), the six take-over candidates bit for bit (one
    function on the same inputs: they depend on the word only through the sign of uᵀx_i), the
    doubling x_i projected with every row at once rather than alone (to a few roundings)."""
    from wsutils.estimators.takeover import constructions, word_constructions
    from wsutils.maps import Normalisation

    n, d = 40, 8
    X, W = ws.sample_X(n, d, seed=10), ws.sample_W(d, seed=11)
    C = word_constructions(X, W)
    assert C.shape == (n, 7, d)
    norm = Normalisation.parse(normalisation)
    eps = torch.finfo(X.dtype).eps
    for i in range(n):
        alone = constructions(X, W, i, norm)[:7]
        assert torch.equal(C[i, :6], alone[:6])
        assert torch.allclose(C[i, 6], alone[6], rtol=4 * eps, atol=0)


@pytest.mark.parametrize("normalisation", ["raf", "sparsemax", "sigmoid", "relu"])
def test_construction_screen_values_are_the_objectives(normalisation):
    """A screen by the constructions alone ranks each word by the best of its seven
    constructions under the fast objective (each value recomputed here with the full map,
    in the screen's float32 against float64: a loose match), and adding the constructions to
    a search's screen never lowers a word's screened value (the larger of the two)."""
    from wsutils.estimators.takeover import word_constructions
    from wsutils.sensitivity import relative_changes

    n, d = 30, 8
    X, W = ws.sample_X(n, d, seed=12), ws.sample_W(d, seed=13)
    only = Screen(starts=0, steps=0, constructions=True)
    rows, v, Delta = screen_words(X, W, normalisation=normalisation, screen=only)
    C = word_constructions(X, W)
    norm = ws.maps.Normalisation.parse(normalisation)
    phi = lambda Y: ws.maps.general_attention(Y, W, norm)  # noqa: E731
    for i in (0, 7, 29):
        full = relative_changes(phi, X, [i] * 7, C[i]).max()
        assert abs(v[i] / float(full) - 1) < 1e-4
    _, searched, _ = screen_words(X, W, normalisation=normalisation, screen=Screen(steps=5))
    _, both, _ = screen_words(
        X, W, normalisation=normalisation, screen=Screen(steps=5, constructions=True)
    )
    assert np.all(both >= np.maximum(v, searched))
