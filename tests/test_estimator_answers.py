"""No silent wrong answer from the estimators and maps: each returns a value it can justify
(recomputed from its Δ in float64, Δ in the ball exactly) or raises a ValueError/TypeError
that says why."""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from justified import assert_justified, stochastic_upper
from test_ball import assert_in_ball

import wsutils as ws
from wsutils.estimators import objectives as ob
from wsutils.estimators import self_attention as at
from wsutils.estimators import takeover as tk
from wsutils.estimators.drf import _draw_law, drf_row_sensitivity
from wsutils.estimators.rf import rf_relative_change, rf_row_law
from wsutils.maps import Normalisation, attention_scores
from wsutils.sensitivity import cosine_ascent, perturb, search_dtype
from wsutils.text.embeddings import sample_matrix

MAPS = {"raf": ws.raf, "relu": ws.relu_attention}


# --- issue 14 item 1: the fast attention update at every score scale -------------------------


def _full_change64(kind, X, W, row, Delta):
    return ws.relative_change(lambda Z: MAPS[kind](Z, W), X, row, Delta)


@pytest.mark.parametrize("kind", ("raf", "relu"))
def test_fast_update_matches_full_map_at_every_score_scale(kind):
    """The O(n·d) objective against the full map, in float64, for W scaled from 0.01 to 1e6
    (spread of scores up to ~1e7: one key takes all the weight, exp underflows to 0).

    Error model: both sides round every score ``s`` with an absolute error ``≲ d·|s|·u``
    (``u = 1.1e-16``), which moves each softmax weight by that much relatively; everything
    else is a sum of ``O(n + d)`` bounded terms. So the two agree to an absolute
    ``≈ 4·(n + d)·max(1, max|s|)·u``; the fast update is held to 100 times that."""
    n, d = 7, 12
    X = ws.sample_X(n, d, seed=3)
    g = torch.Generator().manual_seed(5)
    Deltas = torch.randn(3 * n, d, generator=g, dtype=torch.float64)
    Deltas = ws.sensitivity.project_ball(
        Deltas
        * (math.sqrt(d) / Deltas.norm(dim=1, keepdim=True))
        * torch.linspace(0.05, 1, 3 * n, dtype=torch.float64)[:, None],
        math.sqrt(d),
    )
    rows = torch.arange(3 * n) % n
    for scale in [0.01, 1, 10, 30, 100, 1e3, 1e4, 1e6]:
        W = ws.sample_W(d, seed=4) * scale
        obj = ob.fast_objective(X, W, Normalisation.parse(kind))
        fast = obj(rows, Deltas)
        smax = float(attention_scores(X, W).abs().max())
        tol = 100 * 4 * (n + d) * max(1.0, smax) * 1.1e-16
        for b in range(len(rows)):
            full = _full_change64(kind, X, W, int(rows[b]), Deltas[b])
            assert abs(float(fast[b]) - full) <= tol, (scale, b, float(fast[b]), full)


@pytest.mark.parametrize("scale", [1, 30, 300, 1e4])
def test_fast_and_generic_answers_are_each_justified_at_every_score_scale(scale):
    """Issue 14 item 1: at W·30 the fast estimator reported per-row values of 1e78 and inf
    and found 0.45 where the generic search found 1.57. Issue 23 item 13: the two searches
    are different floating-point computations, so they need not follow one ascent path (at
    W·30 they part on some CPUs and not on others). What holds on every machine is asserted
    for each answer on its own: every per-row value is the float64 relative change at its
    own Δ in the ball, and it lies in the certified bracket ``[certified_lower_bound,
    3√(nd)/‖φ(X)‖]``: each search starts from every row's take-over constructions too and
    keeps its best iterate, so it ends at or above the best of them (up to the fast update's
    rounding, bounded as in ``test_fast_update_matches_full_map_at_every_score_scale``)."""
    n, d = 8, 16
    X = ws.sample_X(n, d, seed=0)
    W = ws.sample_W(d, seed=1) * scale
    upper = stochastic_upper(X, ws.raf(X, W))
    tol = 100 * 4 * (n + d) * max(1.0, float(attention_scores(X, W).abs().max())) * 1.1e-16
    # every row's take-over constructions, as extra starts of every row's search
    cands = torch.cat([tk.takeover_candidates(X, W, r) for r in range(n)])
    lower = {r: tk.certified_lower_bound(X, W, r) for r in range(n)}
    fast = at.attention_word_sensitivity(X, W, init=cands, steps=30, starts=3, seed=0)
    gen = ws.word_sensitivity(lambda Z: ws.raf(Z, W), X, init=cands, steps=30, starts=3, seed=0)
    for res in (fast, gen):
        assert_justified(res, lambda Z: ws.raf(Z, W), X, lower=lower, upper=upper, tol=2 * tol)


