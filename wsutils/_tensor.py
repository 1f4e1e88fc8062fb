"""numpy/torch interchange: every public function accepts either and returns the input's kind.

Also the overflow-safe row norm that every rescaling in ``wsutils`` uses (:func:`row_norms`)
and the exact power-of-two rescaling (:func:`pow2_above`).

This module and :mod:`wsutils._digest` are the package's shared internals: any module of
``wsutils``, in any subpackage, may import their public names (``tests/test_layers.py``
allows exactly these two across subpackages). They are not on the API page.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

Array = Any  # numpy.ndarray or torch.Tensor


def as_tensor(
    x: Array, *, dtype: torch.dtype | None = None, device=None, name: str = "input"
) -> torch.Tensor:
    """A torch view of ``x``: float64 for numpy input unless ``dtype`` says otherwise;
    a floating torch tensor keeps its dtype and device unless told otherwise.

    Complex input is a TypeError (casting would silently drop the imaginary part), and so is
    anything that is not numeric (strings, objects)."""
    if isinstance(x, torch.Tensor):
        if x.is_complex():
            raise TypeError(
                f"{name} is complex ({x.dtype}); wsutils works on real arrays: pass "
                "the real part explicitly if that is what you mean."
            )
        if dtype is None and not x.is_floating_point():
            dtype = torch.float64
        return x.to(dtype=dtype or x.dtype, device=device or x.device)
    a = np.asarray(x)
    if np.iscomplexobj(a):
        raise TypeError(
            f"{name} is complex ({a.dtype}); wsutils works on real arrays: pass "
            "the real part explicitly if that is what you mean."
        )
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a real numeric array, got dtype {a.dtype}.")
    return torch.as_tensor(a, dtype=dtype or torch.float64, device=device)


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
