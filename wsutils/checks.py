"""Input checks shared by the maps, the estimators and the bounds: each raises a ValueError
that says what is wrong and what to do."""

from __future__ import annotations

import math

import torch


def check_finite(name: str, t: torch.Tensor) -> None:
    if t.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)}); pass at least one entry.")
    if not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise ValueError(f"{name} has {bad} non-finite entries (NaN or inf); clean the input first.")


def check_text(X: torch.Tensor) -> tuple[int, int]:
    """``X`` must be a finite ``(..., n, d)`` array with ``n, d ≥ 1``; returns ``(n, d)``."""
    if X.ndim < 2:
        raise ValueError(
            f"X must have shape (n, d) (one row per word), got shape {tuple(X.shape)}."
        )
    n, d = X.shape[-2], X.shape[-1]
    if n == 0 or d == 0:
        raise ValueError(f"X is empty (shape {tuple(X.shape)}); a text needs n ≥ 1 words of d ≥ 1.")
    check_finite("X", X)
    return n, d


def check_shape(name: str, t: torch.Tensor, shape: tuple[int, ...], hint: str) -> None:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} ({hint}), got {tuple(t.shape)}.")
    check_finite(name, t)


def check_unit_rows(X: torch.Tensor, *, rtol: float = 1e-6) -> None:
    """Rows of ``X`` must have norm ``√d`` (the paper's normalisation, §1 of the brief)."""
    d = X.shape[-1]
    norms = torch.linalg.vector_norm(X, dim=-1)
    err = float((norms / math.sqrt(d) - 1).abs().max())
    if err > rtol:
        raise ValueError(
            f"rows of X must have norm √d = {math.sqrt(d):.6g}; the worst row is off by a relative "
            f"{err:.3g}. Rescale with wsutils.normalize_rows(X)."
        )