def test_fast_and_generic_agree_at_a_converged_maximum():
    """Issue 23 item 13: agreement between the two code paths is asserted where it does not
    depend on the path. After 300 steps at W·1 each answer is a converged local maximum of
    the *other* code path's objective: 50 further small steps of the other objective from it
    gain less than 1e-8 relatively (measured: < 1e-11; at W·30, 300 steps are not enough,
    the gain is 2e-3, so that scale is not asserted here). And each answer's value is the
    other code path's objective at its Δ, to 1e-9 (issue 32: the old check ran only where the
    two Δ already agreed, so it could assert nothing)."""
    n, d = 8, 16
    X = ws.sample_X(n, d, seed=0)
    W = ws.sample_W(d, seed=1)
    fast = at.attention_word_sensitivity(X, W, steps=300, starts=3, seed=0)
    gen = ws.word_sensitivity(lambda Z: ws.raf(Z, W), X, steps=300, starts=3, seed=0)
    rows = torch.arange(n)
    base = ws.raf(X, W)
    obj = ob.fast_objective(X, W, Normalisation.parse("raf"))
    objectives = {
        "fast": lambda D: obj(rows, D),
        "full": lambda D: (
            (ws.raf(perturb(X, rows, D), W) - base).flatten(1).norm(dim=1) / base.norm()
        ),
    }
    for res, other in ((fast, "full"), (gen, "fast")):
        D = torch.as_tensor(np.stack([res.per_row_Delta[r] for r in range(n)]))
        v = np.array([res.per_row[r] for r in range(n)])
        polished, _ = cosine_ascent(objectives[other], D.clone(), math.sqrt(d), steps=50, lr=1e-3)
        assert np.all(polished.numpy() <= v * (1 + 1e-8)), (other, polished.numpy() - v)
    # each reports the value it attained: the other implementation, read at its Δ, agrees
    # (the two objectives compute the same function, so only rounding separates them)
    for res, other in ((fast, "full"), (gen, "fast")):
        D = torch.as_tensor(np.stack([res.per_row_Delta[r] for r in range(n)]))
        v = np.array([res.per_row[r] for r in range(n)])
        np.testing.assert_allclose(objectives[other](D).numpy(), v, rtol=1e-9)


def test_relu_attention_is_scale_invariant_even_for_huge_W():
    """Issue 14 item 2: ReLU attention with a huge W returned 0.0. rownorm(ReLU(c·s)) does not
    depend on c > 0, so the estimate at 1e160·W equals the one at W."""
    X = ws.sample_X(6, 8, seed=0)
    W = ws.sample_W(8, seed=1)
    a = at.attention_word_sensitivity(X, W, normalisation="relu", steps=10, starts=2, seed=0)
    b = at.attention_word_sensitivity(
        X, W * 1e160, normalisation="relu", steps=10, starts=2, seed=0
    )
    np.testing.assert_allclose(b.value, a.value, rtol=1e-12)
    np.testing.assert_allclose(
        ws.relu_attention(X, W * 1e300), ws.relu_attention(X, W), rtol=1e-13
    )


# --- issue 14 item 2: nonsense instead of an error ---------------------------------------------


