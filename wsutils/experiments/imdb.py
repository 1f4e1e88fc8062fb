"""The paper's experiments on real text (chapter ``imdb``; the authors' ``utils_data.py`` and
``gen.py --dataset imdb``): texts ``X`` built from IMDb reviews embedded
by a BERT model, and one grid point of the word-sensitivity sweep on them.

:func:`review_matrix` builds ``X`` from one review; :func:`sensitivity_point` is the module-level
per-point function for :func:`wsutils.run.sweep.run_grid`: its parameters are JSON values (the
review is named by its ``review`` id in the loaded dataset), and the model, the dataset and the
embeddings are loaded once per process (the embeddings through the on-disk cache).
:func:`flip_point_imdb` is the grid-point function of the generalization experiment
(:func:`wsutils.generalization.flip_runs`) on labelled reviews (:func:`flip_texts`).
"""

from __future__ import annotations

import functools
import time
from typing import Sequence

import numpy as np

from ..checks import check_int
from ..estimators.attention import attention_word_sensitivity
from ..generalization import LOSSES, TRAININGS, check_Ns, flip_runs
from ..maps import raf, relu_attention
from ..run import config
from ..text.data import load_imdb, select_reviews
from ..text.embeddings import embed, load_model, sample_matrix, word_rows
from ..weights import sample_W, sample_X

__all__ = [
    "MAPS",
    "review_matrix",
    "searched_rows",
    "sensitivity_point",
    "flip_texts",
    "flip_point_imdb",
]

MAPS = {"RAF": raf, "ReLU attention": relu_attention}
_KINDS = {"RAF": "raf", "ReLU attention": "relu"}
KEEP = ("all", "words")


def _dataset(imdb: str | None):
    # not cached here: load_imdb caches a local file by its content's sha256, so a file
    # changed in place is read again
    return load_imdb(imdb)


@functools.lru_cache(maxsize=256)
def _embedded(model: str, imdb: str | None, review: int, max_length: int):
    ds = _dataset(imdb)
    text = ds[int(review)]["text"]
    E, mask = embed(
        [text],
        model=load_model(model),
        ids=[int(review)],
        max_length=max_length,
        return_mask=True,
        progress=False,
    )
    return E[0], mask[0]


def review_matrix(
    review: int,
    n: int,
    d: int,
    *,
    keep: str = "all",
    model: str | None = None,
    imdb: str | None = None,
    max_length: int = 256,
) -> np.ndarray:
    """``X ∈ R^{n×d}`` from review ``review`` (its id in :func:`wsutils.text.data.load_imdb`):
    layer-0 embeddings, first ``n`` rows (``keep="all"``: ``[CLS]``, words, ``[SEP]``, padding,
    the authors' choice; ``keep="words"``: word tokens only), first ``d`` coordinates, rows
    rescaled to ``√d`` (:func:`wsutils.text.embeddings.sample_matrix`)."""
    if keep not in KEEP:
        raise ValueError(f"keep must be one of {KEEP}, got {keep!r}.")
    model = config.model() if model is None else model
    imdb = None if imdb is None else str(imdb)
    E, mask = _embedded(model, imdb, int(review), int(max_length))
    return sample_matrix(E, n, d, rows=word_rows(mask) if keep == "words" else None)


def searched_rows(n: int, rows: int | None) -> list[int] | None:
    """The rows :func:`sensitivity_point` searches: ``None`` (every row) when ``rows`` is
    ``None`` or at least ``n``; otherwise ``rows`` distinct rows spread evenly over ``0..n−1``
    (``np.linspace`` rounded), row 0 (``[CLS]``) included, and row ``n − 1`` too when
    ``rows ≥ 2``."""
    n = check_int("n", n, minimum=1)
    if rows is None:
        return None
    rows = check_int("rows", rows, minimum=1)
    if rows >= n:
        return None
    picked = np.unique(np.rint(np.linspace(0, n - 1, rows)).astype(int)).tolist()
    assert len(picked) == rows, (n, rows, picked)  # spacing (n−1)/(rows−1) > 1: all distinct
    return picked


