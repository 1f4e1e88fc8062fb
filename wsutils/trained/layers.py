"""The model's own modules as maps: every layer's input, the attention block, the full layer
and the layers ``1..ℓ`` composed (:mod:`wsutils.trained`); the block's upper certificate.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from .._tensor import Array
from ..checks import check_int, check_rows
from ..estimators.softmax_upper import float_sum_rounding
from ..modules import ModuleMap
from ..text.embeddings import embed, model_key
from ._common import Map, _encoder, _layer_index
from .heads import _head_row_bounds, _own_norm_text, head_weights


def layer_inputs(
    enc, texts: Sequence[str], n: int, *, ids: Sequence[int] | None = None, cache_dir=None
) -> np.ndarray:
    """The hidden states of every layer for ``texts`` cut to ``n`` tokens (``[CLS]``, the first
    ``n − 2`` word pieces, ``[SEP]``): a float32 array ``(L + 1, len(texts), n, d)`` whose entry
    ``ℓ − 1`` is the input of layer ``ℓ`` (entry 0 the embedding layer's output, entry ``ℓ``
    the output of layer ``ℓ``, each already through the model's own LayerNorm).

    The model runs on the cut text (no padding), so a map of layer ``ℓ`` applied to entry
    ``ℓ − 1`` computes what the model computes on that text. Every text must have at least
    ``n − 2`` word pieces (a ValueError names the short ones). Cached on disk per layer
    (:func:`wsutils.text.embeddings.embed`, keyed by the model's
    :func:`~wsutils.text.embeddings.model_key`, its live parameters included, computed once
    for all the layers; the layer, ``n``, texts and ``ids``) in ``cache_dir``: by default
    :func:`wsutils.text.embeddings.default_cache_dir`, ``.wsbook-cache/`` at the root of an
    editable install (else in the working directory); a folder of one's own, or ``False``
    for no cache."""
    enc = _encoder(enc)
    n = check_int("n", n, minimum=3)
    key = None if cache_dir is False else model_key(enc)  # once, not once per layer
    out = []
    for layer in range(enc.layers + 1):
        E, mask = embed(
            list(texts),
            model=enc,
            layer=layer,
            max_length=n,
            ids=ids,
            return_mask=True,
            batch_size=64,
            cache_dir=cache_dir,
            progress=False,
            key_of_model=key,
        )
        short = np.flatnonzero(mask.sum(axis=1) < n)
        if short.size:
            raise ValueError(
                f"texts {short.tolist()} have fewer than n − 2 = {n - 2} word "
                "pieces: choose longer texts or a smaller n."
            )
        out.append(E)
    return np.stack(out)


def block_map(enc, layer: int) -> Map:
    """The whole attention block of layer ``layer`` (from 1): the model's own
    ``encoder.layer[layer − 1].attention`` (all heads, ``W_O``, the residual and the
    LayerNorm), ``(B, n, d) → (B, n, d)``, no attention mask (texts without padding)."""
    enc = _encoder(enc)
    layer = _layer_index(enc, layer)
    return ModuleMap([enc.model.encoder.layer[layer - 1].attention], batch_first=True)


def layer_map(enc, layer: int) -> Map:
    """The full transformer layer ``layer`` (from 1), the model's own
    ``encoder.layer[layer − 1]`` (attention block and feed-forward part):
    hidden states ``ℓ − 1 → ℓ``."""
    enc = _encoder(enc)
    layer = _layer_index(enc, layer)
    return ModuleMap([enc.model.encoder.layer[layer - 1]], batch_first=True)


def stack_map(enc, layer: int) -> Map:
    """Layers ``1..layer`` in turn: the embedding output (hidden states 0) to hidden states
    ``layer``. A one-token substitution changes one row of its input exactly
    (:func:`vocabulary_changes`), so it is the map to compare substitutions with at ``layer``."""
    enc = _encoder(enc)
    layer = _layer_index(enc, layer)
    return ModuleMap(list(enc.model.encoder.layer[:layer]), batch_first=True)


def block_certified_upper(enc, layer: int, X: Array, *, rows=None) -> np.ndarray:
    """Per word ``i`` of ``rows`` (``None``: every word), an upper bound on
    ``sup_{‖Δ‖≤‖x_i‖} ‖B(X_i(Δ)) − B(X)‖_F/‖B(X)‖_F`` for the attention block ``B`` of layer
    ``layer`` (:func:`block_map`: every head, ``W_O``, the residual and the LayerNorm, no
    attention mask): :prf:ref:`prop-block-upper`, so the block's ``S^own``
    (:prf:ref:`def-own-norm-ws`) over those words is at most their largest entry.

    Each output row ``j`` before the LayerNorm moves by at most
    ``e_j = min(‖W_O‖₂ (Σ_h u_hj²)^{1/2}, Σ_h ‖W_O^h‖₂ u_hj) + [j = i]‖x_i‖``, with ``u_hj`` the
    row terms of every head (``wsutils.trained.heads._head_row_bounds``,
    :prf:ref:`prop-head-upper`); the LayerNorm then moves it by at most
    ``max|γ| · min(e_j / s_j, 2√d)`` with ``s_j = ((‖z_j‖ − e_j)₊²/d + ε)^{1/2}``, ``z_j`` the
    centred row. Computed in float64 from the module's weights, ``B(X)`` in float64 from the
    same formula, enlarged by ``1 + 4γ_k``, ``k = n + 2d``
    (:func:`~wsutils.estimators.softmax_upper.float_sum_rounding`); not covered, as for
    :func:`~wsutils.trained.head_certified_upper`: ``exp``, ``sigmoid``, the square roots and
    the SVDs of ``W_V`` and ``W_O``. Cost ``O(heads·(n²d_h + n·d·d_h))``.

    Raises
    ------
    ValueError
        If ``X`` is not one finite ``n × d`` text of the model's width or a row of ``X`` is
        zero (``wsutils.trained.heads._own_norm_text``), or ``rows`` is refused by
        ``wsutils.checks.check_rows``.
    """
    enc = _encoder(enc)
    layer = _layer_index(enc, layer)
    heads = [head_weights(enc, layer, h) for h in range(enc.heads)]
    Xt = _own_norm_text(X, heads)
    n, d = Xt.shape
    cols = torch.as_tensor(check_rows(rows, n))  # None: every word
    e, Z, B, gamma, eps = _block_rows(enc, layer, heads, Xt, cols)
    base = float(torch.linalg.vector_norm(B))
    z_norm = torch.linalg.vector_norm(Z, dim=1)[:, None]
    s = torch.sqrt(torch.clamp(z_norm - e, min=0) ** 2 / d + eps)
    g = float(gamma.abs().max())
    row = g * torch.minimum(e / s, torch.full_like(e, 2 * math.sqrt(d)))
    total = torch.sqrt((row**2).sum(dim=0))
    return (total / base * (1 + 4 * float_sum_rounding(n + 2 * d))).numpy()


def _block_rows(enc, layer: int, heads, Xt: torch.Tensor, cols: torch.Tensor):
    """:prf:ref:`prop-block-upper` before the LayerNorm: ``e[j, c]``, the most row ``j`` of
    ``Y`` (the LayerNorm's input) moves when word ``cols[c]`` moves in its own-norm ball; the
    centred rows ``Z = ΠY``, the block's output ``B``, the LayerNorm's scale and ``ε``."""
    out = enc.model.encoder.layer[layer - 1].attention.output
    take = lambda t: t.detach().to("cpu", torch.float64)  # noqa: E731
    W_O, b_O, gamma, beta = (
        take(t)
        for t in (out.dense.weight, out.dense.bias, out.LayerNorm.weight, out.LayerNorm.bias)
    )
    eps = float(out.LayerNorm.eps)
    sq, lin, phis = 0.0, 0.0, []
    for head in heads:
        u, Phi = _head_row_bounds(head, Xt, cols)
        sq = sq + u**2
        lin = lin + float(torch.linalg.matrix_norm(head.W_O, ord=2)) * u
        phis.append(Phi)
    e = torch.minimum(float(torch.linalg.matrix_norm(W_O, ord=2)) * torch.sqrt(sq), lin)
    e[cols, torch.arange(len(cols))] += torch.linalg.vector_norm(Xt[cols], dim=1)  # residual
    Z = torch.cat(phis, dim=1) @ W_O.T + b_O + Xt
    Z = Z - Z.mean(dim=1, keepdim=True)  # the centred rows z_j
    B = gamma * Z / torch.sqrt((Z**2).mean(dim=1, keepdim=True) + eps) + beta
    return e, Z, B, gamma, eps
