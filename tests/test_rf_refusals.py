"""Issue 14, items 4, 6, 7 and 8 for the random-features estimator
(wsutils.estimators.rf.rf_word_sensitivity): what it refuses at the door, and the dtype of
the input changes nothing."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import wsutils as ws
from wsutils.estimators.rf import (
    rf_block_seed,
    rf_preactivation,
    rf_relative_change,
    rf_row_law,
    rf_weight_block,
    rf_word_sensitivity,
)
from wsutils.run.device import DoesNotFit

n, d = 6, 4
K = n * d


@pytest.fixture(scope="module")
def X():
    return ws.sample_X(n, d, seed=0)


def test_a_requires_grad_input_is_estimated(X):
    """Today the search finishes and then fails in `.numpy()`."""
    Xg = X.clone().requires_grad_(True)
    for rows in (0, None):
        r = rf_word_sensitivity(Xg, K, rows=rows, seed=1, steps=5)
        ref = rf_word_sensitivity(X, K, rows=rows, seed=1, steps=5)
        assert r.value == ref.value and np.array_equal(r.Delta, ref.Delta)
    assert Xg.grad is None


@pytest.mark.parametrize("mode, rows", [("reduced", 2), ("blocks", None)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_low_precision_input_gives_the_numbers_of_its_float64_copy(X, mode, rows, dtype):
    """Certified values are float64 whatever the input dtype: a float16 text's value is the
    true relative change of that text (today up to 0.14 % above it), and the weights do not
    depend on the dtype (today float32/float16 input drew other weights in reduced mode)."""
    low = X.to(dtype)
    r = rf_word_sensitivity(low, K, rows=rows, seed=3, mode=mode, steps=8, check_norms=False)
    ref = rf_word_sensitivity(
        low.double(), K, rows=rows, seed=3, mode=mode, steps=8, check_norms=False
    )
    assert (r.value, r.lower, r.upper, r.row) == (ref.value, ref.lower, ref.upper, ref.row)
    assert r.Delta.dtype == np.float64 and np.array_equal(r.Delta, ref.Delta)
    if mode == "reduced":  # recomputed from the law's float64 draw at the returned Δ
        u, Vi = rf_row_law(low.double(), K, rows, seed=3)
        true = float(rf_relative_change(u, Vi, torch.as_tensor(r.Delta)))
    else:  # the dense map of the blocks-mode V on the float64 text
        V = torch.cat([rf_weight_block(K, n, d, j, seed=3) for j in range(n)], dim=1)
        true = float(ws.relative_change(lambda Z: ws.rf(Z, V), low.double(), r.row, r.Delta))
    assert r.value <= true * (1 + 1e-12)
    assert r.lower <= r.value <= r.upper


def test_rf_row_law_draws_from_the_seed_alone(X):
    u64, V64 = rf_row_law(X, K, 1, seed=5)
    u32, V32 = rf_row_law(X.float(), K, 1, seed=5)
    assert V32.dtype == torch.float64 and torch.equal(V32, V64)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(k=2.7), TypeError, "k .* must be an integer"),
        (dict(k=True), TypeError, "must be an integer"),
        (dict(seed=1.7), TypeError, "seed must be an integer"),
        (dict(seed=-1), ValueError, "seed must be in"),
        (dict(seed=-1, rows=None), ValueError, "seed must be in"),
        (dict(seed=2**64 - 1), ValueError, "seed must be in"),
        (dict(rows=1.9), TypeError, "rows must be an integer"),
        (dict(rows=[0, 1.5]), TypeError, r"rows\[1\] must be an integer"),
        (dict(rows=np.array([True, False, True, False, False, False])), TypeError, "boolean mask"),
        (dict(rows=[True, False]), TypeError, "boolean mask"),
        (dict(starts=2.5), TypeError, "starts must be an integer"),
        (dict(steps=3.0), TypeError, "steps must be an integer"),
        (dict(dtype="float16"), ValueError, "dtype must be"),
        (dict(dtype=np.float32), ValueError, "dtype must be"),
        (dict(search_dtype="float32"), TypeError, "unknown search setting"),
        (dict(lr=0.1), ValueError, "takes no lr"),
        (dict(max_batch_elements=7), ValueError, "takes no max_batch_elements"),
    ],
)
def test_coercions_are_refused(X, kwargs, error, match):
    """Today k=2.7, seed=1.7, rows=1.9 are truncated, seed=−1 works in reduced mode only
    (and draws the weights of 2**64 − 1), a boolean mask is read as indices."""
    args = {"k": K, "steps": 2, **kwargs}
    with pytest.raises(error, match=match):
        rf_word_sensitivity(X, **args)


def test_block_seeds_are_checked():
    with pytest.raises(ValueError, match="seed must be in"):
        rf_block_seed(-1, 0)
    with pytest.raises(TypeError, match="block must be an integer"):
        rf_block_seed(0, 1.5)


@pytest.mark.parametrize(
    "to_complex",
    [
        lambda X: X.numpy().astype(np.complex128),
        lambda X: X.to(torch.complex64),
    ],
)
def test_complex_input_is_refused(X, to_complex):
    """Today the imaginary part is dropped with a warning."""
    with pytest.raises(TypeError, match="complex"):
        rf_word_sensitivity(to_complex(X), K, steps=2)


@pytest.mark.parametrize("name", ["float32", "float64", "torch.float32"])
def test_search_dtype_accepts_its_name(X, name):
    """Today 'Invalid device string: float32'."""
    r = rf_word_sensitivity(X, K, steps=4, seed=2, dtype=name)
    dtype = getattr(torch, name.removeprefix("torch."))
    assert r.value == rf_word_sensitivity(X, K, steps=4, seed=2, dtype=dtype).value


def test_cuda_without_a_gpu_is_a_clear_error(X, monkeypatch):
    """Today an AssertionError ('Torch not compiled with CUDA enabled') on CPU-only torch."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="none is visible.*device='cpu'"):
        rf_word_sensitivity(X, K, device="cuda")


