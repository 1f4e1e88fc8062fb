"""The model's own modules as maps: every layer's input, the attention block, the full layer
and the layers ``1..ℓ`` composed (:mod:`wsutils.trained`).
"""

from __future__ import annotations

import copy
from typing import Callable, Sequence

import numpy as np
import torch

from .._digest import module_digest
from ..checks import check_int
from ..text.embeddings import embed, model_key
from ._common import Map, _encoder, _layer_index


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


class _ModuleMap:
    """A model's module as a map of its hidden states, in the input's dtype: the live modules
    in their own dtype; in another (float64, for the certified values of the estimators) a
    copy, made again whenever the live modules' parameters have changed since it was made
    (:func:`wsutils._digest.module_digest` of the live modules at every call in that dtype:
    ``O(parameters)``, against the ``O(batch·n·parameters)`` of the call itself)."""

    def __init__(self, modules, pick: Callable):
        self.live = list(modules)
        self.dtype = next(self.live[0].parameters()).dtype
        self.copies: dict = {}  # dtype → (digest of the live modules, copy)
        self.pick = pick

    def _for(self, dtype):
        if dtype == self.dtype:
            return self.live
        digest = module_digest(*self.live)
        held = self.copies.get(dtype)
        if held is None or held[0] != digest:
            self.copies[dtype] = held = (digest, [copy.deepcopy(m).to(dtype) for m in self.live])
        return held[1]

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        mods = self._for(X.dtype)
        single = X.ndim == 2  # one text: the modules want a batch
        X = X[None] if single else X
        for m in mods:
            X = self.pick(m(X))
        return X[0] if single else X


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def block_map(enc, layer: int) -> Map:
    """The whole attention block of layer ``layer`` (from 1): the model's own
    ``encoder.layer[layer − 1].attention`` (all heads, ``W_O``, the residual and the
    LayerNorm), ``(B, n, d) → (B, n, d)``, no attention mask (texts without padding)."""
    enc = _encoder(enc)
    layer = _layer_index(enc, layer)
    return _ModuleMap([enc.model.encoder.layer[layer - 1].attention], _first)


def layer_map(enc, layer: int) -> Map:
    """The full transformer layer ``layer`` (from 1), the model's own
    ``encoder.layer[layer − 1]`` (attention block and feed-forward part):
    hidden states ``ℓ − 1 → ℓ``."""
    enc = _encoder(enc)
    layer = _layer_index(enc, layer)
    return _ModuleMap([enc.model.encoder.layer[layer - 1]], _first)


def stack_map(enc, layer: int) -> Map:
    """Layers ``1..layer`` in turn: the embedding output (hidden states 0) to hidden states
    ``layer``. A one-token substitution changes one row of its input exactly
    (:func:`vocabulary_changes`), so it is the map to compare substitutions with at ``layer``."""
    enc = _encoder(enc)
    layer = _layer_index(enc, layer)
    return _ModuleMap(list(enc.model.encoder.layer[:layer]), _first)
