"""numpy/torch interchange: :func:`like` returns a result as the input's kind (the
conversion at the door, with its refusals, is :func:`wsutils.checks.as_tensor`).

Also the overflow-safe row norm that every rescaling in ``wsutils`` uses (:func:`row_norms`)
and the exact power-of-two rescaling (:func:`pow2_above`), and the probes with which a
map's declarations are checked (:func:`probe_moves`).

This module and :mod:`wsutils._digest` are the package's shared internals: any module of
``wsutils``, in any subpackage, may import their public names (``tests/test_layers.py``
allows exactly these two across subpackages). They are not on the API page.
"""

from __future__ import annotations

import math
from typing import Any

import torch

Array = Any  # numpy.ndarray or torch.Tensor


def like(result: torch.Tensor, reference: Array) -> Array:
    """Return ``result`` as the kind of ``reference`` (numpy in, numpy out)."""
    if isinstance(reference, torch.Tensor):
        return result
    return result.detach().cpu().numpy()


def row_norms(t: torch.Tensor, *, keepdim: bool = True) -> torch.Tensor:
    """Euclidean norm of every row (last axis) of ``t``, without overflow or underflow.

    ``torch.linalg.vector_norm`` squares the entries first, so a row of norm ``≥ 1e154``
    (float64; ``≥ 1.8e19`` in float32) comes out ``inf`` and one of norm ``≤ 1e-162`` comes
    out ``0``. Here each row is first divided by a power of two close to its largest entry
    (exact: only the exponent changes), normed, and multiplied back. Rows of zeros give 0.
    """
    big = t.detach().abs().amax(dim=-1, keepdim=True)
    _, e = torch.frexp(big)  # big = m·2^e with 0.5 ≤ m < 1
    scale = torch.ldexp(torch.ones_like(big), e)  # a power of two ≥ big
    scale = torch.where(big > 0, scale, torch.ones_like(scale))
    out = torch.linalg.vector_norm(t / scale, dim=-1, keepdim=True) * scale
    return out if keepdim else out.squeeze(-1)


def pow2_above(t: torch.Tensor) -> torch.Tensor:
    """A power of two ``≥ max |t|`` (1 for an all-zero ``t``), as a 0-d tensor: dividing by
    it changes only exponents, so a product of rescaled factors is scaled exactly (the
    overflow-free scores of :func:`wsutils.maps.relu_attention`). Trusts its caller: ``t`` a
    finite floating tensor."""
    big = t.detach().abs().amax()
    _, e = torch.frexp(big)
    return torch.where(big > 0, torch.ldexp(torch.ones_like(big), e), torch.ones_like(big))


def probe_moves(n: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed perturbations with which a map's declarations are checked before a search
    trusts them (:func:`wsutils.sensitivity.check_batch_map`,
    :func:`wsutils.tokenwise.check_tokenwise`): the rows ``[0, n − 1]`` (the first and last
    words) and two float64 ``Δ`` of norm ``√d``, drawn from a generator seeded 0."""
    g = torch.Generator().manual_seed(0)
    D = torch.randn(2, d, generator=g, dtype=torch.float64)
    D *= math.sqrt(d) / torch.linalg.vector_norm(D, dim=1, keepdim=True)
    return torch.tensor([0, n - 1]), D
