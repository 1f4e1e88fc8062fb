"""The paper's experiments on real text (chapter ``imdb``; the authors' ``utils_data.py`` and
``gen.py --dataset imdb``): texts ``X`` built from IMDb reviews embedded
by a BERT model, and one grid point of the word-sensitivity sweep on them.

:func:`review_matrix` builds ``X`` from one review; :func:`sensitivity_point` is the module-level
per-point function for :func:`wsutils.run.sweep.run_grid`: its parameters are JSON values (the
review is named by its ``review`` id in the loaded dataset), and the model, the dataset and the
embeddings are loaded once per process (the embeddings through the on-disk cache).
:func:`flip_point_imdb` is the grid-point function of the generalization experiment
(:func:`wsutils.generalization.flip_runs`) on labelled reviews (:func:`flip_texts`).
:func:`scale` gives the sizes of the two chapters (``imdb``, ``imdb-generalization``) at one
scale, and :func:`sweep_point` one sweep point's parameters at those sizes.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..checks import check_int
from ..estimators.self_attention import attention_word_sensitivity
from ..generalization import LOSSES, MAPS, TRAININGS, check_Ns, flip_runs
from ..maps import LABELS
from ..run import config
from ..run.seeds import point_seed
from ..search import Search, point_search
from ..sensitivity import check_rows
from ..text.data import load_imdb, select_reviews
from ..text.embeddings import embed, load_model, sample_matrix, word_rows
from ..weights import sample_W, sample_X
from .attention import EVERY_ROW_HALVING, SEARCH_DTYPE

__all__ = [
    "Scale",
    "SCALES",
    "scale",
    "sweep_point",
    "review_matrix",
    "searched_rows",
    "sensitivity_point",
    "flip_texts",
    "flip_split",
    "flip_word_mask",
    "flip_point_imdb",
]

KEEP = ("all", "words")


@dataclass(frozen=True)
class Scale:
    """The imdb chapters' sizes at one scale.

    ``reviews``: reviews selected (half of each label); ``d_divisors``: the sweep's widths
    ``d = h // f`` for the model's width ``h`` (:meth:`ds`); ``ns``: its lengths; ``texts``:
    reviews (and Gaussian texts) per grid point; ``steps``, ``starts``: the attention search
    (every row); ``rf_steps``, ``rf_starts``, ``rf_rows``: the random-features search, over
    ``rf_rows`` rows (:func:`searched_rows`); ``workers``: the sweep's processes. ``gen_*``:
    the generalization experiment (width ``h // gen_d_divisor``, training sizes ``gen_Ns``,
    ``gen_draws`` new texts, the search's ``gen_starts`` and ``gen_steps``); ``word_reviews``:
    the held-out reviews of the real-word flip experiment (chapter ``word-flips``)."""

    reviews: int
    d_divisors: tuple[int, ...]
    ns: tuple[int, ...]
    texts: int
    steps: int
    starts: int
    rf_steps: int
    rf_starts: int
    rf_rows: int
    workers: int
    gen_d_divisor: int
    gen_Ns: tuple[int, ...]
    gen_draws: int
    gen_starts: int
    gen_steps: int
    word_reviews: int

    def ds(self, h: int) -> tuple[int, ...]:
        """The sweep's widths for a model of width ``h``."""
        return tuple(h // f for f in self.d_divisors)

    def gen_d(self, h: int) -> int:
        """The generalization experiment's width for a model of width ``h``."""
        return h // self.gen_d_divisor


SCALES = {
    "quick": Scale(
        reviews=8,
        d_divisors=(4,),
        ns=(10, 20, 40),
        texts=2,
        steps=25,
        starts=2,
        rf_steps=25,
        rf_starts=2,
        rf_rows=16,
        workers=1,
        gen_d_divisor=4,
        gen_Ns=(250, 300),
        gen_draws=1,
        gen_starts=3,
        gen_steps=120,
        word_reviews=1,  # the tests' scale: one review's 39 positions × 30,522 tokens
    ),
    "paper": Scale(  # the attention search as the attention chapter's paper grid
        reviews=100,
        d_divisors=(4, 2, 1),
        ns=(10, 20, 50, 100, 150, 200),
        texts=3,
        steps=100,
        starts=4,
        rf_steps=20,  # RF: every row costs O(k·d) per step
        rf_starts=2,
        rf_rows=8,  # the rows' sups lie within a few % of each other (chapter imdb)
        workers=2,
        gen_d_divisor=1,
        gen_Ns=(1100, 1200, 1300),
        gen_draws=2,
        gen_starts=4,
        gen_steps=300,
        word_reviews=1,  # its claims are existence claims (chapter word-flips)
    ),
}


def scale(name: str | None = None) -> Scale:
    """The imdb chapters' sizes at scale ``name`` (``None``: the current ``WSBOOK_SCALE``)."""
    return config.pick(SCALES, name)


def sweep_point(
    P: Scale,
    map: str,
    n: int,
    d: int,
    source: str,
    review: int,
    *,
    model: str,
    imdb: str | None,
    keep: str = "all",
) -> dict:
    """The parameters of one sweep point for :func:`sensitivity_point` at sizes ``P``: its own
    weights (seed ``point_seed(LABELS[map], source, d, n, review)``: the map's label names
    its draws, those of every build since the first), the search of ``map`` (random
    features: ``P.rf_*`` over ``P.rf_rows`` rows spread evenly, :func:`searched_rows`;
    attention: ``P.steps`` and ``P.starts`` over
    every row, in the precision of the attention chapters' grids,
    :data:`wsutils.experiments.attention.SEARCH_DTYPE`, with the successive halving
    :data:`wsutils.experiments.attention.EVERY_ROW_HALVING`)."""
    if map not in MAPS:
        raise ValueError(f"map must be one of {MAPS}, got {map!r}.")
    if map == "rf":
        search = dict(starts=P.rf_starts, steps=P.rf_steps)
        search = dict(rows=searched_rows(int(n), P.rf_rows), search=search)
    else:
        search = dict(starts=P.starts, steps=P.steps, dtype=SEARCH_DTYPE[map])
        search = dict(rows=None, search=search | dict(halving=EVERY_ROW_HALVING))
    return dict(
        map=map,
        n=int(n),
        d=int(d),
        source=source,
        review=int(review),
        seed=point_seed(LABELS[map], source, int(d), int(n), int(review)),
        keep=keep,
        model=model,
        imdb=imdb,
        **search,
    )


def _dataset(imdb: str | None):
    # not cached here: load_imdb caches a local file by its content's sha256, so a file
    # changed in place is read again
    return load_imdb(imdb)


@functools.lru_cache(maxsize=256)
def _embedded(model: str, imdb: str | None, review: int, max_length: int):
    ds = _dataset(imdb)
    if not 0 <= review < len(ds):
        raise ValueError(
            f"review must be the id of a review, in [0, {len(ds)}) for this data set, got "
            f"{review} (a negative id is not counted from the end)."
        )
    text = ds[review]["text"]
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
    review = check_int("review", review, minimum=0)
    E, mask = _embedded(model, imdb, review, check_int("max_length", max_length, minimum=2))
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
    search: dict,
    model: str,
    imdb: str | None,
    rows: Sequence[int] | None = None,
    rf_mode: str = "rows",
) -> dict:
    """One point of the sweep: the word sensitivity (:prf:ref:`def-word-sensitivity`) of
    ``map`` — ``"rf"`` (``k = D = n·d``, the exact estimator
    :func:`wsutils.estimators.rf.rf_word_sensitivity`, which never forms ``V``), ``"raf"`` or
    ``"relu"`` (weights ``W`` drawn with ``seed``) — searched over **every** row
    (``rows=None``), or over the rows ``rows`` (indices; :func:`sweep_point` spreads them
    evenly, :func:`searched_rows`; ``S`` is then the sup over those rows only).

    ``rf_mode`` (RF only): ``"rows"`` draws ``V flat(X)`` jointly with the searched column
    blocks only (:func:`wsutils.estimators.rf.rf_rows_law`, :prf:ref:`prop-rf-rows-law`: a
    draw of the same law as ``"blocks"``, which draws all ``n`` blocks to form
    ``V flat(X)``); with every row searched the two are the same draw. The RF upper
    certificate is not computed (``upper=False``; nothing here returns it).

    ``search``: a dict of :class:`~wsutils.search.Search`'s fields
    (:func:`wsutils.search.point_search`; ``starts`` and ``steps``, and for attention the
    ``dtype`` of the search, ``None``: float64, or ``"float32"``), over the estimator's own
    defaults (:data:`wsutils.estimators.rf.RF_SEARCH` for RF, whose starts are seeded by
    ``seed + 1``; ``Search()`` seeded by ``seed`` for attention). The search only proposes
    ``Δ``: every returned value is recomputed with the full map in float64 on the float64
    text.

    ``source="imdb"``: the text of review ``review`` (:func:`review_matrix`, rows ``keep``);
    ``source="gaussian"``: i.i.d. rows of norm ``√d`` drawn with seed ``review`` (the synthetic
    chapters' texts), for a side-by-side comparison. Returns the sup over rows (``S``), the
    value for the first row alone (``S_first``, what the authors' scripts report), the row
    attaining the sup, the smallest value over the searched rows (``S_row_min``), the number
    of rows searched (``n_rows``), the upper certificate over the searched rows (``upper``:
    attention, :func:`wsutils.estimators.upper.attention_certified_upper`; with every row
    searched, as in the sweep, ``S ≤ S(X) ≤ upper``; NaN where the library has none, and for
    random features, whose bound over every word is
    :func:`wsutils.estimators.rf.rf_high_probability_bound`, a function of the sizes alone)
    and the wall time of the search and the certificate."""
    from ..estimators.rf import rf_word_sensitivity

    if map not in MAPS:
        raise ValueError(f"map must be one of {MAPS}, got {map!r}.")
    search = point_search(search)
    if rf_mode not in ("rows", "blocks"):
        raise ValueError(f"rf_mode must be 'rows' or 'blocks', got {rf_mode!r}.")
    if source == "imdb":
        X = review_matrix(review, n, d, keep=keep, model=model, imdb=imdb)
    elif source == "gaussian":
        X = sample_X(n, d, seed=review).numpy()
    else:
        raise ValueError(f"source must be 'imdb' or 'gaussian', got {source!r}.")
    picked = None if rows is None else check_rows(list(rows), n)
    t0 = time.perf_counter()
    if map == "rf":
        r = rf_word_sensitivity(
            X,
            n * d,
            rows=picked,
            seed=seed,
            search=search,
            mode="blocks" if picked is None else rf_mode,
            upper=False,  # never returned: S, the lower bound and the search are unchanged
        )
    else:
        # the search of wsutils.sensitivity.word_sensitivity, in O(n·d) per start and step
        r = attention_word_sensitivity(
            X,
            sample_W(d, seed=seed),
            normalisation=map,
            rows=picked,
            search=Search.parse(search, seed=seed),
            upper=True,  # every row searched: value ≤ S ≤ upper where a certificate exists
        )
    return {
        "S": r.value,
        "S_first": r.per_row[0],
        "row": r.row,
        "S_row_min": min(r.per_row.values()),
        "n_rows": len(r.per_row),
        "upper": math.nan if r.upper is None else float(r.upper),
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


#: The arguments of :func:`flip_word_mask` that a grid point of :func:`flip_point_imdb` holds.
FLIP_TEXT_KEYS = ("reviews", "select_seed", "model", "imdb", "max_length")


def flip_word_mask(
    *,
    reviews: int,
    select_seed: int,
    model: str | None = None,
    imdb: str | None = None,
    max_length: int = 256,
) -> np.ndarray:
    """Which rows of :func:`flip_texts`' texts (the same selection) hold a word of their
    review: ``(reviews, max_length)`` booleans, from the tokenizer's attention mask, false at
    ``[CLS]``, ``[SEP]`` and ``[PAD]`` (:func:`wsutils.text.embeddings.word_rows`). A
    grid point's ``row`` changes a word of the new text ``held_out`` where
    ``mask[held_out, row]`` holds."""
    model = config.model() if model is None else model
    imdb = None if imdb is None else str(imdb)
    _, mask, _, _ = _flip_embedded(model, imdb, int(reviews), int(select_seed), int(max_length))
    return word_rows(mask)


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
    search: dict | None = None,
    row: int = 0,
    batch_searches: bool = True,
) -> dict:
    """One grid point of the generalization experiment on IMDb reviews, for
    :func:`wsutils.run.sweep.run_grid` (every parameter is a JSON value).

    The texts are :func:`flip_texts` (``reviews`` reviews drawn with ``select_seed``); the
    training texts are the first ``max(Ns)`` of them (label-balanced when ``max(Ns)`` is even),
    the new text is the one at position ``held_out ≥ max(Ns)`` (never a training text), with
    its sentiment as label ``y``. Then :func:`wsutils.generalization.flip_runs` with weights
    seed ``seed`` (search seed ``seed + 1``; ``search``, a dict of
    :class:`~wsutils.search.Search`'s fields over
    ``wsutils.generalization.FLIP_SEARCH``, and ``batch_searches`` as there).
    Returns ``{"runs": [...], "review": id of the new text, "y": its label}``.
    """
    Ns = check_Ns(Ns)
    Xs, Y, X, y, review = flip_split(
        Ns=Ns,
        held_out=held_out,
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
        Xs,
        Y,
        X,
        y,
        Ns=Ns,
        seed=seed,
        losses=losses,
        trainings=trainings,
        search=point_search(search),
        row=row,
        batch_searches=batch_searches,
    )
    return {**out, "review": review, "y": y}


def flip_split(*, Ns: list[int], held_out: int, reviews: int, **texts):
    """The generalization experiment's texts on IMDb (:func:`flip_texts` of ``reviews``
    reviews, ``texts`` its other arguments): the training texts, the first ``max(Ns)`` of the
    selection, and the new text, the one at position ``held_out`` (never a training text).
    Returns ``(Xs, Y, X, y, review)``: the training texts and labels, the new text, its label
    and its review's id. A ValueError unless ``max(Ns) ≤ held_out < reviews``."""
    Nmax = max(Ns)
    if not Nmax <= held_out < reviews:
        raise ValueError(
            f"held_out must be a position in the selection after the {Nmax} "
            f"training texts, i.e. between {Nmax} and reviews − 1 = {reviews - 1}; "
            f"got {held_out}."
        )
    Xs, y, ids = flip_texts(reviews=reviews, **texts)
    return Xs[:Nmax], y[:Nmax], Xs[held_out], float(y[held_out]), int(ids[held_out])
