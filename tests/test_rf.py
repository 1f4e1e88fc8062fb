"""The exact random-features estimator (wsutils.estimators.rf) against the dense-V definition."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import wsutils as ws
from wsutils.estimators.rf import (
    rf_certified_lower,
    rf_certified_upper,
    rf_high_probability_bound,
    rf_preactivation,
    rf_relative_change,
    rf_row_law,
    rf_weight_block,
    rf_word_sensitivity,
)

# Level of every two-sample Kolmogorov–Smirnov test below: a correct implementation fails one
# of them with probability 1e-3 per test, for a fixed set of seeds it either passes or not.
KS_LEVEL = 1e-3


def _unit(v):
    return v * (math.sqrt(v.shape[-1]) / torch.linalg.vector_norm(v))


def test_blocks_assemble_the_dense_V():
    n, d, k = 5, 3, 7
    X = ws.sample_X(n, d, seed=0)
    V = torch.cat([rf_weight_block(k, n, d, j, seed=4) for j in range(n)], dim=1)
    torch.testing.assert_close(rf_preactivation(X, k, seed=4), V @ ws.flat(X))
    Delta = _unit(torch.randn(d, dtype=torch.float64))
    u = V @ ws.flat(X)
    ours = float(rf_relative_change(u, V[:, 2 * d : 3 * d], Delta))
    np.testing.assert_allclose(
        ours, ws.relative_change(lambda Z: ws.rf(Z, V), X, 2, Delta), rtol=1e-12
    )


def test_reduced_law_matches_dense_V_at_a_fixed_Delta():
    """Same law: the relative change at one fixed Δ, over 400 seeds of each construction."""
    n, d, k = 6, 4, 16
    X = ws.sample_X(n, d, seed=1)
    Delta = _unit(torch.ones(d, dtype=torch.float64))
    ours, dense = [], []
    for s in range(400):
        u, Vi = rf_row_law(X, k, 0, seed=s)
        ours.append(float(rf_relative_change(u, Vi, Delta)))
        V = ws.sample_V(k, n, d, seed=10_000 + s)
        dense.append(ws.relative_change(lambda Z: ws.rf(Z, V), X, 0, Delta))
    # φ(X) = 0 (all units off, probability 2^-16 per draw) leaves the change undefined in both
    ours, dense = np.array(ours), np.array(dense)
    assert stats.ks_2samp(ours[np.isfinite(ours)], dense[np.isfinite(dense)]).pvalue > KS_LEVEL


def test_estimator_agrees_in_law_with_generic_estimator_on_dense_V():
    """S (row 0) from rf_word_sensitivity vs ws.word_sensitivity on a dense V, 60 seeds each."""
    n, d, k = 6, 4, 24
    X = ws.sample_X(n, d, seed=2)
    ours, dense = [], []
    for s in range(60):
        ours.append(rf_word_sensitivity(X, k, rows=0, seed=s, starts=4, steps=30).value)
        V = ws.sample_V(k, n, d, seed=20_000 + s)
        dense.append(
            ws.word_sensitivity(
                lambda Z: ws.rf(Z, V), X, rows=0, starts=6, steps=60, lr=0.5, seed=s
            ).value
        )
    ours, dense = np.array(ours), np.array(dense)
    assert stats.ks_2samp(ours, dense).pvalue > KS_LEVEL
    se = math.sqrt(ours.var() / len(ours) + dense.var() / len(dense))
    assert abs(ours.mean() - dense.mean()) < 4 * se


def test_blocks_mode_on_the_same_V_matches_the_generic_estimator():
    n, d, k = 5, 4, 20
    X = ws.sample_X(n, d, seed=3)
    V = torch.cat([rf_weight_block(k, n, d, j, seed=7) for j in range(n)], dim=1)
    ours = rf_word_sensitivity(X, k, rows=None, seed=7, starts=4, steps=60)
    dense = ws.word_sensitivity(lambda Z: ws.rf(Z, V), X, starts=8, steps=200, seed=0)
    assert ours.mode == "blocks" and set(ours.per_row) == set(range(n))
    # both are certified lower bounds on the same sup; each search should get within 2 %
    assert ours.value >= 0.98 * dense.value and dense.value >= 0.98 * ours.value
    assert ours.lower <= ours.value <= ours.upper
    np.testing.assert_allclose(
        ws.relative_change(lambda Z: ws.rf(Z, V), X, ours.row, ours.Delta), ours.value, rtol=1e-10
    )


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 12), d=st.integers(1, 8), k=st.integers(2, 60), seed=st.integers(0, 10**6))
def test_upper_bound_holds_for_random_Delta(n, d, k, seed):
    X = ws.sample_X(n, d, seed=seed)
    u, Vi = rf_row_law(X, k, n - 1, seed=seed + 1)
    if not bool((u > 0).any()):
        return
    upper = rf_certified_upper(u, Vi)
    g = torch.Generator().manual_seed(seed)
    Delta = torch.randn(64, d, generator=g, dtype=torch.float64)
    Delta *= (
        math.sqrt(d)
        * torch.rand(64, 1, generator=g, dtype=torch.float64)
        / torch.linalg.vector_norm(Delta, dim=1, keepdim=True)
    )
    assert float(rf_relative_change(u, Vi, Delta).max()) <= upper * (1 + 1e-12)


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 12), d=st.integers(1, 8), k=st.integers(2, 60), seed=st.integers(0, 10**6))
def test_explicit_Delta_attains_its_lower_bound(n, d, k, seed):
    X = ws.sample_X(n, d, seed=seed)
    u, Vi = rf_row_law(X, k, 0, seed=seed + 1)
    if not bool((u > 0).any()):
        return
    lower, Delta = rf_certified_lower(u, Vi)
    assert float(torch.linalg.vector_norm(Delta)) <= math.sqrt(d)
    assert float(rf_relative_change(u, Vi, Delta)) >= lower * (1 - 1e-10)
    assert lower <= rf_certified_upper(u, Vi) * (1 + 1e-12)


def test_result_is_recomputable_and_seeded():
    n, d = 8, 6
    X = ws.sample_X(n, d, seed=5)
    a = rf_word_sensitivity(X, n * d, rows=3, seed=11)
    b = rf_word_sensitivity(X, n * d, rows=3, seed=11)
    assert a.value == b.value and np.array_equal(a.Delta, b.Delta)
    assert a.mode == "reduced" and a.row == 3 and isinstance(a, ws.SensitivityResult)
    u, Vi = rf_row_law(X, n * d, 3, seed=11)
    np.testing.assert_allclose(
        float(rf_relative_change(u, Vi, torch.as_tensor(a.Delta))), a.value, rtol=1e-12
    )
    assert a.lower <= a.value <= a.upper
    assert np.linalg.norm(a.Delta) <= math.sqrt(d)


def test_high_probability_bound_covers_draws():
    n, d, k = 10, 8, 80
    X = ws.sample_X(n, d, seed=6)
    C = rf_high_probability_bound(n, d, k, 0.05)
    uppers = [rf_word_sensitivity(X, k, rows=0, seed=s, steps=0).upper for s in range(50)]
    assert max(uppers) <= C
    assert rf_high_probability_bound(n, d, 4, 0.05) == math.inf


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(k=0), "k"),
        (dict(rows=9), "out of range"),
        (dict(mode="dense"), "mode"),
        (dict(rows=[0, 1], mode="reduced"), "single row"),
        (dict(starts=0), "starts"),
    ],
)
def test_bad_input(kwargs, match):
    X = ws.sample_X(4, 3, seed=0)
    args = {"k": 12, **kwargs}
    with pytest.raises(ValueError, match=match):
        rf_word_sensitivity(X, **args)


def test_bad_input_rows_not_normalised_and_delta():
    with pytest.raises(ValueError, match="normalise_rows"):
        rf_word_sensitivity(torch.ones(3, 2) * 5, 6)
    with pytest.raises(ValueError, match="delta"):
        rf_high_probability_bound(3, 2, 6, 1.5)


@pytest.mark.parametrize("mode, rows", [("reduced", 0), ("blocks", None)])
def test_float32_search_matches_the_float64_search(mode, rows):
    """The ascent runs in float32 by default; the reported value is recomputed in float64 at
    the proposed Δ, so it is exact for that Δ and the search itself loses next to nothing."""
    X = ws.sample_X(12, 16, seed=5)
    k = 12 * 16
    r32 = rf_word_sensitivity(X, k, rows=rows, seed=9, mode=mode, steps=40)
    r64 = rf_word_sensitivity(X, k, rows=rows, seed=9, mode=mode, steps=40, dtype=None)
    assert r32.lower == r64.lower and r32.upper == r64.upper  # bounds: float64 both
    assert r32.lower <= r32.value <= r32.upper
    np.testing.assert_allclose(r32.value, r64.value, rtol=1e-5)
    if mode == "blocks":  # the value is the dense map's relative change at the returned Δ
        V = torch.cat([rf_weight_block(k, 12, 16, j, seed=9) for j in range(12)], dim=1)
        np.testing.assert_allclose(
            ws.relative_change(lambda Z: ws.rf(Z, V), X, r32.row, r32.Delta), r32.value, rtol=1e-12
        )


def test_relative_change_is_float64_for_float32_blocks():
    n, d, k = 6, 5, 40
    X = ws.sample_X(n, d, seed=2)
    u = rf_preactivation(X, k, seed=3)
    V32 = rf_weight_block(k, n, d, 1, seed=3, dtype=torch.float32)
    Delta = torch.randn(3, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    out = rf_relative_change(u, V32, Delta)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, rf_relative_change(u, V32.double(), Delta), rtol=0, atol=0)


@pytest.mark.parametrize("mode, rows", [("reduced", 0), ("blocks", [0, 3])])
def test_upper_false_skips_only_the_upper_certificate(mode, rows):
    X = ws.sample_X(10, 8, seed=4)
    full = rf_word_sensitivity(X, 80, rows=rows, seed=3, mode=mode, steps=20)
    light = rf_word_sensitivity(X, 80, rows=rows, seed=3, mode=mode, steps=20, upper=False)
    assert light.upper is None and light.per_row_upper == {}
    assert (light.value, light.lower, light.row) == (full.value, full.lower, full.row)
    assert np.array_equal(light.Delta, full.Delta) and light.per_row == full.per_row


def test_stop_rule_ends_the_search_where_it_says():
    """``stop=(m, rtol)`` with a tolerance every step meets ends the search at step ``m``: the
    same result as ``steps=m``; ``stop=None`` is the default; the value stays the float64
    relative change at the returned Δ."""
    X = ws.sample_X(12, 10, seed=7)
    k = 120
    for m in (1, 3):
        early = rf_word_sensitivity(X, k, rows=2, seed=5, steps=40, stop=(m, 10.0))
        short = rf_word_sensitivity(X, k, rows=2, seed=5, steps=m)
        assert early.value == short.value and np.array_equal(early.Delta, short.Delta)
    default = rf_word_sensitivity(X, k, rows=2, seed=5, steps=40)
    assert rf_word_sensitivity(X, k, rows=2, seed=5, steps=40, stop=None).value == default.value
    never = rf_word_sensitivity(X, k, rows=2, seed=5, steps=40, stop=(40, 0.0))
    assert never.value == default.value  # the window never fits: all 40 steps
    u, Vi = rf_row_law(X, k, 2, seed=5)
    np.testing.assert_allclose(
        float(rf_relative_change(u, Vi, torch.as_tensor(early.Delta))), early.value, rtol=1e-12
    )


@pytest.mark.parametrize(
    "stop", [(0, 1e-4), (10, -1.0), (10, math.nan), "10", (10,), (2.5, 1e-4), (10, True)]
)
def test_bad_stop_is_refused(stop):
    with pytest.raises((ValueError, TypeError), match="stop"):
        rf_word_sensitivity(ws.sample_X(4, 3, seed=0), 12, stop=stop)
