"""Can one real word flip a model trained on IMDb reviews? (issue 35; the models of the
imdb-generalization chapter.)

:func:`word_flip_point` trains the flip experiment's models on ``N`` reviews (min-norm
interpolation, then fine-tuning or re-training on a held-out review ``X``,
:prf:ref:`def-flip-problem`) and scores every real one-token substitution of ``X``: every
position of its first ``n`` tokens that holds a word (not ``[CLS]``, ``[SEP]`` or
``[PAD]``), every token of the vocabulary there
(:func:`wsutils.text.token_rows.substitution_rows`: one substitution changes one row), each
substituted text read out exactly by every trained model
(:func:`wsutils.generalization.word_scores`), the rows made once for every map. A model is
flipped by a word when
``y·t₁ < 0`` on the substituted text; a model no word flips is certified so, for this
review, by the exhaustive scoring.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
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
    n: int,
    d: int,
    Ns: list[int],
    seed: int,
    reviews: int,
    select_seed: int,
    held_out: int,
    maps: Sequence[str] = ("rf", "raf", "relu"),
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
    :func:`wsutils.experiments.imdb.flip_point_imdb`; ``maps``: some of ``"rf"``
    (``k = n·d``), ``"raf"`` and ``"relu"``, every one scored on the same candidate rows.
    ``positions``: the positions to score (default: every word position ``< n``).

    Random features: each candidate's lower bounds ``L ≤ y·t₁``
    (:func:`wsutils.generalization.rf_word_bounds`, exact remainders of the units with
    ``|h_l| ≤ tau`` that can lower an output) rule it out for every model where
    ``L > BOUND_MARGIN``; the rest are scored exactly, and so are up to ``checked``
    ruled-out candidates a position (drawn with ``seed``), to check the bound. Attention:
    every candidate is scored exactly.

    Returns ``{"runs": [...], "review", "y", "positions", "tokens", "in_ball",
    "certified_positions", "certificate", "bound_gap", "seconds"}``: per map, ``N`` and
    training a run with ``map``, ``t1`` (the model's output on ``X`` itself), ``flips`` (the
    substitutions with ``y·t₁ < 0``), ``flipped_positions``, the scored substitution with the
    smallest ``y·t₁`` (``best_position``, ``best_token``, ``best_t1``; ``-1``, ``-1``,
    ``None`` if none was scored), ``ruled_out`` and ``scored`` (candidates ruled out by the
    bound, scored exactly) and ``bound_min``, the smallest bound ``L`` of a ruled-out
    candidate (``None`` if none), so that every candidate has
    ``y·t₁ ≥ min(y·best_t1, bound_min)``; ``tokens``: the vocabulary size (every token a
    candidate at every position); ``in_ball``: how many candidates land in the ball
    ``‖x' − x_i‖ ≤ √d`` of the continuous search; random features' (``None`` without
    ``"rf"``): ``certified_positions``, the positions where :prf:ref:`prop-flip-bound`'s
    certificate ``‖θ_j‖ ‖V_i‖_op max_v ‖Δ_v‖ < y·t_j`` rules out every token for every model
    at once, ``certificate``, the smallest over positions of ``max_j`` of that bound over
    ``y·t_j`` (below one: certified), and ``bound_gap``, the smallest ``y·t₁ − L`` over the
    ruled-out candidates scored anyway (``None`` if none; below zero only by rounding);
    ``seconds``: the whole point's, and ``map_seconds``, each map's models and scores.
    """
    maps = list(maps)
    if not maps or any(m not in LABELS for m in maps) or len(set(maps)) < len(maps):
        raise ValueError(f"maps must be distinct ones of {tuple(LABELS)}, got {maps!r}.")
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
    scorers = {}
    for m in maps:
        t = time.perf_counter()
        scorers[m] = _Scorer.train(m, train, Y, X, y, Ns=Ns, trainings=trainings, seed=seed)
        scorers[m].seconds += time.perf_counter() - t
    in_ball = 0
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
        for sc in scorers.values():
            t = time.perf_counter()
            sc.position(p, X, rows, change, tau=tau, checked=checked, rng=rng)
            sc.seconds += time.perf_counter() - t
    rf = scorers.get("rf")
    candidates = len(positions) * int(enc.vocab_size)
    return {
        "runs": [run for sc in scorers.values() for run in sc.runs(candidates)],
        "review": review,
        "y": y,
        "positions": positions,
        "tokens": int(enc.vocab_size),
        "in_ball": in_ball,
        "certified_positions": None if rf is None else rf.certified,
        "certificate": None if rf is None else _finite(rf.certificate),
        "bound_gap": None if rf is None else _finite(rf.gap),
        "seconds": time.perf_counter() - t0,
        "map_seconds": {m: sc.seconds for m, sc in scorers.items()},
    }


