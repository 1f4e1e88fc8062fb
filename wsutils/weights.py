"""Seeded samplers for the frozen random weights, with the paper's scalings
(eqs. :eq:`eq-rf`–:eq:`eq-raf`).

Weights are drawn on the CPU from a ``torch.Generator`` seeded with ``seed`` and then moved to
``device``, so the same seed gives the same numbers on every device.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = ["gaussian", "sample_V", "sample_Vs", "sample_W", "sample_X"]


def _check_positive(**dims: int) -> None:
    bad = {k: v for k, v in dims.items() if int(v) <= 0}
    if bad:
        raise ValueError(f"dimensions must be positive, got {bad}.")


def gaussian(shape: Sequence[int], std: float, *, seed: int, device=None,
             dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """I.i.d. ``N(0, std²)`` entries of the given shape, reproducible from ``seed``."""
    _check_positive(**{f"shape[{i}]": s for i, s in enumerate(shape)})
    g = torch.Generator().manual_seed(int(seed))
    out = torch.randn(*shape, generator=g, dtype=dtype) * std
    return out.to(device) if device is not None else out


def sample_V(k: int, n: int, d: int, *, seed: int, device=None,
             dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """RF weights ``V ∈ R^{k×D}``, entries ``N(0, 1/D)``, ``D = n·d`` (eq. :eq:`eq-rf`)."""
    _check_positive(k=k, n=n, d=d)
    D = n * d
    return gaussian((k, D), 1 / math.sqrt(D), seed=seed, device=device, dtype=dtype)


def sample_Vs(n: int, d: int, L: int, *, widths: Sequence[int] | None = None, seed: int,
              device=None, dtype: torch.dtype = torch.float64) -> list[torch.Tensor]:
    """DRF weights (eq. :eq:`eq-drf`): ``L`` layers, layer ``l`` of shape ``k_l × k_{l−1}``
    with He scaling ``N(0, 2/k_{l−1})``; ``k_0 = D = n·d``. The authors use ``k_l = D``
    for every layer (``widths=None``). Layer ``l`` uses seed ``seed + l``."""
    if L < 1:
        raise ValueError(f"L must be at least 1, got {L}.")
    _check_positive(n=n, d=d)
    widths = [n * d] * L if widths is None else list(widths)
    if len(widths) != L:
        raise ValueError(f"widths must list L = {L} layer widths, got {len(widths)}.")
    fan_in, Vs = n * d, []
    for l, k in enumerate(widths):
        Vs.append(gaussian((k, fan_in), math.sqrt(2 / fan_in), seed=seed + l, device=device,
                           dtype=dtype))
        fan_in = k
    return Vs


def sample_W(d: int, *, seed: int, device=None, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Attention weights ``W ∈ R^{d×d}``, entries ``N(0, 1/d)`` (eq. :eq:`eq-raf`)."""
    _check_positive(d=d)
    return gaussian((d, d), 1 / math.sqrt(d), seed=seed, device=device, dtype=dtype)


def sample_X(n: int, d: int, *, seed: int, device=None,
             dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A synthetic text: ``n`` i.i.d. Gaussian rows rescaled to norm ``√d`` (the paper's
    synthetic texts)."""
    _check_positive(n=n, d=d)
    X = gaussian((n, d), 1.0, seed=seed, device=device, dtype=dtype)
    return X * (math.sqrt(d) / torch.linalg.vector_norm(X, dim=-1, keepdim=True))
