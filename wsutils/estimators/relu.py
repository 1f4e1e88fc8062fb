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

The far-``n`` slope model and the slopes' standard error live in
:mod:`wsutils.estimators.rates`, the softmax chapter's laws in
:mod:`wsutils.estimators.softmax_laws`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .._tensor import Array, like
from ..checks import as_tensor, as_text, check_int, check_seed, check_shape, check_unit_rows
from ..maps import attention_scores, relu_attention
from ..sensitivity import project_ball, relative_change

__all__ = [
    "ReluTakeover",
    "relu_orthogonal_takeover",
    "relu_zeta_estimate",
    "ReluBound",
    "relu_upper_bound",
    "relu_zeta_lower",
    "relu_certified_upper",
    "relu_upper_if_defined",
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
    out = relu_upper_if_defined(Xt, Wt)
    if out is None:
        raise ValueError(
            "μ_i = 0 for some row i: some other row has no positive score "
            "outside key i; the bound of prop-relu-low does not apply."
        )
    return out


def relu_upper_if_defined(Xt: torch.Tensor, Wt: torch.Tensor) -> np.ndarray | None:
    """:func:`relu_certified_upper` on a checked float64 text (``n ≥ 2``, rows of norm
    ``√d``) and ``d × d`` weights, or ``None`` where some ``μ_i = 0`` (the proposition does
    not apply): for a caller that reports "no certificate" rather than an error."""
    n, d = Xt.shape
    b = torch.relu(attention_scores(Xt, Wt))
    Z = b.sum(dim=1)
    M = Z[:, None] - b  # M[j, i] = Σ_{k≠i} b_jk
    M.fill_diagonal_(math.inf)  # j ≠ i
    mu = M.min(dim=0).values  # μ_i
    if not bool((mu > 0).all()):
        return None
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
