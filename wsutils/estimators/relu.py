"""ReLU attention: the orthogonal take-over and the upper bound of the ReLU-attention chapter,
and the far-``n`` slope that the softmax chapter predicts from ``κ``.

- :func:`relu_orthogonal_takeover` builds the explicit ``Δ`` of :prf:ref:`prop-relu-takeover`:
  for ``n − 1 < d`` the new word ``x'_i`` is chosen with ``x'_iᵀ W x_k = 0`` for every other
  word ``k``, so that its row of ReLU scores is zero except on itself and the row attends only
  to ``x'_i``. The relative change it produces is recomputed with the full map: a certified
  lower bound on ``S``.
- :func:`relu_upper_bound` evaluates the deterministic bound of :prf:ref:`prop-relu-low` on
  ``‖φ(X_i(Δ)) − φ(X)‖_F`` over the whole ball, from ``ζ_i`` (:func:`relu_zeta_estimate`),
  ``μ_i``, ``‖X_{−i}‖_op``, ``‖X_{−i}W‖_op`` and column ``i`` of the ReLU scores.
- :func:`far_slope_prediction` and :func:`slope_standard_error` (with
  :func:`wsutils.estimators.rates.kappa_isotropic`) state once the model behind the far-``n``
  checks of the softmax chapter (:prf:ref:`obs-far`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .._tensor import Array, as_tensor, like
from ..checks import as_text, check_int, check_real, check_seed, check_shape, check_unit_rows
from ..maps import attention_scores, relu_attention
from ..sensitivity import project_ball, relative_change
from .rates import kappa_isotropic

__all__ = [
    "ReluTakeover",
    "relu_orthogonal_takeover",
    "relu_zeta_estimate",
    "ReluBound",
    "relu_upper_bound",
    "far_slope_prediction",
    "slope_standard_error",
    "lse_model",
    "attention_fro2_draws",
    "attention_fro2_law",
    "sigma2_model",
    "relu_zeta_lower",
    "relu_certified_upper",
]


def _prepare(X: Array, W: Array, row: int):
    Xt, n, d = as_text(X, dtype=torch.float64)
    if Xt.ndim != 2:
        raise ValueError(f"X must be a single text of shape (n, d), got {tuple(Xt.shape)}.")
    check_unit_rows(Xt)
    Wt = as_tensor(W, dtype=torch.float64)
    check_shape("W", Wt, (d, d), f"d × d with d = {d}, the width of X")
    i = check_int("row", row, minimum=0)
    if i >= n:
        raise ValueError(f"row {i} is out of range for a text of n = {n} words.")
    return Xt, Wt, n, d, i


@dataclass
class ReluTakeover:
    """The construction of :prf:ref:`prop-relu-takeover` at one row.

    ``Delta`` (``‖Δ‖ ≤ √d``, same kind as ``X``); ``dim_K`` the dimension of ``K_i = {y :
    yᵀWx_k = 0 for all k ≠ i}``; ``candidate`` which ``y`` was used (``"2c"`` or ``"c+|c|e"``,
    ``c = P_K x_i``); ``self_score`` ``s'_ii > 0``; ``max_cross`` the largest ``|s'_ik|``, ``k
    ≠ i`` (zero in exact arithmetic); ``self_weight`` ``a'_ii`` after the change; ``row_bound =
    ‖x'_i − φ_i‖/‖φ(X)‖_F`` (the bound of the proposition); ``change`` the relative change
    recomputed with the full map (a certified lower bound on ``S``).
    """

    Delta: Array
    dim_K: int
    candidate: str
    self_score: float
    max_cross: float
    self_weight: float
    row_bound: float
    change: float


def orthogonal_points(Xt: torch.Tensor, Wt: torch.Tensor, i: int):
    """The two points of :func:`relu_orthogonal_takeover` (trusted float64 input, any row
    norms): ``(dim K_i, [(name, Δ)])`` with ``Δ = y − x_i`` projected onto the exact ball,
    for each of ``y = 2c`` and ``y = c + ‖c‖e`` whose self-score ``yᵀWy`` is positive (the
    list may be empty). Raises ``ValueError`` when ``K_i = {0}``."""
    n, d = Xt.shape
    others = torch.cat([Xt[:i], Xt[i + 1 :]])
    B = others @ Wt.T  # rows (W x_k)ᵀ, k ≠ i
    U, sv, Vh = torch.linalg.svd(B, full_matrices=True)
    tol = max(B.shape) * torch.finfo(B.dtype).eps * (float(sv[0]) if sv.numel() else 0.0)
    rank = int((sv > tol).sum())
    N = Vh[rank:].T  # orthonormal basis of K_i, d × (d − rank)
    if N.shape[1] == 0:
        raise ValueError(
            f"K_i = {{0}}: span{{W x_k : k ≠ {i}}} is all of R^{d} (n − 1 = {n - 1} "
            f"≥ d = {d}); the orthogonal take-over needs n − 1 < d."
        )
    xi = Xt[i]
    c = N @ (N.T @ xi)  # P_K x_i
    M = N.T @ ((Wt + Wt.T) / 2) @ N
    _, evecs = torch.linalg.eigh(M)
    e = N @ evecs[:, -1]
    if float(e @ c) < 0:
        e = -e
    y_cap = c + torch.linalg.vector_norm(c) * e
    points = [
        (name, project_ball((y - xi)[None], math.sqrt(d))[0])
        for name, y in (("2c", 2 * c), ("c+|c|e", y_cap))
        if float(y @ Wt @ y) > 0
    ]
    return int(N.shape[1]), points


def relu_orthogonal_takeover(X: Array, W: Array, row: int = 0) -> ReluTakeover:
    """The orthogonal take-over of :prf:ref:`prop-relu-takeover` for ReLU attention
    (eq. :eq:`eq-relu-attention`) at word ``row``.

    ``K_i`` is the orthogonal complement of ``span{W x_k : k ≠ i}``; its dimension is at least
    ``d − n + 1``. With ``c = P_K x_i`` and ``e`` a unit top eigenvector of ``(W + Wᵀ)/2``
    compressed to ``K_i`` (signed so that ``eᵀc ≥ 0``), two points of ``K_i`` with ``‖y − x_i‖
    = ‖x_i‖ = √d`` are tried: ``y = 2c`` and ``y = c + ‖c‖e``. The one with a positive
    self-score ``yᵀWy/√d`` and the larger relative change is returned. Raises ``ValueError``
    when ``K_i = {0}`` (typically ``n − 1 ≥ d``) or when neither point has a positive
    self-score.
    """
    Xt, Wt, n, d, i = _prepare(X, W, row)
    dim_K, points = orthogonal_points(Xt, Wt, i)
    phi = lambda Z: relu_attention(Z, Wt)  # noqa: E731
    best = None
    for name, Delta in points:
        change = relative_change(phi, Xt, i, Delta)
        if best is None or change > best[2]:
            best = (name, Delta, change)
    if best is None:
        raise ValueError(
            "neither y = 2c nor y = c + ‖c‖e (c = P_K x_i) has a positive "
            "self-score here; the construction does not apply."
        )
    name, Delta, change = best
    Xp = Xt.clone()
    Xp[i] = Xt[i] + Delta
    s_row = attention_scores(Xp, Wt)[i]
    cross = torch.cat([s_row[:i], s_row[i + 1 :]])
    a = torch.relu(s_row)
    base = relu_attention(Xt, Wt)
    row_bound = float(torch.linalg.vector_norm(Xp[i] - base[i]) / torch.linalg.vector_norm(base))
    return ReluTakeover(
        Delta=like(Delta, X),
        dim_K=dim_K,
        candidate=name,
        self_score=float(s_row[i]),
        max_cross=float(cross.abs().max()) if cross.numel() else 0.0,
        self_weight=float(a[i] / a.sum()),
        row_bound=row_bound,
        change=change,
    )


def relu_zeta_estimate(
    X: Array, row: int = 0, *, starts: int = 8, steps: int = 300, seed: int = 0
) -> float:
    """An estimate of ``ζ_i = min_{‖v‖=1} Σ_{k≠i} ReLU(x_kᵀv)`` (:prf:ref:`prop-relu-low`).

    Minimised by normalised subgradient steps on the sphere (step ``0.5/√(t+1)``) from
    ``starts`` points (the first is ``−m/‖m‖``, ``m`` the mean of the other rows; the rest
    random from ``seed``); returns the smallest value seen.
    Any value seen is attained, so the result is an upper estimate of ``ζ_i``, not a certified
    lower bound: a bound evaluated with it can only come out smaller than the proved one.
    """
    Xt, n, d = as_text(X, dtype=torch.float64)
    i = check_int("row", row, minimum=0)
    if i >= n:
        raise ValueError(f"row {i} is out of range for a text of n = {n} words.")
    starts = check_int("starts", starts, minimum=1)
    steps = check_int("steps", steps, minimum=1)
    g = torch.Generator().manual_seed(check_seed(seed))
    others = torch.cat([Xt[:i], Xt[i + 1 :]])
    v = torch.randn(starts, d, generator=g, dtype=torch.float64)
    v[0] = -others.mean(dim=0)
    v = v / torch.linalg.vector_norm(v, dim=1, keepdim=True)
    best = math.inf
    for t in range(steps + 1):
        proj = v @ others.T  # (starts, n − 1)
        best = min(best, float(torch.relu(proj).sum(dim=1).min()))
        grad = (proj > 0).to(v.dtype) @ others  # a subgradient, (starts, d)
        grad = grad - (grad * v).sum(dim=1, keepdim=True) * v  # tangent to the sphere
        norm = torch.linalg.vector_norm(grad, dim=1, keepdim=True).clamp_min(1e-300)
        v = v - (0.5 / math.sqrt(t + 1)) * grad / norm
        v = v / torch.linalg.vector_norm(v, dim=1, keepdim=True)
    return best


@dataclass
class ReluBound:
    """The terms of :prf:ref:`prop-relu-low` at one row ``i``: ``tau`` (``τ_i``) bounds the
    change of row ``i``, ``others`` (``ω_i``) that of all the other rows together, ``value`` is
    ``√(τ_i² + ω_i²)/‖φ(X)‖_F``; ``zeta`` and ``mu`` are the ``ζ_i``, ``μ_i`` used."""

    tau: float
    others: float
    value: float
    zeta: float
    mu: float


def relu_upper_bound(X: Array, W: Array, row: int, zeta: float) -> ReluBound:
    """The upper bound of :prf:ref:`prop-relu-low` on ``sup_{‖Δ‖≤√d} ‖φ(X_i(Δ)) − φ(X)‖_F /
    ‖φ(X)‖_F`` for ReLU attention (eq. :eq:`eq-relu-attention`), given ``ζ_i = zeta``.

    ``τ_i = ‖φ_i‖ + min{2√d, ‖X_{−i}‖²_op/ζ_i + 2√d·min(1, 2√d/ζ_i)}`` and
    ``ω_i = √d (3‖X_{−i}W‖_op + ‖b_{·i}‖)/μ_i`` with ``b_{·i} = (ReLU(s_ji))_{j≠i}``,
    ``μ_i = min_{j≠i} Σ_{k≠i} ReLU(s_jk)``. With ``zeta`` from :func:`relu_zeta_estimate` (an
    upper estimate of ``ζ_i``) the value is at most the proved bound.
    """
    Xt, Wt, n, d, i = _prepare(X, W, row)
    if isinstance(zeta, bool) or not (
        isinstance(zeta, (int, float)) and math.isfinite(zeta) and zeta > 0
    ):
        raise ValueError(f"zeta must be a positive number (ζ_i of the proposition), got {zeta!r}.")
    if n < 2:
        raise ValueError("the bound needs n ≥ 2 words (other rows to compete with).")
    keep = torch.arange(n) != i
    others = Xt[keep]
    b = torch.relu(attention_scores(Xt, Wt))
    Z = b.sum(dim=1)
    mu = float((Z - b[:, i])[keep].min())  # Σ_{k≠i} b_jk, j ≠ i
    if not mu > 0:
        raise ValueError(
            "μ_i = 0: some other row has no positive score outside key i; the "
            "bound of the proposition does not apply."
        )
    phi = (b / torch.where(Z > 0, Z, torch.ones_like(Z))[:, None]) @ Xt  # eq-relu-attention
    sqd = math.sqrt(d)
    X_op = float(torch.linalg.matrix_norm(others, ord=2))
    tau = float(torch.linalg.vector_norm(phi[i])) + min(
        2 * sqd, X_op**2 / zeta + 2 * sqd * min(1.0, 2 * sqd / zeta)
    )
    XW_op = float(torch.linalg.matrix_norm(others @ Wt, ord=2))
    alpha = float(torch.linalg.vector_norm(b[keep, i]))
    oth = sqd * (3 * XW_op + alpha) / mu
    value = math.hypot(tau, oth) / float(torch.linalg.vector_norm(phi))
    return ReluBound(tau=tau, others=oth, value=value, zeta=float(zeta), mu=mu)


def far_slope_prediction(ns: Sequence[int], d: int) -> float:
    """The log–log slope of ``S ∝ 1/κ`` over ``ns`` at width ``d`` with
    ``κ = 1 + √(n/d)`` (:func:`wsutils.estimators.rates.kappa_isotropic`), fitted as the
    chapter fits the data: the model of :prf:ref:`obs-far`. Near ``−0.35`` for ``n/d`` between
    2.6 and 21, tending to ``−½`` only as ``n/d → ∞``."""
    ns = np.asarray(ns, dtype=float)
    return float(np.polyfit(np.log(ns), -np.log(kappa_isotropic(ns, d)), 1)[0])


def slope_standard_error(ns: Sequence[int], log_values: np.ndarray) -> float:
    """Standard error of the least-squares slope of ``log S`` on ``log n`` under the model
    ``log S(n, s) = a + p log n + ε`` with ``ε`` independent across grid points and seeds.

    ``log_values`` is ``(len(ns), seeds)``; the noise variance is estimated from the residuals
    of every seed's value around the fitted line (``len(ns)·seeds − 2`` degrees of freedom), and
    the slope is that of the per-``n`` mean, whose error is ``σ/√(seeds·Σ(log n − mean)²)``.
    """
    x = np.log(np.asarray(ns, dtype=float))
    y = np.asarray(log_values, dtype=float)
    if y.ndim != 2 or y.shape[0] != x.size or x.size < 3 or y.size < 4:
        raise ValueError(
            "log_values must be (len(ns), seeds) with at least 3 values of n and "
            f"4 values in all, got shape {y.shape} for {x.size} values of n."
        )
    if not np.all(np.isfinite(y)):
        raise ValueError(
            "log_values holds a NaN or an infinity: pass the logs of positive values."
        )
    p, a = np.polyfit(x, y.mean(axis=1), 1)
    resid = y - (a + p * x)[:, None]
    sigma2 = float((resid**2).sum()) / (y.size - 2)
    return math.sqrt(sigma2 / (y.shape[1] * float(((x - x.mean()) ** 2).sum())))


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


def relu_zeta_lower(X: Array) -> np.ndarray:
    """A certified lower bound on ``ζ_i = min_{‖v‖=1} Σ_{k≠i} ReLU(x_kᵀv)``
    (:prf:ref:`prop-relu-low`) for every row ``i``, in closed form: with ``t = X_{−i}v``,
    ``Σ_k ReLU(t_k) = (‖t‖₁ + s_iᵀv)/2``, ``s_i = Σ_{k≠i} x_k``; ``‖t‖₁ ≥ ‖t‖₂²/‖t‖_∞``,
    ``‖t‖₂² ≥ σ_min(X_{−i})² ≥ σ_min(X)² − ‖x_i‖²`` (interlacing) and
    ``‖t‖_∞ ≤ max_k ‖x_k‖``, so ``ζ_i ≥ ((σ_min(X)² − ‖x_i‖²)/max_k‖x_k‖ − ‖s_i‖)/2``,
    clipped at 0. Positive only for ``n`` of order ``d²`` (for isotropic rows), so on the
    book's grids it is 0, which the bound of :func:`relu_certified_upper` allows."""
    Xt, n, d = as_text(X, dtype=torch.float64)
    smin = float(torch.linalg.svdvals(Xt)[-1]) if n >= d else 0.0
    norms2 = (Xt**2).sum(dim=1)
    s = Xt.sum(dim=0)[None] - Xt  # s_i = Σ_{k≠i} x_k
    lower = (
        (smin**2 - norms2) / float(norms2.max().sqrt()) - torch.linalg.vector_norm(s, dim=1)
    ) / 2
    return lower.clamp_min(0).numpy()


