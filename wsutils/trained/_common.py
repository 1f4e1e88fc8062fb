"""Helpers shared by the modules of :mod:`wsutils.trained`: an encoder from a name or an
Encoder, a layer's index, and the type of a map.
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
