"""The deep-random-features chapter's sizes at each scale (``book/deep-random-features.md``).

- :class:`Scale` holds the chapter's grids: the finite-width simulations of the wide limit
  and the grid of the authors' deep-RF script (``d = 768``, ``n = 50, 60, 70, 80``,
  ``L ∈ {2, 4, 8}``); ``SCALES`` gives one per scale and :func:`scale` picks the current
  one.
- :data:`DEPTHS` are the depths ``L`` of every grid, :data:`LEVEL` the significance level
  ``α`` of the two-sided intervals of the chapter's checks (coverage ``1 − α``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..run import config

__all__ = ["Scale", "SCALES", "scale", "DEPTHS", "LEVEL"]

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
        widths=(128, 512, 2048, 4096),
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
