"""The settings of a search (wsutils.search.Search): checked once when made, one parser for
a Search, a dict or keywords, and the same numbers whichever way the settings are given."""

import math

import numpy as np
import pytest
import torch

import wsutils as ws
from wsutils.estimators import attention as at
from wsutils.search import Search, precision
from wsutils.trained import own_norm_word_sensitivity


def test_defaults_and_fields_are_checked_when_made():
    s = Search()
    assert (s.starts, s.steps, s.lr, s.seed, s.dtype) == (8, 200, 0.5, 0, None)
    assert Search(dtype=torch.float32).dtype == "float32" == Search(dtype="torch.float32").dtype
    for bad, err in [
        (dict(starts=0), ValueError),
        (dict(steps=-1), ValueError),
        (dict(starts=2.0), TypeError),
        (dict(lr=math.nan), ValueError),
        (dict(lr=0.0), ValueError),
        (dict(seed=-1), ValueError),
        (dict(dtype="float16"), ValueError),
        (dict(max_batch_elements=0), ValueError),
    ]:
        with pytest.raises(err):
            Search(**bad)
    with pytest.raises(AttributeError):
        s.steps = 3  # frozen
    with pytest.raises(ValueError, match="^dtype must be"):
        Search(dtype=torch.float16)
    with pytest.raises(ValueError, match="^search_dtype must be"):  # names its parameter
        precision("half", name="search_dtype")
    assert precision(torch.float64) == "float64" and precision(None) is None


def test_parse_reads_a_search_a_dict_or_keywords():
    base = Search(starts=3, steps=7)
    assert Search.parse(None) == Search()
    assert Search.parse(base) is base
    assert Search.parse(base, seed=5) == Search(starts=3, steps=7, seed=5)
    assert Search.parse({"starts": 3, "steps": 7}) == base
    assert Search.parse({"starts": 3}, steps=7) == base
    with pytest.raises(TypeError, match="unknown search setting"):
        Search.parse(None, search_dtype="float32")
    with pytest.raises(TypeError, match="unknown search setting"):
        Search.parse({"step": 3})
    with pytest.raises(TypeError, match="must be a wsutils.search.Search"):
        Search.parse(3)


def test_keywords_and_a_search_give_the_same_numbers():
    X, W = ws.sample_X(6, 8, seed=1), ws.sample_W(8, seed=2)
    s = Search(starts=3, steps=12, seed=4, lr=0.3)
    phi = lambda Z: ws.raf(Z, W)  # noqa: E731
    a = ws.word_sensitivity(phi, X, search=s)
    b = ws.word_sensitivity(phi, X, starts=3, steps=12, seed=4, lr=0.3)
    assert a.value == b.value and a.row == b.row
    assert (a.starts, a.steps, a.seed) == (3, 12, 4)
    c = at.attention_word_sensitivity(X, W, search=s)
    e = at.attention_word_sensitivity(X, W, search=Search(starts=3), steps=12, seed=4, lr=0.3)
    assert c.value == e.value
    f = own_norm_word_sensitivity(phi, X, search=s)  # s searches in X's own precision
    g = own_norm_word_sensitivity(phi, X, starts=3, steps=12, seed=4, lr=0.3, dtype=None)
    assert f.value == g.value


def test_a_float32_search_is_certified_in_float64():
    """``dtype="float32"`` runs the generic search on a rounded copy; the value is the
    float64 relative change at the returned Δ, which lies in the ball."""
    X, W = ws.sample_X(7, 16, seed=3), ws.sample_W(16, seed=4)
    phi = lambda Z: ws.relu_attention(Z, W)  # noqa: E731
    res = ws.word_sensitivity(phi, X, starts=2, steps=15, dtype="float32")
    for r, D in res.per_row_Delta.items():
        assert D.dtype == np.float64 and np.linalg.norm(D) <= math.sqrt(16)
        assert res.per_row[r] == pytest.approx(ws.relative_change(phi, X, r, D), rel=1e-12)
