"""The generic word-sensitivity estimator."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import wsutils as ws
from wsutils.sensitivity import perturb, project_ball


def test_zero_perturbation_gives_zero():
    X = ws.sample_X(5, 4, seed=0)
    W = ws.sample_W(4, seed=1)
    for fn in (ws.raf, ws.relu_attention):
        assert ws.relative_change(lambda Z: fn(Z, W), X, 2, torch.zeros(4)) == 0.0


def test_perturb_changes_one_row_only():
    X = ws.sample_X(5, 4, seed=0)
    Delta = torch.ones(2, 4)
    out = perturb(X, torch.tensor([1, 3]), Delta)
    torch.testing.assert_close(out[0, 1], X[1] + 1)
    torch.testing.assert_close(out[0, [0, 2, 3, 4]], X[[0, 2, 3, 4]])
    torch.testing.assert_close(out[1, 3], X[3] + 1)


@settings(max_examples=50, deadline=None)
@given(scale=st.floats(1e-3, 1e6), d=st.integers(1, 30), seed=st.integers(0, 10**6))
def test_projection_never_leaves_the_ball(scale, d, seed):
    g = torch.Generator().manual_seed(seed)
    Delta = torch.randn(16, d, generator=g, dtype=torch.float64) * scale
    r = math.sqrt(d)
    P = project_ball(Delta, r)
    assert bool((torch.linalg.vector_norm(P, dim=-1) <= r).all())
    inside = torch.linalg.vector_norm(Delta, dim=-1) <= r
    torch.testing.assert_close(P[inside], Delta[inside])


@pytest.mark.parametrize("fn", ["raf", "relu_attention", "rf"])
def test_estimator_stays_in_ball_and_value_is_recomputable(fn):
    n, d = 6, 5
    X = ws.sample_X(n, d, seed=0)
    w = ws.sample_V(n * d, n, d, seed=1) if fn == "rf" else ws.sample_W(d, seed=1)
    phi = lambda Z: getattr(ws, fn)(Z, w)  # noqa: E731
    res = ws.word_sensitivity(phi, X, steps=40, starts=3, seed=0)
    assert np.linalg.norm(res.Delta) <= math.sqrt(d)
    assert res.value == max(res.per_row.values())
    assert set(res.per_row) == set(range(n))
    np.testing.assert_allclose(
        ws.relative_change(phi, X, res.row, res.Delta), res.value, rtol=1e-10
    )
    np.testing.assert_allclose(
        res.phi_norm, float(torch.linalg.vector_norm(phi(X))), rtol=1e-12
    )  # the certification's denominator


def test_same_seed_same_result_and_rows_argument():
    X = ws.sample_X(6, 4, seed=0)
    W = ws.sample_W(4, seed=1)
    phi = lambda Z: ws.raf(Z, W)  # noqa: E731
    a = ws.word_sensitivity(phi, X, rows=[1, 4], steps=30, seed=5)
    b = ws.word_sensitivity(phi, X, rows=[1, 4], steps=30, seed=5)
    assert a.value == b.value and a.row == b.row and np.array_equal(a.Delta, b.Delta)
    assert set(a.per_row) == {1, 4}
    c = ws.word_sensitivity(phi, X, rows=2, steps=30, seed=5)
    assert c.row == 2


def test_best_iterate_kept_and_init_used():
    """With zero steps the estimator returns the best start; an init start is searched too."""
    n, d = 5, 4
    X = ws.sample_X(n, d, seed=0)
    W = ws.sample_W(d, seed=1)
    phi = lambda Z: ws.raf(Z, W)  # noqa: E731
    strong = ws.word_sensitivity(phi, X, rows=[0], steps=60, seed=0)
    seeded = ws.word_sensitivity(phi, X, rows=[0], steps=0, starts=1, seed=3, init=strong.Delta)
    assert seeded.value >= strong.value * (1 - 1e-12)


def test_unbatched_map_matches_batched():
    X = ws.sample_X(4, 3, seed=0)
    W = ws.sample_W(3, seed=1)
    a = ws.word_sensitivity(lambda Z: ws.raf(Z, W), X, steps=20, seed=1)
    b = ws.word_sensitivity(lambda Z: ws.raf(Z, W), X, steps=20, seed=1, batched=False)
    np.testing.assert_allclose(a.value, b.value, rtol=1e-10)


def test_chunking_does_not_change_the_answer():
    X = ws.sample_X(6, 4, seed=0)
    W = ws.sample_W(4, seed=1)
    phi = lambda Z: ws.raf(Z, W)  # noqa: E731
    one = ws.word_sensitivity(phi, X, steps=20, seed=2)
    many = ws.word_sensitivity(phi, X, steps=20, seed=2, max_batch_elements=1)
    assert one.per_row.keys() == many.per_row.keys()


# --- issue 54: a map of one's own gets a true value or a clear refusal -----------------------


def _centred_attention(W, d):
    """The reader's map of issue 54, written for one ``(n, d)`` text: it centres the words
    with a mean over axis 0, which on a batch ``(B, n, d)`` is a mean over the texts."""

    def phi(Z):
        Zc = Z - Z.mean(0)
        s = Zc @ W.to(Z.dtype) @ Zc.transpose(-1, -2) / math.sqrt(d)
        return torch.softmax(s, -1) @ Zc

    return phi


def test_a_map_that_mixes_the_batch_is_refused_and_searched_text_by_text():
    """Batched, the map would be searched and certified as another map (issue 54 measured
    27.06 reported where the map gives 1.02): it is refused with a message naming
    ``batched=False``; with ``batched=False`` the value is the map evaluated by hand on the
    single texts ``X`` and ``X_i(Δ)``. The two evaluations are the same map on the same
    texts; only the norms and the division are computed by two code paths, each within
    ``γ_{nd+2}`` relative (tests/rounding.py)."""
    from rounding import gamma

    n, d = 24, 32
    X, W = ws.sample_X(n, d, seed=0), ws.sample_W(d, seed=1)
    phi = _centred_attention(W, d)
    with pytest.raises(ValueError, match="mixes the texts of a batch.*batched=False"):
        ws.word_sensitivity(phi, X, seed=0, starts=4, steps=30)
    r = ws.word_sensitivity(phi, X, seed=0, starts=4, steps=30, batched=False)
    moved = X.clone()
    moved[r.row] += torch.as_tensor(r.Delta)
    by_hand = float(
        torch.linalg.vector_norm(phi(moved) - phi(X)) / torch.linalg.vector_norm(phi(X))
    )
    assert abs(r.value - by_hand) <= 2 * gamma(n * d + 2) * by_hand
    again = ws.relative_change(phi, X, r.row, r.Delta, batched=False)
    assert abs(again - by_hand) <= 2 * gamma(n * d + 2) * by_hand


@pytest.mark.parametrize(
    "make",
    [
        lambda W, d: lambda Z: Z / torch.linalg.vector_norm(Z),  # a norm over the batch
        lambda W, d: lambda Z: Z - Z.mean(0),  # a mean over the texts
        lambda W, d: lambda Z: Z.sum(0) + 0 * Z,  # the batch summed
    ],
)
def test_maps_that_mix_a_batch_are_refused(make):
    n, d = 6, 4
    X, W = ws.sample_X(n, d, seed=2), ws.sample_W(d, seed=3)
    with pytest.raises(ValueError, match="batched=False"):
        ws.word_sensitivity(make(W, d), X, seed=0, starts=2, steps=3)


def test_a_map_that_does_not_broadcast_is_refused_by_name():
    n, d = 6, 4
    X, W = ws.sample_X(n, d, seed=2), ws.sample_W(d, seed=3)

    def single(Z):  # written for one (n, d) text: Z.T is its transpose
        return torch.softmax(Z @ W.to(Z.dtype) @ Z.transpose(0, 1) / math.sqrt(d), -1) @ Z

    with pytest.raises(ValueError, match="failed on a batch of texts.*batched=False"):
        ws.word_sensitivity(single, X, seed=0, starts=2, steps=3)
    r = ws.word_sensitivity(single, X, seed=0, starts=2, steps=3, batched=False)
    assert math.isfinite(r.value)


def test_results_print_a_short_summary():
    X, W = ws.sample_X(6, 4, seed=0), ws.sample_W(4, seed=1)
    r = ws.word_sensitivity(lambda Z: ws.raf(Z, W), X, seed=0, starts=2, steps=3)
    text = repr(r)
    assert text.startswith("SensitivityResult(value=") and "\n" not in text and len(text) < 200
    assert text.endswith("ball ‖Δ‖ ≤ √d, lower bound)")  # issue 61, item 5
    rf = ws.rf_word_sensitivity(X, 24, steps=3)
    assert repr(rf).startswith("RFSensitivityResult(value=") and len(repr(rf)) < 200


def test_hidden_states_are_pointed_to_the_own_norm_ball():
    """Issue 61, item 5: rows of their own norms are refused with a hint that names the
    own-norm estimator (rescaling measures the map elsewhere), and its result says which ball
    it searched."""
    from wsutils.trained import own_norm_word_sensitivity

    X, W = ws.sample_X(6, 4, seed=0), ws.sample_W(4, seed=1)
    H = X * torch.linspace(1.5, 3.0, 6, dtype=X.dtype)[:, None]  # norms of their own
    with pytest.raises(ValueError, match="own_norm_word_sensitivity"):
        ws.word_sensitivity(lambda Z: ws.raf(Z, W), H, starts=1, steps=1)
    r = own_norm_word_sensitivity(lambda Z: ws.raf(Z, W), H, starts=1, steps=2, dtype=None)
    assert repr(r).endswith("ball ‖Δ‖ ≤ ‖x_i‖, lower bound)")


def test_progress_counts_steps(capsys):
    """``progress=True`` shows the steps taken (one chunk of rows can take minutes, so a
    bar over chunks would sit at 0/1)."""
    X, W = ws.sample_X(6, 4, seed=0), ws.sample_W(4, seed=1)
    ws.word_sensitivity(lambda Z: ws.raf(Z, W), X, seed=0, starts=2, steps=7, progress=True)
    err = capsys.readouterr().err
    assert "7/7" in err and "step" in err
