"""The random-features chapter's sizes at each scale (``book/random-features.md``).

- :class:`Scale` holds the chapter's grids: the grid of the authors' RF script (at the paper
  scale: ``d ∈ {192, 384, 768}``, ``n = 90, 100, …, 150``) and the long range in ``n`` beyond
  it; ``SCALES`` gives one per scale and :func:`scale` picks the current one.
- :data:`DELTA` is the failure probability per draw of the high-probability bound
  (:prf:ref:`thm-rf-upper`); :data:`LEVEL` the level of the two-sided Student t intervals
  on the fitted log–log slopes.
- :func:`lower_order_bound` is the bound of :prf:ref:`prop-rf-lower-order` at
  ``ε = ε_g``; :func:`fitted_slope` the chapter's least-squares slope of ``log S`` on
  ``log n`` with its t interval; :func:`plot_rate` draws the chapter's figure of the rate.
- :func:`sample_text` draws the chapter's two families of texts and :func:`rf_point` is one
  point of its grids (for :func:`wsutils.run.sweep.run_grid`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats

from ..checks import check_real
from ..estimators.rf import rf_word_sensitivity
from ..run import config

__all__ = [
    "Scale",
    "SCALES",
    "scale",
    "DELTA",
    "LEVEL",
    "lower_order_bound",
    "fitted_slope",
    "plot_rate",
    "sample_text",
    "rf_point",
]

#: Failure probability per draw of the high-probability bound of :prf:ref:`thm-rf-upper`.
DELTA = 1e-4
#: Level of the two-sided Student t intervals on the fitted slopes.
LEVEL = 1e-3


@dataclass(frozen=True)
class Scale:
    """The random-features chapter's sizes at one scale.

    Attributes
    ----------
    seeds
        Seeds per point of the main grid.
    ds, ns
        Word widths ``d`` and lengths ``n`` of the main grid (``k = D = nd``).
    long_d
        The word width of the long range in ``n``.
    long_ns, long_seeds
        Lengths and seeds of the long range.
    """

    seeds: tuple[int, ...]
    ds: tuple[int, ...]
    ns: tuple[int, ...]
    long_d: int
    long_ns: tuple[int, ...]
    long_seeds: tuple[int, ...]


SCALES = {
    "quick": Scale(
        seeds=(0, 1, 2),
        ds=(16, 32),
        ns=(20, 30, 40, 60),
        long_d=16,
        long_ns=(20, 80, 320, 1280),
        long_seeds=(0, 1, 2, 3),
    ),
    "paper": Scale(  # the grid of the authors' RF script, then beyond it
        seeds=(0, 1, 2),
        ds=(192, 384, 768),
        ns=tuple(range(90, 151, 10)),
        long_d=64,
        long_ns=(100, 250, 1000, 2500, 4000),
        long_seeds=(0, 1, 2, 3, 4),
    ),
}


def scale(name: str | None = None) -> Scale:
    """The chapter's sizes at scale ``name`` (``None``: the current ``WSBOOK_SCALE``)."""
    return config.pick(SCALES, name)


def lower_order_bound(n, k, delta: float = DELTA):
    """The lower bound ``1/(2√n (1 + ε√(2/k)))`` of :prf:ref:`prop-rf-lower-order` at
    ``ε = ε_g = √(2 log(2/δ))`` (arrays ``n``, ``k`` broadcast), for ``0 < δ < 1`` and
    positive finite ``n``, ``k``."""
    delta = check_real("delta", delta, positive=True)
    if delta >= 1:
        raise ValueError(f"delta is a probability: it must lie in (0, 1), got {delta}.")
    for name, v in (("n", n), ("k", k)):
        v = np.asarray(v, dtype=float)
        if v.size == 0 or not np.all(np.isfinite(v)) or np.any(v <= 0):
            raise ValueError(f"{name} must hold positive finite numbers, got {v!r}.")
    eps_g = math.sqrt(2 * math.log(2 / delta))
    return 1 / (2 * np.sqrt(n) * (1 + eps_g * np.sqrt(2 / np.asarray(k))))


def fitted_slope(n, S, groups, level: float = LEVEL) -> tuple[float, float]:
    """The OLS slope of ``log S`` on ``log n`` with one intercept per group, and the
    half-width of its two-sided Student t interval at ``level`` (standard error from the
    residual spread). ``n`` and ``S`` positive and finite, ``n``, ``S`` and ``groups`` of
    one length, more runs than fitted coefficients, ``0 < level < 1``."""
    n, S, groups = np.asarray(n, dtype=float), np.asarray(S, dtype=float), np.asarray(groups)
    if not (n.ndim == S.ndim == groups.ndim == 1 and len(n) == len(S) == len(groups)):
        raise ValueError(
            f"n, S and groups must be 1-d and of one length, got {n.shape}, {S.shape} and "
            f"{groups.shape}."
        )
    for name, v in (("n", n), ("S", S)):
        if not np.all(np.isfinite(v)) or np.any(v <= 0):
            raise ValueError(f"{name} must be positive and finite (its log is fitted), got {v}.")
    level = check_real("level", level, positive=True)
    if level >= 1:
        raise ValueError(f"level is a significance level: it must lie in (0, 1), got {level}.")
    keys = sorted(set(groups.tolist()))
    A = np.column_stack([np.log(n)] + [(groups == g).astype(float) for g in keys])
    coef, res, *_ = np.linalg.lstsq(A, np.log(S), rcond=None)
    dof = len(S) - A.shape[1]
    if dof < 1 or np.linalg.matrix_rank(A) < A.shape[1]:
        raise ValueError(
            f"{len(S)} runs cannot fit a slope and {len(keys)} intercepts with an error: "
            "the design (log n and one intercept per group) needs full rank and more runs than "
            "coefficients."
        )
    cov = (res[0] / dof) * np.linalg.inv(A.T @ A)
    return float(coef[0]), float(stats.t.ppf(1 - level / 2, dof) * math.sqrt(cov[0, 0]))


