"""The four feature maps of the paper, eqs. :eq:`eq-rf`–:eq:`eq-relu-attention`, with frozen
random weights.

Each map accepts a numpy array or a torch tensor ``X`` of shape ``(n, d)`` (or a batch
``(..., n, d)``) and returns the same kind: numpy in, numpy out; torch in, torch out and
differentiable. Computation is in float64 unless ``dtype`` says otherwise (a floating torch
input keeps its own dtype), on the input's device.

======================  ======================================  ==========================
map                     formula                                 label in the book
======================  ======================================  ==========================
:func:`rf`              ``ReLU(V flat(X)) ∈ R^k``               :eq:`eq-rf`
:func:`drf`             ``ReLU(V_L ··· ReLU(V_1 flat(X)))``     :eq:`eq-drf`
:func:`raf`             ``softmax(X W Xᵀ/√d) X ∈ R^{n×d}``      :eq:`eq-raf`
:func:`relu_attention`  ``N(ReLU(X W Xᵀ/√d)) X``                :eq:`eq-relu-attention`
======================  ======================================  ==========================

``flat`` is row-major: ``flat(X) = (x_1, …, x_n)``, so column block ``i`` of ``V`` (columns
``i·d … (i+1)·d − 1``) multiplies word ``i``.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from ._tensor import Array, as_tensor, like, row_norms
from .checks import check_finite, check_shape, check_text

__all__ = ["flat", "rf", "drf", "raf", "relu_attention", "attention_scores", "normalize_rows"]


def flat(X: torch.Tensor) -> torch.Tensor:
    """Row-major flattening of the last two axes: ``(..., n, d) → (..., n·d)``."""
    return X.reshape(*X.shape[:-2], X.shape[-2] * X.shape[-1])


def attention_scores(X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """The score matrix ``X W Xᵀ / √d`` (torch, batched, unchecked)."""
    d = X.shape[-1]
    return (X @ W) @ X.transpose(-1, -2) / math.sqrt(d)


def _pow2_above(t: torch.Tensor) -> torch.Tensor:
    """A power of two ``≥ max |t|`` (1 for an all-zero ``t``), as a 0-d tensor: dividing by
    it changes only exponents, so every product below is scaled exactly."""
    big = t.detach().abs().amax()
    _, e = torch.frexp(big)
    return torch.where(big > 0, torch.ldexp(torch.ones_like(big), e), torch.ones_like(big))


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Attention is computed in at least float32: half precision overflows at scores of 65504
    and rounds the weights to 3 digits."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _rf(X: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    return torch.relu(flat(X) @ V.T)


def _drf(X: torch.Tensor, Vs: Sequence[torch.Tensor]) -> torch.Tensor:
    h = flat(X)
    for V in Vs:
        h = torch.relu(h @ V.T)
    return h


def _raf(X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Softmax attention (trusted input). Computed in float32 at least; scores that overflow
    the compute dtype are a ValueError (softmax of ``inf`` is NaN, and no rescaling keeps
    softmax unchanged)."""
    cd = _compute_dtype(X.dtype)
    Xc, Wc = X.to(cd), W.to(cd)
    s = attention_scores(Xc, Wc)
    if not bool(torch.isfinite(s).all()):
        raise ValueError(f"the attention scores XWXᵀ/√d overflow {cd} (|score| > "
                         f"{torch.finfo(cd).max:.3g}): pass float64 input or a smaller W.")
    return (torch.softmax(s, dim=-1) @ Xc).to(X.dtype)


