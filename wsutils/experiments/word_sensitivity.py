"""The word-sensitivity chapter's sizes at each scale (``book/word-sensitivity.md``).

- :class:`Scale` holds the size of the chapter's one synthetic text; ``SCALES`` gives one
  per scale and :func:`scale` picks the current one.
- :data:`STEPS` is the number of steps per search, :data:`HALVING` the successive halving
  that cuts the searches, and :data:`STEPS_TOL` the largest change of any value of the
  chapter against the uncut search of twice as many steps (measured at the paper scale:
  ``benchmarks/bench_word_sensitivity.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..run import config

__all__ = ["Scale", "SCALES", "scale", "STEPS", "HALVING", "STEPS_TOL"]

#: Steps per search; twice as many, uncut, move no value of the chapter by more than
#: :data:`STEPS_TOL`.
STEPS = 150
#: The successive halving of the chapter's searches (after 20 steps, then 40, 80, … only the
#: best third of the (word, start) searches go on). The library's shorter
#: :data:`wsutils.halving.SCHEDULE` (cuts after 10 steps) lost 1.2 % of ReLU attention's value
#: against the uncut search of ``2 · STEPS`` steps, more than :data:`STEPS_TOL`.
HALVING = (20, 1 / 3)
#: The largest change of a value against the uncut search of ``2 · STEPS`` steps (measured at
#: the paper scale).
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
