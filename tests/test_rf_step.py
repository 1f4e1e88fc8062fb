"""The compiled random-features step (:mod:`wsutils.estimators._rf_step`) against the BLAS
products it replaces: one evaluation (value and gradient) of the same ``Δ``, in the two
dtypes. The two sum in different orders, so they agree to rounding, not bit for bit."""

import contextlib

import pytest
import torch

from wsutils.estimators import _rf_step
from wsutils.estimators.rf import _blocked_objective, _relative_change_objective

pytest.importorskip("numba")

TOL = {torch.float32: 1e-4, torch.float64: 1e-10}


def _problem(dtype, k=3000, d=48, B=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    Vi = torch.randn(k, d, generator=g, dtype=torch.float64).to(dtype)
    u = torch.randn(k, generator=g, dtype=torch.float64).to(dtype)
    Delta = torch.randn(B, d, generator=g, dtype=torch.float64).to(dtype)
    base = torch.relu(u)
    return u, Vi, base, torch.linalg.vector_norm(base), Delta


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_step_matches_the_blas_products(dtype):
    u, Vi, base, norm, Delta = _problem(dtype)
    with _one_thread():
        assert _rf_step.usable(Vi)
        vals, grad = _rf_step.objective(u, Vi, base, norm)(Delta)
    ref_vals, ref_grad = _blocked_objective(u, Vi, base, norm)(Delta)
    assert vals.dtype == grad().dtype == dtype and grad().shape == Delta.shape
    torch.testing.assert_close(vals, ref_vals, rtol=TOL[dtype], atol=0)
    scale = ref_grad().abs().max()
    assert float((grad() - ref_grad()).abs().max() / scale) < TOL[dtype]
    # the value is the relative change itself, computed directly
    direct = torch.linalg.vector_norm(torch.relu(u[:, None] + Vi @ Delta.T) - base[:, None], dim=0)
    torch.testing.assert_close(vals, direct / norm, rtol=TOL[dtype], atol=0)


def test_inactive_units_add_their_base_only():
    """A unit with ``u_j + v_jᵀΔ ≤ 0`` adds ``ReLU(u_j)²`` to the value and nothing to the
    gradient: with ``Δ`` far outside every unit's reach, all of them are inactive."""
    u, Vi, base, norm, _ = _problem(torch.float64, k=200, d=8)
    Vi = Vi.abs()  # every v_jᵀΔ ≤ −1000 ‖v_j‖₁ for the Δ below
    Delta = torch.full((1, 8), -1e3, dtype=torch.float64)
    with _one_thread():
        vals, grad = _rf_step.objective(u, Vi, base, norm)(Delta)
    torch.testing.assert_close(vals, torch.ones(1, dtype=torch.float64), rtol=1e-12, atol=0)
    assert torch.count_nonzero(grad()) == 0


def test_usable_only_where_the_compiled_loop_applies():
    u, Vi, *_ = _problem(torch.float32, k=64, d=8)
    with _one_thread():
        assert _rf_step.usable(Vi)
        assert not _rf_step.usable(Vi.T)  # not contiguous
        assert not _rf_step.usable(Vi.to(torch.float16))
    torch.set_num_threads(2)  # several threads: the BLAS products use them
    try:
        assert not _rf_step.usable(Vi)
        vals, _ = _relative_change_objective(u, Vi)(torch.zeros(1, 8))
        assert float(vals) == 0.0
    finally:
        torch.set_num_threads(_THREADS)


_THREADS = torch.get_num_threads()


@contextlib.contextmanager
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