def _finite(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None


@dataclass
class _Scorer:
    """One map's trained models on one review (:func:`word_flip_point`): their read-outs
    ``thetas`` (one row per ``(N, training)`` of ``keys``), their outputs ``t1`` on the
    review, what the map needs to score a candidate row, and the tallies over positions
    (:meth:`position` adds one, :meth:`runs` reads them)."""

    map: str
    thetas: torch.Tensor
    keys: list
    t1: np.ndarray
    y: float
    features: dict  # rf: h (k,), V; attention: W, norm
    seconds: float = 0.0
    certified: int = 0
    certificate: float = np.inf
    gap: float = np.inf

    def __post_init__(self):
        # per model, over the positions scored so far
        m = len(self.keys)
        self.low = np.full(m, np.inf)  # the smallest y·t₁ scored
        self.best = [(-1, -1)] * m  # where: (position, token)
        self.flips = np.zeros(m, dtype=np.int64)
        self.ruled_out = np.zeros(m, dtype=np.int64)
        self.bound_min = np.full(m, np.inf)  # the smallest bound of a ruled-out candidate
        self.flipped_at = [[] for _ in range(m)]

    @classmethod
    def train(cls, map, train, Y, X, y, *, Ns, trainings, seed) -> "_Scorer":
        n, d = X.shape
        if map == "rf":
            k = n * d
            H, _ = G.rf_preactivations(torch.cat([train, X[None]]), k, seed=seed)
            V = G.sample_V_blocked(k, n, d, seed=seed)  # float32, as the features were made
            feats, features = torch.relu(H), dict(h=H[-1], V=V)
        else:
            norm = Normalisation.parse(map)
            W = sample_W(d, seed=seed)
            feats = G.attention_features(torch.cat([train, X[None]]), W, norm)
            features = dict(W=W, norm=norm)
        thetas, keys = G.trained_readouts(feats[:-1], Y, feats[-1], y, Ns=Ns, trainings=trainings)
        t1 = (feats[-1] @ thetas.T).numpy()
        return cls(map, thetas, keys, t1, y, features)

    def position(self, p, X, rows, change, *, tau, checked, rng) -> None:
        """Score, or rule out, every candidate row at position ``p`` for every model."""
        y, thetas = self.y, self.thetas
        d = X.shape[1]
        if self.map == "rf":
            h, V = self.features["h"], self.features["V"]
            Vi = V[:, p * d : (p + 1) * d].double()
            fm = G.rf_flip_model(h, Vi)
            # prop-flip-bound's certificate, one bound for the whole position
            move = thetas.norm(dim=1) * fm.change_bound / d**0.5 * float(change.max())
            ratio = float((move / (y * torch.as_tensor(self.t1))).max())
            self.certified += int(ratio < 1)
            self.certificate = min(self.certificate, ratio)
            L = G.rf_word_bounds(h, Vi, X[p], rows, thetas, y, tau=tau)
            out = L > BOUND_MARGIN  # (T, m): ruled out by prop-word-bound
            self.ruled_out += out.sum(0).numpy()
            self.bound_min = np.minimum(
                self.bound_min, torch.where(out, L, np.inf).amin(0).numpy()
            )
            scored = torch.nonzero(~out.all(1)).flatten()
            check = torch.nonzero(out.any(1)).flatten().numpy()
            check = torch.as_tensor(rng.permutation(check)[:checked])
        else:
            fm = G.attention_flip_model(X, self.features["W"], self.features["norm"], p)
            scored, check = torch.arange(len(rows)), torch.arange(0)
        yt = np.full((len(rows), len(self.keys)), np.inf)
        both = torch.cat([scored, check])
        if len(both):
            exact = (y * G.word_scores(fm, X[p], rows[both], thetas)).numpy()
            yt[scored.numpy()] = exact[: len(scored)]
            if len(check):  # ruled-out candidates scored anyway: the bound holds
                bound = L[check].numpy()
                slack = np.where(bound > BOUND_MARGIN, exact[len(scored) :] - bound, np.inf)
                self.gap = min(self.gap, float(slack.min()))
        for j in range(len(self.keys)):
            v = int(np.argmin(yt[:, j]))
            if yt[v, j] < self.low[j]:
                self.low[j], self.best[j] = yt[v, j], (p, v)
            hits = int((yt[:, j] < 0).sum())
            self.flips[j] += hits
            if hits:
                self.flipped_at[j].append(p)

    def runs(self, candidates: int) -> list[dict]:
        """One record per trained model, of the ``candidates`` each was given (positions
        scored × tokens)."""
        return [
            {
                "map": self.map,
                "N": N,
                "training": training,
                "t1": float(self.t1[j]),
                "flips": int(self.flips[j]),
                "flipped_positions": self.flipped_at[j],
                "best_position": self.best[j][0],
                "best_token": self.best[j][1],
                "best_t1": float(self.y * self.low[j]) if np.isfinite(self.low[j]) else None,
                "ruled_out": int(self.ruled_out[j]),
                "bound_min": _finite(self.bound_min[j]),
                "scored": candidates - int(self.ruled_out[j]),
            }
            for j, (N, training) in enumerate(self.keys)
        ]
