"""Seeded samplers for the frozen random weights, with the paper's scalings
(eqs. :eq:`eq-rf`–:eq:`eq-raf`).

Weights are a function of the seed alone: the normals are drawn on the CPU, in float64 (or in
the precision ``draw`` names, a fixed choice of the calling code, never the caller's ``dtype``),
from a ``torch.Generator`` seeded with ``seed``, then scaled, cast to ``dtype`` and moved to
``device``. So the same seed gives the same numbers on every device and in every dtype, up to
the final rounding: ``sample_W(d, seed=s, dtype=torch.float32)`` is
``sample_W(d, seed=s).float()`` exactly.

Refused: sizes that are not positive integers (``2.7`` is a
TypeError, not ``2``), seeds outside ``[0, 2**63)`` (``wsutils.checks.check_seed``: ``−1``
would be a second name for ``2**64 − 1``), a CUDA device on a machine without one
(:func:`wsutils.run.device.pick_device`), and sizes whose draw needs more memory than is available
(:func:`wsutils.run.device.check_fits`, checked before anything is allocated).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from .checks import SEED_LIMIT, check_int, check_real, check_seed
from .run.device import check_fits, optional_device

__all__ = ["gaussian", "sample_V", "sample_Vs", "sample_W", "sample_X"]

_DRAWS = (torch.float64, torch.float32)


def _dims(**dims) -> dict[str, int]:
    out = {k: check_int(k, v) for k, v in dims.items()}
    bad = {k: v for k, v in out.items() if v < 1}
    if bad:
        raise ValueError(f"dimensions must be positive, got {bad}.")
    return out


def _draw_bytes(numel: int, dtype: torch.dtype, draw: torch.dtype) -> int:
    """Peak bytes of one draw: the normals, plus the cast copy when ``dtype`` differs."""
    size = numel * draw.itemsize
    return size + (numel * dtype.itemsize if dtype != draw else 0)


def gaussian(
    shape: Sequence[int],
    std: float,
    *,
    seed: int,
    device=None,
    dtype: torch.dtype = torch.float64,
    draw: torch.dtype = torch.float64,
) -> torch.Tensor:
    """I.i.d. ``N(0, std²)`` entries of the given shape, reproducible from ``seed``.

    The normals are drawn in ``draw`` precision (float64, or float32 where the calling code
    trades precision for speed, as the blocked RF weights of the generalization experiment
    do), scaled by ``std``, then cast to ``dtype``: the values depend on ``seed`` (and the
    fixed ``draw``) alone, never on ``dtype``.

    Parameters
    ----------
    shape
        Positive sizes.
    std : float
        The standard deviation.
    seed : int
        The stream: the same seed gives the same numbers on every device and in every
        ``dtype`` (drawn in float64, then cast), up to the final rounding.
    device, dtype
        Where and in which floating dtype the result lives (default: the CPU, float64).
    draw : torch.dtype
        The precision of the normals, float64 or float32.

    Returns
    -------
    torch.Tensor
        The entries, of ``shape``.

    Raises
    ------
    TypeError
        If a size is not an integer (``2.7`` is refused, not read as ``2``) or the seed is not
        an integer (``1.7`` would silently be ``1``; ``True`` is refused).
    ValueError
        If a size is not positive, ``std`` is negative or not finite, the seed is outside
        ``[0, 2**63)`` (torch reads ``−1`` as
        ``2**64 − 1``, a second name for one stream: ``wsutils.checks.check_seed``), or
        ``device="cuda"`` is asked for on a machine without a GPU (pass ``"cpu"`` or
        ``"auto"``; :func:`wsutils.run.device.pick_device`).
    wsutils.run.device.DoesNotFit
        Before anything is allocated, if the draw needs more memory than is available (the
        message gives both; a failure after minutes of work, or swapping, is worse).
    """
    dims = _dims(**{f"shape[{i}]": s for i, s in enumerate(shape)})
    seed = check_seed(seed)
    std = check_real("std", std)
    if std < 0:
        raise ValueError(f"std must be at least 0 (a standard deviation), got {std}.")
    if draw not in _DRAWS:
        raise ValueError(f"draw must be torch.float64 or torch.float32, got {draw!r}.")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch dtype, got {dtype!r}.")
    device = optional_device(device)
    numel = math.prod(dims.values())
    check_fits(
        _draw_bytes(numel, dtype, draw),
        f"drawing {tuple(dims.values())} weights",
        hint="use smaller sizes",
    )
    if device is not None and device.type != "cpu":
        check_fits(
            numel * dtype.itemsize,
            f"{tuple(dims.values())} weights",
            device,
            hint="use smaller sizes or device='cpu'",
        )
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(*dims.values(), generator=g, dtype=draw).mul_(std).to(dtype)
    return out.to(device) if device is not None else out


def sample_V(
    k: int, n: int, d: int, *, seed: int, device=None, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """RF weights ``V ∈ R^{k×D}``, entries ``N(0, 1/D)``, ``D = n·d`` (eq. :eq:`eq-rf`).

    Parameters
    ----------
    k, n, d : int
        The number of features, words and the word width.
    seed, device, dtype
        As in :func:`gaussian`.

    Returns
    -------
    torch.Tensor
        ``V``, of shape ``(k, n·d)``.

    Raises
    ------
    TypeError, ValueError, wsutils.run.device.DoesNotFit
        As :func:`gaussian` (sizes, seed, device, memory).
    """
    k, n, d = _dims(k=k, n=n, d=d).values()
    D = n * d
    return gaussian((k, D), 1 / math.sqrt(D), seed=seed, device=device, dtype=dtype)


def sample_Vs(
    n: int,
    d: int,
    L: int,
    *,
    widths: Sequence[int] | None = None,
    seed: int,
    device=None,
    dtype: torch.dtype = torch.float64,
) -> list[torch.Tensor]:
    """DRF weights (eq. :eq:`eq-drf`): ``L`` layers, layer ``l`` of shape ``k_l × k_{l−1}``
    with He scaling ``N(0, 2/k_{l−1})``; ``k_0 = D = n·d``. The authors use ``k_l = D``
    for every layer (``widths=None``). Layer ``l`` uses seed ``seed + l``.

    Parameters
    ----------
    n, d, L : int
        The number of words, the word width and the number of layers.
    widths
        ``k_1, …, k_L`` (default: ``n·d`` each).
    seed, device, dtype
        As in :func:`gaussian`.

    Returns
    -------
    list of torch.Tensor
        ``V_1, …, V_L``.

    Raises
    ------
    TypeError
        If a size, a width or the seed is not an integer, as :func:`gaussian`.
    ValueError
        If a size is not positive, ``widths`` does not list ``L`` widths, ``seed + L − 1``
        reaches ``2**63``, or as :func:`gaussian`.
    wsutils.run.device.DoesNotFit
        Before anything is allocated, if the layers do not fit in memory.
    """
    L = check_int("L", L)
    if L < 1:
        raise ValueError(f"L must be at least 1, got {L}.")
    n, d = _dims(n=n, d=d).values()
    seed = check_seed(seed)
    if seed + L - 1 >= SEED_LIMIT:
        raise ValueError(
            f"layer l uses seed + l, so seed + L − 1 must be below 2**63; got "
            f"seed = {seed}, L = {L}. Pass a smaller seed."
        )
    widths = [n * d] * L if widths is None else list(widths)
    if len(widths) != L:
        raise ValueError(f"widths must list L = {L} layer widths, got {len(widths)}.")
    widths = [check_int(f"widths[{l}]", k, minimum=1) for l, k in enumerate(widths)]
    fans = [n * d] + widths[:-1]
    total = sum(k * f for k, f in zip(widths, fans)) * dtype.itemsize
    check_fits(
        total,
        f"{L} DRF layers of widths {widths}",
        optional_device(device),
        hint="use smaller widths",
    )
    return [
        gaussian((k, f), math.sqrt(2 / f), seed=seed + l, device=device, dtype=dtype)
        for l, (k, f) in enumerate(zip(widths, fans))
    ]


def sample_W(
    d: int, *, seed: int, device=None, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """Attention weights ``W ∈ R^{d×d}``, entries ``N(0, 1/d)`` (eq. :eq:`eq-raf`).

    Parameters
    ----------
    d : int
        The word width.
    seed, device, dtype
        As in :func:`gaussian`.

    Returns
    -------
    torch.Tensor
        ``W``, of shape ``(d, d)``.

    Raises
    ------
    TypeError, ValueError, wsutils.run.device.DoesNotFit
        As :func:`gaussian` (sizes, seed, device, memory).
    """
    (d,) = _dims(d=d).values()
    return gaussian((d, d), 1 / math.sqrt(d), seed=seed, device=device, dtype=dtype)


def sample_X(
    n: int, d: int, *, seed: int, device=None, dtype: torch.dtype = torch.float64
) -> torch.Tensor:
    """A synthetic text: ``n`` i.i.d. Gaussian rows rescaled to norm ``√d`` (the paper's
    synthetic texts). Rescaled in float64, then cast to ``dtype``.

    Parameters
    ----------
    n, d : int
        The number of words and the word width.
    seed, device, dtype
        As in :func:`gaussian`.

    Returns
    -------
    torch.Tensor
        ``X``, of shape ``(n, d)``, rows of norm ``√d``.

    Raises
    ------
    TypeError, ValueError, wsutils.run.device.DoesNotFit
        As :func:`gaussian` (sizes, seed, device, memory).
    """
    n, d = _dims(n=n, d=d).values()
    X = gaussian((n, d), 1.0, seed=seed)
    X = X * (math.sqrt(d) / torch.linalg.vector_norm(X, dim=-1, keepdim=True))
    X = X.to(dtype)
    return X.to(optional_device(device)) if device is not None else X
