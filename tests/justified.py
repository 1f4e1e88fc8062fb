"""What two searches by different floating-point code paths may be asked on every machine
(issue 23 item 13). They need not follow one ascent path: a rounding-level difference of one
gradient can send a path to another local maximum on one CPU and not on another. So each
answer is checked on its own: its value is the float64 relative change at its own Δ, the Δ
lies in the ball, and the value lies in a certified bracket (a lower certificate it started
from and kept, an upper certificate no Δ in the ball can exceed)."""

import math

import numpy as np
import torch
from test_ball import assert_in_ball

import wsutils as ws


def assert_justified(res, phi64, X, *, lower=None, upper=None, tol=0.0):
    """Every per-row value of the search result ``res`` is finite, is the float64 relative
    change ``ws.relative_change(phi64, X, row, Δ)`` at its own ``Δ`` (rtol 1e-12), that ``Δ``
    lies in the exact ball, ``value`` is the best of them, and ``lower[row] − tol ≤ value ≤
    upper`` where given (``lower``: a dict row ↦ certified lower bound; ``upper``: a float)."""
    d = np.asarray(res.Delta).shape[-1]
    assert res.value == max(res.per_row.values())
    for r, v in res.per_row.items():
        D = res.per_row_Delta[r]
        assert math.isfinite(v)
        assert_in_ball(D, d)
        np.testing.assert_allclose(v, ws.relative_change(phi64, X, r, D), rtol=1e-12, atol=1e-300)
        if lower is not None:
            assert v >= lower[r] - tol, (r, v, lower[r])
        if upper is not None:
            assert v <= upper, (r, v, upper)


def stochastic_upper(X, phi_X, *, row_stochastic=True):
    """An upper certificate on ``‖φ(X_i(Δ)) − φ(X)‖_F/‖φ(X)‖_F`` over every row ``i`` and
    ``‖Δ‖ ≤ √d`` for attention ``φ(X) = A X`` with weights in ``[0, 1]`` and rows of ``X`` of
    norm ``√d``: ``φ'_j − φ_j = Σ_k (a'_jk − a_jk) x_k + a'_ji Δ``, so
    ``‖φ'_j − φ_j‖ ≤ √d (‖a'_j − a_j‖₁ + a'_ji)``. Row-stochastic weights: ``≤ 3√d`` per
    row, ``3√(nd)`` in all. Weights in ``[0, 1]`` that change only in column ``i`` off row
    ``i`` (sigmoid): ``2√d`` off row ``i``, ``(n + 1)√d`` on it."""
    n, d = X.shape
    total = 9 * n if row_stochastic else 4 * (n - 1) + (n + 1) ** 2
    return math.sqrt(total * d) / float(torch.linalg.vector_norm(torch.as_tensor(phi_X)))
