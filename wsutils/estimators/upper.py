"""The upper certificates the library has for attention: what turns a search's lower bound
into a bracket.

A search finds a lower bound on ``S(X)``: the change of one ``Δ``. An upper certificate bounds
the change of **every** ``Δ`` in the ball at a word, so the two bracket the largest change over
the words they cover. The library has one for

- softmax attention with any ``β``, scalable softmax, each with or without a sink
  (:prf:ref:`prop-softmax-upper`,
  :func:`~wsutils.estimators.softmax_upper.softmax_certified_upper`);
- ReLU attention on a text with rows of norm ``√d`` where every ``μ_i > 0``
  (:prf:ref:`prop-relu-low`, :func:`~wsutils.estimators.relu.relu_certified_upper`);

for random features inside :func:`~wsutils.estimators.rf.rf_word_sensitivity`
(:prf:ref:`lem-rf-deterministic`), for one trained head in the own-norm ball
(:prf:ref:`prop-head-upper`, :func:`wsutils.trained.head_certified_upper`) and for a trained
model's whole attention block (:prf:ref:`prop-block-upper`,
:func:`wsutils.trained.block_certified_upper`). Sparsemax,
1.5-entmax, sigmoid and hardmax attention, a sink's own token and a map of one's own have none:
their searches give a lower bound only. ReLU attention's bound is computed in float64 without a
rounding allowance (and the rows' norms are checked to ``1e-6``), softmax attention's with one
that does not cover cancellation in ``φ(X)`` itself
(:func:`~wsutils.estimators.softmax_upper.softmax_certified_upper`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..checks import has_unit_rows
from ..maps import Normalisation

__all__ = ["attention_certified_upper"]


def attention_certified_upper(
    X: torch.Tensor,
    W: torch.Tensor,
    rows: Sequence[int],
    *,
    normalisation: str | Normalisation = "raf",
) -> np.ndarray | None:
    """Per word of ``rows``, an upper certificate on ``sup_{‖Δ‖≤√d} ‖φ(X_i(Δ)) − φ(X)‖/‖φ(X)‖``
    for attention with ``normalisation`` (eq. :eq:`eq-general-attention`), or ``None`` where
    the library has none (module docstring): sparsemax, 1.5-entmax, sigmoid, hardmax, a sink's
    own token (row 0 among ``rows`` with a sink: the proposition bounds words only), ReLU
    attention off its proposition's conditions (a row not of norm ``√d``, ``n < 2``, some
    ``μ_i = 0``), and where the bound's float64 arithmetic overflows into a NaN (ReLU
    attention with weights near float64's range).

    ``X`` is one float64 ``n × d`` text and ``W`` the float64 ``d × d`` weights, both checked
    by the caller (the estimators' door). Cost ``O(n²d)``, then ``O(n·d)`` a word for softmax;
    ReLU attention's bounds every word at once (two singular values and ``O(n²)``)."""
    from .relu import relu_upper_if_defined
    from .softmax_upper import softmax_certified_upper

    norm = Normalisation.parse(normalisation)
    rows = list(rows)
    if norm.name in ("softmax", "scalable"):
        if norm.sink is not None and 0 in rows:
            return None  # the sink's token is not a word: prop-softmax-upper does not bound it
        out = softmax_certified_upper(X, W, normalisation=norm, rows=rows)
    elif norm.name != "relu" or X.shape[0] < 2 or not has_unit_rows(X):
        return None
    else:
        every = relu_upper_if_defined(X, W)
        out = None if every is None else every[rows]
    return None if out is None or np.isnan(out).any() else out
