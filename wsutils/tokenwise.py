"""A map whose first part acts on each word alone, declared as such so that a search reuses it.

Most maps of a transformer begin word by word: the queries, keys and values ``x_j W_Q``,
``x_j W_K``, ``x_j W_V``, a layer norm of each word, a feed-forward layer. Written as
``φ(Z) = mix(tokens(Z))`` with ``tokens`` acting on each row of ``Z`` alone, the change of one
word ``i`` changes one row of ``tokens(Z)``: a search
(:func:`wsutils.sensitivity.word_sensitivity`) computes ``tokens(X)`` once, and for each
``(i, Δ)`` only ``tokens(x_i + Δ)`` (one word) and ``mix`` of the text with that row
replaced. For softmax
attention ``mix`` costs ``O(n²·d)`` a text against ``O(n·d² + n²·d)`` for the whole map, and
the backward pass saves the same.

:class:`TokenwiseMap` is the declaration; the search checks it before using it
(:func:`check_tokenwise`) and certifies every value with the whole map, ``mix(tokens(Z))``,
evaluated text by text as by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from ._tensor import Array, probe_moves
from .estimators.softmax_upper import softmax_certified_upper

__all__ = ["TokenwiseMap", "check_tokenwise", "replace_rows", "softmax_attention"]

Map = Callable[[torch.Tensor], torch.Tensor]


def replace_rows(F: torch.Tensor, rows: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``B`` copies of ``F`` (``n × p``), copy ``b`` with row ``rows[b]`` replaced by
    ``new[b]`` (``B × p``): ``(B, n, p)``, differentiable in ``new``, in ``new``'s dtype."""
    out = F.to(new.dtype).expand(rows.shape[0], *F.shape).clone()
    out[torch.arange(rows.shape[0], device=rows.device), rows] = new
    return out


@dataclass(frozen=True)
class TokenwiseMap:
    """The map ``φ(Z) = mix(tokens(Z))`` with ``tokens`` acting on each word alone.

    ``tokens`` maps a batch ``(B, n, d)`` to ``(B, n, p)``, row ``j`` of its output a function
    of row ``j`` of its input only (and the same function for every ``j``: no position enters);
    ``mix`` maps ``(B, n, p)`` to ``(B, ...)``. Called on ``Z`` it is ``mix(tokens(Z))``, so it
    goes wherever a batched map goes; :func:`wsutils.sensitivity.word_sensitivity` recognises
    it and evaluates a changed word in ``mix`` alone (module docstring). Softmax attention
    ``softmax(Z W Zᵀ/√d) Z`` is ``tokens(Z) = [Z W, Z]`` and
    ``mix(F) = softmax(F_Q F_Kᵀ/√d) F_K``.

    ``upper_certificate`` (optional): ``(X, rows) ↦`` one upper bound per row of ``rows`` on
    the sup over ``‖Δ‖ ≤ √d`` of the relative change at that row, for a map whose bound is
    known (``X`` a float64 ``n × d`` text, ``rows`` a list of indices);
    :func:`wsutils.sensitivity.word_sensitivity` then returns it as the result's ``upper``,
    and refuses a bound below a value the search found. :func:`softmax_attention` sets it
    (:prf:ref:`prop-softmax-upper`); a map declared by hand has none unless it is given one.
    """

    tokens: Map
    mix: Map
    upper_certificate: Callable[[torch.Tensor, list[int]], Array] | None = None

    def __call__(self, Z: torch.Tensor) -> torch.Tensor:
        return self.mix(self.tokens(Z))

    def word_objective(self, Xs: torch.Tensor, base: torch.Tensor, base_norm: float):
        """The objective of :func:`wsutils.sensitivity.ascend_rows` for this map at the text
        ``Xs`` (``base = φ(X)``, ``base_norm = ‖φ(X)‖ > 0``): the relative change
        ``‖mix(F_i) − φ(X)‖/‖φ(X)‖`` with ``F_i`` the rows ``tokens(X)`` and row ``i``
        ``tokens(x_i + Δ)``; its ``pair_elements`` is what one (row, Δ) pair holds
        (``n·p``)."""
        with torch.no_grad():
            F = self.tokens(Xs[None])[0]

        def objective(chunk):
            def values(row_idx: torch.Tensor, Delta: torch.Tensor) -> torch.Tensor:
                word = self.tokens((Xs[row_idx] + Delta)[:, None, :])[:, 0]
                out = self.mix(replace_rows(F, row_idx, word))
                diff = (out - base).reshape(len(row_idx), -1)
                return torch.linalg.vector_norm(diff, dim=-1) / base_norm

            return values

        objective.pair_elements = F.numel()
        return objective


