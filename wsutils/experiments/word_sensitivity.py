"""The word-sensitivity chapter's sizes at each scale (``book/word-sensitivity.md``).

- :class:`Scale` holds the size of the chapter's one synthetic text; ``SCALES`` gives one
  per scale and :func:`scale` picks the current one.
- :data:`STEPS` is the number of steps per search, and :data:`STEPS_TOL` the largest change
  of any value of the chapter when the steps are doubled (measured at the paper scale:
  ``benchmarks/bench_word_sensitivity.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..run import config

__all__ = ["Scale", "SCALES", "scale", "STEPS", "STEPS_TOL"]

#: Steps per search; twice as many move no value of the chapter by more than :data:`STEPS_TOL`.
STEPS = 150
#: The largest change of a value when the steps are doubled (measured at the paper scale).
STEPS_TOL = 0.005


@dataclass(frozen=True)
class Scale:
    """The word-sensitivity chapter's sizes at one scale.

    Attributes
    ----------
    n, d
        Words and word width of the chapter's synthetic text.
    """

    n: int
    d: int


SCALES = {"quick": Scale(n=20, d=32), "paper": Scale(n=40, d=64)}


def scale(name: str | None = None) -> Scale:
    """The chapter's sizes at scale ``name`` (``None``: the current ``WSBOOK_SCALE``)."""
    return config.pick(SCALES, name)