def _relu_attention(X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Row-normalised ReLU attention (trusted input). ``rownorm(ReLU(c·s)) = rownorm(ReLU(s))``
    for ``c > 0``, so the scores are computed from ``X`` and ``W`` divided by powers of two
    (exact): the same floats as without the scaling, but no overflow for any finite input."""
    cd = _compute_dtype(X.dtype)
    Xc, Wc = X.to(cd), W.to(cd)
    Xs = Xc / _pow2_above(Xc)
    A = torch.relu(attention_scores(Xs, Wc / _pow2_above(Wc)))
    mass = A.sum(dim=-1, keepdim=True)
    # rownorm(A): each row divided by its sum; an all-zero row stays zero.
    A = A / torch.where(mass > 0, mass, torch.ones_like(mass))
    return (A @ Xc).to(X.dtype)


def _prepare(X: Array, dtype, weights: dict[str, Array]):
    Xt = as_tensor(X, dtype=dtype, name="X")
    n, d = check_text(Xt)
    ws = {k: as_tensor(v, dtype=Xt.dtype, device=Xt.device, name=k) for k, v in weights.items()}
    return Xt, n, d, ws


def rf(X: Array, V: Array, *, dtype: torch.dtype | None = None) -> Array:
    """Random features ``φ_RF(X) = ReLU(V flat(X))`` (eq. :eq:`eq-rf`).

    ``V`` is ``k × (n·d)``; the paper draws it with i.i.d. ``N(0, 1/D)`` entries, ``D = n·d``
    (:func:`wsutils.weights.sample_V`). Returns a vector of length ``k``.
    """
    Xt, n, d, w = _prepare(X, dtype, {"V": V})
    Vt = w["V"]
    if Vt.ndim != 2 or Vt.shape[1] != n * d:
        raise ValueError(
            f"V must have shape (k, n·d) = (k, {n * d}) for X of shape (n, d) = ({n}, {d}), "
            f"got {tuple(Vt.shape)}."
        )
    check_finite("V", Vt)
    return like(_rf(Xt, Vt), X)


def drf(X: Array, Vs: Sequence[Array], *, dtype: torch.dtype | None = None) -> Array:
    """Deep random features: ``ReLU(V_L ··· ReLU(V_1 flat(X)))`` (eq. :eq:`eq-drf`).

    ``Vs[0]`` is ``k_1 × (n·d)`` and ``Vs[l]`` is ``k_{l+1} × k_l``; the paper draws every layer
    ``D × D`` with He scaling ``N(0, 2/D)`` (:func:`wsutils.weights.sample_Vs`).
    """
    if len(Vs) == 0:
        raise ValueError("Vs is empty: a deep random-features map needs at least one layer.")
    Xt, n, d, w = _prepare(X, dtype, {str(i): V for i, V in enumerate(Vs)})
    fan_in = n * d
    for i in range(len(Vs)):
        Vt = w[str(i)]
        if Vt.ndim != 2 or Vt.shape[1] != fan_in:
            raise ValueError(
                f"Vs[{i}] must have shape (k_{i + 1}, {fan_in}) (its input width), "
                f"got {tuple(Vt.shape)}."
            )
        check_finite(f"Vs[{i}]", Vt)
        fan_in = Vt.shape[0]
    return like(_drf(Xt, [w[str(i)] for i in range(len(Vs))]), X)


def _attention(X: Array, W: Array, dtype, kernel) -> Array:
    Xt, n, d, w = _prepare(X, dtype, {"W": W})
    check_shape("W", w["W"], (d, d), f"d × d with d = {d}, the width of X")
    return like(kernel(Xt, w["W"]), X)


def raf(X: Array, W: Array, *, dtype: torch.dtype | None = None) -> Array:
    """Random attention features ``φ_RAF(X) = softmax(X W Xᵀ/√d) X`` (eq. :eq:`eq-raf`).

    ``W`` is ``d × d`` with i.i.d. ``N(0, 1/d)`` entries (:func:`wsutils.weights.sample_W`);
    softmax is row-wise. Returns ``n × d``. Half-precision input is computed in float32 and
    returned in its own dtype; scores that overflow (``|XWXᵀ/√d|`` beyond the dtype's range) are
    a ValueError, never NaN.
    """
    return _attention(X, W, dtype, _raf)


def relu_attention(X: Array, W: Array, *, dtype: torch.dtype | None = None) -> Array:
    """Row-normalised ReLU attention ``N(ReLU(X W Xᵀ/√d)) X`` (eq. :eq:`eq-relu-attention`).

    ``N`` (the book's ``rownorm``) divides each row by its sum; a row whose scores are all
    ``≤ 0`` stays zero. Returns ``n × d``. Since ``rownorm(ReLU(c·s)) = rownorm(ReLU(s))`` for
    ``c > 0``, the scores are formed from ``X`` and ``W`` rescaled by powers of two: any finite
    input gives finite output, in every dtype (half precision is computed in float32).
    """
    return _attention(X, W, dtype, _relu_attention)


def normalize_rows(X: Array) -> Array:
    """Rescale every row of ``X`` to norm ``√d`` (the paper's normalisation).

    Raises a ValueError for a zero row, which has no direction to keep. The norms are
    computed without overflow (``wsutils._tensor.row_norms``), so rows of any finite
    size are rescaled.
    """
    Xt = as_tensor(X, name="X")
    n, d = check_text(Xt)
    norms = row_norms(Xt)
    if bool((norms == 0).any()):
        raise ValueError("X has an all-zero row, which cannot be rescaled to norm √d; drop it first.")
    return like(Xt * (math.sqrt(d) / norms), X)
