"""The deep-random-features chapter's sizes at each scale (``book/deep-random-features.md``).

- :class:`Scale` holds the chapter's grids: the finite-width simulations of the wide limit
  and the grid of the authors' deep-RF script (``d = 768``, ``n = 50, 60, 70, 80``,
  ``L ∈ {2, 4, 8}``); ``SCALES`` gives one per scale and :func:`scale` picks the current
  one.
- :data:`DEPTHS` are the depths ``L`` of every grid, :data:`LEVEL` the significance level
  ``α`` of the two-sided intervals of the chapter's checks (coverage ``1 − α``).
- :func:`drf_point` is one point of the chapter's grids (for
  :func:`wsutils.run.sweep.run_grid`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..estimators.drf import drf_limit_sensitivity, drf_row_sensitivity
from ..run import config

__all__ = ["Scale", "SCALES", "scale", "DEPTHS", "LEVEL", "drf_point"]

#: The depths ``L`` of every grid of the chapter (those of the authors' script).
DEPTHS = (2, 4, 8)
#: The significance level ``α`` of the two-sided intervals of the chapter's checks: each
#: interval covers with probability ``1 − α`` under its model.
LEVEL = 1e-3


@dataclass(frozen=True)
class Scale:
    """The deep-random-features chapter's sizes at one scale.

    Attributes
    ----------
    seeds
        Seeds per point of the simulations.
    d_sim
        Word width of the simulations of the wide limit.
    widths
        Layer widths ``k`` of the convergence check.
    n_conv
        Lengths ``n`` of the convergence check.
    n_rate, k_rate
        Lengths and width of the rate check.
    paper_n, paper_k
        Lengths and widths simulated at ``d = 768`` (the authors' grid: ``n = 50, …, 80``).
    """

    seeds: tuple[int, ...]
    d_sim: int
    widths: tuple[int, ...]
    n_conv: tuple[int, ...]
    n_rate: tuple[int, ...]
    k_rate: int
    paper_n: tuple[int, ...]
    paper_k: tuple[int, ...]


SCALES = {
    "quick": Scale(
        seeds=(0, 1, 2),
        d_sim=8,
        widths=(64, 256, 1024),
        n_conv=(16, 64),
        n_rate=(16, 32, 64, 128),
        k_rate=256,
        paper_n=(50, 60, 70, 80),
        paper_k=(256,),
    ),
    "paper": Scale(
        seeds=(0, 1, 2, 3),
        d_sim=16,
        widths=(128, 512, 2048),  # 4096 until 2026-12-07 (60 s of the build)
        n_conv=(16, 64),
        n_rate=(16, 32, 64, 128),
        k_rate=1024,
        paper_n=(50, 60, 70, 80),
        paper_k=(256, 1024),
    ),
}


def scale(name: str | None = None) -> Scale:
    """The chapter's sizes at scale ``name`` (``None``: the current ``WSBOOK_SCALE``)."""
    return config.pick(SCALES, name)


def drf_point(
    *, n: int, d: int, L: int, k: int, seed: int, steps: int = 20, precision: str = "float64"
) -> dict:
    """One grid point of the deep-random-features chapter (for
    :func:`wsutils.run.sweep.run_grid`): an isotropic text from ``seed``, weights from
    ``seed + 1`` drawn in ``precision``, first word, the ascent of
    :func:`wsutils.estimators.drf.drf_row_sensitivity` started also at the wide-limit
    maximiser ``Δ = x_1``. Returns the finite-width estimate ``S``, the wide limit ``S_inf``
    and the wall-clock and CPU seconds it took."""
    import time

    from ..run.device import small_work_threads
    from ..weights import sample_X

    t0, c0 = time.perf_counter(), time.process_time()
    X = sample_X(n, d, seed=seed)
    with small_work_threads(k * max(k, d), threshold=1 << 23):
        S, _ = drf_row_sensitivity(
            X,
            L,
            k,
            row=0,
            seed=seed + 1,
            init=X[0],
            precision=precision,
            search=dict(starts=2, steps=steps),
        )
    return {
        "S": S,
        "S_inf": drf_limit_sensitivity(n, L)[0],
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": time.process_time() - c0,
    }