def test_nan_map_is_an_error():
    X = ws.sample_X(4, 3, seed=0)
    with pytest.raises(ValueError, match="non-finite"):
        ws.word_sensitivity(lambda Z: Z * math.nan, X, steps=2, starts=1)
    # NaN only away from X: every iterate of every row is NaN
    with pytest.raises(ValueError, match="non-finite"):
        ws.word_sensitivity(
            lambda Z: torch.where((Z - X).abs().sum() > 0, Z * math.nan, Z), X, steps=2, starts=1
        )


def test_drf_with_no_active_unit_is_an_error():
    X = ws.sample_X(3, 4, seed=0)
    seed = next(s for s in range(100) if float(torch.relu(_draw_law(X, 1, 1, 0, s)[0]).sum()) == 0)
    with pytest.raises(ValueError, match="no unit"):
        drf_row_sensitivity(X, 1, 1, seed=seed, search=dict(steps=2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_attention_maps_never_return_nan_in_low_precision(dtype):
    X = ws.sample_X(5, 8, seed=0)
    W = ws.sample_W(8, seed=1)
    # scores far beyond float16's 65504 but within float32: computed in float32
    big = (W * 1e4).to(dtype)
    for fn in (ws.raf, ws.relu_attention):
        out = fn(X.to(dtype), big)
        assert out.dtype == dtype and bool(torch.isfinite(out).all())
        ref = fn(X.to(dtype).double(), big.double())
        np.testing.assert_allclose(out.double(), ref, atol=4 * torch.finfo(dtype).eps * 3)
    # scores beyond float32's range: ReLU attention still exact, softmax refused with a reason
    huge = (W * 1e38).to(torch.float32)
    assert bool(torch.isfinite(huge).all())
    assert not bool(torch.isfinite(attention_scores(X.float(), huge)).all())
    assert bool(torch.isfinite(ws.relu_attention(X.float(), huge)).all())
    with pytest.raises(ValueError, match="overflow"):
        ws.raf(X.float(), huge)


def test_sample_matrix_refuses_nan_and_handles_huge_rows():
    E = np.ones((4, 6)) * 1e200
    np.testing.assert_allclose(sample_matrix(E, 3, 4), np.ones((3, 4)), rtol=1e-15)
    E[1, 2] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        sample_matrix(E, 3, 4)


# --- issue 14 items 6 and 8: silent coercion and misleading messages --------------------------


def test_no_silent_coercion():
    X = ws.sample_X(4, 3, seed=0)
    W = ws.sample_W(3, seed=1)
    phi = lambda Z: ws.raf(Z, W)  # noqa: E731
    with pytest.raises(TypeError, match="boolean mask"):
        ws.word_sensitivity(phi, X, rows=np.array([True, False, True, False]), steps=1)
    with pytest.raises(TypeError, match="boolean mask"):
        at.attention_word_sensitivity(X, W, rows=[True, False, False, True], steps=1)
    with pytest.raises(TypeError, match="integer"):
        ws.word_sensitivity(phi, X, rows=1.9, steps=1)
    with pytest.raises(TypeError, match="integer"):
        ws.word_sensitivity(phi, X, steps=2.5)
    with pytest.raises(TypeError, match="complex"):
        ws.raf(X.numpy() + 1j, W)
    with pytest.raises(TypeError, match="complex"):
        ws.word_sensitivity(phi, X.to(torch.complex128), steps=1)
    with pytest.raises(ValueError, match="init must be one perturbation"):
        ws.word_sensitivity(phi, X, init=np.zeros(6), steps=1)
    with pytest.raises(ValueError, match="lr must be a finite positive number"):
        ws.word_sensitivity(phi, X, lr=math.nan, steps=1)
    with pytest.raises(ValueError, match="lr must be"):
        at.attention_word_sensitivity(X, W, lr=-1.0, steps=1)


def test_float16_values_are_float64_relative_changes():
    """Issue 14 item 6: float16 input reported a 'certified' value up to 0.14 % above the true
    relative change. Values are now the float64 relative change at the returned Δ."""
    X = ws.sample_X(6, 8, seed=2).to(torch.float16)
    W = ws.sample_W(8, seed=3).to(torch.float16)
    phi = lambda Z: ws.raf(Z, W)  # noqa: E731
    for r in (
        ws.word_sensitivity(phi, X, steps=20, starts=2, seed=0),
        at.attention_word_sensitivity(X, W, steps=20, starts=2, seed=0),
    ):
        assert r.Delta.dtype == np.float64
        for row, value in r.per_row.items():
            exact = ws.relative_change(phi, X, row, r.per_row_Delta[row])
            np.testing.assert_allclose(value, exact, rtol=1e-12)
    cert = tk.certified_lower_bound(X, W, 0)
    best = max(
        ws.relative_change(phi, X, 0, D) for D in tk.takeover_candidates(X.double(), W.double(), 0)
    )
    np.testing.assert_allclose(cert, best, rtol=1e-12)


# --- the property test: every public estimator, random shapes, dtypes and score scales ---------


def _justified(value, Delta, d, recompute):
    assert math.isfinite(value) and value >= 0
    assert_in_ball(Delta, d)
    np.testing.assert_allclose(value, recompute(Delta), rtol=1e-10, atol=1e-14)


@settings(
    max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    n=st.integers(1, 5),
    d=st.integers(1, 10),
    seed=st.integers(0, 10**6),
    dtype=st.sampled_from([torch.float64, torch.float32, torch.float16]),
    scale=st.sampled_from([1e-3, 1.0, 30.0, 1e3, 1e6]),
    which=st.sampled_from(["generic", "raf", "relu", "certified", "takeover", "drf", "rf"]),
)
def test_every_estimator_returns_a_justified_value_or_refuses(n, d, seed, dtype, scale, which):
    X = ws.sample_X(n, d, seed=seed).to(dtype)
    W = (ws.sample_W(d, seed=seed + 1) * scale).to(dtype)
    X64, W64 = X.double(), W.double()
    row = seed % n
    full = {k: (lambda Z, f=f: f(Z, W64)) for k, f in MAPS.items()}
    try:
        if which == "generic":
            r = ws.word_sensitivity(lambda Z: ws.raf(Z, W), X, steps=4, starts=2, seed=seed)
            for i, v in r.per_row.items():
                _justified(
                    v, r.per_row_Delta[i], d, lambda D: ws.relative_change(full["raf"], X64, i, D)
                )
        elif which in ("raf", "relu"):
            r = at.attention_word_sensitivity(
                X, W, normalisation=which, steps=4, starts=2, seed=seed, takeovers=bool(seed % 2)
            )
            for i, v in r.per_row.items():
                _justified(
                    v, r.per_row_Delta[i], d, lambda D: ws.relative_change(full[which], X64, i, D)
                )
        elif which == "certified":
            v = tk.certified_lower_bound(X, W, row, normalisation="relu" if seed % 2 else "raf")
            assert math.isfinite(v) and v >= 0
        elif which == "takeover":
            for D in (tk.row_takeover(X, W, row), tk.takeover_candidates(X, W, row)):
                assert_in_ball(D, d)
        elif which == "drf":
            v, D = drf_row_sensitivity(X, 2, 8, row=row, seed=seed, search=dict(starts=2, steps=4))
            b, A, Vs = _draw_law(X64, 2, 8, row, seed)
            base = torch.relu(torch.relu(b) @ Vs[0].T)
            out = torch.relu(torch.relu(b + A @ torch.as_tensor(D)) @ Vs[0].T)
            _justified(v, D, d, lambda D: float((out - base).norm() / base.norm()))
        else:
            r = ws.rf_word_sensitivity(X, 4 * n * d, rows=row, seed=seed, starts=2, steps=4)
            u, Vi = rf_row_law(X.to(search_dtype(X.dtype)), 4 * n * d, row, seed=seed)
            _justified(
                r.value,
                r.Delta,
                d,
                lambda D: float(rf_relative_change(u, Vi, torch.as_tensor(D)[None])[0]),
            )
    except (ValueError, TypeError) as e:
        assert len(str(e)) > 20, f"unhelpful message: {e!r}"
