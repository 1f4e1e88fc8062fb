"""Can one real word flip a model trained on IMDb reviews? (issue 35; the models of the
imdb-generalization chapter.)

:func:`word_flip_point` trains the flip experiment's models on ``N`` reviews (min-norm
interpolation, then fine-tuning or re-training on a held-out review ``X``,
:prf:ref:`def-flip-problem`) and scores every real one-token substitution of ``X``: every
position of its first ``n`` tokens that holds a word (not ``[CLS]``, ``[SEP]`` or
``[PAD]``), every token of the vocabulary there
(:func:`wsutils.text.token_rows.substitution_rows`: one substitution changes one row), each
substituted text read out exactly by every trained model
(:func:`wsutils.generalization.word_scores`). A model is flipped by a word when
``y·t₁ < 0`` on the substituted text; a model no word flips is certified so, for this
review, by the exhaustive scoring.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import torch

from .. import generalization as G
from ..generalization import TRAININGS, check_Ns
from ..maps import LABELS, Normalisation
from ..run import config
from ..text.data import load_imdb
from ..text.embeddings import load_model
from ..text.token_rows import substitution_rows
from ..weights import sample_W
from .imdb import flip_split

__all__ = ["word_flip_point", "review_ids", "BOUND_MARGIN"]

#: A random-features candidate is ruled out for a model when its lower bound
#: (:func:`wsutils.generalization.rf_word_bounds`) exceeds this, far above the float64
#: rounding of the bound's terms (outputs of order one), so no rounding can rule out a flip.
BOUND_MARGIN = 1e-6


def review_ids(enc, review: int, *, imdb: str | None, max_length: int) -> list[int]:
    """The token ids of review ``review`` (its row in :func:`wsutils.text.data.load_imdb`, as
    :func:`wsutils.experiments.imdb.flip_split` returns it), tokenized as its embedding was
    (``[CLS]`` … ``[SEP]``, padded to ``max_length``)."""
    text = load_imdb(imdb)[int(review)]["text"]
    return enc.tokenizer(text, padding="max_length", truncation=True, max_length=max_length)[
        "input_ids"
    ]


def word_flip_point(
    *,
    map: str,
    n: int,
    d: int,
    Ns: list[int],
    seed: int,
    reviews: int,
    select_seed: int,
    held_out: int,
    model: str | None = None,
    imdb: str | None = None,
    max_length: int = 128,
    trainings: Sequence[str] = TRAININGS,
    positions: list[int] | None = None,
    tau: float = 0.3,
    checked: int = 16,
) -> dict:
    """One review of the real-word flip experiment, for :func:`wsutils.run.sweep.run_grid`
    (every parameter a JSON value). The texts, the training set (the first ``max(Ns)``
    reviews), the held-out review and the weights (seed ``seed``) are those of
    :func:`wsutils.experiments.imdb.flip_point_imdb`; ``map`` is ``"rf"`` (``k = n·d``),
    ``"raf"`` or ``"relu"``. ``positions``: the positions to score (default: every word
    position ``< n``).

    Random features: each candidate's lower bounds ``L ≤ y·t₁``
    (:func:`wsutils.generalization.rf_word_bounds`, exact remainders of the units with
    ``|h_l| ≤ tau`` that can lower an output) rule it out
    for every model where ``L > BOUND_MARGIN``; the rest are scored exactly, and so are up to
    ``checked`` ruled-out candidates a position (drawn with ``seed``), to check the bound.
    Attention: every candidate is scored exactly.

    Returns ``{"runs": [...], "review", "y", "positions", "tokens", "in_ball",
    "certified_positions", "certificate", "bound_gap", "seconds"}``: per ``(N, training)`` a
    run with ``t1`` (the model's output on ``X`` itself), ``flips`` (the substitutions with
    ``y·t₁ < 0``), ``flipped_positions``, the scored substitution with the smallest ``y·t₁``
    (``best_position``, ``best_token``, ``best_t1``; ``-1``, ``-1``, ``None`` if none was
    scored), ``ruled_out`` and ``scored`` (candidates ruled out by the bound, scored exactly)
    and ``bound_min``, the smallest bound ``L`` of a ruled-out candidate (``None`` if none),
    so that every candidate has ``y·t₁ ≥ min(y·best_t1, bound_min)``;
    ``tokens``: the vocabulary size (every token a candidate at every position); ``in_ball``:
    how many candidates land in the ball ``‖x' − x_i‖ ≤ √d`` of the continuous search;
    ``certified_positions``: random features' positions where :prf:ref:`prop-flip-bound`'s
    certificate ``‖θ_j‖ ‖V_i‖_op max_v ‖Δ_v‖ < y·t_j`` rules out every token for every model
    at once, and ``certificate`` the smallest over positions of ``max_j`` of that bound over
    ``y·t_j`` (below one: certified; ``None`` for attention); ``bound_gap``: the smallest
    ``y·t₁ − L`` over the ruled-out candidates scored anyway (``None`` if none; below zero
    only by rounding).
    """
    if map not in LABELS:
        raise ValueError(f"map must be one of {tuple(LABELS)}, got {map!r}.")
    Ns = check_Ns(Ns)
    t0 = time.perf_counter()
    model = config.model() if model is None else model
    enc = load_model(model)
    Xs, Y, X, y, review = flip_split(
        Ns=Ns,
        held_out=held_out,
        n=n,
        d=d,
        reviews=reviews,
        select_seed=select_seed,
        model=model,
        imdb=imdb,
        max_length=max_length,
    )
    X, train = torch.as_tensor(X), torch.as_tensor(Xs)
    tokens = review_ids(enc, review, imdb=imdb, max_length=max_length)
    special = set(enc.tokenizer.all_special_ids)
    words = [p for p in range(n) if tokens[p] not in special]
    positions = words if positions is None else [int(p) for p in positions]
    if not positions or any(p not in words for p in positions):
        raise ValueError(f"positions must be word positions of the review, some of {words}.")
    if map == "rf":
        k = n * d
        H, _ = G.rf_preactivations(torch.cat([train, X[None]]), k, seed=seed)
        V = G.sample_V_blocked(k, n, d, seed=seed)  # float32, as the features were made
        feats = torch.relu(H)
    else:
        norm = Normalisation.parse(map)
        W = sample_W(d, seed=seed)
        feats = G.attention_features(torch.cat([train, X[None]]), W, norm)
    Phi, phi = feats[:-1], feats[-1]
    thetas, keys = G.trained_readouts(Phi, Y, phi, y, Ns=Ns, trainings=trainings)
    t1 = (phi @ thetas.T).numpy()
    low = np.full(len(keys), np.inf)
    best = [(-1, -1)] * len(keys)
    flips = np.zeros(len(keys), dtype=np.int64)
    ruled_out = np.zeros(len(keys), dtype=np.int64)
    bound_min = np.full(len(keys), np.inf)  # the smallest bound of a ruled-out candidate
    flipped_at = [[] for _ in keys]
    in_ball, certified, certificate, gap = 0, 0, np.inf, np.inf
    rng = np.random.default_rng(seed)
    for p in positions:
        rows = torch.as_tensor(substitution_rows(enc, tokens, p, d))
        own = rows[tokens[p]]
        if not torch.allclose(own, X[p], rtol=1e-5, atol=1e-5):
            raise RuntimeError(
                f"the substitution row of the review's own token at position {p} is not the "
                "text's row: the review's tokens and its embedding disagree."
            )
        change = torch.linalg.vector_norm(rows - X[p], dim=1)
        in_ball += int((change <= d**0.5).sum())
        if map == "rf":
            Vi = V[:, p * d : (p + 1) * d].double()
            fm = G.rf_flip_model(H[-1], Vi)
            # prop-flip-bound's certificate, one bound for the whole position
            move = thetas.norm(dim=1) * fm.change_bound / d**0.5 * float(change.max())
            ratio = float((move / (y * torch.as_tensor(t1))).max())
            certified, certificate = certified + int(ratio < 1), min(certificate, ratio)
            L = G.rf_word_bounds(H[-1], Vi, X[p], rows, thetas, y, tau=tau)
            out = L > BOUND_MARGIN  # (T, m): ruled out by prop-word-bound
            ruled_out += out.sum(0).numpy()
            bound_min = np.minimum(bound_min, torch.where(out, L, np.inf).amin(0).numpy())
            scored = torch.nonzero(~out.all(1)).flatten()
            check = torch.nonzero(out.any(1)).flatten().numpy()
            check = torch.as_tensor(rng.permutation(check)[:checked])
        else:
            fm = G.attention_flip_model(X, W, norm, p)
            scored, check = torch.arange(len(rows)), torch.arange(0)
        yt = np.full((len(rows), len(keys)), np.inf)
        both = torch.cat([scored, check])
        if len(both):
            exact = (y * G.word_scores(fm, X[p], rows[both], thetas)).numpy()
            yt[scored.numpy()] = exact[: len(scored)]
            if len(check):  # ruled-out candidates scored anyway: the bound holds
                bound = L[check].numpy()
                slack = np.where(bound > BOUND_MARGIN, exact[len(scored) :] - bound, np.inf)
                gap = min(gap, float(slack.min()))
        for j in range(len(keys)):
            v = int(np.argmin(yt[:, j]))
            if yt[v, j] < low[j]:
                low[j], best[j] = yt[v, j], (p, v)
            hits = int((yt[:, j] < 0).sum())
            flips[j] += hits
            if hits:
                flipped_at[j].append(p)
    runs = [
        {
            "N": N,
            "training": training,
            "t1": float(t1[j]),
            "flips": int(flips[j]),
            "flipped_positions": flipped_at[j],
            "best_position": best[j][0],
            "best_token": best[j][1],
            "best_t1": float(y * low[j]) if np.isfinite(low[j]) else None,
            "ruled_out": int(ruled_out[j]),
            "bound_min": float(bound_min[j]) if np.isfinite(bound_min[j]) else None,
            "scored": len(positions) * int(enc.vocab_size) - int(ruled_out[j]),
        }
        for j, (N, training) in enumerate(keys)
    ]
    return {
        "runs": runs,
        "review": review,
        "y": y,
        "positions": positions,
        "tokens": int(enc.vocab_size),
        "in_ball": in_ball,
        "certified_positions": certified,
        "certificate": certificate if np.isfinite(certificate) else None,
        "bound_gap": gap if np.isfinite(gap) else None,
        "seconds": time.perf_counter() - t0,
    }
