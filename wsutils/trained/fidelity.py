"""Whether the maps of :mod:`wsutils.trained` are the model's own: their outputs against the
model's float32 modules on real hidden states, within a stated model of float32 rounding
(:mod:`wsutils.trained`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ._common import _encoder
from .heads import Head, head_map, head_weights
from .layers import layer_map

__all__ = ["MapFidelity", "map_fidelity"]

#: The float32 unit roundoff ``ε₃₂``.
U32 = 2.0**-24


@dataclass(frozen=True)
class MapFidelity:
    """The largest deviations of the book's maps from the model's own output, with their
    tolerances (:func:`map_fidelity`).

    ``head``: over the first layer's heads, ``max |head_map(X) − the model's slice|``;
    ``head_tol``: its tolerance; ``head_without_bQ``: the smallest, over heads, of the same
    deviation for the head map without its query bias (a control the check must reject);
    ``layer``: over every layer, ``max |layer_map(X) − the model's output|`` (float64 copy
    against float32); ``layer_tol``: its tolerance."""

    head: float
    head_tol: float
    head_without_bQ: float
    layer: float
    layer_tol: float

    @property
    def faithful(self) -> bool:
        """Every deviation within its tolerance, and the control more than 100 tolerances
        off (so the check could have failed)."""
        return self.head < self.head_tol < self.head_without_bQ / 100 and (
            self.layer < self.layer_tol
        )


def map_fidelity(enc, inputs) -> MapFidelity:
    """Compare the maps with the model on one text's hidden states ``inputs``, the
    ``(L + 1, n, d)`` slice of :func:`wsutils.trained.layer_inputs` for that text: the head
    maps of the first layer (eq. :eq:`eq-trained-head`, float64) against the model's own
    ``attention.self`` (float32), and the float64 copy of every layer
    (:func:`wsutils.trained.layer_map`) against the model's next hidden state.

    The tolerance is a model of float32 rounding: a ``d``-term float32 sum errs by about
    ``√d·ε₃₂`` times its scale (errors adding like a random walk), with a factor 10 for the
    chain of operations: ``10·√d·ε₃₂·max|output|``. The head map without ``b_Q`` is the
    control: a check that accepts it could not tell a wrong map from the model's.

    Raises
    ------
    ValueError
        If ``inputs`` is not ``(L + 1, n, d)`` for this model's ``L`` layers and width ``d``.
    """
    enc = _encoder(enc)
    H = np.asarray(inputs)
    d = enc.hidden
    if H.ndim != 3 or H.shape[0] != enc.layers + 1 or H.shape[2] != d:
        raise ValueError(
            f"inputs must be one text's hidden states, (L + 1, n, d) = ({enc.layers + 1}, n, "
            f"{d}) (layer_inputs(...)[:, j]), got shape {H.shape}."
        )
    X0, dh = torch.as_tensor(H[0]), d // enc.heads
    dev_head, dev_nobq, dev_layer, tol_layer = 0.0, math.inf, 0.0, 0.0
    with torch.no_grad():
        ctx = enc.model.encoder.layer[0].attention.self(X0[None])[0][0].double()
        for h in range(enc.heads):
            hd, want = head_weights(enc, 1, h), ctx[:, h * dh : (h + 1) * dh]
            nobq = Head(**{**hd.__dict__, "b_Q": torch.zeros_like(hd.b_Q)})
            dev_head = max(dev_head, float((head_map(hd)(X0.double()) - want).abs().max()))
            dev_nobq = min(dev_nobq, float((head_map(nobq)(X0.double()) - want).abs().max()))
        tol_head = 10 * math.sqrt(d) * U32 * float(ctx.abs().max())
        for layer in range(1, enc.layers + 1):
            Y = layer_map(enc, layer)(torch.as_tensor(H[layer - 1]).double()).numpy()
            dev_layer = max(dev_layer, float(np.abs(Y - H[layer]).max()))
            tol_layer = max(tol_layer, 10 * math.sqrt(d) * U32 * float(np.abs(H[layer]).max()))
    return MapFidelity(dev_head, tol_head, dev_nobq, dev_layer, tol_layer)