def plot_rate(axes, grid, long, ds, long_d) -> None:
    """The chapter's figure ``fig-rf-rate`` on two axes: ``Ŝ`` (dots) and the mean
    certificates (lines) against ``n``, log–log, for the main grid (one colour per ``d`` of
    ``ds``) and the long range (black, at ``long_d``), with a reference slope ``-1/2``
    (left); ``Ŝ√n`` (right). ``grid`` and ``long`` map ``"n"``, ``"S"``, ``"lower"``,
    ``"upper"`` (and ``"d"`` for ``grid``) to arrays, one entry per run."""
    series = [(grid, d, f"C{j}", f"d = {d}") for j, d in enumerate(ds)]
    series += [(long, None, "k", f"d = {long_d}, long")]
    for src, d, col, lab in series:
        m = np.ones(len(src["n"]), bool) if d is None else src["d"] == d
        n, ns = src["n"][m], np.unique(src["n"][m])

        def mean(key, m=m, n=n, ns=ns, src=src):
            return np.array([src[key][m][n == v].mean() for v in ns])

        axes[0].scatter(n, src["S"][m], s=10, color=col, label=lab)
        axes[0].plot(ns, mean("lower"), color=col, lw=0.8, ls=":")
        axes[0].plot(ns, mean("upper"), color=col, lw=0.8)
        axes[1].scatter(n, src["S"][m] * np.sqrt(n), s=10, color=col, label=lab)
    n_all = np.concatenate([grid["n"], long["n"]])
    n_all = np.array([n_all.min(), n_all.max()])
    axes[0].plot(n_all, 1.2 / np.sqrt(n_all), "k--", lw=0.8)
    axes[0].set(
        xscale="log",
        yscale="log",
        xlabel="n (words)",
        ylabel=r"$\hat S$, $\underline{S}_1$, $\overline{S}_1$",
    )
    axes[1].set(xscale="log", xlabel="n (words)", ylabel=r"$\hat S\,\sqrt{n}$")
    axes[1].legend(fontsize=9)


def sample_text(family: str, n: int, d: int, *, seed: int, share: float = 0.5) -> torch.Tensor:
    """A synthetic text with rows of norm ``√d``: ``"isotropic"`` (i.i.d. Gaussian rows,
    :func:`wsutils.weights.sample_X`) or ``"common"`` (anisotropic: every row is
    ``√share·m + √(1 − share)·g_i`` rescaled, one common Gaussian ``m`` for the whole text, so
    that rows have cosine ``≈ share`` with each other, as real embeddings share a component)."""
    from ..maps import normalise_rows
    from ..weights import gaussian, sample_X

    if family == "isotropic":
        return sample_X(n, d, seed=seed)
    if family != "common":
        raise ValueError(f"family must be 'isotropic' or 'common', got {family!r}.")
    if not 0 <= share < 1:
        raise ValueError(f"share must be in [0, 1), got {share}.")
    G = gaussian((n + 1, d), 1.0, seed=seed)
    return normalise_rows(math.sqrt(share) * G[:1] + math.sqrt(1 - share) * G[1:])


def rf_point(
    *,
    family: str,
    n: int,
    d: int,
    seed: int,
    rows: int | None = 0,
    steps: int = 30,
    precision: str = "float64",
) -> dict:
    """One grid point of the random-features chapter (for :func:`wsutils.run.sweep.run_grid`):
    the text ``sample_text(family, n, d, seed=seed)``, ``k = D = n·d``, weights from
    ``seed + 1``; ``rows=0`` (the first word: the reduced law, drawn in ``precision``, see
    :func:`wsutils.estimators.rf.rf_row_law`) or ``None`` (every word, blocks mode), as
    :func:`wsutils.estimators.rf.rf_word_sensitivity` reads them. Returns
    the estimate ``S``, the certified ``lower``/``upper``, and the wall-clock and CPU seconds
    (all threads) it took."""
    import time

    t0, c0 = time.perf_counter(), time.process_time()
    X = sample_text(family, n, d, seed=seed)
    r = rf_word_sensitivity(
        X,
        n * d,
        rows=rows,
        seed=seed + 1,
        steps=steps,
        precision=precision,
    )
    return {
        "S": r.value,
        "lower": r.lower,
        "upper": r.upper,
        "row": r.row,
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - c0,
    }
