"""Helpers shared by the modules of :mod:`wsutils.trained`: an encoder from a name or an
Encoder, a layer's index, the length check, and the type of a map.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..checks import check_int
from ..text.embeddings import Encoder, load_model

Map = Callable[[torch.Tensor], torch.Tensor]


def _encoder(enc) -> Encoder:
    if isinstance(enc, Encoder):
        return enc
    if isinstance(enc, str):
        return load_model(enc)
    raise TypeError(
        f"enc must be a wsutils.text.embeddings.Encoder or a model name, got "
        f"{type(enc).__name__}; load one with wsutils.text.embeddings.load_model."
    )


def _layer_index(enc: Encoder, layer) -> int:
    layer = check_int("layer", layer, minimum=1)
    if layer > enc.layers:
        raise ValueError(
            f"layer must be between 1 and {enc.layers} for {enc.name} (layers are "
            f"counted from 1, as hidden_states[layer] is their output), got {layer}."
        )
    return layer


def _check_length(enc: Encoder, n: int) -> None:
    """A ValueError for a text of ``n`` tokens beyond the model's position embeddings."""
    P = getattr(enc.model.config, "max_position_embeddings", None)
    if P is not None and n > int(P):
        raise ValueError(
            f"the text has {n} tokens, more than the model's "
            f"max_position_embeddings = {int(P)} ({enc.name}): cut it to at most "
            f"{int(P)} tokens (tokenizer(..., truncation=True, "
            f"max_length={int(P)}))."
        )