def softmax_attention(W: torch.Tensor) -> TokenwiseMap:
    """Softmax attention ``softmax(Z W Zᵀ/√d) Z`` (eq. :eq:`eq-raf`) declared word-wise:
    ``tokens(Z) = [Z W, Z]`` (each word's query ``x W`` and its key and value ``x``) and
    ``mix(F) = softmax(F_Q F_Kᵀ/√d) F_K``, the scores formed in the order of
    :func:`wsutils.maps.raf`: the map the "Your own map" page writes by hand, and the one
    ``benchmarks/bench_generic.py`` times. Its ``upper_certificate`` is
    :func:`~wsutils.estimators.softmax_upper.softmax_certified_upper` with this ``W``
    (:prf:ref:`prop-softmax-upper`)."""
    d = W.shape[0]

    def tokens(Z):
        return torch.cat([Z @ W.to(Z.dtype), Z], dim=-1)

    def mix(F):
        Q, K = F[..., :d], F[..., d:]
        return torch.softmax(Q @ K.transpose(-1, -2) / math.sqrt(d), dim=-1) @ K

    def upper(X, rows):
        return softmax_certified_upper(X, W.detach().to("cpu", torch.float64), rows=rows)

    return TokenwiseMap(tokens, mix, upper)


def check_tokenwise(phi: TokenwiseMap, X64: torch.Tensor, rtol: float) -> None:
    """Check the declaration of ``phi`` at the float64 text ``X64`` (``n × d``) before a
    search trusts it: ``tokens`` of the text with its first and last words moved (by a fixed
    ``Δ`` of norm ``√d``) agrees with ``tokens(X)`` on every other row, and ``tokens`` of each
    word alone, a batch of one-word texts, agrees with its row of ``tokens(X)``, to ``rtol``
    relative (the rounding of kernels chosen by shape). A ``tokens`` that mixes words (a
    mean over them, an attention) or uses the position (a positional embedding) fails one of
    them: a ValueError that says to pass the whole map as a plain function."""
    n, d = X64.shape
    hint = (
        "TokenwiseMap declares that tokens acts on each word alone, the same way at every "
        "position; pass the whole map as a plain function (lambda Z: mix(tokens(Z))) instead."
    )
    ends, D = probe_moves(n, d)
    with torch.no_grad():
        F = phi.tokens(X64[None])[0].to(torch.float64)
        moved = phi.tokens(replace_rows(X64, ends, X64[ends] + D)).to(torch.float64)
        alone = phi.tokens(X64[:, None, :]).to(torch.float64)
    if moved.shape[1:] != F.shape or alone.shape[:2] != (n, 1) or alone.shape[2:] != F.shape[1:]:
        raise ValueError(
            f"tokens returned {tuple(F.shape)} for one text of {n} words, "
            f"{tuple(alone.shape)} for its {n} words one by one: it must map (B, n, d) to "
            f"(B, n, p). {hint}"
        )
    scale = float(torch.linalg.vector_norm(F))
    for b, i in enumerate(ends.tolist()):
        others = [j for j in range(n) if j != i]
        gap = float(torch.linalg.vector_norm(moved[b, others] - F[others]))
        if not gap <= rtol * scale:
            raise ValueError(
                f"moving word {i} changed tokens at other words (by {gap:.3g}, relative "
                f"{gap / scale:.3g}): tokens mixes the words. {hint}"
            )
    gap = float(torch.linalg.vector_norm(alone[:, 0] - F))
    if not gap <= rtol * scale:
        raise ValueError(
            f"tokens of each word alone differs from tokens of the text (by {gap:.3g}, "
            f"relative {gap / scale:.3g}): it depends on the other words or the position. {hint}"
        )
