"""The verification literature's baseline for our certificates: interval bound propagation
(IBP) through softmax attention, written from the method's description (Gowal et al., 2018;
the baseline of Shi et al., *Robustness Verification for Transformers*, ICLR 2020, who certify
a classifier's margin when a word's embedding moves in an ℓp ball and bound every
intermediate quantity on the way), here for the same quantity as
:func:`~wsutils.estimators.softmax_upper.softmax_certified_upper`: the relative change of
``φ(X) = softmax(c·XWXᵀ/√d + b)X`` when word ``i`` moves by ``‖Δ‖ ≤ √d``.

IBP gives every intermediate quantity an interval, entry by entry, and propagates them with
interval arithmetic:

1. the scores over the ball exactly (a tightened IBP: a verifier's IBP bounds ``q`` and ``k``
   entry by entry and multiplies the intervals, which is looser): a
   score ``z_jk`` with ``i`` on one side moves by at most ``c‖Wᵀx_j‖`` (key ``i``) or
   ``c‖Wx_k‖`` (query ``i``); ``z_ii``, quadratic in ``Δ``, by ``c(‖(W + Wᵀ)x_i‖√d +
   max(|λ_min|, |λ_max|)·d)/√d`` with ``λ`` the eigenvalues of ``(W + Wᵀ)/2``; the value
   ``x_i + Δ`` lies in the box ``x_i ± √d`` (each entry);
2. each softmax weight in ``[e^{l_k}/(e^{l_k} + Σ_{m≠k} e^{u_m}),
   e^{u_k}/(e^{u_k} + Σ_{m≠k} e^{l_m})]`` from the score intervals ``[l, u]`` (the exact box
   of the softmax, where a verifier's IBP splits it into exp, sum and reciprocal);
3. each output entry ``Σ_k a_jk v_km`` as a sum of products of intervals.

Every output entry then lies in ``[L, U]`` for every ``Δ`` in the ball, so the change is at
most ``‖max(U − φ, φ − L)‖_F`` (entrywise). The intervals forget that the weights of a row sum
to one and that one ``Δ`` moves them all: that is what our certificates use. Computed in float64
without a rounding allowance: a baseline to compare with, not a certificate. Cost ``O(n²d)``
per word (every row's weights and values as intervals).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .._tensor import Array
from ..checks import as_tensor, as_text, check_rows, check_shape
from ..maps import Normalisation, attention_scores

__all__ = ["ibp_upper"]


def ibp_upper(
    X: Array, W: Array, *, normalisation: str | Normalisation = "raf", rows=None
) -> np.ndarray:
    """Per word ``i`` of ``rows`` (``None``: every word), interval bound propagation's bound on
    ``sup_{‖Δ‖≤√d} ‖φ(X_i(Δ)) − φ(X)‖_F/‖φ(X)‖_F`` for softmax attention (any ``β``, scalable
    softmax, a sink's logit on key 0; module docstring). Float64, no rounding allowance. With a
    sink, row 0 is the sink's token, not a word: its entry is ``inf``, as for
    :func:`~wsutils.estimators.softmax_upper.softmax_certified_upper`."""
    norm = Normalisation.parse(normalisation)
    if norm.name not in ("softmax", "scalable"):
        raise ValueError(f"ibp_upper bounds softmax attention, not {norm.name!r}.")
    Xt, n, d = as_text(X, dtype=torch.float64)
    Wt = as_tensor(W, dtype=torch.float64)
    check_shape("W", Wt, (d, d), f"d × d with d = {d}, the width of X")
    c, r = norm.scale(n), math.sqrt(d)
    bias = norm.key_bias(n, Xt)
    z = c * attention_scores(Xt, Wt) + (0 if bias is None else bias)
    phi = torch.softmax(z, dim=1) @ Xt
    base = float(torch.linalg.vector_norm(phi))
    key_move = c * torch.linalg.vector_norm(Xt @ Wt, dim=1)  # |Δz_ji| ≤ c‖Wᵀx_j‖
    query_move = c * torch.linalg.vector_norm(Xt @ Wt.T, dim=1)  # |Δz_ik| ≤ c‖Wx_k‖
    eig = torch.linalg.eigvalsh((Wt + Wt.T) / 2)
    quad = float(eig.abs().max()) * d / r  # |ΔᵀWΔ|/√d ≤ max|λ|·d/√d
    self_move = c * (torch.linalg.vector_norm(Xt @ (Wt + Wt.T), dim=1) + quad)
    out = []
    for i in check_rows(rows, n):
        lo, hi = z.clone(), z.clone()
        lo[:, i] -= key_move  # key i in every row
        hi[:, i] += key_move
        lo[i] = z[i] - query_move  # row i: its query moves against every key
        hi[i] = z[i] + query_move
        lo[i, i], hi[i, i] = z[i, i] - self_move[i], z[i, i] + self_move[i]
        a_lo, a_hi = _softmax_interval(lo, hi)
        v_lo, v_hi = Xt.clone(), Xt.clone()
        v_lo[i] -= r  # the box around x_i + Δ
        v_hi[i] += r
        L, U = _matmul_interval(a_lo, a_hi, v_lo, v_hi)
        dev = torch.maximum(U - phi, phi - L)
        out.append(float(torch.linalg.vector_norm(dev)) / base)
    if bias is not None:
        out = [math.inf if i == 0 else v for i, v in zip(check_rows(rows, n), out)]
    return np.array(out)


def _softmax_interval(lo: torch.Tensor, hi: torch.Tensor):
    """Entrywise bounds on ``softmax(z)`` over the box ``lo ≤ z ≤ hi`` (row by row): weight
    ``k`` is smallest with its own score at ``lo`` and the others' at ``hi``, and the reverse."""
    m = torch.maximum(hi.max(dim=1, keepdim=True).values, lo.max(dim=1, keepdim=True).values)
    e_lo, e_hi = torch.exp(lo - m), torch.exp(hi - m)
    s_lo, s_hi = e_lo.sum(dim=1, keepdim=True), e_hi.sum(dim=1, keepdim=True)
    a_lo = e_lo / (e_lo + (s_hi - e_hi))
    a_hi = e_hi / (e_hi + (s_lo - e_lo).clamp_min(0))
    return a_lo, a_hi.clamp(max=1.0)


def _matmul_interval(a_lo, a_hi, v_lo, v_hi):
    """Entrywise bounds on ``A V`` for ``A`` in ``[a_lo, a_hi]`` (non-negative) and ``V`` in
    ``[v_lo, v_hi]``: each product ``a·v`` at the corner that makes it smallest or largest."""
    # a ≥ 0: a·v is smallest at a_hi where v < 0 and at a_lo where v ≥ 0 (entry by entry)
    L = torch.einsum("jk,km->jm", a_hi, v_lo.clamp(max=0)) + torch.einsum(
        "jk,km->jm", a_lo, v_lo.clamp(min=0)
    )
    U = torch.einsum("jk,km->jm", a_hi, v_hi.clamp(min=0)) + torch.einsum(
        "jk,km->jm", a_lo, v_hi.clamp(max=0)
    )
    return L, U
