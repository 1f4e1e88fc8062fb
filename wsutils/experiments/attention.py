"""Per-point functions for the attention chapters' grids (run with :func:`wsutils.run.sweep.run_grid`).

Each takes JSON-serialisable parameters (seeds included), draws its own synthetic text
(:func:`wsutils.weights.sample_X`, seed ``seed``) and weights (:func:`wsutils.weights.sample_W`,
seed ``seed + 1``) and returns a dict of floats, so a process pool or a Dask executor can run it.
"""

from __future__ import annotations

import math
import time

import torch

from ..estimators.attention import (attention_word_sensitivity, certified_lower_bound, takeover_certificate)
from ..maps import raf, relu_attention
from ..estimators.rf import rf_word_sensitivity
from ..weights import sample_W, sample_X

__all__ = ["sensitivity_point", "takeover_point", "rf_point"]


def sensitivity_point(kind: str, d: int, n: int, seed: int, rows: int = 2, starts: int = 4,
                      steps: int = 100) -> dict:
    """``S`` of softmax (``kind="raf"``) or ReLU (``"relu"``) attention at one text.

    The estimator (:func:`wsutils.estimators.attention.attention_word_sensitivity`) searches the first
    ``rows`` words from ``starts`` random starts plus the take-over constructions;
    ``certified`` is the best construction alone (:func:`wsutils.estimators.attention.certified_lower_bound`) over the same
    rows. Also returns ``‖φ(X)‖_F/√d``, ``κ = ‖X‖_op/√d`` and, for ``raf``, the bound and the
    self-weight of :prf:ref:`thm-raf-high` at row 0.
    """
    torch.set_num_threads(1)
    X = sample_X(n, d, seed=seed)
    W = sample_W(d, seed=seed + 1)
    searched = list(range(min(rows, n)))
    t0 = time.perf_counter()
    res = attention_word_sensitivity(X, W, kind=kind, rows=searched, starts=starts, steps=steps,
                                     seed=seed, takeovers=True)
    elapsed = time.perf_counter() - t0
    cert = max(certified_lower_bound(X, W, r, kind=kind) for r in searched)
    phi = (raf if kind == "raf" else relu_attention)(X, W)
    out = {
        "S": res.value,
        "certified": cert,
        "phi_norm": float(torch.linalg.vector_norm(phi)) / math.sqrt(d),
        "kappa": float(torch.linalg.matrix_norm(X, ord=2)) / math.sqrt(d),
        "seconds": elapsed,
    }
    if kind == "raf":
        c = takeover_certificate(X, W, 0)
        out.update(bound=c.bound, self_weight=c.self_weight, margin=c.margin, A_fro=c.A_fro)
    return out


def takeover_point(d: int, n: int, seed: int) -> dict:
    """The row take-over at row 0 of one text (:prf:ref:`thm-raf-high`): the margin, the
    self-weight ``a'_00`` it reaches and the relative change it produces, for the phase diagram."""
    torch.set_num_threads(1)
    X = sample_X(n, d, seed=seed)
    W = sample_W(d, seed=seed + 1)
    c = takeover_certificate(X, W, 0)
    return {"margin": c.margin, "self_weight": c.self_weight, "change": c.exact,
            "bound": c.bound, "lam": c.lam}


def rf_point(d: int, n: int, seed: int, starts: int = 2, steps: int = 30) -> dict:
    """``S_RF`` at the same text as :func:`sensitivity_point` (``X`` from ``seed``), ``k = D``,
    with the exact estimator :func:`wsutils.estimators.rf.rf_word_sensitivity` (row 0)."""
    torch.set_num_threads(1)
    X = sample_X(n, d, seed=seed)
    res = rf_word_sensitivity(X, n * d, rows=0, seed=seed + 1, starts=starts, steps=steps)
    return {"S": res.value}
