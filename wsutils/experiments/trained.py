"""The sizes of the trained-attention and trained-substitutions chapters, and the two small
choices both make: which word rows to search (:func:`rows_of`) and which reviews to cut
(:func:`long_reviews`).

Threads. The searches run many small batched products; one torch thread was about 20 times
faster than two in one measurement on a loaded two-core machine, so both chapters set
``torch.set_num_threads(Scale.threads)`` and the vocabulary search's worker processes get
one thread each (:func:`wsutils.run.sweep.process_pool`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..checks import check_int
from ..run import config
from . import figure1

__all__ = ["Scale", "SCALES", "scale", "rows_of", "long_reviews"]


@dataclass(frozen=True)
class Scale:
    """The trained chapters' sizes at one scale.

    Attributes
    ----------
    reviews, n, rows, starts, steps
        Head by head (trained-attention): reviews, their length ``n`` in tokens, word rows
        searched per review, and the starts and steps of each head's search (the
        trained-substitutions chapter's first-layer heads use the same starts and steps).
    ns, n_rows
        The lengths of "as ``n`` grows" and the rows searched at each.
    layer_reviews, layer_rows, layer_steps
        Layer by layer: reviews, rows and steps of the block's and the layer's search.
    vocab
        Candidate tokens of the vocabulary search: a seeded random subset of this many, or
        ``None`` for every token of the vocabulary (trained-substitutions).
    vocab_reviews, positions, n_real
        Reviews of the vocabulary search, positions searched per review, their length.
    deep, top, sample, real_steps
        Deeper layers: review-positions evaluated, tokens moving the first layer most and
        tokens drawn at random per position, and the steps of the layers' search.
    used
        One-word sentence pairs (of :func:`wsutils.experiments.figure1.scale`'s) placed.
    reviews_pool, pairs
        The figure-1 chapter's review pool and pair count (the same pairs).
    workers
        Processes of the vocabulary search (:func:`wsutils.run.sweep.process_pool`).
    threads
        Torch threads of the chapter's own process (see the module's docstring).
    """

    reviews: int
    n: int
    rows: int
    starts: int
    steps: int
    ns: tuple[int, ...]
    n_rows: int
    layer_reviews: int
    layer_rows: int
    layer_steps: int
    vocab: int | None
    vocab_reviews: int
    positions: int
    n_real: int
    deep: int
    top: int
    sample: int
    real_steps: int
    used: int
    reviews_pool: int
    pairs: int
    workers: int
    threads: int = 1


SCALES = {
    "quick": Scale(
        reviews=1,
        n=32,
        rows=2,
        starts=2,
        steps=10,
        ns=(16, 64),
        n_rows=2,
        layer_reviews=1,
        layer_rows=1,
        layer_steps=3,
        vocab=4096,
        vocab_reviews=1,
        positions=2,
        n_real=16,
        deep=2,
        top=8,
        sample=8,
        real_steps=8,
        used=60,
        reviews_pool=figure1.SCALES["quick"].reviews,
        pairs=figure1.SCALES["quick"].pairs,
        workers=1,
    ),
    "paper": Scale(
        reviews=3,
        n=64,
        rows=4,
        starts=2,
        steps=20,
        ns=(16, 32, 64, 128, 240),
        n_rows=6,
        layer_reviews=2,
        layer_rows=2,
        layer_steps=10,
        vocab=None,
        vocab_reviews=25,
        positions=8,
        n_real=32,
        deep=6,
        top=32,
        sample=32,
        real_steps=10,
        used=1000,
        reviews_pool=figure1.SCALES["paper"].reviews,
        pairs=figure1.SCALES["paper"].pairs,
        workers=2,
    ),
}


def scale(name: str | None = None) -> Scale:
    """The trained chapters' sizes at scale ``name`` (``"quick"`` or ``"paper"``; ``None``:
    the current ``WSBOOK_SCALE``, :func:`wsutils.run.config.pick`)."""
    return config.pick(SCALES, name)


def rows_of(n: int, k: int) -> list[int]:
    """``k`` evenly spaced word rows of a text of ``n`` tokens, ``[CLS]`` (row 0) and
    ``[SEP]`` (row ``n − 1``) excluded; ``1 ≤ k ≤ n − 2`` (with that many word rows the
    spacing is at least one, so the ``k`` rounded rows are distinct)."""
    n = check_int("n", n, minimum=3)
    k = check_int("k", k, minimum=1)
    if k > n - 2:
        raise ValueError(
            f"k = {k} word rows asked, but a text of n = {n} tokens has {n - 2} besides "
            "[CLS] and [SEP]: ask for fewer rows or a longer text."
        )
    return np.linspace(1, n - 2, k).round().astype(int).tolist()


def long_reviews(texts, tokenizer, n: int, count: int) -> list[int]:
    """The indices of the first ``count`` of ``texts`` with at least ``n − 2`` WordPiece
    tokens (so that they fill ``n`` tokens with ``[CLS]`` and ``[SEP]``); an error when
    fewer than ``count`` are that long (nothing is silently left out)."""
    n = check_int("n", n, minimum=3)
    count = check_int("count", count, minimum=1)
    long_enough = (k for k, t in enumerate(texts) if len(tokenizer.tokenize(t)) >= n - 2)
    found = list(itertools.islice(long_enough, count))
    if len(found) < count:
        raise ValueError(
            f"only {len(found)} of the {len(texts)} texts have at least n − 2 = {n - 2} "
            f"WordPiece tokens, {count} asked: pass more texts, a smaller n or a smaller count."
        )
    return found