def relu_certified_upper(X: Array, W: Array) -> np.ndarray:
    """The bound of :prf:ref:`prop-relu-low` at **every** row ``i``, certified: an upper
    bound on ``sup_{‖Δ‖≤√d} ‖φ(X_i(Δ)) − φ(X)‖_F/‖φ(X)‖_F`` for ReLU attention
    (eq. :eq:`eq-relu-attention`), so ``S(X) ≤ max_i`` of the result (an upper certificate
    over every word). Each entry is :func:`relu_upper_bound`'s ``value`` with three inputs
    replaced by quantities that can only enlarge it: ``ζ_i`` by the certified lower bound of
    :func:`relu_zeta_lower` (``τ_i`` falls with ``ζ_i``; at ``ζ_i = 0`` its minimum is
    ``2√d``), ``‖X_{−i}‖_op`` and ``‖X_{−i}W‖_op`` by ``‖X‖_op`` and ``‖XW‖_op`` (deleting a
    row cannot raise an operator norm). ``μ_i``, ``α`` and ``‖φ_i‖`` are exact. Cost: two
    singular-value computations and ``O(n²)`` for all rows together, then a closed form per
    word. Raises ``ValueError`` where some ``μ_i = 0`` (the proposition does not apply)."""
    Xt, n, d = as_text(X, dtype=torch.float64)
    if Xt.ndim != 2 or n < 2:
        raise ValueError(f"X must be one text of shape (n, d) with n ≥ 2, got {tuple(Xt.shape)}.")
    check_unit_rows(Xt)
    Wt = as_tensor(W, dtype=torch.float64)
    check_shape("W", Wt, (d, d), f"d × d with d = {d}, the width of X")
    b = torch.relu(attention_scores(Xt, Wt))
    Z = b.sum(dim=1)
    M = Z[:, None] - b  # M[j, i] = Σ_{k≠i} b_jk
    M.fill_diagonal_(math.inf)  # j ≠ i
    mu = M.min(dim=0).values  # μ_i
    if not bool((mu > 0).all()):
        raise ValueError(
            "μ_i = 0 for some row i: some other row has no positive score "
            "outside key i; the bound of prop-relu-low does not apply."
        )
    phi = (b / torch.where(Z > 0, Z, torch.ones_like(Z))[:, None]) @ Xt
    sqd = math.sqrt(d)
    X_op = float(torch.linalg.matrix_norm(Xt, ord=2))
    XW_op = float(torch.linalg.matrix_norm(Xt @ Wt, ord=2))
    zeta = torch.as_tensor(relu_zeta_lower(Xt))
    cap = torch.full_like(zeta, 2 * sqd)
    pos = zeta > 0
    via_zeta = torch.where(
        pos,
        X_op**2 / torch.where(pos, zeta, 1.0)
        + 2 * sqd * torch.clamp(2 * sqd / torch.where(pos, zeta, 1.0), max=1.0),
        cap,
    )
    tau = torch.linalg.vector_norm(phi, dim=1) + torch.minimum(cap, via_zeta)
    alpha = torch.sqrt((b**2).sum(dim=0) - torch.diagonal(b) ** 2)  # ‖b[j≠i, i]‖
    omega = sqd * (3 * XW_op + alpha) / mu
    return (torch.sqrt(tau**2 + omega**2) / torch.linalg.vector_norm(phi)).numpy()
