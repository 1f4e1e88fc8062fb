"""Tolerances derived from the rounding of a computation (issue 51): two computations of one
quantity by different code (another order of summation, a batch against one, BLAS against a
loop, another implementation) agree only to their rounding, and that rounding differs from CPU
to CPU (the vector units and the BLAS kernels a CPU picks). A test that compares two such
computations asks for agreement within a bound of the rounding, never ``==``.

Higham, *Accuracy and Stability of Numerical Algorithms*, §3.1: a dot product of length ``k``
computed in any order satisfies ``|fl(aᵀb) − aᵀb| ≤ γ_k Σ|a_i b_i| ≤ γ_k ‖a‖‖b‖`` with
``γ_k = k·u/(1 − k·u)`` and ``u`` the unit roundoff (half the machine epsilon). Two
computations that each satisfy such a bound differ by at most twice it."""

from __future__ import annotations

import torch


def unit_roundoff(dtype: torch.dtype = torch.float64) -> float:
    """``u``: half the distance from 1 to the next number of ``dtype``."""
    return torch.finfo(dtype).eps / 2


def gamma(k: int, dtype: torch.dtype = torch.float64) -> float:
    """``γ_k = k·u/(1 − k·u)``: the relative error bound of ``k`` roundings in a row."""
    ku = k * unit_roundoff(dtype)
    assert ku < 1, "γ_k is defined for k·u < 1"
    return ku / (1 - ku)


def dot_tolerance(k: int, a_norm, b_norm, dtype: torch.dtype = torch.float64):
    """How far two computations of a length-``k`` dot product of vectors of norms ``a_norm``
    and ``b_norm`` may be apart: ``2·γ_k·‖a‖‖b‖`` (each within ``γ_k‖a‖‖b‖`` of the exact
    value). The norms may be tensors (one bound per entry)."""
    return 2 * gamma(k, dtype) * a_norm * b_norm
