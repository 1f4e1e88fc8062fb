"""The attention-sink chapter's sizes and its per-point function (run with
:func:`wsutils.run.sweep.run_grid`).

A point is one synthetic text with a sink token in front, ``(x_0; x_1, …, x_n)``: the words are
a text of :func:`wsutils.weights.sample_X` (rows of norm ``√d``), the sink's row ``x_0`` is its
own Gaussian row rescaled to ``value·√d`` (``value`` 0, 0.1 or 1: a zero, a small or a real
token's value), the weights are :func:`wsutils.weights.sample_W`, and the sink's margin ``b_0``
is added to every query's score on key 0 (eq. :eq:`eq-sink-attention`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ..estimators.self_attention import attention_word_sensitivity
from ..estimators.softmax_upper import off_sink_exponents, softmax_certified_upper
from ..estimators.takeover import constructions
from ..maps import Normalisation, attention_scores, normalise_scores
from ..run import config
from ..run.seeds import point_seed
from ..trained import head_attention, head_grid, head_upper_grid, head_weights
from ..weights import sample_W, sample_X

__all__ = [
    "SCALES",
    "SEARCH",
    "SINK_VALUES",
    "Scale",
    "certified_slopes",
    "grid_points",
    "head_sinks",
    "scale",
    "sink_point",
    "sink_positions",
    "sink_text",
]

#: The sink's value ``x_0`` as a multiple of a row of norm ``√d``.
SINK_VALUES = {"zero": 0.0, "small": 0.1, "real": 1.0}

#: The estimator's search at a grid point, 2 random starts and the 7 constructions, 100 steps.
#: On texts of the paper grid (d = 192, 768; n = 20, 100, 250; zero and real values; margins 8
#: to 48) it found the default search's value (8 starts, 200 steps) to 3 digits at 0.4 of its
#: cost; a referee's reruns at d = 192 found up to 3.2 % more with 8 starts and 300 steps. A
#: float32 search lost the smallest values (1e-8) to rounding.
SEARCH = {"starts": 2, "steps": 100}


@dataclass(frozen=True)
class Scale:
    """The sizes of the attention-sink chapter at one scale: widths ``ds`` and lengths ``ns``
    (those of the attention chapters, :mod:`wsutils.experiments.attention`), the sink margins
    ``margins``, ``seeds`` texts per point, the ``rows`` (words) whose certified lower bound
    is computed, the ``workers`` of the grid's process pool, ``search``: the settings of the
    estimator for the sink map (:func:`~wsutils.estimators.self_attention.\
attention_word_sensitivity` with the constructions as extra starts), and ``search_every``:
    it runs at the margins that are multiples of it, on the first text of each ``(d, n)``
    (:func:`grid_points`)."""

    ds: tuple[int, ...]
    ns: tuple[int, ...]
    margins: tuple[float, ...]
    seeds: int
    rows: tuple[int, ...]
    workers: int
    search: dict = dataclasses.field(default_factory=lambda: dict(SEARCH))
    search_every: float = 8.0


SCALES = {
    "quick": Scale(
        ds=(192,),
        ns=(10, 20, 50, 100, 250),
        margins=tuple(float(b) for b in range(0, 49, 4)),
        seeds=1,
        rows=(1,),
        workers=1,
    ),
    "paper": Scale(
        ds=(192, 384, 768),
        ns=(10, 20, 50, 100, 250),
        margins=tuple(float(b) for b in range(0, 49, 4)),
        seeds=2,
        rows=(1,),
        workers=2,
    ),
}


def scale(name: str | None = None) -> Scale:
    """The chapter's :class:`Scale` at ``name`` (``"quick"`` or ``"paper"``; ``None``: the
    current ``WSBOOK_SCALE``)."""
    return config.pick(SCALES, name)


def sink_text(n: int, d: int, value: str, seed: int) -> torch.Tensor:
    """``(x_0; X)``, ``(n + 1) × d`` float64: the words ``X`` (``sample_X(n + 1, d, seed)``
    without its row 0) and the sink's row ``x_0``, that row 0 scaled by
    ``SINK_VALUES[value]``."""
    if value not in SINK_VALUES:
        raise ValueError(f"value must be one of {tuple(SINK_VALUES)}, got {value!r}.")
    X = sample_X(n + 1, d, seed=seed)
    X[0] *= SINK_VALUES[value]
    return X


@functools.lru_cache(maxsize=4)
def _text_parts(d: int, n: int, value: str, seed: int, rows: tuple[int, ...]):
    """What a point's margin does not change, kept for the next margins of the same text in
    this process (keyed on everything that makes it): the text, the weights, the scores of
    the text and, per row, the texts the constructions make
    (:func:`wsutils.estimators.takeover.constructions`: for softmax they depend on ``X`` and
    ``W`` only) and their scores, and the text's three margins (:func:`_margins`). Read-only
    for its callers."""
    X = sink_text(n, d, value, seed)
    W = sample_W(d, seed=seed + 1)
    changed = {}
    for r in rows:
        cands = constructions(X, W, r, Normalisation("softmax"))
        texts = X.expand(len(cands), -1, -1).clone()
        texts[:, r] += cands
        changed[r] = (texts, attention_scores(texts, W))
    s = attention_scores(X, W)
    return X, W, s, changed, _margins(X, W, s)


def _margins(X: torch.Tensor, W: torch.Tensor, s: torch.Tensor) -> dict:
    """The margins of :func:`sink_point` that do not depend on ``b_0``: ``margin_half``,
    ``margin_own`` and ``margin_rows`` (see there), from the scores ``s`` of the text."""
    n = X.shape[0] - 1
    half = torch.logsumexp(s[:, 1:], dim=1) - s[:, 0]
    own = off_sink_exponents(X, W, 1.0, torch.tensor([1]))[0]  # word 1, b_0 = 0
    reach = s + torch.linalg.vector_norm(X @ W, dim=1)[:, None] - s[:, :1]  # [j, i]
    reach.fill_diagonal_(-math.inf)
    return {
        "margin_half": float(half.median()),
        "margin_own": float(torch.logsumexp(own, 0)),
        "margin_rows": float(reach[:, 1:].max()) + 0.5 * math.log(n),
    }


def _constructions_lower(parts, norm: Normalisation) -> float:
    """The certified lower bound of :func:`~wsutils.estimators.takeover.certified_lower_bound`
    over the rows of ``parts`` (``_text_parts``), from their cached scores: the largest
    float64 relative change of the map ``normalise_scores(s, norm) X`` over the constructions."""
    X, _, s, changed, _ = parts
    base = normalise_scores(s, norm) @ X
    base_norm = torch.linalg.vector_norm(base)
    best = 0.0
    for texts, scores in changed.values():
        out = normalise_scores(scores, norm) @ texts
        change = torch.linalg.vector_norm((out - base).flatten(1), dim=1) / base_norm
        best = max(best, float(change.max()))
    return best


def sink_point(
    d: int, n: int, margin: float, value: str, seed: int, rows=(1,), search=None
) -> dict:
    """One text with a sink (:func:`sink_text`, weights ``sample_W(d, seed + 1)``) at margin
    ``b_0 = margin``.

    ``lower`` is a certified lower bound on ``S`` at the words ``rows``: with ``search`` (a
    dict of :class:`wsutils.search.Search` settings), the value the estimator for the sink map
    finds (:func:`~wsutils.estimators.self_attention.attention_word_sensitivity` with
    ``takeovers=True``: the constructions are among its starts, ``seed=0``); without it, the
    constructions' certified lower bound alone (``lower_constructions``, the value of
    :func:`wsutils.estimators.takeover.certified_lower_bound` from scores kept per text across
    margins, ``_text_parts``), and ``searched`` says which. ``upper`` is the upper certificate
    (:prf:ref:`prop-softmax-upper`, row-wise) at the same words, ``upper_all`` over every word
    (an upper bound on ``S``). The joint certificate of :prf:ref:`prop-softmax-joint` is left
    out: at the word alone it cost about 23 CPU s over the paper grid's 1170 points, a third of
    the chapter's growth past the build budget. Then the sink's smallest and mean weight over
    the rows, ``mass_min`` and ``mass_mean`` (``a_{j0}``); ``phi_norm``, ``‖φ(X)‖_F/√((n +
    1)d)``; ``margin_half``, the median over rows ``j`` of the margin at which the sink takes
    half of row ``j`` (``log Σ_{k≥1} e^{s_jk} − s_j0``); ``margin_own``, ``log Σ_{k≥1}
    e^{s̄_1k}`` (:func:`~wsutils.estimators.softmax_upper.off_sink_exponents`), so that
    :prf:ref:`prop-sink-rows` (part 2) bounds word 1's weight off the sink by ``1 − a'_10 ≤
    e^{margin_own − b_0}`` for every ``Δ`` (below 1 past it); and ``margin_rows``, the margin
    past which :prf:ref:`prop-sink-real`'s condition holds (``max_{j, i ≥ 1, i ≠ j} s_ji +
    ‖Wᵀx_j‖ − s_j0 + ½ log n``).
    The last three do not depend on ``margin``."""
    torch.set_num_threads(1)
    parts = _text_parts(d, n, value, seed, tuple(rows))
    X, W, s, _, margins = parts
    norm = Normalisation("softmax", sink=margin)
    cons = _constructions_lower(parts, norm)
    lower = cons
    if search is not None:
        found = attention_word_sensitivity(
            X,
            W,
            normalisation=norm,
            rows=list(rows),
            takeovers=True,
            seed=0,
            upper=False,
            **search,
        )  # U below bounds every word
        lower = found.value
    U = softmax_certified_upper(X, W, normalisation=norm, joint=False)  # the build budget
    A = normalise_scores(s, norm)
    return {
        "lower": lower,
        "lower_constructions": cons,
        "searched": search is not None,
        "upper": float(U[list(rows)].max()),
        "upper_all": float(U[1:].max()),
        "mass_min": float(A[:, 0].min()),
        "mass_mean": float(A[:, 0].mean()),
        "phi_norm": float(torch.linalg.vector_norm(A @ X)) / math.sqrt((n + 1) * d),
        **margins,
    }


def certified_slopes(frame, span: float):
    """Certified bounds on the mean slope of ``log S_1`` in ``b_0`` over ``[b, b + span]``:
    for each text of ``frame`` (rows of :func:`sink_point` with a ``text`` column, one value)
    and each margin ``b`` with ``b + span`` on its grid, ``lo = log(lower(b + span)/upper(b))
    /span`` and ``hi = log(upper(b + span)/lower(b))/span`` (``S_1(b) ∈ [lower, upper]`` at
    both ends), and ``past``: whether ``b ≥ margin_own + log 2`` (past it
    :prf:ref:`prop-sink-rows` keeps word 1 from holding half of its row). A
    ``pandas.DataFrame`` with columns ``text, margin, lo, hi, past``."""
    parts = []
    for text, g in frame.groupby("text"):
        g = g.set_index("margin")
        b = np.array([m for m in g.index if m + span in g.index])
        up, lo = np.log(g.upper.loc[b].to_numpy()), np.log(g.lower.loc[b].to_numpy())
        ahead = b + span
        parts.append(
            pd.DataFrame(
                {
                    "text": [text] * len(b),
                    "margin": b,
                    "lo": (np.log(g.lower.loc[ahead].to_numpy()) - up) / span,
                    "hi": (np.log(g.upper.loc[ahead].to_numpy()) - lo) / span,
                    "past": b >= g.margin_own.iloc[0] + math.log(2),
                }
            )
        )
    return pd.concat(parts).reset_index(drop=True)


def _searched(P: Scale, s: int, value: str, d: int, margin: float) -> bool:
    first = s == 0 and (value != "small" or d == P.ds[0])
    return first and math.isclose(math.remainder(margin, P.search_every), 0.0, abs_tol=1e-9)


def grid_points(P: Scale) -> list[dict]:
    """The chapter's grid: every width, length, text, value and margin of ``P``. The estimator
    (``P.search``) runs at the margins that are multiples of ``P.search_every`` (the certified
    slopes span 8, so every window's two ends are searched) on the first text of each
    ``(d, n)``, for the zero and the real value at every width and for the small one at the
    first width (the figure's); the other points keep the constructions' lower bound
    (:func:`sink_point`). At the paper scale the search at every margin of those texts cost
    61 s more than the constructions alone (2 workers, nothing else running), and 130 s more
    inside a whole-book build."""
    return [
        dict(
            d=d,
            n=n,
            margin=b,
            value=v,
            rows=P.rows,
            seed=point_seed("attention-sink", d, n, s),
            search=P.search if _searched(P, s, v, d, b) else None,
        )
        for d in P.ds
        for n in P.ns
        for s in range(P.seeds)
        for v in SINK_VALUES
        for b in P.margins
    ]


def sink_positions(tokens: Sequence[str]) -> list[int]:
    """The positions of a tokenized text that a trained head may use as a sink: ``[CLS]``,
    ``[SEP]`` and punctuation (a token with no letter or digit, ``##`` aside)."""
    return [
        k
        for k, tok in enumerate(tokens)
        if tok in ("[CLS]", "[SEP]") or not any(c.isalnum() for c in tok.removeprefix("##"))
    ]


def head_sinks(enc, inputs, tokens: Sequence[str], rows, *, search: dict, seed: int) -> dict:
    """Every head of every layer of ``enc`` at one text, with and without its sink: ``mass``,
    the mean over the queries of the weight on :func:`sink_positions` (``(L, heads)``);
    ``S``, the own-norm word sensitivity found (:func:`wsutils.trained.head_grid` over the
    words ``rows`` that are not sink positions, ``search``, ``seed``); and ``S_masked``, the
    same search with the sink positions' keys masked (``−inf``: the rest renormalised);
    ``U_masked``, the upper certificate of :prf:ref:`prop-head-upper` over the same words with
    the mask (:func:`wsutils.trained.head_upper_grid`); and
    ``value``, the mean norm of the sink positions' values ``x_k W_V + b_V`` over that of the
    other tokens'.
    ``inputs`` is ``(L + 1, n, d)``, the layers' inputs for this text
    (:func:`wsutils.trained.layer_inputs`)."""
    inputs = np.asarray(inputs, dtype=np.float64)
    n = inputs.shape[1]
    sinks = sink_positions(tokens)
    if len(tokens) != n or not sinks or len(sinks) == n:
        raise ValueError(
            f"tokens must be the text's {n} tokens, with some sink positions and some "
            f"words; got {len(tokens)} tokens and {len(sinks)} sink positions."
        )
    words = [r for r in rows if r not in sinks]
    if not words:
        raise ValueError(f"every row of {list(rows)} is a sink position: pass word rows.")
    mask = np.zeros(n)
    mask[sinks] = -np.inf
    mass = np.empty((enc.layers, enc.heads))
    value = np.empty((enc.layers, enc.heads))
    others = [k for k in range(n) if k not in sinks]
    for layer in range(1, enc.layers + 1):
        X = torch.as_tensor(inputs[layer - 1])
        for h in range(enc.heads):
            head = head_weights(enc, layer, h)
            A = head_attention(head, X)
            mass[layer - 1, h] = float(A[:, sinks].sum(dim=1).mean())
            v = torch.linalg.vector_norm(X @ head.W_V + head.b_V, dim=1)  # ‖v_k‖
            value[layer - 1, h] = float(v[sinks].mean() / v[others].mean())
    kw = dict(search=search, seed=point_seed("sink heads", seed))
    return {
        "mass": mass,
        "value": value,
        "S": head_grid(enc, inputs, words, **kw),
        "S_masked": head_grid(enc, inputs, words, key_bias=mask, **kw),
        "U_masked": head_upper_grid(enc, inputs, words, key_bias=mask),
        "rows": words,
        "sinks": sinks,
    }