def sensitivity_point(
    *,
    map: str,
    n: int,
    d: int,
    source: str,
    review: int,
    keep: str,
    seed: int,
    steps: int,
    starts: int,
    model: str,
    imdb: str | None,
    rows: int | None = None,
    rf_mode: str = "rows",
) -> dict:
    """One point of the sweep: the word sensitivity (:prf:ref:`def-word-sensitivity`) of
    ``map`` — ``"RF"`` (``k = D = n·d``, the exact estimator
    :func:`wsutils.estimators.rf.rf_word_sensitivity`, which never forms ``V``), ``"RAF"`` or
    ``"ReLU attention"`` (weights ``W`` drawn with ``seed``) — searched over **every** row
    (``rows=None``), or over ``rows`` of them spread evenly, row 0 included
    (:func:`searched_rows`; ``S`` is then the sup over those rows only).

    ``rf_mode`` (RF only): ``"rows"`` draws ``V flat(X)`` jointly with the searched column
    blocks only (:func:`wsutils.estimators.rf.rf_rows_law`, :prf:ref:`prop-rf-rows-law`: a
    draw of the same law as ``"blocks"``, which draws all ``n`` blocks to form
    ``V flat(X)``); with every row searched the two are the same draw.

    ``source="imdb"``: the text of review ``review`` (:func:`review_matrix`, rows ``keep``);
    ``source="gaussian"``: i.i.d. rows of norm ``√d`` drawn with seed ``review`` (the synthetic
    chapters' texts), for a side-by-side comparison. Returns the sup over rows (``S``), the
    value for the first row alone (``S_first``, what the authors' scripts report), the row
    attaining the sup, the smallest value over the searched rows (``S_row_min``), the number
    of rows searched (``n_rows``) and the wall time of the search."""
    from ..estimators.rf import rf_word_sensitivity

    if map not in (*MAPS, "RF"):
        raise ValueError(f"map must be one of {sorted(MAPS) + ['RF']}, got {map!r}.")
    if rf_mode not in ("rows", "blocks"):
        raise ValueError(f"rf_mode must be 'rows' or 'blocks', got {rf_mode!r}.")
    if source == "imdb":
        X = review_matrix(review, n, d, keep=keep, model=model, imdb=imdb)
    elif source == "gaussian":
        X = sample_X(n, d, seed=review).numpy()
    else:
        raise ValueError(f"source must be 'imdb' or 'gaussian', got {source!r}.")
    picked = searched_rows(n, rows)
    t0 = time.perf_counter()
    if map == "RF":
        r = rf_word_sensitivity(
            X,
            n * d,
            rows=picked,
            seed=seed,
            starts=starts,
            steps=steps,
            mode="blocks" if picked is None else rf_mode,
        )
    else:
        # the search of wsutils.sensitivity.word_sensitivity, in O(n·d) per start and step
        r = attention_word_sensitivity(
            X,
            sample_W(d, seed=seed),
            kind=_KINDS[map],
            rows=picked,
            starts=starts,
            steps=steps,
            seed=seed,
        )
    return {
        "S": r.value,
        "S_first": r.per_row[0],
        "row": r.row,
        "S_row_min": min(r.per_row.values()),
        "n_rows": len(r.per_row),
        "seconds": time.perf_counter() - t0,
    }


@functools.lru_cache(maxsize=2)
def _flip_embedded(model: str, imdb: str | None, reviews: int, select_seed: int, max_length: int):
    enc = load_model(model)
    sel = select_reviews(
        _dataset(imdb), reviews, tokenizer=enc.tokenizer, seed=select_seed, unique=True
    )
    E, mask = embed(
        sel.texts,
        model=enc,
        ids=[int(i) for i in sel.review],
        max_length=max_length,
        return_mask=True,
    )
    return E, mask, sel.y, sel.review


