"""The figure-1 chapter's sizes: the IMDb reviews it draws its one-word sentence pairs from.

The trained-substitutions chapter places the same pairs (the same call of
:func:`wsutils.text.word_attention.one_word_pairs` on the same reviews, same seed), so both read
them from :func:`scale`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..run import config

__all__ = ["Scale", "SCALES", "scale"]


@dataclass(frozen=True)
class Scale:
    """The figure-1 chapter's sizes at one scale.

    Attributes
    ----------
    reviews
        Reviews selected from IMDb (:func:`wsutils.text.data.select_reviews`, seed 0).
    pairs
        One-word-different sentence pairs drawn from them
        (:func:`wsutils.text.word_attention.one_word_pairs`).
    """

    reviews: int
    pairs: int


SCALES = {"quick": Scale(reviews=200, pairs=500), "paper": Scale(reviews=2000, pairs=5000)}


def scale(name: str | None = None) -> Scale:
    """The figure-1 chapter's sizes at scale ``name`` (``"quick"`` or ``"paper"``; ``None``:
    the current ``WSBOOK_SCALE``, :func:`wsutils.run.config.pick`)."""
    return config.pick(SCALES, name)
