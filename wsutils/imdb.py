"""The paper's experiments on real text (brief §4): texts ``X`` built from IMDb reviews embedded
by a BERT model, and one grid point of the word-sensitivity sweep on them.

:func:`review_matrix` builds ``X`` from one review; :func:`sensitivity_point` is the module-level
per-point function for :func:`wsutils.sweep.run_grid`: its parameters are JSON values (the
review is named by its ``review`` id in the loaded dataset), and the model, the dataset and the
embeddings are loaded once per process (the embeddings through the on-disk cache).
"""

from __future__ import annotations

import functools
import time

import numpy as np

from . import config
from .data import load_imdb
from .embeddings import embed, load_model, sample_matrix, word_rows
from .maps import raf, relu_attention
from .sensitivity import word_sensitivity
from .weights import sample_W, sample_X

__all__ = ["MAPS", "review_matrix", "sensitivity_point"]

MAPS = {"RAF": raf, "ReLU attention": relu_attention}
KEEP = ("all", "words")


@functools.lru_cache(maxsize=2)
def _dataset(imdb: str | None):
    return load_imdb(imdb)


@functools.lru_cache(maxsize=256)
def _embedded(model: str, imdb: str | None, review: int, max_length: int):
    ds = _dataset(imdb)
    text = ds[int(review)]["text"]
    E, mask = embed([text], model=load_model(model), ids=[int(review)], max_length=max_length,
                    return_mask=True, progress=False)
    return E[0], mask[0]


def review_matrix(review: int, n: int, d: int, *, keep: str = "all", model: str | None = None,
                  imdb: str | None = None, max_length: int = 256) -> np.ndarray:
    """``X ∈ R^{n×d}`` from review ``review`` (its id in :func:`wsutils.data.load_imdb`):
    layer-0 embeddings, first ``n`` rows (``keep="all"``: ``[CLS]``, words, ``[SEP]``, padding,
    the authors' choice; ``keep="words"``: word tokens only), first ``d`` coordinates, rows
    rescaled to ``√d`` (:func:`wsutils.embeddings.sample_matrix`)."""
    if keep not in KEEP:
        raise ValueError(f"keep must be one of {KEEP}, got {keep!r}.")
    model = config.model() if model is None else model
    imdb = None if imdb is None else str(imdb)
    E, mask = _embedded(model, imdb, int(review), int(max_length))
    return sample_matrix(E, n, d, rows=word_rows(mask) if keep == "words" else None)


def sensitivity_point(*, map: str, n: int, d: int, source: str, review: int, keep: str,
                      seed: int, steps: int, starts: int, model: str, imdb: str | None) -> dict:
    """One point of the sweep: the word sensitivity (:prf:ref:`def-word-sensitivity`) of
    ``map`` — ``"RF"`` (``k = D = n·d``, the exact estimator
    :func:`wsutils.rf_sensitivity.rf_word_sensitivity`, which never forms ``V``), ``"RAF"`` or
    ``"ReLU attention"`` (weights ``W`` drawn with ``seed``) — searched over **every** row.

    ``source="imdb"``: the text of review ``review`` (:func:`review_matrix`, rows ``keep``);
    ``source="gaussian"``: i.i.d. rows of norm ``√d`` drawn with seed ``review`` (the synthetic
    chapters' texts), for a side-by-side comparison. Returns the sup over rows (``S``), the
    value for the first row alone (``S_first``, what the authors' scripts report), the row
    attaining the sup and the wall time of the search."""
    from .rf_sensitivity import rf_word_sensitivity

    if map not in (*MAPS, "RF"):
        raise ValueError(f"map must be one of {sorted(MAPS) + ['RF']}, got {map!r}.")
    if source == "imdb":
        X = review_matrix(review, n, d, keep=keep, model=model, imdb=imdb)
    elif source == "gaussian":
        X = sample_X(n, d, seed=review).numpy()
    else:
        raise ValueError(f"source must be 'imdb' or 'gaussian', got {source!r}.")
    t0 = time.perf_counter()
    if map == "RF":
        r = rf_word_sensitivity(X, n * d, rows=None, seed=seed, starts=starts, steps=steps)
    else:
        W, phi = sample_W(d, seed=seed), MAPS[map]
        r = word_sensitivity(lambda Z: phi(Z, W), X, rows=None, starts=starts, steps=steps,
                             seed=seed)
    return {"S": r.value, "S_first": r.per_row[0], "row": r.row,
            "seconds": time.perf_counter() - t0}
