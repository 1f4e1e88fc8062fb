"""numpy/torch interchange: every public function accepts either and returns the input's kind."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

Array = Any  # numpy.ndarray or torch.Tensor


def as_tensor(x: Array, *, dtype: torch.dtype | None = None, device=None) -> torch.Tensor:
    """A torch view of ``x``: float64 for numpy input unless ``dtype`` says otherwise;
    a floating torch tensor keeps its dtype and device unless told otherwise."""
    if isinstance(x, torch.Tensor):
        if dtype is None and not x.is_floating_point():
            dtype = torch.float64
        return x.to(dtype=dtype or x.dtype, device=device or x.device)
    return torch.as_tensor(np.asarray(x), dtype=dtype or torch.float64, device=device)


def like(result: torch.Tensor, reference: Array) -> Array:
    """Return ``result`` as the kind of ``reference`` (numpy in, numpy out)."""
    if isinstance(reference, torch.Tensor):
        return result
    return result.detach().cpu().numpy()