def flip_texts(
    *,
    n: int,
    d: int,
    reviews: int,
    select_seed: int,
    keep: str = "all",
    model: str | None = None,
    imdb: str | None = None,
    max_length: int = 256,
):
    """Labelled texts for the generalization experiment on IMDb: ``reviews`` label-balanced,
    pairwise distinct reviews of fewer than 240 tokens, ``[CLS]``/``[SEP]`` not counted
    (:func:`wsutils.text.data.select_reviews` with seed ``select_seed`` and ``unique=True``; they
    alternate ``y = −1, +1, …``), embedded at layer 0 through the on-disk cache
    (:func:`wsutils.text.embeddings.embed` with the review ids), each cut to ``n × d`` with rows of
    norm ``√d`` (:func:`wsutils.text.embeddings.sample_matrix`; ``keep="all"`` keeps
    ``[CLS]``, ``[SEP]`` and ``[PAD]`` rows as the authors do, ``"words"`` word tokens only).

    Returns ``(Xs, y, review_ids)``: ``(reviews, n, d)`` float64, labels ``±1`` (the reviews'
    sentiment, positive = +1), and the reviews' ids in the loaded dataset. Layer 0 embeds each
    token on its own (token, position and segment embeddings, then a layer norm), so any
    ``max_length > n`` gives the same first ``n`` rows as the paper's 256.
    """
    if keep not in KEEP:
        raise ValueError(f"keep must be one of {KEEP}, got {keep!r}.")
    if keep == "all" and not n < max_length:
        raise ValueError(
            f"n = {n} rows need max_length > n (the last position holds [SEP] "
            f"when a review is truncated), got max_length = {max_length}."
        )
    model = config.model() if model is None else model
    imdb = None if imdb is None else str(imdb)
    E, mask, y, ids = _flip_embedded(model, imdb, int(reviews), int(select_seed), int(max_length))
    rows = word_rows(mask) if keep == "words" else [None] * len(E)
    Xs = np.stack([sample_matrix(E[j], n, d, rows=rows[j]) for j in range(len(E))])
    return Xs, np.asarray(y, dtype=np.float64), np.asarray(ids)


def flip_point_imdb(
    *,
    map: str,
    n: int,
    d: int,
    Ns: list[int],
    seed: int,
    reviews: int,
    select_seed: int,
    held_out: int,
    keep: str = "all",
    model: str | None = None,
    imdb: str | None = None,
    max_length: int = 256,
    losses: Sequence[str] = LOSSES,
    trainings: Sequence[str] = TRAININGS,
    starts: int = 4,
    steps: int = 300,
    lr: float = 0.3,
    row: int = 0,
    batch_searches: bool = True,
    search_dtype: str = "float64",
) -> dict:
    """One grid point of the generalization experiment on IMDb reviews, for
    :func:`wsutils.run.sweep.run_grid` (every parameter is a JSON value).

    The texts are :func:`flip_texts` (``reviews`` reviews drawn with ``select_seed``); the
    training texts are the first ``max(Ns)`` of them (label-balanced when ``max(Ns)`` is even),
    the new text is the one at position ``held_out ≥ max(Ns)`` (never a training text), with
    its sentiment as label ``y``. Then :func:`wsutils.generalization.flip_runs` with weights
    seed ``seed`` (search seed ``seed + 1``; ``batch_searches``, ``search_dtype`` as there).
    Returns ``{"runs": [...], "review": id of the new text, "y": its label}``.
    """
    Ns = check_Ns(Ns)
    Nmax = max(Ns)
    if not Nmax <= held_out < reviews:
        raise ValueError(
            f"held_out must be a position in the selection after the {Nmax} "
            f"training texts, i.e. between {Nmax} and reviews − 1 = {reviews - 1}; "
            f"got {held_out}."
        )
    Xs, y, ids = flip_texts(
        n=n,
        d=d,
        reviews=reviews,
        select_seed=select_seed,
        keep=keep,
        model=model,
        imdb=imdb,
        max_length=max_length,
    )
    out = flip_runs(
        map,
        Xs[:Nmax],
        y[:Nmax],
        Xs[held_out],
        float(y[held_out]),
        Ns=Ns,
        seed=seed,
        losses=losses,
        trainings=trainings,
        starts=starts,
        steps=steps,
        lr=lr,
        row=row,
        batch_searches=batch_searches,
        search_dtype=search_dtype,
    )
    return {**out, "review": int(ids[held_out]), "y": float(y[held_out])}