@pytest.mark.parametrize("rows", [0, None])
def test_a_width_that_cannot_fit_is_refused_before_allocating(X, rows):
    """Today k = 10**9 starts drawing a 10**9 × d block (or fails in the allocator)."""
    with pytest.raises(DoesNotFit, match=r"k = 1000000000.*needs about .* GiB.*smaller k"):
        rf_word_sensitivity(X, 10**9, rows=rows)


def test_the_estimate_is_checked_against_available_memory(X, monkeypatch):
    from wsutils.run import device

    monkeypatch.setattr(device, "available_memory", lambda device=None: 64 * 2**20)
    k = 2_000_000  # 2e6 × 4 × (8 + 4) bytes ≈ 0.09 GiB
    with pytest.raises(DoesNotFit, match="0.0625 GiB available"):
        rf_word_sensitivity(X, k)
    monkeypatch.setattr(device, "available_memory", lambda device=None: 2**40)
    rf_word_sensitivity(X, 30_000, steps=1)  # below the threshold: not even measured


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 6),
    d=st.integers(1, 5),
    k=st.integers(1, 40),
    dtype=st.sampled_from([torch.float16, torch.float32, torch.float64]),
    rows=st.sampled_from(["first", "all"]),
    scale=st.sampled_from([1e-3, 1.0, 1e3]),
    seed=st.integers(0, 2**63 - 2),
)
def test_the_estimator_returns_a_justified_value_or_a_clear_error(
    n, d, k, dtype, rows, scale, seed
):
    """Random shapes, dtypes, input scales and seeds: either a value recomputed from its Δ
    (within the ball, between the certified bounds) or a ValueError/TypeError."""
    X = (ws.sample_X(n, d, seed=seed % 1000) * scale).to(dtype)
    row_arg = 0 if rows == "first" else None
    try:
        r = rf_word_sensitivity(X, k, rows=row_arg, seed=seed, steps=3, check_norms=False)
    except (ValueError, TypeError) as err:
        assert str(err)
        return
    Xd = X.double()
    assert np.linalg.norm(r.Delta) <= math.sqrt(d)
    if r.mode == "reduced":
        u, Vi = rf_row_law(Xd, k, r.row, seed=seed)
    else:
        u = rf_preactivation(Xd, k, seed=seed)
        Vi = rf_weight_block(k, n, d, r.row, seed=seed)
    true = float(rf_relative_change(u, Vi, torch.as_tensor(r.Delta)))
    assert math.isfinite(r.value) and abs(r.value - true) <= 1e-12 * max(1.0, true)
    assert r.lower * (1 - 1e-12) <= r.value <= r.upper * (1 + 1e-12)
