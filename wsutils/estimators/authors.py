"""The authors' sensitivity search, as their script runs it, for side-by-side comparisons.

The authors' ``sensitivity.py`` (github.com/simone-bombari/attention-sensitivity, one commit;
the projection is ``project`` in their ``utils.py``) estimates ``S`` of an attention map by one
ascent on the first word only:

- start at ``x_1 + 0.1ξ``, ``ξ ~ N(0, I_d)``;
- loss ``−‖φ(X') − φ(X)‖/√(n·d)`` (their ``−sqrt(MSELoss)`` on the flattened outputs);
- plain gradient steps of learning rate 10, ``50·n`` of them (RAF and ReLU attention);
- after each step, projection onto the ball of radius ``√d`` **centred at the noisy start**
  ``x_1 + 0.1ξ`` (not at ``x_1``), so ``Δ = x' − x_1`` can reach ``√d + 0.1‖ξ‖``;
- the value reported is that of the **last** iterate.

:func:`authors_estimator` runs exactly that with full forward and backward passes (``O(n²·d)``
per step); :func:`authors_replica` computes the same iterates with the ``O(n·d)`` objective of
:func:`wsutils.estimators.self_attention.attention_word_sensitivity` (the loss is a fixed multiple
of the relative change, so its gradient is the same multiple of the relative change's
gradient). Both return :class:`AuthorsRun`: the value as their script reports it, the value
after putting ``Δ`` back into the ball ``‖Δ‖ ≤ √d`` (a valid lower bound on ``S``), and
``‖Δ‖/√d``. Used by the softmax-attention chapter (the comparison table) and by
``benchmarks/bench_attention.py``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .._tensor import Array
from ..checks import as_tensor, check_int, check_seed, check_shape, check_text
from ..maps import Normalisation, raf, relu_attention
from ..sensitivity import project_ball, relative_change
from .objectives import fast_objective

__all__ = ["AuthorsRun", "authors_estimator", "authors_replica", "authors_map"]

#: The two maps the authors' search runs on here: RAF (softmax) and ReLU attention.
_PAPER_MAPS = (Normalisation("softmax"), Normalisation("relu"))


def _paper_map(normalisation) -> Normalisation:
    """``normalisation`` read by :meth:`wsutils.maps.Normalisation.parse`, softmax or ReLU
    attention."""
    try:
        norm = Normalisation.parse(normalisation)
    except (TypeError, ValueError):
        norm = None
    if norm not in _PAPER_MAPS:
        raise ValueError(
            f"normalisation must be 'raf' or 'relu' (the maps the authors' search runs on "
            f"here), got {normalisation!r}."
        )
    return norm


def _map_fn(norm: Normalisation):
    return raf if norm.name == "softmax" else relu_attention


class AuthorsRun(NamedTuple):
    """``as_run``: the relative change at the last iterate, ``Δ`` measured from ``x_1`` as the
    authors' script measures it (``‖Δ‖`` may exceed ``√d``); ``in_ball``: the same ``Δ``
    projected onto ``‖Δ‖ ≤ √d`` (a certified lower bound on ``S``); ``ratio``: ``‖Δ‖/√d``."""

    as_run: float
    in_ball: float
    ratio: float


def authors_map(X: Array, W: Array, *, normalisation: str = "raf") -> torch.Tensor:
    """RAF (``normalisation="raf"``) or ReLU attention (``"relu"``) with the roundings of the
    authors' ``utils.py``: their torch ``attention_softmax`` divides the scores by ``√d``
    computed in float32, their ``relu_attention_numpy`` (which gives the value they report)
    rounds the scores to float32 before the ReLU and the row normalisation. Otherwise the same
    maps as eq. :eq:`eq-raf` and :eq:`eq-relu-attention` (no value matrix), in float64."""
    norm = _paper_map(normalisation)
    Xt = as_tensor(X, dtype=torch.float64)
    n, d = check_text(Xt)
    Wt = as_tensor(W, dtype=torch.float64)
    check_shape("W", Wt, (d, d), f"d × d with d = {d}, the width of X")
    if norm.name == "softmax":
        root = float(torch.sqrt(torch.tensor(float(d), dtype=torch.float32)))
        return torch.softmax(Xt @ Wt @ Xt.T / root, dim=1) @ Xt
    s = (Xt @ Wt @ Xt.T / math.sqrt(d)).to(torch.float32)
    a = torch.relu(s)
    mass = a.sum(dim=1, keepdim=True)
    return (a / torch.where(mass > 0, mass, torch.ones_like(mass))).to(torch.float64) @ Xt


def _setup(X: Array, W: Array, normalisation, seed, lr, steps):
    norm = _paper_map(normalisation)
    Xt = as_tensor(X, dtype=torch.float64)
    n, d = check_text(Xt)
    if Xt.ndim != 2 or n < 2:
        raise ValueError(f"X must be one text of shape (n, d) with n ≥ 2, got {tuple(Xt.shape)}.")
    Wt = as_tensor(W, dtype=torch.float64)
    check_shape("W", Wt, (d, d), f"d × d with d = {d}, the width of X")
    seed = check_seed(seed)
    steps = 50 * n if steps is None else check_int("steps", steps, minimum=1)
    if not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr > 0):
        raise ValueError(f"lr must be a positive number (the authors use 10), got {lr!r}.")
    g = torch.Generator().manual_seed(seed)
    x0 = Xt[0] + 0.1 * torch.randn(d, generator=g, dtype=torch.float64)
    return Xt, Wt, n, d, steps, float(lr), x0, norm


def _project(xt: torch.Tensor, x0: torch.Tensor, radius: float) -> torch.Tensor:
    step = xt - x0
    norm = torch.linalg.vector_norm(step)
    return x0 + step * (radius / norm) if norm > radius else xt


def _read_out(
    X: torch.Tensor, W: torch.Tensor, norm: Normalisation, Delta: torch.Tensor
) -> AuthorsRun:
    d = X.shape[1]
    fn = _map_fn(norm)
    phi = lambda Z: fn(Z, W)  # noqa: E731
    as_run = relative_change(phi, X, 0, Delta)
    in_ball = relative_change(phi, X, 0, project_ball(Delta[None], math.sqrt(d))[0])
    return AuthorsRun(as_run, in_ball, float(torch.linalg.vector_norm(Delta)) / math.sqrt(d))


def authors_estimator(
    X: Array, W: Array, *, seed: int, normalisation="raf", lr: float = 10.0, steps=None
) -> AuthorsRun:
    """The authors' search (module docstring) with full forward passes of the map
    (eq. :eq:`eq-raf` or :eq:`eq-relu-attention`): ``50·n`` steps unless ``steps`` is given,
    ``ξ`` drawn from ``seed``."""
    Xt, Wt, n, d, steps, lr, x0, norm = _setup(X, W, normalisation, seed, lr, steps)
    fn = _map_fn(norm)
    phi = fn(Xt, Wt).reshape(-1)
    xt, rest = x0.clone(), Xt[1:]
    for _ in range(steps):
        x = xt.clone().requires_grad_(True)
        feats = fn(torch.cat([x[None], rest]), Wt).reshape(-1)
        (grad,) = torch.autograd.grad(-torch.sqrt(torch.mean((feats - phi) ** 2)), x)
        xt = _project(xt - lr * grad, x0, math.sqrt(d))
    return _read_out(Xt, Wt, norm, xt - Xt[0])


def authors_replica(
    X: Array, W: Array, *, seed: int, normalisation="raf", lr: float = 10.0, steps=None
) -> AuthorsRun:
    """The iterates of :func:`authors_estimator` (same start, loss, steps, projection, last
    iterate), with the loss ``−(‖φ(X)‖/√(nd))·rel(Δ)`` evaluated in ``O(n·d)`` per step by the
    objective of :func:`wsutils.estimators.self_attention.attention_word_sensitivity`."""
    Xt, Wt, n, d, steps, lr, x0, norm = _setup(X, W, normalisation, seed, lr, steps)
    obj = fast_objective(Xt, Wt, norm)
    scale = obj.base_norm / math.sqrt(n * d)
    xt, row = x0.clone(), torch.zeros(1, dtype=torch.long)
    for _ in range(steps):
        D = (xt - Xt[0]).requires_grad_(True)
        (grad,) = torch.autograd.grad(-scale * obj(row, D[None])[0], D)
        xt = _project(xt - lr * grad.detach(), x0, math.sqrt(d))
    return _read_out(Xt, Wt, norm, xt - Xt[0])
