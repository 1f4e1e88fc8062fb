"""The model's own modules as maps: every layer's input, the attention block, the full layer
and the layers ``1..ℓ`` composed (:mod:`wsutils.trained`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..checks import check_int
from ..modules import ModuleMap
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
