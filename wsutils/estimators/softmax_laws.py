"""The laws behind the softmax chapter's checks of :prf:ref:`conj-raf-high`, stated once: the
log-sum-exp of the row take-over's competitors (:func:`lse_model`), the law of ``‖A‖_F²`` at
random texts (:func:`attention_fro2_law`, :func:`attention_fro2_draws`, with its large-``n``
constants ``FRO2_BIAS`` and ``FRO2_SD``) and the finite-``d`` law of ``σ²`` at the row
take-over (:func:`sigma2_model`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..checks import check_int, check_real, check_seed
from ..maps import attention_scores

__all__ = [
    "FRO2_BIAS",
    "FRO2_SD",
    "attention_fro2_draws",
    "attention_fro2_law",
    "lse_model",
    "sigma2_model",
]


def lse_model(n: int, sigma2: float) -> tuple[float, float]:
    """The model of :prf:ref:`conj-raf-high` for the competitors of the row take-over: the
    ``n − 1`` scores ``s'_ij`` are i.i.d. ``N(0, σ²)``, so ``log Σ_{j≠i} exp s'_ij`` has mean
    ``≈ log(n − 1) + σ²/2`` and, by the delta method, standard deviation
    ``≈ √((e^{σ²} − 1)/(n − 1))``. Returns ``(mean, sd)``."""
    n = check_int("n", n, minimum=2)
    sigma2 = check_real("sigma2", sigma2)
    if sigma2 < 0:
        raise ValueError(f"sigma2 is a variance: it must be at least 0, got {sigma2}.")
    return math.log(n - 1) + sigma2 / 2, math.sqrt(math.expm1(sigma2) / (n - 1))


#: ``c = 2(e² − 1) − 3(e − 1) ≈ 7.6``: the second-order mean ``e (1 − c/n)`` of ``‖A‖_F²``
#: for i.i.d. ``N(0, 1)`` scores (:func:`attention_fro2_law`), the large-``n`` limit.
FRO2_BIAS = 2 * (math.e**2 - 1) - 3 * (math.e - 1)

#: ``√(e⁶ − 4e⁴ + 4e³ − e²) ≈ 16.1`` — ``n`` times the first-order standard deviation of
#: ``‖A‖_F²`` for i.i.d. ``N(0, 1)`` scores (:func:`attention_fro2_law`), the large-``n`` limit.
FRO2_SD = math.sqrt(math.e**6 - 4 * math.e**4 + 4 * math.e**3 - math.e**2)


def attention_fro2_law(n: int, d: int, *, draws: int = 400, seed: int = 0) -> tuple[float, float]:
    """The law of ``‖A‖_F²``, ``A = softmax(XWXᵀ/√d)``, in :prf:ref:`conj-raf-high` (part 3)
    at finite ``(n, d)``: ``W_jl ~ N(0, 1/d)`` and rows of ``X`` uniform on the sphere of
    radius ``√d``. Returns ``(mean, sd)`` from a Monte Carlo of ``draws`` draws (``seed``).

    **The row model.** Row ``j``'s scores are, exactly: ``w = Wᵀx_j ~ N(0, I_d)`` given
    ``x_j``, the self-score ``s_jj = x̂_jᵀw ~ N(0, 1)``, ``σ_j² = ‖w‖²/d =
    (s_jj² + χ²_{d−1})/d``, and, for ``k ≠ j``, ``s_jk = σ_j·t_k`` with ``t_k = √d·u₁`` a
    coordinate of a uniform point of the unit sphere (``u₁ = g/√(g² + χ²_{d−1})``), i.i.d.
    over ``k`` given the row. The model draws the ``n`` rows independently: each row's law is
    exact, so the **mean** ``E‖A‖_F² = n⁻¹Σ_j E[n‖a_j‖²]`` is exact; the **sd** leaves out the
    correlation across rows (through the shared ``W`` and ``X``), of order ``d^{−1/2}``.
    Each draw costs ``n²`` numbers, not the ``n·d²`` of a draw of ``(X, W)``.

    **The limit.** As ``d → ∞`` the scores become i.i.d. ``N(0, 1)``: ``n‖a_j‖² =
    U_j/V_j²`` with ``U_j = n⁻¹Σ_k e^{2s_jk} → e²`` and ``V_j = n⁻¹Σ_k e^{s_jk} → e^{1/2}``,
    so ``‖A‖_F² → e``; the delta method gives the mean ``e (1 − c/n)``, ``c ≈ 7.6``
    (``FRO2_BIAS``), and the sd ``√(e⁶ − 4e⁴ + 4e³ − e²)/n ≈ 16.1/n`` (``FRO2_SD``) to first
    order in ``1/n`` (``Var e^{2s} = e⁸ − e⁴``, ``Var e^{s} = e² − e``,
    ``Cov = e^{9/2} − e^{5/2}``). At ``n`` in the tens both are poor (at ``n = 50`` the mean
    is about ``2.43``, not ``2.31``, and the sd about ``0.13``, not ``0.32``: the summands
    ``e^{2s}`` are log-normal and rare draws carry the first-order variance), which is why
    the book compares with this finite law."""
    n = check_int("n", n, minimum=2)
    d = check_int("d", d, minimum=2)
    draws = check_int("draws", draws, minimum=2)
    rng = np.random.default_rng(check_seed(seed))
    values = []
    for start in range(0, draws, 64):
        m = min(64, draws - start)
        s_self = rng.standard_normal((m, n, 1))
        sigma = np.sqrt((s_self**2 + rng.chisquare(d - 1, (m, n, 1))) / d)
        g = rng.standard_normal((m, n, n))
        S = sigma * g * math.sqrt(d) / np.sqrt(g**2 + rng.chisquare(d - 1, (m, n, n)))
        S[:, np.arange(n), np.arange(n)] = s_self[..., 0]
        A = np.exp(S - S.max(axis=-1, keepdims=True))
        A /= A.sum(axis=-1, keepdims=True)
        values.append((A**2).sum(axis=(1, 2)))
    v = np.concatenate(values)
    return float(v.mean()), float(v.std(ddof=1))


def attention_fro2_draws(n: int, d: int, *, draws: int = 100, seed: int = 0) -> np.ndarray:
    """``draws`` independent values of ``‖A‖_F²``, ``A = softmax(XWXᵀ/√d)``, with the law of
    :prf:ref:`conj-raf-high` (``W_jl ~ N(0, 1/d)``, rows of ``X`` uniform on the sphere of
    radius ``√d``), each from a full draw of ``(X, W)`` in float64 (``seed``): the exact law,
    correlation across rows included, at ``n·d²`` operations a draw. The book takes the
    spread of ``‖A‖_F²`` from it and the mean from :func:`attention_fro2_law`."""
    n = check_int("n", n, minimum=2)
    d = check_int("d", d, minimum=2)
    draws = check_int("draws", draws, minimum=2)
    g = torch.Generator().manual_seed(check_seed(seed))
    values = []
    for start in range(0, draws, 16):
        m = min(16, draws - start)
        X = torch.randn(m, n, d, generator=g, dtype=torch.float64)
        X *= math.sqrt(d) / torch.linalg.vector_norm(X, dim=-1, keepdim=True)
        W = torch.randn(m, d, d, generator=g, dtype=torch.float64) / math.sqrt(d)
        A = torch.softmax(attention_scores(X, W), dim=-1)
        values.append((A**2).sum(dim=(1, 2)).numpy())
    return np.concatenate(values)


def sigma2_model(d: int, *, draws: int = 600, seed: int = 0) -> tuple[float, float]:
    """The finite-``d`` law of ``σ² = ‖Wᵀx'_i‖²/d`` of :prf:ref:`conj-raf-high` (part 1),
    ``x'_i = x_i + √d·u`` the row take-over (``u`` the unit top eigenvector of
    ``H = (W + Wᵀ)/2``, signed so that ``uᵀx_i ≥ 0``), ``W_jl ~ N(0, 1/d)`` i.i.d. and ``x_i``
    uniform on the sphere of radius ``√d``, by an exact Monte Carlo of ``draws`` draws
    (``seed``). Returns ``(mean, sd)``.

    The law, reduced to ``O(d)`` numbers per draw: ``H`` is GOE (diagonal variance ``1/d``,
    off-diagonal ``1/(2d)``) and ``A = (W − Wᵀ)/2`` is independent of it, with
    ``Wᵀ = H − A``. The spectrum ``λ₁ ≥ … ≥ λ_d`` of ``H`` is that of the tridiagonal matrix
    with diagonal ``N(0, 1/d)`` and off-diagonal ``χ_{d−k}/√(2d)``, ``k = 1…d−1``
    (Dumitriu–Edelman, β = 1); its eigenvectors are Haar and independent of the spectrum,
    so the coordinates ``c`` of ``x_i`` in them are uniform on the sphere and those of
    ``x'_i`` are ``c' = c + √d e₁`` with ``c₁ ≥ 0`` (the sign of ``u``). Then
    ``Hx'_i = Λc'``, and given ``H`` and ``x'_i`` the vector ``Ax'_i`` is
    ``N(0, (‖x'_i‖²I − x'_i x'_iᵀ)/(2d))`` in any orthonormal basis (``A``'s law is
    rotation invariant), so ``σ² = ‖Λc' − z‖²/d`` with ``z = ‖c'‖(g − (gᵀĉ)ĉ)/√(2d)``,
    ``g ~ N(0, I_d)``, ``ĉ = c'/‖c'‖``.

    Where the mean differs from the limit ``7/2``: ``σ² = ‖Wᵀx_i‖²/d + ‖Wᵀu‖² +
    2x_iᵀWWᵀu/√d``, with ``E‖Wᵀx_i‖²/d = 1``, ``‖Wᵀu‖² = λ₁² + ‖Au‖²`` (``E‖Au‖² =
    (d − 1)/(2d)``), and the cross term, whose mean ``≈ 2(λ₁² + ½)·E|uᵀx_i|/√d ≈
    4.0/√d`` is positive because ``u`` is signed so that ``uᵀx_i ≥ 0``: an ``O(1/√d)`` bias,
    partly offset by ``E λ₁² < 2`` at finite ``d`` (the edge of the semicircle).
    ``O(draws·d²)`` time (the tridiagonal eigenvalues)."""
    from scipy.linalg import eigvalsh_tridiagonal

    d = check_int("d", d, minimum=2)
    draws = check_int("draws", draws, minimum=2)
    rng = np.random.default_rng(check_seed(seed))
    out = np.empty(draws)
    for t in range(draws):
        lam = eigvalsh_tridiagonal(
            rng.standard_normal(d) / math.sqrt(d),
            np.sqrt(rng.chisquare(np.arange(d - 1, 0, -1)) / (2 * d)),
        )[::-1]
        c = rng.standard_normal(d)
        c *= math.sqrt(d) / np.linalg.norm(c)
        c[0] = abs(c[0]) + math.sqrt(d)  # coordinates of x'_i = x_i + √d u
        chat = c / np.linalg.norm(c)
        g = rng.standard_normal(d)
        z = (g - (g @ chat) * chat) * (np.linalg.norm(c) / math.sqrt(2 * d))  # A x'_i
        out[t] = float(np.sum((lam * c - z) ** 2)) / d
    return float(out.mean()), float(out.std(ddof=1))
