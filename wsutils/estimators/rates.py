"""The models behind the book's tolerances on rates, stated once (chapters ``random-features``
and ``deep-random-features``; other chapters that check a random-features rate use the same
functions).

Every function says which statement it implements. A tolerance in a chapter is either a
certificate computed for the drawn weights, or one of these models plus a statistical interval
whose level the chapter states.

Random features, ``S_RF`` at width ``k`` on texts of ``n`` words of width ``d``
(:prf:ref:`thm-rf-upper`, :prf:ref:`thm-rf-lower`). Both certificates carry a finite-width
factor of the form ``1 + a_1·√(d/k)``:

* the upper certificate ``\\overline S_i = √d ‖V_i‖_op/‖ReLU(V flat X)‖`` is, for typical
  weights, ``√2 (1 + √(d/k))/√n`` (``a_1 = 1``; :func:`rf_upper_limit`);
* the lower certificate ``\\underline S_i = √(d/2) ‖(V_i)_J‖_op/‖ReLU(V flat X)‖`` is, for
  typical weights, ``(1 + √(2d/k))/√(2n)`` (``a_1 = √2``; :func:`rf_lower_typical`); the
  linearised change ``max_Δ ‖(V_i Δ)_J‖/‖ReLU(V flat X)‖`` is ``√2`` times it.

At ``k = D = nd`` the factor is ``1 + a_1/√n``, which decays with ``n`` and steepens a fitted
log–log slope. The **model** used for every slope check of random features is
``S = a_0·(1 + a_1·√(d/k))/√n`` with an unknown constant ``a_0`` and an unknown ``a_1 ∈ [0, √2]``
(the range spanned by the two certificates' factors and the linearised change).
:func:`rf_slope_window` turns it into the interval of slopes it allows on a given grid.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = [
    "A1_MAX",
    "rf_upper_limit",
    "rf_lower_typical",
    "rf_finite_width_factor",
    "ols_slope",
    "rf_slope_window",
    "drf_limit_expansion",
    "kappa_isotropic",
    "bonferroni_z",
    "family_failure",
    "ols_slope_bound",
    "ols_slope_range",
    "slope_se_seeds",
    "slope_standard_error",
    "far_slope_prediction",
]

#: The largest ``a_1`` of the model ``S ∝ (1 + a_1·√(d/k))/√n`` (the lower certificate's factor).
A1_MAX = math.sqrt(2.0)


def _positive(name, value):
    a = np.asarray(value, dtype=np.float64)
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError(f"{name} must be positive and finite, got {value!r}.")
    return a


def rf_upper_limit(n, d, k):
    """``√2 (1 + √(d/k))/√n``: the leading term of the high-probability bound
    ``C(k, d, n, δ)/√n`` of :prf:ref:`thm-rf-upper` as ``k → ∞`` (``n``, ``δ`` fixed), and the
    typical value of the upper certificate ``\\overline S_i`` (``‖V_i‖_op ≈ (√k + √d)/√D``,
    ``‖ReLU(V flat X)‖ ≈ √(k/2)``). A typical value, not a bound at finite ``k``."""
    n, d, k = _positive("n", n), _positive("d", d), _positive("k", k)
    return math.sqrt(2.0) * (1 + np.sqrt(d / k)) / np.sqrt(n)


def rf_lower_typical(n, d, k):
    """``(1 + √(2d/k))/√(2n)``: the typical value of the lower certificate ``\\underline S_i``
    of :prf:ref:`thm-rf-lower` (``|J| ≈ k/2`` active units, ``‖(V_i)_J‖_op ≈ (√|J| + √d)/√D``,
    ``‖ReLU(V flat X)‖ ≈ √(k/2)``). A typical value, not a bound."""
    n, d, k = _positive("n", n), _positive("d", d), _positive("k", k)
    return (1 + np.sqrt(2 * d / k)) / np.sqrt(2 * n)


def rf_finite_width_factor(d, k, a1=A1_MAX):
    """``1 + a_1·√(d/k)``, the finite-width factor of the model in the module docstring
    (``a_1 = 1``: upper certificate; ``a_1 = √2``: lower certificate). At ``k = D = nd`` it is
    ``1 + a_1/√n``."""
    d, k = _positive("d", d), _positive("k", k)
    if not 0 <= a1 <= A1_MAX:
        raise ValueError(f"a1 must lie in [0, √2] (the model's range), got {a1}.")
    return 1 + a1 * np.sqrt(d / k)


def ols_slope(x, y, groups=None) -> float:
    """Least-squares slope of ``log y`` on ``log x``, with one intercept per value of
    ``groups`` (one common intercept if ``None``)."""
    x = _positive("x", x).ravel()
    y = _positive("y", y).ravel()
    if x.shape != y.shape or x.size < 2:
        raise ValueError(f"x and y need the same length ≥ 2, got {x.size} and {y.size}.")
    g = np.zeros(x.size) if groups is None else np.asarray(groups).ravel()
    cols = [np.log(x)] + [(g == v).astype(float) for v in np.unique(g)]
    coef, *_ = np.linalg.lstsq(np.column_stack(cols), np.log(y), rcond=None)
    return float(coef[0])


def rf_slope_window(n, d, k, groups=None) -> tuple[float, float]:
    """The interval of least-squares log–log slopes of ``S`` on ``n`` that the model
    ``S = a_0·(1 + a_1√(d/k))/√n``, ``a_1 ∈ [0, √2]`` (module docstring) allows on the grid
    ``(n, d, k)`` (arrays of equal length, one entry per point; ``groups`` as in
    :func:`ols_slope`).

    The fitted slope is ``−1/2`` plus the slope of ``log(1 + a_1√(d/k))``; the latter is ``0``
    at ``a_1 = 0`` and, when ``d/k`` decreases with ``n`` (e.g. ``k = D = nd``), decreases with
    ``a_1`` (a least-squares slope is a weighted mean of the local slopes with non-negative
    weights, and each local slope of ``log(1 + a_1·x)`` is monotone in ``a_1`` for ``x`` falling).
    Returns ``(lo, hi)`` with ``lo`` at ``a_1 = √2`` and ``hi = −1/2`` at ``a_1 = 0``."""
    n = _positive("n", n).ravel()
    factor = rf_finite_width_factor(np.broadcast_to(d, n.shape), np.broadcast_to(k, n.shape))
    steep = ols_slope(n, factor, groups)
    return -0.5 + min(steep, 0.0), -0.5 + max(steep, 0.0)


def drf_limit_expansion(n, L):
    """``1 − L/(3π√n)``: the expansion of ``F_L(n; 1, 1)·√n``, the wide-limit relative change
    of ``L`` He-scaled ReLU layers at ``Δ = x_i`` (:prf:ref:`thm-drf-limit`, part 2), up to
    ``O_L(1/n)``."""
    n = _positive("n", n)
    if L < 0:
        raise ValueError(f"L must be ≥ 0, got {L}.")
    return 1 - L / (3 * math.pi * np.sqrt(n))


def kappa_isotropic(n, d):
    """``1 + √(n/d)``: the typical ``κ = ‖X‖_op/√d`` of a text with i.i.d. isotropic rows of norm
    ``√d`` (``‖X‖_op ≈ √n + √d``; chapter ``attention``, the condition on ``X``). Where the
    softmax bound scales like ``1/κ``, the model ``S ∝ 1/κ`` predicts the log–log slope
    ``ols_slope(n, 1/kappa_isotropic(n, d))``: about ``−0.35`` for ``n`` a few times ``d``,
    tending to ``−1/2`` only as ``n/d → ∞``. A typical value, not a bound."""
    n, d = _positive("n", n), _positive("d", d)
    return 1 + np.sqrt(n / d)


def bonferroni_z(m: int, alpha: float = 0.01) -> float:
    """The half-width ``z`` of a band ``|value − model mean| < z·sd`` checked on ``m`` values
    such that, for normal values, all ``m`` pass with probability at least ``1 − alpha``
    (Bonferroni: each leaves with probability ``alpha/m``). The book's bands on grids of
    seeds use it with ``alpha = 0.01``; :func:`family_failure` gives the exact probability
    for independent values."""
    from statistics import NormalDist

    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"m must be a positive integer (values checked), got {m!r}.")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}.")
    return NormalDist().inv_cdf(1 - alpha / (2 * m))


def family_failure(z: float, m: int) -> float:
    """``P(some |N_k| ≥ z)`` for ``m`` independent standard normal values ``N_k``:
    ``1 − (1 − erfc(z/√2))^m``, the probability that a band of half-width ``z`` sd, checked on
    ``m`` independent values that follow the model, fails for a fresh set of seeds."""
    if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 0:
        raise ValueError(f"m must be a non-negative integer, got {m!r}.")
    if not (isinstance(z, (int, float, np.floating)) and z >= 0 and math.isfinite(z)):
        raise ValueError(f"z must be a finite half-width of at least 0, got {z!r}.")
    return float(-math.expm1(m * math.log1p(-math.erfc(z / math.sqrt(2)))))


def ols_slope_bound(n, bound) -> float:
    """``max |Σ_j w_j ε_j|`` over perturbations ``|ε_j| ≤ bound_j`` of the ``log`` values, with
    ``w_j = (log n_j − mean)/Σ(log n − mean)²`` the weights of the least-squares slope of
    ``log y`` on ``log n`` (:func:`ols_slope`): ``Σ_j |w_j|·bound_j``, attained at
    ``ε_j = bound_j·sign(w_j)``. How far a remainder known only to satisfy ``|ε_j| ≤ bound_j``
    can move a fitted slope (chapter ``deep-random-features``, the wide limit's rate)."""
    w = _ols_weights(n)
    b = np.broadcast_to(np.asarray(bound, dtype=np.float64), w.shape)
    if np.any(~np.isfinite(b)) or np.any(b < 0):
        raise ValueError(f"bound must be finite and non-negative, got {bound!r}.")
    return float(np.sum(np.abs(w) * b))


def _ols_weights(n) -> np.ndarray:
    """The weights ``w_j = (log n_j − mean)/Σ(log n − mean)²`` of the least-squares slope of a
    ``log y`` on ``log n`` (:func:`ols_slope`): the slope is ``Σ_j w_j log y_j``. Not finite
    when every ``n_j`` is the same."""
    c = np.log(_positive("n", n))
    c = c - c.mean()
    with np.errstate(divide="ignore", invalid="ignore"):
        return c / float((c**2).sum())


def ols_slope_range(n, lower, upper) -> tuple[float, float]:
    """The least and the largest least-squares slope of ``log y`` on ``log n``
    (:func:`ols_slope`) over every ``y`` with ``lower_j ≤ y_j ≤ upper_j``: what a bracket on
    each point's value says about the slope fitted to them (the rule that the bracket decides;
    chapter ``imdb``). The slope is ``Σ_j w_j log y_j`` with the weights ``w_j`` of
    :func:`ols_slope_bound`, so the least takes ``upper_j`` where ``w_j < 0`` and ``lower_j``
    where ``w_j > 0``, the largest the reverse; both are attained. An infinite ``upper_j``
    gives an infinite end (where ``w_j ≠ 0``)."""
    w = _ols_weights(n).ravel()
    lo = _positive("lower", lower).ravel()
    up = np.asarray(upper, dtype=np.float64).ravel()
    if not (w.size == lo.size == up.size) or w.size < 2:
        raise ValueError(
            f"n, lower and upper need the same length ≥ 2, got {w.size}, {lo.size}, {up.size}."
        )
    if np.isnan(up).any() or np.any(up < lo):
        raise ValueError(f"upper must be a number ≥ lower at every point, got {upper!r}.")
    if not np.isfinite(w).all():
        raise ValueError(f"n needs two different values for a slope, got {n!r}.")
    with np.errstate(invalid="ignore"):  # 0·inf where w_j = 0
        a, b = w * np.log(lo), w * np.log(up)
    a, b = np.where(w == 0, 0.0, a), np.where(w == 0, 0.0, b)
    return float(np.minimum(a, b).sum()), float(np.maximum(a, b).sum())


def _log_table(x: np.ndarray, log_values, enough, what: str) -> np.ndarray:
    """``log_values`` as a finite float64 array ``(len(n), seeds)`` for the slope errors below,
    with at least ``what`` (``enough(y)``); a ValueError that says so otherwise."""
    y = np.asarray(log_values, dtype=np.float64)
    if y.ndim != 2 or y.shape[0] != x.size or not enough(y):
        raise ValueError(
            f"log_values must be (len(n), seeds) with at least {what}, got shape {y.shape} "
            f"for {x.size} values of n."
        )
    if not np.all(np.isfinite(y)):
        raise ValueError(
            "log_values holds a NaN or an infinity: pass the logs of positive values."
        )
    return y


def slope_se_seeds(n, log_values) -> float:
    """Standard error of the least-squares slope of the per-``n`` mean of ``log_values``
    (``(len(n), seeds)``) on ``log n``, from the spread between seeds only ("pure error"):
    ``σ̂²`` pools the variance across seeds at each ``n`` (``seeds − 1`` degrees of freedom
    each), and the slope's error is ``σ̂/√(seeds·Σ(log n − mean)²)``. Unlike the residuals
    around the line, it does not count a curved mean (a decay that sets in part-way along the
    grid, chapter ``relu-attention``) as noise. Needs at least two seeds."""
    x = np.log(_positive("n", n)).ravel()
    y = _log_table(
        x, log_values, lambda y: y.shape[1] >= 2 and x.size >= 2, "2 values of n and 2 seeds"
    )
    sigma2 = float(y.var(axis=1, ddof=1).mean())
    return math.sqrt(sigma2 / (y.shape[1] * float(((x - x.mean()) ** 2).sum())))


def far_slope_prediction(ns: Sequence[int], d: int) -> float:
    """The log–log slope of ``S ∝ 1/κ`` over ``ns`` at width ``d`` with
    ``κ = 1 + √(n/d)`` (:func:`kappa_isotropic`), fitted as the
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
    y = _log_table(
        x, log_values, lambda y: x.size >= 3 and y.size >= 4, "3 values of n and 4 in all"
    )
    p, a = np.polyfit(x, y.mean(axis=1), 1)
    resid = y - (a + p * x)[:, None]
    sigma2 = float((resid**2).sum()) / (y.size - 2)
    return math.sqrt(sigma2 / (y.shape[1] * float(((x - x.mean()) ** 2).sum())))
